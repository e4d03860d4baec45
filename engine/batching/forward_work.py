"""A sequence's pending forward call, and how one batched step is cut from all pending calls.

A request's generation loop (engine/generate.py) calls `forward(tokens, cache, ...)` exactly as it
would on TransformerModel; the scheduler turns each call into a `ForwardWork` and serves it over
one or more steps. A step is one `TransformerModel.forward_segments` pass: every pending decode
(1 token, or 1 + a speculative draft) goes in whole, and a prompt being prefilled goes in slices
of at most PREFILL_SLICE tokens while other sequences are decoding (so their next token waits
for one slice, not for a whole prompt), or of up to max_batch tokens when nothing else runs.
Rows are exact whichever way a prompt is sliced (every row is computed on its own), so slicing
changes timing only.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

import numpy as np

from engine.kv_cache import KVCache
from engine.models.transformer import Segment

# Tokens of prefill per step while other sequences decode, at most: a running stream waits for
# one such slice per token (bench/bench_batching.py measures the gap). The scheduler takes fewer
# when the machine is slow (see PREFILL_STEP_SECONDS in scheduler.py), never fewer than
# MIN_PREFILL_SLICE (one 8-row mat-mul tile: below that prefill loses its tiling).
PREFILL_SLICE = 64
MIN_PREFILL_SLICE = 8
# A call this short is a decode (one token plus a draft of at most generate.MAX_DRAFT_TOKENS):
# it always goes into the next step whole.
DECODE_MAX_TOKENS = 17


@dataclass(eq=False)
class ForwardWork:
    """One `forward(tokens, cache, ...)` call of one sequence, served over one or more steps."""

    tokens: np.ndarray  # int64 (T,)
    cache: KVCache  # owned by the calling sequence
    wanted: np.ndarray  # sorted unique rows (into tokens) whose logits are returned
    order: np.ndarray | None  # rows of `wanted` in the caller's order (logits_at), or None
    shape: str  # "last": (n_vocab,), "rows": (len, n_vocab)
    cancel: object  # anything with `.cancelled`
    start_tokens: int = 0  # cache.n_tokens before the call: a cancelled call truncates back to it
    done: int = 0  # tokens fed so far
    rows: list[np.ndarray] = field(default_factory=list)
    result: np.ndarray | None = None
    error: BaseException | None = None
    finished: threading.Event = field(default_factory=threading.Event)

    @classmethod
    def of_call(cls, tokens, cache, all_logits: bool, logits_at, cancel) -> ForwardWork:
        ids = np.asarray(tokens, dtype=np.int64).reshape(-1)
        n = ids.size
        if n == 0:
            raise ValueError("forward() needs at least one token")
        order = None
        if all_logits:
            wanted, shape = np.arange(n), "rows"
        elif logits_at is not None:
            asked = np.asarray(logits_at, dtype=np.int64).reshape(-1)
            if asked.size and (asked.min() < 0 or asked.max() >= n):
                raise ValueError(f"logits_at indices must be in [0, {n}); got {asked.tolist()}")
            wanted, shape = np.unique(asked), "rows"
            order = np.searchsorted(wanted, asked)  # duplicates kept, as forward() does
        else:
            wanted, shape = np.array([n - 1]), "last"
        cache.reserve(n)  # too long for the cache: refused now, in the caller's thread
        return cls(ids, cache, wanted, order, shape, cancel, start_tokens=cache.n_tokens)

    @property
    def remaining(self) -> int:
        return int(self.tokens.size - self.done)

    def segment(self, n: int) -> Segment:
        """The next n tokens as a segment of a step, with the wanted rows among them."""
        lo, hi = self.done, self.done + n
        rows = self.wanted[(self.wanted >= lo) & (self.wanted < hi)] - lo
        return Segment(self.tokens[lo:hi], self.cache, rows)

    def took(self, n: int, logits: np.ndarray) -> bool:
        """Record that a step fed n more tokens and gave these logits rows; True when done."""
        self.done += n
        # kept even when empty: a call that wants no row (logits_at=[]) returns (0, n_vocab), as
        # forward() does, and a step's empty rows are cheap to concatenate
        self.rows.append(logits)
        if self.done < self.tokens.size:
            return False
        got = np.concatenate(self.rows, axis=0) if len(self.rows) > 1 else self.rows[0]
        if self.shape == "last":
            self.result = got[0]
        elif self.order is not None:
            self.result = got[self.order]
        else:
            self.result = got
        self.rows = []
        self.finished.set()
        return True

    def fail(self, error: BaseException) -> None:
        """End the call with an error; slices already committed are taken back out of the cache,
        so the cache holds exactly what it held before the call (as forward()'s contract says
        for a cancelled chunk)."""
        cache = self.cache
        if cache.n_tokens > self.start_tokens:
            cache.truncate(self.start_tokens)
        self.error = error
        self.rows = []
        self.finished.set()


def cut_step(
    pending: list[ForwardWork], max_batch: int, prefill_slice: int = PREFILL_SLICE
) -> list[tuple[ForwardWork, int]]:
    """-> (work, tokens to feed now) for the next step, in the order given (oldest first).

    Decodes first, each whole, while they fit in max_batch rows; then prefill slices, oldest
    call first: at most `prefill_slice` tokens in all when the step also decodes, else up to
    max_batch (a lone prefill runs at full chunk size)."""
    step: list[tuple[ForwardWork, int]] = []
    rows = 0
    decodes = [w for w in pending if w.remaining <= DECODE_MAX_TOKENS]
    for work in decodes:
        if rows + work.remaining > max_batch:
            break
        step.append((work, work.remaining))
        rows += work.remaining
    budget = max_batch - rows
    if step:
        budget = min(budget, prefill_slice)
    for work in pending:
        if budget <= 0:
            break
        if work.remaining <= DECODE_MAX_TOKENS:
            continue
        n = min(work.remaining, budget)
        step.append((work, n))
        budget -= n
    return step
