"""Prefix reuse (engine/prefix_cache.py): reused KV state gives the same logits as a full prefill.

Tiny random-weight models (llama, and gemma3 with a sliding window of 8 positions so the window
matters) run on the numpy reference backend; the oracle is the same model prefilling the whole
sequence from an empty cache.
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from engine.errors import ConfigValidationError
from engine.gguf import open_gguf
from engine.kernels.reference import ReferenceBackend
from engine.models import build_model
from engine.prefix_cache import PrefixCache, common_prefix_length

N_CTX = 96


def make_lm(path):
    model = build_model(open_gguf(path), backend=ReferenceBackend())
    return SimpleNamespace(model=model, n_ctx=N_CTX, path=path)


@pytest.fixture(scope="module", params=["llama", "gemma3"])
def lm(request, tiny_model_factory):
    return make_lm(tiny_model_factory(request.param))


def prefill(lm, tokens, cache=None):
    cache = cache if cache is not None else lm.model.new_cache(N_CTX)
    logits = lm.model.forward(tokens, cache)
    return cache, logits


def assert_same_as_fresh_prefill(lm, reused_logits, stored, tokens, n_reused):
    """Reuse adds no error at all: bit-identical to recomputing the stored sequence the way it
    was computed, cutting it at n_reused and feeding the rest. Against one single prefill of
    `tokens` the two differ only by float32 summation order (BLAS batch shapes)."""
    cache, _ = prefill(lm, stored)
    cache.truncate(n_reused)
    np.testing.assert_array_equal(reused_logits, lm.model.forward(tokens[n_reused:], cache))
    np.testing.assert_allclose(reused_logits, prefill(lm, tokens)[1], rtol=0, atol=1e-3)


def tokens_of(seed, n, vocab=49152):
    return [int(t) for t in np.random.default_rng(seed).integers(10, vocab, n)]


def test_common_prefix_length():
    assert common_prefix_length([1, 2, 3], [1, 2, 4, 5]) == 2
    assert common_prefix_length([1, 2], [1, 2, 3]) == 2
    assert common_prefix_length([], [1]) == 0
    assert common_prefix_length([7], [8]) == 0


def test_follow_up_turn_prefills_only_new_tokens_and_matches_full_prefill(lm):
    store = PrefixCache()
    turn1 = tokens_of(1, 30)
    cache, logits1 = prefill(lm, turn1)
    store.store(lm, turn1, cache, logits1)
    turn2 = turn1 + tokens_of(2, 25)  # > sliding window of 8 past the reused part

    hit = store.lookup(lm, turn2, min_capacity=N_CTX)
    assert hit.n_tokens == 30 and hit.next_logits is None
    assert_same_as_fresh_prefill(lm, lm.model.forward(turn2[30:], hit.cache), turn1, turn2, 30)
    assert hit.cache.tokens == turn2


def test_edit_reuses_up_to_the_first_changed_token(lm):
    store = PrefixCache()
    original = tokens_of(3, 40)
    cache, logits = prefill(lm, original)
    store.store(lm, original, cache, logits)
    edited = original[:17] + [original[17] + 1] + original[18:]

    hit = store.lookup(lm, edited, min_capacity=N_CTX)
    assert hit.n_tokens == 17
    assert_same_as_fresh_prefill(lm, lm.model.forward(edited[17:], hit.cache), original, edited, 17)


def test_exact_repeat_returns_the_stored_logits_without_a_forward_pass(lm):
    store = PrefixCache()
    prompt = tokens_of(4, 20)
    cache, logits = prefill(lm, prompt)
    store.store(lm, prompt, cache, logits)
    # the request then generates; at its end the loop stores the longer sequence
    cache.truncate(20)
    lm.model.forward([11, 12, 13], cache)
    store.store(lm, prompt + [11, 12, 13], cache, None)
    assert len(store) == 1  # the longer sequence replaced the prompt-only entry

    hit = store.lookup(lm, prompt, min_capacity=N_CTX)
    assert hit.n_tokens == 20
    np.testing.assert_array_equal(hit.next_logits, logits)
    # and the restored rows continue exactly like the original cache did
    assert_same_as_fresh_prefill(lm, lm.model.forward([11], hit.cache), prompt, prompt + [11], 20)


def test_full_match_without_logits_has_no_logits(lm):
    store = PrefixCache()
    seq = tokens_of(5, 12)
    cache, _ = prefill(lm, seq)
    store.store(lm, seq, cache, None)
    hit = store.lookup(lm, seq[:8], min_capacity=N_CTX)
    assert hit.n_tokens == 8 and hit.next_logits is None


def test_a_request_writing_to_its_copy_never_changes_the_stored_state(lm):
    store = PrefixCache()
    seq = tokens_of(6, 16)
    cache, logits = prefill(lm, seq)
    store.store(lm, seq, cache, logits)
    hit = store.lookup(lm, seq + [42], min_capacity=N_CTX)
    # a request that fails halfway: it scribbles over its rows and is never stored
    hit.cache.truncate(5)
    hit.cache.k[:] = 7.0
    hit.cache.v[:] = 7.0
    again = store.lookup(lm, seq + [42], min_capacity=N_CTX)
    assert again.n_tokens == 16
    assert_same_as_fresh_prefill(lm, lm.model.forward([42], again.cache), seq, seq + [42], 16)


def test_store_refuses_rows_that_do_not_belong_to_the_tokens(lm):
    store = PrefixCache()
    seq = tokens_of(7, 10)
    cache, _ = prefill(lm, seq)
    with pytest.raises(ValueError, match="differ"):
        store.store(lm, seq[:9], cache, None)
    with pytest.raises(ValueError, match="differ"):
        store.store(lm, seq[:9] + [seq[9] + 1], cache, None)
    assert len(store) == 0


def test_lru_eviction_keeps_the_byte_budget(lm):
    seqs = [tokens_of(10 + i, 20) for i in range(4)]
    caches = [prefill(lm, s)[0] for s in seqs]
    one_entry = PrefixCache()
    one_entry.store(lm, seqs[0], caches[0], None)
    entry_bytes = one_entry.nbytes
    assert entry_bytes == caches[0].k[:, :20].nbytes * 2

    store = PrefixCache(budget_bytes=2 * entry_bytes)
    store.store(lm, seqs[0], caches[0], None)
    store.store(lm, seqs[1], caches[1], None)
    assert store.lookup(lm, seqs[0], N_CTX).n_tokens == 20  # touch 0: now 1 is least recent
    store.store(lm, seqs[2], caches[2], None)
    assert len(store) == 2 and store.nbytes <= store.budget_bytes
    assert store.lookup(lm, seqs[1], N_CTX) is None
    assert store.lookup(lm, seqs[0], N_CTX).n_tokens == 20
    assert store.lookup(lm, seqs[2], N_CTX).n_tokens == 20

    tiny_budget = PrefixCache(budget_bytes=entry_bytes - 1)
    tiny_budget.store(lm, seqs[3], caches[3], None)
    assert len(tiny_budget) == 0


def test_entries_of_another_model_never_match(tiny_model_factory, lm):
    other = make_lm(tiny_model_factory("llama", seed=1))
    store = PrefixCache()
    seq = tokens_of(20, 10)
    cache, logits = prefill(lm, seq)
    store.store(lm, seq, cache, logits)
    assert store.lookup(other, seq, N_CTX) is None
    assert store.lookup(lm, seq, N_CTX).n_tokens == 10


def test_restored_cache_has_the_requested_capacity(lm):
    store = PrefixCache()
    seq = tokens_of(21, 10)
    cache, _ = prefill(lm, seq)
    store.store(lm, seq, cache, None)
    assert store.lookup(lm, seq + [5], min_capacity=40).cache.capacity == 40


def test_invalid_budget_is_refused():
    with pytest.raises(ConfigValidationError, match="budget"):
        PrefixCache(budget_bytes=-1)


# --- through the generation loop -----------------------------------------------------------------
from fake_model import id_token_lm  # noqa: E402

from engine.cancel import CancelToken  # noqa: E402
from engine.events import Finished  # noqa: E402
from engine.generate import GenerationRequest, generate  # noqa: E402


class CountingModel:
    """The real model, counting forward passes (and optionally failing on one)."""

    def __init__(self, model):
        self.inner, self.config = model, model.config
        self.calls: list[tuple[int, int]] = []  # (start position, n tokens)
        self.fail_at_call: int | None = None

    def new_cache(self, n_ctx):
        return self.inner.new_cache(n_ctx)

    def forward(self, tokens, cache, *, all_logits=False, cancel=None):
        self.calls.append((cache.n_tokens, len(tokens)))
        if self.fail_at_call is not None and len(self.calls) == self.fail_at_call:
            raise RuntimeError("simulated failure in the middle of a request")
        return self.inner.forward(tokens, cache, all_logits=all_logits)


@pytest.fixture
def loop_lm(lm, monkeypatch):
    return id_token_lm(CountingModel(lm.model), N_CTX, monkeypatch)


def finish(lm, prompt, cache=None, cancel=None, **overrides) -> Finished:
    overrides.setdefault("max_new_tokens", 8)
    request = GenerationRequest(
        prompt_ids=prompt, overrides=overrides, prefix_cache=cache, speculative=False
    )
    events = list(generate(lm, request, cancel))
    assert isinstance(events[-1], Finished)
    return events[-1]


@pytest.mark.parametrize(
    "sampling", [dict(), dict(do_sample=True, seed=1234, temperature=1.5, top_k=0)]
)
def test_chat_turns_with_reuse_equal_turns_without(loop_lm, sampling):
    cache = PrefixCache()
    prompt = tokens_of(30, 20)
    previous_fed = 0
    for turn in range(3):
        reused = finish(loop_lm, prompt, cache, **sampling)
        fresh = finish(loop_lm, prompt, None, **sampling)
        assert reused.error is None and fresh.error is None
        assert reused.token_ids == fresh.token_ids
        assert fresh.usage.cached_tokens is None
        if turn == 0:
            assert reused.usage.cached_tokens == 0
        else:
            # everything of the previous turn that was fed to the model is reused
            assert reused.usage.cached_tokens == previous_fed
        previous_fed = (
            len(prompt) + len(reused.token_ids) - 1
        )  # the last sampled token is never fed
        prompt = (
            prompt + list(reused.token_ids) + tokens_of(31 + turn, 6)
        )  # the user's next message


def test_regenerate_runs_no_prefill_pass(loop_lm):
    cache = PrefixCache()
    prompt = tokens_of(40, 18)
    first = finish(loop_lm, prompt, cache)
    calls_before = len(loop_lm.model.calls)
    again = finish(loop_lm, prompt, cache)
    assert again.usage.cached_tokens == len(prompt)
    assert again.token_ids == first.token_ids
    # every forward pass of the second request decodes a sampled token: none covers the prompt
    second = loop_lm.model.calls[calls_before:]
    assert all(start >= len(prompt) for start, _ in second)
    assert len(second) == len(again.token_ids) - 1


def test_edited_message_recomputes_from_the_first_change(loop_lm):
    cache = PrefixCache()
    prompt = tokens_of(41, 24)
    finish(loop_lm, prompt, cache)
    edited = prompt[:10] + tokens_of(42, 14)
    reused = finish(loop_lm, edited, cache)
    assert reused.usage.cached_tokens == 10
    assert reused.token_ids == finish(loop_lm, edited, None).token_ids


def test_a_failed_request_leaves_no_reusable_state_behind(loop_lm):
    cache = PrefixCache()
    prompt = tokens_of(43, 16)
    loop_lm.model.fail_at_call = len(loop_lm.model.calls) + 3  # prefill, decode, then fail
    failed = finish(loop_lm, prompt, cache)
    assert failed.finish_reason == "error"
    loop_lm.model.fail_at_call = None
    # only the finished prefill was stored; nothing the failed decode wrote
    assert [len(e.tokens) for e in cache._entries.values()] == [len(prompt)]
    retry = finish(loop_lm, prompt, cache)
    assert retry.usage.cached_tokens == len(prompt)
    assert retry.token_ids == finish(loop_lm, prompt, None).token_ids


def test_a_cancelled_request_stores_only_consistent_state(loop_lm):
    cache = PrefixCache()
    prompt = tokens_of(44, 16)
    cancel = CancelToken()
    seen = []

    original = loop_lm.model.forward

    def cancel_after_two_decodes(tokens, kv, **kwargs):
        seen.append(len(tokens))
        if len(seen) == 3:
            cancel.cancel()
        return original(tokens, kv, **kwargs)

    loop_lm.model.forward = cancel_after_two_decodes
    cancelled = finish(loop_lm, prompt, cache, cancel=cancel)
    loop_lm.model.forward = original
    assert cancelled.finish_reason == "cancelled"
    follow_up = prompt + list(cancelled.token_ids) + tokens_of(45, 4)
    reused = finish(loop_lm, follow_up, cache)
    assert reused.usage.cached_tokens >= len(prompt)
    assert reused.token_ids == finish(loop_lm, follow_up, None).token_ids


# --- real models: a chat that grows turn by turn --------------------------------------------------
def chat_turn(lm, request_kwargs, cache, **overrides):
    overrides.setdefault("max_new_tokens", 6)
    request = GenerationRequest(
        **request_kwargs, prefix_cache=cache, overrides=overrides, speculative=False
    )
    done = list(generate(lm, request))[-1]
    assert done.error is None, done.error
    return done


@pytest.mark.slow
@pytest.mark.parametrize(
    "sampling", [dict(do_sample=False), dict(do_sample=True, seed=7, temperature=0.8)]
)
def test_smollm2_chat_with_reuse_equals_without(smollm2, sampling):
    cache = PrefixCache()
    messages = []
    for turn, user in enumerate(["Hi! What is a prime number?", "Give one example.", "Thanks."]):
        messages.append({"role": "user", "content": user})
        reused = chat_turn(smollm2, dict(messages=list(messages)), cache, **sampling)
        fresh = chat_turn(smollm2, dict(messages=list(messages)), None, **sampling)
        assert reused.token_ids == fresh.token_ids
        if turn:
            # the previous turns' template text is reused; only the new message (and the
            # template tokens around it) is prefilled
            assert reused.usage.cached_tokens > reused.usage.prompt_tokens // 2
        messages.append({"role": "assistant", "content": reused.text})
    regenerated = chat_turn(smollm2, dict(messages=messages[:-1]), cache, **sampling)
    assert regenerated.usage.cached_tokens == regenerated.usage.prompt_tokens
    assert regenerated.token_ids == fresh.token_ids


@pytest.mark.slow
def test_gemma3_follow_up_with_reuse_equals_without(gemma3):
    cache = PrefixCache()
    first = "The three primary colors are"
    done = chat_turn(gemma3, dict(prompt=first), cache)
    follow = first + done.text + " Another fact about colors:"
    reused = chat_turn(gemma3, dict(prompt=follow), cache)
    assert reused.usage.cached_tokens >= len(gemma3.tokenizer.encode(first)) - 1
    assert reused.token_ids == chat_turn(gemma3, dict(prompt=follow), None).token_ids


@pytest.mark.slow
def test_gemma3_reuse_past_the_sliding_window_is_exact(gemma3_path):
    """A follow-up whose new tokens attend across the 512-position window of gemma3's local
    layers: the reused rows are the ones the window reaches, so any misplaced row would show."""
    from engine.loader import load_model

    lm = load_model(gemma3_path, n_ctx=1024)
    window = lm.config.sliding_window
    assert window == 512
    words = " ".join(f"item{i}" for i in range(180))
    first = f"A list of inventory codes: {words}."
    assert len(lm.tokenizer.encode(first)) > window + 8
    cache = PrefixCache()
    chat_turn(lm, dict(prompt=first), cache, max_new_tokens=2)
    follow = first + " The last code in the list is"
    reused = chat_turn(lm, dict(prompt=follow), cache, max_new_tokens=4)
    fresh = chat_turn(lm, dict(prompt=follow), None, max_new_tokens=4)
    assert reused.usage.cached_tokens > window
    assert reused.token_ids == fresh.token_ids
