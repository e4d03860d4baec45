"""Visible, reversible compaction of a long chat: the prompt-side rules, no Qt, no model.

A chat that nears the context limit can have its oldest turns replaced by a summary the loaded
model writes itself. The originals stay in the app's store; what changes is only the prompt the
model sees: the covered messages are left out and the summary is given as a system-side note.
This module holds the pure parts of that, so the app, the tests and a receipt reader agree on
them:

- when a chat is "near the limit" (`near_limit`: NEAR_LIMIT of the room the prompt may take);
- which messages to summarise (`choose_covered`: whole turns, oldest first, enough to bring the
  prompt down to TARGET of that room, never the latest turn);
- the request that asks the model for the summary (`summary_request_messages`);
- the prompt built on a compaction (`with_summary_note`: the note beside the system prompt);
- the receipt section of a reply built on one (`receipt_section`) and what a replay says when
  the summary was edited since (`edited_note`).

Why 85%: the check runs after a reply, on the exact context use the engine reported
(prompt + reply). At 85% of the prompt's room the next user message and one more turn still
fit as they are, so the offer comes before drop-oldest would silently cut turns, and the user
has a turn or two to answer it; much earlier would offer summaries of chats that never grow.
Why down to 50%: one summary then buys about as many turns again as the chat had before it
neared the limit, instead of an offer after every reply.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass

from engine.context_fit import reply_reserve

LONG_CHAT_MODES = ("drop_oldest", "offer", "auto")  # Settings: "When a chat is too long"
DEFAULT_LONG_CHAT_MODE = "offer"
NEAR_LIMIT = 0.85
TARGET = 0.50
# The summary's own length cap: a few paragraphs, small next to what it replaces; an eighth of
# a small context (a 1,024-token window gets 128), never under 64 tokens.
SUMMARY_MAX_TOKENS = 320
SUMMARY_MIN_TOKENS = 64
# Tokens the summary request's instructions and the transcript's labels take beyond the covered
# messages' own text (measured: about 90 with SmolLM2's ChatML template); rounded up.
SUMMARY_OVERHEAD_TOKENS = 160

SUMMARY_INSTRUCTIONS = (
    "You summarise conversations. Write a concise summary of the conversation the user gives "
    "you: the facts, names, numbers, decisions and open questions that a reader needs to go on "
    'with it. Write in the third person ("The user asked ..."), no preamble, no headings.'
)


@dataclass(frozen=True)
class ChatItem:
    """One message of the visible branch as the planner sees it: id, role, text."""

    id: int
    role: str
    content: str


def summary_max_tokens(n_ctx: int) -> int:
    return max(SUMMARY_MIN_TOKENS, min(SUMMARY_MAX_TOKENS, int(n_ctx) // 8))


def prompt_budget(n_ctx: int, max_new_tokens: int | None) -> int:
    """Tokens the prompt may take: the context minus the room kept for the reply (the same room
    engine.context_fit.fit_chat keeps, so "near the limit" means near where turns get dropped)."""
    return max(0, int(n_ctx) - reply_reserve(int(n_ctx), max_new_tokens))


def near_limit(prompt_tokens: int, n_ctx: int, max_new_tokens: int | None) -> bool:
    budget = prompt_budget(n_ctx, max_new_tokens)
    return budget > 0 and prompt_tokens >= NEAR_LIMIT * budget


def choose_covered(
    items: Sequence[ChatItem],
    prompt_tokens: int,
    n_ctx: int,
    max_new_tokens: int | None,
    fixed_chars: int = 0,
) -> list[int]:
    """Ids of the oldest whole turns to summarise, oldest first; [] when there is nothing to
    summarise (a chat of one turn).

    `prompt_tokens` is the engine's exact count for the prompt these items make (the last
    reply's context use); each message's share of it is estimated from its characters, as the
    GUI thread has no tokenizer; `fixed_chars` are the characters always sent (the system
    prompt, an earlier summary's note), part of the count but never covered. A turn is a user message with everything after it up to the
    next user message. Turns are taken until the rest is estimated at TARGET of the budget, but
    never the latest turn, and never more than the summary request itself can hold."""
    budget = prompt_budget(n_ctx, max_new_tokens)
    total_chars = fixed_chars + sum(len(i.content) for i in items)
    if not items or total_chars == 0 or budget <= 0:
        return []
    per_char = prompt_tokens / total_chars
    starts = [k for k, item in enumerate(items) if item.role == "user"]
    if len(starts) < 2:
        return []
    # The summary request holds the covered text plus instructions, and keeps room for the
    # summary: past that it would be refused.
    summary_tokens = summary_max_tokens(n_ctx)
    request_room = int(n_ctx) - summary_tokens - SUMMARY_OVERHEAD_TOKENS
    target = TARGET * budget
    covered_end = 0
    for start in starts[1:]:  # cutting before the k-th turn start covers everything above it
        covered_tokens = per_char * sum(len(i.content) for i in items[:start])
        if covered_tokens > request_room:
            break
        covered_end = start
        if prompt_tokens - covered_tokens + summary_tokens <= target:
            break
    return [i.id for i in items[:covered_end]]


def transcript(items: Sequence[ChatItem]) -> str:
    """The covered messages as plain text, one labelled paragraph each."""
    labels = {"user": "User", "assistant": "Assistant", "tool": "Tool result"}
    return "\n\n".join(
        f"{labels.get(i.role, i.role.capitalize())}: {i.content.strip()}"
        for i in items
        if i.content.strip()
    )


def summary_request_messages(
    covered: Sequence[ChatItem], previous_summary: str | None = None
) -> list[dict]:
    """The chat the loaded model answers with the summary: instructions as the system prompt,
    the transcript (after an earlier summary it extends, if any) as the user's message."""
    parts = []
    if previous_summary:
        parts.append(f"Summary of what came before:\n{previous_summary.strip()}")
    parts.append(f"Conversation:\n{transcript(covered)}")
    parts.append("Write the summary now.")
    return [
        {"role": "system", "content": SUMMARY_INSTRUCTIONS},
        {"role": "user", "content": "\n\n".join(parts)},
    ]


def summary_note(summary: str, n_messages: int) -> str:
    """How the model sees a summary in the prompt: a system-side note that says what it is."""
    noun = "message" if n_messages == 1 else "messages"
    return (
        f"Summary of the {n_messages} earlier {noun} of this conversation, which are left out "
        f"here:\n{summary.strip()}"
    )


def with_summary_note(messages: Sequence[dict], summary: str, n_covered: int) -> list[dict]:
    """The request's messages (the covered ones already left out) with the summary's note:
    appended to the leading system prompt, or as a system message of its own first. One system
    message matters: several templates (Gemma's, Llama 2's) accept a system message only first,
    and the context fit keeps leading system messages, so the note is never dropped."""
    kept = [dict(m) for m in messages]
    note = summary_note(summary, n_covered)
    if kept and kept[0].get("role") == "system":
        kept[0]["content"] = f"{kept[0].get('content', '')}\n\n{note}"
        return kept
    return [{"role": "system", "content": note}, *kept]


def summary_sha256(summary: str) -> str:
    return hashlib.sha256(summary.encode("utf-8")).hexdigest()


def receipt_section(compaction_id: int, covered: Sequence[int], summary: str) -> dict:
    """What a reply's receipt records about the compaction its prompt was built on."""
    return {
        "compaction_id": int(compaction_id),
        "covered_message_ids": [int(i) for i in covered],
        "summary": summary,
        "summary_sha256": summary_sha256(summary),
    }


def edited_note(section: dict | None, summary_now: str | None) -> str | None:
    """What a replay says about the summary a reply was built on: nothing when it is unchanged
    (or the reply had none); otherwise that the replay used the recorded text, and why."""
    if not isinstance(section, dict):
        return None
    recorded = section.get("summary_sha256")
    if summary_now is None:
        return (
            "the summary this reply was built on is no longer used by the chat (its originals "
            "were restored, or a newer summary replaced it); the replay used the summary "
            "recorded in the receipt"
        )
    if summary_sha256(summary_now) != recorded:
        return (
            "the summary this reply was built on was edited since; the replay used the summary "
            "as recorded in the receipt, not the edited text"
        )
    return None
