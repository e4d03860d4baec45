"""KVCache: layout, accounting, truncate/clone semantics, overflow refusal."""

from types import SimpleNamespace

import numpy as np
import pytest

from engine.errors import ContextOverflowError
from engine.kv_cache import KVCache

CFG = SimpleNamespace(n_layers=3, n_kv_head=2, head_dim=8)


def test_layout_and_bytes():
    cache = KVCache.for_config(CFG, 16)
    assert cache.k.shape == cache.v.shape == (3, 16, 2, 8) and cache.k.dtype == np.float16
    assert cache.capacity == 16 and cache.n_tokens == 0
    assert cache.nbytes == KVCache.bytes_needed(CFG, 16) == 2 * 3 * 16 * 2 * 8 * 2
    k0, v0 = cache.layer(0)
    assert k0.shape == (16, 2, 8) and k0.flags.c_contiguous and np.shares_memory(k0, cache.k)


def test_bytes_needed_is_exact_for_huge_contexts_without_allocating():
    big = SimpleNamespace(n_layers=80, n_kv_head=8, head_dim=128)
    assert KVCache.bytes_needed(big, 10**9) == 2 * 80 * 10**9 * 8 * 128 * 2  # ~3.3e14, no overflow


def test_reserve_commit_truncate():
    cache = KVCache.for_config(CFG, 4)
    assert cache.reserve(3) == 0
    cache.commit([5, 6, 7])
    assert cache.n_tokens == 3 and cache.tokens == [5, 6, 7]
    with pytest.raises(
        ContextOverflowError, match="3 cached \\+ 2 new tokens exceed the context window of 4"
    ):
        cache.reserve(2)
    cache.truncate(1)
    assert cache.n_tokens == 1 and cache.tokens == [5]
    assert cache.reserve(3) == 1
    with pytest.raises(ValueError):
        cache.truncate(2)


def test_clone_is_independent():
    cache = KVCache.for_config(CFG, 4)
    cache.k[:, :2] = 1.5
    cache.commit([1, 2])
    copy = cache.clone()
    cache.k[:, :2] = 0
    cache.truncate(0)
    assert copy.n_tokens == 2 and copy.tokens == [1, 2] and np.all(copy.k[:, :2] == 1.5)


def test_zero_capacity_refused():
    with pytest.raises(ContextOverflowError):
        KVCache.for_config(CFG, 0)
