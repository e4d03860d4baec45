"""Tools in the chat window: a scripted engine (tests/app_fakes.py) that ends replies on tool
calls, the real built-in tools, and the real stdio MCP test server (tests/mcp_test_server.py)
for the approval, deny, timeout, crash and Stop paths."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from app_fakes import WAIT_MS, FakeEngine, ToolCallReply, close_window, make_window

from app.export import to_json, to_markdown
from app.store import SCHEMA_V3, Store
from app.tool_registry import READY, builtin_key, mcp_key
from engine.types import MessageStatus, Role, ToolApproval, ToolChoice

SERVER = Path(__file__).with_name("mcp_test_server.py")


def _tool_widgets(window):
    return [w for w in window.chat_view.widgets if w.message.role == Role.TOOL]


def _start_server(qtbot, window, name="test"):
    registry = window.session.tool_registry
    registry.add_server(name, f"{sys.executable} {SERVER}")
    qtbot.waitUntil(lambda: registry.servers[name].status != "starting", timeout=WAIT_MS)
    assert registry.servers[name].status == READY, registry.servers[name].message
    return registry


def _finished(window):
    return not window.session.busy


def test_builtin_calculator_round_runs_without_asking_and_continues(qtbot, tmp_path):
    engine = FakeEngine(
        replies=[ToolCallReply(calls=(("calculator", {"expression": "6*7"}),)), "It is 42."]
    )
    window = make_window(qtbot, tmp_path, engine)
    try:
        window.session.set_tool_enabled(builtin_key("calculator"), True)
        assert window.session.send("What is 6*7?")
        qtbot.waitUntil(lambda: len(engine.requests) == 2 and _finished(window), timeout=WAIT_MS)
        first, second = engine.requests
        assert [t["function"]["name"] for t in first.tools] == ["calculator"]
        # the second request carries the call and its result, paired by id
        assistant, tool = second.messages[-2], second.messages[-1]
        assert assistant["role"] == "assistant" and assistant["content"] == ""
        call = assistant["tool_calls"][0]
        assert call["function"]["name"] == "calculator"
        assert json.loads(call["function"]["arguments"]) == {"expression": "6*7"}
        assert tool == {"role": "tool", "tool_call_id": call["id"], "content": "42"}
        widget = _tool_widgets(window)[0]
        assert widget.message.tool["approval"] == ToolApproval.AUTOMATIC
        assert not widget.approval_row.isVisible()
        assert not widget.result_shown  # collapsed until opened
        assert widget.result_view.toPlainText() == "42"
        assert window.chat_view.widgets[-1].message.content == "It is 42."
        cid = window.session.conversation_id
    finally:
        close_window(window)
    # after a restart: the round is still in the chat, and in both exports
    store = Store(tmp_path / "chats.sqlite3")
    try:
        branch = store.branch(cid)
        assert [m.role for m in branch] == ["user", "assistant", "tool", "assistant"]
        assert branch[1].tool_calls[0]["function"]["name"] == "calculator"
        assert branch[2].tool["tool_call_id"] == branch[1].tool_calls[0]["id"]
        conv = store.conversation(cid)
        record = json.loads(to_json(conv, branch, store.tree(cid)))
        assert record["messages"][2]["tool"]["approval"] == "automatic"
        markdown = to_markdown(conv, branch)
        assert "**Tool call** `calculator`" in markdown and '"expression": "6*7"' in markdown
        assert store.chat_tools(cid)["enabled"] == [builtin_key("calculator")]
    finally:
        store.close()


def test_tools_off_in_a_chat_leave_the_request_without_tools(qtbot, tmp_path):
    engine = FakeEngine(replies=["Hi."])
    window = make_window(qtbot, tmp_path, engine)
    try:
        window.session.send("Hello")
        qtbot.waitUntil(lambda: _finished(window) and bool(engine.requests), timeout=WAIT_MS)
        assert engine.requests[0].tools is None
    finally:
        close_window(window)


def test_round_cap_makes_the_last_round_answer_without_tools(qtbot, tmp_path):
    loop = ToolCallReply(calls=(("calculator", {"expression": "1+1"}),))
    engine = FakeEngine(replies=[loop, loop, loop, loop])
    window = make_window(qtbot, tmp_path, engine)
    try:
        window.session.tools.max_rounds = 2
        window.session.set_tool_enabled(builtin_key("calculator"), True)
        window.session.send("loop")
        qtbot.waitUntil(lambda: len(engine.requests) == 3 and _finished(window), timeout=WAIT_MS)
        assert [r.tool_choice for r in engine.requests] == [
            ToolChoice.AUTO,
            ToolChoice.AUTO,
            ToolChoice.NONE,
        ]
        assert "limit 2" in window.notice_banner.text
        # a call in the capped round (the engine ignored "none") is not run
        assert len(_tool_widgets(window)) == 2
    finally:
        close_window(window)


def test_migration_from_v3_keeps_messages_and_adds_tool_columns(tmp_path):
    import sqlite3

    path = tmp_path / "v3.sqlite3"
    db = sqlite3.connect(path)
    db.executescript(SCHEMA_V3)
    db.execute("INSERT INTO conversations VALUES (1, 'old', '', 1.0, 1.0)")
    db.execute(
        "INSERT INTO messages(id, conversation_id, position, role, content, created_at, parent_id,"
        " selected) VALUES (1, 1, 0, 'user', 'hi', 1.0, NULL, 1)"
    )
    db.commit()
    db.close()
    store = Store(path)
    try:
        assert store.schema_version == 5  # through 4 (tools) to 5 (projects)
        (m,) = store.branch(1)
        assert m.content == "hi" and m.tool is None
        assert store.chat_tools(1) == {}
        store.set_chat_tools(1, {"enabled": ["builtin:calculator"]})
        store.add_message(1, Role.TOOL, "42", tool={"tool_call_id": "c1"})
        assert store.branch(1)[-1].tool == {"tool_call_id": "c1"}
        assert store.chat_tools(1) == {"enabled": ["builtin:calculator"]}
    finally:
        store.close()


@pytest.fixture
def mcp_window(qtbot, tmp_path):
    windows = []

    def make(replies):
        engine = FakeEngine(replies=replies)
        window = make_window(qtbot, tmp_path, engine)
        windows.append(window)
        registry = _start_server(qtbot, window)
        return window, engine, registry

    yield make
    for window in windows:
        close_window(window)


def _ask_for_approval(qtbot, window, tool: str, text: str):
    """Enable the test server's `tool`, send `text` and wait until its call asks for approval;
    returns the call's widget."""
    window.session.set_tool_enabled(mcp_key("test", tool), True)
    window.session.send(text)
    qtbot.waitUntil(lambda: bool(_tool_widgets(window)), timeout=WAIT_MS)
    widget = _tool_widgets(window)[0]
    qtbot.waitUntil(widget.approval_row.isVisible, timeout=WAIT_MS)
    return widget


