"""Reading the app's own files (settings, the chats database) only when they are regular files.

Opening a FIFO for reading blocks until a writer appears, so a FIFO named `settings.json` or
`chats.sqlite3` hung start-up; a device never ends, so `/dev/zero` as the settings file raised
MemoryError and as the database was "recovered" by copying 7 GB. The kind of file is checked with
stat (which never opens it) before anything opens it, the open itself is non-blocking in case the
path was swapped for a FIFO in between, and reads stop one byte past a size cap.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path


class NotRegularFileError(OSError):
    """The path exists but is not a regular file (`kind` says what it is); it was not opened."""

    def __init__(self, path: Path, kind: str):
        self.path, self.kind = path, kind
        super().__init__(f"{path} is {kind}, not a regular file")


class FileTooLargeError(OSError):
    """A regular file is larger than the cap its reader allows; nothing of it was kept."""

    def __init__(self, path: Path, limit: int):
        self.path, self.limit = path, limit
        super().__init__(f"{path} is larger than the limit of {limit:,} bytes")


def kind_of(mode: int) -> str:
    """What a non-regular file is, for a message ("a FIFO (named pipe)", "a directory", ...)."""
    if stat.S_ISDIR(mode):
        return "a directory"
    if stat.S_ISFIFO(mode):
        return "a FIFO (named pipe)"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    if stat.S_ISSOCK(mode):
        return "a socket"
    return "not a regular file"


def check_regular(path: Path) -> None:
    """Nothing if `path` (symlinks followed) is a regular file; NotRegularFileError otherwise.
    FileNotFoundError (and other OSErrors of stat) propagate."""
    mode = os.stat(path).st_mode
    if not stat.S_ISREG(mode):
        raise NotRegularFileError(path, kind_of(mode))


def is_special(path: Path) -> str | None:
    """What `path` is when it exists and is not a regular file (see kind_of), else None
    (a regular file, a missing path or one stat cannot reach)."""
    try:
        check_regular(path)
    except NotRegularFileError as exc:
        return exc.kind
    except OSError:
        return None
    return None


def read_regular(path: Path, max_bytes: int) -> bytes:
    """The bytes of the regular file at `path`, at most `max_bytes` of them.

    Raises FileNotFoundError, NotRegularFileError (never opened), FileTooLargeError, or the
    OSError of the open or read."""
    check_regular(path)
    # O_NONBLOCK: a FIFO swapped in after the check does not block the open; the fstat below
    # then refuses it before any read.
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    with os.fdopen(fd, "rb") as f:
        info = os.fstat(f.fileno())
        if not stat.S_ISREG(info.st_mode):
            raise NotRegularFileError(path, kind_of(info.st_mode))
        if info.st_size > max_bytes:  # refused unread; the read below stops a growing file
            raise FileTooLargeError(path, max_bytes)
        data = f.read(max_bytes + 1)
    if len(data) > max_bytes:
        raise FileTooLargeError(path, max_bytes)
    return data
