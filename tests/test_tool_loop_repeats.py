"""The tool loop against a model that keeps making the same call (issue 31, defect 9: after the
calculator's result a small model called it 5 more times and ended with an empty reply).

A call identical to an earlier one of the same user turn (same tool, same arguments as canonical
JSON) is not run again; the model gets the earlier result with a note; after `max_repeats`
repeats the next request offers no tools and a notice says why; an answer with no text says why
it is empty. In the window, with the scripted local engine (tests/app_fakes.py) and, for the
remote path, the scripted OpenAI server (tests/scripted_openai_server.py): no model loads."""

from __future__ import annotations

import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
from app_fakes import WAIT_MS, FakeEngine, ToolCallReply, close_window, make_window

import app.tool_runner as tool_runner
from app.tool_registry import READY, builtin_key, mcp_key
from app.tool_runner import FINISH_WORDS, REPEATED, ToolRunner, call_key
from engine.types import FinishReason, Role, ToolChoice

SERVER = Path(__file__).with_name("mcp_test_server.py")
SIX_TIMES_SEVEN = ToolCallReply(calls=(("calculator", {"expression": "6*7"}),))


def _tool_widgets(window):
    return [w for w in window.chat_view.widgets if w.message.role == Role.TOOL]


def _idle(window) -> bool:
    return not window.session.busy


@pytest.fixture
def builtin_runs(monkeypatch):
    """Every built-in tool run, as (name, arguments): what the app really executed."""
    runs: list[tuple[str, dict]] = []
    real = tool_runner.run_builtin

    def counting(name, arguments, context=None):
        runs.append((name, dict(arguments)))
        return real(name, arguments, context)

    monkeypatch.setattr(tool_runner, "run_builtin", counting)
    return runs


@pytest.fixture
def window_with(qtbot, tmp_path):
    windows = []

    def make(replies, tools=("calculator",)):
        engine = FakeEngine(replies=replies)
        window = make_window(qtbot, tmp_path, engine)
        windows.append(window)
        for name in tools:
            window.session.set_tool_enabled(builtin_key(name), True)
        return window, engine

    yield make
    for window in windows:
        close_window(window)


def test_a_repeated_call_is_not_run_again_and_the_loop_ends_with_a_reason(
    qtbot, window_with, builtin_runs
):
    """The reported run: the same calculator call again and again, then an empty answer."""
    window, engine = window_with([SIX_TIMES_SEVEN] * 6 + [""])
    window.session.send("What is 6*7?")
    qtbot.waitUntil(lambda: len(engine.requests) == 4 and _idle(window), timeout=WAIT_MS)
    # run once; the two repeats were answered from its result; then no tools were offered
    assert builtin_runs == [("calculator", {"expression": "6*7"})]
    assert [r.tool_choice for r in engine.requests] == [ToolChoice.AUTO] * 3 + [ToolChoice.NONE]
    second_result = engine.requests[2].messages[-1]
    assert second_result["role"] == "tool"
    assert second_result["content"].startswith("42\n\n[Not run again")
    assert "call #1" in second_result["content"]
    # shown in the window: each repeat names the call it repeats, the notice names the tool
    first, second, third = _tool_widgets(window)
    assert "Tool call #1: calculator" in first.title.text()
    assert "Tool call #2: calculator" in second.title.text()
    assert "repeated call — not run again, same result as #1" in second.status_label.text()
    assert "same result as #1" in third.status_label.text()
    assert "running" not in third.status_label.text()
    assert "ran without asking" in first.status_label.text()
    assert second.message.tool["approval"] == REPEATED
    assert second.result_view.toPlainText().startswith("42\n")
    banner = window.notice_banner.text
    assert "repeated the same tool call (calculator) 2 times" in banner
    # the fourth reply called once more although no tools were offered: not run, and said so
    final = window.chat_view.widgets[-1]
    assert final.message.role == Role.ASSISTANT and final.message.content == ""
    note = final.tool_calls_label.text()
    assert final.tool_calls_label.isVisible()
    assert note.startswith("The model ended its turn without text after 3 tool calls")
    assert "finish reason: tool_calls" in note
    assert "2 of its calls repeated an earlier one" in note
    assert "It still called 1 tool, which did not run." in note
    assert len(_tool_widgets(window)) == 3


def test_an_empty_answer_after_a_tool_result_says_why(qtbot, window_with, builtin_runs):
    window, engine = window_with([SIX_TIMES_SEVEN, ""])
    window.session.send("What is 6*7?")
    qtbot.waitUntil(lambda: len(engine.requests) == 2 and _idle(window), timeout=WAIT_MS)
    final = window.chat_view.widgets[-1]
    assert final.tool_calls_label.text() == (
        "The model ended its turn without text after 1 tool call "
        "(finish reason: stop — the model stopped by itself)."
    )
    # kept with the reply: the chat reopened shows it again
    window.session.open_conversation(window.session.conversation_id)
    final = window.chat_view.widgets[-1]
    assert "without text after 1 tool call " in final.tool_calls_label.text()


