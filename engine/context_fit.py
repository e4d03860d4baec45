"""Fit a chat conversation into the context window by a named policy, reporting what was dropped.

Policies:
- "drop_oldest": keep the system prompt(s) at the start and the latest user turn; drop whole
  turns from the oldest on (a turn is a user message with the replies that follow it, so the
  conversation never starts with an orphaned assistant reply) until the rendered prompt plus the
  room reserved for the reply fits. If even the system prompt and the last turn do not fit, the
  request is refused with ContextOverflowError.
- "refuse": send everything or nothing; too long -> ContextOverflowError.

Token counts are exact: the candidate conversation is rendered with the model's chat template
and tokenized, as the generation loop will do (engine.generate.build_prompt_ids). The number of
turns to drop is found by binary search, so a long chat costs O(log turns) renders.

Very long chats (millions of characters) are never rendered whole. Before any render, each
candidate gets a lower bound on its tokens from character counts alone: no token of the
vocabulary covers more characters than its own text is long, so a message of c characters
(after trimming, as templates do) takes at least c / max_token_chars tokens. Candidates whose
bound already exceeds the budget are skipped unrendered, so only a tail that can plausibly fit
is ever rendered (the chat template's output cap of a few million characters is never reached,
and no time goes into tokenizing turns that will be dropped anyway). When even the system
prompt plus the last turn cannot fit, LastMessageTooLongError names the last message's token
count and the room there is. (A template that leaves part of a message out, e.g. old reasoning,
makes the bound loose the safe way: at worst a turn more is dropped, never a turn too few.)
"""

from __future__ import annotations

from dataclasses import dataclass

from engine.errors import ConfigValidationError, ContextOverflowError
from engine.model_protocol import LanguageModel

POLICIES = ("drop_oldest", "refuse")
# Tokenizing this many characters takes about a second; a longer last message is counted on
# this much of it (a lower bound) for the error message.
MAX_COUNTED_CHARS = 1_000_000


class LastMessageTooLongError(ContextOverflowError):
    """The system prompt and the last turn alone exceed the room for the prompt, so dropping
    older turns cannot help. Carries the counts the message names."""

    def __init__(self, message: str, *, last_message_tokens: int, exact: bool, budget: int):
        super().__init__(message)
        self.last_message_tokens = last_message_tokens
        self.exact = exact
        self.budget = budget


@dataclass(frozen=True)
class FitResult:
    messages: list[dict]  # what to send, in order
    dropped: list[dict]  # the messages left out, oldest first
    dropped_indices: list[int]  # their positions in the original list
    prompt_tokens: int  # tokens of the rendered `messages`
    reserved_tokens: int  # room kept for the reply
    context_limit: int

    @property
    def dropped_turns(self) -> int:
        return sum(1 for m in self.dropped if m.get("role") == "user")


def count_prompt_tokens(
    lm: LanguageModel, messages: list[dict], enable_thinking: bool | None = None
) -> int:
    from engine.generate import GenerationRequest, build_prompt_ids

    ids, _ = build_prompt_ids(
        lm, GenerationRequest(messages=messages, enable_thinking=enable_thinking)
    )
    return len(ids)


