"""A thread-safe cancel flag shared between the caller (e.g. the GUI thread) and the generation loop."""

import threading


class CancelToken:
    """Set from any thread; the generation loop polls `cancelled` between steps, and the forward
    pass polls it between layers (so a long prefill chunk stops within one layer's work).

    Polling an Event is a single attribute read plus a lock-free check, so a generation nobody
    cancels pays nothing measurable for it.
    """

    __slots__ = ("_event",)

    def __init__(self) -> None:
        self._event = threading.Event()

    def cancel(self) -> None:
        self._event.set()

    @property
    def cancelled(self) -> bool:
        return self._event.is_set()


class ForwardCancelled(Exception):
    """A forward pass saw its cancel token set and stopped before committing its chunk: the KV
    cache still holds exactly the tokens it held before that chunk (rows written past
    `n_tokens` are scratch that later writes overwrite)."""
