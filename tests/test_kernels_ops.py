"""JIT RMSNorm, RoPE, SwiGLU/GeGLU/gpt-oss's clamped SwiGLU and attention against the numpy
reference backend, over random shapes: lengths that are not a multiple of the 16-lane vectors,
GQA groups, sliding windows shorter and longer than the context, soft-capping, attention sinks,
prefill chunks after a prefix."""

import numpy as np
import pytest

from engine.kernels.jit_backend import JitBackend
from engine.kernels.reference import ReferenceBackend

REF = ReferenceBackend()


@pytest.fixture(scope="module")
def jit():
    b = JitBackend(n_threads=2)
    yield b
    b.close()


@pytest.mark.parametrize("rows,d", [(1, 640), (3, 33), (17, 16), (2, 7), (300, 256)])
def test_rmsnorm(jit, rows, d):
    rng = np.random.default_rng(d)
    x = (rng.standard_normal((rows, d)) * 3).astype(np.float32)
    w = rng.standard_normal(d).astype(np.float32)
    expected = REF.rmsnorm(x, w, 1e-6)
    np.testing.assert_allclose(jit.rmsnorm(x, w, 1e-6), expected, rtol=2e-5, atol=2e-5)
    inplace = x.copy()
    jit.rmsnorm(inplace, w, 1e-6, out=inplace)
    np.testing.assert_allclose(inplace, expected, rtol=2e-5, atol=2e-5)


