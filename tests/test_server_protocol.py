"""The OpenAI protocol layer without a model: request bodies -> GenerationRequest (and the field a
refusal names), engine events -> response objects and chunks, engine errors -> status + shape."""

from __future__ import annotations

import json

import pytest

from engine.errors import (
    ChatTemplateError,
    ConfigValidationError,
    ConstraintError,
    ContextOverflowError,
    EngineError,
    KVAdmissionError,
    MemoryBudgetError,
    QueueFullError,
    SchedulerClosedError,
    TokenizerError,
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
        (["--max-connections", "0"], "--max-connections"),
        (["--request-timeout", "0"], "--request-timeout"),
        (["--request-timeout", "nan"], "--request-timeout"),
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


# --- every refusal, word for word --------------------------------------------------------------
# The messages are what a client shows its user; each is written out here by hand.
FUNCTION_CALL = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}


def _assistant_calls(*calls):
    return {"messages": [{"role": "assistant", "content": None, "tool_calls": list(calls)}]}


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"model": None}, "model=None is invalid: must be the name of the served model (GET /v1/models)"),
        ({"model": ""}, "model='' is invalid: must be the name of the served model (GET /v1/models)"),
        ({"messages": "hi"}, "messages='hi' is invalid: must be a non-empty array of messages"),
        ({"messages": []}, "messages=[] is invalid: must be a non-empty array of messages"),
        ({"messages": USER * 4097}, "messages=4097 is invalid: must be at most 4096 messages"),
        ({"messages": ["hi"]}, "messages[0]='hi' is invalid: must be a JSON object"),
        (
            {"messages": [{"role": "critic", "content": "x"}]},
            "messages[0].role='critic' is invalid: must be one of assistant, developer, system, "
            "tool, user",
        ),
        (
            {"messages": [{"role": "tool", "content": "x", "tool_call_id": ""}]},
            "messages[0].tool_call_id='' is invalid: must be the id of the call it answers",
        ),
        (
            {"messages": [{"role": "tool", "content": "x", "tool_call_id": 7}]},
            "messages[0].tool_call_id=7 is invalid: must be the id of the call it answers",
        ),
        (
            {"messages": [{"role": "assistant", "content": None, "tool_calls": {"id": "x"}}]},
            "messages[0].tool_calls={'id': 'x'} is invalid: must be an array of tool calls",
        ),
        (_assistant_calls("x"), "messages[0].tool_calls[0]='x' is invalid: must be a JSON object"),
        (
            _assistant_calls({**FUNCTION_CALL, "id": ""}),
            "messages[0].tool_calls[0].id='' is invalid: must be a non-empty string",
        ),
        (
            _assistant_calls({**FUNCTION_CALL, "id": 5}),
            "messages[0].tool_calls[0].id=5 is invalid: must be a non-empty string",
        ),
        (
            _assistant_calls(FUNCTION_CALL, {**FUNCTION_CALL, "type": "code"}),
            "messages[0].tool_calls[1].type='code' is invalid: must be \"function\"",
        ),
        (
            _assistant_calls({"id": "c1", "function": "f"}),
            "messages[0].tool_calls[0].function='f' is invalid: must be a JSON object",
        ),
        (
            _assistant_calls({"id": "c1", "function": {"name": 3}}),
            "messages[0].tool_calls[0].function.name=3 is invalid: must be a non-empty string",
        ),
        (
            _assistant_calls({"id": "c1", "function": {"name": ""}}),
            "messages[0].tool_calls[0].function.name='' is invalid: must be a non-empty string",
        ),
        (
            _assistant_calls({"id": "c1", "function": {"name": "f", "arguments": ["a"]}}),
            "messages[0].tool_calls[0].function.arguments=['a'] is invalid: must be a JSON text "
            "(string)",
        ),
        (
            {"messages": [{"role": "user", "content": None}]},
            "messages[0].content=None is invalid: must be a string or text parts",
        ),
        (
            {"messages": [{"role": "user", "content": {"text": "x"}}]},
            "messages[0].content={'text': 'x'} is invalid: must be a string or text parts",
        ),
        (
            {"messages": [{"role": "user", "content": ["x"]}]},
            "messages[0].content[0].type='x' is invalid: must be 'text' (this server reads text "
            "only)",
        ),
        (
            {"messages": [{"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "image_url"}]}]},
            "messages[0].content[1].type='image_url' is invalid: must be 'text' (this server "
            "reads text only)",
        ),
        (
            {"messages": [{"role": "user", "content": [{"type": "text", "text": 5}]}]},
            "messages[0].content[0].text=5 is invalid: must be a string",
        ),
        ({"top_logprobs": 3}, "top_logprobs=3 is invalid: must be used together with logprobs: true"),
        (
            {"logprobs": True, "top_logprobs": 21},
            "top_logprobs=21 is invalid: must be an integer in [0, 20]",
        ),
        (
            {"logprobs": True, "top_logprobs": -1},
            "top_logprobs=-1 is invalid: must be an integer in [0, 20]",
        ),
        (
            {"logprobs": True, "top_logprobs": 1.5},
            "top_logprobs=1.5 is invalid: must be an integer in [0, 20]",
        ),
        (
            {"logprobs": True, "top_logprobs": float("inf")},
            "top_logprobs=inf is invalid: must be an integer in [0, 20]",
        ),
        (
            {"logprobs": True, "top_logprobs": True},
            "top_logprobs=True is invalid: must be an integer in [0, 20]",
        ),
        ({"logprobs": "yes"}, "logprobs='yes' is invalid: must be true or false"),
        (
            {"functions": [{"name": "f"}]},
            "functions='[...]' is invalid: must be absent (not supported by this server)",
        ),
        (
            {"function_call": "auto"},
            "function_call='[...]' is invalid: must be absent (not supported by this server)",
        ),
        ({"n": 2}, "n=2 is invalid: must be 1 (one choice per request)"),
        ({"n": "1"}, "n='1' is invalid: must be an integer"),
        (
            {"logit_bias": {"50256": -100}},
            "logit_bias='{...}' is invalid: must be empty or absent (not supported)",
        ),
        ({"response_format": "json"}, "response_format='json' is invalid: must be a JSON object"),
        (
            {"response_format": {"type": "xml"}},
            "response_format.type='xml' is invalid: must be one of text, json_object, json_schema",
        ),
        (
            {"response_format": {}},
            "response_format.type=None is invalid: must be one of text, json_object, json_schema",
        ),
        (
            {"response_format": {"type": "json_schema", "json_schema": []}},
            "response_format.json_schema=[] is invalid: must be an object {\"name\", \"schema\"}",
        ),
        (
            {"response_format": {"type": "json_schema", "json_schema": {"name": "x"}}},
            "response_format.json_schema.schema=None is invalid: must be a JSON schema object",
        ),
        (
            {"response_format": {"type": "json_schema", "json_schema": {"schema": "x"}}},
            "response_format.json_schema.schema='x' is invalid: must be a JSON schema object",
        ),
        (
            {
                "response_format": {
                    "type": "json_schema",
                    "json_schema": {"schema": {}, "strict": "yes"},
                }
            },
            "response_format.json_schema.strict='yes' is invalid: must be a boolean",
        ),
        ({"stream": 1}, "stream=1 is invalid: must be true or false"),
        ({"stream_options": "usage"}, "stream_options='usage' is invalid: must be a JSON object"),
        (
            {"stream_options": {"include_usage": 1}},
            "stream_options.include_usage=1 is invalid: must be true or false",
        ),
    ],
)  # fmt: skip
def test_each_chat_refusal_says_what_the_field_must_be(fields, message):
    with pytest.raises(ConfigValidationError) as info:
        parse_chat({"model": "smol", "messages": USER, **fields}, NAMES)
    assert str(info.value) == message


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"prompt": 5}, "prompt=5 is invalid: must be a string, or an array of token ids (one prompt per request)"),
        ({"prompt": []}, "prompt=[] is invalid: must be a string, or an array of token ids (one prompt per request)"),
        ({"prompt": [True, 2]}, "prompt=[True, 2] is invalid: must be a string, or an array of token ids (one prompt per request)"),
        ({"prompt": [1, "a"]}, "prompt=[1, 'a'] is invalid: must be a string, or an array of token ids (one prompt per request)"),
        ({"prompt": [[]]}, "prompt=[] is invalid: must be a string, or an array of token ids (one prompt per request)"),
        ({"prompt": [1, -3]}, "prompt[1]=-3 is invalid: must be a token id >= 0"),
        ({"prompt": "x", "echo": True}, "echo=True is invalid: must be false (echoing the prompt is not supported)"),
        ({"prompt": "x", "echo": "no"}, "echo='no' is invalid: must be true or false"),
        ({"prompt": "x", "suffix": "end"}, "suffix='end' is invalid: must be null (insertion is not supported)"),
        ({"prompt": "x", "best_of": 2}, "best_of=2 is invalid: must be 1 (one completion per request)"),
        ({"prompt": "x", "best_of": 0}, "best_of=0 is invalid: must be an integer >= 1"),
        ({"prompt": "x", "logprobs": 21}, "logprobs=21 is invalid: must be an integer in [0, 20]"),
        ({"prompt": "x", "logprobs": True}, "logprobs=True is invalid: must be an integer in [0, 20]"),
        ({"prompt": "x", "response_format": {"type": "yaml"}}, "response_format.type='yaml' is invalid: must be one of text, json_object, json_schema"),
        ({"prompt": "x", "stream": "yes"}, "stream='yes' is invalid: must be true or false"),
        ({"prompt": "x", "n": 3}, "n=3 is invalid: must be 1 (one choice per request)"),
    ],
)  # fmt: skip
def test_each_completion_refusal_says_what_the_field_must_be(fields, message):
    with pytest.raises(ConfigValidationError) as info:
        parse_completion({"model": "smol", **fields}, NAMES)
    assert str(info.value) == message


