"""When generation ends, and what text may be released before it does.

Two independent checks, in this order for every sampled token:

1. End-of-generation ids (the generation loop's `eog_ids`): the token id is checked before it
   is detokenized, so an end-of-generation token never reaches the output.
2. Stop strings (`StopStringMatcher`): matched on the detokenized text stream, across token
   boundaries. Text is held back only while it could still be the start of a stop string:
   exactly the longest suffix of the unreleased text that is a proper prefix of some stop
   string. It is released the moment it stops being one. On a match, the text before the match
   is released and nothing of the stop string or after it ever is. If no stop string ever
   matches, the concatenated output equals the input text byte for byte.

Finish reason precedence (`decide_finish_reason`) when one step satisfies several conditions:

    error > tool_calls > stop > stop_sequence > grammar_complete > repetition > length > cancelled

(tool_calls is the end of a reply that ended on tool calls: it refines stop or grammar_complete,
so it ranks above them.)

A reason describing what the step produced (an end-of-generation token, a stop string, a
complete JSON value) beats a budget running out on that same step, and the cancel flag is only
observed between steps, so a cancel that raced with a natural end reports the natural end.
"""

from __future__ import annotations

from collections.abc import Iterable

from engine.events import (
    FINISH_CANCELLED,
    FINISH_ERROR,
    FINISH_GRAMMAR_COMPLETE,
    FINISH_LENGTH,
    FINISH_REPETITION,
    FINISH_STOP,
    FINISH_STOP_SEQUENCE,
    FINISH_TOOL_CALLS,
)
from engine.types import FinishReason

FINISH_PRECEDENCE = (
    FINISH_ERROR,
    FINISH_TOOL_CALLS,
    FINISH_STOP,
    FINISH_STOP_SEQUENCE,
    FINISH_GRAMMAR_COMPLETE,
    FINISH_REPETITION,  # a loop cut short (engine/repetition.py): what was written is kept
    FINISH_LENGTH,
    FINISH_CANCELLED,
)


def decide_finish_reason(reasons: Iterable[str]) -> FinishReason | None:
    """The highest-precedence reason among those that hold on one step (None if none)."""
    present = set(reasons)
    unknown = present.difference(FINISH_PRECEDENCE)
    if unknown:
        raise ValueError(f"unknown finish reasons {sorted(unknown)}; known: {FINISH_PRECEDENCE}")
    for reason in FINISH_PRECEDENCE:
        if reason in present:
            return reason
    return None


def longest_partial_suffix(buffer: str, tags: Iterable[str]) -> int:
    """Length of the longest suffix of `buffer` that is a proper prefix of one of `tags`: what a
    streaming matcher must hold back (stop strings here, tool-call tags in engine/tool_calls)."""
    longest = 0
    for tag in tags:
        for length in range(min(len(tag) - 1, len(buffer)), longest, -1):
            if buffer.endswith(tag[:length]):
                longest = length
                break
    return longest


class StopStringMatcher:
    """Feed text pieces with `push`; it returns what is safe to release and whether a stop string
    matched. After a match, further pushes are refused (the caller ends generation)."""

    __slots__ = ("_stops", "_held", "_matched")

    def __init__(self, stop_strings):
        self._stops = tuple(s for s in stop_strings if s)
        self._held = ""
        self._matched: str | None = None

    @property
    def matched(self) -> str | None:
        """The stop string that matched, if any."""
        return self._matched

    @property
    def held(self) -> str:
        """Text received but not yet released (a possible start of a stop string)."""
        return self._held

    def push(self, text: str) -> tuple[str, bool]:
        """-> (text to release now, whether a stop string matched)."""
        if self._matched is not None:
            raise RuntimeError("a stop string already matched; generation should have ended")
        if not self._stops:
            return text, False
        buffer = self._held + text
        match_at, match = self._earliest_match(buffer)
        if match is not None:
            self._matched, self._held = match, ""
            return buffer[:match_at], True
        keep = longest_partial_suffix(buffer, self._stops)
        self._held = buffer[len(buffer) - keep :] if keep else ""
        return buffer[: len(buffer) - keep], False

    def flush(self) -> str:
        """At the end of generation (no match), release whatever was held back."""
        released, self._held = self._held, ""
        return released if self._matched is None else ""

    def _earliest_match(self, buffer: str) -> tuple[int, str | None]:
        best_at, best = len(buffer) + 1, None
        for stop in self._stops:
            at = buffer.find(stop)
            if at != -1 and at < best_at:
                best_at, best = at, stop
        return best_at, best
