"""How a remote reply ended, as the window and the exports show it, against real loopback servers
(the scripted server, the fault proxy in front of it): no model runs.

Issue 31, defect 2: a server that stopped a reply itself (finish_reason "cancelled", e.g.
`engine serve` shut down mid-reply) was shown as "stop (end of turn)"; every finish reason a
server can send must be shown for what it is in the message header, the usage panel and the
Markdown/JSON export. Defect 6: the usage panel stayed on "generating…" after a remote stream
broke, even in new chats. The expected texts are written out here by hand."""

from __future__ import annotations

import json

import pytest
from PySide6.QtCore import Qt
from PySide6.QtWidgets import QMessageBox

from app.export import to_json, to_markdown
from engine.types import MessageStatus
from tests.app_fakes import FakeEngine, close_window, make_window
from tests.fault_proxy import Fault, FaultProxy
from tests.scripted_openai_server import Reply, ScriptedOpenAIServer
from tests.test_app_remote import add_connection, pick_remote_model, send

WAIT_MS = 60_000
GENERATING = "generating…"


@pytest.fixture
def dialogs(monkeypatch):
    shown = []
    monkeypatch.setattr(
        QMessageBox, "critical", lambda parent, title, text, *a, **k: shown.append((title, text))
    )
    return shown


@pytest.fixture
def scripted():
    servers: list[ScriptedOpenAIServer] = []

    def start(replies: list[Reply]) -> ScriptedOpenAIServer:
        servers.append(ScriptedOpenAIServer(replies).start())
        return servers[-1]

    yield start
    for server in servers:
        server.stop()


def _remote_window(qtbot, tmp_path, base_url: str, model: str):
    window = make_window(qtbot, tmp_path, FakeEngine())
    add_connection(qtbot, window, base_url, models=(model,))
    pick_remote_model(qtbot, window)
    return window


def _ask(qtbot, window, text: str):
    """Send `text`; the stored reply once it ended, whichever way."""
    ended = []
    window.session.replyFinished.connect(ended.append)
    window.session.replyFailed.connect(lambda _message, stored: ended.append(stored))
    send(qtbot, window, text)
    qtbot.waitUntil(lambda: bool(ended) and not window.session.busy, timeout=WAIT_MS)
    return ended[0]


# (server's finish_reason, stored status, message header, usage panel's Finish, Markdown heading)
ENDINGS = [
    (
        "cancelled",
        MessageStatus.ERROR,
        "⚠ failed: cut short by the server, which said 'cancelled'",
        "cut short by the server, which said 'cancelled'",
        "## Assistant (failed: cut short by the server, which said 'cancelled')",
    ),
    (
        "error",
        MessageStatus.ERROR,
        "⚠ failed: the server reported an error",
        "the server reported an error",
        "## Assistant (failed: the server reported an error)",
    ),
    (
        "content_filter",
        MessageStatus.ERROR,
        "⚠ failed: stopped by the server's content filter",
        "stopped by the server's content filter",
        "## Assistant (failed: stopped by the server's content filter)",
    ),
    (
        "foo",
        MessageStatus.ERROR,
        "⚠ failed: ended: server said 'foo'",
        "ended: server said 'foo'",
        "## Assistant (failed: ended: server said 'foo')",
    ),
    (
        "length",
        MessageStatus.COMPLETE,
        "✂ length limit reached — the reply may be cut short",
        "length limit reached",
        "## Assistant (length limit reached — the reply may be cut short)",
    ),
    (
        None,
        MessageStatus.COMPLETE,
        "⚠ ended without a finish reason from the server",
        "ended without a finish reason from the server",
        "## Assistant (ended without a finish reason from the server)",
    ),
    (
        "tool_calls",  # said with no call in the reply: nothing could be run
        MessageStatus.COMPLETE,
        "⚠ tool calls, none of which could be run",
        "tool calls, none of which could be run",
        "## Assistant (tool calls, none of which could be run)",
    ),
    ("stop", MessageStatus.COMPLETE, "", "stop (end of turn)", "## Assistant"),
]


def test_every_finish_reason_is_shown_for_what_it_is_in_chat_panel_and_exports(
    qtbot, tmp_path, scripted, dialogs
):
    """Catches the server's "cancelled" (or "error", or a word the app does not know) mapped to
    a normal stop, as it was: header empty, panel "stop (end of turn)", Markdown "## Assistant"."""
    server = scripted(
        [Reply(f"Answer number {i} so far", finish=e[0]) for i, e in enumerate(ENDINGS)]
    )
    window = _remote_window(qtbot, tmp_path, server.base_url, server.model)
    cid = window.session.conversation_id
    for i, (word, status, header, panel, _heading) in enumerate(ENDINGS):
        stored = _ask(qtbot, window, f"Question {i}")
        assert stored.status == status, word
        assert stored.content == f"Answer number {i} so far"  # the partial reply is kept
        assert stored.usage["server_finish_reason"] == (word or "")
        assert window.chat_view.widgets[-1].status_label.text() == header, word
        assert window.usage_panel.text_of("finish_reason") == panel, word
        assert window.usage_panel.title() == "Usage — selected reply"
    # The failures were said in a dialog, in words that name the server's reason.
    said = [text for _title, text in dialogs]
    assert len(said) == 4
    assert "cut the reply short (finish_reason 'cancelled'" in said[0]
    assert "finish_reason 'error'" in said[1]
    assert "content filter" in said[2]
    assert "finish_reason 'foo', which this app does not know" in said[3]

    conversation = window.store.conversation(cid)
    messages = window.store.messages(cid)
    markdown = to_markdown(conversation, messages).splitlines()
    headings = [line for line in markdown if line.startswith("## Assistant")]
    assert headings == [e[4] for e in ENDINGS]
    exported = json.loads(to_json(conversation, messages))["messages"]
    replies = [m for m in exported if m["role"] == "assistant"]
    assert [
        (m["status"], m["finish_reason"], m["usage"]["server_finish_reason"]) for m in replies
    ] == [
        ("error", "error", "cancelled"),
        ("error", "error", "error"),
        ("error", "error", "content_filter"),
        ("error", "error", "foo"),
        ("complete", "length", "length"),
        ("complete", "stop", ""),
        ("complete", "stop", "tool_calls"),
        ("complete", "stop", "stop"),
    ]
    # Reopened (the widgets rebuilt from the store), a reply still says how it ended.
    window.session.open_conversation(cid)
    headers = [
        w.status_label.text() for w in window.chat_view.widgets if w.message.role == "assistant"
    ]
    assert headers == [e[2] for e in ENDINGS]
    close_window(window)


