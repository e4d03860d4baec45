"""Mistral tool calls: [TOOL_CALLS] [{"name": ..., "arguments": {...}, "id": ...}, ...].

`[TOOL_CALLS]` is a control token in Mistral's v3 vocabulary, which text decoding hides; the
generation loop passes its text through (engine.tool_calls.stream.marker_token_texts). A reply
that starts with the array itself (as a constrained call is written) is read the same way."""

from __future__ import annotations

from engine.tool_calls.call_body import CallBody
from engine.tool_calls.items import Item, Text, cut_off, feed_body, split_at_tag

MARKER = "[TOOL_CALLS]"


class MistralParser:
    def __init__(self) -> None:
        self._held = ""
        self._state = "start"  # start | text | array_open | array | call
        self._body: CallBody | None = None
        self._key = 0

    def push(self, text: str) -> list[Item]:
        items: list[Item] = []
        buffer = self._held + text
        self._held = ""
        while buffer:
            if self._state == "call":
                assert self._body is not None
                rest = feed_body(self._body, self._key, buffer, items)
                if rest is None:
                    return items
                self._body = None
                self._key += 1
                self._state = "array"
                buffer = rest
            elif self._state == "array_open":
                stripped = buffer.lstrip()
                if not stripped:
                    return items
                if stripped[0] == "[":
                    self._state, buffer = "array", stripped[1:]
                elif stripped[0] == "{":  # a single object without the list
                    self._state, buffer = "array", stripped
                else:
                    self._state = "text"
                    buffer = stripped
            elif self._state == "array":
                stripped = buffer.lstrip(" \t\r\n,")
                if not stripped:
                    return items
                if stripped[0] == "{":
                    self._body = CallBody()
                    self._state, buffer = "call", stripped
                elif stripped[0] == "]":
                    self._state, buffer = "text", stripped[1:]
                else:
                    self._state, buffer = "text", stripped
            else:
                if self._state == "start":
                    stripped = buffer.lstrip()
                    if not stripped:
                        self._held = buffer
                        return items
                    if stripped.startswith("[{") or (stripped == "[" and len(buffer) < 64):
                        self._state, buffer = "array_open", stripped
                        continue
                    self._state = "text"
                text, after, held = split_at_tag(buffer, MARKER)
                if text:
                    items.append(Text(text))
                if after is not None:
                    self._state, buffer = "array_open", after
                    continue
                self._held = held
                break
        return items

    def flush(self) -> list[Item]:
        items: list[Item] = []
        if self._body is not None:
            items.append(cut_off(self._body, self._key))
            self._body = None
        elif self._held and self._state in ("start", "text"):
            items.append(Text(self._held))
        self._held = ""
        return items
