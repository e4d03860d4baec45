"""BatchScheduler on the real models: batched == alone, admission, cancellation, prefix reuse, load.

"Alone" is engine.generate.generate on the same model, the independent path: the scheduler must
give every request exactly those tokens whatever runs beside it (greedy, and seeded sampling).
"""

from __future__ import annotations

import random
import threading
import time

import pytest

from engine.batching import BatchScheduler
from engine.batching.forward_work import DECODE_MAX_TOKENS
from engine.cancel import CancelToken
from engine.errors import KVAdmissionError, QueueFullError, SchedulerClosedError
from engine.events import Finished, TokenSampled
from engine.generate import generate
from engine.kv_cache import KVCache
from engine.prefix_cache import PrefixCache
from engine.types import FinishReason, GenerationRequest

DEADLINE = 120.0  # seconds; generous for a loaded shared machine, never reached when it works


def _request(lm, topic: str, max_new: int, **overrides) -> GenerationRequest:
    values = {"max_new_tokens": max_new, **overrides}
    if "temperature" not in overrides:
        # greedy, stated: a chat request of a model whose checkpoint states no sampling values
        # otherwise samples with the LocalChat chat defaults (and a fresh seed each run)
        values["do_sample"] = False
    if lm.chat_template is not None and lm.config.arch != "gemma3":
        return GenerationRequest(
            messages=[{"role": "user", "content": f"Write about {topic}."}], overrides=values
        )
    return GenerationRequest(prompt=f"Here is a short story about {topic}:", overrides=values)


def _alone(lm, request: GenerationRequest) -> Finished:
    events = list(generate(lm, request, CancelToken()))
    assert isinstance(events[-1], Finished)
    return events[-1]


class _Reader:
    """Reads a ticket's events on its own thread (as a server connection would)."""

    def __init__(
        self, ticket, *, cancel_after: int | None = None, token: CancelToken | None = None
    ):
        self.ticket, self.events = ticket, []
        self.tokens_seen = threading.Event()
        self._cancel_after, self._token = cancel_after, token
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self):
        n = 0
        for event in self.ticket.events():
            self.events.append(event)
            if isinstance(event, TokenSampled):
                n += 1
                if n >= 3:
                    self.tokens_seen.set()
                if self._cancel_after is not None and n == self._cancel_after:
                    self._token.cancel()

    def finished(self) -> Finished:
        self.thread.join(DEADLINE)
        assert not self.thread.is_alive(), "the request never finished"
        done = [e for e in self.events if isinstance(e, Finished)]
        assert len(done) == 1 and self.events[-1] is done[0]
        return done[0]


def _stamp_events(ticket, scheduler) -> list:
    """Record (time, scheduler steps so far, event) as the scheduler produces each event: a
    reader may lag behind the producer, so "when" must be taken on the producing side."""
    stamps: list = []
    put = ticket._put

    def stamped(event):
        stamps.append((time.perf_counter(), scheduler.stats().steps, event))
        put(event)

    ticket._put = stamped
    return stamps


# One test function per model (not a fixture looked up by name at run time): the real-model
# fixture must be a visible dependency, so tests/conftest.py marks the test `slow`.
def test_batched_tokens_equal_alone_with_staggered_starts_and_finishes_smollm2(smollm2):
    _check_batched_tokens_equal_alone(smollm2)


def test_batched_tokens_equal_alone_with_staggered_starts_and_finishes_gemma3(gemma3):
    _check_batched_tokens_equal_alone(gemma3)


def _check_batched_tokens_equal_alone(lm):
    # greedy and seeded requests, different lengths (they finish at different steps), and two
    # of them submitted while the first ones are already decoding (their prefill interleaves)
    requests = [
        _request(lm, "cats", 24),
        _request(lm, "the sea", 16, temperature=0.9, seed=7),
        _request(lm, "bread", 30, temperature=1.1, top_k=40, seed=11),
        _request(lm, "a lighthouse keeper and a storm at night", 10),
    ]
    alone = [_alone(lm, r) for r in requests]
    with BatchScheduler(lm, max_concurrency=4) as scheduler:
        first = [_Reader(scheduler.submit(r, CancelToken())) for r in requests[:2]]
        assert first[0].tokens_seen.wait(DEADLINE)
        later = [_Reader(scheduler.submit(r, CancelToken())) for r in requests[2:]]
        results = [reader.finished() for reader in first + later]
        steps = scheduler.stats().steps
    for got, want in zip(results, alone, strict=True):
        assert got.token_ids == want.token_ids
        assert got.text == want.text
        assert got.finish_reason == want.finish_reason
        assert got.usage.completion_tokens == want.usage.completion_tokens
    # batched: far fewer forward passes than tokens generated (one step serves everyone)
    generated = sum(r.usage.completion_tokens for r in results)
    assert steps < generated


