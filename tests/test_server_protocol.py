"""The OpenAI protocol layer without a model: request bodies -> GenerationRequest (and the field a
refusal names), engine events -> response objects and chunks, engine errors -> status + shape."""

from __future__ import annotations

import json

import pytest

from engine.errors import (
    ConfigValidationError,
    ConstraintError,
    ContextOverflowError,
    MemoryBudgetError,
)
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
from engine.server.api_errors import ApiError, from_engine_error
from engine.server.protocol import CHAT, COMPLETION, parse_chat, parse_completion
from engine.server.responses import ResponseWriter
from engine.server.serve import check_bind, is_loopback
from engine.types import FinishReason, JsonMode

NAMES = {"smol", "default"}
USER = [{"role": "user", "content": "hi"}]


def chat(**fields):
    return parse_chat({"model": "smol", "messages": USER, **fields}, NAMES)


def refused_field(parse, body) -> str:
    with pytest.raises(ConfigValidationError) as info:
        parse(body, NAMES)
    return info.value.field


def test_chat_fields_map_onto_the_engine_request():
    parsed = chat(
        max_tokens=7,
        temperature=0.5,
        top_p=0.9,
        top_k=20,
        min_p=0.05,
        presence_penalty=0.3,
        frequency_penalty=-0.2,
        repetition_penalty=1.1,
        seed=42,
        stop="END",
        logprobs=True,
        top_logprobs=3,
        stream=True,
        stream_options={"include_usage": True},
        user="someone",  # unknown to us: ignored, as OpenAI ignores what it does not use
    )
    assert parsed.kind == CHAT and parsed.stream and parsed.include_usage
    assert parsed.logprobs and parsed.top_logprobs == 3
    assert parsed.request.top_logprobs == 3
    assert parsed.request.messages == [{"role": "user", "content": "hi"}]
    assert parsed.request.overrides == {
        "max_new_tokens": 7,
        "temperature": 0.5,
        "do_sample": True,
        "top_p": 0.9,
        "top_k": 20,
        "min_p": 0.05,
        "presence_penalty": 0.3,
        "frequency_penalty": -0.2,
        "repetition_penalty": 1.1,
        "seed": 42,
        "stop": ["END"],
    }


def test_temperature_zero_is_greedy_and_absent_values_leave_the_preset_in_charge():
    assert chat(temperature=0).request.overrides == {"do_sample": False}
    assert chat().request.overrides == {}
    assert chat(max_completion_tokens=5, max_tokens=9).request.overrides == {"max_new_tokens": 5}


def test_completions_default_to_openais_16_tokens_and_accept_token_ids():
    parsed = parse_completion({"model": "default", "prompt": "Once"}, NAMES)
    assert parsed.kind == COMPLETION and parsed.request.prompt == "Once"
    assert parsed.request.overrides == {"max_new_tokens": 16}
    ids = parse_completion({"model": "smol", "prompt": [[1, 2, 3]], "logprobs": 2}, NAMES)
    assert ids.request.prompt_ids == [1, 2, 3] and ids.logprobs and ids.top_logprobs == 2
    assert not parse_completion({"model": "smol", "prompt": "x"}, NAMES).logprobs


def test_messages_roles_and_text_parts():
    parsed = chat(
        messages=[
            {"role": "developer", "content": "be brief"},
            {
                "role": "user",
                "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}],
            },
            {"role": "assistant", "content": None},
        ]
    )
    assert parsed.request.messages == [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "ab"},
        {"role": "assistant", "content": ""},
    ]


