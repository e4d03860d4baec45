"""The numpy reference ops against small hand-computed cases and textbook formulas."""

import math

import numpy as np
import pytest
from gguf import GGMLQuantizationType
from gguf.quants import quantize

from engine.kernels.backend import get_backend
from engine.kernels.reference import ReferenceBackend
from engine.qtensor import QTensor

ops = ReferenceBackend()


def _tensor(w: np.ndarray, qtype=GGMLQuantizationType.F32) -> QTensor:
    data = quantize(w.astype(np.float32), qtype)
    return QTensor("w", qtype, tuple(w.shape), data)


def test_linear_f32_hand_computed():
    w = _tensor(np.array([[1, 2, 3], [0, -1, 0.5]], dtype=np.float32))
    x = np.array([[1, 1, 1], [2, 0, -2]], dtype=np.float32)
    np.testing.assert_allclose(ops.linear(w, x), [[6, -0.5], [-4, -1]])


def test_linear_q8_0_matches_dequantized_matmul_and_writes_out():
    rng = np.random.default_rng(0)
    w = rng.standard_normal((5, 64)).astype(np.float32)
    qt = _tensor(w, GGMLQuantizationType.Q8_0)
    x = rng.standard_normal((3, 64)).astype(np.float32)
    out = np.zeros((3, 5), np.float32)
    res = ops.linear(qt, x, out=out)
    assert res is out
    # Q8_0 keeps ~1/254 of each block's max: the result is close to the float product.
    np.testing.assert_allclose(out, x @ w.T, atol=0.15)


def test_embedding_picks_rows():
    table = np.arange(12, dtype=np.float32).reshape(4, 3)
    np.testing.assert_array_equal(
        ops.embedding(_tensor(table), np.array([3, 0, 3])), [[9, 10, 11], [0, 1, 2], [9, 10, 11]]
    )


def test_rmsnorm_hand_computed():
    x = np.array([[3.0, 4.0]], np.float32)  # mean square 12.5
    out = ops.rmsnorm(x, np.array([1.0, 2.0], np.float32), eps=0.0)
    s = 1 / math.sqrt(12.5)
    np.testing.assert_allclose(out, [[3 * s, 8 * s]], rtol=1e-6)


def test_rope_norm_and_neox_pairings():
    # head_dim 4, theta 100: inv_freq = [1, 0.1]; position 1.
    x = np.array([[[1.0, 2.0, 3.0, 4.0]]], np.float32)
    c0, s0, c1, s1 = math.cos(1), math.sin(1), math.cos(0.1), math.sin(0.1)
    norm = ops.rope(x.copy(), np.array([1]), theta=100.0, neox=False)
    np.testing.assert_allclose(
        norm[0, 0], [1 * c0 - 2 * s0, 1 * s0 + 2 * c0, 3 * c1 - 4 * s1, 3 * s1 + 4 * c1], rtol=1e-6
    )
    neox = ops.rope(x.copy(), np.array([1]), theta=100.0, neox=True)
    np.testing.assert_allclose(
        neox[0, 0], [1 * c0 - 3 * s0, 2 * c1 - 4 * s1, 1 * s0 + 3 * c0, 2 * s1 + 4 * c1], rtol=1e-6
    )
    # position 0 is the identity
    np.testing.assert_array_equal(ops.rope(x.copy(), np.array([0]), theta=100.0, neox=True), x)


