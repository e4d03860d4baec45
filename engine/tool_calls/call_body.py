"""One call object, streamed: {"name": "...", "arguments": {...}} (or "parameters", as Llama 3
writes it), fed a piece of text at a time.

The name is announced as soon as it is complete and the arguments key follows it; from then on
every character of the arguments object is passed on as it arrives, so a UI can show the call
forming. When a model writes the keys in another order (arguments first), nothing is streamed
and the whole call is read once its object closes: correct, only less live.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field

from engine.tool_calls.json_scan import JsonValueEnd

# Up to and including the "{" that opens the arguments object.
_HEAD = re.compile(
    r'\s*\{\s*"name"\s*:\s*"((?:[^"\\]|\\.)*)"\s*,\s*"(?:arguments|parameters)"\s*:\s*\{'
)
_MAX_HEAD_CHARS = 4096  # a name and a key; past this the call is read whole at the end


@dataclass
class BodyOutput:
    started: str | None = None  # the tool name, when it became known in this feed
    arguments: str = ""  # arguments text that arrived in this feed
    leftover: str | None = None  # text after the closing "}", once the object closed
    broken: bool = False  # the terminator arrived before the object closed


@dataclass
class CallBody:
    """Feed text with `feed`; `done` turns true when the call's object closes."""

    terminator: str | None = None  # text that may not appear inside the object (e.g. </tool_call>)
    raw: str = ""
    name: str | None = None  # set when streamed
    arguments_text: str = ""
    done: bool = False
    broken: bool = False
    _outer: JsonValueEnd = field(default_factory=JsonValueEnd)
    _args: JsonValueEnd | None = None

    @property
    def streaming(self) -> bool:
        return self.name is not None

    def feed(self, text: str) -> BodyOutput:
        out = BodyOutput()
        for i, ch in enumerate(text):
            if self.done or self.broken:
                out.leftover = text[i:]
                break
            self.raw += ch
            closed = self._outer.feed(ch)
            if self.terminator and self.raw.endswith(self.terminator) and not closed:
                self.broken = out.broken = True
                self.raw = self.raw[: -len(self.terminator)]
                out.leftover = text[i + 1 :]
                break
            if self._args is not None and not self._args.done:
                self._args.feed(ch)
                self.arguments_text += ch
                out.arguments += ch
            elif self.name is None and len(self.raw) <= _MAX_HEAD_CHARS and ch == "{":
                match = _HEAD.fullmatch(self.raw)
                if match:
                    self.name = out.started = _json_string(match.group(1))
                    self._args = JsonValueEnd()
                    self._args.feed("{")
                    self.arguments_text = out.arguments = "{"
            if closed:
                self.done = True
                out.leftover = text[i + 1 :]
                break
        return out

    def decode(self) -> tuple[str, dict | None, str]:
        """After `done`: (name, arguments, problem). arguments is None when the call cannot be
        read (then problem says why); validation against the schema is the caller's."""
        try:
            value = json.loads(self.raw)
        except ValueError as exc:
            return self.name or "", None, f"the call is not valid JSON ({exc})"
        if not isinstance(value, dict):
            return self.name or "", None, "the call is not a JSON object"
        name = value.get("name")
        if not isinstance(name, str) or not name:
            return "", None, 'the call has no "name"'
        arguments = value.get("arguments", value.get("parameters", {}))
        if isinstance(arguments, str):  # some models write the arguments as a JSON string
            try:
                arguments = json.loads(arguments) if arguments.strip() else {}
            except ValueError as exc:
                return name, None, f"the arguments are not valid JSON ({exc})"
        if not isinstance(arguments, dict):
            return (
                name,
                None,
                f"the arguments must be a JSON object, not {type(arguments).__name__}",
            )
        return name, arguments, ""


def looks_like_call_head(text: str) -> bool:
    """True when `text` starts a call object (name first, then the arguments key)."""
    return _HEAD.match(text) is not None


def _json_string(body: str) -> str:
    try:
        return json.loads(f'"{body}"')
    except ValueError:
        return body
