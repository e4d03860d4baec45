"""Two LocalChat instances on one data directory (issue 17): the second used to mark the first's
live reply "interrupted" and both wrote into the same chat. Now the first holds a lock, released
by the OS however the process ends; the second asks, then brings the first window forward or
opens read-only without touching the database."""

import hashlib
import os
import signal
import subprocess
import sys
import textwrap

from app.instance_lock import InstanceLock, RaiseRequests, request_raise
from app.store import STATUS_STREAMING
from tests.data_dir_helpers import REPO, make_chats

ENV = dict(os.environ, QT_QPA_PLATFORM="offscreen", PYTHONPATH=str(REPO))


def test_second_lock_on_a_directory_is_refused_until_released(tmp_path):
    first, second = InstanceLock(tmp_path), InstanceLock(tmp_path)
    assert first.acquire() and first.held
    assert not second.acquire() and not second.held
    first.release()
    assert second.acquire()
    second.release()


def test_killed_instance_never_blocks_the_next(tmp_path):
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time; from pathlib import Path; from app.instance_lock import "
            "InstanceLock; lock = InstanceLock(Path(sys.argv[1])); assert lock.acquire(); "
            "print('HELD', flush=True); time.sleep(600)",
            str(tmp_path),
        ],
        env=ENV,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "HELD"
        assert not InstanceLock(tmp_path).acquire()
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
        holder.stdout.close()
    lock = InstanceLock(tmp_path)
    assert lock.acquire()
    lock.release()


def test_raise_request_reaches_the_first_instance(qtbot, tmp_path):
    requests = RaiseRequests(tmp_path)
    with qtbot.waitSignal(requests.raiseRequested, timeout=10000):
        assert request_raise(tmp_path, timeout_s=10)
    assert not (tmp_path / "localchat.raise-request").exists()


def test_raise_request_without_a_listener_gives_up(tmp_path):
    assert not request_raise(tmp_path, timeout_s=0.2)
    assert not (tmp_path / "localchat.raise-request").exists()


# The real entry point as a second instance, over the fake engine, with the dialog answered.
SECOND_INSTANCE = textwrap.dedent("""
    import sys
    import app.engine_bridge
    import app.views.instance_dialog as dialog
    from PySide6.QtCore import QTimer
    from PySide6.QtWidgets import QApplication
    from tests.app_fakes import FakeEngine

    app.engine_bridge.RealEngine = lambda: FakeEngine()
    dialog.ask_about_running_instance = lambda data_dir: (print("ASKED", flush=True), sys.argv[3])[1]
    qapp = QApplication([])

    def report():
        from app.views.main_window import MainWindow

        try:
            window = next(w for w in qapp.topLevelWidgets() if isinstance(w, MainWindow))
            print("TITLE", window.windowTitle())
            print("BANNER", window.notice_banner.text.replace("\\\\n", " "))
            messages = window.store.messages(window.session.conversation_id)
            print("STATUSES", [m.status for m in messages])
        finally:
            qapp.quit()

    QTimer.singleShot(1000, report)
    from app.__main__ import main
    sys.exit(main(["--data-dir", sys.argv[1], "--model", sys.argv[2]]))
""")


def run_second_instance(data_dir, tmp_path, choice):
    model = tmp_path / "fake.gguf"
    model.write_bytes(b"GGUF")
    return subprocess.run(
        [sys.executable, "-c", SECOND_INSTANCE, str(data_dir), str(model), choice],
        env=ENV,
        capture_output=True,
        text=True,
        timeout=120,
    )


def live_reply_database(data_dir):
    """A database where the first instance is streaming a reply right now."""
    store = make_chats(data_dir / "chats.sqlite3")
    cid = store.list_conversations()[0].id
    store.add_message(cid, "user", "a question being answered")
    store.begin_reply(cid)
    store._db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    return store


def digest(path):
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_second_instance_read_only_leaves_the_live_reply_alone(tmp_path):
    data_dir = tmp_path / "data"
    data_dir.mkdir()
    first = live_reply_database(data_dir)  # the first instance's store, still open
    lock = InstanceLock(data_dir)
    assert lock.acquire()
    before = digest(data_dir / "chats.sqlite3")
    run = run_second_instance(data_dir, tmp_path, "read-only")
    assert run.returncode == 0, run.stderr[-3000:]
    assert "ASKED" in run.stdout and "TITLE LocalChat (read-only)" in run.stdout
    assert "Read-only: another LocalChat window" in run.stdout
    assert f"'{STATUS_STREAMING}']" in run.stdout  # shown as it is, not "interrupted"
    assert digest(data_dir / "chats.sqlite3") == before
    assert [m.status for m in first.messages(first.list_conversations()[0].id)][-1] == (
        STATUS_STREAMING
    )
    first.close()
    lock.release()


def test_second_instance_brings_the_first_window_forward_and_exits(qtbot, tmp_path):
    data_dir = tmp_path / "data"
    data_dir.mkdir()
    lock = InstanceLock(data_dir)
    assert lock.acquire()
    requests = RaiseRequests(data_dir)
    raised = []
    requests.raiseRequested.connect(lambda: raised.append(True))
    model = tmp_path / "fake.gguf"
    model.write_bytes(b"GGUF")
    second = subprocess.Popen(
        [sys.executable, "-c", SECOND_INSTANCE, str(data_dir), str(model), "show"],
        env=ENV,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    qtbot.waitUntil(lambda: bool(raised), timeout=60000)
    out, err = second.communicate(timeout=60)
    assert second.returncode == 0, err[-3000:]
    assert "ASKED" in out and "TITLE" not in out  # no second window
    assert not (data_dir / "chats.sqlite3").exists()  # and it opened no database
    lock.release()
