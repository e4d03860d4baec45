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
"""

from __future__ import annotations

from dataclasses import dataclass

from engine.errors import ConfigValidationError, ContextOverflowError

POLICIES = ("drop_oldest", "refuse")


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


def count_prompt_tokens(lm, messages: list[dict]) -> int:
    from engine.generate import GenerationRequest, build_prompt_ids

    ids, _ = build_prompt_ids(lm, GenerationRequest(messages=messages))
    return len(ids)


def fit_conversation(
    lm,
    messages: list[dict],
    *,
    reserve_tokens: int,
    policy: str = "drop_oldest",
    context_limit: int | None = None,
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

    counts: dict[int, int] = {}

    def tokens_for(k: int) -> int:
        if k not in counts:
            counts[k] = count_prompt_tokens(lm, candidate(k)[0])
        return counts[k]

    full = tokens_for(0)
    if full <= budget:
        return FitResult(list(messages), [], [], full, reserve_tokens, limit)
    if policy == "refuse":
        raise ContextOverflowError(
            f"The conversation takes {full} tokens; with {reserve_tokens} reserved for the reply it "
            f"exceeds the context window of {limit} tokens by {full + reserve_tokens - limit}"
        )
    last = len(cut_points) - 1
    smallest = tokens_for(last)
    if smallest > budget:
        raise ContextOverflowError(
            f"Even the system prompt and the last message take {smallest} tokens; with "
            f"{reserve_tokens} reserved for the reply that exceeds the context window of {limit} tokens"
        )
    low, high = (
        1,
        last,
    )  # invariant: candidate `high` fits; dropping fewer turns than `low` does not
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


# Room kept for the reply of a chat whose preset says "until the context is full" (no max).
DEFAULT_REPLY_RESERVE = 512


def fit_chat(lm, messages: list[dict], max_new_tokens: int | None) -> FitResult | None:
    """A chat as the app sends it: drop the oldest turns ("drop_oldest") so the prompt plus the
    reply's room fit the context. The room is the preset's max_new_tokens, or with no maximum
    min(DEFAULT_REPLY_RESERVE, n_ctx // 4). None when the room alone fills the context: nothing
    can be fitted, and generate() refuses the request with ContextOverflowError naming both."""
    reserve = (
        min(DEFAULT_REPLY_RESERVE, lm.n_ctx // 4) if max_new_tokens is None else max_new_tokens
    )
    if reserve >= lm.n_ctx:
        return None
    return fit_conversation(lm, messages, reserve_tokens=int(reserve), policy="drop_oldest")
