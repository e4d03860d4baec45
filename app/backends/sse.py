"""Incremental parser for server-sent events (the OpenAI streaming format).

The WHATWG rules, as far as chat completions use them: lines end in \\n, \\r\\n or \\r; a line
starting with ':' is a comment (keep-alive); `data:` lines of one event are joined with \\n; a
blank line dispatches the event. The OpenAI stream ends with the data `[DONE]`. Fed bytes in
whatever pieces the network delivers, so a chunk split mid-line or mid-character is fine."""

from __future__ import annotations

import codecs
from dataclasses import dataclass

DONE = "[DONE]"


@dataclass(frozen=True)
class SseEvent:
    data: str
    event: str = "message"  # the `event:` field; llama.cpp's server sends "error" for failures


class SseParser:
    def __init__(self) -> None:
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._buffer = ""
        self._data: list[str] = []
        self._event = ""

    def feed(self, chunk: bytes) -> list[SseEvent]:
        self._buffer += self._decoder.decode(chunk)
        events: list[SseEvent] = []
        while True:
            cut = _line_end(self._buffer)
            if cut is None:
                break
            line, self._buffer = self._buffer[: cut[0]], self._buffer[cut[1] :]
            event = self._line(line)
            if event is not None:
                events.append(event)
        return events

    def close(self) -> list[SseEvent]:
        """End of input: a last event without its blank line still counts (some servers)."""
        self._buffer += self._decoder.decode(b"", final=True)
        events = self.feed(b"\n") if self._buffer else []
        if self._data:
            events.append(self._dispatch())
        return events

    @property
    def pending(self) -> str:
        """Text received but not yet part of a finished line (for error messages)."""
        return self._buffer

    def _line(self, line: str) -> SseEvent | None:
        if not line:
            return self._dispatch() if self._data else None
        if line.startswith(":"):
            return None
        name, _, value = line.partition(":")
        if value.startswith(" "):
            value = value[1:]
        if name == "data":
            self._data.append(value)
        elif name == "event":
            self._event = value
        return None  # id / retry are not used by chat completions

    def _dispatch(self) -> SseEvent:
        event = SseEvent("\n".join(self._data), self._event or "message")
        self._data, self._event = [], ""
        return event


def _line_end(buffer: str) -> tuple[int, int] | None:
    """(end of line, start of the next) for the first complete line, or None. A trailing \\r
    waits for the next chunk: it may be the first half of \\r\\n."""
    for i, ch in enumerate(buffer):
        if ch == "\n":
            return i, i + 1
        if ch == "\r":
            if i + 1 == len(buffer):
                return None
            return i, i + 2 if buffer[i + 1] == "\n" else i + 1
    return None
