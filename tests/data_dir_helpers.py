"""Helpers for tests of the app's own data: a chats database with known content, damaged copies
of it, and running a child process in a data directory the OS will not let it write."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

from app.store import Store

REPO = Path(__file__).resolve().parent.parent
MARKER = "MARKER-that-gets-a-bad-byte"


def make_chats(db_path: Path, n_chats: int = 3, n_pairs: int = 4, filler: int = 0) -> Store:
    """`n_chats` chats of `n_pairs` question/answer pairs; message text padded with `filler`
    characters so the database spans many pages. The first user message of the last chat contains MARKER."""
    store = Store(db_path)
    for c in range(n_chats):
        cid = store.create_conversation(f"chat {c}")
        for p in range(n_pairs):
            last_chat = c == n_chats - 1  # the newest chat: the one the window opens first
            text = f"question {c}.{p}" + (f" {MARKER}" if last_chat and p == 0 else "")
            store.add_message(cid, "user", text + " " + "q" * filler)
            store.add_message(cid, "assistant", f"answer {c}.{p} " + "a" * filler, usage={"n": p})
    store._db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    return store


def flip_marker_byte(db_path: Path) -> None:
    """Overwrite the first byte of MARKER inside the file with 0xFF (invalid UTF-8). SQLite's
    integrity check still passes: it does not look inside text."""
    data = bytearray(db_path.read_bytes())
    at = data.find(MARKER.encode())
    assert at > 0, "marker not found in the database file"
    data[at] = 0xFF
    db_path.write_bytes(bytes(data))


def root_can_mount() -> bool:
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        return False
    probe = subprocess.run(
        ["unshare", "-m", "sh", "-c", "mount -t tmpfs -o size=64k tmpfs /mnt && umount /mnt"],
        capture_output=True,
    )
    return probe.returncode == 0


def run_python_in_mount(
    mount_dir: Path, script: str, *args: str, size: str, read_only: bool = False, timeout=120
) -> subprocess.CompletedProcess:
    """Run `script` with a fresh tmpfs of `size` mounted at `mount_dir` (in a private mount
    namespace, so nothing leaks out), after copying `mount_dir`'s current files into it;
    `read_only` remounts it read-only first. Needs root and unshare."""
    seed = mount_dir.with_name(mount_dir.name + "-seed")
    if seed.exists():
        shutil.rmtree(seed)
    shutil.copytree(mount_dir, seed)
    remount = f" && mount -o remount,ro {mount_dir}" if read_only else ""
    quoted_args = " ".join(f"'{a}'" for a in args)
    shell = (
        f"mount -t tmpfs -o size={size},mode=0700 tmpfs {mount_dir} && cp -a {seed}/. {mount_dir}/"
        f'{remount} && exec {sys.executable} -c "$SCRIPT" {quoted_args}'
    )
    env = dict(os.environ, SCRIPT=script, PYTHONPATH=str(REPO), QT_QPA_PLATFORM="offscreen")
    return subprocess.run(
        ["unshare", "-m", "sh", "-c", shell],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
