"""BatchScheduler on a scripted fake model (fast tier, no model file): what a client of the
scheduler sees. Every reply, finish reason, byte count and step below is worked out by hand from
the scripts (tests/fake_model.py: KV costs 8 bytes per position, 2 * 1 layer * 1 head * 2 dims
* 2 bytes), and the generation loop alone (engine.generate.generate on the same fake) is the
independent path a batched request must match token for token.

Timing never decides an outcome here: where the order of events matters, the fake model's
`on_step` hook holds or cancels at a chosen step, and the prefill-slice test runs on a fake clock.
"""

from __future__ import annotations

import os
import threading
from types import SimpleNamespace

import numpy as np
import pytest
from fake_model import (
    BOS,
    BatchedScriptedModel,
    FakeChatTemplate,
    ScriptedModel,
    batched_fake_lm,
    ids,
    script_replies,
    use_fake_detokenizer,
)

import engine.batching.scheduler as scheduler_module
from engine.batching import BatchScheduler
from engine.cancel import CancelToken
from engine.errors import (
    KVAdmissionError,
    QueueFullError,
    SchedulerClosedError,
    TemplateCancelled,
)
from engine.events import Finished, TokenSampled
from engine.generate import cancelled_before_the_prompt, generate
from engine.prefix_cache import PrefixCache
from engine.presets import resolve_preset
from engine.types import GenerationRequest, SchedulerStats

DEADLINE = 30.0  # seconds; never reached when the scheduler works
BYTES_PER_POSITION = 8  # FakeConfig: 2 (K and V) * 1 layer * 1 KV head * 2 dims * 2 bytes (f16)

A, B, C, X, Y, Z = ids("a", "b", "c", "x", "y", "z")
HELLO, WORLD, BANG, HOW, ARE, YOU, END = ids("Hello", " world", "!", " How", " are", " you", " END")


@pytest.fixture(autouse=True)
def _fake_detokenizer(monkeypatch):
    use_fake_detokenizer(monkeypatch)


def request(prompt, max_new: int, **overrides) -> GenerationRequest:
    """A greedy raw-token request with no speculative drafts (each step's rows are then known)."""
    values = {"max_new_tokens": max_new, "do_sample": False, **overrides}
    return GenerationRequest(prompt_ids=list(prompt), overrides=values, speculative=False)


def read(ticket) -> tuple[list, Finished]:
    """All of a ticket's events (read on another thread, as a server connection does)."""
    events: list = []
    reader = threading.Thread(target=lambda: events.extend(ticket.events()), daemon=True)
    reader.start()
    reader.join(DEADLINE)
    assert not reader.is_alive(), "the request never finished"
    assert isinstance(events[-1], Finished)
    assert sum(isinstance(e, Finished) for e in events) == 1
    return events, events[-1]


def finished(ticket) -> Finished:
    return read(ticket)[1]


def alone(lm, req: GenerationRequest) -> Finished:
    """The same request through the plain generation loop (model.forward, no scheduler)."""
    events = list(generate(lm, req, CancelToken()))
    assert isinstance(events[-1], Finished)
    return events[-1]


class Pause:
    """Called from a step (see on_steps): holds the scheduler inside that step's forward pass
    until `go` is set; what a test submits meanwhile is admitted before the next step."""

    def __init__(self):
        self.entered, self.go = threading.Event(), threading.Event()

    def __call__(self):
        self.entered.set()
        assert self.go.wait(DEADLINE)

    def wait_entered(self):
        assert self.entered.wait(DEADLINE), "the scheduler never ran the step"


def on_steps(model: BatchedScriptedModel, actions: dict) -> None:
    """Run actions[i]() inside step i (0-based), before the step's logits are computed."""

    def on_step(_segments):
        action = actions.get(len(model.steps) - 1)
        if action is not None:
            action()

    model.on_step = on_step


def steps_with(model: BatchedScriptedModel, cache) -> list[int]:
    """Indices of the steps that fed tokens into `cache`."""
    return [i for i, step in enumerate(model.steps) if any(c is cache for c, _ in step)]


def caches_in_order(model: BatchedScriptedModel) -> list:
    """Each KV cache once, in the order the steps first fed it."""
    seen: list = []
    for step in model.steps:
        for cache, _ in step:
            if not any(cache is s for s in seen):
                seen.append(cache)
    return seen


# --- every request gets its own reply, batched ---------------------------------------------------
P1, P2, P3 = (BOS, HELLO), (BOS, HOW), (BOS, ARE)
REPLIES = {P1: [A, B, C], P2: [X, Y, Z, X, Y, Z, X], P3: [HELLO, END, WORLD]}


