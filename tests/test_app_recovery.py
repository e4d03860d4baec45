"""The app starts whatever state its own data is in (issue 17): a damaged chats database is kept
aside and recovered, a read-only data directory gives a working window that says chats are not
saved, and a pathological settings file gives the defaults. Files are created 0600 in 0700
directories."""

import functools
import hashlib
import json
import os
import sqlite3
import stat
import subprocess
import sys
import textwrap

import pytest

import app.app_data
from app.app_data import open_app_data
from app.recovery import database_problem
from app.settings import Settings, SettingsFile
from app.store import Store
from tests.data_dir_helpers import (
    MARKER,
    REPO,
    flip_marker_byte,
    make_chats,
    root_can_mount,
    run_python_in_mount,
)


def sha(path):
    return hashlib.sha256(path.read_bytes()).hexdigest()


def open_data(tmp_path):
    return open_app_data(tmp_path / "chats.sqlite3", SettingsFile(tmp_path / "settings.json"))


def kept_files(tmp_path):
    return [p for p in tmp_path.iterdir() if p.name.startswith("chats.sqlite3.damaged-")]


def test_one_invalid_byte_in_a_message_is_found_repaired_and_the_original_kept(tmp_path):
    db = tmp_path / "chats.sqlite3"
    make_chats(db).close()
    flip_marker_byte(db)
    assert sqlite3.connect(db).execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    before = sha(db)
    assert "not valid UTF-8" in database_problem(db)

    data = open_data(tmp_path)
    store = data.store
    chats = store.list_conversations()
    assert len(chats) == 3
    messages = [m for c in chats for m in store.messages(c.id)]
    assert len(messages) == 24
    damaged = [m for m in messages if MARKER[1:] in m.content]
    assert len(damaged) == 1 and damaged[0].content.startswith("question 2.0 \ufffd")
    assert all(m.usage == {"n": int(m.content.split(".")[1][0])} for m in messages[1::2])
    (kept,) = [p for p in kept_files(tmp_path) if not p.name.endswith(("-wal", "-shm"))]
    assert sha(kept) == before  # the original, byte for byte
    (notice,) = data.notices
    assert "Recovered 3 chats and 24 messages" in notice and str(kept) in notice
    assert database_problem(db) is None
    store.close()


