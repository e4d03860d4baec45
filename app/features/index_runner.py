"""Indexing a collection off the GUI thread, with progress and cancel.

A plain daemon thread (like app/library/scan_runner.py), not the engine's worker: indexing must
not wait behind a generation, nor a generation behind indexing. The thread opens its own
Collection (an SQLite connection belongs to the thread that opened it), gets the embedding model
from the shared EmbedderCache (loaded once, on this thread, so the window never waits for it) and
runs engine.documents.index.index_paths. Its progress and its report come back over queued Qt
signals. Cancel sets the run's token: index_paths stops between files and embedding batches and
every file is either as it was or fully re-indexed (one transaction per file).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from PySide6.QtCore import QObject, Signal

from engine.cancel import CancelToken
from engine.errors import EngineError

if TYPE_CHECKING:  # engine.documents loads numpy: imported on the index thread, when it runs
    from engine.documents.embedder import TextEmbedder
    from engine.documents.index import IndexProgress, IndexReport

PROGRESS_INTERVAL_S = 0.1  # at most ten progress updates a second reach the window


class EmbedderCache:
    """Embedding models by file (None: the default one), each loaded once and shared: the
    index thread and the query at send time use the same object (Embedder is thread-safe)."""

    def __init__(self, loader: Callable[[str | None], TextEmbedder] | None = None):
        self._loader = loader  # None: default_loader, looked up when a model is wanted
        self._lock = threading.Lock()
        self._models: dict[str | None, TextEmbedder] = {}

    def get(self, path: str | None) -> TextEmbedder:
        with self._lock:  # two threads asking at once load it once
            model = self._models.get(path)
            if model is None:
                model = self._models[path] = (self._loader or default_loader)(path)
            return model

    def loaded(self, path: str | None) -> bool:
        return path in self._models


def default_loader(path: str | None) -> TextEmbedder:
    """The GGUF embedding model at `path`, else the default from set-up (all-MiniLM-L6-v2);
    ModelNotInstalledError says how to install it."""
    from engine.embedding import Embedder, default_embedding_model_path

    return Embedder.load(path or default_embedding_model_path())


class IndexRunner(QObject):
    progress = Signal(object)  # engine.documents.index.IndexProgress
    finished = Signal(str, object, str)  # collection name, IndexReport | None, error ("" if none)

    def __init__(self, embedders: EmbedderCache, parent: QObject | None = None):
        super().__init__(parent)
        self.embedders = embedders
        self._cancel = CancelToken()
        self._thread: threading.Thread | None = None

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def start(self, root: Path, name: str, paths: list[str]) -> bool:
        """Index `paths` into collection `name` under `root`; False if a run is going on."""
        if self.running:
            return False
        self._cancel = token = CancelToken()
        last = [0.0]

        def tell(progress: IndexProgress) -> None:
            now = time.monotonic()
            final = progress.current is None and progress.files_done == progress.files_total
            if final or now - last[0] >= PROGRESS_INTERVAL_S:
                last[0] = now
                self.progress.emit(progress)

        def run() -> None:
            report: IndexReport | None = None
            error = ""
            try:
                from engine.documents.collection import Collection
                from engine.documents.index import index_paths

                with Collection.open(name, root) as collection:
                    embedder = self.embedders.get(collection.embed_model_path)
                    # recorded so a later run (and `python -m engine ask`) uses the same model
                    model_file = getattr(embedder, "path", None)
                    report = index_paths(
                        collection,
                        paths,
                        embedder,
                        cancel=token,
                        progress=tell,
                        embed_model_path=str(model_file) if model_file else None,
                    )
            except EngineError as exc:  # no embedding model, another model's collection...
                error = str(exc)
            except Exception as exc:  # a bug must reach the user, not end the thread silently
                error = f"Indexing failed: {type(exc).__name__}: {exc}"
            self.finished.emit(name, report, error)

        self._thread = threading.Thread(target=run, name=f"index-{name}", daemon=True)
        self._thread.start()
        return True

    def cancel(self) -> None:
        self._cancel.cancel()

    def wait(self, timeout: float = 30.0) -> None:
        """For shutdown and tests: let a running index end."""
        if self._thread is not None:
            self._thread.join(timeout)


def describe_progress(p: IndexProgress) -> str:
    """'File 3 of 10 · 42 pages · 180 chunks · 35.2 chunks/s · about 0:12 left'"""
    parts = [f"File {min(p.files_done + 1, p.files_total)} of {p.files_total}"]
    parts.append(f"{p.pages} page{'s' if p.pages != 1 else ''}")
    parts.append(f"{p.chunks} chunk{'s' if p.chunks != 1 else ''}")
    if p.chunks_per_s > 0:
        parts.append(f"{p.chunks_per_s:.1f} chunks/s")
    if p.eta_s is not None:
        s = int(p.eta_s + 0.5)
        parts.append(f"about {s // 60}:{s % 60:02d} left")
    return " · ".join(parts)


def describe_report(report: IndexReport) -> str:
    """One line for the panel after a run."""
    if report.cancelled:
        head = "Indexing cancelled: files finished before the cancel are kept, the rest unchanged"
    elif report.stopped:
        head = f"Indexing stopped: {report.stopped}"
    else:
        head = "Indexed"
    counts = [
        f"{len(report.added)} added",
        f"{len(report.updated)} updated",
        f"{len(report.unchanged)} unchanged",
    ]
    if report.removed:
        counts.append(f"{len(report.removed)} removed")
    problems = [p for p in report.problems if p.kind != "note"]
    if problems:
        counts.append(f"{len(problems)} with problems")
    rate = f"; {report.pages} pages, {report.chunks} chunks in {report.elapsed_s:.1f} s"
    return f"{head}: {', '.join(counts)}{rate}"


def problem_lines(report: IndexReport) -> list[str]:
    return [p.message for p in report.problems]