def test_each_request_gets_its_own_reply_and_finish_reason_in_shared_steps():
    lm = batched_fake_lm(script_replies(REPLIES))
    r1, r2, r3 = request(P1, 10), request(P2, 5), request(P3, 10, stop=[" END"])
    pause = Pause()
    on_steps(lm.model, {0: pause})
    with BatchScheduler(lm) as scheduler:
        t1 = scheduler.submit(r1, CancelToken())
        pause.wait_entered()
        # P3 runs between the others and ends first: the ones after it still go on
        t3 = scheduler.submit(r3, CancelToken())
        t2 = scheduler.submit(r2, CancelToken())
        pause.go.set()
        got = [finished(t) for t in (t1, t2, t3)]
        stats = scheduler.stats()
    # by hand: P1 ends on its end-of-sequence token, P2 on max_new_tokens, P3 on its stop string
    want = [
        ((A, B, C), "abc", "stop", 4),
        ((X, Y, Z, X, Y), "xyzxy", "length", 5),
        ((HELLO, END), "Hello", "stop_sequence", 2),
    ]
    for done, (tokens, text, reason, sampled) in zip(got, want, strict=True):
        assert (done.token_ids, done.text, done.finish_reason) == (tokens, text, reason)
        assert done.usage.completion_tokens == sampled and done.usage.prompt_tokens == 2
        assert done.error is None
    # ... exactly what each gets alone
    for done, req in zip(got, (r1, r2, r3), strict=True):
        mine = alone(batched_fake_lm(script_replies(REPLIES)), req)
        assert (done.token_ids, done.finish_reason) == (mine.token_ids, mine.finish_reason)
    # step 0 is P1's prefill alone (held); then every forward call of the three shares a step:
    # P2 makes the most calls (prefill + 4 tokens fed), so steps 1-5 serve everyone
    assert len(lm.model.steps) == 6 and stats.steps == 6
    assert [len(step) for step in lm.model.steps] == [1, 3, 3, 2, 1, 1]
    assert sorted(len(ids_) for _, ids_ in lm.model.steps[1]) == [1, 2, 2]
    assert (stats.running, stats.queued, stats.kv_bytes_reserved) == (0, 0, 0)


def test_tickets_name_their_prompt_and_worst_case_kv_bytes():
    lm = batched_fake_lm(script_replies({(BOS, HELLO, WORLD): [A]}))
    with BatchScheduler(lm) as scheduler:
        ticket = scheduler.submit(request((BOS, HELLO, WORLD), 5), CancelToken())
        assert ticket.prompt_tokens == 3
        assert ticket.kv_bytes == (3 + 5) * BYTES_PER_POSITION
        assert ticket.queue_position == 0 and ticket.admitted and ticket.wait_admitted(0)
        done = finished(ticket)
    assert done.token_ids == (A,) and done.finish_reason == "stop"


def test_a_preset_resolved_by_the_caller_is_the_one_used():
    lm = batched_fake_lm(script_replies({P1: [A, B, C, X, Y]}))
    preset = resolve_preset(lm, overrides={"max_new_tokens": 2, "do_sample": False})
    plain = GenerationRequest(prompt_ids=list(P1), speculative=False)  # no overrides of its own
    with BatchScheduler(lm) as scheduler:
        ticket = scheduler.submit(plain, CancelToken(), preset=preset)
        assert ticket.kv_bytes == (2 + 2) * BYTES_PER_POSITION
        done = finished(ticket)
    assert done.token_ids == (A, B) and done.finish_reason == "length"
    assert done.preset["values"]["max_new_tokens"] == 2


def test_a_reader_that_sees_finished_sees_the_memory_free():
    lm = batched_fake_lm(script_replies({P1: [A, B]}))
    with BatchScheduler(lm) as scheduler:
        ticket = scheduler.submit(request(P1, 4), CancelToken())
        for event in ticket.events():
            if isinstance(event, Finished):
                stats = scheduler.stats()
    assert (stats.running, stats.kv_bytes_reserved) == (0, 0)
    assert event.token_ids == (A, B)


def test_speculative_drafts_are_verified_in_the_batch_and_change_no_token():
    reply = [A, B, C, A, B, C, X]

    class Oracle:
        """Drafts the script's own next tokens: every draft is accepted."""

        def draft(self, tokens, max_tokens):
            done = len(tokens) - len(P1)
            return reply[done : done + max_tokens]

    class Wrong:
        def draft(self, tokens, max_tokens):
            return [Z] * max_tokens

    lm = batched_fake_lm(script_replies({P1: reply, P2: [Y, Y]}))
    right = GenerationRequest(
        prompt_ids=list(P1),
        overrides={"max_new_tokens": 7, "do_sample": False},
        speculative=Oracle(),
    )
    wrong = GenerationRequest(
        prompt_ids=list(P1),
        overrides={"max_new_tokens": 7, "do_sample": False},
        speculative=Wrong(),
    )
    with BatchScheduler(lm) as scheduler:
        t_right = scheduler.submit(right, CancelToken())
        t_wrong = scheduler.submit(wrong, CancelToken())
        t_other = scheduler.submit(request(P2, 4), CancelToken())
        got_right, got_wrong, got_other = (finished(t) for t in (t_right, t_wrong, t_other))
    assert got_right.token_ids == got_wrong.token_ids == tuple(reply)
    assert got_right.usage.draft_tokens_accepted == 5  # B C A B C: drafted after A, all kept
    assert got_wrong.usage.draft_tokens_accepted == 0
    assert got_other.token_ids == (Y, Y)
    # the oracle's draft was verified in one call: A plus the 5 drafted tokens
    oracle_cache = caches_in_order(lm.model)[0]
    assert [len(t) for step in lm.model.steps for c, t in step if c is oracle_cache] == [2, 6]


