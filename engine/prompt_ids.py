"""Chat messages -> prompt token ids, where only the template's own special tokens are special.

The rendered prompt mixes the template's text (role markers such as "<|im_start|>user") with the
messages' text. Tokenizing all of it with special-token parsing on would let anyone who can put
text in a message (a user, a pasted document, a tool result) write "<|im_start|>system ..." and
get real control tokens: role spoofing. So the messages' character spans in the rendered prompt
are found and tokenized with control tokens not parsed (Tokenizer.encode's `literal_spans`),
as llama.cpp tokenizes text with parse_special=false.

The spans are found without changing what the template sees as far as possible: the template is
rendered a second time with each message's text wrapped in two Unicode noncharacters (inside its
leading/trailing whitespace, so `| trim` still trims the same), and the wrapped render, markers
removed, must equal the real one; the markers then give the spans. A template that transforms
the text in a way the markers disturb (Qwen3 splits assistant text at "</think>") fails that
check; then only the messages that hold control-token text are wrapped, and if that fails too,
such a message's text is searched for in the prompt. A message with control-token text that
cannot be found is refused (ChatTemplateError) rather than tokenized with its control tokens.

Ids for a chat with no special-token text in its messages are exactly what tokenizing the whole
prompt gives: the spans only change how control-token text inside them is cut.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from engine.errors import ChatTemplateError, TemplateCancelled

log = logging.getLogger(__name__)

# Unicode noncharacters: never assigned, so no real text or template is expected to hold them.
OPEN, CLOSE = "\ufdd0", "\ufdd1"

Span = tuple[int, int]


def chat_prompt_ids(
    template,
    tokenizer,
    messages: Sequence[Mapping[str, Any]],
    cancel: Any = None,
    extra: Mapping[str, Any] | None = None,
) -> tuple[list[int], str]:
    """-> (token ids with BOS as the tokenizer adds it, the prompt text). `cancel` (the request's
    CancelToken) stops a slow template render with TemplateCancelled; `extra` are more template
    variables (`tools`)."""

    def has_control_text(text: str) -> bool:
        literal = [(0, len(text))]
        plain = tokenizer.encode(text, add_special=False, literal_spans=literal)
        return plain != tokenizer.encode(text, add_special=False)

    text, spans = render_with_message_spans(template, messages, has_control_text, cancel, extra)
    ids = tokenizer.encode(text, add_special=True, literal_spans=spans)
    return list(ids), text


def render_with_message_spans(
    template,
    messages: Sequence[Mapping[str, Any]],
    has_control_text: Callable[[str], bool],
    cancel: Any = None,
    extra: Mapping[str, Any] | None = None,
) -> tuple[str, list[Span]]:
    """The prompt text and (start, end) character spans in it that came from message text:
    every message's where the template keeps the text intact, else at least every message whose
    text `has_control_text`."""
    extra = dict(extra or {})
    text = template.render(messages, add_generation_prompt=True, cancel=cancel, **extra)
    if not any(_message_texts(m) for m in messages):
        return text, []
    spans = _marked_spans(template, messages, text, lambda _: True, cancel, extra)
    if spans is not None:
        return text, spans
    suspicious = {
        i for i, m in enumerate(messages) if any(map(has_control_text, _message_texts(m)))
    }
    if not suspicious:
        return text, []  # nothing in the messages would be parsed as a control token
    spans = _marked_spans(template, messages, text, lambda i: i in suspicious, cancel, extra)
    if spans is not None:
        return text, spans
    log.info("chat template %r changes message text; locating messages by search", template)
    spans = []
    for i in sorted(suspicious):
        for message_text in _message_texts(messages[i]):
            found = _occurrences(text, message_text.strip())
            if not found and has_control_text(message_text):
                raise ChatTemplateError(
                    f"the chat template {template.name!r} rewrites the text of message {i + 1}, "
                    "which contains special-token text; it cannot be kept as plain text, so the "
                    "conversation is refused (remove the special-token text from that message)"
                )
            spans += found
    return text, sorted(spans)


def _marked_spans(
    template,
    messages,
    text: str,
    wrap: Callable[[int], bool],
    cancel: Any = None,
    extra: Mapping[str, Any] | None = None,
) -> list[Span] | None:
    """Spans from a render with the chosen messages' text wrapped in markers, or None if that
    render, markers removed, is not exactly `text`."""
    texts = [t for m in messages for t in _message_texts(m)]
    if any(OPEN in t or CLOSE in t for t in [text, *texts]):
        return None
    marked_messages = [_marked(m) if wrap(i) else m for i, m in enumerate(messages)]
    try:
        marked = template.render(
            marked_messages, add_generation_prompt=True, cancel=cancel, **(extra or {})
        )
    except TemplateCancelled:
        raise
    except ChatTemplateError:
        return None  # the template reacts to the markers
    unmarked, spans = _strip_markers(marked)
    return spans if unmarked == text else None


def _message_texts(message: Any) -> list[str]:
    """The text a message carries: its content string, or the text of its content parts."""
    if not isinstance(message, Mapping):
        return []
    content = message.get("content")
    if isinstance(content, str):
        return [content]
    if isinstance(content, Sequence) and not isinstance(content, (str, bytes)):
        return [
            part["text"]
            for part in content
            if isinstance(part, Mapping) and isinstance(part.get("text"), str)
        ]
    return []


def _marked(message: Any) -> Any:
    if not isinstance(message, Mapping):
        return message
    content = message.get("content")
    if isinstance(content, str):
        return {**message, "content": _wrap(content)}
    if isinstance(content, Sequence) and not isinstance(content, (str, bytes)):
        parts = [
            {**part, "text": _wrap(part["text"])}
            if isinstance(part, Mapping) and isinstance(part.get("text"), str)
            else part
            for part in content
        ]
        return {**message, "content": parts}
    return message


def _wrap(text: str) -> str:
    core = text.strip()
    if not core:
        return text
    start = text.index(core)
    return text[:start] + OPEN + core + CLOSE + text[start + len(core) :]


def _strip_markers(marked: str) -> tuple[str, list[Span] | None]:
    """Text without the markers and the spans they enclosed (None if they do not pair up)."""
    out: list[str] = []
    spans: list[Span] = []
    opened: list[int] = []
    length = 0
    pos = 0
    while True:
        cut = min(
            (i for i in (marked.find(OPEN, pos), marked.find(CLOSE, pos)) if i >= 0), default=-1
        )
        if cut < 0:
            out.append(marked[pos:])
            break
        out.append(marked[pos:cut])
        length += cut - pos
        if marked[cut] == OPEN:
            opened.append(length)
        elif opened:
            spans.append((opened.pop(), length))
        else:
            return "".join(out), None
        pos = cut + 1
    if opened:
        return "".join(out), None
    return "".join(out), sorted(spans)


def _occurrences(text: str, needle: str) -> list[Span]:
    if not needle:
        return []
    spans = []
    at = text.find(needle)
    while at >= 0:
        spans.append((at, at + len(needle)))
        at = text.find(needle, at + 1)
    return spans