def test_cancel_mid_stream_frees_kv_and_leaves_the_others_alone(smollm2):
    lm = smollm2
    keep, doomed = _request(lm, "cats", 24), _request(lm, "dogs", 200)
    want = _alone(lm, keep)
    with BatchScheduler(lm, max_concurrency=4) as scheduler:
        token = CancelToken()
        ticket = scheduler.submit(doomed, token)
        stamps = _stamp_events(ticket, scheduler)
        victim = _Reader(ticket)
        other = _Reader(scheduler.submit(keep, CancelToken()))
        assert victim.tokens_seen.wait(DEADLINE)
        cancelled_at = time.perf_counter()
        token.cancel()
        cancelled = victim.finished()
        assert cancelled.finish_reason == FinishReason.CANCELLED
        assert cancelled.usage.completion_tokens < 200
        # within one step of the cancel: at most the token being sampled right then
        late = [e for t, _s, e in stamps if t > cancelled_at and isinstance(e, TokenSampled)]
        assert len(late) <= 1
        got = other.finished()
        assert got.token_ids == want.token_ids
        stats = scheduler.stats()
        assert (stats.running, stats.queued, stats.kv_bytes_reserved) == (0, 0, 0)


def test_a_request_that_can_never_fit_names_its_bytes(smollm2):
    lm = smollm2
    request = _request(lm, "cats", 40)
    with BatchScheduler(lm, kv_budget_bytes=10_000_000) as scheduler:
        ticket = scheduler.submit(request, CancelToken())
        per_position = KVCache.bytes_needed(lm.config, 1)
        needed = ticket.kv_bytes
        assert needed == per_position * (ticket.prompt_tokens + 40)
        _Reader(ticket).finished()
    with BatchScheduler(lm, kv_budget_bytes=needed - 1) as scheduler:
        with pytest.raises(KVAdmissionError) as info:
            scheduler.submit(request, CancelToken())
        err = info.value
        assert err.never_fits and err.bytes_needed == needed and err.budget_bytes == needed - 1
        assert str(needed) in str(err)
        assert scheduler.stats().kv_bytes_reserved == 0


def test_full_queue_is_refused_and_the_queued_request_runs_after_the_first(smollm2):
    lm = smollm2
    first, second, third = (_request(lm, t, 12) for t in ("cats", "dogs", "owls"))
    want_second = _alone(lm, second)
    with BatchScheduler(lm, max_concurrency=1, max_queue=1) as scheduler:
        hold = CancelToken()
        running = scheduler.submit(_request(lm, "cats", 300), hold)
        assert running.queue_position == 0
        queued = scheduler.submit(second, CancelToken())
        assert queued.queue_position == 1 and not queued.admitted
        with pytest.raises(QueueFullError) as info:
            scheduler.submit(third, CancelToken())
        assert info.value.max_queue == 1
        stats = scheduler.stats()
        assert (stats.running, stats.queued) == (1, 1)
        reader = _Reader(queued)
        assert _Reader(running, cancel_after=2, token=hold).finished().finish_reason == "cancelled"
        assert reader.finished().token_ids == want_second.token_ids
        assert queued.admitted
        del first


def test_kv_budget_queues_what_does_not_fit_next_to_the_running(smollm2):
    lm = smollm2
    a, b = _request(lm, "cats", 20), _request(lm, "dogs", 20)
    with BatchScheduler(lm) as probe:
        one = probe.submit(a, CancelToken())
        _Reader(one).finished()
    budget = one.kv_bytes * 3 // 2  # room for one of them at a time
    with BatchScheduler(lm, max_concurrency=4, kv_budget_bytes=budget) as scheduler:
        ta = scheduler.submit(a, CancelToken())
        tb = scheduler.submit(b, CancelToken())
        assert (ta.queue_position, tb.queue_position) == (0, 1)
        ra, rb = _Reader(ta), _Reader(tb)
        assert ra.finished().token_ids == _alone(lm, a).token_ids
        assert rb.finished().token_ids == _alone(lm, b).token_ids


def test_a_cancelled_queued_request_ends_without_running(smollm2):
    lm = smollm2
    with BatchScheduler(lm, max_concurrency=1) as scheduler:
        hold = CancelToken()
        running = scheduler.submit(_request(lm, "cats", 300), hold)
        token = CancelToken()
        queued = scheduler.submit(_request(lm, "dogs", 10), token)
        token.cancel()
        done = _Reader(queued).finished()
        assert done.finish_reason == FinishReason.CANCELLED and done.token_ids == ()
        assert done.usage.prompt_tokens == queued.prompt_tokens
        assert scheduler.stats().queued == 0
        hold.cancel()
        _Reader(running).finished()


def test_prefix_cache_is_shared_across_requests(smollm2):
    lm = smollm2
    system = {"role": "system", "content": "You are a terse assistant who answers in one line."}

    def ask(question: str) -> GenerationRequest:
        return GenerationRequest(
            messages=[system, {"role": "user", "content": question}],
            overrides={"max_new_tokens": 8, "do_sample": False},
        )

    with BatchScheduler(lm, prefix_cache=PrefixCache()) as scheduler:
        first = _Reader(scheduler.submit(ask("What is a cat?"), CancelToken())).finished()
        second = _Reader(scheduler.submit(ask("What is a dog?"), CancelToken())).finished()
    assert first.usage.cached_tokens == 0
    assert second.usage.cached_tokens is not None and second.usage.cached_tokens > 5
    assert second.token_ids == _alone(lm, ask("What is a dog?")).token_ids  # reuse is exact


