"""A collection: one SQLite file in the data directory holding its files, chunks (text, place,
embedding) and an FTS5 index over the chunk text.

One file per collection (…/LocalChat/collections/<name>.sqlite3), not one shared database: a
collection is what a user creates, reuses across chats, copies or deletes, so it is one file; a
long indexing run holds the write lock of its own file only, so searching another collection (or
the chat database) never waits for it; and a damaged file loses one collection, not all.

Writes are one transaction per document file (`replace_file`): a cancelled or failed run leaves
every file either as it was before or fully re-indexed, never half-written. Chunk ids are
AUTOINCREMENT, so an id a receipt recorded is never reused for other text.
"""

from __future__ import annotations

import json
import re
import sqlite3
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import platformdirs

from engine.documents.chunk import Chunk
from engine.documents.problems import CollectionError, DiskFull
from engine.errors import ConfigValidationError

SCHEMA_VERSION = 1
# Question words and function words left out of the keyword query (English; other languages'
# words all stay, which only costs precision). The vector side still sees the whole question.
STOPWORDS = frozenset({
    "a", "an", "and", "are", "as", "at", "be", "by", "can", "could", "did", "do", "does", "for",
    "from", "had", "has", "have", "how", "i", "if", "in", "into", "is", "it", "its", "me", "my",
    "of", "on", "or", "our", "should", "so", "than", "that", "the", "their", "them", "then",
    "there", "these", "this", "those", "to", "was", "we", "were", "what", "when", "where",
    "which", "who", "why", "will", "with", "would", "you", "your",
})  # fmt: skip
_NAME = re.compile(r"^[\w][\w .-]{0,63}$")

_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS files (
    id INTEGER PRIMARY KEY,
    path TEXT NOT NULL UNIQUE,
    sha256 TEXT,
    size INTEGER,
    mtime REAL,
    kind TEXT,
    pages INTEGER,
    status TEXT NOT NULL,       -- 'indexed' (its chunks are here) or 'skipped' (none)
    problem TEXT,               -- what went wrong last time, in words; NULL when nothing did
    indexed_at REAL
);
CREATE TABLE IF NOT EXISTS chunks (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    file_id INTEGER NOT NULL REFERENCES files(id) ON DELETE CASCADE,
    ordinal INTEGER NOT NULL,
    page INTEGER,
    heading TEXT NOT NULL,      -- JSON list of the heading path
    char_start INTEGER NOT NULL,
    char_end INTEGER NOT NULL,
    n_tokens INTEGER NOT NULL,
    text TEXT NOT NULL,
    text_sha256 TEXT NOT NULL,
    embedding BLOB NOT NULL     -- float32 little-endian, dim values, L2-normalised
);
CREATE INDEX IF NOT EXISTS chunks_by_file ON chunks(file_id, ordinal);
CREATE VIRTUAL TABLE IF NOT EXISTS chunks_fts USING fts5(
    text, content='chunks', content_rowid='id', tokenize='unicode61 remove_diacritics 2'
);
CREATE TRIGGER IF NOT EXISTS chunks_fts_insert AFTER INSERT ON chunks BEGIN
    INSERT INTO chunks_fts(rowid, text) VALUES (new.id, new.text);
END;
CREATE TRIGGER IF NOT EXISTS chunks_fts_delete AFTER DELETE ON chunks BEGIN
    INSERT INTO chunks_fts(chunks_fts, rowid, text) VALUES ('delete', old.id, old.text);