def test_token_ids_must_lie_in_the_vocabulary():
    def ids(prompt, vocab_size):
        return parse_completion({"model": "smol", "prompt": prompt}, NAMES, vocab_size=vocab_size)

    assert ids([0, 99], 100).request.prompt_ids == [0, 99]
    assert ids([[7]], 100).request.prompt_ids == [7]  # an array of one prompt
    for prompt, message in [
        ([5, 100], "prompt[1]=100 is invalid: must be a token id of this model's vocabulary, in [0, 99]"),
        ([-1], "prompt[0]=-1 is invalid: must be a token id of this model's vocabulary, in [0, 99]"),
    ]:  # fmt: skip
        with pytest.raises(ConfigValidationError) as info:
            ids(prompt, 100)
        assert str(info.value) == message
    assert ids([10**6], None).request.prompt_ids == [10**6]  # no vocabulary known: no upper bound


def test_sampling_values_are_checked_by_the_engine_under_the_openai_name():
    from engine.generation_config import GenerationConfig

    def engine_allowed(field, value):  # the engine's own words for the allowed range
        with pytest.raises(ConfigValidationError) as info:
            GenerationConfig.from_values({field: value})
        return info.value.allowed

    with pytest.raises(ConfigValidationError) as info:
        chat(repeat_penalty=-1)
    # the field the client sent, the value, and the engine's own allowed range
    allowed = engine_allowed("repetition_penalty", -1)
    assert str(info.value) == f"repeat_penalty=-1 is invalid: must be {allowed}"
    with pytest.raises(ConfigValidationError) as info:
        chat(max_completion_tokens=0)
    allowed = engine_allowed("max_new_tokens", 0)
    assert str(info.value) == f"max_completion_tokens=0 is invalid: must be {allowed}"


