"""Bring a collection up to date with files and folders on disk.

Only what changed is touched: a file whose size and mtime match the stored ones is skipped
without reading it, one whose content hash (sha256) matches is skipped without extracting it.
A file that is gone from disk is reported and its chunks dropped. Each file is written in one
transaction (Collection.replace_file), and cancel is checked between files and between embedding
batches, so a cancelled or failed run leaves every file either as it was or fully re-indexed.

Problems never stop the run (except a full disk): each is reported with the file and what was
skipped, and a file indexed before keeps its previous chunks.
"""

from __future__ import annotations

import hashlib
import os
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from engine.documents.chunk import DEFAULT_CHUNK_TOKENS, DEFAULT_OVERLAP_TOKENS, chunk_blocks
from engine.documents.collection import Collection
from engine.documents.embedder import TextEmbedder
from engine.documents.extract import DEFAULT_MAX_BYTES, FOLDER_SUFFIXES, extract
from engine.documents.problems import DiskFull, DocumentError, DocumentRemoved

EMBED_BATCH = 32


@dataclass(frozen=True)
class IndexProgress:
    files_done: int
    files_total: int
    current: str | None  # the file being indexed
    pages: int  # pages extracted so far this run
    chunks: int  # chunks embedded so far this run
    elapsed_s: float
    chunks_per_s: float
    eta_s: float | None  # None until there is a rate to go by


@dataclass(frozen=True)
class FileProblem:
    path: str
    kind: str  # DocumentError.kind, or "removed"
    message: str  # names the file and what was skipped
    kept_previous: bool = False  # its earlier chunks are still in the collection


@dataclass
class IndexReport:
    added: list[str] = field(default_factory=list)
    updated: list[str] = field(default_factory=list)
    unchanged: list[str] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)  # gone from disk: chunks dropped
    problems: list[FileProblem] = field(default_factory=list)
    pages: int = 0
    chunks: int = 0
    elapsed_s: float = 0.0
    cancelled: bool = False
    stopped: str | None = None  # why the run stopped early (e.g. the disk is full)

    @property
    def pages_per_s(self) -> float:
        return self.pages / self.elapsed_s if self.elapsed_s > 0 else 0.0

    @property
    def chunks_per_s(self) -> float:
        return self.chunks / self.elapsed_s if self.elapsed_s > 0 else 0.0


class IndexCancelled(Exception):
    """Raised inside a file's work when the cancel token is set; that file is not written."""


def gather_files(paths: Iterable[str | os.PathLike]) -> tuple[list[Path], list[FileProblem]]:
    """Files named directly (any suffix) and the readable documents inside folders (by suffix;
    hidden files and folders such as .git are skipped), absolute, each once, in a stable order."""
    found: dict[str, Path] = {}
    problems: list[FileProblem] = []
    for raw in paths:
        p = Path(raw).expanduser().absolute()
        if p.is_dir():
            for root, dirs, names in os.walk(p):
                dirs[:] = sorted(d for d in dirs if not d.startswith("."))
                for name in sorted(names):
                    f = Path(root) / name
                    wanted = not name.startswith(".") and f.suffix.lower() in FOLDER_SUFFIXES
                    if wanted and f.is_file():
                        found.setdefault(str(f), f)
        elif p.is_file():
            found.setdefault(str(p), p)
        elif p.exists():
            problems.append(
                FileProblem(str(p), "unsupported", f"{p}: not a file or folder; skipped")
            )
        else:
            problems.append(FileProblem(str(p), "removed", f"{p}: no such file or folder; skipped"))
    return list(found.values()), problems


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _cancelled(cancel: Any) -> bool:
    return cancel is not None and bool(getattr(cancel, "cancelled", False))