def fit_conversation(
    lm: LanguageModel,
    messages: list[dict],
    *,
    reserve_tokens: int,
    policy: str = "drop_oldest",
    context_limit: int | None = None,
    enable_thinking: bool | None = None,
) -> FitResult:
    """Choose the messages to send so that prompt + reserve_tokens <= the context limit."""
    if policy not in POLICIES:
        raise ConfigValidationError("context_policy", policy, f"one of {', '.join(POLICIES)}")
    limit = int(lm.n_ctx if context_limit is None else context_limit)
    if (
        isinstance(reserve_tokens, bool)
        or not isinstance(reserve_tokens, int)
        or not 0 <= reserve_tokens < limit
    ):
        raise ConfigValidationError(
            "reserve_tokens", reserve_tokens, f"an integer in [0, {limit - 1}]"
        )
    if not messages:
        raise ConfigValidationError("messages", messages, "at least one message")
    budget = limit - reserve_tokens

    n_system = 0
    while n_system < len(messages) and messages[n_system].get("role") == "system":
        n_system += 1
    turn_starts = [i for i in range(n_system, len(messages)) if messages[i].get("role") == "user"]
    # candidate k drops every message before the k-th turn start (k = 0 drops nothing)
    cut_points = (
        [n_system] + turn_starts[1:]
        if turn_starts and turn_starts[0] == n_system
        else [n_system] + turn_starts
    )

    def candidate(k: int) -> tuple[list[dict], list[int]]:
        cut = cut_points[k]
        kept = messages[:n_system] + messages[cut:]
        return kept, list(range(n_system, cut))

    max_token_chars = _max_token_chars(lm.tokenizer)
    chars = [_content_chars(m) for m in messages]
    system_chars = sum(chars[:n_system])
    tail_chars = [0] * (len(messages) + 1)  # tail_chars[i]: characters of messages[i:]
    for i in range(len(messages) - 1, -1, -1):
        tail_chars[i] = tail_chars[i + 1] + chars[i]

    def lower_bound(k: int) -> int:
        """Tokens candidate k takes at least, from its character count alone."""
        return -(-(system_chars + tail_chars[cut_points[k]]) // max_token_chars)

    counts: dict[int, int] = {}

    def tokens_for(k: int) -> int:
        if k not in counts:
            counts[k] = count_prompt_tokens(lm, candidate(k)[0], enable_thinking)
        return counts[k]

    if lower_bound(0) <= budget:
        full = tokens_for(0)
        if full <= budget:
            return FitResult(list(messages), [], [], full, reserve_tokens, limit)
        if policy == "refuse":
            raise ContextOverflowError(
                f"The conversation takes {full} tokens; with {reserve_tokens} reserved for the "
                f"reply it exceeds the context window of {limit} tokens by "
                f"{full + reserve_tokens - limit}"
            )
    elif policy == "refuse":
        raise ContextOverflowError(
            f"The conversation takes at least {lower_bound(0)} tokens ({tail_chars[0]} "
            f"characters); with {reserve_tokens} reserved for the reply it exceeds the context "
            f"window of {limit} tokens"
        )
    last = len(cut_points) - 1
    if lower_bound(last) > budget:
        raise _too_long(
            lm, messages, f"at least {lower_bound(last)}", budget, reserve_tokens, limit
        )
    if tokens_for(last) > budget:
        raise _too_long(lm, messages, str(tokens_for(last)), budget, reserve_tokens, limit)
    # Candidates whose character bound is over budget cannot fit: start the search after them.
    first = 1
    while first < last and lower_bound(first) > budget:
        first += 1
    low, high = first, last  # invariant: candidate `high` fits; fewer drops than `low` do not
    while low < high:
        mid = (low + high) // 2
        if tokens_for(mid) <= budget:
            high = mid
        else:
            low = mid + 1
    kept, dropped_indices = candidate(high)
    return FitResult(
        kept,
        [messages[i] for i in dropped_indices],
        dropped_indices,
        tokens_for(high),
        reserve_tokens,
        limit,
    )


def _content_chars(message: dict) -> int:
    """Characters a template writes for a message's content (templates may trim it)."""
    content = message.get("content")
    return len(content.strip()) if isinstance(content, str) else 0


def _max_token_chars(tokenizer) -> int:
    """Characters the longest vocabulary entry can stand for: its own text length (byte-level
    BPE spells each byte as one character, SentencePiece a space as one "▁", a byte-fallback
    token "<0xNN>" covers one byte). Without a vocabulary list there is no bound to use: a huge
    value turns the pruning off (every candidate's bound becomes at most one token)."""
    tokens = getattr(tokenizer, "tokens", None)
    if not tokens:
        return 1 << 62
    return max(1, max(len(t) for t in tokens))


def _too_long(
    lm: LanguageModel, messages, smallest: str, budget: int, reserve_tokens: int, limit: int
) -> LastMessageTooLongError:
    """The error for "even the system prompt and the last turn do not fit", naming the last
    message's own token count (counted on at most MAX_COUNTED_CHARS of it)."""
    content = messages[-1].get("content")
    content = content if isinstance(content, str) else ""
    exact = len(content) <= MAX_COUNTED_CHARS
    n_tokens = len(lm.tokenizer.encode(content[:MAX_COUNTED_CHARS], add_special=False))
    count = f"{n_tokens} tokens" if exact else f"more than {n_tokens} tokens"
    room = (
        f"the prompt must fit in {budget} tokens (a context window of {limit} tokens minus "
        f"{reserve_tokens} reserved for the reply)"
    )
    if n_tokens > budget:
        text = f"The last message alone is {count} ({len(content)} characters); {room}."
    else:
        text = (
            f"Even the system prompt and the last turn take {smallest} tokens (the last "
            f"message is {count}); {room}."
        )
    return LastMessageTooLongError(
        text + " Shorten the message or raise the context size.",
        last_message_tokens=n_tokens,
        exact=exact,
        budget=budget,
    )


# Room kept for the reply of a chat whose preset says "until the context is full" (no max).
DEFAULT_REPLY_RESERVE = 512


def reply_reserve(n_ctx: int, max_new_tokens: int | None) -> int:
    """Room fit_chat keeps for the reply: the preset's max_new_tokens, or with no maximum
    min(DEFAULT_REPLY_RESERVE, n_ctx // 4) (engine/compaction.py measures "near the limit"
    against the same room)."""
    return min(DEFAULT_REPLY_RESERVE, n_ctx // 4) if max_new_tokens is None else max_new_tokens


def fit_chat(
    lm: LanguageModel,
    messages: list[dict],
    max_new_tokens: int | None,
    enable_thinking: bool | None = None,
) -> FitResult | None:
    """A chat as the app sends it: drop the oldest turns ("drop_oldest") so the prompt plus the
    reply's room fit the context. The room is the preset's max_new_tokens, or with no maximum
    min(DEFAULT_REPLY_RESERVE, n_ctx // 4). None when the room alone fills the context: nothing
    can be fitted, and generate() refuses the request with ContextOverflowError naming both."""
    reserve = reply_reserve(lm.n_ctx, max_new_tokens)
    if reserve >= lm.n_ctx:
        return None
    return fit_conversation(
        lm,
        messages,
        reserve_tokens=int(reserve),
        policy="drop_oldest",
        enable_thinking=enable_thinking,
    )