# --- cancellation --------------------------------------------------------------------------------
def test_cancelling_one_request_mid_stream_leaves_the_others_exact():
    lm = batched_fake_lm(script_replies({P1: [A] * 12, P2: [X, Y, Z, X, Y, Z], P3: [B] * 12}))
    model = lm.model
    doomed, pause = CancelToken(), Pause()
    on_steps(model, {0: pause, 2: doomed.cancel})
    with BatchScheduler(lm) as scheduler:
        t1 = scheduler.submit(request(P1, 12), doomed)
        pause.wait_entered()
        t2 = scheduler.submit(request(P2, 6), CancelToken())
        t3 = scheduler.submit(request(P3, 12), CancelToken())
        pause.go.set()
        gone, kept, other = finished(t1), finished(t2), finished(t3)
        stats = scheduler.stats()
    assert gone.finish_reason == "cancelled" and gone.error is None
    # P1 prefilled in step 0, fed its 1st token in step 1 and its 2nd in step 2 (during which it
    # was cancelled): it sampled 2 tokens and is in no step after step 2
    assert gone.token_ids == (A, A) and gone.usage.completion_tokens == 2
    assert steps_with(model, caches_in_order(model)[0]) == [0, 1, 2]
    assert kept.token_ids == (X, Y, Z, X, Y, Z) and kept.finish_reason == "length"
    assert other.token_ids == (B,) * 12 and other.finish_reason == "length"
    assert (stats.running, stats.queued, stats.kv_bytes_reserved) == (0, 0, 0)


LONG = (A,) * 200  # a prompt that goes in as one 200-token call, served in slices


def test_cancel_after_the_first_prefill_slice_stops_the_rest_of_that_call():
    # The long prompt's prefill is one forward call of 200 tokens, sliced beside the running
    # decode (max_batch 32: 31 rows of prefill per step). Cancelled inside the step that runs its
    # first slice, only the scheduler's step-level cancel can stop the call: the loop itself
    # looks at the token only before and after a whole call.
    lm = batched_fake_lm(script_replies({P1: [B] * 30, LONG: [C]}), n_ctx=256, max_batch=32)
    model = lm.model
    token, pause = CancelToken(), Pause()
    long_cache: list = []

    def cancel_on_the_long_slice(segments):
        if token.cancelled:
            return
        for seg in segments:
            if len(seg.ids) > 1 and seg.cache.n_tokens == 0 and seg.ids[0] == A:
                long_cache.append(seg.cache)
                token.cancel()

    def on_step(segments):
        if len(model.steps) == 2:  # the runner's first decode step: submit the long one now
            pause()
        cancel_on_the_long_slice(segments)

    model.on_step = on_step
    # with a prefix cache: a cancelled call must not hand back logits (the loop would store the
    # prompt's state in the cache and fail on the taken-back slice)
    with BatchScheduler(lm, max_concurrency=2, prefix_cache=PrefixCache()) as scheduler:
        runner = scheduler.submit(request(P1, 30), CancelToken())
        pause.wait_entered()
        ticket = scheduler.submit(request(LONG, 4), token)
        pause.go.set()
        done = finished(ticket)
        kept = finished(runner)
        stats = scheduler.stats()
    (cache,) = long_cache
    assert done.finish_reason == "cancelled" and done.error is None
    assert done.token_ids == () and done.usage.completion_tokens == 0
    # one slice ran (31 rows beside the runner's 1), the other 169 tokens never did ...
    assert model.tokens_fed_to(cache) == [A] * 31
    # ... and the slice that ran was taken back out: the cache holds what it held before the call
    assert cache.n_tokens == 0 and cache.tokens == []
    assert kept.token_ids == (B,) * 30 and kept.finish_reason == "length"
    assert (stats.running, stats.kv_bytes_reserved) == (0, 0)


# --- admission: slots, memory, the queue, typed refusals ------------------------------------------
def test_one_slot_is_reused_in_fifo_order_and_a_full_queue_is_refused():
    replies = {P1: [A, A], P2: [B, B], P3: [C, C], (BOS, YOU): [X]}
    lm = batched_fake_lm(script_replies(replies))
    model = lm.model
    pause = Pause()
    on_steps(model, {0: pause})
    with BatchScheduler(lm, max_concurrency=1, max_queue=2, kv_budget_bytes=10_000) as scheduler:
        first = scheduler.submit(request(P1, 3), CancelToken())
        pause.wait_entered()
        second = scheduler.submit(request(P2, 3), CancelToken())
        third = scheduler.submit(request(P3, 3), CancelToken())
        assert (first.queue_position, second.queue_position, third.queue_position) == (0, 1, 2)
        assert first.admitted and not second.admitted and not third.admitted
        assert not second.wait_admitted(0.0)
        with pytest.raises(QueueFullError) as full:
            scheduler.submit(request((BOS, YOU), 3), CancelToken())
        err = full.value
        # (2 + 3) positions * 8 bytes each; the running request reserved 40 of the 10,000
        assert (err.bytes_needed, err.bytes_available, err.max_queue, err.running) == (
            40,
            10_000 - 40,
            2,
            1,
        )
        assert "queue of 2 waiting requests is full" in str(err)
        assert scheduler.stats() == SchedulerStats(
            running=1,
            queued=2,
            kv_bytes_reserved=40,
            kv_budget_bytes=10_000,
            steps=0,
            max_concurrency=1,
            max_queue=2,
        )
        pause.go.set()
        got = [finished(t) for t in (first, second, third)]
        assert second.wait_admitted(DEADLINE) and third.admitted
        stats = scheduler.stats()
    assert [g.token_ids for g in got] == [(A, A), (B, B), (C, C)]
    # one at a time, oldest first: no step ever held two requests
    assert all(len(step) == 1 for step in model.steps)
    order = [step[0][1][:2] for step in model.steps if len(step[0][1]) == 2]
    assert order == [list(P1), list(P2), list(P3)]
    assert (stats.running, stats.queued, stats.kv_bytes_reserved) == (0, 0, 0)