def test_closed_scheduler_refuses_and_close_cancels_running(smollm2):
    lm = smollm2
    scheduler = BatchScheduler(lm)
    reader = _Reader(scheduler.submit(_request(lm, "cats", 400), CancelToken()))
    assert reader.tokens_seen.wait(DEADLINE)
    scheduler.close()
    assert reader.finished().finish_reason == FinishReason.CANCELLED
    with pytest.raises(SchedulerClosedError):
        scheduler.submit(_request(lm, "dogs", 4), CancelToken())


def test_load_40_requests_8_concurrent_none_lost_or_duplicated(smollm2):
    lm = smollm2
    rng = random.Random(13)
    topics = ["cats", "rain", "a small boat", "chess"]
    longest = {t: _alone(lm, _request(lm, t, 24)).token_ids for t in topics}
    per_position = KVCache.bytes_needed(lm.config, 1)
    budget = per_position * 400  # about 8 typical requests; a 400-token one can never fit
    scheduler = BatchScheduler(lm, max_concurrency=8, kv_budget_bytes=budget, max_queue=40)
    readers, refused, plans = [], 0, []
    try:
        for i in range(40):
            topic = rng.choice(topics)
            impossible = i % 9 == 4
            max_new = 400 if impossible else rng.randint(1, 24)
            cancel_after = rng.randint(1, 6) if i % 5 == 2 else None
            token = CancelToken()
            try:
                ticket = scheduler.submit(_request(lm, topic, max_new), token)
            except KVAdmissionError as err:
                assert impossible and err.never_fits and err.bytes_needed > budget
                refused += 1
                continue
            assert not impossible
            readers.append(_Reader(ticket, cancel_after=cancel_after, token=token))
            plans.append((topic, max_new, cancel_after))
        results = [r.finished() for r in readers]
        stats = scheduler.stats()
    finally:
        scheduler.close()
    assert refused == 4 and len(results) == 36
    for (topic, max_new, cancel_after), got in zip(plans, results, strict=True):
        want = longest[topic]
        assert got.token_ids == want[: len(got.token_ids)]  # each stream is its own, in order
        if got.finish_reason == FinishReason.CANCELLED:
            assert cancel_after is not None
        else:
            assert got.token_ids == want[:max_new] or got.finish_reason == FinishReason.STOP
    assert (stats.running, stats.queued, stats.kv_bytes_reserved) == (0, 0, 0)


def test_cancel_after_the_first_prefill_slice_stops_the_rest_of_the_call(smollm2, monkeypatch):
    # Cancelled right after its first prefill slice has run (from the forward pass itself, on the
    # scheduler thread), the long prompt's 256-token call is still under way: the generation loop
    # looks at the token only between calls, so only the scheduler's step-level cancel can keep
    # the call's other slices from running. (Cancelling before the first slice would be caught by
    # the loop's own check before the call, and prove nothing about the scheduler.)
    lm = smollm2
    model = lm.model
    prompt = list(lm.tokenizer.encode(" ".join(["The river runs to the sea."] * 80)))[:450]
    token = CancelToken()
    armed = threading.Event()
    long_cache: list = []
    fed: list[int] = []  # tokens fed into the long prompt's cache, per step
    real_forward_segments = model.forward_segments

    def forward_segments(segments, cancel=None):
        out = real_forward_segments(segments, cancel)
        if armed.is_set():
            for seg in segments:
                if long_cache and seg.cache is long_cache[0]:
                    fed.append(len(seg.ids))
                elif not long_cache and len(seg.ids) > DECODE_MAX_TOKENS:  # the runner decodes
                    long_cache.append(seg.cache)
                    fed.append(len(seg.ids))
                    token.cancel()
        return out

    monkeypatch.setattr(model, "forward_segments", forward_segments)
    with BatchScheduler(lm, max_concurrency=2) as scheduler:
        hold = CancelToken()
        runner = _Reader(scheduler.submit(_request(lm, "cats", 400), hold))
        assert runner.tokens_seen.wait(DEADLINE)  # decoding: the long prompt goes in slices
        armed.set()
        ticket = scheduler.submit(
            GenerationRequest(prompt_ids=prompt, overrides={"max_new_tokens": 4}), token
        )
        done = _Reader(ticket).finished()
        assert done.finish_reason == FinishReason.CANCELLED and done.usage.completion_tokens == 0
        # one slice ran; the rest of the call (256 tokens) never did ...
        assert len(fed) == 1 and fed[0] < 256
        # ... and the slice that ran was taken back out of the request's cache
        assert long_cache[0].n_tokens == 0
        hold.cancel()
        assert runner.finished().finish_reason == FinishReason.CANCELLED
        assert scheduler.stats().kv_bytes_reserved == 0