def test_an_empty_answer_without_tools_says_why(qtbot, window_with):
    window, engine = window_with([""], tools=())
    window.session.send("Hello?")
    qtbot.waitUntil(lambda: len(engine.requests) == 1 and _idle(window), timeout=WAIT_MS)
    final = window.chat_view.widgets[-1]
    assert final.tool_calls_label.text() == (
        "The model ended its turn without text (finish reason: stop — the model stopped by itself)."
    )


def test_an_answer_with_text_gets_no_empty_note(qtbot, window_with):
    window, engine = window_with([SIX_TIMES_SEVEN, "It is 42."])
    window.session.send("What is 6*7?")
    qtbot.waitUntil(lambda: len(engine.requests) == 2 and _idle(window), timeout=WAIT_MS)
    final = window.chat_view.widgets[-1]
    assert final.message.content == "It is 42."
    assert not final.tool_calls_label.isVisible()
    assert "empty_reason" not in (final.message.tool or {})


def test_identical_calls_in_one_reply_run_once_and_other_arguments_run(
    qtbot, window_with, builtin_runs
):
    calls = (
        ("calculator", {"expression": "1+1"}),
        ("calculator", {"expression": "2+2"}),
        ("calculator", {"expression": "1+1"}),
    )
    window, engine = window_with([ToolCallReply(calls=calls), "Done."])
    window.session.send("sums")
    qtbot.waitUntil(lambda: len(engine.requests) == 2 and _idle(window), timeout=WAIT_MS)
    assert builtin_runs == [
        ("calculator", {"expression": "1+1"}),
        ("calculator", {"expression": "2+2"}),
    ]
    results = [m["content"] for m in engine.requests[1].messages if m["role"] == "tool"]
    assert results[0] == "2" and results[1] == "4"
    assert results[2].startswith("2\n\n[Not run again") and "call #1" in results[2]
    # one repeat is below the limit: the next request still offers the tools
    assert engine.requests[1].tool_choice == ToolChoice.AUTO
    assert "same result as #1" in _tool_widgets(window)[2].status_label.text()


def test_a_new_user_turn_runs_the_same_call_again(qtbot, window_with, builtin_runs):
    window, engine = window_with([SIX_TIMES_SEVEN, "42.", SIX_TIMES_SEVEN, "Still 42."])
    window.session.send("What is 6*7?")
    qtbot.waitUntil(lambda: len(engine.requests) == 2 and _idle(window), timeout=WAIT_MS)
    window.session.send("And again?")
    qtbot.waitUntil(lambda: len(engine.requests) == 4 and _idle(window), timeout=WAIT_MS)
    assert builtin_runs == [("calculator", {"expression": "6*7"})] * 2
    assert "Tool call #1: calculator" in _tool_widgets(window)[1].title.text()
    assert engine.requests[3].messages[-1]["content"] == "42"


def test_the_repeat_limit_is_the_runners_setting(qtbot, window_with, builtin_runs):
    window, engine = window_with([SIX_TIMES_SEVEN] * 2 + ["ok"])
    window.session.tools.max_repeats = 1
    window.session.send("What is 6*7?")
    qtbot.waitUntil(lambda: len(engine.requests) == 3 and _idle(window), timeout=WAIT_MS)
    assert [r.tool_choice for r in engine.requests] == [ToolChoice.AUTO] * 2 + [ToolChoice.NONE]
    assert "(calculator) 1 times" in window.notice_banner.text


def test_call_key_ignores_key_order_and_spacing_only():
    # canonical JSON written by hand: sorted keys, no spaces
    assert call_key("add", {"b": 3, "a": 2}) == '{"arguments":{"a":2,"b":3},"name":"add"}'
    assert call_key("add", {"a": 2, "b": 3}) == call_key("add", {"b": 3, "a": 2})
    assert call_key("add", {"a": 2, "b": 3}) != call_key("add", {"a": 2, "b": 4})
    assert call_key("add", {"a": 2}) != call_key("sub", {"a": 2})
    assert call_key("echo", {"text": "é"}) == '{"arguments":{"text":"é"},"name":"echo"}'


