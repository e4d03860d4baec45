"""Which tool-call format a model writes, read from its chat template, and the prompt side:
tools handed to the template as `tools=` (as transformers passes them), or, for a template that
never reads `tools`, described in a system message in the generic JSON format.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Mapping, Sequence
from typing import Any

from engine.tool_calls.fallback import WithFallback
from engine.tool_calls.hermes import HermesParser
from engine.tool_calls.items import FormatParser
from engine.tool_calls.json_lines import JsonLinesParser
from engine.tool_calls.mistral import MARKER as MISTRAL_MARKER
from engine.tool_calls.mistral import MistralParser
from engine.types import Role, ToolCallFormat, ToolSpec


def detect_format(template_source: str) -> ToolCallFormat:
    """The format the template teaches its model (its own tool-call markup decides)."""
    if "<tool_call>" in template_source:
        return ToolCallFormat.HERMES
    if MISTRAL_MARKER in template_source:
        return ToolCallFormat.MISTRAL
    if "<|start_header_id|>" in template_source and "tools" in template_source:
        return ToolCallFormat.LLAMA3_JSON
    return ToolCallFormat.GENERIC_JSON


def template_reads_tools(template_source: str) -> bool:
    return "tools" in template_source


def new_parser(fmt: ToolCallFormat) -> FormatParser:
    if fmt == ToolCallFormat.HERMES:
        return WithFallback(HermesParser(), JsonLinesParser())
    if fmt == ToolCallFormat.MISTRAL:
        return MistralParser()
    return JsonLinesParser()


def arguments_key(fmt: ToolCallFormat) -> str:
    return "parameters" if fmt == ToolCallFormat.LLAMA3_JSON else "arguments"


GENERIC_INSTRUCTIONS = (
    "You can call functions. To call one, reply with only a JSON object on its own line: "
    '{{"name": <function name>, "arguments": <object of argument values>}}. '
    "When a function result is given, answer the user with it.\n\nFunctions:\n{tools}"
)


def prepare_messages(
    messages: Sequence[Mapping[str, Any]], tools: Sequence[ToolSpec], template_source: str
) -> tuple[list[dict], dict]:
    """-> (messages to render, extra render variables). History tool calls get their arguments as
    objects (templates write them with `tojson`; OpenAI clients send them as JSON text)."""
    prepared = [_normalise(m) for m in messages]
    if not tools:
        return prepared, {}
    if template_reads_tools(template_source):
        return prepared, {"tools": [t.to_openai() for t in tools]}
    described = GENERIC_INSTRUCTIONS.format(
        tools="\n".join(json.dumps(t.to_openai()["function"]) for t in tools)
    )
    if prepared and prepared[0].get("role") == Role.SYSTEM:
        first = prepared[0]
        prepared[0] = {**first, "content": f"{first.get('content') or ''}\n\n{described}".strip()}
    else:
        prepared.insert(0, {"role": Role.SYSTEM.value, "content": described})
    return [_plain_history(m) for m in prepared], {}


def _normalise(message: Mapping[str, Any]) -> dict:
    result = dict(message)
    calls = result.get("tool_calls")
    if isinstance(calls, Sequence) and not isinstance(calls, (str, bytes)):
        fixed = []
        for call in calls:
            if isinstance(call, Mapping) and isinstance(call.get("function"), Mapping):
                function = dict(call["function"])
                if isinstance(function.get("arguments"), str):
                    # kept as written when it is not JSON; the template shows it as text
                    with contextlib.suppress(ValueError):
                        function["arguments"] = json.loads(function["arguments"] or "{}")
                call = {**call, "function": function}
            fixed.append(call)
        result["tool_calls"] = fixed
    return result


def _plain_history(message: dict) -> dict:
    """For a template without tool support: calls and results as ordinary turns it can render."""
    role = message.get("role")
    if role == Role.TOOL:
        return {
            "role": Role.USER.value,
            "content": f"Function result: {message.get('content', '')}",
        }
    calls = message.get("tool_calls")
    if role == Role.ASSISTANT and calls:
        written = "\n".join(
            json.dumps(
                {"name": c["function"]["name"], "arguments": c["function"].get("arguments", {})}
            )
            for c in calls
            if isinstance(c, Mapping) and isinstance(c.get("function"), Mapping)
        )
        text = message.get("content") or ""
        return {"role": role, "content": f"{text}\n{written}".strip()}
    return message