def test_memory_queues_what_does_not_fit_beside_the_running_and_never_lets_it_be_overtaken():
    replies = {P1: [A, A, A], P2: [B, B, B], (BOS,): [C]}
    lm = batched_fake_lm(script_replies(replies))
    pause = Pause()
    on_steps(lm.model, {0: pause})
    # P1 and P2 need (2 + 3) * 8 = 40 bytes each, the 1-token prompt (1 + 1) * 8 = 16
    with BatchScheduler(lm, max_concurrency=4, kv_budget_bytes=60) as scheduler:
        t1 = scheduler.submit(request(P1, 3), CancelToken())
        pause.wait_entered()
        t2 = scheduler.submit(request(P2, 3), CancelToken())
        t3 = scheduler.submit(request((BOS,), 1), CancelToken())
        # a free slot, 20 bytes free: the 40-byte request waits; the 16-byte one would fit now
        # but queues behind it (strict FIFO: the big one cannot starve)
        assert (t1.queue_position, t2.queue_position, t3.queue_position) == (0, 1, 2)
        with pytest.raises(KVAdmissionError) as never:
            scheduler.submit(request((BOS, HELLO, WORLD, BANG), 4), CancelToken())
        err = never.value
        assert err.never_fits and (err.bytes_needed, err.bytes_available, err.budget_bytes) == (
            64,
            20,
            60,
        )
        assert "64 bytes" in str(err) and "whole KV budget of 60 bytes" in str(err)
        assert scheduler.stats().kv_bytes_reserved == 40
        pause.go.set()
        got = [finished(t) for t in (t1, t2, t3)]
    assert [g.token_ids for g in got] == [(A, A, A), (B, B, B), (C,)]
    # P1 released its 40 bytes: P2 and the small one started together, after P1's last step
    s2, s3 = (steps_with(lm.model, c) for c in caches_in_order(lm.model)[1:])
    assert min(s2) == min(s3) > max(steps_with(lm.model, caches_in_order(lm.model)[0]))


def test_a_cancelled_queued_request_ends_at_once_without_running():
    lm = batched_fake_lm(script_replies({P1: [A] * 5, P2: [B]}))
    first, second = Pause(), Pause()
    on_steps(lm.model, {0: first, 2: second})
    with BatchScheduler(lm, max_concurrency=1) as scheduler:
        running = scheduler.submit(request(P1, 5), CancelToken())
        first.wait_entered()
        token = CancelToken()
        queued = scheduler.submit(request(P2, 3, do_sample=True, seed=5), token)
        token.cancel()
        first.go.set()
        # it ends between steps, while the running request still holds the only slot (held in
        # step 2): it does not wait for the slot to run and notice its cancel then
        done = finished(queued)
        assert queued.admitted and scheduler.stats().queued == 0
        second.go.set()
        assert finished(running).token_ids == (A,) * 5
    assert done.finish_reason == "cancelled" and done.token_ids == () and done.text == ""
    assert done.usage.prompt_tokens == 2 and done.usage.completion_tokens == 0
    # its receipt still says what it would have run with
    assert done.preset["seed_used"] == 5 and done.preset["values"]["max_new_tokens"] == 3
    # it never ran: every step fed P1's cache only
    assert len(caches_in_order(lm.model)) == 1


def test_a_request_cancelled_while_its_template_renders_ends_at_once():
    class SlowTemplate(FakeChatTemplate):
        def render(self, messages, add_generation_prompt=True, cancel=None, **kwargs):
            if cancel is not None and cancel.cancelled:
                raise TemplateCancelled("rendering the chat template was cancelled")
            return super().render(messages, add_generation_prompt)

    lm = batched_fake_lm(script_replies({}), chat_template=SlowTemplate())
    token = CancelToken()
    token.cancel()
    chat = GenerationRequest(messages=[{"role": "user", "content": "Hello"}])
    with BatchScheduler(lm) as scheduler:
        ticket = scheduler.submit(chat, token)
        assert ticket.admitted and ticket.queue_position == 0 and ticket.cancel is token
        assert (ticket.prompt_tokens, ticket.kv_bytes) == (0, 0)
        done = finished(ticket)
        assert scheduler.stats().running == 0
    assert done.finish_reason == "cancelled" and done.usage.prompt_tokens == 0
    assert lm.model.steps == []


