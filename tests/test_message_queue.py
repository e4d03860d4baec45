"""The message queue (app/features/message_queue.py, app/views/pending_messages.py): Send while a
reply streams queues the message; queued messages go out in order when the reply finishes, wait
after a Stop or an error, stay with their chat, and survive closing the app. Fake engine, real
window, store and settings file."""

from __future__ import annotations

import json
from dataclasses import dataclass

import pytest
from PySide6.QtWidgets import QMessageBox

from app.features.message_queue import FAILED, FROM_LAST_SESSION, MAX_QUEUED, STOPPED
from engine.events import TextDelta
from engine.types import Role
from tests.app_fakes import WAIT_MS, FakeEngine, close_window, make_window


@pytest.fixture
def dialogs(monkeypatch):
    shown = []
    monkeypatch.setattr(
        QMessageBox, "critical", lambda parent, title, text, *a, **k: shown.append((title, text))
    )
    return shown


def user_texts(window) -> list[str]:
    cid = window.session.conversation_id
    return [m.content for m in window.store.messages(cid) if m.role == Role.USER]


def type_and_send(window, text: str) -> None:
    window.input.setPlainText(text)
    window.send()


def streaming_window(qtbot, tmp_path, replies=None):
    """A window whose first reply pauses after one token (FakeEngine.gate holds it)."""
    engine = FakeEngine(replies=replies or ["First answer here", "Second", "Third"], pause_after=1)
    window = make_window(qtbot, tmp_path, engine)
    type_and_send(window, "question one")
    qtbot.waitUntil(lambda: window.session.busy, timeout=WAIT_MS)
    return window, engine


def test_send_while_a_reply_streams_queues_and_sends_in_order(qtbot, tmp_path):
    window, engine = streaming_window(qtbot, tmp_path)
    try:
        assert window.send_button.isEnabled() and window.send_button.text() == "Queue"
        type_and_send(window, "question two")
        type_and_send(window, "question three")
        assert window.input.toPlainText() == ""
        assert window.message_queue.pending() == ["question two", "question three"]
        view = window.pending_messages
        assert view.isVisible() and [r.text for r in view.rows] == [
            "question two",
            "question three",
        ]
        assert "sent in order when the reply finishes" in view.status.text()
        assert user_texts(window) == ["question one"]  # nothing sent behind the reply's back
        engine.pause_after = None
        engine.gate.set()
        qtbot.waitUntil(
            lambda: len(engine.requests) == 3 and not window.session.busy, timeout=WAIT_MS
        )
        assert user_texts(window) == ["question one", "question two", "question three"]
        assert [w.text for w in window.chat_view.widgets if w.message.role == Role.ASSISTANT] == [
            "First answer here",
            "Second",
            "Third",
        ]
        assert window.message_queue.pending() == [] and not view.isVisible()
    finally:
        close_window(window)


def test_queued_messages_can_be_edited_reordered_and_removed(qtbot, tmp_path):
    window, engine = streaming_window(qtbot, tmp_path)
    try:
        for text in ("alpha", "beta", "gamma"):
            type_and_send(window, text)
        view = window.pending_messages
        view.rows[2].up_button.click()  # gamma before beta
        assert window.message_queue.pending() == ["alpha", "gamma", "beta"]
        view.rows[0].remove_button.click()
        assert window.message_queue.pending() == ["gamma", "beta"]
        row = view.rows[1]
        row.edit_button.click()  # Edit: the text in an editor
        assert row.editing
        row.editor.setPlainText("beta, but better")
        row.edit_button.click()  # Save
        assert window.message_queue.pending() == ["gamma", "beta, but better"]
        assert not view.rows[0].up_button.isEnabled() and not view.rows[1].down_button.isEnabled()
        engine.pause_after = None
        engine.gate.set()
        qtbot.waitUntil(
            lambda: len(engine.requests) == 3 and not window.session.busy, timeout=WAIT_MS
        )
        assert user_texts(window) == ["question one", "gamma", "beta, but better"]
    finally:
        close_window(window)


def test_after_stop_the_queue_waits_until_send_now(qtbot, tmp_path):
    window, engine = streaming_window(qtbot, tmp_path)
    try:
        type_and_send(window, "question two")
        window.cancel()
        engine.gate.set()
        qtbot.waitUntil(lambda: not window.session.busy, timeout=WAIT_MS)
        qtbot.waitUntil(lambda: window.message_queue.waiting_because() == STOPPED, timeout=WAIT_MS)
        assert len(engine.requests) == 1 and user_texts(window) == ["question one"]
        view = window.pending_messages
        assert "waiting: the reply was stopped" in view.status.text()
        assert view.send_now.isVisible()
        engine.pause_after = None
        view.send_now.click()
        qtbot.waitUntil(
            lambda: len(engine.requests) == 2 and not window.session.busy, timeout=WAIT_MS
        )
        assert user_texts(window) == ["question one", "question two"]
        assert window.message_queue.pending() == []
    finally:
        close_window(window)


@dataclass
class FailingMidReply(FakeEngine):
    """Streams a little, waits at `gate`, then fails (as a native crash in the engine would)."""

    def _stream(self, lm, request, reply, cancel):
        yield TextDelta("partial")
        self.gate.wait(WAIT_MS / 1000)
        raise RuntimeError("the model broke")


