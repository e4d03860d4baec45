"""BatchScheduler: several requests on one loaded model, decoded together in one forward per step.

    scheduler = BatchScheduler(lm, max_concurrency=4, kv_budget_bytes=256 * 2**20)
    ticket = scheduler.submit(GenerationRequest(messages=[...]), CancelToken())
    for event in ticket.events():   # exactly what engine.generate.generate yields
        ...
    scheduler.close()

How (one thread per running request, one scheduler thread):
- Each admitted request runs engine.generate's own event pipeline (`planned_events`: prefix
  cache, processors, sampler, speculative drafts, stop strings, detokenizer, reasoning split,
  usage) on a driver thread of its own, unchanged, except that its forward calls go to a
  per-request stand-in model (`_SequenceModel`) instead of the TransformerModel. The stand-in
  hands the call to the scheduler and blocks until its logits are ready.
- The scheduler thread gathers the pending calls of every running request (it waits until each
  running request has made its next call or GATHER_SECONDS passed), cuts one step from them
  (forward_work.cut_step: every decode whole, plus a prefill slice of at most PREFILL_SLICE
  tokens while others decode) and runs it as one TransformerModel.forward_segments pass: the
  weights are read once per step for every sequence, each sequence keeps its own KVCache.
- Events go into the ticket's queue as the driver makes them, so a slow reader never holds up
  the batch; the KV reservation is released before the Finished event is queued (a reader that
  sees Finished sees the memory free in stats()).

Why threads around the unchanged loop rather than a second, batched loop: the loop's semantics
(penalties, JSON constraint, draft verification, stop hold-back, usage) stay in one place, and
every row of a batched forward is bit-identical to the same row computed alone (the kernels
compute each row on its own, tests/test_batching_exact.py), so a request's tokens are exactly
the ones it gets alone, greedy or seeded, whatever else runs beside it.

Cancellation: a cancelled request's pending call is failed at the next step boundary (its slices
taken back out of its cache) and its loop ends with finish reason "cancelled", so it leaves the
batch within one step and frees its reservation; a queued request that is cancelled ends
without running. Other sequences are not disturbed: they simply are not in the next step.
"""

from __future__ import annotations

import dataclasses
import queue
import threading
import time
from collections.abc import Iterator

import numpy as np

from engine.batching.admission import KVLedger
from engine.batching.forward_work import ForwardWork, cut_step
from engine.cancel import CancelToken, ForwardCancelled
from engine.errors import SchedulerClosedError, TemplateCancelled
from engine.events import Finished
from engine.generate import (
    Plan,
    cancelled_before_the_prompt,
    default_kv_budget_bytes,
    plan_request,
    planned_events,
)
from engine.kv_cache import KVCache
from engine.model_protocol import LanguageModel
from engine.presets import ResolvedPreset
from engine.types import GenerationRequest, SchedulerStats, SupportsPrefixReuse

# How long a step waits for running requests that have not made their next forward call yet
# (they are sampling: about a millisecond each). Longer only when a driver thread is starved.
GATHER_SECONDS = 0.05
# How often an idle scheduler looks for cancelled queued requests.
_IDLE_POLL_SECONDS = 0.05
_JOIN_SECONDS = 30.0


class Ticket:
    """A submitted request: its place in line, and its events."""

    def __init__(self, plan: Plan | None, cancel: CancelToken, started: float, kv_bytes: int):
        self.queue_position = 0  # 0: running now; k: k-th in the queue when submitted
        self.prompt_tokens = len(plan.prompt_ids) if plan is not None else 0
        self.kv_bytes = kv_bytes  # its worst-case KV reservation
        self.cancel = cancel
        self._plan = plan
        self._started = started
        self._events: queue.SimpleQueue[object] = queue.SimpleQueue()
        self._released = False
        self._admitted = threading.Event()

    @property
    def admitted(self) -> bool:
        """True once the request has left the queue (it is running or has run)."""
        return self._admitted.is_set()

    def wait_admitted(self, timeout: float | None = None) -> bool:
        return self._admitted.wait(timeout)

    def events(self) -> Iterator[object]:
        """Blocking iterator of the request's events, ending after its one Finished event. Read
        it from one thread, once."""
        while True:
            event = self._events.get()
            yield event
            if isinstance(event, Finished):
                return

    def _put(self, event: object) -> None:
        self._events.put(event)