def _naive_attention(q, k, v, p0, scale, window, softcap):
    n_tokens, n_head, hd = q.shape
    group = n_head // k.shape[1]
    out = np.zeros((n_tokens, n_head * hd))
    for t in range(n_tokens):
        i = p0 + t
        for h in range(n_head):
            js = [j for j in range(i + 1) if window == 0 or j > i - window]
            s = np.array([float(q[t, h] @ k[j, h // group].astype(np.float64)) * scale for j in js])
            if softcap:
                s = softcap * np.tanh(s / softcap)
            p = np.exp(s - s.max())
            p /= p.sum()
            out[t, h * hd : (h + 1) * hd] = sum(
                pj * v[j, h // group].astype(np.float64) for pj, j in zip(p, js, strict=True)
            )
    return out


@pytest.mark.parametrize("window,softcap", [(0, 0.0), (3, 0.0), (0, 5.0)])
def test_attention_gqa_causal_window_softcap(window, softcap):
    rng = np.random.default_rng(1)
    n_head, n_kv, hd, p0, n_tokens = 4, 2, 8, 5, 3
    k = rng.standard_normal((16, n_kv, hd)).astype(np.float16)
    v = rng.standard_normal((16, n_kv, hd)).astype(np.float16)
    q = rng.standard_normal((n_tokens, n_head, hd)).astype(np.float32)
    got = ops.attention(q, k, v, p0=p0, scale=0.35, window=window, softcap=softcap)
    np.testing.assert_allclose(got, _naive_attention(q, k, v, p0, 0.35, window, softcap), atol=1e-5)


def test_attention_single_key_returns_its_value():
    k = np.ones((4, 1, 2), np.float16)
    v = np.array([[[7, -3]]] * 4, np.float16)
    out = ops.attention(np.ones((1, 2, 2), np.float32), k, v, p0=0, scale=1.0)
    np.testing.assert_array_equal(out, [[7, -3, 7, -3]])


def test_activations():
    g = np.array([[0.0, 1.0, -2.0]], np.float32)
    u = np.array([[5.0, 2.0, 1.0]], np.float32)
    silu = [0.0, 1 / (1 + math.exp(-1)), -2 / (1 + math.exp(2))]
    np.testing.assert_allclose(ops.swiglu(g, u), [[0, 2 * silu[1], silu[2]]], rtol=1e-6)
    gelu = [
        0.5 * a * (1 + math.tanh(math.sqrt(2 / math.pi) * (a + 0.044715 * a**3)))
        for a in (0.0, 1.0, -2.0)
    ]
    np.testing.assert_allclose(ops.geglu(g, u), [[0, 2 * gelu[1], gelu[2]]], rtol=1e-6)


def test_env_forces_numpy_backend(monkeypatch):
    monkeypatch.setenv("LOCALCHAT_KERNELS", "numpy")
    assert get_backend().name == "numpy"


def test_jit_failure_falls_back_to_numpy_with_a_warning(monkeypatch):
    import importlib.util

    monkeypatch.delenv("LOCALCHAT_KERNELS", raising=False)
    if importlib.util.find_spec("engine.kernels.jit_backend") is None:
        pytest.skip("no JIT backend in this build")
    import engine.kernels.jit_backend as jit

    def broken(*args, **kwargs):
        raise RuntimeError("no LLVM target")

    monkeypatch.setattr(jit, "JitBackend", broken)
    with pytest.warns(RuntimeWarning, match="no LLVM target"):
        assert get_backend().name == "numpy"


def test_rope_freq_factors_divide_each_frequency():
    # head_dim 4, theta 100: inv_freq = [1, 0.1]; factors [2, 0.5] -> [0.5, 0.2]; position 3.
    x = np.array([[[1.0, 2.0, 3.0, 4.0]]], np.float32)
    got = ops.rope(
        x.copy(),
        np.array([3]),
        theta=100.0,
        neox=True,
        freq_factors=np.array([2.0, 0.5], np.float32),
    )
    a0, a1 = 3 * 0.5, 3 * 0.2
    expected = [
        1 * math.cos(a0) - 3 * math.sin(a0),
        2 * math.cos(a1) - 4 * math.sin(a1),
        1 * math.sin(a0) + 3 * math.cos(a0),
        2 * math.sin(a1) + 4 * math.cos(a1),
    ]
    np.testing.assert_allclose(got[0, 0], expected, rtol=1e-6)