def _panel_is_idle_or_shows(window, finish: str | None) -> None:
    panel = window.usage_panel
    assert GENERATING not in panel.title()
    assert panel.text_of("finish_reason") != GENERATING
    if finish is not None:
        assert panel.text_of("finish_reason") == finish


def test_the_usage_panel_leaves_generating_whichever_way_a_remote_reply_ends(
    qtbot, tmp_path, scripted, dialogs
):
    """Defect 6: a stream broken mid-reply (the fault proxy cuts it) left the panel on
    "Usage — generating…" / "generating…", and a new chat kept that title. Also a Stop, a new
    chat and a chat of another backend opened while a reply streams, and a refusal before the
    stream (429)."""
    words = " ".join(f"colour{i}" for i in range(60))
    server = scripted(
        [
            Reply(f"Red, green, blue, {words}."),  # cut by the proxy
            Reply("Once upon a time", endless=True),  # stopped with Stop
            Reply("Once upon a time", endless=True),  # left for a new chat
            Reply("Once upon a time", endless=True),  # left for a chat of the local model
            Reply("Fine."),
        ]
    )
    proxy = FaultProxy("127.0.0.1", server.port).start()
    try:
        window = make_window(qtbot, tmp_path, FakeEngine())
        local_chat = window.session.ensure_conversation()
        assert _ask(qtbot, window, "Hello, local model.").status == MessageStatus.COMPLETE
        window.new_chat()
        add_connection(qtbot, window, proxy.base_url, models=(server.model,))
        pick_remote_model(qtbot, window)
        proxy.fault = Fault(cut_after_bytes=1500)
        stored = _ask(qtbot, window, "Name colours.")
        assert stored.status == MessageStatus.ERROR and stored.content
        _panel_is_idle_or_shows(window, "error")
        assert window.usage_panel.title() == "Usage — selected reply"
        # A new chat: nothing selected, nothing generating.
        window.new_chat()
        _panel_is_idle_or_shows(window, "—")
        assert window.usage_panel.title() == "Usage — last reply"
        proxy.fault = Fault()

        # Stop mid-stream.
        send(qtbot, window, "A long story.")
        qtbot.waitUntil(
            lambda: window.usage_panel.title() == "Usage — generating…", timeout=WAIT_MS
        )
        qtbot.waitUntil(
            lambda: len(getattr(window.chat_view.streaming_widget, "text", "")) > 20,
            timeout=WAIT_MS,
        )
        qtbot.mouseClick(window.cancel_button, Qt.LeftButton)
        qtbot.waitUntil(lambda: not window.session.busy, timeout=WAIT_MS)
        _panel_is_idle_or_shows(window, "cancelled by you")

        # A new chat while a reply streams (the reply is stopped and kept in its chat).
        send(qtbot, window, "Another long story.")
        qtbot.waitUntil(
            lambda: window.usage_panel.title() == "Usage — generating…", timeout=WAIT_MS
        )
        window.new_chat()
        qtbot.waitUntil(lambda: not window.session.busy, timeout=WAIT_MS)
        _panel_is_idle_or_shows(window, "—")
        assert window.usage_panel.title() == "Usage — last reply"

        # A chat of the local model opened while a remote reply streams: the panel shows that
        # chat's last reply (the local backend answers there again).
        send(qtbot, window, "A third long story.")
        qtbot.waitUntil(
            lambda: window.usage_panel.title() == "Usage — generating…", timeout=WAIT_MS
        )
        window.session.open_conversation(local_chat)
        qtbot.waitUntil(lambda: not window.session.busy, timeout=WAIT_MS)
        qtbot.waitUntil(lambda: window.backends.kind == "local", timeout=WAIT_MS)
        _panel_is_idle_or_shows(window, "stop (end of turn)")
        assert window.usage_panel.title() == "Usage — selected reply"
        window.new_chat()
        pick_remote_model(qtbot, window)

        # Refused before the stream: the panel says error, not generating.
        proxy.fault = Fault(status_429_retry_after="3")
        stored = _ask(qtbot, window, "Now?")
        assert stored.status == MessageStatus.ERROR
        _panel_is_idle_or_shows(window, "error")
        proxy.fault = Fault()
        close_window(window)
    finally:
        proxy.stop()
