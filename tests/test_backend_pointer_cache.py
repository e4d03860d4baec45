"""The JIT backend's per-array address cache: it pins no array, and an array that reuses a dead
one's id gets its own address, never the stale one."""

import gc
import weakref

import numpy as np
import pytest

from engine.kernels.jit_backend import JitBackend
from engine.kv_cache import KVCache


@pytest.fixture(scope="module")
def backend():
    b = JitBackend(n_threads=1)
    yield b
    b.close()


def test_a_cached_address_keeps_no_array_alive(backend):
    big = np.zeros(1 << 22, np.float32)  # 16 MB: a KV layer of a long context
    assert backend._ptr(big) == big.ctypes.data
    ref = weakref.ref(big)
    del big
    gc.collect()
    assert ref() is None


def test_reused_ids_get_their_own_address(backend):
    seen_reuse = False
    ids = set()
    for i in range(2000):
        a = np.full(64 + i % 3, i, np.float32)  # freed each round: CPython reuses the ids
        seen_reuse |= id(a) in ids
        ids.add(id(a))
        assert backend._ptr(a) == a.ctypes.data
        assert backend._ptr(a) == a.ctypes.data  # and the hit is the same
    assert seen_reuse


def test_kv_layer_views_are_the_same_objects_every_call():
    cache = KVCache(3, 8, 2, 16)
    k, v = cache.layer(1)
    assert cache.layer(1)[0] is k and cache.layer(1)[1] is v
    cache.write(1, 0, np.ones((1, 2, 16), np.float32), np.full((1, 2, 16), 2, np.float32))
    assert k[0].tolist() == [[1.0] * 16] * 2 and v[0, 0, 0] == 2.0