# --- closing -------------------------------------------------------------------------------------
def test_close_cancels_running_and_queued_requests_and_refuses_new_ones():
    lm = batched_fake_lm(script_replies({P1: [A] * 40, P2: [B], P3: [C] * 40}), n_ctx=64)
    pause = Pause()
    on_steps(lm.model, {3: pause})
    before = set(threading.enumerate())
    scheduler = BatchScheduler(lm, max_concurrency=2)
    (thread,) = [t for t in set(threading.enumerate()) - before if t.name == "batch-scheduler"]
    running = scheduler.submit(request(P1, 40), CancelToken())
    also_running = scheduler.submit(request(P3, 40), CancelToken())
    pause.wait_entered()
    queued = scheduler.submit(request(P2, 3), CancelToken())
    closer = threading.Thread(target=scheduler.close)
    closer.start()
    done_queued = finished(queued)  # ends while the running ones are still held in step 3 ...
    # ... where close() itself has already cancelled every running request
    assert running.cancel.cancelled and also_running.cancel.cancelled
    pause.go.set()
    closer.join(DEADLINE)
    assert not closer.is_alive()
    assert not thread.is_alive()  # close() returned after the scheduler thread ended
    done_running = finished(running)
    assert done_running.finish_reason == "cancelled"
    assert done_running.token_ids == (A,) * 3  # sampled after steps 0, 1, 2; step 3 fed the 3rd
    assert finished(also_running).finish_reason == "cancelled" and queued.cancel.cancelled
    assert done_queued.finish_reason == "cancelled" and done_queued.usage.prompt_tokens == 2
    with pytest.raises(SchedulerClosedError) as refused:
        scheduler.submit(request(P2, 3), CancelToken())
    assert str(refused.value) == CLOSED
    assert scheduler.stats().running == 0


CLOSED = "The batch scheduler is closed; the model is unloading"


def test_close_leaves_the_tokens_of_finished_requests_alone():
    lm = batched_fake_lm(script_replies({P1: [A]}))
    token = CancelToken()
    with BatchScheduler(lm) as scheduler:
        assert finished(scheduler.submit(request(P1, 2), token)).finish_reason == "stop"
    assert not token.cancelled  # a caller may still hold it (e.g. for its next request)


def test_leaving_the_with_block_closes_the_scheduler():
    lm = batched_fake_lm(script_replies({P1: [A]}))
    with BatchScheduler(lm) as scheduler:
        assert finished(scheduler.submit(request(P1, 2), CancelToken())).token_ids == (A,)
    with pytest.raises(SchedulerClosedError):
        scheduler.submit(request(P1, 2), CancelToken())


def test_a_request_planned_while_the_scheduler_closes_is_refused():
    lm = batched_fake_lm(script_replies({}))
    scheduler = BatchScheduler(lm)

    class ClosingTemplate(FakeChatTemplate):
        def render(self, messages, add_generation_prompt=True, cancel=None, **kwargs):
            scheduler.close()  # the model unloads while this request is being planned
            return super().render(messages, add_generation_prompt)

    lm.chat_template = ClosingTemplate()
    chat = GenerationRequest(messages=[{"role": "user", "content": "Hello"}])
    with pytest.raises(SchedulerClosedError) as refused:
        scheduler.submit(chat, CancelToken())
    assert str(refused.value) == CLOSED
    assert scheduler.stats().kv_bytes_reserved == 0 and lm.model.steps == []


def test_close_from_the_scheduler_thread_itself_cancels_without_deadlock():
    lm = batched_fake_lm(script_replies({P1: [A] * 20}))
    scheduler = BatchScheduler(lm)
    on_steps(lm.model, {2: scheduler.close})  # e.g. a shutdown hook run inside a step
    done = finished(scheduler.submit(request(P1, 20), CancelToken()))
    assert done.finish_reason == "cancelled" and done.error is None
    assert done.token_ids == (A, A)
    with pytest.raises(SchedulerClosedError):
        scheduler.submit(request(P1, 2), CancelToken())


def test_the_scheduler_thread_never_keeps_the_process_alive():
    before = set(threading.enumerate())
    scheduler = BatchScheduler(batched_fake_lm(script_replies({})))
    try:
        (thread,) = [t for t in set(threading.enumerate()) - before if t.is_alive()]
        assert thread.daemon and thread.name == "batch-scheduler"
    finally:
        scheduler.close()


def test_an_idle_scheduler_wakes_for_a_submit_and_for_close(monkeypatch):
    # with its idle poll an hour long, only the wake-ups of submit() and close() can move it
    monkeypatch.setattr(scheduler_module, "_IDLE_POLL_SECONDS", 3600.0)
    lm = batched_fake_lm(script_replies({P1: [A]}))
    before = set(threading.enumerate())
    scheduler = BatchScheduler(lm)
    (thread,) = [t for t in set(threading.enumerate()) - before if t.name == "batch-scheduler"]
    assert finished(scheduler.submit(request(P1, 2), CancelToken())).token_ids == (A,)
    assert finished(scheduler.submit(request(P1, 2), CancelToken())).token_ids == (A,)
    closer = threading.Thread(target=scheduler.close, daemon=True)
    closer.start()
    closer.join(DEADLINE)
    assert not closer.is_alive() and not thread.is_alive()


