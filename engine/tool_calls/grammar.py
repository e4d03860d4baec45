"""The grammar of one constrained call (tool_choice "required" or a named function), in the
model's own format, for llguidance: the name is one of the offered tools and the arguments are
a JSON value of that tool's schema. The JSON machinery (tokenizer view, bounded whitespace,
native-panic guard) is engine.constrained's; this file only writes the Lark grammar around it.

    Hermes       <tool_call>\\n{"name": "NAME", "arguments": ARGS}\\n</tool_call>
    Llama 3      {"name": "NAME", "parameters": ARGS}
    Mistral      [{"name": "NAME", "arguments": ARGS}]   ([TOOL_CALLS] is a control token the
                                                          grammar cannot spell; the parser reads
                                                          a leading array as calls)
    generic      {"name": "NAME", "arguments": ARGS}
"""

from __future__ import annotations

import json
from collections.abc import Sequence

from engine.errors import ConstraintError
from engine.tool_calls.formats import arguments_key
from engine.types import ToolCallFormat, ToolSpec

# The same bounded whitespace as JSON mode (engine.constrained._JSON_OPTIONS), per schema.
_WHITESPACE = {"whitespace_flexible": True, "whitespace_pattern": r"(?:\x20|\x0A\x20{0,20})"}


def _literal(text: str) -> str:
    return json.dumps(text)  # a Lark string literal: JSON's quoting is accepted as is


def tool_call_lark(fmt: ToolCallFormat, tools: Sequence[ToolSpec]) -> str:
    if not tools:
        raise ConstraintError("a constrained tool call needs at least one offered tool")
    key = arguments_key(fmt)
    rules = []
    alternatives = []
    for i, tool in enumerate(tools):
        head = f'{{"name": {json.dumps(tool.name)}, "{key}": '
        schema = {**tool.parameters, "x-guidance": _WHITESPACE}
        rules.append(f"call_{i}: {_literal(head)} args_{i} {_literal('}')}")
        rules.append(f"args_{i}: %json {json.dumps(schema)}")
        alternatives.append(f"call_{i}")
    call = "call: " + " | ".join(alternatives)
    if fmt == ToolCallFormat.HERMES:
        start = (
            f"start: {_literal('<tool_call>' + chr(10))} call {_literal(chr(10) + '</tool_call>')}"
        )
    elif fmt == ToolCallFormat.MISTRAL:
        start = f"start: {_literal('[')} call {_literal(']')}"
    else:
        start = "start: call"
    return "\n".join([start, call, *rules])


def make_tool_call_constraint(tokenizer, fmt: ToolCallFormat, tools: Sequence[ToolSpec]):
    """A JsonConstraint (engine.constrained) following the call grammar."""
    import llguidance

    from engine.constrained import JsonConstraint, _native_guard, llg_tokenizer_for

    llg_tok = llg_tokenizer_for(tokenizer)
    with _native_guard("building the tool-call grammar"):
        grammar = llguidance.LLMatcher.grammar_from_lark(tool_call_lark(fmt, tools))
        is_error, messages = llguidance.LLMatcher.validate_grammar_with_warnings(grammar, llg_tok)
    if is_error:
        raise ConstraintError(
            "The tool-call grammar is invalid: " + "; ".join(m.strip() for m in messages)
        )
    return JsonConstraint(llg_tok, grammar)
