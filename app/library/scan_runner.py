"""Runs library scans off the GUI thread and hands the result back through a Qt signal.

A plain daemon thread, not the engine's QThread: a scan only reads file headers and must not wait
behind a model load or a generation. The signal is emitted from that thread; Qt queues it to the
receiver's (GUI) thread. A newer scan supersedes an older one: only the latest result is emitted.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

from PySide6.QtCore import QObject, Signal

from app.library.scan import LibraryScanner, ModelFolder, known_model_folders


class LibraryScanRunner(QObject):
    finished = Signal(list, float)  # list[ModelFileSummary], seconds the scan took
    failed = Signal(str)

    def __init__(self, parent: QObject | None = None, known: list[ModelFolder] | None = None):
        super().__init__(parent)
        self.scanner = LibraryScanner()
        self.known = known_model_folders() if known is None else known
        self._generation = 0
        self._lock = threading.Lock()
        self._threads: list[threading.Thread] = []

    def folders(self, chosen: list[str]) -> list[ModelFolder]:
        """The user's folders first (their names win when a file is in both), then the tools'."""
        return [ModelFolder(Path(p), "Your folder") for p in chosen] + list(self.known)

    def scan(self, chosen: list[str]) -> None:
        with self._lock:
            self._generation += 1
            generation = self._generation
        folders = self.folders(chosen)

        def superseded() -> bool:
            return generation != self._generation

        def run() -> None:
            start = time.perf_counter()
            try:
                result = self.scanner.scan(folders, cancelled=superseded)
            except Exception as exc:  # a bug must reach the user, not kill the thread silently
                if not superseded():
                    self.failed.emit(f"The scan failed: {type(exc).__name__}: {exc}")
                return
            if not superseded():
                self.finished.emit(result, time.perf_counter() - start)

        thread = threading.Thread(target=run, name="library-scan", daemon=True)
        self._threads = [t for t in self._threads if t.is_alive()] + [thread]
        thread.start()

    def wait(self, timeout: float = 10.0) -> None:
        """For shutdown and tests: let running scans end."""
        for thread in self._threads:
            thread.join(timeout)
