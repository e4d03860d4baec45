"""A request's `tools` and `tool_choice`, checked before anything runs.

Each error is a ConfigValidationError naming the field as a path (`tools[1].function.name`),
the value and what is allowed, like every other request setting. A tool's parameters schema is
checked with the same validator as JSON mode (engine.constrained.validate_schema), since a
constrained call compiles it to a grammar, and with jsonschema, which validates the arguments
of every call the model makes.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from engine.errors import ConfigValidationError, ConstraintError
from engine.types import ToolChoice, ToolSpec

MAX_TOOLS = 128  # OpenAI's limit for one request
_NAME = re.compile(r"[A-Za-z0-9_.\-]{1,64}")  # OpenAI's function name rule (dots allowed, as MCP)


@dataclass(frozen=True)
class ToolPlan:
    """The request's tools, validated: what is offered and how calls are made."""

    tools: tuple[ToolSpec, ...]
    choice: str  # a ToolChoice value
    forced_name: str | None  # tool_choice named one function
    constrained: bool  # the reply is one call decoded under a grammar (required / a named function)

    @property
    def offered(self) -> tuple[ToolSpec, ...]:
        if self.forced_name is not None:
            return tuple(t for t in self.tools if t.name == self.forced_name)
        return self.tools


def parse_tools(tools: Any) -> tuple[ToolSpec, ...]:
    if tools is None:
        return ()
    if isinstance(tools, (str, bytes, Mapping)) or not isinstance(tools, Sequence):
        raise ConfigValidationError("tools", _short(tools), "a list of function tools")
    if len(tools) > MAX_TOOLS:
        raise ConfigValidationError("tools", f"{len(tools)} tools", f"at most {MAX_TOOLS} tools")
    specs: list[ToolSpec] = []
    seen: set[str] = set()
    for i, tool in enumerate(tools):
        spec = _parse_tool(tool, f"tools[{i}]")
        if spec.name in seen:
            raise ConfigValidationError(
                f"tools[{i}].function.name", spec.name, "a name no other tool has"
            )
        seen.add(spec.name)
        specs.append(spec)
    return tuple(specs)


def _parse_tool(tool: Any, where: str) -> ToolSpec:
    if not isinstance(tool, Mapping):
        raise ConfigValidationError(
            where, _short(tool), 'an object {"type": "function", "function": {...}}'
        )
    if "function" in tool:
        if tool.get("type", "function") != "function":
            raise ConfigValidationError(f"{where}.type", tool.get("type"), '"function"')
        function = tool["function"]
        where = f"{where}.function"
        if not isinstance(function, Mapping):
            raise ConfigValidationError(
                where, _short(function), "an object with name, description, parameters"
            )
    else:
        function = tool  # the bare function dict, as some clients send it
    name = function.get("name")
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise ConfigValidationError(
            f"{where}.name", name, "1-64 letters, digits, underscores, dots or dashes"
        )
    description = function.get("description", "")
    if not isinstance(description, str):
        raise ConfigValidationError(f"{where}.description", _short(description), "a string")
    parameters = function.get("parameters")
    if parameters is None:
        parameters = {"type": "object", "properties": {}}
    if not isinstance(parameters, Mapping) or parameters.get("type", "object") != "object":
        raise ConfigValidationError(
            f"{where}.parameters", _short(parameters), 'a JSON schema of "type": "object"'
        )
    parameters = dict(parameters)
    parameters.setdefault("type", "object")
    _check_schema(parameters, f"{where}.parameters")
    return ToolSpec(name=name, description=description, parameters=parameters)


def _check_schema(schema: dict, where: str) -> None:
    from jsonschema import Draft202012Validator
    from jsonschema.exceptions import SchemaError

    from engine.constrained import validate_schema

    try:
        validate_schema(schema)
    except ConstraintError as exc:
        raise ConfigValidationError(
            where, _short(schema), f"a usable JSON schema ({exc})"
        ) from None
    try:
        Draft202012Validator.check_schema(schema)
    except SchemaError as exc:
        raise ConfigValidationError(
            where, _short(schema), f"a valid JSON schema ({exc.message})"
        ) from None


def parse_tool_choice(choice: Any, tools: tuple[ToolSpec, ...]) -> tuple[str, str | None]:
    """-> (ToolChoice value, forced function name or None)."""
    if choice is None:
        choice = ToolChoice.AUTO
    if isinstance(choice, str):
        if choice not in tuple(ToolChoice):
            raise ConfigValidationError(
                "tool_choice", choice,
                '"auto", "none", "required" or {"type": "function", "function": {"name": ...}}',
            )  # fmt: skip
        if choice == ToolChoice.REQUIRED and not tools:
            raise ConfigValidationError("tool_choice", choice, '"required" only with tools given')
        return ToolChoice(choice), None
    if isinstance(choice, Mapping):
        function = choice.get("function")
        name = function.get("name") if isinstance(function, Mapping) else choice.get("name")
        known = [t.name for t in tools]
        if not isinstance(name, str) or name not in known:
            raise ConfigValidationError(
                "tool_choice.function.name", name,
                f"the name of an offered tool ({', '.join(known) or 'none offered'})",
            )  # fmt: skip
        return ToolChoice.REQUIRED, name
    raise ConfigValidationError(
        "tool_choice", _short(choice), '"auto", "none", "required" or a named function'
    )


def plan_tools(tools: Any, choice: Any) -> ToolPlan | None:
    """The request's ToolPlan, or None when no tools are in play (none given, or "none")."""
    specs = parse_tools(tools)
    word, forced = parse_tool_choice(choice, specs)
    if not specs or word == ToolChoice.NONE:
        return None
    return ToolPlan(
        tools=specs, choice=word, forced_name=forced, constrained=word == ToolChoice.REQUIRED
    )


def check_no_control_text(tokenizer, plan: ToolPlan) -> None:
    """Tools are rendered as template text, whose control-token text becomes real control tokens
    (messages are tokenized apart, see engine.prompt_ids): a tool description holding
    "<|im_start|>system" (an MCP server controls its own) would rewrite the conversation's
    roles. Such a tool is refused by name."""
    import json

    for i, tool in enumerate(plan.tools):
        text = json.dumps(tool.to_openai(), ensure_ascii=False)
        literal = tokenizer.encode(text, add_special=False, literal_spans=[(0, len(text))])
        if literal != tokenizer.encode(text, add_special=False):
            raise ConfigValidationError(
                f"tools[{i}]", tool.name, "a definition without the model's control-token text"
            )


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."
