"""Split a gpt-oss ("harmony" format) reply into reasoning and answer text.

gpt-oss writes each part of its reply as a message on a channel:

    <|channel|>analysis<|message|>...chain of thought...<|end|>
    <|start|>assistant<|channel|>final<|message|>...the answer...<|return|>

The markers are special tokens that decoding still renders (llama.cpp's rule for <|channel|>,
<|message|>, <|start|>, <|constrain|>, and for <|end|> once <|return|> and <|call|> end the
generation; engine/tokenizer/metadata.py follows it), so they arrive in the text stream. When the
vocabulary is harmony's, the text of the `analysis` channel becomes reasoning and every other
channel's (final, commentary) answer text;
the headers between <|start|> and <|message|> (role, channel, recipient, content type) and
anything between <|end|> and the next <|start|> are dropped. The prompt's generation header
(<|start|>assistant) leaves the reply in a header; a prompt that ends after <|message|> (a
template that opens the final channel itself) starts inside that channel's message.
"""

from __future__ import annotations

from engine.reasoning import ANSWER, REASONING

START, CHANNEL, MESSAGE, END = "<|start|>", "<|channel|>", "<|message|>", "<|end|>"
CONSTRAIN = "<|constrain|>"
MARKERS = (START, CHANNEL, MESSAGE, END, CONSTRAIN)
REASONING_CHANNEL = "analysis"
# The loop's states: in a message header, in a message body of some kind, between messages.
_HEADER, _BODY, _BETWEEN = "header", "body", "between"


def is_harmony_vocabulary(tokenizer) -> bool:
    """Whether the vocabulary has harmony's <|channel|> and <|message|> tokens (o200k_harmony:
    gpt-oss), so replies come as channel messages."""
    return tokenizer.token_id(CHANNEL) is not None and tokenizer.token_id(MESSAGE) is not None


def prompt_channel(prompt_text: str) -> str | None:
    """The channel the prompt leaves open (its text ends after a header's <|message|>), else
    None: the reply starts in a header or between messages."""
    at = prompt_text.rfind(MESSAGE)
    if at == -1 or prompt_text[at + len(MESSAGE) :].strip():
        return None
    header = prompt_text[:at]
    opened = header.rfind(CHANNEL)
    if opened == -1 or header.rfind(START) > opened or header.rfind(END) > opened:
        return ""  # a message without a channel: answer text
    return _channel_name(header[opened + len(CHANNEL) :])


def _channel_name(header: str) -> str:
    """'analysis' from 'analysis', 'commentary to=functions.f <|constrain|>json', ..."""
    words = header.replace(CONSTRAIN, " ").split()
    return words[0] if words else ""


class HarmonySplitter:
    """push(text) / flush() -> [(REASONING | ANSWER, text), ...], as ReasoningSplitter."""

    __slots__ = ("_state", "_kind", "_header", "_held")

    def __init__(self, open_channel: str | None = None):
        self._state = _HEADER if open_channel is None else _BODY
        self._kind = _kind_of(open_channel or "")
        self._header = ""
        self._held = ""

    def push(self, text: str) -> list[tuple[str, str]]:
        buffer = self._held + text
        self._held = ""
        parts: list[tuple[str, str]] = []
        while buffer:
            at, marker = _first_marker(buffer)
            if marker is None:
                keep = _partial_marker_suffix(buffer)
                self._take(parts, buffer[: len(buffer) - keep])
                self._held = buffer[len(buffer) - keep :]
                break
            self._take(parts, buffer[:at])
            buffer = buffer[at + len(marker) :]
            self._on_marker(marker)
        return parts

    def flush(self) -> list[tuple[str, str]]:
        parts: list[tuple[str, str]] = []
        held, self._held = self._held, ""
        self._take(parts, held)
        return parts

    def _on_marker(self, marker: str) -> None:
        if marker == MESSAGE and self._state == _HEADER:
            channel = self._header.rpartition(CHANNEL)
            self._kind = _kind_of(_channel_name(channel[2]) if channel[1] else "")
            self._state, self._header = _BODY, ""
        elif marker == END:
            self._state = _BETWEEN
        elif marker in (START, CHANNEL):
            if self._state != _HEADER:
                self._state, self._header = _HEADER, ""
            self._header += marker
        elif self._state == _HEADER:  # <|constrain|> inside a header
            self._header += marker

    def _take(self, parts: list[tuple[str, str]], text: str) -> None:
        if not text:
            return
        if self._state == _HEADER:
            self._header += text
            return
        if self._state == _BETWEEN:
            return
        if parts and parts[-1][0] == self._kind:
            parts[-1] = (self._kind, parts[-1][1] + text)
        else:
            parts.append((self._kind, text))


def _kind_of(channel: str) -> str:
    return REASONING if channel == REASONING_CHANNEL else ANSWER


def _first_marker(buffer: str) -> tuple[int, str | None]:
    best, found = len(buffer), None
    for marker in MARKERS:
        at = buffer.find(marker)
        if at != -1 and at < best:
            best, found = at, marker
    return best, found


def _partial_marker_suffix(buffer: str) -> int:
    """Length of the longest buffer tail that could still become a marker."""
    for length in range(min(max(map(len, MARKERS)) - 1, len(buffer)), 0, -1):
        tail = buffer[-length:]
        if any(marker.startswith(tail) for marker in MARKERS):
            return length
    return 0