def test_mcp_call_waits_for_approval_then_allow_once(qtbot, mcp_window):
    window, engine, _ = mcp_window(
        [ToolCallReply(calls=(("add", {"a": 2, "b": 3}),)), "The sum is 5."]
    )
    widget = _ask_for_approval(qtbot, window, "add", "2+3?")
    assert len(engine.requests) == 1 and window.session.busy  # nothing runs before the answer
    assert '"a": 2' in widget.arguments_view.toPlainText()
    widget.allow_once_button.click()
    qtbot.waitUntil(lambda: len(engine.requests) == 2 and _finished(window), timeout=WAIT_MS)
    assert engine.requests[1].messages[-1]["content"] == "5"
    assert widget.message.tool["approval"] == ToolApproval.ONCE
    assert window.session.chat_tools().get("always") is None


def test_always_for_this_tool_skips_the_question_next_time(qtbot, mcp_window):
    call = ToolCallReply(calls=(("echo", {"text": "hi"}),))
    window, engine, _ = mcp_window([call, "first", call, "second"])
    _ask_for_approval(qtbot, window, "echo", "one").allow_always_button.click()
    qtbot.waitUntil(lambda: len(engine.requests) == 2 and _finished(window), timeout=WAIT_MS)
    window.session.send("two")
    qtbot.waitUntil(lambda: len(engine.requests) == 4 and _finished(window), timeout=WAIT_MS)
    second = _tool_widgets(window)[1]
    assert second.message.tool["approval"] == ToolApproval.ALWAYS
    assert engine.requests[3].messages[-1]["content"] == "hi"


def test_deny_tells_the_model_and_runs_nothing(qtbot, mcp_window):
    window, engine, _ = mcp_window([ToolCallReply(calls=(("crash", {}),)), "Understood."])
    _ask_for_approval(qtbot, window, "crash", "crash it").deny_button.click()
    qtbot.waitUntil(lambda: len(engine.requests) == 2 and _finished(window), timeout=WAIT_MS)
    assert "denied" in engine.requests[1].messages[-1]["content"]
    # the server never ran `crash`: it is still up
    assert window.session.tool_registry.servers["test"].status == READY


