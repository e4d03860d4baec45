"""Shared pieces of the tool-call tests: the templates in tests/fixtures/templates, the tools
offered, and a driver that feeds a reply to a ToolCallStream in chosen pieces."""

from __future__ import annotations

import random
from pathlib import Path

from engine.chat_template import ChatTemplate
from engine.events import (
    TextDelta,
    ToolCallArgumentsDelta,
    ToolCallFinished,
    ToolCallMalformed,
    ToolCallStarted,
)
from engine.tool_calls.formats import prepare_messages
from engine.tool_calls.spec import parse_tools
from engine.tool_calls.stream import ToolCallStream

TEMPLATES = Path(__file__).parent / "fixtures" / "templates"

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Current weather in a city",
            "parameters": {
                "type": "object",
                "properties": {
                    "city": {"type": "string"},
                    "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
                },
                "required": ["city"],
                "additionalProperties": False,
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "get_current_datetime",
            "description": "The current date and time",
            "parameters": {"type": "object", "properties": {}},
        },
    },
]
SPECS = parse_tools(TOOLS)


def template(name: str, bos: str = "", eos: str = "") -> ChatTemplate:
    source = (TEMPLATES / name).read_text()
    return ChatTemplate(source, name=name, bos_token=bos, eos_token=eos)


def assistant_turn(tmpl: ChatTemplate, before: list[dict], reply: dict) -> str:
    """What the template says the model writes for `reply` after `before`: the history render
    with the reply, minus the render that ends on the generation prompt."""
    messages, extra = prepare_messages(before, SPECS, tmpl.source)
    prompt = tmpl.render(messages, add_generation_prompt=True, **extra)
    messages, extra = prepare_messages([*before, reply], SPECS, tmpl.source)
    full = tmpl.render(messages, add_generation_prompt=False, **extra)
    assert full.startswith(prompt), (prompt[-80:], full[len(prompt) - 80 :])
    return full[len(prompt) :]


def call(name: str, arguments: dict, call_id: str = "abcDEF123") -> dict:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


def run(fmt, text: str, pieces: list[int] | None = None) -> list[object]:
    """All events for `text` fed in pieces of the given sizes (cycled), then flushed."""
    stream = ToolCallStream(fmt, SPECS)
    events: list[object] = []
    sizes = pieces or [len(text) or 1]
    at, i = 0, 0
    while at < len(text):
        size = sizes[i % len(sizes)]
        events += stream.push(text[at : at + size])
        at += size
        i += 1
    events += stream.flush()
    return events


def random_pieces(seed: int, n: int = 64) -> list[int]:
    rng = random.Random(seed)
    return [rng.randint(1, 6) for _ in range(n)]


def summary(events: list[object]) -> dict:
    """What must not depend on how the text was cut: the text, the calls, the argument text per
    call, the malformed calls, and the order of kinds."""
    text = "".join(e.text for e in events if isinstance(e, TextDelta))
    args: dict[str, str] = {}
    for e in events:
        if isinstance(e, ToolCallArgumentsDelta):
            args[e.id] = args.get(e.id, "") + e.text
    started = [e for e in events if isinstance(e, ToolCallStarted)]
    finished = [e for e in events if isinstance(e, ToolCallFinished)]
    malformed = [e for e in events if isinstance(e, ToolCallMalformed)]
    order = [s.id for s in started]
    return {
        "text": text,
        "started": [s.name for s in started],
        "finished": [(f.name, f.arguments) for f in finished],
        "arguments": [args.get(i, "") for i in order],
        "malformed": [(m.name, m.problem.split(" ")[0:3]) for m in malformed],
        "ids_ok": all(f.id in order for f in finished),
    }
