"""Tool calls end to end on Qwen2.5-Coder-1.5B-Instruct (Hermes tool template, tool_choice
"auto"): once through the generation loop, once over the OpenAI API with the official client.

Both use the session's one loaded copy of the 1.1 GB model (conftest's `qwen_coder`); the
server is LocalChat's own (engine/server, the same app `python -m engine serve` runs) on a
background thread over that model, as the desktop app's Serve toggle runs it. A separate
`python -m engine serve` process would load and warm the model a second time (~10 s of CPU);
the CLI's serve path is covered with SmolLM2 in test_server_*.py.

Needs `python -m tools.fetch_qwen_coder` first (else skipped)."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import openai
import pytest

from engine.batching import BatchScheduler
from engine.generate import generate
from engine.prefix_cache import PrefixCache
from engine.server.background import BackgroundServer
from engine.types import FinishReason, GenerationRequest

ASK = [{"role": "user", "content": "What is the weather in Paris right now?"}]


def events_of(lm, **request):
    overrides = request.pop("overrides", {})
    return list(
        generate(lm, GenerationRequest(**request, overrides={"max_new_tokens": 96, **overrides}))
    )


FIXED = datetime(2031, 7, 19, 9, 41, 0, tzinfo=UTC)  # a date no model can guess


def test_qwen_coder_calls_the_date_tool_then_answers_with_its_result(qwen_coder, monkeypatch):
    from app.tools import builtin

    monkeypatch.setattr(builtin, "_clock", lambda tz=None: FIXED.astimezone(tz))
    tools = builtin.builtin_schemas()
    messages: list[dict] = [{"role": "user", "content": "What is today's date? Use a tool."}]
    greedy = {"do_sample": False, "max_new_tokens": 80}
    done = events_of(qwen_coder, messages=messages, tools=tools, overrides=greedy)[-1]
    assert done.finish_reason == FinishReason.TOOL_CALLS, done.text
    assert [c.name for c in done.tool_calls] == ["get_current_datetime"]
    (call,) = done.tool_calls
    result = builtin.run_builtin(call.name, call.arguments)
    assert not result.is_error, result.text
    messages += [
        {"role": "assistant", "content": done.text or None, "tool_calls": [call.to_openai()]},
        result.message(call.id),
    ]
    # Offered the tools again, this 1.5B model calls the date tool once more (measured: greedy,
    # every time), so the app ends a round of calls with a tools-off turn ("none": the history
    # keeps the call and its result, rendered by the template); the answer must use the result.
    # The date comes first in the answer ("The current date is Saturday, 19 July 2031, ..."):
    # 32 tokens hold it, where the whole sentence with the time and ISO form took 71.
    done = events_of(
        qwen_coder,
        messages=messages,
        tools=tools,
        tool_choice="none",
        overrides={**greedy, "max_new_tokens": 32},
    )[-1]
    assert done.tool_calls == ()
    answer = done.text
    assert "2031" in answer and "19" in answer and ("July" in answer or "-07-" in answer), answer


# --- a model with its own tool template (Hermes), tool_choice "auto" ------------------------------
@pytest.fixture(scope="module")
def qwen_server(qwen_coder):
    scheduler = BatchScheduler(qwen_coder, prefix_cache=PrefixCache())
    server = BackgroundServer(qwen_coder, scheduler, port=0, model_id="qwen-coder")
    try:
        assert server.wait_ready(timeout=120)
        with openai.OpenAI(base_url=server.url, api_key="x", max_retries=0, timeout=600) as c:
            yield server, c
    finally:
        server.stop()
        scheduler.close()


CITY_WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather in a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
        },
    },
}


def test_qwen_calls_the_tool_on_its_own_and_answers_with_the_result(qwen_server):
    server, client = qwen_server
    fields = {"model": "qwen-coder", "tools": [CITY_WEATHER], "temperature": 0, "max_tokens": 60}
    whole = client.chat.completions.create(messages=ASK, **fields).choices[0]
    assert whole.finish_reason == "tool_calls"
    (call,) = whole.message.tool_calls
    assert call.function.name == "get_weather"
    assert json.loads(call.function.arguments)["city"] == "Paris"

    streamed = {"arguments": ""}
    finish = None
    for chunk in client.chat.completions.create(messages=ASK, stream=True, **fields):
        for part in (chunk.choices[0].delta.tool_calls or ()) if chunk.choices else ():
            assert part.index == 0
            streamed.setdefault("name", part.function.name)
            streamed["arguments"] += part.function.arguments or ""
        if chunk.choices and chunk.choices[0].finish_reason:
            finish = chunk.choices[0].finish_reason
    assert finish == "tool_calls" and streamed["name"] == "get_weather"
    # the model's own text either way (an auto call is sent once the engine has checked it)
    assert streamed["arguments"] == call.function.arguments

    history = [
        *ASK,
        {"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},
        {"role": "tool", "tool_call_id": call.id, "content": "Sunny and 21 degrees Celsius."},
    ]
    # "auto" here: this 1.5B model calls the tool once more (in its template's {{...}} example
    # form, which is not JSON: malformed, so it comes back as text); "none" lets it answer
    answer = client.chat.completions.create(messages=history, tool_choice="none", **fields)
    choice = answer.choices[0]
    assert choice.finish_reason == "stop" and not choice.message.tool_calls
    assert "21" in choice.message.content
    again = client.chat.completions.create(messages=history, **fields).choices[0]
    if not again.message.tool_calls:  # a malformed call is text with a note, never a call
        assert again.finish_reason == "stop" and again.message.content