def test_timeout_gives_a_named_message_and_the_chat_goes_on(qtbot, mcp_window):
    window, engine, registry = mcp_window(
        [ToolCallReply(calls=(("hang", {"seconds": 30}),)), "It timed out."]
    )
    registry.call_timeout_s = 1.0
    _ask_for_approval(qtbot, window, "hang", "hang").allow_once_button.click()
    qtbot.waitUntil(lambda: len(engine.requests) == 2 and _finished(window), timeout=WAIT_MS)
    widget = _tool_widgets(window)[0]
    assert widget.message.tool["error"] == "McpTimeout"
    assert "Timed out" in widget.status_label.text()
    assert "did not answer within 1 s" in engine.requests[1].messages[-1]["content"]


def test_crash_gives_a_named_message_and_marks_the_server(qtbot, mcp_window):
    window, engine, registry = mcp_window([ToolCallReply(calls=(("crash", {}),)), "It crashed."])
    _ask_for_approval(qtbot, window, "crash", "crash").allow_once_button.click()
    qtbot.waitUntil(lambda: len(engine.requests) == 2 and _finished(window), timeout=WAIT_MS)
    widget = _tool_widgets(window)[0]
    assert widget.message.tool["error"] == "McpServerCrashed"
    assert "Server crashed" in widget.status_label.text()
    assert registry.servers["test"].status == "error"
    assert "error" in window.tools_panel.server_labels["test"].text()
    # the app stays usable: the next message is answered
    window.session.send("still there?")
    qtbot.waitUntil(lambda: len(engine.requests) == 3 and _finished(window), timeout=WAIT_MS)


def test_stop_during_a_tool_call_cancels_it(qtbot, mcp_window):
    window, engine, _ = mcp_window([ToolCallReply(calls=(("hang", {"seconds": 30}),)), "never"])
    _ask_for_approval(qtbot, window, "hang", "hang").allow_once_button.click()
    qtbot.waitUntil(
        lambda: "running" in _tool_widgets(window)[0].status_label.text(), timeout=WAIT_MS
    )
    assert window.cancel_button.isEnabled()
    window.cancel_button.click()
    qtbot.waitUntil(lambda: _finished(window), timeout=WAIT_MS)
    widget = _tool_widgets(window)[0]
    assert widget.message.status == MessageStatus.CANCELLED
    assert widget.message.tool["error"] == "ToolCancelled"
    assert len(engine.requests) == 1  # no generation after Stop
    assert window.send_button.isEnabled()


def test_stop_cancels_the_running_call_through_its_token(qtbot, mcp_window):
    """The call's thread ends on Stop (ToolCancelled within the client's 50 ms poll), not at
    the 30 s time limit: the MCP client got the cancel token."""
    from app.tools.mcp_client import ToolCancelled

    window, engine, registry = mcp_window([ToolCallReply(calls=(("hang", {"seconds": 60}),))])
    registry.call_timeout_s = 30.0
    _ask_for_approval(qtbot, window, "hang", "hang").allow_once_button.click()
    qtbot.waitUntil(
        lambda: "running" in _tool_widgets(window)[0].status_label.text(), timeout=WAIT_MS
    )
    with qtbot.waitSignal(window.session.tools._outcome, timeout=10_000) as blocker:
        window.session.cancel()
    assert isinstance(blocker.args[1], ToolCancelled)


def test_stop_while_a_call_waits_for_approval(qtbot, mcp_window):
    window, engine, _ = mcp_window([ToolCallReply(calls=(("add", {"a": 1, "b": 1}),)), "x"])
    widget = _ask_for_approval(qtbot, window, "add", "add")
    window.cancel_button.click()
    qtbot.waitUntil(lambda: _finished(window), timeout=WAIT_MS)
    assert widget.message.tool["approval"] == ToolApproval.CANCELLED
    assert not widget.approval_row.isVisible()
    assert not window.session.answer_tool(widget.message.id, ToolApproval.ONCE)  # too late
    assert len(engine.requests) == 1
    # the next turn sends the cancelled call's answer, so every call in the history is paired
    window.session.send("again")
    qtbot.waitUntil(lambda: len(engine.requests) == 2 and _finished(window), timeout=WAIT_MS)
    history = engine.requests[1].messages
    tool_message = next(m for m in history if m["role"] == "tool")
    assert tool_message["content"].startswith("The user stopped")


