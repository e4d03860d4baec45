"""Hub searches, listings and downloads off the GUI thread (app/library/hub.py does the work).

Each operation runs on its own daemon thread with a fresh HubClient, so HF_ENDPOINT and
HF_HUB_OFFLINE are read when the user acts. Results come back as Qt signals (queued to the GUI
thread). One download at a time; stop() sets its cancel event, and the partial file is kept so
the next download of the same file continues it.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from PySide6.QtCore import QObject, Signal

from app.library.hub import DownloadCancelled, HubClient, HubError, RemoteFile

PROGRESS_INTERVAL_S = 0.1  # at most ten progress signals a second


class DownloadRunner(QObject):
    searched = Signal(str, list)  # query, list[RepoHit]
    listed = Signal(str, list, dict)  # repo id, list[RemoteFile], filename -> cached path
    progress = Signal(object, object)  # bytes done, total bytes or None
    downloaded = Signal(str)  # path of the file in the cache
    stopped = Signal(str)  # the user stopped it (message says the partial file is kept)
    failed = Signal(str)  # a message for the user

    def __init__(
        self, parent: QObject | None = None, client_factory: Callable[[], HubClient] = HubClient
    ):
        super().__init__(parent)
        self.client_factory = client_factory
        self._cancel: threading.Event | None = None
        self._threads: list[threading.Thread] = []

    @property
    def endpoint(self) -> str:
        return self.client_factory().endpoint

    @property
    def downloading(self) -> bool:
        return self._cancel is not None

    def search(self, query: str) -> None:
        self._run(lambda c: self.searched.emit(query, c.search(query)))

    def list_files(self, repo_id: str) -> None:
        def work(client: HubClient) -> None:
            files = client.gguf_files(repo_id)
            cached = {}
            for f in files:
                path = client.cached_path(repo_id, f.filename)
                if path is not None:
                    cached[f.filename] = str(path)
            self.listed.emit(repo_id, files, cached)

        self._run(work)

    def download(self, remote: RemoteFile) -> None:
        if self._cancel is not None:
            self.failed.emit("A download is already running; stop it first.")
            return
        cancel = self._cancel = threading.Event()
        last = [0.0]

        def report(done: int, total: int | None) -> None:
            now = time.monotonic()
            if now - last[0] >= PROGRESS_INTERVAL_S or done == total:
                last[0] = now
                self.progress.emit(done, total)

        def work(client: HubClient) -> None:
            try:
                path = client.download(
                    remote.repo_id,
                    remote.filename,
                    expected_sha256=remote.sha256,
                    progress=report,
                    cancel=cancel,
                )
            finally:
                self._cancel = None
            self.downloaded.emit(str(path))

        self._run(work)

    def stop(self) -> None:
        if self._cancel is not None:
            self._cancel.set()

    def wait(self, timeout: float = 30.0) -> None:
        for thread in self._threads:
            thread.join(timeout)

    def _run(self, work: Callable[[HubClient], None]) -> None:
        def run() -> None:
            try:
                work(self.client_factory())
            except DownloadCancelled as exc:
                self.stopped.emit(str(exc))
            except HubError as exc:
                self.failed.emit(str(exc))
            except Exception as exc:  # a bug must reach the user, not end the thread silently
                self.failed.emit(f"{type(exc).__name__}: {exc}")

        thread = threading.Thread(target=run, name="hub", daemon=True)
        self._threads = [t for t in self._threads if t.is_alive()] + [thread]
        thread.start()