def test_defaults_four_running_sixteen_queued_half_the_memory():
    pages = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    with BatchScheduler(batched_fake_lm(script_replies({}))) as scheduler:
        stats = scheduler.stats()
    assert stats == SchedulerStats(
        running=0,
        queued=0,
        kv_bytes_reserved=0,
        kv_budget_bytes=pages // 2,
        steps=0,
        max_concurrency=4,
        max_queue=16,
    )


# --- failures ------------------------------------------------------------------------------------
def test_a_failed_step_ends_the_requests_in_it_with_an_error_and_the_scheduler_goes_on():
    lm = batched_fake_lm(script_replies({P1: [A] * 6, P2: [B] * 6, P3: [C, C]}))
    model = lm.model
    pause = Pause()

    def fail():
        raise RuntimeError("the forward pass ran out of memory")

    on_steps(model, {0: pause, 2: fail})
    with BatchScheduler(lm) as scheduler:
        t1 = scheduler.submit(request(P1, 6), CancelToken())
        pause.wait_entered()
        t2 = scheduler.submit(request(P2, 6), CancelToken())
        pause.go.set()
        got = [finished(t) for t in (t1, t2)]
        # the scheduler still serves: a later request runs to its end
        after = finished(scheduler.submit(request(P3, 4), CancelToken()))
        stats = scheduler.stats()
    for done in got:
        assert done.finish_reason == "error"
        assert done.error == "RuntimeError: the forward pass ran out of memory"
    # the tokens sampled before the failed step are kept: P1 sampled 2 (after steps 0 and 1),
    # P2 1 (after step 1)
    assert [g.token_ids for g in got] == [(A, A), (B,)]
    # the failed step's tokens were never committed to the caches
    c1, c2 = caches_in_order(model)[:2]
    assert c1.tokens == [BOS, HELLO, A] and c2.tokens == [BOS, HOW]
    assert after.token_ids == (C, C) and after.finish_reason == "stop"
    assert (stats.running, stats.kv_bytes_reserved) == (0, 0)
    assert stats.steps == len(model.steps) - 1  # the failed step is not counted


def test_a_stream_keeps_decoding_while_an_older_prompt_is_prefilled_in_slices():
    # the long prompt arrived first and is mid-call; the younger request's tokens must not wait
    # for that whole call: every step carries one of its tokens beside the next slice
    lm = batched_fake_lm(script_replies({P1: [B] * 5, LONG: [C]}), n_ctx=256, max_batch=32)
    model = lm.model
    pause = Pause()
    on_steps(model, {0: pause})
    with BatchScheduler(lm) as scheduler:
        long = scheduler.submit(request(LONG, 1), CancelToken())
        pause.wait_entered()  # step 0: the long prompt alone, at the full 32 rows
        young = scheduler.submit(request(P1, 5), CancelToken())
        pause.go.set()
        assert finished(young).token_ids == (B,) * 5
        assert finished(long).token_ids == (C,)
    long_cache, young_cache = caches_in_order(model)
    assert steps_with(model, young_cache) == [1, 2, 3, 4, 5]
    # beside the young one's prefill (2 rows) and decodes (1 row): 30, then 31 rows a step; the
    # last 14 are short enough to go whole
    sizes = [len(t) for step in model.steps for c, t in step if c is long_cache]
    assert sizes == [32, 30, 31, 31, 31, 31, 14]


def test_a_step_failing_after_a_slice_ran_takes_that_slice_back_out():
    lm = batched_fake_lm(script_replies({P1: [B] * 30, LONG: [C]}), n_ctx=256, max_batch=32)
    model = lm.model
    pause = Pause()

    def fail():
        raise MemoryError("no room for the activations")

    on_steps(model, {1: pause, 3: fail})  # step 2 runs the long prompt's first slice
    with BatchScheduler(lm, max_concurrency=2) as scheduler:
        runner = scheduler.submit(request(P1, 30), CancelToken())
        pause.wait_entered()
        ticket = scheduler.submit(request(LONG, 4), CancelToken())
        pause.go.set()
        done, kept = finished(ticket), finished(runner)
    long_cache = caches_in_order(model)[1]
    assert model.tokens_fed_to(long_cache) == [A] * 62  # two slices of 31 went in (step 2, 3)
    assert long_cache.n_tokens == 0  # the committed one is taken back out with the failed one
    assert (
        done.finish_reason == "error" and done.error == "MemoryError: no room for the activations"
    )
    # the runner was in the failed step too; it keeps what it sampled after steps 0, 1 and 2
    assert kept.finish_reason == "error" and kept.token_ids == (B, B, B)


def test_a_token_id_outside_the_vocabulary_ends_that_request_with_an_error():
    lm = batched_fake_lm(script_replies({P1: [A, A]}))
    with BatchScheduler(lm) as scheduler:
        bad = finished(scheduler.submit(request((BOS, 999), 2), CancelToken()))
        good = finished(scheduler.submit(request(P1, 2), CancelToken()))
    assert bad.finish_reason == "error" and "token id 999 is out of range" in bad.error
    assert good.token_ids == (A, A)
    assert all(999 not in ids_ for step in lm.model.steps for _c, ids_ in step)