@pytest.mark.parametrize("damage", ["garbage", "truncated", "zeroed_page"])
def test_damaged_file_is_kept_and_what_is_readable_recovered(tmp_path, damage):
    db = tmp_path / "chats.sqlite3"
    # Enough messages that half the file holds some: the schema's own pages (tables, indexes,
    # the search index's shadow tables) fill the first ~20 pages before any message.
    make_chats(db, n_chats=10, n_pairs=6, filler=800).close()
    data = db.read_bytes()
    assert len(data) > 48 * 4096
    if damage == "garbage":
        damaged = os.urandom(len(data))
    elif damage == "truncated":
        damaged = data[: len(data) // 2]
    else:  # the page holding a message of the middle chat zeroed (not an index or schema page)
        page = data.find(b"answer 5.3 ") // 4096
        assert page > 0
        damaged = data[: page * 4096] + bytes(4096) + data[(page + 1) * 4096 :]
    db.write_bytes(damaged)
    assert database_problem(db) is not None

    result = open_data(tmp_path)
    store = result.store
    recovered = sum(len(store.messages(c.id)) for c in store.list_conversations())
    (kept,) = [p for p in kept_files(tmp_path) if not p.name.endswith(("-wal", "-shm"))]
    assert kept.read_bytes() == damaged
    assert "damaged" in result.notices[0] and str(kept) in result.notices[0]
    if damage == "garbage":
        assert recovered == 0
    else:
        assert 0 < recovered < 120  # what the intact pages hold, no more
    # The fresh database is healthy and writable.
    cid = store.create_conversation("after recovery")
    store.add_message(cid, "user", "still works")
    assert store.integrity_check() == "ok"
    store.close()


def test_healthy_database_is_left_alone(tmp_path):
    make_chats(tmp_path / "chats.sqlite3").close()
    data = open_data(tmp_path)
    assert data.notices == [] and kept_files(tmp_path) == []
    assert len(data.store.list_conversations()) == 3
    data.store.close()


# The real entry point over the fake engine: before the fix, the decode error escaped while the
# window was built and Qt aborted (SIGABRT, exit status 134) because the engine thread was running.
START_APP = textwrap.dedent("""
    import sys
    import app.engine_bridge
    from PySide6.QtCore import QTimer
    from PySide6.QtWidgets import QApplication, QMessageBox
    from tests.app_fakes import FakeEngine

    app.engine_bridge.RealEngine = lambda: FakeEngine()
    QMessageBox.critical = lambda *a, **k: print("DIALOG", a[2], file=sys.stderr)
    qapp = QApplication([])

    def report():
        from app.views.main_window import MainWindow

        try:
            window = next(w for w in qapp.topLevelWidgets() if isinstance(w, MainWindow))
            banner = window.notice_banner
            print("BANNER", banner.isVisible(), banner.text.replace("\\n", " "))
            print("CHATS", len(window.store.list_conversations()))
        finally:
            qapp.quit()

    QTimer.singleShot(1000, report)
    from app.__main__ import main
    sys.exit(main(["--data-dir", sys.argv[1], "--model", sys.argv[2]]))
""")


def start_app(data_dir, tmp_path):
    model = tmp_path / "fake.gguf"
    model.write_bytes(b"GGUF")
    return subprocess.run(
        [sys.executable, "-c", START_APP, str(data_dir), str(model)],
        env=dict(os.environ, QT_QPA_PLATFORM="offscreen", PYTHONPATH=str(REPO)),
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_app_starts_on_a_database_with_an_invalid_byte(tmp_path):
    data_dir = tmp_path / "data"
    data_dir.mkdir()
    make_chats(data_dir / "chats.sqlite3").close()
    flip_marker_byte(data_dir / "chats.sqlite3")
    run = start_app(data_dir, tmp_path)
    assert run.returncode == 0, run.stderr[-2000:]
    assert "BANNER True The chat database was damaged" in run.stdout
    assert "CHATS 3" in run.stdout
    assert "Recovered 3 chats and 24 messages" in run.stderr  # and on stderr


def test_pathological_settings_file_gives_defaults_and_is_kept(tmp_path):
    path = tmp_path / "settings.json"
    path.write_text("[" * 1000 + "]" * 1000)  # RecursionError in json.loads
    settings_file = SettingsFile(path)
    assert settings_file.load() == Settings()
    assert "nested too deeply" in settings_file.problem
    assert settings_file.kept_as.read_text() == "[" * 1000 + "]" * 1000
    assert not path.exists()  # the next save cannot overwrite the user's file
    path.write_text(json.dumps({"theme": {"a": 1}, "font_size": "big"}))
    assert SettingsFile(path).load() == Settings()


def test_app_starts_with_a_deeply_nested_settings_file_and_schema(tmp_path):
    data_dir = tmp_path / "data"
    data_dir.mkdir()
    deep_schema = '{"properties": {"a": ' * 600 + "{}" + "}}" * 600
    (data_dir / "settings.json").write_text(json.dumps({"json_schema": deep_schema}))
    run = start_app(data_dir, tmp_path)
    assert run.returncode == 0, run.stderr[-2000:]
    (data_dir / "settings.json").write_text("{" * 1000)
    run = start_app(data_dir, tmp_path)
    assert run.returncode == 0, run.stderr[-2000:]
    assert "BANNER True The settings file" in run.stdout


def test_files_are_0600_in_0700_directories(tmp_path):
    data_dir = tmp_path / "new" / "data"
    store = Store(data_dir / "chats.sqlite3")
    store.add_message(store.create_conversation(), "user", "hi")
    SettingsFile(data_dir / "settings.json").save(Settings())
    assert stat.S_IMODE(data_dir.stat().st_mode) == 0o700
    for name in ("chats.sqlite3", "chats.sqlite3-wal", "chats.sqlite3-shm", "settings.json"):
        assert stat.S_IMODE((data_dir / name).stat().st_mode) == 0o600, name
    store.close()
    # An existing world-readable database is tightened on open.
    (data_dir / "chats.sqlite3").chmod(0o644)
    Store(data_dir / "chats.sqlite3").close()
    assert stat.S_IMODE((data_dir / "chats.sqlite3").stat().st_mode) == 0o600


READ_ONLY_CHILD = textwrap.dedent("""
    import sys
    from pathlib import Path
    from app.app_data import open_app_data
    from app.settings import Settings, SettingsFile

    data = Path(sys.argv[1])
    result = open_app_data(data / "chats.sqlite3", SettingsFile(data / "settings.json"))
    store = result.store
    titles = sorted(c.title for c in store.list_conversations())
    cid = store.create_conversation("typed while read-only")
    store.add_message(cid, "user", "hello")
    print("READ_ONLY", result.read_only)
    print("TITLES", titles)
    print("WORKS", [m.content for m in store.messages(cid)])
    print("SETTINGS_SAVED", result.settings_file.save(Settings()))
    print("NOTICE", " ".join(result.notices))
""")


@pytest.mark.skipif(not root_can_mount(), reason="needs root and unshare for a read-only mount")
@pytest.mark.parametrize("damaged", [False, True])
def test_read_only_data_directory_opens_a_working_copy(tmp_path, damaged):
    data_dir = tmp_path / "data"
    data_dir.mkdir()
    make_chats(data_dir / "chats.sqlite3").close()
    if damaged:
        flip_marker_byte(data_dir / "chats.sqlite3")
    before = sha(data_dir / "chats.sqlite3")
    run = run_python_in_mount(data_dir, READ_ONLY_CHILD, str(data_dir), size="4m", read_only=True)
    assert run.returncode == 0, run.stderr[-3000:]
    assert "READ_ONLY True" in run.stdout
    assert "TITLES ['chat 0', 'chat 1', 'chat 2']" in run.stdout
    assert "WORKS ['hello']" in run.stdout and "SETTINGS_SAVED False" in run.stdout
    assert "cannot be written: chats cannot be saved" in run.stdout
    if damaged:
        assert "Recovered 3 chats and 24 messages into this window (not saved)" in run.stdout
    assert sha(data_dir / "chats.sqlite3") == before


class QuickBusyTimeoutStore(Store):
    """The app's Store, giving up on a locked database after 0.1 s instead of sqlite's default
    5 s busy timeout: the test needs the lock to be seen, not the wait (it was the suite's
    longest idle 5 s)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, connect=functools.partial(sqlite3.connect, timeout=0.1), **kwargs)


def test_locked_database_is_not_mistaken_for_damage(tmp_path, monkeypatch):
    monkeypatch.setattr(app.app_data, "Store", QuickBusyTimeoutStore)
    db = tmp_path / "chats.sqlite3"
    make_chats(db).close()
    holder = sqlite3.connect(db, isolation_level=None)
    holder.execute("BEGIN EXCLUSIVE")  # e.g. a database browser in the middle of a write
    try:
        data = open_data(tmp_path)
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    assert kept_files(tmp_path) == []
    assert "cannot be opened (database is locked)" in data.notices[0]
    assert len(data.store.list_conversations()) == 3 and not data.store.saves_to_disk
    data.store.close()


def test_app_creates_its_data_directory_0700(tmp_path):
    data_dir = tmp_path / "fresh" / "data"
    run = start_app(data_dir, tmp_path)
    assert run.returncode == 0, run.stderr[-2000:]
    assert stat.S_IMODE(data_dir.stat().st_mode) == 0o700
    assert stat.S_IMODE((data_dir / "chats.sqlite3").stat().st_mode) == 0o600
    assert stat.S_IMODE((data_dir / "settings.json").stat().st_mode) == 0o600


def test_a_table_whose_root_page_was_cut_off_does_not_hide_the_tables_still_there(tmp_path):
    # Cut the file before its first message page and the table just before it (the last one
    # the schema created): every chat row (page 3) is intact, but a table's root page is gone
    # and SQLite refuses the whole schema unless told to read on.
    db = tmp_path / "chats.sqlite3"
    make_chats(db, n_chats=4, n_pairs=2, filler=800).close()
    data = db.read_bytes()
    first_message_page = data.find(b"question 0.0 ") // 4096
    assert first_message_page > 3
    db.write_bytes(data[: (first_message_page - 1) * 4096])
    assert database_problem(db) is not None

    result = open_data(tmp_path)
    titles = sorted(c.title for c in result.store.list_conversations())
    assert titles == ["chat 0", "chat 1", "chat 2", "chat 3"]
    result.store.close()
