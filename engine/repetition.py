"""Runaway repetition: a reply that writes the same span of tokens again and again.

Small models, and base models above all (gemma-3-270m, which has no chat template, answered a
question by repeating it for more than 1,000 tokens, until the context was full), can fall into
a loop under greedy decoding and never sample an end-of-turn token. The generation loop feeds
every generated token to a `RepetitionDetector` and ends the request with finish reason
"repetition" (engine.types.FinishReason.REPETITION) when it fires, unless the preset turns it
off (GenerationConfig.stop_on_repetition).

The rule: the reply's last `span` tokens are one block of `period` tokens written over and over,
i.e. tokens[i] == tokens[i - period] for every i in that tail (the first copy excluded), with

    period <= MAX_PERIOD                         (a loop of a sentence or a short paragraph)
    span   >= max(MIN_SPAN, MIN_REPEATS * period)

Only generated tokens count (a reply that quotes its prompt once is not a loop). Exact token
equality is what makes the rule safe for legitimate output: text with anything that changes
from one copy to the next (a counter, an index, an id, another word) breaks the period. The
thresholds are high on purpose, because a false stop cuts a real answer while a missed loop only
costs time that the length limit bounds anyway:

- MIN_SPAN = 256: code with a repeated line (20 lines of 6 tokens: 120 tokens), a refrain sung
  three times or a short table of identical rows stays far below it; a loop has filled a screen
  before it fires (a 16-token question written 16 times).
- MIN_REPEATS = 4: a long block is only a loop after four identical copies (a 100-token
  paragraph fires at its 400th token), so two or three copies of an example are left alone.
- MAX_PERIOD = 128: longer loops are rare and bounded by max_new_tokens and the context; the
  bound keeps the check to one vector compare of 128 ids per token.

What it still stops that a person might want: an exact list of 256+ tokens of one thing (e.g.
"write 0 two hundred times"). Turn stop_on_repetition off in the preset for that.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

MAX_PERIOD = 128  # tokens in one copy of the repeated block, at most
MIN_REPEATS = 4  # whole copies of the block before it counts as a loop
MIN_SPAN = 256  # tokens the loop must cover before it counts, whatever its period


@dataclass(frozen=True)
class Loop:
    """A detected loop: `span` trailing tokens that repeat a block of `period` tokens."""

    period: int
    span: int

    @property
    def repeats(self) -> float:
        return self.span / self.period


class RepetitionDetector:
    """Feed generated tokens one at a time with `push`; it returns the Loop once the reply's
    tail is a runaway repetition (see the module docstring), None until then.

    For each period p it keeps the number of consecutive latest tokens equal to the token p
    positions earlier, so a push costs O(max_period) and no history is rescanned."""

    def __init__(
        self,
        max_period: int = MAX_PERIOD,
        min_repeats: int = MIN_REPEATS,
        min_span: int = MIN_SPAN,
    ):
        if max_period < 1 or min_repeats < 2 or min_span < 2:
            raise ValueError(
                f"max_period={max_period} (>= 1), min_repeats={min_repeats} (>= 2), "
                f"min_span={min_span} (>= 2)"
            )
        self._periods = np.arange(1, max_period + 1, dtype=np.int64)
        # the streak length at which period p fires: span = streak + p (the first copy)
        self._needed = np.maximum(min_span, min_repeats * self._periods) - self._periods
        self._recent = np.full(max_period, -1, dtype=np.int64)  # [p - 1]: the token p back
        self._streaks = np.zeros(max_period, dtype=np.int64)
        self.loop: Loop | None = None

    def push(self, token_id: int) -> Loop | None:
        token = int(token_id)
        # p positions back must exist: before the first tokens -1 never equals an id
        matches = self._recent == token
        self._streaks = np.where(matches, self._streaks + 1, 0)
        self._recent[1:] = self._recent[:-1]
        self._recent[0] = token
        fired = np.flatnonzero(self._streaks >= self._needed)
        if fired.size and self.loop is None:
            p = int(self._periods[fired[0]])  # the shortest period: the block as written
            self.loop = Loop(period=p, span=int(self._streaks[fired[0]]) + p)
        return self.loop