def test_long_values_are_cut_in_messages():
    with pytest.raises(ConfigValidationError) as info:
        chat(messages="x" * 100)
    assert info.value.value == "'" + "x" * 76 + "..."
    with pytest.raises(ConfigValidationError) as info:
        chat(messages="x" * 78)  # its repr is 80 characters: shown whole
    assert info.value.value == "x" * 78
    with pytest.raises(ConfigValidationError) as info:
        chat(messages="x" * 79)  # 81: cut
    assert info.value.value == "'" + "x" * 76 + "..."


def test_the_largest_accepted_values():
    assert len(chat(messages=USER * 4096).request.messages) == 4096
    assert chat(logprobs=True, top_logprobs=20).top_logprobs == 20
    assert (
        parse_completion({"model": "smol", "prompt": "x", "logprobs": 20}, NAMES).top_logprobs == 20
    )


def test_lone_surrogates_are_refused_where_they_are():
    problem = "must be text without lone UTF-16 surrogates (a \\ud800-\\udfff escape must be half of a pair)"
    for body, field in [
        ({"messages": [{"role": "user", "content": "a\ud800"}]}, "messages[0].content"),
        ({"messages": [USER[0], {"role": "user", "content": [{"type": "text", "text": "\udc00"}]}]},
         "messages[1].content[0].text"),
        ({"stop": ["ok", "\udfff"]}, "stop[1]"),
        ({"metadata": {"k\ud800": 1}}, "metadata"),
        ({"\ud800": 1}, "body"),
    ]:  # fmt: skip
        with pytest.raises(ConfigValidationError) as info:
            parse_chat({"model": "smol", "messages": USER, **body}, NAMES)
        assert info.value.field == field
        assert str(info.value).endswith(problem)
        str(info.value).encode("utf-8")  # the message itself can be sent
    # the value shown is the first 40 characters, escaped
    long_text = "\ud800" + "a" * 100
    for body in ({"stop": long_text}, {"metadata": {long_text: 1}}):
        with pytest.raises(ConfigValidationError) as info:
            parse_chat({"model": "smol", "messages": USER, **body}, NAMES)
        assert info.value.value == "'\\ud800" + "a" * 39 + "'"
    with pytest.raises(ConfigValidationError) as info:
        parse_completion({"model": "smol", "prompt": "\ud800x"}, NAMES)
    assert info.value.field == "prompt" and info.value.value == "'\\ud800x'"
    # a surrogate pair is one character, not a lone surrogate
    assert (
        chat(messages=[{"role": "user", "content": "\U0001f600"}]).request.messages[0]["content"]
        == "\U0001f600"
    )
    deep: list = []
    for _ in range(5000):  # nesting far past Python's recursion limit: no RecursionError
        deep = [deep]
    chat(metadata=deep)


