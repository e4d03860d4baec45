"""Built-in tools, safe to run without asking: they read nothing private and change nothing.

    get_current_datetime {timezone?}  the local (or named IANA zone's) date, time and weekday
    calculator {expression}           arithmetic (calculator.py: an AST walker, never eval)

`BUILTIN_TOOLS` maps each name to its OpenAI function schema (what GenerationRequest.tools
takes) and its runner; `run_builtin(name, arguments)` gives a ToolResult, with any refusal as
an error result the model can read and recover from.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from app.tools.calculator import evaluate, format_number
from app.tools.errors import ToolArgumentsError, ToolError, UnknownToolError
from app.tools.result import ToolResult


@dataclass(frozen=True)
class BuiltinTool:
    schema: dict  # {"type": "function", "function": {...}}
    run: Callable[[dict], str]

    @property
    def name(self) -> str:
        return self.schema["function"]["name"]


_clock: Callable[..., datetime] = datetime.now  # the wall clock (tests substitute a fixed one)


def current_datetime(arguments: dict, now: Callable[..., datetime] | None = None) -> str:
    now = now or _clock
    zone_name = arguments.get("timezone")
    if zone_name and str(zone_name).strip().lower() not in ("local", "localtime"):
        try:
            moment = now(ZoneInfo(str(zone_name)))
        except (ZoneInfoNotFoundError, ValueError):
            raise ToolArgumentsError(f"{zone_name!r} is not a known IANA time zone") from None
    else:
        moment = now().astimezone()
    offset = moment.strftime("%z")
    return (
        f"{moment.strftime('%A, %d %B %Y, %H:%M:%S')} "
        f"({moment.tzname() or 'local time'}, UTC{offset[:3]}:{offset[3:]}); "
        f"ISO 8601: {moment.isoformat(timespec='seconds')}"
    )


def calculate(arguments: dict) -> str:
    expression = arguments.get("expression")
    if not isinstance(expression, str):
        raise ToolArgumentsError('the calculator needs an "expression" string')
    return format_number(evaluate(expression))


DATETIME_TOOL = BuiltinTool(
    schema={
        "type": "function",
        "function": {
            "name": "get_current_datetime",
            "description": "Get the current date, time and weekday. Use it whenever the answer "
            "depends on today's date or the time.",
            "parameters": {
                "type": "object",
                "properties": {
                    "timezone": {
                        "type": "string",
                        "description": "IANA time zone such as Europe/Paris; default: local",
                    }
                },
                "additionalProperties": False,
            },
        },
    },
    run=current_datetime,
)
CALCULATOR_TOOL = BuiltinTool(
    schema={
        "type": "function",
        "function": {
            "name": "calculator",
            "description": "Evaluate an arithmetic expression exactly: + - * / // % ** and "
            "parentheses, sqrt, log, sin, cos, tan, abs, round, min, max, pi, e.",
            "parameters": {
                "type": "object",
                "properties": {
                    "expression": {"type": "string", "description": "for example (2+3)*4**2"}
                },
                "required": ["expression"],
                "additionalProperties": False,
            },
        },
    },
    run=calculate,
)
BUILTIN_TOOLS: dict[str, BuiltinTool] = {t.name: t for t in (DATETIME_TOOL, CALCULATOR_TOOL)}


def builtin_schemas() -> list[dict]:
    return [t.schema for t in BUILTIN_TOOLS.values()]


def run_builtin(name: str, arguments: dict) -> ToolResult:
    tool = BUILTIN_TOOLS.get(name)
    if tool is None:
        raise UnknownToolError(f"there is no built-in tool named {name!r}")
    try:
        return ToolResult(tool.run(arguments))
    except ToolError as exc:
        return ToolResult(f"Error: {exc}", is_error=True)
