"""Built-in tools: the calculator's AST walker (values hand-computed; what it must refuse) and
the date/time tool (checked against a fixed clock)."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from app.tools.builtin import BUILTIN_TOOLS, builtin_schemas, current_datetime, run_builtin
from app.tools.calculator import MAX_INT_BITS, evaluate
from app.tools.errors import ToolArgumentsError, UnknownToolError
from engine.tool_calls.spec import parse_tools


@pytest.mark.parametrize(
    ("expression", "value"),
    [
        ("(2+3)*4**2", 80),
        ("7 // 2", 3),
        ("7 % 3", 1),
        ("10/4", 2.5),
        ("2^10", 1024),  # what people (and models) mean by ^
        ("-(-3)", 3),
        ("sqrt(16) + abs(-2)", 6.0),
        ("max(1, 5, 3) - min(4, 2)", 3),
        ("round(2.675, 2)", 2.67),  # binary floating point, as Python rounds it
        ("2**4095", 2**4095),
        ("3**2584", 3**2584),  # 4,096 bits exactly
        ("1.5e3 * 2", 3000.0),
    ],
)
def test_calculator_values(expression, value):
    assert evaluate(expression) == value


@pytest.mark.parametrize(
    ("expression", "problem"),
    [
        ("9**9**9", "exponent"),
        ("2**5000", "bits"),
        ("(2**4000) * (2**4000)", "bits"),
        ("1/0", "division by zero"),
        ("__import__('os')", "unknown function"),
        ("__import__('os').system('true')", "not allowed"),
        ("().__class__", "not allowed"),
        ("[x for x in range(10)]", "not allowed"),
        ("open('/etc/passwd')", "unknown function"),
        ("'a' * 3", "not a number"),
        ("True + 1", "not a number"),
        ("x" * 501, "characters long"),
        ("+".join(["1"] * 150), "parts"),
        ("1e308 * 10", "finite"),
        ("sqrt(-1)", "math error"),
        ("(-8) ** 0.5", "not a number"),  # a complex result
        ("", "empty"),
        ("2 +", "not an arithmetic expression"),
    ],
)
def test_calculator_refuses(expression, problem):
    with pytest.raises(ToolArgumentsError, match=problem):
        evaluate(expression)
    assert MAX_INT_BITS == 4096


def test_calculator_result_via_the_tool_is_text_and_errors_are_readable_results():
    assert run_builtin("calculator", {"expression": "6*7"}).text == "42"
    refused = run_builtin("calculator", {"expression": "1/0"})
    assert refused.is_error and "division by zero" in refused.text
    with pytest.raises(UnknownToolError):
        run_builtin("rm", {})


def test_datetime_tool_on_a_fixed_clock():
    fixed = datetime(2026, 3, 14, 15, 9, 26, tzinfo=UTC)
    text = current_datetime({"timezone": "Asia/Tokyo"}, now=lambda tz=None: fixed.astimezone(tz))
    assert text.startswith("Sunday, 15 March 2026, 00:09:26 (JST, UTC+09:00)")
    assert "2026-03-15T00:09:26+09:00" in text
    assert run_builtin("get_current_datetime", {"timezone": "Mars/Olympus"}).is_error


def test_builtin_schemas_are_valid_request_tools():
    specs = parse_tools(builtin_schemas())
    assert [s.name for s in specs] == list(BUILTIN_TOOLS)