def test_an_unknown_model_is_named_with_the_served_names_only():
    names = {"smol", "Qwen-X", "/home/me/models/smol.gguf", "C:\\models\\smol.gguf"}
    with pytest.raises(ApiError) as info:
        parse_chat({"model": "gpt-4o", "messages": USER}, names)
    assert info.value.message == (
        "The model 'gpt-4o' does not exist on this server; it serves 'Qwen-X', 'smol' "
        "(GET /v1/models)"
    )
    assert (info.value.status, info.value.param, info.value.code) == (
        404,
        "model",
        "model_not_found",
    )
    with pytest.raises(ApiError) as info:
        parse_completion({"model": "m" * 300, "prompt": "x"}, names)
    assert "'" + "m" * 100 + "'" in info.value.message and "m" * 101 not in info.value.message
    # every name the server answers to still works, the path too
    assert parse_chat({"model": "/home/me/models/smol.gguf", "messages": USER}, names).model == (
        "/home/me/models/smol.gguf"
    )


def test_what_a_chat_request_may_leave_out_or_send_empty():
    parsed = chat(functions=[], function_call=None, logit_bias={}, n=1.0, suffix="ignored in chat")
    assert parsed.request.overrides == {}
    assert not parsed.stream and not parsed.include_usage and not parsed.logprobs
    assert parsed.top_logprobs == 0 and parsed.request.top_logprobs == 0
    assert parsed.request.json_mode == JsonMode.OFF and parsed.request.json_schema is None
    assert parsed.request.tools is None and parsed.request.tool_choice == "auto"
    assert parsed.model == "smol" and parsed.kind == CHAT
    parsed = chat(
        logprobs=True, top_logprobs=2.0, stream=False, stream_options={"include_usage": False}
    )
    assert parsed.logprobs and parsed.top_logprobs == 2 and parsed.include_usage is False
    assert chat(stream=True).include_usage is False
    assert chat(stream=True, stream_options={}).include_usage is False
    assert chat(logprobs=False).logprobs is False


