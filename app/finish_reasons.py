"""How a reply ended, in words: the one place where a finish reason becomes text, for the message
header, the usage panel and the Markdown export.

Two inputs decide it. The app's own FinishReason (engine/types.py), stored as the message's
`finish_reason`, gives the category that everything else acts on (status, whether tool calls
run). For a remote reply, `usage["server_finish_reason"]` keeps the word the server itself sent
(app/backends/openai_client.py maps it): several of a server's words land in one of our
categories, and the user must see which one it was. A server that stopped a reply ("cancelled",
e.g. because it shut down) must not read as the user's Stop, and a word this app does not know
must never read as a clean end of turn.

No Qt here: the views and app/export.py call it."""

from __future__ import annotations

from collections.abc import Mapping

from engine.types import FinishReason, MessageStatus

# The engine ended a reply that kept writing the same span (engine/repetition.py): not a clean
# end, so the header says it as the usage panel does.
NOTE_REPETITION = "stopped: the model was repeating itself"
# The app's own reasons (the local engine's, and a server's once mapped), for the usage panel.
FINISH_LABELS: dict[str, str] = {
    FinishReason.STOP: "stop (end of turn)",
    FinishReason.STOP_SEQUENCE: "stop string matched",
    FinishReason.LENGTH: "length limit reached",
    FinishReason.CANCELLED: "cancelled by you",
    FinishReason.GRAMMAR_COMPLETE: "JSON complete",
    FinishReason.TOOL_CALLS: "tool calls made",
    FinishReason.ERROR: "error",
    FinishReason.REPETITION: NOTE_REPETITION,
}

# The same reasons in a sentence: why an answer with no text ended (the tool loop's note under
# it, "The model ended its turn without text (finish reason: stop — the model stopped by itself)").
FINISH_WORDS: dict[str, str] = {
    FinishReason.STOP: "the model stopped by itself",
    FinishReason.LENGTH: "the token limit was reached",
    FinishReason.TOOL_CALLS: "it ended on tool calls",
    FinishReason.STOP_SEQUENCE: "a stop sequence matched",
    FinishReason.GRAMMAR_COMPLETE: "the JSON value was complete",
    FinishReason.REPETITION: "the model was repeating itself, so the engine stopped it",
    FinishReason.CANCELLED: "you stopped it",
    FinishReason.ERROR: "it failed",
}

# A server's words that the client maps to a category of ours without losing anything: the
# category's own label says it all.
PLAIN_SERVER_WORDS: dict[str, FinishReason] = {
    "stop": FinishReason.STOP,
    "eos": FinishReason.STOP,  # some servers (TGI) say eos_token
    "eos_token": FinishReason.STOP,
    "stop_sequence": FinishReason.STOP_SEQUENCE,
    "length": FinishReason.LENGTH,
    "max_tokens": FinishReason.LENGTH,
    "tool_calls": FinishReason.TOOL_CALLS,
    "function_call": FinishReason.TOOL_CALLS,
}
# A server's words that end a reply badly: the client makes each an error (the partial reply is
# kept, no tool call runs), and these say what happened.
SERVER_ENDS: dict[str, str] = {
    "cancelled": "cut short by the server, which said 'cancelled'",
    "error": "the server reported an error",
    "content_filter": "stopped by the server's content filter",
}
NO_SERVER_REASON = "ended without a finish reason from the server"
TOOL_CALLS_NOT_RUN = "tool calls, none of which could be run"

# The message header's words for a reply that did not end cleanly (a clean end shows nothing);
# the Markdown export uses the same words without the mark in front.
NOTE_STREAMING = "generating…"
NOTE_CANCELLED = "cancelled — partial reply kept"
NOTE_FAILED = "failed"
NOTE_INTERRUPTED = "interrupted (the app closed while this reply was streaming)"
NOTE_LENGTH = "length limit reached — the reply may be cut short"
MARKS: dict[str, str] = {
    MessageStatus.CANCELLED: "■ ",
    MessageStatus.ERROR: "⚠ ",
    MessageStatus.INTERRUPTED: "⚠ ",
}


def server_word(usage: Mapping | None) -> str | None:
    """The finish_reason a remote server sent ('' when it sent none); None for a local reply or
    a reply stored before the app kept the word."""
    word = usage.get("server_finish_reason") if isinstance(usage, Mapping) else None
    return word if isinstance(word, str) else None


def unknown_server_word(word: str) -> str:
    return f"ended: server said {word!r}"


def finish_label(finish_reason: str | None, usage: Mapping | None = None) -> str:
    """The usage panel's "Finish" text: always says something, never a clean end for a reply
    that did not end cleanly."""
    word = server_word(usage)
    if word is not None:
        said = _server_label(finish_reason, word)
        if said is not None:
            return said
    if finish_reason is None or finish_reason == "":
        return "—"
    label = FINISH_LABELS.get(finish_reason)
    if label is None:  # a reason from an imported chat or a later version: as it is
        return f"ended: {finish_reason!r} (a reason this app does not know)"
    return label


def _server_label(finish_reason: str | None, word: str) -> str | None:
    """What the server's word adds to our category, or None when the category says it all."""
    if finish_reason == FinishReason.CANCELLED:
        return None  # the user's Stop, whatever the server had said before
    if word in SERVER_ENDS:
        return SERVER_ENDS[word]
    if word == "":
        return NO_SERVER_REASON if finish_reason != FinishReason.ERROR else None
    if word in PLAIN_SERVER_WORDS:
        if PLAIN_SERVER_WORDS[word] == FinishReason.TOOL_CALLS and finish_reason == (
            FinishReason.STOP
        ):
            return TOOL_CALLS_NOT_RUN
        return None
    return unknown_server_word(word)


def end_note(status: str | None, finish_reason: str | None, usage: Mapping | None = None) -> str:
    """How a stored reply ended, in words for its Markdown heading; '' for a clean end."""
    if status == MessageStatus.STREAMING:
        return NOTE_STREAMING
    if status == MessageStatus.INTERRUPTED:
        return NOTE_INTERRUPTED
    if status == MessageStatus.CANCELLED:
        return NOTE_CANCELLED
    label = finish_label(finish_reason, usage)
    if status == MessageStatus.ERROR:
        plain = label in ("—", FINISH_LABELS[FinishReason.ERROR])
        return NOTE_FAILED if plain else f"{NOTE_FAILED}: {label}"
    if status not in (None, MessageStatus.COMPLETE):
        return str(status)  # a status from an imported chat or a later version, as it is
    if finish_reason == FinishReason.LENGTH:
        return NOTE_LENGTH
    if finish_reason == FinishReason.REPETITION:
        return NOTE_REPETITION
    if label == "—" or label in FINISH_LABELS.values():
        return ""
    return label


def header_note(status: str | None, finish_reason: str | None, usage: Mapping | None = None) -> str:
    """The message header's note: end_note with a mark that says what kind of end it was."""
    note = end_note(status, finish_reason, usage)
    if not note or status == MessageStatus.STREAMING:
        return note
    if status == MessageStatus.COMPLETE and finish_reason == FinishReason.LENGTH:
        return "✂ " + note
    return MARKS.get(str(status), "⚠ ") + note
