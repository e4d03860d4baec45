"""A format parser with a second one reading the text the first leaves: models trained on
Hermes tags sometimes write a bare or fenced JSON call instead (Qwen2.5-Coder-1.5B answers
"What is today's date?" with a ```json call), and llama.cpp's Hermes parser accepts those too.
The fallback only ever sees text outside the primary format's calls."""

from __future__ import annotations

from engine.tool_calls.items import (
    CallArguments,
    CallBroken,
    CallClosed,
    CallOpened,
    FormatParser,
    Item,
    Text,
)


class WithFallback:
    def __init__(self, primary: FormatParser, fallback: FormatParser) -> None:
        self._primary = primary
        self._fallback = fallback
        self._keys: dict[tuple[int, int], int] = {}

    def push(self, text: str) -> list[Item]:
        return self._route(self._primary.push(text))

    def flush(self) -> list[Item]:
        items = self._route(self._primary.flush())
        return items + self._renumber(1, self._fallback.flush())

    def _route(self, items: list[Item]) -> list[Item]:
        out: list[Item] = []
        for item in items:
            if isinstance(item, Text):
                out += self._renumber(1, self._fallback.push(item.text))
            else:
                # a call of the primary format ends whatever the fallback held (in order)
                out += self._renumber(1, self._fallback.flush())
                out += self._renumber(0, [item])
        return out

    def _renumber(self, source: int, items: list[Item]) -> list[Item]:
        out: list[Item] = []
        for item in items:
            if isinstance(item, Text):
                out.append(item)
                continue
            key = self._keys.setdefault((source, item.key), len(self._keys))
            if isinstance(item, CallOpened):
                out.append(CallOpened(key, item.name))
            elif isinstance(item, CallArguments):
                out.append(CallArguments(key, item.text))
            elif isinstance(item, CallClosed):
                out.append(CallClosed(key, item.body))
            elif isinstance(item, CallBroken):
                out.append(CallBroken(key, item.name, item.raw, item.problem))
        return out
