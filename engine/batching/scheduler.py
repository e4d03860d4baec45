"""BatchScheduler: several requests on one loaded model, decoded together in one forward per step.

    scheduler = BatchScheduler(lm, max_concurrency=4, kv_budget_bytes=256 * 2**20)
    ticket = scheduler.submit(GenerationRequest(messages=[...]), CancelToken())
    for event in ticket.events():   # exactly what engine.generate.generate yields
        ...
    scheduler.close()

How (one scheduler thread; each running request a greenlet on it):
- Each admitted request runs engine.generate's own event pipeline (`planned_events`: prefix
  cache, processors, sampler, speculative drafts, stop strings, detokenizer, reasoning split,
  usage) unchanged, except that its forward calls go to a per-request stand-in model
  (`_SequenceModel`). The stand-in's forward() pauses the request (a greenlet switch back to
  the scheduler) with its call as a `ForwardWork`, and the scheduler resumes it with the logits.
- One step: resume every request whose logits are ready until each has made its next forward
  call or ended; then cut a step from the pending calls (forward_work.cut_step: every decode
  whole, plus a prefill slice of at most PREFILL_SLICE tokens while others decode) and run it
  as one TransformerModel.forward_segments pass: the weights are read once per step for every
  sequence, each sequence keeps its own KVCache. A step of decodes only (one token per
  sequence, the steady state) runs as native step lists, one call from Python per layer
  (engine/models/batch_decode.py); a step with a prefill slice or a draft runs the layer loop.
- Events go into the ticket's queue as they are made, so a slow reader never holds up the batch;
  the KV reservation is released before the Finished event is queued (a reader that sees
  Finished sees the memory free in stats()).

Why greenlets around the unchanged loop, rather than threads or a second, batched loop: the
loop's semantics (penalties, JSON constraint, draft verification, stop hold-back, usage) stay in
one place (engine/generate.py), and all of it runs on one thread, so a step costs no thread
wake-ups or GIL hand-offs (on a busy 2-core machine a wake-up costs milliseconds, as much as a
SmolLM2 decode step). Every row of a batched forward is bit-identical to the same row computed
alone (the kernels compute each row on its own, tests/test_batching_exact.py), so a request
gets exactly the tokens it gets alone, greedy or seeded, whatever runs beside it.

Cancellation: a cancelled request's pending call is failed before the next step (slices of it
already run are taken back out of its cache) and its loop ends with finish reason "cancelled":
it leaves the batch within one step and frees its reservation. A queued request that is
cancelled ends without running. Other sequences are not disturbed: they are simply in the next
step without it.
"""

from __future__ import annotations

import dataclasses
import queue
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass

import greenlet
import numpy as np

from engine.batching.admission import KVLedger
from engine.batching.forward_work import (
    MIN_PREFILL_SLICE,
    PREFILL_SLICE,
    ForwardWork,
    cut_step,
)
from engine.cancel import CancelToken, ForwardCancelled
from engine.errors import SchedulerClosedError, TemplateCancelled
from engine.events import FINISH_ERROR, Finished, PrefillProgress
from engine.generate import (
    Plan,
    cancelled_before_the_prompt,
    default_kv_budget_bytes,
    kv_bytes_needed,
    plan_request,
    planned_events,
)
from engine.kv_cache import KVCache
from engine.model_protocol import LanguageModel
from engine.presets import ResolvedPreset
from engine.types import GenerationRequest, SchedulerStats, SupportsPrefixReuse