def test_every_sampling_field_reaches_the_engine_under_its_own_name():
    parsed = chat(repeat_penalty=1.2, repeat_last_n=32, stop=["a", "b"], temperature=1.5)
    assert parsed.request.overrides == {
        "repetition_penalty": 1.2,
        "repeat_last_n": 32,
        "stop": ["a", "b"],
        "temperature": 1.5,
        "do_sample": True,
    }
    assert chat(max_tokens=9).request.overrides == {"max_new_tokens": 9}


def test_tool_choice_and_the_history_shapes_clients_send():
    parsed = chat(tools=[WEATHER], tool_choice="none")
    assert parsed.request.tool_choice == "none" and not parsed.tools_constrained
    assert chat(tools=[], tool_choice="required").tools_constrained is False
    assert chat(tools=[WEATHER], tool_choice="required").tools_constrained is True
    history = [
        {
            "role": "assistant",
            "content": "Checking.",
            "tool_calls": [
                {"id": "a", "function": {"name": "f", "arguments": {"x": 1}}},  # an object
                {"id": "b", "function": {"name": "g"}},  # no arguments, no type
            ],
        },
        {"role": "tool", "tool_call_id": "a", "content": "1", "name": "f"},
        {"role": "tool", "tool_call_id": "b", "content": "2", "name": 7},
        {"role": "assistant", "content": "done", "tool_calls": None},
        {"role": "system", "content": "s"},
    ]
    messages = chat(messages=history).request.messages
    assert messages[0]["tool_calls"] == [
        {"id": "a", "type": "function", "function": {"name": "f", "arguments": '{"x": 1}'}},
        {"id": "b", "type": "function", "function": {"name": "g", "arguments": "{}"}},
    ]
    assert messages[0]["content"] == "Checking."
    assert messages[1] == {"role": "tool", "content": "1", "tool_call_id": "a", "name": "f"}
    assert messages[2] == {"role": "tool", "content": "2", "tool_call_id": "b"}
    assert messages[3] == {"role": "assistant", "content": "done"}
    assert messages[4] == {"role": "system", "content": "s"}


def test_what_a_completion_request_may_send():
    parsed = parse_completion(
        {
            "model": "smol",
            "prompt": ["Once"],
            "echo": False,
            "suffix": "",
            "best_of": 1,
            "logprobs": 0,
            "max_tokens": 5,
            "response_format": {"type": "json_object"},
            "stream": True,
            "stream_options": {"include_usage": True},
        },
        NAMES,
    )
    assert parsed.kind == COMPLETION and parsed.request.prompt == "Once"
    assert parsed.logprobs is True and parsed.top_logprobs == 0  # logprobs 0: the token's own
    assert parsed.request.top_logprobs == 0 and parsed.model == "smol"
    assert parsed.request.overrides == {"max_new_tokens": 5}
    assert parsed.request.json_mode == JsonMode.OBJECT
    assert parsed.stream and parsed.include_usage and not parsed.tools_constrained
    plain = parse_completion({"model": "smol", "prompt": [1, 2]}, NAMES)
    assert plain.request.prompt_ids == [1, 2] and plain.request.top_logprobs == 0
    assert plain.include_usage is False and plain.stream is False and plain.logprobs is False
    three = parse_completion({"model": "smol", "prompt": "x", "logprobs": 3}, NAMES)
    assert three.request.top_logprobs == 3 and three.top_logprobs == 3
    with pytest.raises(ConfigValidationError) as info:
        parse_completion("prompt", NAMES)
    assert str(info.value) == "body='prompt' is invalid: must be a JSON object"
    strict_false = {
        "type": "json_schema",
        "json_schema": {"schema": {"type": "object"}, "strict": False},
    }
    assert chat(response_format=strict_false).request.json_mode == JsonMode.SCHEMA


