"""Built-in tools.

    get_current_datetime {timezone?}  the local (or named IANA zone's) date, time and weekday
    calculator {expression}           arithmetic (calculator.py: an AST walker, never eval)
    fetch_url {url}                   a web page's readable text (fetch_url.py)

The first two read nothing private and change nothing, so they run without asking. fetch_url
reaches the network at a URL the model chose, so it waits for the user's approval of each
call like an MCP tool (`needs_approval`), and what it may reach depends on a setting
(`ToolContext.allow_private_addresses`).

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
from app.tools.fetch_url import fetch_url, format_page
from app.tools.result import ToolResult
from engine.cancel import CancelToken


@dataclass(frozen=True)
class ToolContext:
    """What a call may depend on besides its arguments: the user's settings and Stop."""

    allow_private_addresses: bool = False  # Settings.fetch_allow_private
    cancel: CancelToken | None = None


@dataclass(frozen=True)
class BuiltinTool:
    schema: dict  # {"type": "function", "function": {...}}
    run: Callable[[dict, ToolContext], str]
    needs_approval: bool = False  # True: each call waits for Allow / Always / Deny

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


def fetch(arguments: dict, context: ToolContext) -> str:
    url = arguments.get("url")
    if not isinstance(url, str):
        raise ToolArgumentsError('fetch_url needs a "url" string, such as https://example.com/')
    page = fetch_url(url, allow_private=context.allow_private_addresses, cancel=context.cancel)
    return format_page(page)


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
    run=lambda arguments, _context: current_datetime(arguments),
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
    run=lambda arguments, _context: calculate(arguments),
)
FETCH_URL_TOOL = BuiltinTool(
    schema={
        "type": "function",
        "function": {
            "name": "fetch_url",
            "description": "Fetch a web page (http or https) and return its readable text, "
            "for questions about a page the user names or facts to look up at a known URL.",
            "parameters": {
                "type": "object",
                "properties": {
                    "url": {"type": "string", "description": "for example https://example.com/"}
                },
                "required": ["url"],
                "additionalProperties": False,
            },
        },
    },
    run=fetch,
    needs_approval=True,
)
BUILTIN_TOOLS: dict[str, BuiltinTool] = {
    t.name: t for t in (DATETIME_TOOL, CALCULATOR_TOOL, FETCH_URL_TOOL)
}


def builtin_schemas() -> list[dict]:
    return [t.schema for t in BUILTIN_TOOLS.values()]


def builtin_needs_approval(name: str) -> bool:
    tool = BUILTIN_TOOLS.get(name)
    return tool is not None and tool.needs_approval


def run_builtin(name: str, arguments: dict, context: ToolContext | None = None) -> ToolResult:
    tool = BUILTIN_TOOLS.get(name)
    if tool is None:
        raise UnknownToolError(f"there is no built-in tool named {name!r}")
    try:
        return ToolResult(tool.run(arguments, context or ToolContext()))
    except ToolError as exc:
        return ToolResult(f"Error: {exc}", is_error=True)
