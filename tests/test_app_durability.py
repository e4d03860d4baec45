"""Durability: the app is SIGKILLed while a reply streams; the database must open cleanly with the
completed messages and the partial reply (saved at most app.reply_recorder.SAVE_INTERVAL_S behind) intact."""

import os
import queue
import signal
import sqlite3
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

from app.store import Store

REPO = Path(__file__).resolve().parent.parent
# 2000 tokens at 20 ms each: the reply streams for 40 s or more, far longer than the test needs.
WORDS = [f"word{i}" for i in range(2000)]
LONG_REPLY = " ".join(WORDS)
STARTUP_TIMEOUT_S = 120  # the child imports Qt and numpy on a shared machine
STREAM_TIMEOUT_S = 60

# The real window, session, recorder and store over a fake engine that streams slowly (20 ms per
# token), so the kill lands in the middle of the second reply.
CHILD = textwrap.dedent(f"""
    import sys
    from pathlib import Path
    from PySide6.QtWidgets import QApplication
    from app.controller import EngineController
    from app.settings import SettingsFile
    from app.store import Store
    from app.views.main_window import MainWindow
    from tests.app_fakes import FakeEngine

    data = Path(sys.argv[1])
    app = QApplication([])
    engine = FakeEngine(replies=["The first answer is complete.", {LONG_REPLY!r}], token_delay_s=0.02)
    controller = EngineController(engine)
    settings_file = SettingsFile(data / "settings.json")
    window = MainWindow(controller, Store(data / "chats.sqlite3"), settings_file.load(), settings_file)
    window.show()

    def on_loaded(_info):
        window.input.setPlainText("First question")
        window.send()

    def on_finished(stored):
        if stored.content.startswith("The first"):
            window.input.setPlainText("Second question, answered at length")
            window.send()
            print("STREAMING", flush=True)

    controller.modelLoaded.connect(on_loaded)
    window.session.replyFinished.connect(on_finished)
    window.open_model("/models/fake.gguf")
    app.exec()
""")


def partial_reply_length(db_path: Path) -> int:
    try:
        db = sqlite3.connect(f"file:{db_path}?mode=ro", uri=True, timeout=1)
        row = db.execute("SELECT length(content) FROM messages WHERE status='streaming'").fetchone()
        db.close()
        return row[0] if row else 0
    except sqlite3.Error:
        return 0


def wait_for(condition, timeout_s: float, what: str):
    """Poll `condition` until it returns a truthy value; fail naming `what` after a generous
    deadline (the machine may be busy, so the deadline is never part of what is tested)."""
    deadline = time.monotonic() + timeout_s
    while not (value := condition()):
        assert time.monotonic() < deadline, f"timed out after {timeout_s} s waiting for {what}"
        time.sleep(0.02)
    return value


def test_sigkill_while_streaming_keeps_database_and_partial_reply(tmp_path):
    env = dict(os.environ, QT_QPA_PLATFORM="offscreen", PYTHONPATH=str(REPO))
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD, str(tmp_path)],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    # The child's output is read on a thread so waiting for it has a deadline.
    lines: queue.Queue[str] = queue.Queue()
    reader = threading.Thread(
        target=lambda: [lines.put(line) for line in child.stdout], daemon=True
    )
    reader.start()
    db_path = tmp_path / "chats.sqlite3"
    try:
        assert lines.get(timeout=STARTUP_TIMEOUT_S).strip() == "STREAMING"
        seen = wait_for(
            lambda: (length := partial_reply_length(db_path)) >= 60 and length,
            STREAM_TIMEOUT_S,
            "the first throttled save of the partial reply",
        )
        # One more throttled save must land while the reply streams: the kill then cuts
        # mid-reply after a save that the last look did not see.
        wait_for(
            lambda: partial_reply_length(db_path) > seen,
            STREAM_TIMEOUT_S,
            "a later save of the partial reply",
        )
        child.send_signal(signal.SIGKILL)
        child.wait(STREAM_TIMEOUT_S)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
        reader.join(STREAM_TIMEOUT_S)
        child.stdout.close()
    assert child.returncode == -signal.SIGKILL

    store = Store(db_path)
    assert store.integrity_check() == "ok"
    [conv] = store.list_conversations()
    messages = store.messages(conv.id)
    assert [(m.role, m.status) for m in messages] == [
        ("user", "complete"),
        ("assistant", "complete"),
        ("user", "complete"),
        ("assistant", "interrupted"),
    ]
    assert messages[1].content == "The first answer is complete."
    assert messages[1].usage["completion_tokens"] == 5
    assert messages[2].content == "Second question, answered at length"
    partial = messages[3].content
    # A clean prefix of the reply, cut mid-stream, that kept growing after our last look.
    assert LONG_REPLY.startswith(partial) and len(partial) < len(LONG_REPLY)
    assert len(partial) > seen >= 60
    store.close()