def test_the_serve_flags_defaults_are_the_servers():
    from engine.__main__ import build_parser
    from engine.server.app import DEFAULT_MAX_CONNECTIONS, DEFAULT_REQUEST_TIMEOUT_S

    args = build_parser().parse_args(["serve", "m.gguf"])
    assert args.request_timeout == DEFAULT_REQUEST_TIMEOUT_S
    assert args.max_connections == DEFAULT_MAX_CONNECTIONS
    assert args.allowed_host == [] and args.allowed_origin == [] and args.cors is None
    args = build_parser().parse_args(
        ["serve", "m.gguf", "--allowed-host", "a", "--allowed-host", "b", "--allowed-origin", "o"]
    )
    assert args.allowed_host == ["a", "b"] and args.allowed_origin == ["o"]


@pytest.mark.parametrize(
    ("error", "prompt_param", "expected"),
    [
        (QueueFullError(100, 10, 8, 4), "messages", (429, None, "queue_full", "rate_limit_exceeded")),
        (KVAdmissionError(100, 10, 50, never_fits=True), "messages", (400, "max_tokens", "kv_budget_exceeded", "invalid_request_error")),
        (KVAdmissionError(100, 10, 500, never_fits=False), "messages", (429, None, "kv_budget_busy", "rate_limit_exceeded")),
        (SchedulerClosedError("closed"), "prompt", (503, None, "shutting_down", "server_error")),
        (ContextOverflowError("too long"), "messages", (400, "messages", "context_length_exceeded", "invalid_request_error")),
        (MemoryBudgetError("5 bytes"), "prompt", (400, "max_tokens", "kv_budget_exceeded", "invalid_request_error")),
        (ChatTemplateError("raise_exception"), "messages", (400, "messages", "chat_template_error", "invalid_request_error")),
        (ConstraintError("bad schema"), "messages", (400, "response_format", "invalid_schema", "invalid_request_error")),
        (TokenizerError("no vocab"), "prompt", (400, "prompt", "invalid_value", "invalid_request_error")),
        (EngineError("other"), "messages", (500, None, None, "server_error")),
        (RuntimeError("bug"), "messages", (500, None, None, "server_error")),
        (ConfigValidationError("prompt", "", "a prompt"), "messages", (400, "messages", "invalid_value", "invalid_request_error")),
        (ConfigValidationError("do_sample", 1, "a bool"), "messages", (400, "temperature", "invalid_value", "invalid_request_error")),
        (ConfigValidationError("tools[0].function.name", "a b", "a name"), "messages", (400, "tools[0].function.name", "invalid_value", "invalid_request_error")),
    ],
)  # fmt: skip
def test_every_engine_error_maps_to_its_status_param_code_and_type(error, prompt_param, expected):
    answer = from_engine_error(error, prompt_param)
    assert (answer.status, answer.param, answer.code, answer.type) == expected
    assert answer.body() == {
        "error": {
            "message": str(error),
            "type": expected[3],
            "param": expected[1],
            "code": expected[2],
        }
    }


def test_engine_field_names_in_messages_become_the_fields_clients_send():
    overflow = ContextOverflowError(
        "prompt (10) + max_new_tokens (100) = 110 positions exceeds the context window of 64"
    )
    answer = from_engine_error(overflow, "messages")
    assert answer.message == (
        "prompt (10) + max_tokens (100) = 110 positions exceeds the context window of 64"
    )
    invalid = from_engine_error(
        ConfigValidationError("max_new_tokens", 0, "an integer >= 1"), "prompt"
    )
    assert invalid.message == "max_tokens=0 is invalid: must be an integer >= 1"
    assert invalid.param == "max_tokens"
    # only the whole word: another field that merely contains it is left alone
    other = from_engine_error(EngineError("my_max_new_tokens_x is odd"), "prompt")
    assert other.message == "my_max_new_tokens_x is odd"
