"""Arithmetic without eval: the expression is parsed with `ast` and walked node by node, so
only numbers, + - * / // % **, parentheses and a few named math functions and constants can
run, never a name lookup, attribute, call of anything else or comprehension.

Limits keep a model's expression from costing more than a moment: the text length, the number
of nodes, the size of an exponent and of any integer result (Python's integers are unbounded;
9**9**9 alone would take minutes and gigabytes).
"""

from __future__ import annotations

import ast
import math
import operator
from collections.abc import Callable
from typing import Any

from app.tools.errors import ToolArgumentsError

MAX_EXPRESSION_CHARS = 500
MAX_NODES = 200
MAX_EXPONENT = 10_000  # |b| in a ** b
MAX_INT_BITS = 4_096  # any integer on the way (about 1,233 decimal digits)

_BINARY: dict[type, Callable[[Any, Any], Any]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
}
_UNARY: dict[type, Callable[[Any], Any]] = {ast.UAdd: operator.pos, ast.USub: operator.neg}
_FUNCTIONS: dict[str, Callable[..., Any]] = {
    "sqrt": math.sqrt,
    "abs": abs,
    "round": round,
    "floor": math.floor,
    "ceil": math.ceil,
    "exp": math.exp,
    "log": math.log,
    "log10": math.log10,
    "log2": math.log2,
    "sin": math.sin,
    "cos": math.cos,
    "tan": math.tan,
    "asin": math.asin,
    "acos": math.acos,
    "atan": math.atan,
    "min": min,
    "max": max,
}
_CONSTANTS = {"pi": math.pi, "e": math.e, "tau": math.tau}


def evaluate(expression: str) -> int | float:
    """The value of an arithmetic expression, or ToolArgumentsError saying what is refused."""
    if not isinstance(expression, str) or not expression.strip():
        raise ToolArgumentsError("the expression is empty")
    if len(expression) > MAX_EXPRESSION_CHARS:
        raise ToolArgumentsError(
            f"the expression is {len(expression)} characters long (limit {MAX_EXPRESSION_CHARS})"
        )
    text = expression.replace("^", "**").replace("×", "*").replace("÷", "/")
    try:
        tree = ast.parse(text.strip(), mode="eval")
    except SyntaxError:
        raise ToolArgumentsError(f"{expression!r} is not an arithmetic expression") from None
    n_nodes = sum(1 for _ in ast.walk(tree))
    if n_nodes > MAX_NODES:
        raise ToolArgumentsError(f"the expression has {n_nodes} parts (limit {MAX_NODES})")
    try:
        return _check(_eval(tree.body))
    except ZeroDivisionError:
        raise ToolArgumentsError("division by zero") from None
    except OverflowError:
        raise ToolArgumentsError("the result is too large for a floating-point number") from None
    except (ValueError, TypeError) as exc:  # sqrt(-1), log(0), round("x")
        raise ToolArgumentsError(f"math error: {exc}") from None


def format_number(value: int | float) -> str:
    if isinstance(value, float):
        if value.is_integer() and abs(value) < 1e15:
            return str(int(value))
        return format(value, ".15g")
    return str(value)


def _eval(node: ast.AST) -> int | float:
    if isinstance(node, ast.Constant):
        if isinstance(node.value, bool) or not isinstance(node.value, (int, float)):
            raise ToolArgumentsError(f"{node.value!r} is not a number")
        return _check(node.value)
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        left, right = _eval(node.left), _eval(node.right)
        if isinstance(node.op, ast.Pow):
            _check_power(left, right)
        if (
            isinstance(node.op, ast.Mult)
            and isinstance(left, int)
            and isinstance(right, int)
            and left.bit_length() + right.bit_length() > MAX_INT_BITS
        ):
            raise ToolArgumentsError(f"the product would exceed {MAX_INT_BITS} bits")
        return _check(_BINARY[type(node.op)](left, right))
    if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
        return _check(_UNARY[type(node.op)](_eval(node.operand)))
    if isinstance(node, ast.Name) and node.id in _CONSTANTS:
        return _CONSTANTS[node.id]
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and not node.keywords:
        function = _FUNCTIONS.get(node.func.id)
        if function is None:
            raise ToolArgumentsError(
                f"unknown function {node.func.id!r} (known: {', '.join(sorted(_FUNCTIONS))})"
            )
        return _check(function(*(_eval(a) for a in node.args)))
    raise ToolArgumentsError(f"{ast.unparse(node)!r} is not allowed in an arithmetic expression")


def _check_power(base: int | float, exponent: int | float) -> None:
    if abs(exponent) > MAX_EXPONENT:
        raise ToolArgumentsError(f"the exponent {exponent} is too large (limit {MAX_EXPONENT})")
    exact = isinstance(base, int) and isinstance(exponent, int)
    if exact and exponent > 0 and abs(base) > 1 and exponent * math.log2(abs(base)) > MAX_INT_BITS:
        raise ToolArgumentsError(f"the power would exceed {MAX_INT_BITS} bits")


def _check(value: Any) -> int | float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ToolArgumentsError(f"{value!r} is not a number")
    if isinstance(value, int) and value.bit_length() > MAX_INT_BITS:
        raise ToolArgumentsError(f"a number on the way exceeds {MAX_INT_BITS} bits")
    if isinstance(value, float) and not math.isfinite(value):
        raise ToolArgumentsError("the result is not a finite number")
    return value