@pytest.mark.parametrize("op", ["swiglu", "geglu"])
@pytest.mark.parametrize("shape", [(1, 2048), (3, 37), (5, 1), (70, 1000)])
def test_gated_activations(jit, op, shape):
    rng = np.random.default_rng(shape[1])
    gate = (rng.standard_normal(shape) * 4).astype(np.float32)
    gate.flat[:3] = [-100.0, 100.0, 0.0]  # exp range limits
    up = rng.standard_normal(shape).astype(np.float32)
    with np.errstate(over="ignore"):  # the reference overflows exp(100) to inf, correctly
        expected = getattr(REF, op)(gate, up)
    got = getattr(jit, op)(gate, up)
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)
    getattr(jit, op)(gate, up, out=gate)  # aliasing the gate, as the model does
    np.testing.assert_allclose(gate, expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("shape", [(1, 2880), (3, 37), (4, 1000)])
def test_clamped_swiglu(jit, shape):
    """gpt-oss's expert activation with values on both sides of both clamps (limit 7)."""
    rng = np.random.default_rng(shape[1])
    gate = (rng.standard_normal(shape) * 6).astype(np.float32)
    up = (rng.standard_normal(shape) * 6).astype(np.float32)
    gate.flat[:4] = [-100.0, 100.0, 7.0, 0.0]
    up.flat[:4] = [-100.0, 100.0, -7.0, 0.0]
    kw = dict(alpha=1.702, limit=7.0)
    g, u = np.minimum(gate, 7.0), np.clip(up, -7.0, 7.0)  # transformers' _apply_gate, by hand
    with np.errstate(over="ignore"):  # exp(170) overflows to inf, correctly
        expected = REF.swiglu_oai(gate, up, **kw)
        by_hand = g / (1 + np.exp(-1.702 * g)) * (u + 1)
    np.testing.assert_allclose(expected, by_hand, rtol=1e-6)
    assert expected.flat[1] == np.float32(7.0 / (1 + np.exp(-1.702 * 7.0)) * 8.0)
    np.testing.assert_allclose(jit.swiglu_oai(gate, up, **kw), expected, rtol=1e-5, atol=1e-5)
    jit.swiglu_oai(gate, up, out=gate, **kw)  # aliasing the gate, as the model does
    np.testing.assert_allclose(gate, expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("neox", [True, False])
@pytest.mark.parametrize("tokens,heads,hd,p0", [(1, 4, 256, 5000), (7, 3, 64, 0), (2, 1, 6, 31)])
def test_rope(jit, neox, tokens, heads, hd, p0):
    rng = np.random.default_rng(hd)
    x = rng.standard_normal((tokens, heads, hd)).astype(np.float32)
    pos = np.arange(p0, p0 + tokens, dtype=np.int32)
    expected = REF.rope(x.copy(), pos, theta=10000.0, neox=neox, freq_scale=0.5)
    got = jit.rope(x.copy(), pos, theta=10000.0, neox=neox, freq_scale=0.5)
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("neox", [True, False])
@pytest.mark.parametrize("tokens,heads,hd,p0", [(1, 4, 128, 70000), (5, 2, 8, 3)])
def test_rope_with_freq_factors_runs_the_jit_kernel_and_matches(
    jit, monkeypatch, neox, tokens, heads, hd, p0
):
    """Llama 3.1 rope_freqs / YaRN / LongRoPE divisors are folded into the JIT frequency table,
    not handed to the numpy rope (which this test makes unusable)."""
    rng = np.random.default_rng(hd + 1)
    x = rng.standard_normal((tokens, heads, hd)).astype(np.float32)
    pos = np.arange(p0, p0 + tokens, dtype=np.int32)
    factors = rng.uniform(1.0, 40.0, hd // 2).astype(np.float32)
    args = dict(theta=500000.0, neox=neox, freq_scale=0.25, freq_factors=factors)
    expected = REF.rope(x.copy(), pos, **args)

    def refused(*a, **k):
        raise AssertionError("the JIT backend fell back to the numpy rope")

    monkeypatch.setattr(ReferenceBackend, "rope", refused)
    got = jit.rope(x.copy(), pos, **args)
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)
    other = np.ones(hd // 2, np.float32)  # a second table is not confused with the first
    np.testing.assert_allclose(
        jit.rope(x.copy(), pos, **{**args, "freq_factors": other}),
        jit.rope(x.copy(), pos, theta=500000.0, neox=neox, freq_scale=0.25),
        rtol=0,
        atol=0,
    )


@pytest.mark.parametrize("neox", [True, False])
@pytest.mark.parametrize("hd,n_rot", [(128, 96), (8, 4), (64, 2)])
def test_partial_rope_rotates_only_the_leading_dims(jit, neox, hd, n_rot):
    """Phi-4-mini rotates 96 of 128 dims per head: the rest pass through unchanged, and the
    rotated part is a whole-head RoPE of size n_rot (frequencies theta^(-2i/n_rot))."""
    rng = np.random.default_rng(n_rot)
    x = rng.standard_normal((6, 3, hd)).astype(np.float32)
    pos = np.arange(40, 46, dtype=np.int32)
    factors = rng.uniform(1.0, 8.0, n_rot // 2).astype(np.float32)
    args = dict(theta=10000.0, neox=neox, freq_scale=1.0, freq_factors=factors)
    whole = REF.rope(np.ascontiguousarray(x[..., :n_rot]), pos, **args)
    for backend in (REF, jit):
        got = backend.rope(x.copy(), pos, n_rot=n_rot, **args)
        np.testing.assert_allclose(got[..., :n_rot], whole, rtol=1e-5, atol=1e-5)
        np.testing.assert_array_equal(got[..., n_rot:], x[..., n_rot:])


@pytest.mark.parametrize(
    "tokens,p0,n_head,n_kv,hd,window,softcap",
    [
        (1, 0, 4, 1, 256, 0, 0.0),  # first decode step
        (1, 700, 4, 1, 256, 512, 0.0),  # decode past the sliding window
        (9, 0, 9, 3, 64, 0, 0.0),  # prefill, GQA 3
        (5, 20, 2, 2, 32, 4, 0.0),  # prefill chunk after a prefix, tiny window
        (3, 40, 4, 2, 16, 0, 50.0),  # soft-capped scores
        (33, 3, 4, 4, 48, 600, 0.0),  # window longer than the context
    ],
)
def test_attention(jit, tokens, p0, n_head, n_kv, hd, window, softcap):
    rng = np.random.default_rng(tokens * 7 + p0)
    capacity = p0 + tokens + 3
    k = (rng.standard_normal((capacity, n_kv, hd)) * 2).astype(np.float16)
    v = rng.standard_normal((capacity, n_kv, hd)).astype(np.float16)
    q = rng.standard_normal((tokens, n_head, hd)).astype(np.float32)
    kw = dict(p0=p0, scale=hd**-0.5, window=window, softcap=softcap)
    expected = REF.attention(q, k, v, **kw)
    got = jit.attention(q, k, v, **kw)
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-5)
    out = np.full((tokens, n_head * hd), np.nan, np.float32)
    jit.attention(q, k, v, out=out, **kw)
    np.testing.assert_allclose(out, expected, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize(
    "tokens,p0,n_head,n_kv,hd,window",
    [
        (1, 0, 4, 1, 64, 0),  # first decode step: one key against the sink
        (1, 300, 8, 2, 64, 128),  # gpt-oss decode past its 128-position window
        (7, 20, 4, 2, 16, 4),  # prefill chunk after a prefix, tiny window
    ],
)
def test_attention_with_sinks(jit, tokens, p0, n_head, n_kv, hd, window):
    """Attention sinks (gpt-oss): each head's logit joins the softmax denominator, including
    one far above every score (the sink then takes nearly all of the mass) and far below."""
    rng = np.random.default_rng(tokens * 11 + p0)
    capacity = p0 + tokens + 3
    k = (rng.standard_normal((capacity, n_kv, hd)) * 2).astype(np.float16)
    v = rng.standard_normal((capacity, n_kv, hd)).astype(np.float16)
    q = rng.standard_normal((tokens, n_head, hd)).astype(np.float32)
    sinks = rng.standard_normal(n_head).astype(np.float32)
    sinks[:2] = [40.0, -40.0]
    kw = dict(p0=p0, scale=hd**-0.5, window=window)
    expected = REF.attention(q, k, v, sinks=sinks, **kw)
    got = jit.attention(q, k, v, sinks=sinks, **kw)
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-5)
    # The reference by hand for the last query: softmax over [scores, sink], sink dropped.
    t, group = tokens - 1, n_head // n_kv
    pos = p0 + t
    lo = max(0, pos - window + 1) if window else 0
    for h in range(n_head):
        keys = k[lo : pos + 1, h // group].astype(np.float64)
        scores = keys @ q[t, h].astype(np.float64) * hd**-0.5
        logits = np.append(scores, sinks[h])
        p = np.exp(logits - logits.max())
        p = p[:-1] / p.sum()
        mixed = p @ v[lo : pos + 1, h // group].astype(np.float64)
        np.testing.assert_allclose(expected[t, h * hd : (h + 1) * hd], mixed, atol=2e-5)
    without = jit.attention(q, k, v, **kw)
    assert np.abs(without - got).max() > 0.1  # the sinks change the output


def test_wrong_output_shapes_are_refused_not_overrun(jit):
    from gguf import GGMLQuantizationType as Q

    from engine.qtensor import QTensor

    w = QTensor("w", Q.F32, (8, 16), np.ones((8, 16), np.float32))
    with pytest.raises(ValueError, match="out has shape"):
        jit.linear(w, np.ones((2, 16), np.float32), out=np.zeros((2, 4), np.float32))
    q = np.ones((1, 2, 16), np.float32)
    k = np.ones((4, 1, 16), np.float16)
    with pytest.raises(ValueError, match="out has shape"):
        jit.attention(q, k, k, p0=0, scale=1.0, out=np.zeros((1, 8), np.float32))
    with pytest.raises(ValueError, match="do not fit"):
        jit.attention(q, k, k, p0=4, scale=1.0)