def test_malformed_call_is_shown_and_never_run(qtbot, tmp_path):
    engine = FakeEngine(
        replies=[ToolCallReply(text="Let me see.", malformed=(("calculator", "not JSON"),))]
    )
    window = make_window(qtbot, tmp_path, engine)
    try:
        window.session.set_tool_enabled(builtin_key("calculator"), True)
        window.session.send("hm")
        qtbot.waitUntil(lambda: _finished(window) and bool(engine.requests), timeout=WAIT_MS)
        assert not _tool_widgets(window)
        reply = window.chat_view.widgets[-1]
        assert "Malformed tool call calculator: not JSON" in reply.tool_calls_label.text()
        assert reply.message.tool["malformed"][0]["problem"] == "not JSON"
        assert len(engine.requests) == 1
    finally:
        close_window(window)


def test_tools_panel_adds_a_server_and_shows_a_failed_start(qtbot, tmp_path):
    engine = FakeEngine()
    window = make_window(qtbot, tmp_path, engine, load=False)
    try:
        panel = window.tools_panel
        panel.name_edit.setText("broken")
        panel.target_edit.setText(f"{sys.executable} -c 'import sys; sys.exit(7)'")
        panel.add_button.click()
        registry = window.session.tool_registry
        qtbot.waitUntil(lambda: registry.servers["broken"].status == "error", timeout=WAIT_MS)
        assert "could not be started" in panel.server_labels["broken"].text()
        assert window.settings.mcp_servers == [
            {"name": "broken", "command": [sys.executable, "-c", "import sys; sys.exit(7)"]}
        ]
        panel.name_edit.setText("broken")
        panel.target_edit.setText("http://127.0.0.1:9/mcp")
        panel.add_button.click()
        assert "already an MCP server named 'broken'" in panel.add_error.text()
        panel.name_edit.setText("")
        panel.add_button.click()
        assert "name" in panel.add_error.text()
        removed = panel.server_labels["broken"]
        registry.remove_server("broken")
        assert "broken" not in panel.server_labels and removed is not None
        assert window.settings.mcp_servers == []
    finally:
        close_window(window)


def test_a_required_first_call_is_run_and_the_next_round_answers_without_tools(qtbot, tmp_path):
    """tool_choice "required" forces the first round only: the round after the call gets "none"
    and the result, and answers in text. Catches the forced choice carried into later rounds
    (a real model would then call again instead of answering) and a result not sent back.
    The engine side of a required call (the grammar, a real model) is
    test_tool_calls_generate.py and test_qwen_coder_tools.py."""
    engine = FakeEngine(
        replies=[ToolCallReply(calls=(("calculator", {"expression": "17 * 23"}),)), "It is 391."]
    )
    window = make_window(qtbot, tmp_path, engine)
    try:
        window.session.tools.first_choice = ToolChoice.REQUIRED
        window.session.set_tool_enabled(builtin_key("calculator"), True)
        window.session.send("Use the calculator: what is 17 * 23?")
        qtbot.waitUntil(lambda: len(engine.requests) == 2 and _finished(window), timeout=WAIT_MS)
        assert [r.tool_choice for r in engine.requests] == [ToolChoice.REQUIRED, ToolChoice.NONE]
        assert [t["function"]["name"] for t in engine.requests[1].tools] == ["calculator"]
        assert engine.requests[1].messages[-1]["content"] == "391"
        roles = [m.role for m in window.session.branch]
        assert roles == ["user", "assistant", "tool", "assistant"]
        tool = window.session.branch[2]
        assert tool.tool["name"] == "calculator" and not tool.tool["is_error"]
        assert tool.tool["arguments"] == {"expression": "17 * 23"} and tool.content == "391"
        assert window.session.branch[3].content == "It is 391."
        # the next user turn starts over with the forced choice
        window.session.send("And 2 * 3?")
        qtbot.waitUntil(lambda: len(engine.requests) == 3 and _finished(window), timeout=WAIT_MS)
        assert engine.requests[2].tool_choice == ToolChoice.REQUIRED
    finally:
        close_window(window)


def test_saved_servers_start_with_the_app_and_broken_entries_are_dropped(qtbot, tmp_path):
    good = {"name": "test", "command": [sys.executable, str(SERVER)]}
    broken = [
        {"name": "both", "command": ["x"], "url": "http://127.0.0.1:9/mcp"},
        {"name": "", "command": ["x"]},
        {"name": "args", "command": ["x", 3]},
        "not a dict",
    ]
    (tmp_path / "settings.json").write_text(json.dumps({"mcp_servers": [good, *broken]}))
    window = make_window(qtbot, tmp_path, FakeEngine(), load=False)
    try:
        registry = window.session.tool_registry
        assert list(registry.servers) == ["test"]
        qtbot.waitUntil(lambda: registry.servers["test"].status == READY, timeout=WAIT_MS)
        assert "add" in [b.text() for b in window.tools_panel.boxes.values()]
    finally:
        close_window(window)
