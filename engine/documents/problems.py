"""Typed problems with documents. Every message names the file and says what was skipped, because
the app shows `str(problem)` to the user as-is and the CLI prints it."""

from __future__ import annotations

from engine.errors import EngineError


class DocumentError(EngineError):
    """A document could not be used. `.path` names the file, `.kind` is a stable word for the kind
    of problem (for tests and the UI's icon), `.problem` says what is wrong in words."""

    kind = "unreadable"

    def __init__(self, path, problem: str):
        self.path, self.problem = str(path), problem
        super().__init__(f"{path}: {problem}")


class EncryptedDocument(DocumentError):
    kind = "encrypted"


class CorruptDocument(DocumentError):
    kind = "corrupt"


class NoTextInDocument(DocumentError):
    """The file opened but holds no extractable text (e.g. a scanned, image-only PDF)."""

    kind = "no-text"


class DocumentTooLarge(DocumentError):
    kind = "too-large"


class BinaryFile(DocumentError):
    kind = "binary"


class UnreadableEncoding(DocumentError):
    kind = "encoding"


class UnsupportedDocument(DocumentError):
    kind = "unsupported"


class DocumentRemoved(DocumentError):
    """The file was there when indexing started and was gone (or became unreadable) by the time
    its turn came."""

    kind = "removed"


class CollectionError(EngineError):
    """The collection itself cannot be used: bad name, built with another embedding model,
    the disk is full, the file is not a collection."""


class DiskFull(CollectionError):
    """SQLite reported 'database or disk is full': the file being written was rolled back and the
    run stopped, so every file indexed before it is still there."""