@pytest.mark.parametrize(
    ("fields", "field"),
    [
        ({"max_tokens": -1}, "max_tokens"),
        ({"max_tokens": "ten"}, "max_tokens"),
        ({"max_completion_tokens": 0}, "max_completion_tokens"),
        ({"temperature": "hot"}, "temperature"),
        ({"temperature": -0.5}, "temperature"),
        ({"top_p": 1.5}, "top_p"),
        ({"top_k": -3}, "top_k"),
        ({"seed": -1}, "seed"),
        ({"seed": 1.5}, "seed"),
        ({"stop": 5}, "stop"),
        ({"stop": [""]}, "stop"),
        ({"n": 2}, "n"),
        ({"logprobs": "yes"}, "logprobs"),
        ({"top_logprobs": 3}, "top_logprobs"),  # without logprobs: true
        ({"logprobs": True, "top_logprobs": 21}, "top_logprobs"),
        ({"stream": 1}, "stream"),
        ({"stream_options": {"include_usage": "y"}}, "stream_options.include_usage"),
        ({"response_format": {"type": "xml"}}, "response_format.type"),
        ({"response_format": {"type": "json_schema"}}, "response_format.json_schema"),
        (
            {"response_format": {"type": "json_schema", "json_schema": {"schema": []}}},
            "response_format.json_schema.schema",
        ),
        ({"messages": []}, "messages"),
        ({"messages": "hi"}, "messages"),
        ({"messages": [{"role": "tool", "content": "x"}]}, "messages[0].tool_call_id"),
        ({"messages": [{"role": "critic", "content": "x"}]}, "messages[0].role"),
        (
            {"messages": [{"role": "assistant", "content": None, "tool_calls": {"id": "x"}}]},
            "messages[0].tool_calls",
        ),
        (
            {
                "messages": [
                    {"role": "assistant", "tool_calls": [{"id": "c1", "function": {"name": ""}}]}
                ]
            },
            "messages[0].tool_calls[0].function.name",
        ),
        (
            {
                "messages": [
                    {
                        "role": "assistant",
                        "tool_calls": [{"id": "c1", "function": {"name": "f", "arguments": 3}}],
                    }
                ]
            },
            "messages[0].tool_calls[0].function.arguments",
        ),
        ({"functions": [{"name": "f"}]}, "functions"),
        ({"messages": [{"role": "user", "content": 3}]}, "messages[0].content"),
        (
            {"messages": [{"role": "user", "content": [{"type": "image_url"}]}]},
            "messages[0].content[0].type",
        ),
        ({"logit_bias": {"1": 5}}, "logit_bias"),
        ({"model": 3}, "model"),
    ],
)
def test_invalid_chat_values_name_the_openai_field(fields, field):
    assert refused_field(parse_chat, {"model": "smol", "messages": USER, **fields}) == field


@pytest.mark.parametrize(
    ("fields", "field"),
    [
        ({"prompt": 5}, "prompt"),
        ({"prompt": ["a", "b"]}, "prompt"),
        ({"prompt": "x", "echo": True}, "echo"),
        ({"prompt": "x", "suffix": "y"}, "suffix"),
        ({"prompt": "x", "best_of": 3}, "best_of"),
        ({"prompt": "x", "logprobs": -1}, "logprobs"),
    ],
)
def test_invalid_completion_values_name_the_field(fields, field):
    assert refused_field(parse_completion, {"model": "smol", **fields}) == field


def test_a_body_that_is_not_an_object_and_an_unknown_model():
    assert refused_field(parse_chat, ["not", "an", "object"]) == "body"
    with pytest.raises(ApiError) as info:
        parse_chat({"model": "gpt-4o", "messages": USER}, NAMES)
    assert info.value.status == 404 and info.value.param == "model"
    assert info.value.code == "model_not_found" and "'gpt-4o'" in info.value.message


def test_response_format_maps_onto_json_mode():
    assert chat(response_format={"type": "text"}).request.json_mode == JsonMode.OFF
    assert chat(response_format={"type": "json_object"}).request.json_mode == JsonMode.OBJECT
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
    parsed = chat(
        response_format={
            "type": "json_schema",
            "json_schema": {"name": "x", "schema": schema, "strict": True},
        }
    )
    assert parsed.request.json_mode == JsonMode.SCHEMA and parsed.request.json_schema == schema


