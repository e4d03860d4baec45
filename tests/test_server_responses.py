"""engine.server.responses branch by branch: what an OpenAI client receives for each engine
event, streamed and whole, chat and completions. Expected objects are written out by hand from
OpenAI's documented shapes (and our documented extra fields)."""

from __future__ import annotations

import json

import pytest

from engine.events import (
    Finished,
    ReasoningDelta,
    TextDelta,
    TokenSampled,
    ToolCallArgumentsDelta,
    ToolCallFinished,
    ToolCallMalformed,
    ToolCallStarted,
    TopAlternative,
    Usage,
)
from engine.server.protocol import parse_chat, parse_completion
from engine.server.responses import (
    SYSTEM_FINGERPRINT,
    ResponseWriter,
    openai_finish_reason,
    usage_object,
)
from engine.types import FinishReason

NAMES = {"smol"}
USER = [{"role": "user", "content": "hi"}]
PIECES = {10: b"Hel", 11: b"lo", 12: b"\xc3\xa9", 13: b"\xc3", 99: b"zz"}
TOOL = {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}


def usage(cached: int | None = 2) -> Usage:
    return Usage(
        prompt_tokens=5,
        completion_tokens=3,
        cached_tokens=cached,
        prefill_ms=10.12345,
        decode_ms=20.0006,
        ttft_ms=12.34567,
        prompt_tok_s=300.33333,
        decode_tok_s=99.99949,
        context_used=8,
        context_limit=512,
    )


def chat_writer(**fields) -> ResponseWriter:
    parsed = parse_chat({"model": "smol", "messages": USER, **fields}, NAMES)
    return ResponseWriter(parsed, "served-id", PIECES.__getitem__)


def completion_writer(**fields) -> ResponseWriter:
    parsed = parse_completion({"model": "smol", "prompt": "x", **fields}, NAMES)
    return ResponseWriter(parsed, "served-id", PIECES.__getitem__)


def done(reason=FinishReason.STOP, text="", reasoning="", cached: int | None = 2) -> Finished:
    return Finished(reason, usage(cached), text=text, reasoning=reasoning)


def token(index, token_id, text, logprob, top=()):
    return TokenSampled(index=index, token_id=token_id, text=text, logprob=logprob, top=top)


ALT = (TopAlternative(10, "Hel", -0.25), TopAlternative(99, "zz", -2.5))


# --- finish reasons and usage ----------------------------------------------------------------------
@pytest.mark.parametrize(
    ("reason", "sent"),
    [
        (FinishReason.STOP, "stop"),
        (FinishReason.STOP_SEQUENCE, "stop"),
        (FinishReason.GRAMMAR_COMPLETE, "stop"),
        (FinishReason.LENGTH, "length"),
        (FinishReason.TOOL_CALLS, "tool_calls"),
        (FinishReason.CANCELLED, "cancelled"),
        (FinishReason.ERROR, "error"),
        (FinishReason.REPETITION, "stop"),  # a loop the engine ended: nothing to continue
        ("length", "length"),  # the engine's value as a plain string
    ],
)
def test_every_engine_finish_reason_has_its_openai_name(reason, sent):
    assert openai_finish_reason(reason) == sent


def test_usage_in_openais_shape_with_timings_to_the_microsecond():
    assert usage_object(usage()) == {
        "prompt_tokens": 5,
        "completion_tokens": 3,
        "total_tokens": 8,
        "prompt_tokens_details": {"cached_tokens": 2},
        "timings": {
            "prefill_ms": 10.123,
            "decode_ms": 20.001,
            "ttft_ms": 12.346,
            "prompt_tokens_per_second": 300.333,
            "decode_tokens_per_second": 99.999,
        },
    }
    # no prefix cache consulted: OpenAI's field is still a number
    assert usage_object(usage(cached=None))["prompt_tokens_details"] == {"cached_tokens": 0}


# --- whole responses -------------------------------------------------------------------------------
def test_a_whole_chat_response_envelope():
    w = chat_writer()
    w.chunks(TextDelta("Hi"))
    body = w.response(done(text="Hi"))
    assert body["id"].startswith("chatcmpl-") and len(body["id"]) == len("chatcmpl-") + 24
    assert isinstance(body["created"], int) and body["created"] > 1_700_000_000
    assert {k: v for k, v in body.items() if k not in ("id", "created")} == {
        "object": "chat.completion",
        "model": "served-id",
        "system_fingerprint": SYSTEM_FINGERPRINT,
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": "Hi"},
                "logprobs": None,
                "finish_reason": "stop",
            }
        ],
        "usage": usage_object(usage()),
    }
    assert SYSTEM_FINGERPRINT == "localchat"
    assert chat_writer().id != chat_writer().id  # each response its own id


