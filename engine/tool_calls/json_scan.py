"""Find where a JSON value ends in streamed text, one character at a time, without parsing it.

The tool-call parsers need to know when the model has closed a call's object (or the arguments
value inside it) while the text still arrives in small pieces; json.loads only answers for a
whole string. The scanner tracks string/escape state and bracket depth, which is all that
decides the end of an object or array (whether the text is valid JSON is json.loads's job once
the value is closed).
"""

from __future__ import annotations


class JsonValueEnd:
    """Feed characters of one JSON object or array; `done` turns true on its closing bracket."""

    __slots__ = ("depth", "in_string", "escaped", "done", "started")

    def __init__(self) -> None:
        self.depth = 0
        self.in_string = False
        self.escaped = False
        self.started = False
        self.done = False

    def feed(self, ch: str) -> bool:
        """Consume one character; -> True when it closed the value."""
        if self.done:
            return False
        if self.in_string:
            if self.escaped:
                self.escaped = False
            elif ch == "\\":
                self.escaped = True
            elif ch == '"':
                self.in_string = False
            return False
        if ch == '"':
            self.in_string = True
        elif ch in "{[":
            self.depth += 1
            self.started = True
        elif ch in "}]":
            self.depth -= 1
            if self.depth <= 0 and self.started:
                self.done = True
                return True
        return False
