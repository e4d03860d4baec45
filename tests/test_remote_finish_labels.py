"""app/finish_reasons.py: how a finish reason becomes words in the message header, the usage panel
and the Markdown export. Every reason either side can send, local and remote, stored before the
server's word was kept, and imported from another version; the expected words are written out
here by hand (issue 31, defect 2: a server's "cancelled" read as "stop (end of turn)")."""

from __future__ import annotations

import pytest

from app.finish_reasons import end_note, finish_label, header_note, server_word
from engine.types import FinishReason, MessageStatus

C, E, X = MessageStatus.COMPLETE, MessageStatus.ERROR, MessageStatus.CANCELLED


def remote(word: str | None) -> dict:
    return {"measured_over_network": True, "server_finish_reason": word}


LOCAL = {"measured_over_network": False, "server_finish_reason": None}

# (status, finish_reason, usage, usage panel, message header, Markdown heading note)
CASES = [
    # the local engine's own reasons
    (C, "stop", LOCAL, "stop (end of turn)", "", ""),
    (C, "stop_sequence", LOCAL, "stop string matched", "", ""),
    (C, "grammar_complete", LOCAL, "JSON complete", "", ""),
    (C, "tool_calls", LOCAL, "tool calls made", "", ""),
    (
        C,
        "length",
        LOCAL,
        "length limit reached",
        "✂ length limit reached — the reply may be cut short",
        "length limit reached — the reply may be cut short",
    ),
    (
        C,
        "repetition",
        LOCAL,
        "stopped: the model was repeating itself",
        "⚠ stopped: the model was repeating itself",
        "stopped: the model was repeating itself",
    ),
    (
        X,
        "cancelled",
        LOCAL,
        "cancelled by you",
        "■ cancelled — partial reply kept",
        "cancelled — partial reply kept",
    ),
    (E, "error", LOCAL, "error", "⚠ failed", "failed"),
    (E, "error", {"error": "refused before the stream"}, "error", "⚠ failed", "failed"),
    # a server's words
    (C, "stop", remote("stop"), "stop (end of turn)", "", ""),
    (C, "stop", remote("eos_token"), "stop (end of turn)", "", ""),
    (
        C,
        "length",
        remote("max_tokens"),
        "length limit reached",
        "✂ length limit reached — the reply may be cut short",
        "length limit reached — the reply may be cut short",
    ),
    (C, "tool_calls", remote("tool_calls"), "tool calls made", "", ""),
    (C, "tool_calls", remote("stop"), "tool calls made", "", ""),  # calls after a "stop"
    (
        C,
        "stop",
        remote("tool_calls"),
        "tool calls, none of which could be run",
        "⚠ tool calls, none of which could be run",
        "tool calls, none of which could be run",
    ),
    (
        C,
        "stop",
        remote(""),
        "ended without a finish reason from the server",
        "⚠ ended without a finish reason from the server",
        "ended without a finish reason from the server",
    ),
    (
        E,
        "error",
        remote("cancelled"),
        "cut short by the server, which said 'cancelled'",
        "⚠ failed: cut short by the server, which said 'cancelled'",
        "failed: cut short by the server, which said 'cancelled'",
    ),
    (
        E,
        "error",
        remote("error"),
        "the server reported an error",
        "⚠ failed: the server reported an error",
        "failed: the server reported an error",
    ),
    (
        E,
        "error",
        remote("content_filter"),
        "stopped by the server's content filter",
        "⚠ failed: stopped by the server's content filter",
        "failed: stopped by the server's content filter",
    ),
    (
        E,
        "error",
        remote("foo"),
        "ended: server said 'foo'",
        "⚠ failed: ended: server said 'foo'",
        "failed: ended: server said 'foo'",
    ),
    # a broken stream (no [DONE]): the error says it, whatever the server had said before
    (E, "error", remote("stop"), "error", "⚠ failed", "failed"),
    (E, "error", remote(""), "error", "⚠ failed", "failed"),
    # the user's Stop on a remote reply
    (
        X,
        "cancelled",
        remote(""),
        "cancelled by you",
        "■ cancelled — partial reply kept",
        "cancelled — partial reply kept",
    ),
    (
        X,
        "cancelled",
        remote("length"),
        "cancelled by you",
        "■ cancelled — partial reply kept",
        "cancelled — partial reply kept",
    ),
    # stored before the app kept the server's word: the category alone
    (C, "stop", {"measured_over_network": True}, "stop (end of turn)", "", ""),
    # from an import or a later version: never a clean end
    (
        C,
        "paused",
        None,
        "ended: 'paused' (a reason this app does not know)",
        "⚠ ended: 'paused' (a reason this app does not know)",
        "ended: 'paused' (a reason this app does not know)",
    ),
    (C, None, None, "—", "", ""),
    (C, "", {}, "—", "", ""),
    (E, None, None, "—", "⚠ failed", "failed"),
    ("archived", "stop", None, "stop (end of turn)", "⚠ archived", "archived"),
    (None, "stop", None, "stop (end of turn)", "", ""),
]


@pytest.mark.parametrize("status, reason, usage, panel, header, note", CASES)
def test_each_way_a_reply_ends_in_words(status, reason, usage, panel, header, note):
    assert finish_label(reason, usage) == panel
    assert header_note(status, reason, usage) == header
    assert end_note(status, reason, usage) == note


def test_streaming_and_interrupted_replies():
    for reason in (None, "stop", "error"):
        assert header_note(MessageStatus.STREAMING, reason) == "generating…"
        assert end_note(MessageStatus.STREAMING, reason) == "generating…"
        assert header_note(MessageStatus.INTERRUPTED, reason) == (
            "⚠ interrupted (the app closed while this reply was streaming)"
        )
        assert end_note(MessageStatus.INTERRUPTED, reason) == (
            "interrupted (the app closed while this reply was streaming)"
        )


def test_the_servers_word_is_read_only_as_text():
    assert server_word({"server_finish_reason": "x"}) == "x"
    assert server_word({"server_finish_reason": ""}) == ""
    assert server_word({"server_finish_reason": 5}) is None
    assert server_word({}) is None
    assert server_word(None) is None
    assert server_word(["server_finish_reason"]) is None  # a usage that is not a mapping


def test_every_reason_of_the_engine_has_words():
    for reason in FinishReason:
        assert "a reason this app does not know" not in finish_label(reason)