def test_a_whole_completion_response_envelope():
    w = completion_writer()
    for event in (token(0, 10, "Hel", -0.5), TextDelta("Hel")):
        assert w.chunks(event) == []
    body = w.response(done(FinishReason.LENGTH, text="Hel"))
    assert body["id"].startswith("cmpl-") and len(body["id"]) == len("cmpl-") + 24
    assert body["object"] == "text_completion" and body["model"] == "served-id"
    assert body["choices"] == [
        {"index": 0, "text": "Hel", "logprobs": None, "finish_reason": "length"}
    ]


def test_reasoning_comes_apart_from_the_answer_only_when_there_is_some():
    w = chat_writer()
    w.chunks(ReasoningDelta("think"))
    message = w.response(done(text="A", reasoning="think"))["choices"][0]["message"]
    assert message == {"role": "assistant", "content": "A", "reasoning_content": "think"}
    assert (
        "reasoning_content" not in chat_writer().response(done(text="A"))["choices"][0]["message"]
    )


def test_whole_chat_logprobs_with_bytes_and_the_requested_number_of_alternatives():
    w = chat_writer(logprobs=True, top_logprobs=1)
    w.chunks(token(0, 10, "Hel", -0.5, ALT))
    w.chunks(token(1, 12, "é", -1.0, ALT))
    w.chunks(TextDelta("Helé"))
    logprobs = w.response(done(text="Helé"))["choices"][0]["logprobs"]
    assert logprobs == {
        "content": [
            {
                "token": "Hel",
                "logprob": -0.5,
                "bytes": [72, 101, 108],
                "top_logprobs": [{"token": "Hel", "logprob": -0.25, "bytes": [72, 101, 108]}],
            },
            {
                "token": "é",
                "logprob": -1.0,
                "bytes": [0xC3, 0xA9],
                "top_logprobs": [{"token": "Hel", "logprob": -0.25, "bytes": [72, 101, 108]}],
            },
        ],
        "refusal": None,
    }
    # logprobs without top_logprobs: each token's own, no alternatives
    w = chat_writer(logprobs=True)
    w.chunks(token(0, 10, "Hel", -0.5, ALT))
    content = w.response(done(text="Hel"))["choices"][0]["logprobs"]["content"]
    assert content[0]["top_logprobs"] == []


def test_completion_logprobs_offsets_count_characters_not_bytes():
    w = completion_writer(logprobs=2)
    for event in (
        token(0, 12, "é", -1.0, ALT),
        token(1, 10, "Hel", -0.5, ALT),
        token(2, 13, "\ufffd", -3.0, ALT),  # half a character: one replacement character
        token(3, 11, "lo", -0.1, ALT),
    ):
        w.chunks(event)
    logprobs = w.response(done(text="éHel\ufffdlo"))["choices"][0]["logprobs"]
    assert logprobs == {
        "tokens": ["é", "Hel", "\ufffd", "lo"],
        "token_logprobs": [-1.0, -0.5, -3.0, -0.1],
        "top_logprobs": [{"Hel": -0.25, "zz": -2.5}] * 4,
        "text_offset": [0, 1, 4, 5],
    }
    w = completion_writer(logprobs=0)
    w.chunks(token(0, 10, "Hel", -0.5, ALT))
    assert w.response(done(text="Hel"))["choices"][0]["logprobs"]["top_logprobs"] is None


# --- streams ---------------------------------------------------------------------------------------
def test_a_chat_stream_opens_with_the_role_once():
    w = chat_writer(stream=True)
    (opening,) = w.opening_chunks()
    assert opening["object"] == "chat.completion.chunk" and opening["id"] == w.id
    assert opening["choices"] == [
        {
            "index": 0,
            "delta": {"role": "assistant", "content": ""},
            "logprobs": None,
            "finish_reason": None,
        }
    ]
    assert opening["model"] == "served-id" and opening["system_fingerprint"] == "localchat"
    assert w.opening_chunks() == []
    assert completion_writer(stream=True).opening_chunks() == []


def test_stream_chunks_for_text_reasoning_and_nothing():
    w = chat_writer(stream=True)
    assert w.chunks(TextDelta("")) == [] and w.chunks(ReasoningDelta("")) == []
    assert w.chunks(token(0, 10, "Hel", -0.5)) == []  # no logprobs asked: tokens send nothing
    (text,) = w.chunks(TextDelta("Hel"))
    assert text["choices"][0] == {
        "index": 0,
        "delta": {"content": "Hel"},
        "logprobs": None,
        "finish_reason": None,
    }
    (thought,) = w.chunks(ReasoningDelta("hmm"))
    assert thought["choices"][0]["delta"] == {"reasoning_content": "hmm"}
    assert w.chunks(object()) == []  # an event the API has no place for


