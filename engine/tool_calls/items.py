"""What a format parser reports while it reads the reply; engine/tool_calls/stream.py turns these
into events (ids, schema validation). `key` numbers the calls of one reply from 0."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from engine.stopping import longest_partial_suffix
from engine.tool_calls.call_body import CallBody


@dataclass(frozen=True)
class Text:
    text: str


@dataclass(frozen=True)
class CallOpened:
    key: int
    name: str


@dataclass(frozen=True)
class CallArguments:
    key: int
    text: str


@dataclass(frozen=True)
class CallClosed:
    key: int
    body: CallBody


@dataclass(frozen=True)
class CallBroken:
    key: int
    name: str
    raw: str
    problem: str


Item = Text | CallOpened | CallArguments | CallClosed | CallBroken


class FormatParser(Protocol):
    def push(self, text: str) -> list[Item]: ...

    def flush(self) -> list[Item]: ...


def feed_body(body: CallBody, key: int, text: str, items: list[Item]) -> str | None:
    """Feed `text` to a call body, appending what it reports; -> the text after the call once it
    closed or broke (None while the call is still open)."""
    out = body.feed(text)
    if out.started is not None:
        items.append(CallOpened(key, out.started))
    if out.arguments:
        items.append(CallArguments(key, out.arguments))
    if out.broken:
        items.append(
            CallBroken(
                key, body.name or "", body.raw, "the call ended before its JSON object closed"
            )
        )
        return out.leftover or ""
    if body.done:
        items.append(CallClosed(key, body))
        return out.leftover or ""
    return None


def cut_off(body: CallBody, key: int) -> CallBroken:
    return CallBroken(key, body.name or "", body.raw, "the reply ended in the middle of the call")


def split_at_tag(buffer: str, tag: str) -> tuple[str, str | None, str]:
    """Streamed text up to a call's opening `tag`: (text to release, what follows the tag or
    None when the tag is not in `buffer`, text to hold back because it may be the tag's start)."""
    at = buffer.find(tag)
    if at != -1:
        return buffer[:at], buffer[at + len(tag) :], ""
    keep = longest_partial_suffix(buffer, (tag,))
    return buffer[: len(buffer) - keep], None, buffer[len(buffer) - keep :]
