"""Finding a reply's sources never blocks the window (issue 34, ARCHITECTURE.md: the GUI thread
never runs a forward pass or a model load). On send the reply row opens and the status says
"Finding sources…" at once; the question is embedded and searched on a thread; Stop meanwhile
ends the reply as cancelled with the queue and busy state as after any Stop; a retrieval error
is said and the reply goes on without sources.

The fast tier: the real index and retrieval with HashEmbedder, whose query embedding here waits
on a threading.Event the test holds, so the test decides when the retrieval ends.
"""

from __future__ import annotations

import threading

from app_fakes import WAIT_MS, close_window, make_window
from documents_helpers import HashEmbedder
from PySide6.QtCore import QTimer
from test_app_documents import ReceiptEngine, _attach, _docs

from app.features.documents import FINDING_SOURCES
from engine.errors import EngineError
from engine.types import MessageStatus, Role

QUESTION = "When does the museum open in the morning?"
# How long a query embedding waits for the test's gate at most: only reached when retrieval runs
# on the GUI thread (the planted bug), where nothing can open the gate; it keeps that from hanging.
GATE_S = 5.0


class GatedEmbedder(HashEmbedder):
    """Indexes at once; once `hold` is set, a query embedding waits for `gate` and records the
    thread it ran on."""

    def __init__(self) -> None:
        super().__init__()
        self.hold = False
        self.gate, self.started = threading.Event(), threading.Event()
        self.threads: list[threading.Thread] = []
        self.fail: Exception | None = None

    def embed(self, texts, cancel=None):
        if self.hold:
            self.threads.append(threading.current_thread())
            self.started.set()
            self.gate.wait(GATE_S)
            if self.fail is not None:
                raise self.fail
        return super().embed(texts, cancel)


def _window(qtbot, tmp_path, replies=("Opens at nine [1].",)):
    engine = ReceiptEngine(replies=list(replies))
    window = make_window(qtbot, tmp_path, engine)
    embedder = GatedEmbedder()
    window.documents.use_loader(lambda path: embedder)
    _attach(qtbot, window, [_docs(tmp_path)])
    embedder.hold = True  # from here on only questions are embedded
    return window, engine, embedder


def _ticking(qtbot):
    """A timer counting its ticks: it only ticks while the GUI thread processes events."""
    ticks = [0]
    timer = QTimer()
    timer.setInterval(5)
    timer.timeout.connect(lambda: ticks.__setitem__(0, ticks[0] + 1))
    timer.start()
    return timer, ticks


def test_sources_are_found_on_a_thread_while_the_window_keeps_working(qtbot, tmp_path):
    window, engine, embedder = _window(qtbot, tmp_path)
    timer, ticks = _ticking(qtbot)
    try:
        cid = window.session.ensure_conversation()
        assert window.session.send(QUESTION)
        # at once, before the question is embedded: the reply row is open and says why it waits
        reply = window.store.messages(cid)[-1]
        assert reply.role == Role.ASSISTANT and window.chat_view.widget_for(reply.id) is not None
        assert window.state_label.text() == FINDING_SOURCES
        assert window.session.busy and window.cancel_button.isEnabled()
        assert engine.requests == []  # nothing goes to the model before its sources
        qtbot.waitUntil(embedder.started.is_set, timeout=WAIT_MS)
        before = ticks[0]
        # the embedder is blocked, and the GUI thread still runs its timers
        qtbot.waitUntil(lambda: ticks[0] >= before + 3, timeout=WAIT_MS)
        assert embedder.threads[0] is not threading.main_thread()
        assert not embedder.gate.is_set() and engine.requests == []
        with qtbot.waitSignal(window.session.replyFinished, timeout=WAIT_MS):
            embedder.gate.set()
        system = engine.requests[0].messages[0]["content"]
        assert "Answer using the numbered sources" in system and "Tickets cost twelve" in system
        stored = window.store.messages(cid)[-1]
        assert stored.status == MessageStatus.COMPLETE
        assert stored.receipt["sources"]["query"] == QUESTION
        assert window.state_label.text() == ""
    finally:
        timer.stop()
        embedder.gate.set()
        close_window(window)


def test_stop_while_sources_are_found_ends_the_reply_cancelled(qtbot, tmp_path):
    window, engine, embedder = _window(qtbot, tmp_path, replies=("First.", "Second [1]."))
    try:
        session = window.session
        cid = session.ensure_conversation()
        assert session.send(QUESTION)
        qtbot.waitUntil(embedder.started.is_set, timeout=WAIT_MS)
        assert window.message_queue.add("And on Sundays?")  # queued while the reply waits
        with qtbot.waitSignal(session.replyFinished, timeout=WAIT_MS) as finished:
            window.cancel_button.click()
        stored = finished.args[0]
        assert stored.role == Role.ASSISTANT and stored.status == MessageStatus.CANCELLED
        assert [m.content for m in window.store.messages(cid)][0] == QUESTION  # nothing lost
        assert not session.busy and window.send_button.text() == "Send"
        assert window.state_label.text() == "Stopped — partial reply kept"
        # as after any Stop, the queue waits (and keeps the message) until the user resumes it
        qtbot.waitUntil(lambda: window.message_queue.waiting_because() is not None)
        assert window.message_queue.pending() == ["And on Sundays?"]
        # the thread's result, when it comes, starts nothing
        with qtbot.waitSignal(window.documents._retrieved, timeout=WAIT_MS):
            embedder.gate.set()
        assert engine.requests == [] and not session.busy
        assert window.store.messages(cid)[-1].status == MessageStatus.CANCELLED
        # and the next message is answered with its sources as usual
        with qtbot.waitSignal(session.replyFinished, timeout=WAIT_MS):
            window.message_queue.send_now()
        assert len(engine.requests) == 1
        assert "Tickets cost twelve" in engine.requests[0].messages[0]["content"]
    finally:
        embedder.gate.set()
        close_window(window)


def test_a_retrieval_error_is_said_and_the_reply_goes_on_without_sources(qtbot, tmp_path):
    window, engine, embedder = _window(qtbot, tmp_path)
    try:
        embedder.fail = EngineError("the embedding model could not be read")
        embedder.gate.set()
        problems = []
        window.documents.problem.connect(problems.append)
        with qtbot.waitSignal(window.session.replyFinished, timeout=WAIT_MS) as finished:
            assert window.session.send(QUESTION)
        assert problems == [
            "No sources were added to this reply: the embedding model could not be read"
        ]
        assert finished.args[0].status == MessageStatus.COMPLETE
        assert all(
            "numbered sources" not in (m["content"] or "") for m in engine.requests[0].messages
        )
        assert "sources" not in (finished.args[0].receipt or {})
    finally:
        embedder.gate.set()
        close_window(window)
