"""A full disk while a reply streams (issue 17). Before: ~200 tracebacks (one per save attempt),
the final reply lost, the window stuck on "Generating..." with Send disabled. Now: a "disk full"
banner, the reply kept in memory and shown, saving retried on a timer and on the next send, and
the window usable. Simulated by a connection that fails writes the way SQLite does, and once for
real on a tiny tmpfs where that is possible."""

import sqlite3
import textwrap

import pytest
from PySide6.QtCore import Qt

from app.controller import EngineController
from app.settings import SettingsFile
from app.store import STATUS_COMPLETE, STATUS_STREAMING, Store
from app.views.main_window import MainWindow
from tests.app_fakes import FakeEngine
from tests.data_dir_helpers import root_can_mount, run_python_in_mount

WRITES = ("INSERT", "UPDATE", "DELETE", "BEGIN", "COMMIT")
REPLY = " ".join(f"word{i}" for i in range(60))


class FullDiskConnection(sqlite3.Connection):
    """Refuses every write with SQLite's own error while `full` is set."""

    full = False
    refused = 0

    def execute(self, sql, *args):
        if self.full and sql.lstrip().split(None, 1)[0].upper() in WRITES:
            self.refused += 1
            raise sqlite3.OperationalError("database or disk is full")
        return super().execute(sql, *args)


def full_disk_window(qtbot, tmp_path, engine):
    store = Store(
        tmp_path / "chats.sqlite3",
        connect=lambda path, **kw: sqlite3.connect(path, factory=FullDiskConnection, **kw),
    )
    settings_file = SettingsFile(tmp_path / "settings.json")
    controller = EngineController(engine)
    window = MainWindow(controller, store, settings_file.load(), settings_file)
    window.save_retry_timer.setInterval(50)
    qtbot.addWidget(window)
    window.show()
    with qtbot.waitSignal(controller.modelLoaded, timeout=5000):
        window.open_model("/models/fake-model.gguf")
    return window, store._db


def stored_reply(tmp_path):
    db = sqlite3.connect(tmp_path / "chats.sqlite3")
    row = db.execute(
        "SELECT content, status FROM messages WHERE role='assistant' ORDER BY id DESC"
    ).fetchone()
    db.close()
    return row


def test_disk_full_mid_stream_keeps_the_reply_and_saves_it_when_space_returns(qtbot, tmp_path):
    engine = FakeEngine(replies=[REPLY, "second answer"], token_delay_s=0.002, pause_after=10)
    window, db = full_disk_window(qtbot, tmp_path, engine)
    window.input.setPlainText("a long answer please")
    qtbot.keyClick(window.input, Qt.Key_Return)
    qtbot.waitUntil(lambda: window.chat_view.streaming_widget is not None, timeout=5000)
    db.full = True
    with qtbot.waitSignal(window.session.busyChanged, timeout=10000):
        engine.gate.set()

    # The reply is whole on screen, the window says why it is not saved, and it is usable.
    assert window.chat_view.widgets[-1].text == REPLY
    assert window.notice_banner.isVisible() and "Disk full" in window.notice_banner.text
    assert window.send_button.isEnabled() and not window.cancel_button.isEnabled()
    assert not window.state_label.text().startswith("Generating")
    assert db.refused >= 1
    content, status = stored_reply(tmp_path)
    assert status == STATUS_STREAMING and content != REPLY  # not saved yet

    # Still full: a new message is refused with the banner, its text stays in the input box.
    window.input.setPlainText("next question")
    qtbot.keyClick(window.input, Qt.Key_Return)
    assert window.input.toPlainText() == "next question"
    assert "Disk full" in window.notice_banner.text

    # Space returns: the timer saves the reply and the banner goes away.
    db.full = False
    qtbot.waitUntil(lambda: stored_reply(tmp_path) == (REPLY, STATUS_COMPLETE), timeout=10000)
    qtbot.waitUntil(lambda: not window.notice_banner.isVisible(), timeout=10000)
    with qtbot.waitSignal(window.session.busyChanged, timeout=10000):
        qtbot.keyClick(window.input, Qt.Key_Return)
    qtbot.waitUntil(lambda: not window.session.busy, timeout=10000)
    assert stored_reply(tmp_path) == ("second answer", STATUS_COMPLETE)
    window.close()
    window.store.close()