def test_after_an_error_the_queue_waits_and_says_so(qtbot, tmp_path, dialogs):
    engine = FailingMidReply()
    window = make_window(qtbot, tmp_path, engine)
    try:
        type_and_send(window, "question one")
        qtbot.waitUntil(lambda: window.session.busy, timeout=WAIT_MS)
        type_and_send(window, "question two")
        engine.gate.set()
        qtbot.waitUntil(lambda: window.message_queue.waiting_because() == FAILED, timeout=WAIT_MS)
        assert dialogs and dialogs[0][0] == "Generation failed"
        assert len(engine.requests) == 1 and user_texts(window) == ["question one"]
        assert "waiting: the reply failed" in window.pending_messages.status.text()
    finally:
        close_window(window)


def test_each_chat_keeps_its_own_queue(qtbot, tmp_path):
    window, engine = streaming_window(qtbot, tmp_path)
    try:
        first_chat = window.session.conversation_id
        type_and_send(window, "for the first chat")
        window.new_chat()  # leaving stops the reply; the first chat's queue waits
        engine.gate.set()
        qtbot.waitUntil(lambda: not window.session.busy, timeout=WAIT_MS)
        assert window.message_queue.pending() == [] and not window.pending_messages.isVisible()
        assert window.message_queue.pending(first_chat) == ["for the first chat"]
        window.sidebar.conversationSelected.emit(first_chat)
        qtbot.waitUntil(lambda: window.session.conversation_id == first_chat, timeout=WAIT_MS)
        qtbot.waitUntil(lambda: window.message_queue.waiting_because() is not None, timeout=WAIT_MS)
        assert [r.text for r in window.pending_messages.rows] == ["for the first chat"]
        assert len(engine.requests) == 1
    finally:
        close_window(window)


def test_the_queue_survives_closing_the_app_and_waits_after_a_restart(qtbot, tmp_path):
    window, engine = streaming_window(qtbot, tmp_path)
    cid = window.session.conversation_id
    type_and_send(window, "do not lose me")
    window.cancel()
    engine.gate.set()
    qtbot.waitUntil(lambda: not window.session.busy, timeout=WAIT_MS)
    close_window(window)
    saved = json.loads((tmp_path / "settings.json").read_text(encoding="utf-8"))
    assert saved["queued_messages"] == {str(cid): ["do not lose me"]}

    engine = FakeEngine(replies=["answer after restart"])
    window = make_window(qtbot, tmp_path, engine)
    try:
        window.sidebar.conversationSelected.emit(cid)
        qtbot.waitUntil(lambda: window.session.conversation_id == cid, timeout=WAIT_MS)
        assert window.message_queue.pending() == ["do not lose me"]
        assert window.message_queue.waiting_because() == FROM_LAST_SESSION
        assert engine.requests == []  # nothing is sent before the user says so
        window.pending_messages.send_now.click()
        qtbot.waitUntil(
            lambda: len(engine.requests) == 1 and not window.session.busy, timeout=WAIT_MS
        )
        assert user_texts(window)[-1] == "do not lose me"
        saved = json.loads((tmp_path / "settings.json").read_text(encoding="utf-8"))
        assert saved["queued_messages"] == {}
    finally:
        close_window(window)


def test_a_full_queue_refuses_with_a_message_and_keeps_the_text(qtbot, tmp_path, dialogs):
    window, engine = streaming_window(qtbot, tmp_path)
    try:
        for i in range(MAX_QUEUED):
            assert window.message_queue.add(f"message {i}")
        type_and_send(window, "one too many")
        assert window.input.toPlainText() == "one too many"
        assert dialogs == [
            (
                "Not queued",
                f"{MAX_QUEUED} messages are queued in this chat already; wait for the "
                "replies or remove some.",
            )
        ]
        assert len(window.message_queue.pending()) == MAX_QUEUED
        window.cancel()
        engine.gate.set()
        qtbot.waitUntil(lambda: not window.session.busy, timeout=WAIT_MS)
    finally:
        close_window(window)


@pytest.mark.parametrize("saved", [{"x": ["a"]}, {"3": "not a list"}, ["a"], {"4": [1, None]}])
def test_a_hand_edited_queue_entry_that_is_broken_is_dropped(saved):
    from app.settings import Settings

    settings = Settings(queued_messages=saved).validated()
    assert all(isinstance(t, str) for texts in settings.queued_messages.values() for t in texts)
    assert "x" not in settings.queued_messages and "3" not in settings.queued_messages


def test_deleting_a_chat_drops_its_queue(qtbot, tmp_path):
    window, engine = streaming_window(qtbot, tmp_path)
    try:
        cid = window.session.conversation_id
        type_and_send(window, "never mind")
        window.cancel()
        engine.gate.set()
        qtbot.waitUntil(lambda: window.message_queue.waiting_because() is not None, timeout=WAIT_MS)
        window.session.delete_conversation(cid)
        assert window.message_queue.pending(cid) == []
        saved = json.loads((tmp_path / "settings.json").read_text(encoding="utf-8"))
        assert saved["queued_messages"] == {}
    finally:
        close_window(window)
