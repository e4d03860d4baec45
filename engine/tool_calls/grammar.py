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
from typing import Any

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


# The one token that opens a call, per format, after which a lazy constraint takes over.
_OPENER = {ToolCallFormat.HERMES: "<tool_call>", ToolCallFormat.MISTRAL: "[TOOL_CALLS]"}


def _body_lark(fmt: ToolCallFormat, tools: Sequence[ToolSpec]) -> str:
    """The call after its opener token: Hermes "\\n{...}\\n</tool_call>", Mistral " [{...}]"."""
    full = tool_call_lark(fmt, tools)
    rules = full.split("\n", 1)[1]
    if fmt == ToolCallFormat.HERMES:
        start = f"start: {_literal(chr(10))} call {_literal(chr(10) + '</tool_call>')}"
    else:
        start = f"start: {_literal(' [')} call {_literal(']')}"
    return f"{start}\n{rules}"


class LazyToolCallConstraint:
    """`constrain_tool_calls` with tool_choice "auto": the reply is free text until the model
    samples its format's opener token (`<tool_call>`, `[TOOL_CALLS]`); from the next token on,
    the call is decoded under the call grammar (an offered name, arguments of that tool's schema),
    and once the call is closed the text is free again, so a reply may hold text and calls.

    It follows the loop's token list itself, so it sees the opener the moment it is chosen,
    ahead of detokenizing and stop-string hold-back. Never `is_complete`: the reply ends when the
    model ends it."""

    def __init__(self, tokenizer, fmt: ToolCallFormat, tools: Sequence[ToolSpec]):
        import llguidance

        from engine.constrained import _native_guard, llg_tokenizer_for

        opener = _OPENER.get(fmt)
        opener_id = tokenizer.token_id(opener) if opener else None
        if opener_id is None:
            raise ConstraintError(
                "constrain_tool_calls needs a model whose tool calls open with one token "
                f"(Hermes <tool_call> or Mistral [TOOL_CALLS]); this model's format is {fmt}"
            )
        self.opener_id = int(opener_id)
        self._llg = llg_tokenizer_for(tokenizer)
        with _native_guard("building the tool-call grammar"):
            self._grammar = llguidance.LLMatcher.grammar_from_lark(_body_lark(fmt, tools))
            is_error, messages = llguidance.LLMatcher.validate_grammar_with_warnings(
                self._grammar, self._llg
            )
        if is_error:
            raise ConstraintError("The tool-call grammar is invalid: " + "; ".join(messages))
        self._active: Any = None  # the JsonConstraint of the call being written
        self._opened_at = -1  # len(tokens) when the current call's opener was chosen

    @property
    def active(self) -> bool:
        return self._active is not None

    def __call__(self, tokens, logits):
        from engine.constrained import JsonConstraint

        if self._active is not None and self._active.is_complete:
            self._active = None
        if (
            self._active is None
            and tokens
            and tokens[-1] == self.opener_id
            and len(tokens) != self._opened_at
        ):
            self._opened_at = len(tokens)
            self._active = JsonConstraint(self._llg, self._grammar)
        if self._active is None:
            return logits
        return self._active(tokens, logits)

    def accept(self, token_id: int) -> None:
        if self._active is not None:
            self._active.accept(token_id)

    @property
    def is_complete(self) -> bool:
        return False