def test_engine_errors_become_statuses_naming_the_field():
    err = from_engine_error(
        ConfigValidationError("max_new_tokens", 0, "an integer >= 1"), "messages"
    )
    assert (err.status, err.param) == (400, "max_tokens")
    err = from_engine_error(ContextOverflowError("too long"), "prompt")
    assert (err.status, err.param, err.code) == (400, "prompt", "context_length_exceeded")
    err = from_engine_error(ConstraintError("Invalid type: foo"), "messages")
    assert (err.status, err.param) == (400, "response_format")
    err = from_engine_error(MemoryBudgetError("needs 5 bytes"), "messages")
    assert err.status == 400 and err.body()["error"]["message"] == "needs 5 bytes"
    assert set(err.body()["error"]) == {"message", "type", "param", "code"}


# --- responses -------------------------------------------------------------------------------------
def usage(prompt=5, completion=3, cached=2) -> Usage:
    return Usage(
        prompt_tokens=prompt,
        completion_tokens=completion,
        cached_tokens=cached,
        prefill_ms=10.0,
        decode_ms=20.0,
        ttft_ms=12.0,
        prompt_tok_s=300.0,
        decode_tok_s=100.0,
        context_used=prompt + completion,
        context_limit=512,
    )


def token(index, token_id, text, logprob=-0.5):
    top = (TopAlternative(token_id, text, logprob), TopAlternative(99, "zz", -3.0))
    return TokenSampled(index=index, token_id=token_id, text=text, logprob=logprob, top=top)


EVENTS = [
    token(0, 10, "Hel"),
    token(1, 11, "lo"),
    TextDelta("Hello"),
    ReasoningDelta("hmm"),
    token(2, 12, "!"),
    TextDelta("!"),
]


def finished(reason=FinishReason.STOP_SEQUENCE) -> Finished:
    return Finished(finish_reason=reason, usage=usage(), text="Hello!", reasoning="hmm")


def writer(**fields) -> ResponseWriter:
    parsed = chat(**fields)
    return ResponseWriter(parsed, "smol", lambda i: {10: b"Hel", 11: b"lo", 12: b"!"}.get(i, b"zz"))


def test_a_whole_chat_response_with_logprobs_and_usage():
    w = writer(logprobs=True, top_logprobs=1)
    for event in EVENTS:
        assert w.chunks(event) == []
    body = w.response(finished())
    assert body["object"] == "chat.completion" and body["id"].startswith("chatcmpl-")
    (choice,) = body["choices"]
    assert choice["message"] == {
        "role": "assistant",
        "content": "Hello!",
        "reasoning_content": "hmm",
    }
    assert choice["finish_reason"] == "stop"  # a stop string is OpenAI's "stop"
    content = choice["logprobs"]["content"]
    assert [c["token"] for c in content] == ["Hel", "lo", "!"]
    assert content[0]["bytes"] == list(b"Hel") and len(content[0]["top_logprobs"]) == 1
    assert body["usage"]["total_tokens"] == 8
    assert body["usage"]["prompt_tokens_details"] == {"cached_tokens": 2}
    assert body["usage"]["timings"]["ttft_ms"] == 12.0


def test_streamed_chunks_carry_each_tokens_logprob_once_then_finish_and_usage():
    w = writer(logprobs=True, stream=True, stream_options={"include_usage": True})
    chunks = w.opening_chunks()
    for event in EVENTS:
        chunks += w.chunks(event)
    chunks += w.closing_chunks(finished(FinishReason.LENGTH))
    deltas = [c["choices"][0]["delta"] for c in chunks if c["choices"]]
    assert deltas[0] == {"role": "assistant", "content": ""}
    assert "".join(d.get("content", "") for d in deltas) == "Hello!"
    assert [d.get("reasoning_content") for d in deltas if "reasoning_content" in d] == ["hmm"]
    sent = [
        t["token"]
        for c in chunks
        if c["choices"] and c["choices"][0]["logprobs"]
        for t in c["choices"][0]["logprobs"]["content"]
    ]
    assert sent == ["Hel", "lo", "!"]
    assert chunks[-2]["choices"][0]["finish_reason"] == "length"
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == 3
    assert {c["object"] for c in chunks} == {"chat.completion.chunk"}


