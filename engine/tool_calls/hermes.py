"""Hermes / Qwen tool calls: <tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>.

Written by Qwen2.5, Qwen3, Hermes 2/3 and many fine-tunes (their templates tell the model so).
Text before, between and after calls is answer text; several calls may follow one another. The
closing tag after a closed object is optional (a reply may end right after the "}")."""

from __future__ import annotations

from engine.tool_calls.call_body import CallBody
from engine.tool_calls.items import Item, Text, cut_off, feed_body, split_at_tag

OPEN = "<tool_call>"
CLOSE = "</tool_call>"


class HermesParser:
    def __init__(self) -> None:
        self._held = ""  # text that may be the start of OPEN or CLOSE
        self._body: CallBody | None = None
        self._after_call = False  # a call closed; waiting for CLOSE
        self._key = 0

    def push(self, text: str) -> list[Item]:
        items: list[Item] = []
        buffer = self._held + text
        self._held = ""
        while buffer:
            if self._body is not None:
                rest = feed_body(self._body, self._key, buffer, items)
                if rest is None:
                    return items
                self._body = None
                self._key += 1
                self._after_call = True
                buffer = rest
                continue
            if self._after_call:
                stripped = buffer.lstrip()
                if stripped.startswith(CLOSE):
                    buffer = stripped[len(CLOSE) :]
                    self._after_call = False
                    continue
                if not stripped or CLOSE.startswith(stripped):
                    self._held = buffer
                    return items
                self._after_call = False  # no closing tag: what follows is text again
                continue
            text, after, held = split_at_tag(buffer, OPEN)
            if text:
                items.append(Text(text))
            if after is not None:
                self._body = CallBody(terminator=CLOSE)
                buffer = after
                continue
            self._held = held
            break
        return items

    def flush(self) -> list[Item]:
        items: list[Item] = []
        if self._body is not None:
            items.append(cut_off(self._body, self._key))
            self._body = None
        elif self._held and not self._after_call:
            items.append(Text(self._held))
        self._held = ""
        return items
