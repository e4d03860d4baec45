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