def test_an_exception_outside_the_loop_still_ends_the_request_with_an_error(monkeypatch):
    def broken_events(lm, plan, cancel, started, *, model):
        cache = model.new_cache(plan.capacity)
        model.forward(plan.prompt_ids, cache, cancel=cancel)
        yield TokenSampled(index=0, token_id=A, text="a", logprob=0.0)
        raise KeyError("usage")

    monkeypatch.setattr(scheduler_module, "planned_events", broken_events)
    lm = batched_fake_lm(script_replies({}))
    with BatchScheduler(lm, kv_budget_bytes=1000) as scheduler:
        events, done = read(scheduler.submit(request(P1, 3), CancelToken()))
        stats = scheduler.stats()
    assert [type(e) for e in events] == [TokenSampled, Finished]
    assert done.finish_reason == "error" and done.error == "KeyError: 'usage'"
    assert done.usage.context_limit == 64 and done.token_ids == ()
    assert (stats.running, stats.kv_bytes_reserved) == (0, 0)


def test_an_exception_after_the_finished_event_adds_nothing(monkeypatch):
    def events_then_raise(lm, plan, cancel, started, *, model):
        yield cancelled_before_the_prompt(lm)
        raise KeyError("late")

    monkeypatch.setattr(scheduler_module, "planned_events", events_then_raise)
    lm = batched_fake_lm(script_replies({}))
    with BatchScheduler(lm) as scheduler:
        ticket = scheduler.submit(request(P1, 3), CancelToken())
        events, done = read(ticket)
        assert scheduler.stats().kv_bytes_reserved == 0
    assert done.finish_reason == "cancelled" and done.error is None
    assert ticket._events.empty()  # no second Finished behind the first


# --- the stand-in model a request's loop calls ---------------------------------------------------
def test_the_stand_in_forward_returns_what_the_model_forward_returns(monkeypatch):
    seen: dict = {}

    def probe(lm, plan, cancel, started, *, model):
        cache = model.new_cache(16)
        seen["capacity"] = cache.capacity
        seen["last"] = model.forward([BOS, HELLO, WORLD], cache)
        seen["rows"] = model.forward(np.array([BANG, HOW]), cache, all_logits=True)
        seen["picked"] = model.forward([ARE, YOU, A], cache, logits_at=[2, 0, 2])
        seen["none"] = model.forward([B], cache, logits_at=[])
        seen["tokens"] = list(cache.tokens)
        try:
            model.forward([], cache)
        except ValueError as exc:
            seen["empty"] = str(exc)
        try:
            model.forward([A] * 9, cache)
        except Exception as exc:
            seen["overflow"] = type(exc).__name__
        yield cancelled_before_the_prompt(lm)

    def logits_for(prefix):  # a different row for every prefix
        row = np.zeros(40, np.float32)
        row[: len(prefix)] = prefix
        return row[:38]

    monkeypatch.setattr(scheduler_module, "planned_events", probe)
    lm = batched_fake_lm(logits_for)
    with BatchScheduler(lm) as scheduler:
        finished(scheduler.submit(request(P1, 3), CancelToken()))
    reference, cache = ScriptedModel(logits_for), lm.model.new_cache(16)
    assert np.array_equal(seen["last"], reference.forward([BOS, HELLO, WORLD], cache))
    assert np.array_equal(seen["rows"], reference.forward([BANG, HOW], cache, all_logits=True))
    every = reference.forward([ARE, YOU, A], cache, all_logits=True)
    assert np.array_equal(seen["picked"], every[[2, 0, 2]])
    assert seen["last"].shape == (38,) and seen["rows"].shape == (2, 38)
    assert seen["none"].shape == (0, 38)  # a call may want no logits at all
    assert seen["tokens"] == [BOS, HELLO, WORLD, BANG, HOW, ARE, YOU, A, B]
    assert seen["capacity"] == 16 and "at least one token" in seen["empty"]
    assert seen["overflow"] == "ContextOverflowError"  # 9 cached + 9 > 16: refused up front


# --- the prefix cache ----------------------------------------------------------------------------
SYSTEM = (BOS, HELLO, WORLD, BANG)


def test_the_schedulers_prefix_cache_is_shared_by_its_requests():
    q1, q2 = (*SYSTEM, HOW), (*SYSTEM, ARE)
    lm = batched_fake_lm(script_replies({q1: [A, B], q2: [C, X]}))
    with BatchScheduler(lm, prefix_cache=PrefixCache()) as scheduler:
        first = finished(scheduler.submit(request(q1, 2), CancelToken()))
        second = finished(scheduler.submit(request(q2, 2), CancelToken()))
    assert first.usage.cached_tokens == 0
    assert second.usage.cached_tokens == 4  # the 4 shared tokens came from the first request
    assert (first.token_ids, second.token_ids) == ((A, B), (C, X))  # reuse is exact
    second_cache = caches_in_order(lm.model)[-1]
    assert lm.model.tokens_fed_to(second_cache) == [ARE, C]  # only the new token was prefilled