def test_final_save_failure_is_retried_on_the_next_send(qtbot, tmp_path):
    engine = FakeEngine(replies=["first reply here", "second"], pause_after=1)
    window, db = full_disk_window(qtbot, tmp_path, engine)
    window.save_retry_timer.setInterval(3_600_000)  # only the send may retry here
    window.input.setPlainText("one")
    qtbot.keyClick(window.input, Qt.Key_Return)
    qtbot.waitUntil(lambda: window.chat_view.streaming_widget is not None, timeout=5000)
    db.full = True
    with qtbot.waitSignal(window.session.busyChanged, timeout=10000):
        engine.gate.set()
    assert stored_reply(tmp_path)[1] == STATUS_STREAMING
    db.full = False
    window.input.setPlainText("two")
    qtbot.keyClick(window.input, Qt.Key_Return)
    qtbot.waitUntil(lambda: not window.session.busy, timeout=10000)
    replies = sqlite3.connect(tmp_path / "chats.sqlite3").execute(
        "SELECT content, status FROM messages WHERE role='assistant' ORDER BY position"
    )
    assert replies.fetchall() == [("first reply here", "complete"), ("second", "complete")]
    # The request for the second reply carried the first one, from memory.
    assert engine.requests[-1].messages[1] == {"role": "assistant", "content": "first reply here"}
    window.close()
    window.store.close()


# The real thing: a 1 MiB tmpfs filled up after the reply has started.
REAL_DISK_CHILD = textwrap.dedent("""
    import errno, sys
    from pathlib import Path
    from PySide6.QtCore import QTimer
    from PySide6.QtWidgets import QApplication
    from app.controller import EngineController
    from app.settings import SettingsFile
    from app.store import Store
    from app.views.main_window import MainWindow
    from tests.app_fakes import FakeEngine

    data = Path(sys.argv[1])
    reply = " ".join(f"word{i:05d}" for i in range(30000))  # ~300 KB
    app = QApplication([])
    engine = FakeEngine(replies=[reply])
    settings_file = SettingsFile(data / "settings.json")
    window = MainWindow(EngineController(engine), Store(data / "chats.sqlite3"),
                        settings_file.load(), settings_file)
    window.save_retry_timer.setInterval(100)
    window.show()
    filler = data / "filler"

    def fill_disk(message):
        if message.role != "assistant":
            return
        with open(filler, "wb", buffering=0) as f:
            try:
                while True:
                    f.write(b"x" * 4096)
            except OSError as exc:
                assert exc.errno == errno.ENOSPC
        print("FILLED", flush=True)

    def on_finished(stored):
        print("SHOWN", window.chat_view.widgets[-1].text == reply)
        print("BANNER", window.notice_banner.isVisible(), window.notice_banner.text[:9])
        print("SEND", window.send_button.isEnabled(), flush=True)
        filler.unlink()
        QTimer.singleShot(0, wait_for_save)

    def wait_for_save():
        if window.notice_banner.isVisible():
            QTimer.singleShot(100, wait_for_save)
            return
        saved = window.store.messages(window.session.conversation_id)[-1]
        print("SAVED", saved.content == reply, saved.status, flush=True)
        app.quit()

    window.session.messageAdded.connect(fill_disk)
    window.session.replyFinished.connect(on_finished)
    window.controller.modelLoaded.connect(lambda _i: (window.input.setPlainText("hi"), window.send()))
    window.open_model("/models/fake.gguf")
    QTimer.singleShot(60000, app.quit)
    app.exec()
""")


@pytest.mark.skipif(not root_can_mount(), reason="needs root and unshare for a tiny tmpfs")
def test_real_full_disk_on_a_tiny_tmpfs(tmp_path):
    data_dir = tmp_path / "data"
    data_dir.mkdir()
    run = run_python_in_mount(data_dir, REAL_DISK_CHILD, str(data_dir), size="1m")
    assert "FILLED" in run.stdout, run.stderr[-3000:]
    assert "SHOWN True" in run.stdout and "BANNER True Disk full" in run.stdout, run.stdout
    assert "SEND True" in run.stdout
    assert "SAVED True complete" in run.stdout, run.stdout + run.stderr[-3000:]
    assert "Traceback" not in run.stderr, run.stderr[-3000:]


def test_chat_actions_on_a_full_disk_report_it_instead_of_raising(qtbot, tmp_path):
    window, db = full_disk_window(qtbot, tmp_path, FakeEngine())
    chats = len(window.store.list_conversations())
    db.full = True
    window.new_chat()
    window.session.rename_conversation(window.session.conversation_id, "renamed")
    window.system_prompt.setText("be brief")
    window.input.setPlainText("hello")
    window.send()
    assert "Disk full" in window.notice_banner.text and window.notice_banner.isVisible()
    assert len(window.store.list_conversations()) == chats
    assert window.input.toPlainText() == "hello" and window.send_button.isEnabled()
    db.full = False
    with qtbot.waitSignal(window.session.busyChanged, timeout=10000):
        window.send()
    qtbot.waitUntil(lambda: not window.session.busy, timeout=10000)
    assert not window.notice_banner.isVisible()
    window.close()
    window.store.close()
