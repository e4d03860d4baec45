"""Durability: the app is SIGKILLed while a reply streams; the database must open cleanly with the
completed messages and the partial reply (saved at most SAVE_INTERVAL_S behind) intact."""

import os
import signal
import sqlite3
import subprocess
import sys
import textwrap
import time
from pathlib import Path

from app.reply_recorder import SAVE_INTERVAL_S
from app.store import Store

REPO = Path(__file__).resolve().parent.parent
WORDS = [f"word{i}" for i in range(400)]
LONG_REPLY = " ".join(WORDS)

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
    try:
        assert child.stdout.readline().strip() == "STREAMING"
        db_path = tmp_path / "chats.sqlite3"
        deadline = time.monotonic() + 30
        while (seen := partial_reply_length(db_path)) < 60 and time.monotonic() < deadline:
            time.sleep(0.05)
        # Stream on for longer than the save interval: the kill cuts mid-reply, and at least one
        # more throttled save must have landed by then.
        time.sleep(SAVE_INTERVAL_S + 0.15)
        child.send_signal(signal.SIGKILL)
        child.wait(10)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
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
