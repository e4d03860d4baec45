"""Every tensor type through the whole forward pass, against an independent float64 numpy
transformer written here from the textbook llama recipe, whose weights come from gguf-py's own
dequantizer (not engine.quants). Small in-memory llama-shaped models: d_model 256 so the
K-quant types (256-value blocks) fit."""

from types import SimpleNamespace

import numpy as np
import pytest
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType
from gguf.quants import dequantize as gguf_dequantize

from engine.kernels.reference import ReferenceBackend
from engine.models import build_model
from engine.qtensor import QTensor
from tiny_models import ALL_QTYPES, _random_weight

Q = GGMLQuantizationType
D_MODEL, N_HEAD, N_KV, HEAD_DIM, D_FF, N_LAYERS, VOCAB = 256, 4, 2, 64, 256, 2, 300
THETA, EPS = 10000.0, 1e-5


def _make(qtype: GGMLQuantizationType, seed: int = 0):
    """(gguf-like object for build_model, float64 weights dict for the independent forward)."""
    rng = np.random.default_rng(seed)
    tensors, dense = {}, {}

    def add(name, rows, cols, wtype, scale):
        stored = np.ascontiguousarray(_random_weight(rng, rows, cols, wtype, scale, name))
        raw = stored.view(np.uint8).reshape(rows, -1)
        view = {Q.F32: "<f4", Q.F16: "<f2", Q.BF16: "<u2"}.get(wtype)
        data = raw.view(view) if view else raw  # the layout engine.gguf gives each type
        tensors[name] = QTensor(name, wtype, (rows, cols), data)
        dense[name] = np.asarray(gguf_dequantize(raw, wtype), dtype=np.float64).reshape(rows, cols)

    def vector(name, n):
        values = (1.0 + 0.1 * rng.standard_normal(n)).astype(np.float32)
        tensors[name] = QTensor(name, Q.F32, (n,), values)
        dense[name] = values.astype(np.float64)

    add("token_embd.weight", VOCAB, D_MODEL, Q.F32, 1.0)
    for i in range(N_LAYERS):
        p = f"blk.{i}."
        vector(p + "attn_norm.weight", D_MODEL)
        vector(p + "ffn_norm.weight", D_MODEL)
        add(p + "attn_q.weight", N_HEAD * HEAD_DIM, D_MODEL, qtype, 0.08)
        add(p + "attn_k.weight", N_KV * HEAD_DIM, D_MODEL, qtype, 0.08)
        add(p + "attn_v.weight", N_KV * HEAD_DIM, D_MODEL, qtype, 0.08)
        add(p + "attn_output.weight", D_MODEL, N_HEAD * HEAD_DIM, qtype, 0.05)
        add(p + "ffn_gate.weight", D_FF, D_MODEL, qtype, 0.08)
        add(p + "ffn_up.weight", D_FF, D_MODEL, qtype, 0.08)
        add(p + "ffn_down.weight", D_MODEL, D_FF, qtype, 0.05)
    vector("output_norm.weight", D_MODEL)
    add("output.weight", VOCAB, D_MODEL, qtype, 0.1)
    metadata = {f"llama.{k}": v for k, v in {
        "embedding_length": D_MODEL, "block_count": N_LAYERS, "feed_forward_length": D_FF,
        "context_length": 64, "attention.head_count": N_HEAD, "attention.head_count_kv": N_KV,
        "rope.freq_base": THETA, "attention.layer_norm_rms_epsilon": EPS}.items()}
    return SimpleNamespace(arch="llama", metadata=metadata, tensors=tensors), dense


def _independent_forward(w: dict, ids: list[int]) -> np.ndarray:
    """Textbook llama in float64 over the whole sequence, no cache."""
    def rms(x, g):
        return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + EPS) * g

    def rope(x):  # x (T, H, hd); GGUF llama = adjacent pairs (2i, 2i+1)
        pos = np.arange(x.shape[0])[:, None, None]
        freq = THETA ** (-np.arange(0, HEAD_DIM, 2) / HEAD_DIM)
        ang = pos * freq
        a, b = x[..., 0::2], x[..., 1::2]
        out = np.empty_like(x)
        out[..., 0::2] = a * np.cos(ang) - b * np.sin(ang)
        out[..., 1::2] = a * np.sin(ang) + b * np.cos(ang)
        return out

    T = len(ids)
    x = w["token_embd.weight"][ids]
    causal = np.tril(np.ones((T, T), bool))
    for i in range(N_LAYERS):
        p = f"blk.{i}."
        h = rms(x, w[p + "attn_norm.weight"])
        q = rope((h @ w[p + "attn_q.weight"].T).reshape(T, N_HEAD, HEAD_DIM))
        k = rope((h @ w[p + "attn_k.weight"].T).reshape(T, N_KV, HEAD_DIM))
        v = (h @ w[p + "attn_v.weight"].T).reshape(T, N_KV, HEAD_DIM)
        heads = []
        for hd in range(N_HEAD):
            kv = hd // (N_HEAD // N_KV)
            s = q[:, hd] @ k[:, kv].T / np.sqrt(HEAD_DIM)
            s = np.where(causal, s, -np.inf)
            pr = np.exp(s - s.max(-1, keepdims=True))
            heads.append((pr / pr.sum(-1, keepdims=True)) @ v[:, kv])
        x = x + np.concatenate(heads, axis=1) @ w[p + "attn_output.weight"].T
        h = rms(x, w[p + "ffn_norm.weight"])
        g, u = h @ w[p + "ffn_gate.weight"].T, h @ w[p + "ffn_up.weight"].T
        x = x + (g / (1 + np.exp(-g)) * u) @ w[p + "ffn_down.weight"].T
    return rms(x, w["output_norm.weight"]) @ w["output.weight"].T


@pytest.mark.parametrize("qtype", ALL_QTYPES, ids=lambda t: t.name)
def test_forward_matches_independent_float64_model(qtype):
    assert GGML_QUANT_SIZES[qtype][0] in (1, 32, 256)
    gguf_like, dense = _make(qtype)
    model = build_model(gguf_like, backend=ReferenceBackend())
    ids = [3, 141, 59, 265, 35, 89, 79, 32, 38, 46]
    ours = model.forward(ids, model.new_cache(16), all_logits=True)
    expected = _independent_forward(dense, ids)
    scale = np.abs(expected).max()
    assert scale > 0.5  # the random model produces non-trivial logits
    # float32 activations + float16 K/V against float64: ~1e-3 relative.
    np.testing.assert_allclose(ours, expected, atol=5e-3 * scale, rtol=0)
