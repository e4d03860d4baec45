"""KV admission: a byte budget for the worst-case KV caches of running requests, a FIFO queue.

A request's worst case is known when it is planned: capacity = prompt tokens + max new tokens,
at KVCache.bytes_needed bytes (the cache is allocated at full capacity up front, so the
reservation is exactly what it allocates). A request runs when its bytes fit next to the
running ones and a concurrency slot is free; otherwise it queues, or is refused when the queue
is full or when it exceeds the whole budget (waiting cannot help). The queue is strict FIFO:
a small request never overtakes a big one at the head, so the big one cannot starve.

Not thread-safe by itself: the scheduler calls it under its lock.
"""

from __future__ import annotations

from collections import deque
from typing import Generic, TypeVar

from engine.errors import ConfigValidationError, KVAdmissionError, QueueFullError

T = TypeVar("T")


class KVLedger(Generic[T]):
    def __init__(self, budget_bytes: int, max_concurrency: int, max_queue: int):
        for name, value, low in (
            ("kv_budget_bytes", budget_bytes, 1),
            ("max_concurrency", max_concurrency, 1),
            ("max_queue", max_queue, 0),
        ):
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise ConfigValidationError(name, value, f"an integer >= {low}")
        self.budget_bytes = budget_bytes
        self.max_concurrency = max_concurrency
        self.max_queue = max_queue
        self.reserved = 0
        self.running: dict[int, int] = {}  # id(item) -> bytes reserved
        self.queue: deque[tuple[T, int]] = deque()

    @property
    def available(self) -> int:
        return self.budget_bytes - self.reserved

    def _fits_now(self, needed: int) -> bool:
        return len(self.running) < self.max_concurrency and needed <= self.available

    def admit(self, item: T, needed: int) -> int:
        """-> 0 when `item` runs now (its bytes reserved), k >= 1 when it is k-th in the queue.
        Raises KVAdmissionError (never fits) or QueueFullError."""
        if needed > self.budget_bytes:
            raise KVAdmissionError(needed, self.available, self.budget_bytes, never_fits=True)
        if not self.queue and self._fits_now(needed):
            self._reserve(item, needed)
            return 0
        if len(self.queue) >= self.max_queue:
            raise QueueFullError(needed, self.available, self.max_queue, len(self.running))
        self.queue.append((item, needed))
        return len(self.queue)

    def _reserve(self, item: T, needed: int) -> None:
        self.running[id(item)] = needed
        self.reserved += needed

    def release(self, item: T) -> list[T]:
        """Free a running item's bytes; -> the queued items that run now (FIFO), reserved."""
        self.reserved -= self.running.pop(id(item), 0)
        return self.admit_waiting()

    def admit_waiting(self) -> list[T]:
        started = []
        while self.queue and self._fits_now(self.queue[0][1]):
            item, needed = self.queue.popleft()
            self._reserve(item, needed)
            started.append(item)
        return started

    def drop_queued(self, predicate) -> list[T]:
        """Remove queued items for which predicate(item) holds (e.g. cancelled); -> them."""
        dropped = [item for item, _ in self.queue if predicate(item)]
        if dropped:
            self.queue = deque((i, n) for i, n in self.queue if not predicate(i))
        return dropped