END;
"""


def collections_dir() -> Path:
    return Path(platformdirs.user_data_dir("LocalChat", appauthor=False)) / "collections"


def check_name(name: str) -> str:
    if not _NAME.match(name) or name.strip() != name:
        raise ConfigValidationError(
            "collection",
            name,
            "1-64 letters, digits, spaces, '.', '-' or '_', starting with a letter or digit",
        )
    return name


@dataclass(frozen=True)
class FileRecord:
    id: int
    path: str
    sha256: str | None
    size: int | None
    mtime: float | None
    kind: str | None
    pages: int | None
    status: str
    problem: str | None
    n_chunks: int


@dataclass(frozen=True)
class StoredChunk:
    id: int
    file: str
    ordinal: int
    page: int | None
    heading: tuple[str, ...]
    char_start: int
    char_end: int
    n_tokens: int
    text: str
    text_sha256: str

    def place(self) -> str:
        """'file p.3 > Heading > Sub' - how a citation names where the passage is."""
        parts = [Path(self.file).name + (f" p.{self.page}" if self.page is not None else "")]
        parts.extend(self.heading)
        return " > ".join(parts)


def _is_disk_full(exc: sqlite3.Error) -> bool:
    return "full" in str(exc).lower() or getattr(exc, "sqlite_errorcode", None) == 13


class Collection:
    """An open collection. A connection belongs to the thread that opened it (sqlite3's rule):
    an indexing thread opens its own."""

    def __init__(self, path: Path, name: str) -> None:
        self.path, self.name = path, name
        try:
            self.db = sqlite3.connect(str(path), isolation_level=None, timeout=30)
            self.db.execute("PRAGMA foreign_keys=ON")
            self.db.execute("PRAGMA journal_mode=WAL")
            self.db.execute("PRAGMA synchronous=NORMAL")
            self.db.executescript(_SCHEMA)
            version = self._meta("schema_version")
            if version is None:
                self._set_meta("schema_version", str(SCHEMA_VERSION))
            elif version != str(SCHEMA_VERSION):
                raise CollectionError(
                    f"collection {name!r} ({path}) was written by a newer LocalChat "
                    f"(format {version}); this one reads format {SCHEMA_VERSION}"
                )
        except sqlite3.DatabaseError as exc:
            raise CollectionError(f"collection {name!r} ({path}) cannot be opened: {exc}") from None

    @classmethod
    def open(cls, name: str, root: Path | None = None, create: bool = True) -> Collection:
        check_name(name)
        directory = root if root is not None else collections_dir()
        path = directory / f"{name}.sqlite3"
        if not path.exists():
            if not create:
                raise CollectionError(
                    f"no collection named {name!r} (looked for {path}); "
                    "build it with: python -m engine index PATH... --collection NAME"
                )
            directory.mkdir(parents=True, exist_ok=True)
        return cls(path, name)

    def close(self) -> None:
        self.db.close()

    def __enter__(self) -> Collection:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # --- metadata --------------------------------------------------------------------------------
    def _meta(self, key: str) -> str | None:
        row = self.db.execute("SELECT value FROM meta WHERE key=?", (key,)).fetchone()
        return row[0] if row else None

    def _set_meta(self, key: str, value: str) -> None:
        self.db.execute("INSERT OR REPLACE INTO meta(key, value) VALUES (?, ?)", (key, value))

    @property
    def embed_model_id(self) -> str | None:
        return self._meta("embed_model_id")

    @property
    def embed_model_path(self) -> str | None:
        return self._meta("embed_model_path")

    @property
    def embed_dim(self) -> int | None:
        value = self._meta("embed_dim")
        return int(value) if value is not None else None

    @property
    def generation(self) -> int:
        """Bumped by every write; the vector cache reloads when it changed."""
        return int(self._meta("generation") or 0)

    def bind_model(self, model_id: str, dim: int, model_path: str | None) -> None:
        """Record the embedding model on first use; refuse another model later (its vectors would
        not be comparable with the stored ones)."""
        current = self.embed_model_id
        if current is not None and current != model_id:
            raise CollectionError(
                f"collection {self.name!r} was indexed with embedding model {current!r}, not "
                f"{model_id!r}: vectors from two models cannot be compared. Use --embed-model with "
                f"{current!r}, or index into a new collection"
            )
        with self._write("recording the embedding model"):
            self._set_meta("embed_model_id", model_id)
            self._set_meta("embed_dim", str(dim))
            if model_path is not None:
                self._set_meta("embed_model_path", model_path)

    # --- writes ----------------------------------------------------------------------------------
    @contextmanager
    def _write(self, what: str) -> Iterator[None]:
        try:
            self.db.execute("BEGIN IMMEDIATE")
            try:
                yield
                self._set_meta("generation", str(self.generation + 1))
                self.db.execute("COMMIT")
            except BaseException:
                self.db.execute("ROLLBACK")
                raise
        except sqlite3.OperationalError as exc:
            if _is_disk_full(exc):
                raise DiskFull(
                    f"{self.path}: database or disk is full while {what}; that was not written "
                    "and indexing stopped; everything indexed before it is kept"
                ) from None
            raise CollectionError(f"{self.path}: {exc} while {what}") from None

    def replace_file(
        self,
        path: str,
        *,
        sha256: str,
        size: int,
        mtime: float,
        kind: str,
        pages: int,
        chunks: Sequence[Chunk],
        embeddings: np.ndarray,
        problem: str | None,
    ) -> int:
        """The file's new chunks replace its old ones, all in one transaction. Returns file id."""
        import hashlib

        if len(chunks) != len(embeddings):
            raise ValueError(f"{len(chunks)} chunks but {len(embeddings)} embeddings")
        vectors = np.ascontiguousarray(embeddings, dtype="<f4")
        with self._write(f"indexing {path}"):
            file_id = self._upsert_file(path, sha256, size, mtime, kind, pages, "indexed", problem)
            self.db.execute("DELETE FROM chunks WHERE file_id=?", (file_id,))
            self.db.executemany(
                "INSERT INTO chunks(file_id, ordinal, page, heading, char_start, char_end, "
                "n_tokens, text, text_sha256, embedding) VALUES (?,?,?,?,?,?,?,?,?,?)",
                [
                    (
                        file_id,
                        c.ordinal,
                        c.page,
                        json.dumps(list(c.heading), ensure_ascii=False),
                        c.char_start,
                        c.char_end,
                        c.n_tokens,
                        c.text,
                        hashlib.sha256(c.text.encode("utf-8")).hexdigest(),
                        vectors[i].tobytes(),
                    )
                    for i, c in enumerate(chunks)
                ],
            )
        return file_id

    def note_problem(self, path: str, size: int | None, mtime: float | None, problem: str) -> bool:
        """Record that `path` could not be (re)indexed. A file indexed before keeps its chunks
        (returns True: 'kept the previous version'); a new one is recorded as skipped."""
        existing = self.db.execute("SELECT status FROM files WHERE path=?", (path,)).fetchone()
        kept = existing is not None and existing[0] == "indexed"
        with self._write(f"noting a problem with {path}"):
            if kept:
                self.db.execute("UPDATE files SET problem=? WHERE path=?", (problem, path))
            else:
                self._upsert_file(path, None, size, mtime, None, None, "skipped", problem)
        return kept

    def update_stat(self, path: str, size: int, mtime: float) -> None:
        """The file was touched but its content hash is unchanged: remember its new size and
        mtime so the next run need not read it."""
        with self._write(f"updating {path}"):
            self.db.execute("UPDATE files SET size=?, mtime=? WHERE path=?", (size, mtime, path))

    def drop_file(self, path: str) -> int:
        """Remove a file and its chunks; returns how many chunks went."""
        row = self.db.execute("SELECT id FROM files WHERE path=?", (path,)).fetchone()
        if row is None:
            return 0
        (n,) = self.db.execute("SELECT count(*) FROM chunks WHERE file_id=?", row).fetchone()
        with self._write(f"dropping {path}"):
            self.db.execute("DELETE FROM files WHERE id=?", row)
        return int(n)

    def _upsert_file(self, path, sha256, size, mtime, kind, pages, status, problem) -> int:
        now = time.time()
        self.db.execute(
            "INSERT INTO files(path, sha256, size, mtime, kind, pages, status, problem, indexed_at)"
            " VALUES (?,?,?,?,?,?,?,?,?) ON CONFLICT(path) DO UPDATE SET sha256=excluded.sha256,"
            " size=excluded.size, mtime=excluded.mtime, kind=excluded.kind, pages=excluded.pages,"
            " status=excluded.status, problem=excluded.problem, indexed_at=excluded.indexed_at",
            (path, sha256, size, mtime, kind, pages, status, problem, now),
        )
        (file_id,) = self.db.execute("SELECT id FROM files WHERE path=?", (path,)).fetchone()
        return int(file_id)

    # --- reads -----------------------------------------------------------------------------------
    def files(self) -> list[FileRecord]:
        rows = self.db.execute(
            "SELECT f.id, f.path, f.sha256, f.size, f.mtime, f.kind, f.pages, f.status, f.problem,"
            " (SELECT count(*) FROM chunks c WHERE c.file_id=f.id) FROM files f ORDER BY f.path"
        ).fetchall()
        return [FileRecord(*row) for row in rows]

    def file(self, path: str) -> FileRecord | None:
        return next((f for f in self.files() if f.path == path), None)

    def chunk_count(self) -> int:
        return int(self.db.execute("SELECT count(*) FROM chunks").fetchone()[0])

    def chunks(self, ids: Sequence[int]) -> dict[int, StoredChunk]:
        if not ids:
            return {}
        marks = ",".join("?" * len(ids))
        rows = self.db.execute(
            "SELECT c.id, f.path, c.ordinal, c.page, c.heading, c.char_start, c.char_end,"
            f" c.n_tokens, c.text, c.text_sha256 FROM chunks c JOIN files f ON f.id=c.file_id"
            f" WHERE c.id IN ({marks})",
            [int(i) for i in ids],
        ).fetchall()
        return {
            r[0]: StoredChunk(r[0], r[1], r[2], r[3], tuple(json.loads(r[4])), *r[5:]) for r in rows
        }

    def keyword_search(self, query: str, k: int) -> list[int]:
        """Chunk ids, best BM25 first. Every word of the query is quoted (so '-', 'AND', ':' in
        what a user typed are words, not FTS5 syntax) and any of them may match."""
        words = re.findall(r"\w+", query)
        # "how", "is", "the" would make every chunk a match and let a chunk that shares only
        # those outrank one that shares the rare word the question is about
        content = [w for w in words if w.lower() not in STOPWORDS]
        words = content or words
        if not words:
            return []
        match = " OR ".join('"' + w.replace('"', '""') + '"' for w in dict.fromkeys(words))
        rows = self.db.execute(
            "SELECT rowid FROM chunks_fts WHERE chunks_fts MATCH ? ORDER BY bm25(chunks_fts) "
            "LIMIT ?",
            (match, k),
        ).fetchall()
        return [r[0] for r in rows]

    def embedding_matrix(self) -> tuple[np.ndarray, np.ndarray]:
        """(chunk ids int64 (n,), embeddings float32 (n, dim)) in id order."""
        dim = self.embed_dim or 0
        rows = self.db.execute("SELECT id, embedding FROM chunks ORDER BY id").fetchall()
        ids = np.fromiter((r[0] for r in rows), dtype=np.int64, count=len(rows))
        matrix = np.empty((len(rows), dim), dtype=np.float32)
        for i, (_, blob) in enumerate(rows):
            matrix[i] = np.frombuffer(blob, dtype="<f4")
        return ids, matrix
