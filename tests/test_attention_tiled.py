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
from engine.kernels.jit_backend import JitBackend, _attention_plan
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


SPLIT_CASES = [
    # p0, n_head, n_kv, hd, window, softcap, with sinks: decode whose n_kv items are fewer than
    # the fixture's chunks (4 per thread), so the keys are split and merged (split-K)
    (4095, 9, 3, 64, 0, 0.0, False),  # SmolLM2's shape at depth 4096
    (2 * 4 * TILE + 37, 9, 3, 64, 0, 0.0, False),  # 2 splits, the second ending mid-tile
    (4095, 12, 2, 128, 0, 0.0, False),  # Qwen2.5-1.5B's shape
    (3000, 9, 3, 64, 1000, 0.0, False),  # sliding window: both splits inside the window
    (1500, 6, 3, 64, 0, 30.0, False),  # soft-capped scores
    (1500, 6, 3, 64, 0, 0.0, True),  # sinks: counted once, in split 0's sum
    (900, 4, 1, 256, 512, 0.0, True),  # gemma3-like: one kv head, window, sinks
]


@pytest.mark.parametrize("cache_type", ["f16", "q8_0"])
@pytest.mark.parametrize("p0,n_head,n_kv,hd,window,softcap,with_sinks", SPLIT_CASES)
def test_split_key_decode_matches_the_reference(
    jit, monkeypatch, cache_type, p0, n_head, n_kv, hd, window, softcap, with_sinks
):
    monkeypatch.setattr(jit, "split_keys", True)  # opt-in: not bit-exact across batch shapes
    heads, splits = _attention_plan(1, n_head, n_kv, p0 + 1, jit.pool.default_chunks, True)
    assert heads == n_head // n_kv and splits > 1  # whole GQA groups, keys split
    rng = np.random.default_rng(p0 + n_head)
    k = (rng.standard_normal((p0 + 1, n_kv, hd)) * 2).astype(np.float32)
    v = rng.standard_normal((p0 + 1, n_kv, hd)).astype(np.float32)
    # Early keys that score far above the rest: the split holding them has a much larger
    # max than the others, so a merge that does not rescale by exp(m_s - M) is far off.
    k[:40] *= 4
    if cache_type == "q8_0":
        k, v = quantize_q8_0(k), quantize_q8_0(v)
    else:
        k, v = k.astype(np.float16), v.astype(np.float16)
    q = (rng.standard_normal((1, n_head, hd)) * 2).astype(np.float32)
    sinks = None
    if with_sinks:
        sinks = rng.standard_normal(n_head).astype(np.float32)
        sinks[0] = 40.0  # takes nearly all of head 0's mass
    kw = dict(p0=p0, scale=hd**-0.5, window=window, softcap=softcap, sinks=sinks)
    before = dict(jit.fallbacks)
    got = jit.attention(q, k, v, **kw)
    assert jit.fallbacks == before
    np.testing.assert_allclose(got, REF.attention(q, k, v, **kw), rtol=1e-4, atol=2e-5)


def test_split_plan():
    assert _attention_plan(1, 9, 3, 4096, 8, True) == (3, 8)  # 24 items: 3 per chunk
    assert _attention_plan(1, 12, 2, 4096, 8, True) == (6, 4)  # 8 items: 1 per chunk
    assert _attention_plan(1, 9, 3, 600, 8, True) == (3, 2)  # fewer keys: fewer splits
    assert _attention_plan(1, 9, 3, 100, 8, True) == (1, 1)  # too few keys: split the heads instead
    assert _attention_plan(1, 9, 3, 4096, 1, True) == (3, 1)  # one chunk: nothing to balance
    assert _attention_plan(32, 9, 3, 4096, 8, True) == (3, 1)  # prefill: items aplenty


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
