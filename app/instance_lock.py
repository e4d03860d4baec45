"""One writing LocalChat per data directory.

Two windows on one database both wrote into the same chat, and the second marked the first's
live reply "interrupted" (issue 17). The first instance holds an exclusive lock on a file in the
data directory; the OS releases it when the process ends however it ends, so a killed instance
never blocks the next one. A second instance either asks the first to bring its window forward or
opens read-only (app/app_data.py: an in-memory copy, no "interrupted" marking, nothing saved).

Bringing forward: the second instance drops a request file into the data directory and the
first, which watches the directory (QFileSystemWatcher), consumes it and raises its window. Not a
QLocalServer: QtNetwork is left out of the packaged app (packaging/localchat.spec), and a file in
a directory both already share needs no socket name or path-length rules.
"""

from __future__ import annotations

import contextlib
import os
import time
from pathlib import Path

from PySide6.QtCore import QCoreApplication, QFileSystemWatcher, QObject, Signal

LOCK_NAME = "localchat.lock"
RAISE_REQUEST_NAME = "localchat.raise-request"

try:
    import fcntl
except ImportError:  # Windows
    fcntl = None
    import msvcrt


class InstanceLock:
    """An exclusive, non-blocking lock on `<data_dir>/localchat.lock`, held while open."""

    def __init__(self, data_dir: Path):
        self.path = Path(data_dir) / LOCK_NAME
        self._fd: int | None = None

    @property
    def held(self) -> bool:
        return self._fd is not None

    def acquire(self) -> bool:
        """True if this process now holds the lock, or if no lock can exist here (a data
        directory that cannot be written is opened read-only anyway); False if another running
        instance holds it."""
        try:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
        except OSError:
            try:
                # Locking does not need write access: an existing lock file still works.
                fd = os.open(self.path, os.O_RDONLY)
            except OSError:
                return True
        try:
            _lock(fd)
        except OSError:
            os.close(fd)
            return False
        self._fd = fd
        with contextlib.suppress(OSError):
            os.ftruncate(fd, 0)
            os.write(fd, f"{os.getpid()}\n".encode())  # for a curious user; not used
        return True

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)  # closing drops the lock
            self._fd = None


def _lock(fd: int) -> None:
    if fcntl is not None:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    else:
        msvcrt.locking(fd, msvcrt.LK_NBLCK, 1)


class RaiseRequests(QObject):
    """In the instance holding the lock: emits `raiseRequested` when another instance asks."""

    raiseRequested = Signal()

    def __init__(self, data_dir: Path, parent: QObject | None = None):
        super().__init__(parent)
        self.request_path = Path(data_dir) / RAISE_REQUEST_NAME
        with contextlib.suppress(OSError):
            self.request_path.unlink()  # left by an instance that died waiting
        self._watcher = QFileSystemWatcher([str(data_dir)], self)
        self._watcher.directoryChanged.connect(self._check)

    def _check(self, _directory: str = "") -> None:
        try:
            self.request_path.unlink()
        except OSError:
            return  # not a request (the database changed), or already consumed
        self.raiseRequested.emit()


def request_raise(data_dir: Path, timeout_s: float = 3.0) -> bool:
    """From a second instance: ask the running one to bring its window forward. True if it took
    the request within `timeout_s`."""
    request = Path(data_dir) / RAISE_REQUEST_NAME
    try:
        request.write_bytes(b"raise\n")
    except OSError:
        return False
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not request.exists():
            return True
        QCoreApplication.processEvents()
        time.sleep(0.02)
    with contextlib.suppress(OSError):
        request.unlink()
    return False
