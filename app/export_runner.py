"""Runs one export (app/export_job.py) on a worker thread and reports to the GUI thread through
signals: `progressed(done, total)` after each chat, then exactly one of `finished(path)`,
`failed(message)` or `cancelled()`. `cancel()` sets an event the export checks after each chat;
the export then removes its temporary file, so the destination is left as it was."""

from __future__ import annotations

import threading
from pathlib import Path

from PySide6.QtCore import QObject, Signal

from app.export_job import (
    ChatSnapshot,
    ExportCancelled,
    ExportError,
    ExportFormat,
    ExportScope,
    cancellable_step,
    run_export,
)


class ExportRunner(QObject):
    progressed = Signal(int, int)  # chats done, chats in all
    finished = Signal(str)  # the path written
    failed = Signal(str)  # what went wrong, naming the path
    cancelled = Signal()

    def __init__(self, parent: QObject | None = None):
        super().__init__(parent)
        self._cancel = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def start(
        self,
        destination: Path,
        export_format: ExportFormat,
        scope: ExportScope,
        chats: list[ChatSnapshot],
    ) -> None:
        if self.running:
            raise RuntimeError("an export is already running")
        self._cancel = threading.Event()
        step = cancellable_step(self._cancel, self.progressed.emit)
        self._thread = threading.Thread(
            target=self._run,
            args=(Path(destination), export_format, scope, chats, step),
            name="export",
            daemon=True,
        )
        self._thread.start()

    def cancel(self) -> None:
        self._cancel.set()

    def wait(self, timeout: float | None = None) -> None:
        """Block until the export thread has ended (the window's close, tests)."""
        if self._thread is not None:
            self._thread.join(timeout)

    def _run(self, destination, export_format, scope, chats, step) -> None:
        # Signals emitted here are queued to the receivers' (GUI) thread.
        try:
            path = run_export(destination, export_format, scope, chats, step)
        except ExportCancelled:
            self.cancelled.emit()
        except ExportError as exc:
            self.failed.emit(f"Could not write {exc.path}: {exc.problem}.")
        except Exception as exc:  # a bug must still end the export visibly, not hang it
            self.failed.emit(f"Could not write {destination}: {type(exc).__name__}: {exc}")
        else:
            self.finished.emit(str(path))