# How long a step that carries a prefill slice beside running decodes should take, about: the
# slice is sized from the measured time per row (PREFILL_SLICE rows on a quiet machine, fewer
# on a busy one), so a running stream's next token waits about this long for another prompt.
PREFILL_STEP_SECONDS = 0.1
_ROW_TIME_SMOOTHING = 0.3  # weight of the newest step in the running mean of seconds per row
# How often an idle scheduler looks for cancelled queued requests and for close().
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
        # the newest PrefillProgress while its prompt is read (a status line polls it), else None
        self.prefill: PrefillProgress | None = None

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
    """The ForwardModel a running request's loop calls (engine.generate.ForwardModel). It runs in
    the request's greenlet: forward() hands a ForwardWork to the scheduler's greenlet and pauses
    until the scheduler switches back with the logits (or an exception to raise)."""

    def __init__(self, model, hub: greenlet.greenlet, cancel: CancelToken):
        self._model = model
        self._hub = hub
        self._cancel = cancel

    def new_cache(self, n_ctx: int) -> KVCache:
        return self._model.new_cache(n_ctx)

    def forward(
        self, tokens, cache, *, all_logits: bool = False, logits_at=None, cancel=None
    ) -> np.ndarray:
        ids = np.asarray(tokens, dtype=np.int64).reshape(-1)
        self._model.check_ids(ids)
        work = ForwardWork.of_call(ids, cache, all_logits, logits_at, cancel or self._cancel)
        reply = self._hub.switch(work)
        if isinstance(reply, BaseException):
            raise reply
        return reply