def test_completion_logprobs_in_the_legacy_shape():
    parsed = parse_completion({"model": "smol", "prompt": "x", "logprobs": 1}, NAMES)
    w = ResponseWriter(parsed, "smol", lambda i: {10: b"Hel", 11: b"lo", 12: b"!"}[i])
    for event in EVENTS:
        w.chunks(event)
    body = w.response(finished(FinishReason.GRAMMAR_COMPLETE))
    (choice,) = body["choices"]
    assert body["object"] == "text_completion" and choice["text"] == "Hello!"
    assert choice["finish_reason"] == "stop"
    assert choice["logprobs"]["tokens"] == ["Hel", "lo", "!"]
    assert choice["logprobs"]["text_offset"] == [0, 3, 5]
    assert choice["logprobs"]["top_logprobs"][0] == {"Hel": -0.5}


@pytest.mark.parametrize(
    ("reason", "openai"),
    [
        (FinishReason.STOP, "stop"),
        (FinishReason.LENGTH, "length"),
        (FinishReason.CANCELLED, "cancelled"),
    ],
)
def test_finish_reasons(reason, openai):
    assert writer().response(finished(reason))["choices"][0]["finish_reason"] == openai


def test_a_host_beyond_loopback_needs_an_api_key():
    for host in ("127.0.0.1", "127.0.0.5", "::1", "localhost"):
        assert is_loopback(host)
        check_bind(host, None)
    for host in ("0.0.0.0", "192.168.1.4", "::", "example.com"):
        assert not is_loopback(host)
        with pytest.raises(ConfigValidationError) as info:
            check_bind(host, None)
        assert info.value.field == "--host"
        check_bind(host, "secret")
    with pytest.raises(ConfigValidationError):
        check_bind("127.0.0.1", "  ")


@pytest.mark.parametrize(
    ("flags", "named"),
    [
        (["--host", "0.0.0.0"], "--host"),
        (["--host", "192.168.1.4", "--api-key", ""], "--api-key"),
        (["--max-concurrency", "0"], "--max-concurrency"),
        (["--max-queue", "-1"], "--max-queue"),
        (["--kv-budget-mb", "0"], "--kv-budget-mb"),
        (["--port", "70000"], "--port"),
    ],
)
def test_serve_refuses_bad_flags_before_loading_the_model(flags, named, capsys):
    from engine.__main__ import EXIT_USAGE, main

    assert main(["serve", "no-such-model.gguf", *flags]) == EXIT_USAGE
    assert named in capsys.readouterr().err


def test_no_cors_unless_an_origin_is_named():
    from starlette.middleware.cors import CORSMiddleware

    from engine.server.access import AccessGuard
    from engine.server.app import LocalChatServer, ServerOptions, build_app

    def middleware(**options):
        server = LocalChatServer(None, None, ServerOptions(model_id="m", **options))
        return [m.cls for m in build_app(server).user_middleware]

    assert middleware() == [AccessGuard]  # Host and Origin are always checked
    assert middleware(cors_origin="http://localhost:3000") == [AccessGuard, CORSMiddleware]
    assert middleware(allowed_origins=["http://a.b"]) == [AccessGuard, CORSMiddleware]


# --- tools -----------------------------------------------------------------------------------------
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
        },
    },
}


def test_tools_and_a_tool_history_reach_the_engine_request():
    history = [
        {"role": "user", "content": "Weather in Oslo?"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "4 C, rain"},
    ]
    parsed = chat(messages=history, tools=[WEATHER], tool_choice="required")
    assert parsed.request.tools == [WEATHER] and parsed.request.tool_choice == "required"
    assert parsed.tools_constrained
    assert parsed.request.messages[1] == {
        "role": "assistant",
        "content": "",
        "tool_calls": history[1]["tool_calls"],
    }
    assert parsed.request.messages[2] == {
        "role": "tool",
        "content": "4 C, rain",
        "tool_call_id": "call_1",
    }
    named = {"type": "function", "function": {"name": "get_weather"}}
    assert chat(tools=[WEATHER], tool_choice=named).tools_constrained
    assert not chat(tools=[WEATHER], tool_choice="auto").tools_constrained
    assert not chat(tools=[WEATHER]).tools_constrained


