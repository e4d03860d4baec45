"""A thread-safe cancel flag shared between the caller (e.g. the GUI thread) and the generation loop."""

import threading


class CancelToken:
    """Set from any thread; the generation loop polls `cancelled` between steps.

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
