"""Calls written as a bare JSON object: Llama 3.1+ (`{"name": ..., "parameters": {...}}` as the
whole reply, several separated by ";") and the generic fallback for templates with no tool
format of their own (the same object, "arguments" or "parameters", on a line of its own). An
object may sit in a Markdown code fence (```json ... ```), as small models often write it
(Qwen2.5-Coder does, despite its template's <tool_call> tags).

An object at the start of a line is held back until it is known to be a call: its name and an
arguments key appear in that order (then it streams as a call), or it closes, and is a call if
json.loads finds a "name" in it and no key a call does not have (arguments may be left out for a
tool without parameters). Any other object (the user asked for JSON, say) is released as text
unchanged, with its fence.
"""

from __future__ import annotations

import json

from engine.tool_calls.call_body import CallBody
from engine.tool_calls.items import CallArguments, CallOpened, Item, Text, cut_off, feed_body

_FENCES = ("```json", "```JSON", "```")
_MAX_FENCE_LINE = 12


class JsonLinesParser:
    def __init__(self, separators: str = ";") -> None:
        self._separators = separators  # what may stand between two calls
        self._line_start = True
        self._body: CallBody | None = None
        self._is_call = False  # the held object showed a call's head
        self._fence = ""  # a held fence line ("```json\n") in front of the object
        self._fence_line = ""  # a line starting with ` being read
        self._after_call = False
        self._closing_fence = False  # the call was fenced: drop the closing ```
        self._after_held = ""  # part of that closing fence
        self._key = 0

    def push(self, text: str) -> list[Item]:
        items: list[Item] = []
        buffer = text
        while buffer:
            if self._body is not None:
                buffer = self._feed_candidate(buffer, items)
            elif self._after_call:
                buffer = self._skip_after_call(buffer)
            elif self._fence_line:
                buffer = self._read_fence_line(buffer, items)
            elif self._fence:
                stripped = buffer.lstrip()  # any whitespace, as at a line start (_text)
                if not stripped:
                    self._fence += buffer
                    buffer = ""
                elif stripped[0] == "{":
                    self._fence += buffer[: len(buffer) - len(stripped)]
                    self._body = CallBody()
                    buffer = stripped
                else:  # a code block that is not a call
                    items.append(Text(self._fence))
                    self._fence = ""
                    self._line_start = True
            else:
                buffer = self._text(buffer, items)
        return items

    def _text(self, buffer: str, items: list[Item]) -> str:
        out: list[str] = []
        for i, ch in enumerate(buffer):
            if self._line_start and ch in "{`":
                if out:
                    items.append(Text("".join(out)))
                if ch == "{":
                    self._body = CallBody()
                    return buffer[i:]
                self._fence_line = "`"
                return buffer[i + 1 :]
            out.append(ch)
            if ch == "\n":
                self._line_start = True
            elif not ch.isspace():
                self._line_start = False
        if out:
            items.append(Text("".join(out)))
        return ""

    def _read_fence_line(self, buffer: str, items: list[Item]) -> str:
        end = buffer.find("\n")
        if end == -1 and len(self._fence_line) + len(buffer) <= _MAX_FENCE_LINE:
            self._fence_line += buffer
            return ""
        line = self._fence_line + (buffer[: end + 1] if end != -1 else buffer)
        rest = buffer[end + 1 :] if end != -1 else ""
        self._fence_line = ""
        if line.rstrip() in _FENCES and line.endswith("\n"):
            self._fence = line
        else:
            items.append(Text(line))
            self._line_start = line.endswith("\n")
        return rest

    def _skip_after_call(self, buffer: str) -> str:
        """After a call: drop separators and a fenced call's closing ```, keep the whitespace
        (the stream decides whether it is layout or text) and read on as text."""
        buffer, self._after_held = self._after_held + buffer, ""
        skip = " \t\r\n" + self._separators
        if self._closing_fence:
            stripped = buffer.lstrip(skip)
            if not stripped or (len(stripped) < 3 and "```".startswith(stripped)):
                self._after_held = buffer  # wait for the whole closing fence
                return ""
            if stripped.startswith("```"):
                buffer = stripped[3:]
            self._closing_fence = False
        stripped = buffer.lstrip(skip)
        if not stripped:
            self._after_held = buffer
            return ""
        lead = buffer[: len(buffer) - len(stripped)]
        self._after_call = False
        self._line_start = True
        return "".join(c for c in lead if c not in self._separators) + stripped

    def _feed_candidate(self, buffer: str, items: list[Item]) -> str:
        body = self._body
        assert body is not None
        local: list[Item] = []
        rest = feed_body(body, self._key, buffer, local)
        if not self._is_call and body.streaming:
            self._is_call = True
        if self._is_call:
            items.extend(local)
        if rest is None:
            return ""
        self._body = None
        if self._is_call or _decodes_as_call(body):
            if not self._is_call:
                items.extend(i for i in local if not isinstance(i, (CallOpened, CallArguments)))
            self._key += 1
            self._after_call = True
            self._closing_fence = bool(self._fence)
        else:
            items.append(Text(self._fence + body.raw))
            self._line_start = False
        self._fence = ""
        self._is_call = False
        return rest

    def flush(self) -> list[Item]:
        items: list[Item] = []
        if self._body is not None:
            if self._is_call:
                items.append(cut_off(self._body, self._key))
            else:
                items.append(Text(self._fence + self._body.raw))
            self._body = None
        elif self._fence or self._fence_line:
            items.append(Text(self._fence + self._fence_line))
        elif self._after_held and not self._closing_fence:
            items.append(Text(self._after_held))
        self._fence = self._fence_line = self._after_held = ""
        return items


# The keys a call object may hold ("type": "function" and an "id" as Llama 3.2 and some
# fine-tunes add them). An object with any other key is the answer's own JSON, not a call: a
# reply of {"name": "Bob", "age": 30} asked for by the user stays text.
_CALL_KEYS = frozenset({"name", "arguments", "parameters", "type", "id"})


def _decodes_as_call(body: CallBody) -> bool:
    name, arguments, _ = body.decode()
    if not name or arguments is None:
        return False
    return set(json.loads(body.raw)) <= _CALL_KEYS  # decode read it as an object
