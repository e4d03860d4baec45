"""Calls written as a bare JSON object: Llama 3.1+ (`{"name": ..., "parameters": {...}}` as the
whole reply, several separated by ";") and the generic fallback for templates with no tool
format of their own (the same object, "arguments" or "parameters", on a line of its own).

An object at the start of a line is held back until it is known to be a call: its name and an
arguments key appear in that order (then it streams as a call), or it closes, and is a call if
json.loads finds a "name" and arguments in it. Any other object (the user asked for JSON, say)
is released as text unchanged.
"""

from __future__ import annotations

from engine.tool_calls.call_body import CallBody
from engine.tool_calls.items import (
    CallArguments,
    CallOpened,
    Item,
    Text,
    cut_off,
    feed_body,
)


class JsonLinesParser:
    def __init__(self, separators: str = ";") -> None:
        self._separators = separators  # what may stand between two calls
        self._line_start = True
        self._body: CallBody | None = None
        self._is_call = False  # the held object showed a call's head
        self._pending: list[Item] = []  # the held object's own items until it is known a call
        self._after_call = False
        self._key = 0

    def push(self, text: str) -> list[Item]:
        items: list[Item] = []
        buffer = text
        while buffer:
            if self._body is not None:
                buffer = self._feed_candidate(buffer, items)
                continue
            if self._after_call:
                stripped = buffer.lstrip(" \t\r\n" + self._separators)
                if not stripped:
                    return items
                self._after_call = False
                self._line_start = stripped.startswith("{")
                buffer = stripped if self._line_start else buffer
                continue
            out: list[str] = []
            for i, ch in enumerate(buffer):
                if self._line_start and ch == "{":
                    if out:
                        items.append(Text("".join(out)))
                    self._body = CallBody()
                    buffer = buffer[i:]
                    break
                out.append(ch)
                if ch == "\n":
                    self._line_start = True
                elif not ch.isspace():
                    self._line_start = False
            else:
                if out:
                    items.append(Text("".join(out)))
                buffer = ""
        return items

    def _feed_candidate(self, buffer: str, items: list[Item]) -> str:
        body = self._body
        assert body is not None
        local: list[Item] = []
        rest = feed_body(body, self._key, buffer, local)
        if not self._is_call and body.streaming:
            self._is_call = True
            items.extend(self._pending)
            self._pending = []
        if self._is_call:
            items.extend(local)
        else:
            self._pending.extend(i for i in local if isinstance(i, (CallOpened, CallArguments)))
        if rest is None:
            return ""
        self._body = None
        self._pending = []
        if self._is_call or _decodes_as_call(body):
            if not self._is_call:
                items.extend(i for i in local if not isinstance(i, (CallOpened, CallArguments)))
            self._key += 1
            self._after_call = True
        else:
            items.append(Text(body.raw))
            self._line_start = False
        self._is_call = False
        return rest

    def flush(self) -> list[Item]:
        items: list[Item] = []
        if self._body is not None:
            if self._is_call:
                items.append(cut_off(self._body, self._key))
            else:
                items.append(Text(self._body.raw))
            self._body = None
        return items


def _decodes_as_call(body: CallBody) -> bool:
    name, arguments, _ = body.decode()
    return bool(name) and arguments is not None and '"name"' in body.raw