class _SequenceModel:
    """The ForwardModel a running request's loop calls (engine.generate.ForwardModel): forward
    calls become ForwardWork for the scheduler; it blocks until the logits are ready."""

    def __init__(self, scheduler: BatchScheduler, cancel: CancelToken):
        self._scheduler = scheduler
        self._cancel = cancel

    def new_cache(self, n_ctx: int) -> KVCache:
        return self._scheduler.model.new_cache(n_ctx)

    def forward(
        self, tokens, cache, *, all_logits: bool = False, logits_at=None, cancel=None
    ) -> np.ndarray:
        model = self._scheduler.model
        ids = np.asarray(tokens, dtype=np.int64).reshape(-1)
        model.check_ids(ids)
        work = ForwardWork.of_call(ids, cache, all_logits, logits_at, cancel or self._cancel)
        self._scheduler._enqueue(work)
        work.finished.wait()
        if work.error is not None:
            raise work.error
        assert work.result is not None
        return work.result


class BatchScheduler:
    def __init__(
        self,
        lm: LanguageModel,
        *,
        max_concurrency: int = 4,
        kv_budget_bytes: int | None = None,
        max_queue: int = 16,
        prefix_cache: SupportsPrefixReuse | None = None,
    ):
        self.lm = lm
        self.model = lm.model
        self.prefix_cache = prefix_cache
        budget = default_kv_budget_bytes() if kv_budget_bytes is None else kv_budget_bytes
        self._ledger: KVLedger[Ticket] = KVLedger(budget, max_concurrency, max_queue)
        self._cond = threading.Condition()
        self._pending: list[ForwardWork] = []  # oldest first; at most one per running request
        self._live = 0  # running requests whose loop has not ended
        self._tickets: dict[int, Ticket] = {}  # running ones, by id
        self._drivers: list[threading.Thread] = []
        self._steps = 0
        self._closed = False
        self._thread = threading.Thread(target=self._loop, name="batch-scheduler", daemon=True)
        self._thread.start()

    # --- the contract ---------------------------------------------------------------------------
    def submit(
        self,
        request: GenerationRequest,
        cancel: CancelToken,
        *,
        preset: ResolvedPreset | None = None,
    ) -> Ticket:
        """Plan the request now (the typed errors of engine.generate.generate), then admit it
        against the KV budget: worst case = (prompt + max new tokens) x the model's KV bytes
        per position. Raises KVAdmissionError (never_fits=True: larger than the whole budget)
        or QueueFullError (it would have to wait and the queue is full); else -> a Ticket,
        running (queue_position 0) or queued (its 1-based place in the queue)."""
        started = time.perf_counter()
        if self._closed:
            raise SchedulerClosedError("The batch scheduler is closed; the model is unloading")
        if request.prefix_cache is None and self.prefix_cache is not None:
            request = dataclasses.replace(request, prefix_cache=self.prefix_cache)
        try:
            plan = plan_request(self.lm, request, preset, cancel)
        except TemplateCancelled:
            ticket = Ticket(None, cancel, started, 0)
            ticket._admitted.set()
            ticket._put(cancelled_before_the_prompt(self.lm))
            return ticket
        needed = KVCache.bytes_needed(self.lm.config, plan.capacity)
        ticket = Ticket(plan, cancel, started, needed)
        with self._cond:
            if self._closed:
                raise SchedulerClosedError("The batch scheduler is closed; the model is unloading")
            ticket.queue_position = self._ledger.admit(ticket, needed)
            if ticket.queue_position == 0:
                self._start(ticket)
            self._cond.notify_all()
        return ticket

    def stats(self) -> SchedulerStats:
        with self._cond:
            ledger = self._ledger
            return SchedulerStats(
                running=len(ledger.running),
                queued=len(ledger.queue),
                kv_bytes_reserved=ledger.reserved,
                kv_budget_bytes=ledger.budget_bytes,
                steps=self._steps,
                max_concurrency=ledger.max_concurrency,
                max_queue=ledger.max_queue,
            )

    def close(self) -> None:
        """Cancel every running and queued request, wait for them to end, stop the thread."""
        with self._cond:
            if self._closed and not self._thread.is_alive():
                return
            self._closed = True
            for ticket in self._tickets.values():
                ticket.cancel.cancel()
            queued = self._ledger.drop_queued(lambda _ticket: True)
            self._cond.notify_all()
        for ticket in queued:
            ticket.cancel.cancel()
            self._end_unstarted(ticket)
        self._thread.join(_JOIN_SECONDS)
        for driver in list(self._drivers):
            driver.join(_JOIN_SECONDS)

    def __enter__(self) -> BatchScheduler:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # --- running requests -----------------------------------------------------------------------
    def _start(self, ticket: Ticket) -> None:
        """Under the lock: the ticket's bytes are reserved; run its loop on a driver thread."""
        self._live += 1
        self._tickets[id(ticket)] = ticket
        ticket._admitted.set()
        driver = threading.Thread(
            target=self._drive, args=(ticket,), name="batch-request", daemon=True
        )
        self._drivers = [d for d in self._drivers if d.is_alive()]
        self._drivers.append(driver)
        driver.start()

    def _drive(self, ticket: Ticket) -> None:
        plan = ticket._plan
        assert plan is not None
        model = _SequenceModel(self, ticket.cancel)
        try:
            for event in planned_events(self.lm, plan, ticket.cancel, ticket._started, model=model):
                if isinstance(event, Finished):
                    self._release(ticket)  # before the reader can see it: stats() idle
                ticket._put(event)
        finally:
            self._release(ticket)

    def _release(self, ticket: Ticket) -> None:
        with self._cond:
            if ticket._released:
                return
            ticket._released = True
            self._live -= 1
            self._tickets.pop(id(ticket), None)
            for waiting in self._ledger.release(ticket):
                self._start(waiting)
            self._cond.notify_all()

    def _end_unstarted(self, ticket: Ticket) -> None:
        """A queued request that is cancelled ends without running: one Finished, no tokens."""
        plan = ticket._plan
        finished = cancelled_before_the_prompt(self.lm)
        if plan is not None:
            finished = dataclasses.replace(
                finished,
                usage=dataclasses.replace(finished.usage, prompt_tokens=len(plan.prompt_ids)),
                preset={**plan.preset.to_dict(), "seed_used": plan.seed},
            )
        ticket._released = True
        ticket._admitted.set()
        ticket._put(finished)

    # --- the step loop --------------------------------------------------------------------------
    def _enqueue(self, work: ForwardWork) -> None:
        with self._cond:
            if self._closed:
                work.fail(ForwardCancelled())
                return
            self._pending.append(work)
            self._cond.notify_all()

    def _loop(self) -> None:
        model = self.model
        while True:
            with self._cond:
                step = self._next_step()
                if step is None:
                    break
            if not step:
                continue
            try:
                results = model.forward_segments([work.segment(n) for work, n in step])
            except Exception as exc:  # the requests in this step end with Finished(error)
                with self._cond:
                    for work, _n in step:
                        self._pending.remove(work)
                        work.fail(exc)
                continue
            with self._cond:
                self._steps += 1
                for (work, n), logits in zip(step, results, strict=True):
                    if work.took(n, logits):
                        self._pending.remove(work)
        with self._cond:  # closed: nothing will run any more
            for work in self._pending:
                work.fail(ForwardCancelled())
            self._pending.clear()

    def _next_step(self) -> list[tuple[ForwardWork, int]] | None:
        """Under the lock: wait for work, gather the running requests' calls, drop cancelled
        ones, cut the step. None: closed."""
        cond = self._cond
        while not self._pending:
            if self._closed:
                return None
            self._drop_cancelled_queued()
            cond.wait(_IDLE_POLL_SECONDS)
        deadline = time.monotonic() + GATHER_SECONDS
        while len(self._pending) < self._live and not self._closed:
            left = deadline - time.monotonic()
            if left <= 0:
                break
            cond.wait(left)
        if self._closed:
            return None
        for work in [w for w in self._pending if getattr(w.cancel, "cancelled", False)]:
            self._pending.remove(work)
            work.fail(ForwardCancelled())
        self._drop_cancelled_queued()
        return cut_step(self._pending, self.model.max_batch)

    def _drop_cancelled_queued(self) -> None:
        for ticket in self._ledger.drop_queued(lambda t: t.cancel.cancelled):
            self._end_unstarted(ticket)
