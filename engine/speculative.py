"""Speculative decoding by prompt lookup: draft the next tokens by copying what followed the
same n-gram earlier in the sequence.

Chats and edits repeat their context ("rewrite this paragraph with one change", code with a fix,
quoting the question): when the last few tokens already occurred earlier, the tokens that
followed them then are a good guess for what follows now. The generation loop
(engine/generate.py) verifies a draft with one batched forward pass and keeps the longest prefix
the model agrees with, plus the model's own token at the first disagreement, so a wrong draft
costs only the extra rows of that batch and never changes the output.

Draft length adapts to how well drafts do (the schedule of HF transformers' assisted
generation): +2 after a fully accepted draft, -1 after a rejected one, between 1 and max_draft.
A verify pass costs more with every extra row, so a drafter that keeps guessing wrong shrinks to
single-token guesses, and one that copies a quoted paragraph grows to long drafts. The drafter
sees how its last draft did from the tokens the loop appended since (the accepted prefix of the
draft, then the model's own token), so the loop needs no extra call.

The drafter keeps an index n-gram -> position after its most recent earlier occurrence, updated
incrementally as tokens are appended, so drafting costs O(max_ngram) dictionary look-ups per
step whatever the context length. Most recent occurrence: in a chat the latest repetition is the
most likely to continue the same way (the text being rewritten is the last thing quoted).
"""

from __future__ import annotations

from collections.abc import Sequence

from engine.errors import ConfigValidationError
from engine.model_protocol import LanguageModel

DEFAULT_MAX_NGRAM = 4
DEFAULT_MIN_NGRAM = 2  # a single repeated token ("the", ",") predicts too little to pay a batch row
DEFAULT_MAX_DRAFT = 10
INITIAL_DRAFT = 4


class PromptLookupDrafter:
    """`draft(tokens, max_tokens) -> list[int]`: the continuation of the longest suffix n-gram
    (max_ngram down to min_ngram tokens) found earlier in `tokens`, or [] when none is."""

    def __init__(
        self,
        max_ngram: int = DEFAULT_MAX_NGRAM,
        min_ngram: int = DEFAULT_MIN_NGRAM,
        max_draft: int = DEFAULT_MAX_DRAFT,
        adaptive: bool = True,
    ):
        if not (
            isinstance(min_ngram, int)
            and isinstance(max_ngram, int)
            and 1 <= min_ngram <= max_ngram <= 16
        ):
            raise ConfigValidationError(
                "speculative_ngram", (min_ngram, max_ngram), "integers with 1 <= min <= max <= 16"
            )
        if not (isinstance(max_draft, int) and 1 <= max_draft <= 64):
            raise ConfigValidationError("speculative_max_draft", max_draft, "an integer in [1, 64]")
        self.max_ngram, self.min_ngram, self.max_draft = max_ngram, min_ngram, max_draft
        self.adaptive = adaptive
        self.draft_length = min(INITIAL_DRAFT, max_draft) if adaptive else max_draft
        self._pending: tuple[int, list[int]] | None = (
            None  # (sequence length, draft) not yet judged
        )
        self._seq: list[int] = []  # the tokens indexed so far (a copy: the caller's list changes)
        # per n: n-gram tuple -> index of the token that followed its latest occurrence
        self._index: dict[int, dict[tuple[int, ...], int]] = {
            n: {} for n in range(min_ngram, max_ngram + 1)
        }

    def draft(self, tokens: Sequence[int], max_tokens: int) -> list[int]:
        self._sync(tokens)
        self._judge_last_draft()
        limit = min(int(max_tokens), self.draft_length)
        seq = self._seq
        if limit <= 0:
            return []
        for n in range(self.max_ngram, self.min_ngram - 1, -1):
            if len(seq) <= n:
                continue
            follow = self._index[n].get(tuple(seq[-n:]))
            if follow is not None:
                proposal = seq[follow : follow + limit]
                self._pending = (len(seq), proposal)
                return list(proposal)
        return []

    def _judge_last_draft(self) -> None:
        """Adapt the draft length to how many tokens of the previous draft the model kept."""
        if self._pending is None:
            return
        at, proposal = self._pending
        appended = self._seq[at:]
        if len(appended) <= len(proposal) and appended == proposal[: len(appended)]:
            return  # not judged yet: the loop has not gone past the draft
        self._pending = None
        if not self.adaptive:
            return
        kept = 0
        while kept < len(proposal) and kept < len(appended) and appended[kept] == proposal[kept]:
            kept += 1
        if kept == len(proposal):
            self.draft_length = min(self.max_draft, self.draft_length + 2)
        else:
            self.draft_length = max(1, self.draft_length - 1)

    def _sync(self, tokens: Sequence[int]) -> None:
        """Index tokens appended since the last call; start over if the sequence was changed."""
        seq = self._seq
        known = len(seq)
        if (
            len(tokens) < known
            or (known and int(tokens[known - 1]) != seq[-1])
            or (known and int(tokens[0]) != seq[0])
        ):
            self._seq = seq = []
            for table in self._index.values():
                table.clear()
            self._pending = None
            known = 0
        for token in tokens[known:]:
            seq.append(int(token))
            # The n-grams that now have a follower: those ending just before the new token.
            end = len(seq) - 1
            for n, table in self._index.items():
                if end >= n:
                    table[tuple(seq[end - n : end])] = end


def default_drafter(
    lm: LanguageModel, config, required: bool = False
) -> PromptLookupDrafter | None:
    """The engine default: prompt lookup for greedy requests (where it is exact and cheap to
    verify), off for sampled ones unless asked for (it is exact there too, the loop samples every
    position from its own distribution with the same RNG stream, but far fewer drafts agree)."""
    if required or not getattr(config, "do_sample", False):
        return PromptLookupDrafter()
    return None
