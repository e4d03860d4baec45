"""Remote models get the tool flow: the app's OpenAI client turns a server's `tool_calls` deltas
into the engine's ToolCallStarted / ToolCallArgumentsDelta / ToolCallFinished events and
Finished.tool_calls, checked like the local engine's own calls.

Against real servers on loopback: our own (`localchat_server`, tool_choice "required" and a
named function, so every call is constrained) and llama-cpp-python (a named function: it then
decodes the arguments under a grammar of that tool's schema). Golden data: the local engine's
own greedy run of the same request (for our server), and jsonschema. Malformed calls, which a
real server does not make on demand, come from a scripted stream (httpx.MockTransport)."""

from __future__ import annotations

import json

import httpx
import jsonschema
import pytest

from app.backends.openai_client import Connection, OpenAIClient
from app.backends.remote import ConnectionBook, RemoteEngine, remote_model_path
from app.engine_bridge import StreamNotice
from engine.cancel import CancelToken
from engine.events import (
    Finished,
    TextDelta,
    ToolCallArgumentsDelta,
    ToolCallFinished,
    ToolCallMalformed,
    ToolCallStarted,
)
from engine.generate import generate
from engine.types import FinishReason, GenerationRequest

WEATHER_PARAMS = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "maxLength": 40},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
    },
    "required": ["city", "unit"],
    "additionalProperties": False,
}
TOOLS = (
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Current weather in a city",
            "parameters": WEATHER_PARAMS,
        },
    },
)
ASK = ({"role": "user", "content": "What is the weather in Paris right now?"},)
NAMED = {"type": "function", "function": {"name": "get_weather"}}


class _NoKeys:
    def get(self, _connection_id):
        return None


def _quiet(*_args) -> None:
    pass


def remote_run(server, request: GenerationRequest) -> list:
    engine = RemoteEngine(ConnectionBook([Connection("c1", "t", server.base_url)], _NoKeys()))
    handle = engine.load(
        remote_model_path("c1", server.model), n_ctx=0, n_threads=0, progress=_quiet
    )
    try:
        return list(engine.generate(handle, request, CancelToken()))
    finally:
        engine.unload(handle)


def tool_request(choice, messages=ASK, max_new_tokens=80) -> GenerationRequest:
    return GenerationRequest(
        messages=messages,
        overrides={"do_sample": False, "max_new_tokens": max_new_tokens},
        tools=TOOLS,
        tool_choice=choice,
    )


def assert_one_checked_call(events) -> ToolCallFinished:
    finished = events[-1]
    assert isinstance(finished, Finished) and finished.error is None
    started = [e for e in events if isinstance(e, ToolCallStarted)]
    done = [e for e in events if isinstance(e, ToolCallFinished)]
    assert len(started) == len(done) == 1 and started[0].id == done[0].id
    assert started[0].name == done[0].name == "get_weather"
    deltas = "".join(e.text for e in events if isinstance(e, ToolCallArgumentsDelta))
    assert json.loads(deltas) == done[0].arguments  # the fragments are the arguments' JSON
    assert events.index(started[0]) < events.index(done[0])
    jsonschema.validate(done[0].arguments, WEATHER_PARAMS)
    assert finished.tool_calls == (done[0].call,)
    assert finished.finish_reason == FinishReason.TOOL_CALLS
    return done[0]


@pytest.mark.parametrize("choice", ["required", NAMED])
def test_our_servers_calls_arrive_as_the_engines_events(localchat_server, smollm2, choice):
    events = remote_run(localchat_server, tool_request(choice))
    call = assert_one_checked_call(events)
    # the same request run by the local engine makes the same call
    local = list(generate(smollm2, tool_request(choice), CancelToken()))[-1]
    assert [(c.name, c.arguments) for c in local.tool_calls] == [(call.name, call.arguments)]


