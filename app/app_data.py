"""Open the app's own data (chats database and settings) so that start-up never fails on it.

A damaged database is kept aside and what it holds is recovered (app/recovery.py); a data
directory that cannot be written gives an in-memory copy of the chats, so the app works and says
that nothing will be saved; an unusable settings file gives the defaults. Every such event becomes
a notice for the user: shown in the window (a banner) and printed on stderr.
"""

from __future__ import annotations

import os
import sqlite3
import sys
from dataclasses import dataclass, field
from pathlib import Path

from app.recovery import (
    database_problem,
    is_damage,
    keep_aside,
    recover_database,
    recover_in_memory,
)
from app.regular_files import is_special
from app.settings import Settings, SettingsFile
from app.store import Store, StoreError, create_private_dir


@dataclass
class AppData:
    store: Store
    settings: Settings
    settings_file: SettingsFile
    notices: list[str] = field(default_factory=list)

    @property
    def read_only(self) -> bool:
        return not self.store.saves_to_disk


def open_app_data(
    db_path: Path, settings_file: SettingsFile, *, read_only: bool = False
) -> AppData:
    """The store and settings for the window. `read_only`: another window owns the data
    directory; chats are shown from an in-memory copy and nothing is written.

    Raises StoreError only for a database this version must not touch (newer schema, not a
    LocalChat database): that is not damage, and the user has to choose another directory."""
    notices: list[str] = []
    settings = settings_file.load()
    if settings_file.problem:
        notices.append(settings_file.problem)
    special = is_special(db_path)
    if special is not None:
        # A FIFO would block every open and a device never ends (a symlink to /dev/zero was
        # "recovered" by copying 7 GB): it is never opened, only moved aside when allowed.
        store = _replace_special(db_path, special, read_only, notices)
    elif read_only:
        settings_file.read_only = True
        store = Store.in_memory_copy(db_path)
        notices.append(
            "Read-only: another LocalChat window is using this data directory. Chats you "
            "write here are not saved."
        )
    elif not _writable_dir(db_path.parent) or _unwritable_file(db_path):
        problem = database_problem(db_path)
        if problem is None:
            store = Store.in_memory_copy(db_path)
        else:  # damaged and cannot be set aside: show what is readable, leave the file alone
            store, report = recover_in_memory(db_path, problem)
            notices.append(report.summary())
        notices.append(
            f"The data directory {db_path.parent} cannot be written: chats cannot be saved. "
            "You can chat, but nothing is kept after you close the app."
        )
    else:
        store = _open_or_recover(db_path, notices)
    for notice in notices:
        print(f"LocalChat: {notice}", file=sys.stderr)
    return AppData(store, settings, settings_file, notices)


def _replace_special(db_path: Path, kind: str, read_only: bool, notices: list[str]) -> Store:
    """A fresh database in place of the non-regular file at `db_path`, which is moved aside;
    an empty in-memory store when it must stay (another window owns the directory, or it
    cannot be moved)."""
    what = f"The chats database {db_path} is {kind}, not a regular file, and was not opened."
    if read_only:
        notices.append(f"{what} Chats in this window are not saved.")
        return Store.in_memory_copy(db_path)
    try:
        kept = keep_aside(db_path)
        store = Store(db_path)
    except (OSError, sqlite3.Error) as exc:
        notices.append(
            f"{what} It could not be replaced ({exc}). Chats in this window are not saved."
        )
        return Store.in_memory_copy(db_path)
    notices.append(f"{what} It was moved aside to {kept} and a new, empty database was created.")
    return store


def _open_or_recover(db_path: Path, notices: list[str]) -> Store:
    problem = database_problem(db_path)
    if problem is None:
        try:
            return Store(db_path)
        except StoreError:
            raise
        except (OSError, sqlite3.Error) as exc:
            if not (isinstance(exc, sqlite3.Error) and is_damage(exc)):
                # Locked, unreadable, disk full: not damage, so the file stays where it is.
                notices.append(
                    f"The chats database {db_path} cannot be opened ({exc}). Chats in this "
                    "window are not saved."
                )
                return Store.in_memory_copy(db_path)
            problem = str(exc)  # damage the read-only check could not see (a bad WAL)
    try:
        store, report = recover_database(db_path, problem)
    except (OSError, sqlite3.Error) as exc:
        notices.append(
            f"The chat database {db_path} is damaged ({problem}) and could not be set aside "
            f"({exc}). Chats in this window are not saved."
        )
        return Store.in_memory_copy(db_path)
    notices.append(report.summary())
    return store


def _writable_dir(directory: Path) -> bool:
    """Whether a file can really be created in `directory` (os.access says yes to root on a
    read-only mount, so try it)."""
    probe = directory / f".localchat-write-probe-{os.getpid()}"
    try:
        create_private_dir(directory)
        os.close(os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
        probe.unlink()
    except OSError:
        return False
    return True


def _unwritable_file(path: Path) -> bool:
    return path.exists() and not os.access(path, os.W_OK)