def index_paths(
    collection: Collection,
    paths: Iterable[str | os.PathLike],
    embedder: TextEmbedder,
    *,
    cancel: Any = None,
    progress: Callable[[IndexProgress], None] | None = None,
    chunk_tokens: int | None = None,
    overlap_tokens: int | None = None,
    max_bytes: int = DEFAULT_MAX_BYTES,
    embed_model_path: str | None = None,
    embed_batch: int = EMBED_BATCH,
) -> IndexReport:
    started = time.perf_counter()
    report = IndexReport()
    tokens = (
        chunk_tokens if chunk_tokens is not None else min(DEFAULT_CHUNK_TOKENS, embedder.max_tokens)
    )
    # the default overlap shrinks with small chunks (a fifth of one at most)
    overlap = (
        overlap_tokens if overlap_tokens is not None else min(DEFAULT_OVERLAP_TOKENS, tokens // 5)
    )
    try:
        collection.bind_model(embedder.model_id, embedder.dim, embed_model_path)
    except DiskFull as exc:
        report.stopped = str(exc)
        return report
    files, report.problems = gather_files(paths)
    on_disk = {str(f) for f in files}

    # Files the collection holds that are gone from disk: report them and drop their chunks.
    for record in collection.files():
        if record.path not in on_disk and not os.path.exists(record.path):
            try:
                collection.drop_file(record.path)
            except DiskFull as exc:
                report.stopped = str(exc)
                report.elapsed_s = time.perf_counter() - started
                return report
            report.removed.append(record.path)

    sizes = {}
    for f in files:
        try:
            sizes[str(f)] = f.stat().st_size
        except OSError:
            sizes[str(f)] = 0
    total_bytes = sum(min(s, max_bytes) for s in sizes.values()) or 1
    done_bytes = 0

    def tell(done: int, current: str | None, partial_bytes: float = 0.0, embedded: int = 0) -> None:
        """`partial_bytes`: the share of the current file embedded so far, in bytes, and
        `embedded` its chunks embedded so far, so a single large file still shows a rate and a
        time left before it ends."""
        if progress is None:
            return
        elapsed = time.perf_counter() - started
        chunks = report.chunks + embedded
        rate = chunks / elapsed if elapsed > 0 else 0.0
        eta = None
        so_far = done_bytes + partial_bytes
        if so_far > 0 and elapsed > 0:
            eta = elapsed / so_far * max(0.0, total_bytes - so_far)
        progress(IndexProgress(done, len(files), current, report.pages, chunks, elapsed, rate, eta))

    known = {r.path: r for r in collection.files()}
    for n, path in enumerate(files):
        if _cancelled(cancel):
            report.cancelled = True
            break
        key = str(path)
        tell(n, key)

        def batch_done(embedded: int, total: int, n: int = n, key: str = key) -> None:
            tell(n, key, embedded / total * min(sizes.get(key, 0), max_bytes), embedded)

        try:
            outcome = _index_one(
                collection, path, known.get(key), embedder, report,
                cancel=cancel, tokens=tokens, overlap=overlap, max_bytes=max_bytes,
                batch=embed_batch, on_batch=batch_done,
            )  # fmt: skip
        except IndexCancelled:
            report.cancelled = True
            break
        except DiskFull as exc:
            report.stopped = str(exc)
            report.problems.append(FileProblem(key, "disk-full", str(exc), kept_previous=True))
            break
        {"added": report.added, "updated": report.updated, "unchanged": report.unchanged}.get(
            outcome, []
        ).append(key)
        done_bytes += min(sizes.get(key, 0), max_bytes)
        tell(n + 1, None)
    report.elapsed_s = time.perf_counter() - started
    return report


def _index_one(
    collection: Collection,
    path: Path,
    record,
    embedder: TextEmbedder,
    report: IndexReport,
    *,
    cancel: Any,
    tokens: int,
    overlap: int,
    max_bytes: int,
    batch: int,
    on_batch: Callable[[int, int], None],
) -> str:
    """'added', 'updated', 'unchanged' or 'problem' (already appended to report.problems)."""
    key = str(path)
    try:
        st = path.stat()
        indexed = record is not None and record.status == "indexed"
        # a failed re-index keeps the old size/mtime (note_problem), so it is retried next run
        if indexed and record.size == st.st_size and record.mtime == st.st_mtime:
            return "unchanged"
        if st.st_size > max_bytes:
            extract(path, max_bytes)  # raises DocumentTooLarge with the message; never hashes
        sha = file_sha256(path)
        if indexed and record.sha256 == sha:
            # touched but not changed: remember the new mtime so the next run skips the read
            collection.update_stat(key, st.st_size, st.st_mtime)
            return "unchanged"
        doc = extract(path, max_bytes)
        chunks = chunk_blocks(doc.blocks, embedder.count_tokens, tokens, overlap)
        vectors = _embed(embedder, [c.text for c in chunks], cancel, batch, on_batch)
        if _cancelled(cancel):
            raise IndexCancelled
        collection.replace_file(
            key, sha256=sha, size=st.st_size, mtime=st.st_mtime, kind=doc.kind, pages=doc.pages,
            chunks=chunks, embeddings=vectors, problem="; ".join(doc.notes) or None,
        )  # fmt: skip
        for note in doc.notes:
            report.problems.append(FileProblem(key, "note", f"{key}: {note}"))
        report.pages += doc.pages
        report.chunks += len(chunks)
        return "updated" if record is not None and record.status == "indexed" else "added"
    except (FileNotFoundError, DocumentRemoved):
        dropped = collection.drop_file(key)
        what = f"; its {dropped} chunks were dropped" if dropped else ""
        report.problems.append(
            FileProblem(key, "removed", f"{key}: removed during indexing; skipped{what}")
        )
        report.removed.append(key)
        return "problem"
    except DocumentError as exc:
        kept = collection.note_problem(key, _size(path), _mtime(path), str(exc))
        message = str(exc) + ("; the previously indexed version is kept" if kept else "")
        report.problems.append(FileProblem(key, exc.kind, message, kept_previous=kept))
        return "problem"
    except OSError as exc:
        message = f"{key}: cannot be read ({exc.strerror or exc}); skipped"
        kept = collection.note_problem(key, _size(path), _mtime(path), message)
        report.problems.append(FileProblem(key, "unreadable", message, kept_previous=kept))
        return "problem"


def _size(path: Path) -> int | None:
    try:
        return path.stat().st_size
    except OSError:
        return None


def _mtime(path: Path) -> float | None:
    try:
        return path.stat().st_mtime
    except OSError:
        return None


def _embed(
    embedder: TextEmbedder,
    texts: list[str],
    cancel: Any,
    batch: int,
    on_batch: Callable[[int, int], None],
) -> np.ndarray:
    from engine.cancel import ForwardCancelled

    parts = []
    for i in range(0, len(texts), batch):
        if _cancelled(cancel):
            raise IndexCancelled
        try:
            parts.append(
                np.asarray(embedder.embed(texts[i : i + batch], cancel=cancel), np.float32)
            )
        except ForwardCancelled:
            raise IndexCancelled from None
        on_batch(min(len(texts), i + batch), len(texts))
    if not parts:
        return np.zeros((0, embedder.dim), dtype=np.float32)
    return np.concatenate(parts)
