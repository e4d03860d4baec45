"""The one check every user-named input file goes through before it is opened.

Opening a FIFO blocks until a writer appears (forever, from a command line) and a device such as
`/dev/zero` never ends, so only regular files are accepted, and text files are read with a size
cap: reading stops one byte past the cap instead of loading whatever the path yields.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from engine.errors import InputFileError

# A JSON schema is hand-written text: 4 MiB is far above any real one and bounds the memory
# (and the grammar compiler's work) a mistaken path can cost.
MAX_SCHEMA_BYTES = 4 * 2**20


def require_regular_file(path: str | os.PathLike[str], role: str) -> Path:
    """`path` (with ~ expanded) if it names an existing regular file, else InputFileError.

    Uses stat, which never opens the file, so a FIFO or device is refused without blocking."""
    resolved = Path(path).expanduser()
    try:
        mode = resolved.stat().st_mode
    except FileNotFoundError:
        raise InputFileError(role, resolved, "file not found") from None
    except OSError as exc:
        raise InputFileError(role, resolved, exc.strerror or type(exc).__name__) from None
    if stat.S_ISDIR(mode):
        raise InputFileError(role, resolved, "is a directory, not a file")
    if not stat.S_ISREG(mode):
        kind = "a FIFO (named pipe)" if stat.S_ISFIFO(mode) else "a device or socket"
        raise InputFileError(role, resolved, f"is {kind}, not a regular file")
    return resolved


def read_text_file(path: str | os.PathLike[str], role: str, max_bytes: int) -> str:
    """The UTF-8 text of a regular file of at most `max_bytes` bytes, else InputFileError."""
    resolved = require_regular_file(path, role)
    try:
        # O_NONBLOCK: if the path was swapped for a FIFO after the check, open does not wait.
        fd = os.open(resolved, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
        with os.fdopen(fd, "rb") as f:
            if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
                raise InputFileError(role, resolved, "is not a regular file")
            data = f.read(max_bytes + 1)
    except OSError as exc:
        raise InputFileError(role, resolved, exc.strerror or type(exc).__name__) from None
    if len(data) > max_bytes:
        raise InputFileError(role, resolved, f"larger than the limit of {max_bytes:,} bytes")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InputFileError(
            role, resolved, f"not UTF-8 text (invalid byte at offset {exc.start})"
        ) from None