@dataclass(eq=False)
class _Running:
    """A running request on the scheduler thread: its greenlet, and what it waits for."""

    ticket: Ticket
    glet: greenlet.greenlet
    model: _SequenceModel
    started: bool = False
    work: ForwardWork | None = None  # its pending forward call
    reply: object = None  # what to resume it with: its logits, or an exception to raise


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
        self._admitted: list[Ticket] = []  # reserved, their greenlet not made yet (FIFO)
        self._tickets: dict[int, Ticket] = {}  # every running ticket, by id
        self._steps = 0
        self._row_seconds: float | None = None  # running mean of a step's seconds per row
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
        needed = kv_bytes_needed(self.lm, plan.capacity)
        ticket = Ticket(plan, cancel, started, needed)
        with self._cond:
            if self._closed:
                raise SchedulerClosedError("The batch scheduler is closed; the model is unloading")
            ticket.queue_position = self._ledger.admit(ticket, needed)
            if ticket.queue_position == 0:
                self._admit(ticket)
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

    def prefills(self) -> tuple[PrefillProgress, ...]:
        """The newest prefill progress of each running request whose prompt is being read, in
        admission order (plain values: safe to read from any thread, e.g. a status bar timer)."""
        with self._cond:
            tickets = list(self._tickets.values())
        return tuple(t.prefill for t in tickets if t.prefill is not None)

    def close(self) -> None:
        """Cancel every running and queued request, let them end, stop the scheduler thread."""
        with self._cond:
            self._closed = True
            for ticket in self._tickets.values():
                ticket.cancel.cancel()
            queued = self._ledger.drop_queued(lambda _ticket: True)
            self._cond.notify_all()
        for ticket in queued:
            ticket.cancel.cancel()
            self._end_unstarted(ticket)
        if threading.current_thread() is not self._thread:
            self._thread.join(_JOIN_SECONDS)

    def __enter__(self) -> BatchScheduler:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # --- admission (any thread, under the lock) -------------------------------------------------
    def _admit(self, ticket: Ticket) -> None:
        """The ticket's bytes are reserved: the scheduler thread starts it at its next turn."""
        self._tickets[id(ticket)] = ticket
        self._admitted.append(ticket)
        ticket._admitted.set()

    def _release(self, ticket: Ticket) -> None:
        with self._cond:
            if ticket._released:
                return
            ticket._released = True
            self._tickets.pop(id(ticket), None)
            for waiting in self._ledger.release(ticket):
                self._admit(waiting)
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

    def _drop_cancelled_queued(self) -> None:
        for ticket in self._ledger.drop_queued(lambda t: t.cancel.cancelled):
            self._end_unstarted(ticket)

    # --- the scheduler thread -------------------------------------------------------------------
    def _run_request(self, ticket: Ticket, model: _SequenceModel) -> None:
        """A request's greenlet: its event pipeline, events into its ticket."""
        plan = ticket._plan
        assert plan is not None
        finished = False
        try:
            for event in planned_events(self.lm, plan, ticket.cancel, ticket._started, model=model):
                if isinstance(event, PrefillProgress):
                    ticket.prefill = event if event.done < event.total else None
                if isinstance(event, Finished):
                    ticket.prefill = None
                    self._release(ticket)  # before the reader can see it: stats() idle
                    finished = True
                ticket._put(event)
        except Exception as exc:  # the loop reports its own failures; this is a last guard
            if not finished:
                self._release(ticket)
                ticket._put(
                    dataclasses.replace(
                        cancelled_before_the_prompt(self.lm),
                        finish_reason=FINISH_ERROR,
                        error=f"{type(exc).__name__}: {exc}",
                    )
                )
        finally:
            self._release(ticket)

    def _loop(self) -> None:
        hub = greenlet.getcurrent()
        running: list[_Running] = []  # in admission order: oldest prefill is sliced first
        while True:
            with self._cond:
                self._drop_cancelled_queued()
                while not self._admitted and not running and not self._closed:
                    self._cond.wait(_IDLE_POLL_SECONDS)
                    self._drop_cancelled_queued()
                if self._closed and not running and not self._admitted:
                    return
                for ticket in self._admitted:
                    model = _SequenceModel(self.model, hub, ticket.cancel)
                    glet = greenlet.greenlet(self._run_request, parent=hub)
                    running.append(_Running(ticket, glet, model))
                self._admitted.clear()
                if self._closed:
                    for seq in running:
                        seq.ticket.cancel.cancel()
            # resume every request that has its reply, until its next forward call or its end
            for seq in running:
                if seq.work is not None:
                    continue
                if seq.started:
                    reply, seq.reply = seq.reply, None
                    out = seq.glet.switch(reply)
                else:
                    seq.started = True
                    out = seq.glet.switch(seq.ticket, seq.model)
                if seq.glet.dead:
                    continue
                seq.work = out
            running = [seq for seq in running if not seq.glet.dead]
            # cancelled calls leave now; their requests end on their next turn
            for seq in running:
                work = seq.work
                if work is not None and getattr(work.cancel, "cancelled", False):
                    work.fail(ForwardCancelled())
                    seq.work, seq.reply = None, work.error
            pending = [seq.work for seq in running if seq.work is not None]
            step = cut_step(pending, self.model.max_batch, self._prefill_slice()) if pending else []
            if step:
                self._run_step(step, running)

    def _prefill_slice(self) -> int:
        """Prefill tokens to put beside running decodes in the next step (see PREFILL_STEP_SECONDS)."""
        if self._row_seconds is None:
            return PREFILL_SLICE
        rows = int(PREFILL_STEP_SECONDS / self._row_seconds)
        return max(MIN_PREFILL_SLICE, min(PREFILL_SLICE, rows))

    def _run_step(self, step: list[tuple[ForwardWork, int]], running: list[_Running]) -> None:
        by_work = {id(seq.work): seq for seq in running if seq.work is not None}
        rows = sum(n for _work, n in step)
        started = time.perf_counter()
        try:
            results = self.model.forward_segments([work.segment(n) for work, n in step])
        except Exception as exc:  # the requests in this step end with Finished(error)
            for work, _n in step:
                work.fail(exc)
                seq = by_work[id(work)]
                seq.work, seq.reply = None, exc
            return
        per_row = (time.perf_counter() - started) / rows
        if rows >= MIN_PREFILL_SLICE:  # a decode-only step of a few rows says little about prefill
            mean = self._row_seconds
            w = _ROW_TIME_SMOOTHING
            self._row_seconds = per_row if mean is None else (1 - w) * mean + w * per_row
        with self._cond:
            self._steps += 1
        for (work, n), logits in zip(step, results, strict=True):
            if work.took(n, logits):
                seq = by_work[id(work)]
                seq.work, seq.reply = None, work.result