def test_a_tool_result_goes_back_to_our_server_and_it_answers(localchat_server):
    call = assert_one_checked_call(remote_run(localchat_server, tool_request("required")))
    history = (
        *ASK,
        {"role": "assistant", "content": "", "tool_calls": [call.call.to_openai()]},
        {"role": "tool", "tool_call_id": call.id, "content": "Sunny, 21 degrees celsius"},
    )
    events = remote_run(localchat_server, tool_request("none", history, max_new_tokens=16))
    finished = events[-1]
    assert finished.error is None, finished.error
    assert finished.text.strip() and finished.tool_calls == ()
    assert finished.finish_reason in (FinishReason.STOP, FinishReason.LENGTH)
    assert any(isinstance(e, TextDelta) for e in events)


def test_llama_cpp_pythons_named_function_call_arrives_as_the_engines_events(openai_server):
    events = remote_run(openai_server, tool_request(NAMED))
    assert_one_checked_call(events)


# --- calls the app must never execute (a scripted stream) -----------------------------------------
def _sse(*chunks) -> bytes:
    lines = [b"data: " + json.dumps(c).encode() + b"\n\n" for c in chunks]
    return b"".join(lines) + b"data: [DONE]\n\n"


def _tool_delta(index, **part):
    return {"choices": [{"index": 0, "delta": {"tool_calls": [{"index": index, **part}]}}]}


def _scripted(body: bytes):
    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, content=body, headers={"content-type": "text/event-stream"})

    connection = Connection("c1", "scripted", "http://127.0.0.1:9/v1")
    return OpenAIClient(connection, transport=httpx.MockTransport(handler))


def test_calls_that_do_not_validate_are_malformed_and_not_executable():
    body = _sse(
        _tool_delta(0, id="a", type="function", function={"name": "get_weather", "arguments": ""}),
        _tool_delta(0, function={"arguments": '{"city": "Paris", '}),
        _tool_delta(0, function={"arguments": '"unit": "kelvin"}'}),
        _tool_delta(1, id="b", type="function", function={"name": "rm_rf", "arguments": "{}"}),
        _tool_delta(2, id="c", function={"name": "get_weather", "arguments": "{not json"}),
        {"choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]},
    )
    with _scripted(body) as client:
        params = {"tools": list(TOOLS)}
        events = list(client.chat("m", list(ASK), params, CancelToken()))
    malformed = {e.id: e for e in events if isinstance(e, ToolCallMalformed)}
    assert set(malformed) == {"a", "b", "c"}
    assert "unit" in malformed["a"].problem and "schema" in malformed["a"].problem
    assert malformed["a"].text == '{"city": "Paris", "unit": "kelvin"}'
    assert "no tool is named 'rm_rf'" in malformed["b"].problem
    assert "not JSON" in malformed["c"].problem
    assert not any(isinstance(e, ToolCallFinished) for e in events)
    finished = events[-1]
    assert finished.tool_calls == () and finished.finish_reason == FinishReason.STOP


def test_a_call_cut_off_by_the_stream_is_never_executable():
    body = _sse(
        _tool_delta(0, id="a", type="function", function={"name": "get_weather"}),
        _tool_delta(0, function={"arguments": '{"city": "Paris", "unit": "celsius"}'}),
    ).removesuffix(b"data: [DONE]\n\n")
    with _scripted(body) as client:
        events = list(client.chat("m", list(ASK), {"tools": list(TOOLS)}, CancelToken()))
    (malformed,) = [e for e in events if isinstance(e, ToolCallMalformed)]
    assert "ended before the call was complete" in malformed.problem
    assert events[-1].finish_reason == FinishReason.ERROR and events[-1].tool_calls == ()


def test_a_server_that_ignores_a_required_call_answers_in_text_and_is_named(openai_server):
    """llama-cpp-python with this model's chat format ignores tool_choice "required"."""
    events = remote_run(openai_server, tool_request("required", max_new_tokens=12))
    finished = events[-1]
    assert finished.error is None and finished.text and finished.tool_calls == ()
    assert finished.finish_reason != FinishReason.TOOL_CALLS
    assert not any(isinstance(e, (ToolCallStarted, ToolCallMalformed)) for e in events)
    notices = [e.message for e in events if isinstance(e, StreamNotice)]
    assert any("does not support tools" in n for n in notices), notices
