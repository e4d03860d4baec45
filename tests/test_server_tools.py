"""Tool calls over `POST /v1/chat/completions`, driven by the official openai client against
`python -m engine serve` (the session's `localchat_server`: SmolLM2, whose template has no tool
support, so tools are described in a system message and calls are the generic JSON format).

With tool_choice "required" or a named function the call is decoded under the call grammar, so
it is always an offered tool with arguments that validate; the checks here are OpenAI's shapes
(message.tool_calls, finish_reason "tool_calls", streamed deltas with index/id/type/name first
and argument fragments after) and that they agree with each other and with jsonschema."""

from __future__ import annotations

import json

import jsonschema
import openai
import pytest

WEATHER_PARAMS = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "maxLength": 40},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
    },
    "required": ["city", "unit"],
    "additionalProperties": False,
}
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Current weather in a city",
            "parameters": WEATHER_PARAMS,
        },
    },
    {
        "type": "function",
        "function": {
            "name": "get_time",
            "description": "Current time in a time zone",
            "parameters": {
                "type": "object",
                "properties": {"zone": {"type": "string", "maxLength": 40}},
                "required": ["zone"],
                "additionalProperties": False,
            },
        },
    },
]
ASK = [{"role": "user", "content": "What is the weather in Paris right now?"}]
NAMED = {"type": "function", "function": {"name": "get_weather"}}


@pytest.fixture(scope="module")
def client(localchat_server):
    with openai.OpenAI(
        base_url=localchat_server.url, api_key="none", max_retries=0, timeout=180
    ) as c:
        yield c


def ask(client, server, **fields):
    fields = {"temperature": 0, "max_tokens": 80, "tools": TOOLS, **fields}
    return client.chat.completions.create(model=server.model, messages=ASK, **fields)


def test_required_gives_an_offered_call_whose_arguments_validate(client, localchat_server):
    reply = ask(client, localchat_server, tool_choice="required")
    choice = reply.choices[0]
    assert choice.finish_reason == "tool_calls"
    (call,) = choice.message.tool_calls
    assert call.type == "function" and call.id.startswith("call_")
    schema = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}
    assert call.function.name in schema
    jsonschema.validate(json.loads(call.function.arguments), schema[call.function.name])
    assert reply.usage.completion_tokens > 0


def test_streamed_deltas_accumulate_to_the_non_streamed_call(client, localchat_server):
    whole = ask(client, localchat_server, tool_choice=NAMED).choices[0]
    (expected,) = whole.message.tool_calls
    assert expected.function.name == "get_weather"
    jsonschema.validate(json.loads(expected.function.arguments), WEATHER_PARAMS)

    stream = ask(client, localchat_server, tool_choice=NAMED, stream=True)
    calls: dict[int, dict] = {}
    finish = None
    n_argument_deltas = 0
    for chunk in stream:
        if not chunk.choices:
            continue
        delta, finish = chunk.choices[0].delta, chunk.choices[0].finish_reason or finish
        for part in delta.tool_calls or ():
            if part.index not in calls:
                # OpenAI's first delta of a call: its id, type and name
                assert part.id and part.type == "function" and part.function.name
                calls[part.index] = {"id": part.id, "name": part.function.name, "arguments": ""}
            else:
                assert part.id is None and part.function.name is None
                n_argument_deltas += 1
            calls[part.index]["arguments"] += part.function.arguments or ""
    assert finish == "tool_calls"
    assert list(calls) == [0]
    assert calls[0]["name"] == expected.function.name
    assert json.loads(calls[0]["arguments"]) == json.loads(expected.function.arguments)
    assert calls[0]["arguments"] == expected.function.arguments  # the same greedy call
    assert n_argument_deltas > 1  # streamed in fragments as it formed, not in one piece


def test_a_tool_result_round_trip(client, localchat_server):
    server = localchat_server
    first = ask(client, server, tool_choice=NAMED).choices[0].message
    (call,) = first.tool_calls
    history = [
        *ASK,
        {
            "role": "assistant",
            "content": first.content,
            "tool_calls": [
                {
                    "id": call.id,
                    "type": "function",
                    "function": {"name": call.function.name, "arguments": call.function.arguments},
                }
            ],
        },
        {"role": "tool", "tool_call_id": call.id, "content": "Sunny, 21 degrees celsius"},
    ]
    answer = client.chat.completions.create(
        model=server.model, messages=history, tools=TOOLS, temperature=0, max_tokens=24
    )
    choice = answer.choices[0]
    assert choice.finish_reason in ("stop", "length")
    assert choice.message.content and not choice.message.tool_calls
    # the result was in the prompt: without the tool message the prompt is shorter by at least
    # the result's words
    without = client.chat.completions.create(
        model=server.model, messages=history[:2], tools=TOOLS, temperature=0, max_tokens=1
    )
    assert answer.usage.prompt_tokens >= without.usage.prompt_tokens + 5


def test_bad_tools_get_a_400_naming_the_field(client, localchat_server):
    bad_name = [{"type": "function", "function": {"name": "get weather!", "parameters": {}}}]
    cases = [
        ({"tools": bad_name}, "tools[0].function.name"),
        (
            {"tool_choice": {"type": "function", "function": {"name": "nope"}}},
            "tool_choice.function.name",
        ),
        ({"tool_choice": "sometimes"}, "tool_choice"),
        ({"tools": None, "tool_choice": "required"}, "tool_choice"),
    ]
    for fields, param in cases:
        with pytest.raises(openai.BadRequestError) as caught:
            ask(client, localchat_server, **fields)
        assert caught.value.body["param"] == param, caught.value.body
    with pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(
            model=localchat_server.model,
            messages=[*ASK, {"role": "tool", "content": "x"}],
            max_tokens=1,
        )
    assert caught.value.body["param"] == "messages[1].tool_call_id"
