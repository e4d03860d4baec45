"""Split a streamed answer into reasoning (inside <think>...</think>) and answer text.

Models such as Qwen3 and DeepSeek-R1 distills write their chain of thought between `<think>` and
`</think>`; some chat templates already open the tag in the prompt, so the output starts inside
it (`starts_inside=True`). Tags may arrive split across tokens, so a trailing piece of text that
could be the start of a tag is held back until the next piece decides it (the same minimal
hold-back rule as stop strings). Whitespace right after a tag (the "\\n\\n" models put there) is
dropped so neither part starts with blank lines. Tags themselves are never emitted.
"""

from __future__ import annotations

OPEN_TAG = "<think>"
CLOSE_TAG = "</think>"
REASONING = "reasoning"
ANSWER = "answer"


def prompt_opens_reasoning(prompt_text: str) -> bool:
    """True when the rendered prompt ends inside an open <think> block."""
    last_open = prompt_text.rfind(OPEN_TAG)
    return last_open != -1 and prompt_text.find(CLOSE_TAG, last_open) == -1


class ReasoningSplitter:
    __slots__ = ("_inside", "_held", "_skip_whitespace")

    def __init__(self, starts_inside: bool = False):
        self._inside = starts_inside
        self._held = ""
        self._skip_whitespace = starts_inside

    @property
    def inside(self) -> bool:
        return self._inside

    def push(self, text: str) -> list[tuple[str, str]]:
        """-> [(REASONING | ANSWER, text), ...] in stream order, empty parts omitted."""
        buffer = self._held + text
        self._held = ""
        parts: list[tuple[str, str]] = []
        while buffer:
            tag = CLOSE_TAG if self._inside else OPEN_TAG
            at = buffer.find(tag)
            if at != -1:
                self._emit(parts, buffer[:at])
                buffer = buffer[at + len(tag) :]
                self._inside = not self._inside
                self._skip_whitespace = True
                continue
            keep = _partial_tag_suffix(buffer, tag)
            self._emit(parts, buffer[: len(buffer) - keep])
            self._held = buffer[len(buffer) - keep :] if keep else ""
            break
        return parts

    def flush(self) -> list[tuple[str, str]]:
        parts: list[tuple[str, str]] = []
        held, self._held = self._held, ""
        self._emit(parts, held)
        return parts

    def _emit(self, parts: list[tuple[str, str]], text: str) -> None:
        if self._skip_whitespace:
            stripped = text.lstrip()
            if stripped:
                self._skip_whitespace = False
            text = stripped
        if not text:
            return
        kind = REASONING if self._inside else ANSWER
        if parts and parts[-1][0] == kind:
            parts[-1] = (kind, parts[-1][1] + text)
        else:
            parts.append((kind, text))


def _partial_tag_suffix(buffer: str, tag: str) -> int:
    for length in range(min(len(tag) - 1, len(buffer)), 0, -1):
        if buffer.endswith(tag[:length]):
            return length
    return 0
