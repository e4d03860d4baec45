"""Special files in place of the app's own files (issue 31): a FIFO as the chats database or
settings.json hung start-up, a symlink to /dev/zero as the database was "recovered" by copying
7 GB, and /dev/zero as the settings file raised MemoryError. Only regular files are opened; a
special file is moved aside with a notice that names it, and the app starts.

Each start runs in a child process with a memory limit (RLIMIT_AS), a file-size limit
(RLIMIT_FSIZE) and a timeout, so a regression fails the test (a child killed by a signal or
timed out) instead of blocking pytest forever or filling the memory or disk of the machine.
"""

from __future__ import annotations

import json
import os
import resource
import stat
import subprocess
import sys
import textwrap

import pytest

from app.regular_files import FileTooLargeError, NotRegularFileError, read_regular
from app.settings import Settings, SettingsFile

pytestmark = pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs FIFOs (POSIX)")

_START = textwrap.dedent("""
    import json, sys
    from pathlib import Path
    from app.app_data import open_app_data
    from app.settings import SettingsFile

    d = Path(sys.argv[1])
    data = open_app_data(d / "chats.sqlite3", SettingsFile(d / "settings.json"))
    cid = data.store.create_conversation("after the start")
    data.store.add_message(cid, "user", "still works")
    data.settings_file.save(data.settings)
    print(json.dumps({
        "notices": data.notices,
        "chats": [c.title for c in data.store.list_conversations()],
        "saves": data.store.saves_to_disk,
        "theme": data.settings.theme,
    }))
""")


def _limits() -> None:  # in the child, before exec
    resource.setrlimit(resource.RLIMIT_AS, (2 * 2**30, 2 * 2**30))
    resource.setrlimit(resource.RLIMIT_FSIZE, (64 * 2**20, 64 * 2**20))


def start_in_child(data_dir) -> dict:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path), "QT_QPA_PLATFORM": "offscreen"}
    try:
        done = subprocess.run(
            [sys.executable, "-c", _START, str(data_dir)],
            capture_output=True,
            text=True,
            timeout=120,
            env=env,
            preexec_fn=_limits,
        )
    except subprocess.TimeoutExpired:
        pytest.fail("start-up blocked (killed after 120 s)")
    assert done.returncode == 0, f"start-up failed ({done.returncode}): {done.stderr[-3000:]}"
    return json.loads(done.stdout.strip().splitlines()[-1])


def aside(data_dir, name: str) -> list:
    return sorted(p for p in data_dir.iterdir() if p.name.startswith(name + "."))


@pytest.mark.parametrize("special", ["fifo", "dev_zero_link"])
def test_a_special_file_as_the_database_is_moved_aside_unread_and_a_new_one_made(tmp_path, special):
    db = tmp_path / "chats.sqlite3"
    if special == "fifo":
        os.mkfifo(db)
        kind = "a FIFO (named pipe)"
    else:
        db.symlink_to("/dev/zero")
        kind = "a device"
    result = start_in_child(tmp_path)

    (notice,) = result["notices"]
    (kept,) = aside(tmp_path, "chats.sqlite3")
    assert notice == (
        f"The chats database {db} is {kind}, not a regular file, and was not opened. It was "
        f"moved aside to {kept} and a new, empty database was created."
    )
    assert result["chats"] == ["after the start"] and result["saves"] is True
    if special == "fifo":
        assert stat.S_ISFIFO(kept.lstat().st_mode)
    else:
        assert os.readlink(kept) == "/dev/zero"  # the link itself moved, nothing copied
    assert stat.S_ISREG(db.lstat().st_mode)
    # Nothing the size of a device was written anywhere in the data directory.
    written = sum(p.lstat().st_size for p in tmp_path.rglob("*") if p.is_file())
    assert written < 10 * 2**20


@pytest.mark.parametrize("special", ["fifo", "dev_zero_link"])
def test_a_special_settings_file_gives_defaults_is_kept_aside_and_saving_works(tmp_path, special):
    settings = tmp_path / "settings.json"
    if special == "fifo":
        os.mkfifo(settings)
        kind = "a FIFO (named pipe)"
    else:
        settings.symlink_to("/dev/zero")
        kind = "a device"
    result = start_in_child(tmp_path)

    (kept,) = aside(tmp_path, "settings.json")
    (notice,) = result["notices"]
    assert notice == (
        f"The settings file {settings} is {kind}, not a regular file, and was not read; using "
        f"default settings. The old file is kept as {kept}"
    )
    assert result["theme"] == Settings().theme
    assert json.loads(settings.read_text())["theme"] == "system"  # saved as a regular file
    assert stat.S_ISREG(settings.lstat().st_mode)


def test_a_settings_file_over_the_size_cap_is_not_read(tmp_path, monkeypatch):
    import app.settings

    monkeypatch.setattr(app.settings, "MAX_SETTINGS_BYTES", 2**20)
    path = tmp_path / "settings.json"
    path.write_text(json.dumps({"theme": "dark", "json_schema": "x" * 2**20}))
    f = SettingsFile(path)
    assert f.load() == Settings()
    assert f.problem is not None
    assert "is larger than 1 MiB, too large to be settings; using default settings" in f.problem
    assert f.kept_as is not None and f.kept_as.stat().st_size > 2**20

    path.write_text(json.dumps({"theme": "dark"}))  # under the cap: read as before
    assert SettingsFile(path).load().theme == "dark"


def test_read_regular_refuses_without_opening_and_caps_the_size(tmp_path):
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    with pytest.raises(NotRegularFileError, match="is a FIFO"):
        read_regular(fifo, 100)  # would block here if it opened the FIFO
    with pytest.raises(NotRegularFileError, match="is a directory"):
        read_regular(tmp_path, 100)
    zero = tmp_path / "zero"
    zero.symlink_to("/dev/zero")
    with pytest.raises(NotRegularFileError, match="is a device"):
        read_regular(zero, 100)
    exact = tmp_path / "exact"
    exact.write_bytes(b"x" * 100)
    assert read_regular(exact, 100) == b"x" * 100
    exact.write_bytes(b"x" * 101)
    with pytest.raises(FileTooLargeError, match="larger than the limit of 100 bytes"):
        read_regular(exact, 100)
    with pytest.raises(FileNotFoundError):
        read_regular(tmp_path / "absent", 100)