def test_a_requests_own_prefix_cache_wins_over_the_schedulers():
    q1 = (*SYSTEM, HOW)
    lm = batched_fake_lm(script_replies({q1: [A]}))
    shared, own = PrefixCache(), PrefixCache()
    with BatchScheduler(lm, prefix_cache=shared) as scheduler:
        finished(scheduler.submit(request(q1, 1), CancelToken()))
        mine = GenerationRequest(
            prompt_ids=list(q1), overrides={"max_new_tokens": 1}, prefix_cache=own
        )
        done = finished(scheduler.submit(mine, CancelToken()))
    # the shared cache held this very prompt, but the request asked for its own (empty) one
    assert done.usage.cached_tokens == 0 and done.token_ids == (A,)
    assert len(own) == 1 and len(shared) == 1  # its state went into its own cache only


def test_without_a_prefix_cache_nothing_is_reused():
    q1 = (*SYSTEM, HOW)
    lm = batched_fake_lm(script_replies({q1: [A]}))
    with BatchScheduler(lm) as scheduler:
        finished(scheduler.submit(request(q1, 1), CancelToken()))
        done = finished(scheduler.submit(request(q1, 1), CancelToken()))
    assert done.usage.cached_tokens is None


# --- how big a prefill slice beside running decodes is --------------------------------------------
def _long_prompt_slices(monkeypatch, runner_prompt, seconds_per_row) -> list[int]:
    """Run a decoding runner, then a 150-token prompt beside it, on a fake clock where a step of
    n rows takes n * seconds_per_row(step index, n) seconds; -> the long prompt's slice sizes."""
    clock = [0.0]
    monkeypatch.setattr(scheduler_module, "time", SimpleNamespace(perf_counter=lambda: clock[0]))
    long_prompt = (A,) * 150
    lm = batched_fake_lm(
        script_replies({runner_prompt: [C] * 60, long_prompt: [X]}), n_ctx=512, max_batch=128
    )
    model = lm.model
    pause = Pause()

    def on_step(segments):
        index, rows = len(model.steps) - 1, sum(len(s.ids) for s in segments)
        clock[0] += rows * seconds_per_row(index, rows)
        if index == 1:
            pause()

    model.on_step = on_step
    with BatchScheduler(lm, max_concurrency=2) as scheduler:
        runner = scheduler.submit(request(runner_prompt, 60), CancelToken())
        pause.wait_entered()  # the runner decodes (step 1): the long prompt is sliced beside it
        ticket = scheduler.submit(request(long_prompt, 1), CancelToken())
        pause.go.set()
        assert finished(ticket).token_ids == (X,)
        assert finished(runner).token_ids == (C,) * 60
    long_cache = caches_in_order(model)[1]
    return [len(ids_) for step in model.steps for c, ids_ in step if c is long_cache]


RUNNER_8 = (BOS,) + (B,) * 7  # an 8-token prompt: its prefill step (8 rows) is measured


def test_prefill_slices_follow_the_measured_time_per_row(monkeypatch):
    # step 0: the runner's 8-row prefill at 1/128 s a row; step 1: its 1-row decode at 1 s (a
    # step of under 8 rows says little about prefill: not measured); then 1/512 s a row.
    def seconds_per_row(index, rows):
        return {0: 1 / 128, 1: 1.0}.get(index, 1 / 512)

    slices = _long_prompt_slices(monkeypatch, RUNNER_8, seconds_per_row)
    # by hand: rows = int(0.1 s / mean), the mean moving 0.3 of the way to each step's time:
    # 1/128 -> 12.8 rows; 0.7/128 + 0.3/512 = 0.0060547 -> 16.5; 0.0048242 -> 20.7;
    # 0.0039629 -> 25.2; 0.0033600 -> 29.8; 0.0029379 -> 34.0; then the last 14 tokens whole
    assert slices == [12, 16, 20, 25, 29, 34, 14]


def test_a_slow_machine_still_prefills_eight_rows_a_step(monkeypatch):
    slices = _long_prompt_slices(monkeypatch, RUNNER_8, lambda index, rows: 1 / 16)
    # 0.1 s / (1/16 s) = 1.6 rows: never below one 8-row tile; the last 14 tokens are short
    # enough to go whole, as a decode does (DECODE_MAX_TOKENS)
    assert slices == [8] * 17 + [14]


def test_a_fast_machine_prefills_at_most_sixty_four_rows_beside_decodes(monkeypatch):
    slices = _long_prompt_slices(monkeypatch, RUNNER_8, lambda index, rows: 1 / 4096)
    assert slices == [64, 64, 22]  # 409 rows would take 0.1 s: capped at PREFILL_SLICE


def test_before_any_measurement_a_slice_is_sixty_four_rows(monkeypatch):
    # the runner's 2-token prefill and 1-token decodes are never measured: the first slice is
    # the default 64, then the steps with the slice in them set the pace (1/16 s a row: 8 rows)
    slices = _long_prompt_slices(monkeypatch, P1, lambda index, rows: 1 / 16)
    assert slices == [64] + [8] * 9 + [14]
