"""The tiled (online-softmax) JIT attention against the numpy reference, for both KV element
layouts (float16 and q8_0): GQA ratios 1/2/4/7, key counts that end mid-tile and span several
tiles, sliding windows, soft-capping, attention sinks, decode with fewer items than threads
(the group split across items) and prefill blocks after a prefix. q8_0 rows are checked
against gguf-py's own Q8_0 quantizer and dequantizer (an independent implementation)."""

import numpy as np
import pytest
from gguf import GGMLQuantizationType
from gguf import quants as gguf_quants

from engine.kernels.attention import TILE
from engine.kernels.jit_backend import JitBackend
from engine.kernels.reference import ReferenceBackend
from engine.kv_quant import dequantize_q8_0, element_layout, quantize_q8_0

REF = ReferenceBackend()


@pytest.fixture(scope="module")
def jit():
    b = JitBackend(n_threads=2)
    yield b
    b.close()


def _caches(rng, capacity, n_kv, hd, cache_type):
    k = (rng.standard_normal((capacity, n_kv, hd)) * 2).astype(np.float32)
    v = rng.standard_normal((capacity, n_kv, hd)).astype(np.float32)
    if cache_type == "q8_0":
        return quantize_q8_0(k), quantize_q8_0(v)
    return k.astype(np.float16), v.astype(np.float16)


CASES = [
    # tokens, p0, n_head, n_kv, hd, window, softcap
    (1, 0, 4, 4, 64, 0, 0.0),  # first decode step, MHA (ratio 1)
    (1, 4095, 14, 2, 64, 0, 0.0),  # decode at depth 4096, ratio 7
    (1, 2 * TILE + 5, 8, 4, 128, 0, 0.0),  # ratio 2, keys end mid-tile
    (1, 700, 4, 1, 256, 512, 0.0),  # decode past the sliding window, ratio 4 split over items
    (7, TILE - 3, 8, 2, 32, 0, 0.0),  # prefill block crossing a tile edge, ratio 4
    (33, 3, 7, 1, 96, 0, 0.0),  # ratio 7, one kv head
    (5, 20, 2, 2, 32, 4, 0.0),  # tiny window
    (3, 40, 4, 2, 64, 0, 50.0),  # soft-capped scores
    (13, 150, 6, 3, 64, 70, 0.0),  # window inside a tile run
]


@pytest.mark.parametrize("cache_type", ["f16", "q8_0"])
@pytest.mark.parametrize("tokens,p0,n_head,n_kv,hd,window,softcap", CASES)
def test_tiled_attention_matches_the_reference(
    jit, cache_type, tokens, p0, n_head, n_kv, hd, window, softcap
):
    rng = np.random.default_rng(tokens * 31 + p0 + n_head)
    capacity = p0 + tokens + 2
    k, v = _caches(rng, capacity, n_kv, hd, cache_type)
    assert element_layout(k, hd) == cache_type
    q = rng.standard_normal((tokens, n_head, hd)).astype(np.float32)
    kw = dict(p0=p0, scale=hd**-0.5, window=window, softcap=softcap)
    expected = REF.attention(q, k, v, **kw)
    before = dict(jit.fallbacks)
    out = np.full((tokens, n_head * hd), np.nan, np.float32)
    jit.attention(q, k, v, out=out, **kw)
    assert jit.fallbacks == before  # the kernel ran, not the numpy fallback
    np.testing.assert_allclose(out, expected, rtol=1e-4, atol=2e-5)


@pytest.mark.parametrize("cache_type", ["f16", "q8_0"])
@pytest.mark.parametrize(
    "tokens,p0,n_head,n_kv,hd,window",
    [(1, 0, 4, 1, 64, 0), (1, 300, 8, 2, 64, 128), (9, 2 * TILE, 4, 2, 32, 0)],
)
def test_tiled_attention_with_sinks(jit, cache_type, tokens, p0, n_head, n_kv, hd, window):
    rng = np.random.default_rng(tokens + p0)
    capacity = p0 + tokens
    k, v = _caches(rng, capacity, n_kv, hd, cache_type)
    q = rng.standard_normal((tokens, n_head, hd)).astype(np.float32)
    sinks = rng.standard_normal(n_head).astype(np.float32)
    sinks[:2] = [40.0, -40.0]  # one sink that takes nearly all the mass, one that takes none
    kw = dict(p0=p0, scale=hd**-0.5, window=window, sinks=sinks)
    np.testing.assert_allclose(
        jit.attention(q, k, v, **kw), REF.attention(q, k, v, **kw), rtol=1e-4, atol=2e-5
    )


def test_tiled_attention_against_float64_softmax_by_hand(jit):
    """One decode query over several tiles, computed directly in float64."""
    rng = np.random.default_rng(5)
    n_keys, n_head, n_kv, hd = 3 * TILE + 17, 6, 2, 64
    k, v = _caches(rng, n_keys, n_kv, hd, "f16")
    q = rng.standard_normal((1, n_head, hd)).astype(np.float32) * 3
    got = jit.attention(q, k, v, p0=n_keys - 1, scale=hd**-0.5)
    for h in range(n_head):
        keys = k[:, h // 3].astype(np.float64)
        s = keys @ q[0, h].astype(np.float64) * hd**-0.5
        p = np.exp(s - s.max())
        mixed = (p / p.sum()) @ v[:, h // 3].astype(np.float64)
        np.testing.assert_allclose(got[0, h * hd : (h + 1) * hd], mixed, rtol=1e-4, atol=1e-5)


def test_q8_0_rows_match_gguf_py():
    rng = np.random.default_rng(9)
    x = (rng.standard_normal((5, 3, 128)) * rng.uniform(0.01, 30, (5, 3, 1))).astype(np.float32)
    x[0, 0, :32] = 0.0  # an all-zero block: scale 0, every q 0
    x[1, 1, :32] = 0.5 * np.arange(32) - 8.0  # exact halves: ties round away from zero
    ours = quantize_q8_0(x)
    theirs = gguf_quants.quantize(x.reshape(-1, 128), GGMLQuantizationType.Q8_0)
    np.testing.assert_array_equal(ours.reshape(theirs.shape), theirs)
    np.testing.assert_array_equal(
        dequantize_q8_0(ours, 128).reshape(-1, 128),
        gguf_quants.dequantize(theirs, GGMLQuantizationType.Q8_0),
    )
    assert ours.shape == (5, 3, 4 * 34)