def _call_events(call_id="call_a", arguments='{"city": "Oslo"}', ok=True):
    events = [
        TextDelta("Let me look. "),
        ToolCallStarted(call_id, "get_weather"),
        ToolCallArgumentsDelta(call_id, arguments[:5]),
        ToolCallArgumentsDelta(call_id, arguments[5:]),
    ]
    if ok:
        events.append(ToolCallFinished(call_id, "get_weather", json.loads(arguments)))
    else:
        events.append(ToolCallMalformed(call_id, "get_weather", arguments, "not JSON"))
    return events


def _stream(w: ResponseWriter, events, reason) -> tuple[list, list[dict]]:
    sent = []
    for event in events:
        sent.append((type(event).__name__, w.chunks(event)))
    done = Finished(finish_reason=reason, usage=usage(), text="Let me look. ")
    return sent, w.closing_chunks(done)


def test_an_auto_call_is_held_until_checked_then_sent_in_openais_delta_shape():
    w = writer(tools=[WEATHER], stream=True)
    sent, closing = _stream(w, _call_events(), FinishReason.TOOL_CALLS)
    by_event = dict((name, chunks) for name, chunks in sent if name != "ToolCallArgumentsDelta")
    assert by_event["ToolCallStarted"] == []  # held: not yet known to be a valid call
    deltas = [c["choices"][0]["delta"]["tool_calls"] for c in by_event["ToolCallFinished"]]
    assert deltas == [
        [
            {
                "index": 0,
                "id": "call_a",
                "type": "function",
                "function": {"name": "get_weather", "arguments": ""},
            }
        ],
        [{"index": 0, "function": {"arguments": '{"cit'}}],
        [{"index": 0, "function": {"arguments": 'y": "Oslo"}'}}],
    ]
    assert closing[0]["choices"][0]["finish_reason"] == "tool_calls"


def test_a_constrained_call_streams_its_deltas_as_they_form():
    w = writer(tools=[WEATHER], stream=True, tool_choice="required")
    sent, _ = _stream(w, _call_events(), FinishReason.TOOL_CALLS)
    started = dict(sent)["ToolCallStarted"]
    assert started[0]["choices"][0]["delta"]["tool_calls"][0]["function"]["name"] == "get_weather"
    assert dict(sent)["ToolCallFinished"] == []  # everything was sent already


def test_a_malformed_call_comes_back_as_text_with_a_note_never_as_a_tool_call():
    w = writer(tools=[WEATHER], stream=True)
    sent, closing = _stream(w, _call_events(arguments='{"city": Oslo}', ok=False), "tool_calls")
    all_chunks = [c for _, chunks in sent for c in chunks] + closing
    assert not any("tool_calls" in c["choices"][0]["delta"] for c in all_chunks)
    texts = [c["choices"][0]["delta"].get("content") for c in all_chunks]
    assert '{"city": Oslo}' in texts
    assert closing[0]["choices"][0]["finish_reason"] == "stop"
    assert closing[0]["choices"][0]["malformed_tool_calls"][0]["problem"] == "not JSON"
    whole = writer(tools=[WEATHER])
    for event in _call_events(arguments='{"city": Oslo}', ok=False):
        whole.chunks(event)
    body = whole.response(Finished(FinishReason.TOOL_CALLS, usage(), "Let me look. "))
    choice = body["choices"][0]
    assert choice["message"]["content"] == 'Let me look. {"city": Oslo}'
    assert "tool_calls" not in choice["message"] and choice["finish_reason"] == "stop"


def test_a_whole_response_carries_the_calls_and_null_content_when_only_calls():
    w = writer(tools=[WEATHER], tool_choice="required")
    for event in _call_events()[1:]:
        w.chunks(event)
    body = w.response(Finished(FinishReason.TOOL_CALLS, usage(), ""))
    message = body["choices"][0]["message"]
    assert message["content"] is None
    assert message["tool_calls"] == [
        {
            "id": "call_a",
            "type": "function",
            "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'},
        }
    ]
    assert body["choices"][0]["finish_reason"] == "tool_calls"