def test_a_repeated_mcp_call_asks_no_approval_and_is_not_sent_to_the_server(qtbot, tmp_path):
    """The repeat of an allowed MCP call (arguments in another order) gets the first result; the
    server is not called again and the user is not asked again."""
    engine = FakeEngine(
        replies=[
            ToolCallReply(calls=(("add", {"a": 2, "b": 3}),)),
            ToolCallReply(calls=(("add", {"b": 3, "a": 2}),)),
            "The sum is 5.",
        ]
    )
    window = make_window(qtbot, tmp_path, engine)
    try:
        registry = window.session.tool_registry
        registry.add_server("test", f"{sys.executable} {SERVER}")
        qtbot.waitUntil(lambda: registry.servers["test"].status != "starting", timeout=WAIT_MS)
        assert registry.servers["test"].status == READY, registry.servers["test"].message
        sent = []
        server = registry.servers["test"].server
        real_call = server.call_tool

        def counting(name, arguments, **kwargs):
            sent.append((name, arguments))
            return real_call(name, arguments, **kwargs)

        server.call_tool = counting
        window.session.set_tool_enabled(mcp_key("test", "add"), True)
        window.session.send("2+3?")
        qtbot.waitUntil(lambda: bool(_tool_widgets(window)), timeout=WAIT_MS)
        first = _tool_widgets(window)[0]
        qtbot.waitUntil(first.approval_row.isVisible, timeout=WAIT_MS)
        first.allow_once_button.click()
        qtbot.waitUntil(lambda: len(engine.requests) == 3 and _idle(window), timeout=WAIT_MS)
        assert sent == [("add", {"a": 2, "b": 3})]
        repeat = _tool_widgets(window)[1]
        assert repeat.message.tool["approval"] == REPEATED
        assert not repeat.approval_row.isVisible()
        assert engine.requests[2].messages[-1]["content"].startswith("5\n\n[Not run again")
    finally:
        close_window(window)


# --- the remote path: a scripted OpenAI-compatible server streams the calls ----------------------
def test_a_remote_model_repeating_a_call_gets_the_same_handling(qtbot, tmp_path, builtin_runs):
    from test_app_remote import add_connection, pick_remote_model, send

    from tests.scripted_openai_server import Reply, ScriptedOpenAIServer

    again = Reply(tool_calls=(("calculator", {"expression": "6*7"}),))
    server = ScriptedOpenAIServer([again, again, again, Reply("")]).start()
    window = make_window(qtbot, tmp_path, FakeEngine())
    try:
        add_connection(qtbot, window, server.base_url, models=(server.model,))
        pick_remote_model(qtbot, window)
        window.session.set_tool_enabled(builtin_key("calculator"), True)
        send(qtbot, window, "What is 6*7?")
        qtbot.waitUntil(lambda: len(server.requests) == 4 and _idle(window), timeout=WAIT_MS)
        assert builtin_runs == [("calculator", {"expression": "6*7"})]
        choices = [r.get("tool_choice") for r in server.requests]
        assert choices == ["auto", "auto", "auto", "none"]
        assert server.requests[2]["messages"][-1]["content"].startswith("42\n\n[Not run again")
        note = window.chat_view.widgets[-1].tool_calls_label.text()
        assert note.startswith("The model ended its turn without text after 3 tool calls")
        assert "finish reason: stop" in note
    finally:
        close_window(window)
        server.stop()


def test_an_empty_answer_after_the_round_limit_says_the_tools_were_withdrawn(
    qtbot, window_with, builtin_runs
):
    replies = [
        ToolCallReply(calls=(("calculator", {"expression": f"{n}+{n}"}),)) for n in (1, 2, 3)
    ]
    window, engine = window_with(replies)
    window.session.tools.max_rounds = 2
    window.session.send("Add up.")
    qtbot.waitUntil(lambda: len(engine.requests) == 3 and _idle(window), timeout=WAIT_MS)
    assert builtin_runs == [
        ("calculator", {"expression": "1+1"}),
        ("calculator", {"expression": "2+2"}),
    ]
    assert engine.requests[2].tool_choice == ToolChoice.NONE
    assert window.chat_view.widgets[-1].tool_calls_label.text() == (
        "The model ended its turn without text after 2 tool calls "
        "(finish reason: tool_calls — it ended on tool calls). It reached the limit of 2 tool "
        "rounds, so the tools were withdrawn. It still called 1 tool, which did not run."
    )


@pytest.mark.parametrize("reason", [str(reason) for reason in FinishReason])
def test_every_finish_reason_of_an_empty_answer_is_said_in_words(reason):
    # A reason without words showed bare ("finish reason: repetition") after the repetition stop
    # came in: every reason the engine can give has its words.
    runner = SimpleNamespace(calls_in_turn=0, repeats=0, max_repeats=2, rounds=0, max_rounds=8)
    note = ToolRunner.empty_reply_note(runner, reason)
    assert note.startswith(f"The model ended its turn without text (finish reason: {reason} — ")
    assert note.endswith(").") and FINISH_WORDS[reason] in note
