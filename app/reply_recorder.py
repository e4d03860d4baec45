"""Accumulates one streaming reply and keeps the database copy at most `save_interval_s` behind.

Qt-free on purpose: the durability test drives it from a plain subprocess and SIGKILLs that
process mid-stream. The window calls `maybe_save()` on every repaint tick as well as on every
delta, so a reply whose tokens stop arriving is still saved within the interval.

A write that fails (disk full) never raises out of here: the reply stays in memory, `save_error`
says why, partial saves are retried every `RETRY_INTERVAL_S`, and a final save that failed is
kept (`pending`) until `retry()` succeeds.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import asdict

from app.store import (
    STATUS_CANCELLED,
    STATUS_COMPLETE,
    STATUS_ERROR,
    Store,
    StoredMessage,
    StoreWriteError,
)
from engine.events import FINISH_CANCELLED, FINISH_ERROR, Finished, TokenSampled

SAVE_INTERVAL_S = 0.25
RETRY_INTERVAL_S = 2.0  # after a failed write: a full disk is not freed within milliseconds
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
        self.save_error: StoreWriteError | None = None
        self.final: dict | None = None  # the finish_reply arguments, kept until they are saved
        self.pending = False  # the final message is not in the database yet

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
        interval = self._interval if self.save_error is None else RETRY_INTERVAL_S
        if self.closed or not self._dirty or self._clock() - self._last_save < interval:
            return False
        self._last_save = self._clock()
        try:
            self.store.save_partial(self.message_id, self.text, self.reasoning)
        except StoreWriteError as exc:
            self.save_error = exc
            return False
        self._dirty, self.save_error = False, None
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
        self._close(
            content=text,
            reasoning=reasoning,
            status=status,
            finish_reason=finished.finish_reason,
            usage=asdict(finished.usage),
            tokens=[token_record(t) for t in self.tokens],
            receipt=finished.receipt,
        )
        return status

    def fail(self, message: str) -> None:
        """The request was refused or crashed: keep whatever streamed, marked as an error."""
        self._close(
            content=self.text,
            reasoning=self.reasoning,
            status=STATUS_ERROR,
            finish_reason=FINISH_ERROR,
            usage={"error": message},
            tokens=[token_record(t) for t in self.tokens],
        )

    def _close(self, **final) -> None:
        self.final, self.closed, self.pending = final, True, True
        self.retry()

    def retry(self) -> bool:
        """Save the final message if an earlier attempt failed; True once it is saved."""
        if not self.pending:
            return True
        try:
            self.store.finish_reply(self.message_id, **self.final)
        except StoreWriteError as exc:
            self.save_error = exc
            return False
        self.pending, self.save_error = False, None
        return True

    def in_memory(self, stored: StoredMessage) -> StoredMessage:
        """`stored` (the database row, possibly behind) with the final values held here."""
        if self.final is None:
            return dataclasses.replace(stored, content=self.text, reasoning=self.reasoning)
        return dataclasses.replace(
            stored,
            content=self.final["content"],
            reasoning=self.final["reasoning"],
            status=self.final["status"],
            finish_reason=self.final["finish_reason"],
            usage=self.final["usage"],
            tokens=self.final["tokens"],
            receipt=self.final.get("receipt"),
        )
