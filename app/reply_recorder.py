"""Accumulates one streaming reply and keeps the database copy at most `save_interval_s` behind.

Qt-free on purpose: the durability test drives it from a plain subprocess and SIGKILLs that
process mid-stream. The window calls `maybe_save()` on every repaint tick as well as on every
delta, so a reply whose tokens stop arriving is still saved within the interval.
"""

from __future__ import annotations

import time
from dataclasses import asdict

from app.store import STATUS_CANCELLED, STATUS_COMPLETE, STATUS_ERROR, Store
from engine.events import FINISH_CANCELLED, FINISH_ERROR, Finished, TokenSampled

SAVE_INTERVAL_S = 0.25
MAX_RECORDED_TOKENS = 1000  # the token inspector's limit; beyond it tokens are only counted


def token_record(token: TokenSampled) -> dict:
    """A sampled token as stored for the token inspector (dataclasses.asdict is ~10x slower,
    which matters for replies of thousands of tokens)."""
    return {
        "index": token.index,
        "token_id": token.token_id,
        "text": token.text,
        "logprob": token.logprob,
        "top": [{"token_id": a.token_id, "text": a.text, "logprob": a.logprob} for a in token.top],
    }


class ReplyRecorder:
    def __init__(
        self,
        store: Store,
        message_id: int,
        *,
        save_interval_s: float = SAVE_INTERVAL_S,
        clock=time.monotonic,
    ):
        self.store, self.message_id = store, message_id
        self.text, self.reasoning = "", ""
        self.tokens: list[TokenSampled] = []
        self._interval, self._clock = save_interval_s, clock
        self._last_save = clock()
        self._dirty = False
        self.closed = False

    def add_text(self, text: str) -> None:
        self.text += text
        self._dirty = True
        self.maybe_save()

    def add_reasoning(self, text: str) -> None:
        self.reasoning += text
        self._dirty = True
        self.maybe_save()

    def add_tokens(self, tokens: list[TokenSampled]) -> None:
        # Saved with the final message for the inspector; the text alone carries durability.
        room = MAX_RECORDED_TOKENS - len(self.tokens)
        if room > 0:
            self.tokens.extend(tokens[:room])

    def maybe_save(self) -> bool:
        if self.closed or not self._dirty or self._clock() - self._last_save < self._interval:
            return False
        self.store.save_partial(self.message_id, self.text, self.reasoning)
        self._last_save, self._dirty = self._clock(), False
        return True

    def finish(self, finished: Finished) -> str:
        """Commit the final message; returns the stored status."""
        if finished.finish_reason == FINISH_CANCELLED:
            status = STATUS_CANCELLED
        elif finished.finish_reason == FINISH_ERROR:
            status = STATUS_ERROR
        else:
            status = STATUS_COMPLETE
        # The engine's own concatenation is authoritative; fall back to what streamed.
        text = finished.text if finished.text or not self.text else self.text
        reasoning = finished.reasoning or self.reasoning
        self.text, self.reasoning = text, reasoning
        self.store.finish_reply(
            self.message_id,
            content=text,
            reasoning=reasoning,
            status=status,
            finish_reason=finished.finish_reason,
            usage=asdict(finished.usage),
            tokens=[token_record(t) for t in self.tokens],
        )
        self.closed = True
        return status

    def fail(self, message: str) -> None:
        """The request was refused or crashed: keep whatever streamed, marked as an error."""
        self.store.finish_reply(
            self.message_id,
            content=self.text,
            reasoning=self.reasoning,
            status=STATUS_ERROR,
            finish_reason=FINISH_ERROR,
            usage={"error": message},
            tokens=[token_record(t) for t in self.tokens],
        )
        self.closed = True
