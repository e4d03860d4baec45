"""Two generations on one loaded model, and cancellation inside a prefill chunk (issue 17).

Each request owns its KV cache and sampler; the model's activation buffers and the JIT
backend's bound buffers are shared, so forward chunks take turns under the model's forward
lock. Expected outputs are each request run alone on the same model (greedy), not stored text.
"""

from __future__ import annotations

import threading

import numpy as np
import pytest

from engine.cancel import CancelToken, ForwardCancelled
from engine.events import Finished, TokenSampled
from engine.generate import GenerationRequest, generate
from engine.loader import load_model
from engine.prefix_cache import PrefixCache

PROMPTS = [
    "Write a short poem about the sea.",
    "List three prime numbers and explain why each one is prime.",
]
JOIN_TIMEOUT_S = 300  # generous: the machine is shared; a deadlock never finishes at all


@pytest.fixture(scope="module")
def lm(smollm2_path):
    model = load_model(smollm2_path, n_ctx=512)
    yield model
    model.close()


def request(prompt: str, max_new_tokens: int = 24, **kwargs) -> GenerationRequest:
    return GenerationRequest(
        messages=[{"role": "user", "content": prompt}],
        overrides={"max_new_tokens": max_new_tokens, "do_sample": False},
        speculative=False,
        **kwargs,
    )


def finished(events) -> Finished:
    done = [e for e in events if isinstance(e, Finished)]
    assert len(done) == 1
    return done[0]


class TripAfter:
    """A cancel token that reports cancelled from its (n+1)-th poll on: a deterministic cancel
    at a known point inside a forward pass."""

    def __init__(self, n: int):
        self.n, self.polls = n, 0

    @property
    def cancelled(self) -> bool:
        self.polls += 1
        return self.polls > self.n


def run_threads(targets) -> None:
    threads = [threading.Thread(target=t, daemon=True) for t in targets]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(JOIN_TIMEOUT_S)
    assert not any(t.is_alive() for t in threads), "a generation deadlocked"


def test_two_generations_at_once_give_what_each_gives_alone(lm):
    alone = [finished(generate(lm, request(p))) for p in PROMPTS]
    assert alone[0].token_ids != alone[1].token_ids
    for _ in range(2):
        results: list[Finished | None] = [None, None]
        start = threading.Barrier(2)

        def worker(i: int, results=results, start=start) -> None:
            events = generate(lm, request(PROMPTS[i]))
            start.wait()
            results[i] = finished(events)

        run_threads([lambda i=i: worker(i) for i in range(2)])
        for got, expected in zip(results, alone, strict=True):
            assert got.error is None
            assert got.token_ids == expected.token_ids and got.text == expected.text


def test_cancelling_one_generation_leaves_the_other_exact(lm):
    alone = finished(generate(lm, request(PROMPTS[1])))
    cancel = CancelToken()
    first_token = threading.Event()
    results: dict[str, Finished] = {}

    def cancelled_one() -> None:
        events = []
        for event in generate(lm, request(PROMPTS[0], max_new_tokens=200), cancel):
            events.append(event)
            if isinstance(event, TokenSampled):
                first_token.set()
        results["cancelled"] = finished(events)

    def other() -> None:
        first_token.wait(JOIN_TIMEOUT_S)
        events = generate(lm, request(PROMPTS[1]))
        for event in events:
            if isinstance(event, TokenSampled) and event.index == 2:
                cancel.cancel()  # while both are generating
            if isinstance(event, Finished):
                results["other"] = event

    run_threads([cancelled_one, other])
    assert results["cancelled"].finish_reason == "cancelled"
    assert len(results["cancelled"].token_ids) < 200
    assert results["other"].token_ids == alone.token_ids and results["other"].text == alone.text


def test_a_forward_cancelled_inside_a_chunk_commits_nothing(lm):
    rng = np.random.default_rng(0)
    head, chunk = rng.integers(100, 20000, 40).tolist(), rng.integers(100, 20000, 100).tolist()
    cache = lm.model.new_cache(200)
    lm.model.forward(head, cache)
    before_k, before_v = cache.k[:, : len(head)].copy(), cache.v[:, : len(head)].copy()
    # 10 polls in: inside the second layer of the chunk, after rows p0.. of layer 0 were written
    with pytest.raises(ForwardCancelled):
        lm.model.forward(chunk, cache, cancel=TripAfter(10))
    assert cache.n_tokens == len(head) and cache.tokens == head
    assert np.array_equal(cache.k[:, : len(head)], before_k)
    assert np.array_equal(cache.v[:, : len(head)], before_v)
    # Continuing from the untouched cache gives what a cache that was never cancelled gives.
    resumed = lm.model.forward(chunk, cache)
    fresh = lm.model.new_cache(200)
    lm.model.forward(head, fresh)
    assert np.array_equal(resumed, lm.model.forward(chunk, fresh))


def test_a_cancelled_prefill_leaves_nothing_in_the_prefix_cache(lm):
    prefix_cache = PrefixCache()
    long_prompt = " ".join(f"Sentence {i} is about a boat on a lake." for i in range(30))
    done = finished(generate(lm, request(long_prompt, prefix_cache=prefix_cache), TripAfter(8)))
    assert done.finish_reason == "cancelled" and done.token_ids == ()
    assert len(prefix_cache) == 0
    again = finished(generate(lm, request(long_prompt, prefix_cache=prefix_cache)))
    fresh = finished(generate(lm, request(long_prompt)))
    assert again.usage.cached_tokens == 0
    assert again.token_ids == fresh.token_ids