def test_a_completion_stream_sends_text_chunks_and_closes_with_usage():
    w = completion_writer(stream=True, logprobs=1, stream_options={"include_usage": True})
    assert w.chunks(token(0, 10, "Hel", -0.5, ALT)) == []
    (text,) = w.chunks(TextDelta("Hel"))
    assert text["object"] == "text_completion"
    assert text["choices"] == [
        {
            "index": 0,
            "text": "Hel",
            "logprobs": {
                "tokens": ["Hel"],
                "token_logprobs": [-0.5],
                "top_logprobs": [{"Hel": -0.25}],
                "text_offset": [0],
            },
            "finish_reason": None,
        }
    ]
    w.chunks(token(1, 11, "lo", -0.1, ALT))
    closing, usage_chunk = w.closing_chunks(done(FinishReason.STOP, text="Hello"))
    # the token sampled last, never followed by text, still gets its logprob, at the close
    assert closing["choices"] == [
        {
            "index": 0,
            "text": "",
            "logprobs": {
                "tokens": ["lo"],
                "token_logprobs": [-0.1],
                "top_logprobs": [{"Hel": -0.25}],
                "text_offset": [3],
            },
            "finish_reason": "stop",
        }
    ]
    assert usage_chunk["object"] == "text_completion" and usage_chunk["choices"] == []
    assert usage_chunk["usage"] == usage_object(usage()) and usage_chunk["id"] == w.id


def test_a_chat_stream_without_include_usage_closes_with_one_chunk():
    w = chat_writer(stream=True, logprobs=True)
    (closing,) = w.closing_chunks(done(FinishReason.CANCELLED))
    assert closing["object"] == "chat.completion.chunk"
    assert closing["choices"] == [
        {"index": 0, "delta": {}, "logprobs": None, "finish_reason": "cancelled"}
    ]
    w = chat_writer(stream=True, stream_options={"include_usage": True})
    closing, usage_chunk = w.closing_chunks(done())
    assert usage_chunk["object"] == "chat.completion.chunk" and usage_chunk["choices"] == []


def test_a_whole_response_does_not_stream_anything():
    w = chat_writer(tools=[TOOL], tool_choice="required", logprobs=True)
    for event in [
        token(0, 10, "Hel", -0.5),
        TextDelta("Hel"),
        ReasoningDelta("r"),
        ToolCallStarted("c", "get_weather"),
        ToolCallArgumentsDelta("c", "{}"),
        ToolCallFinished("c", "get_weather", {}),
    ]:
        assert w.chunks(event) == []
    assert len(w.response(done(FinishReason.TOOL_CALLS))["choices"][0]["logprobs"]["content"]) == 1


