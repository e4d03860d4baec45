"""Answer text in, events out: TextDelta around the calls, and per call ToolCallStarted ->
ToolCallArgumentsDelta* -> ToolCallFinished (arguments validate against the tool's schema:
safe to execute) or ToolCallMalformed (never to be executed: unreadable, cut off, an unknown
tool, or arguments the schema rejects).

Whitespace right before a call, and after the last call, is dropped (it is the format's
layout, not answer text); whitespace before more text is kept.
"""

from __future__ import annotations

import secrets
import string
from collections.abc import Sequence

from engine.events import (
    TextDelta,
    ToolCallArgumentsDelta,
    ToolCallFinished,
    ToolCallMalformed,
    ToolCallStarted,
)
from engine.tool_calls.formats import new_parser
from engine.tool_calls.items import CallArguments, CallBroken, CallClosed, CallOpened, Item, Text
from engine.tool_calls.mistral import MARKER as MISTRAL_MARKER
from engine.types import ToolCall, ToolCallFormat, ToolSpec

_ID_ALPHABET = string.ascii_letters + string.digits


def new_call_id(fmt: ToolCallFormat) -> str:
    """Mistral's template requires 9 alphanumeric characters; others get an OpenAI-style id."""
    if fmt == ToolCallFormat.MISTRAL:
        return "".join(secrets.choice(_ID_ALPHABET) for _ in range(9))
    return "call_" + "".join(secrets.choice(_ID_ALPHABET) for _ in range(16))


def marker_token_texts(tokenizer, fmt: ToolCallFormat) -> dict[int, str]:
    """Control tokens whose text the parser must see although decoding hides it."""
    if fmt != ToolCallFormat.MISTRAL:
        return {}
    token_id = tokenizer.token_id(MISTRAL_MARKER)
    if token_id is None or tokenizer.piece_bytes(token_id):  # absent, or already visible
        return {}
    return {int(token_id): MISTRAL_MARKER}


class ToolCallStream:
    def __init__(self, fmt: ToolCallFormat, tools: Sequence[ToolSpec]):
        from jsonschema import Draft202012Validator

        self.format = fmt
        self._parser = new_parser(fmt)
        self._tools = {t.name: t for t in tools}
        self._validators = {t.name: Draft202012Validator(t.parameters) for t in tools}
        self._ids: dict[int, str] = {}
        self._opened: set[int] = set()
        self._held_space = ""
        self.calls: list[ToolCall] = []
        self.malformed: list[ToolCallMalformed] = []
        self.text: list[str] = []
        self.ended_on_call = False  # the last thing in the reply was a call

    def push(self, text: str) -> list[object]:
        return self._events(self._parser.push(text)) if text else []

    def flush(self) -> list[object]:
        events = self._events(self._parser.flush())
        if self._held_space and not self.ended_on_call:  # the answer's own last whitespace
            events.append(self._text(self._held_space))
        self._held_space = ""  # else the layout after the last call
        return events

    def _text(self, text: str) -> TextDelta:
        self.text.append(text)
        self.ended_on_call = False
        return TextDelta(text)

    def _events(self, items: list[Item]) -> list[object]:
        events: list[object] = []
        for item in items:
            if isinstance(item, Text):
                # trailing whitespace waits: before a call it is the format's layout (dropped),
                # before more text it is text; so the result does not depend on the cut
                body = item.text.rstrip()
                if not body:
                    self._held_space += item.text
                    continue
                text = self._held_space + body
                self._held_space = item.text[len(body) :]
                events.append(self._text(text))
                continue
            self._held_space = ""
            self.ended_on_call = True
            call_id = self._ids.setdefault(item.key, new_call_id(self.format))
            if isinstance(item, CallOpened):
                self._opened.add(item.key)
                events.append(ToolCallStarted(call_id, item.name))
            elif isinstance(item, CallArguments):
                events.append(ToolCallArgumentsDelta(call_id, item.text))
            elif isinstance(item, CallClosed):
                events.extend(self._closed(item, call_id))
            elif isinstance(item, CallBroken):
                if item.key not in self._opened and item.name:
                    events.append(ToolCallStarted(call_id, item.name))
                events.append(self._malformed(call_id, item.name, item.raw, item.problem))
        return events

    def _closed(self, item: CallClosed, call_id: str) -> list[object]:
        body = item.body
        name, arguments, problem = body.decode()
        events: list[object] = []
        if item.key not in self._opened:
            events.append(ToolCallStarted(call_id, name))
            if arguments is not None:
                import json

                events.append(ToolCallArgumentsDelta(call_id, json.dumps(arguments)))
        if arguments is None:
            return [*events, self._malformed(call_id, name, body.raw, problem)]
        validator = self._validators.get(name)
        if validator is None:
            offered = ", ".join(self._tools) or "none"
            return [
                *events,
                self._malformed(
                    call_id, name, body.raw, f"no tool is named {name!r} (offered: {offered})"
                ),
            ]
        errors = sorted(validator.iter_errors(arguments), key=lambda e: list(e.absolute_path))
        if errors:
            first = errors[0]
            where = "/".join(str(p) for p in first.absolute_path) or "(the arguments)"
            problem = f"the arguments do not match {name}'s schema at {where}: {first.message}"
            return [*events, self._malformed(call_id, name, body.raw, problem)]
        self.calls.append(ToolCall(call_id, name, arguments))
        return [*events, ToolCallFinished(call_id, name, arguments)]

    def _malformed(self, call_id: str, name: str, raw: str, problem: str) -> ToolCallMalformed:
        event = ToolCallMalformed(call_id, name, raw.strip(), problem)
        self.malformed.append(event)
        return event