# --- tool calls ------------------------------------------------------------------------------------
def _call(call_id, args_text, name="get_weather", ok=True, pieces=2):
    cut = max(1, len(args_text) // pieces)
    events = [ToolCallStarted(call_id, name)]
    events += [
        ToolCallArgumentsDelta(call_id, args_text[i : i + cut])
        for i in range(0, len(args_text), cut)
    ]
    if ok:
        events.append(ToolCallFinished(call_id, name, json.loads(args_text)))
    else:
        events.append(ToolCallMalformed(call_id, name, args_text, "not JSON"))
    return events


def _tool_calls_sent(chunks) -> list:
    return [tc for c in chunks for tc in c["choices"][0]["delta"].get("tool_calls", [])]


def test_two_auto_calls_get_indexes_in_the_order_they_were_checked():
    w = chat_writer(tools=[TOOL], stream=True)
    sent = []
    for event in _call("a", '{"city":"Oslo"}') + _call("b", '{"city":"Rome"}'):
        sent += w.chunks(event)
    deltas = _tool_calls_sent(sent)
    # '{"city":"Oslo"}' in pieces of 7: three argument deltas after the name
    assert [d["index"] for d in deltas] == [0, 0, 0, 0, 1, 1, 1, 1]
    assert deltas[0] == {
        "index": 0,
        "id": "a",
        "type": "function",
        "function": {"name": "get_weather", "arguments": ""},
    }
    assert deltas[4]["id"] == "b"
    assert "".join(d["function"]["arguments"] for d in deltas[:4]) == '{"city":"Oslo"}'
    (closing,) = w.closing_chunks(done(FinishReason.TOOL_CALLS))
    assert closing["choices"][0]["finish_reason"] == "tool_calls"
    assert "malformed_tool_calls" not in closing["choices"][0]


def test_argument_deltas_after_a_call_was_sent_go_out_at_once():
    w = chat_writer(tools=[TOOL], stream=True, tool_choice="required")
    (first,) = w.chunks(ToolCallStarted("a", "get_weather"))
    assert _tool_calls_sent([first])[0]["index"] == 0
    (fragment,) = w.chunks(ToolCallArgumentsDelta("a", '{"city"'))
    assert _tool_calls_sent([fragment]) == [{"index": 0, "function": {"arguments": '{"city"'}}]
    assert w.chunks(ToolCallFinished("a", "get_weather", {"city": "x"})) == []


def test_a_constrained_call_cut_short_is_not_resent_as_text():
    w = chat_writer(tools=[TOOL], stream=True, tool_choice="required")
    w.chunks(ToolCallStarted("a", "get_weather"))
    w.chunks(ToolCallArgumentsDelta("a", '{"ci'))
    assert w.chunks(ToolCallMalformed("a", "get_weather", '{"ci', "cut off")) == []
    (closing,) = w.closing_chunks(done(FinishReason.LENGTH))
    choice = closing["choices"][0]
    assert choice["finish_reason"] == "length"
    assert choice["malformed_tool_calls"] == [
        {"name": "get_weather", "text": '{"ci', "problem": "cut off"}
    ]


def test_a_malformed_auto_call_with_no_text_sends_nothing():
    w = chat_writer(tools=[TOOL], stream=True)
    w.chunks(ToolCallStarted("a", "nope"))
    assert w.chunks(ToolCallMalformed("a", "nope", "", "unknown tool")) == []


def test_a_whole_reply_with_text_and_a_call_keeps_both():
    w = chat_writer(tools=[TOOL])
    for event in [TextDelta("Looking. "), *_call("a", '{"city": "Oslo"}')]:
        w.chunks(event)
    message = w.response(done(FinishReason.TOOL_CALLS, text="Looking. "))["choices"][0]["message"]
    assert message["content"] == "Looking. "
    assert message["tool_calls"] == [
        {
            "id": "a",
            "type": "function",
            "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'},
        }
    ]


def test_a_whole_call_carries_the_arguments_as_written_only_when_they_are_what_was_checked():
    # written text that parses to the checked arguments: kept as written (whitespace and all)
    w = chat_writer(tools=[TOOL])
    for event in _call("a", '{ "city" :  "Oslo" }'):
        w.chunks(event)
    (call,) = w.response(done(FinishReason.TOOL_CALLS))["choices"][0]["message"]["tool_calls"]
    assert call["function"]["arguments"] == '{ "city" :  "Oslo" }'
    # the written text says something else (or is not JSON): the checked arguments, as JSON
    for written in ('{"city": "Rome"}', '{"city": '):
        w = chat_writer(tools=[TOOL])
        w.chunks(ToolCallStarted("a", "get_weather"))
        w.chunks(ToolCallArgumentsDelta("a", written))
        w.chunks(ToolCallFinished("a", "get_weather", {"city": "Oslo"}))
        (call,) = w.response(done(FinishReason.TOOL_CALLS))["choices"][0]["message"]["tool_calls"]
        assert call["function"]["arguments"] == '{"city": "Oslo"}'
    # a call with no argument text at all
    w = chat_writer(tools=[TOOL])
    w.chunks(ToolCallStarted("a", "get_weather"))
    w.chunks(ToolCallFinished("a", "get_weather", {}))
    (call,) = w.response(done(FinishReason.TOOL_CALLS))["choices"][0]["message"]["tool_calls"]
    assert call["function"]["arguments"] == "{}"


def test_only_malformed_calls_finish_as_stop_with_their_text_as_content():
    w = chat_writer(tools=[TOOL])
    for event in [TextDelta("A "), *_call("a", "{bad", ok=False), TextDelta(" B")]:
        w.chunks(event)
    choice = w.response(done(FinishReason.TOOL_CALLS, text="A  B"))["choices"][0]
    assert choice["finish_reason"] == "stop"
    assert choice["message"] == {"role": "assistant", "content": "A {bad B"}
    assert choice["malformed_tool_calls"] == [
        {"name": "get_weather", "text": "{bad", "problem": "not JSON"}
    ]
    # a good call beside a malformed one: finish_reason tool_calls, both reported
    w = chat_writer(tools=[TOOL])
    for event in _call("a", "{bad", ok=False) + _call("b", '{"city": "Oslo"}'):
        w.chunks(event)
    choice = w.response(done(FinishReason.TOOL_CALLS))["choices"][0]
    assert choice["finish_reason"] == "tool_calls"
    assert choice["message"]["content"] == "{bad"
    assert [c["id"] for c in choice["message"]["tool_calls"]] == ["b"]
