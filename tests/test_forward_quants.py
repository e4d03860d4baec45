"""Every tensor type and every architecture through the whole forward pass, against an
independent float64 numpy decoder written here (whole sequence, no cache) whose weights come
from gguf-py's own dequantizer (not engine.quants). Small in-memory models: d_model 256 so the
K-quant types (256-value blocks) fit; the gemma3 one has a 4-token window over 10 tokens."""

from types import SimpleNamespace

import numpy as np
import pytest
from gguf import GGMLQuantizationType
from gguf.quants import dequantize as gguf_dequantize
from tiny_models import ALL_QTYPES, _random_weight

from engine.kernels.reference import ReferenceBackend
from engine.models import build_model
from engine.qtensor import QTensor

Q = GGMLQuantizationType
D_MODEL, N_HEAD, N_KV, HEAD_DIM, D_FF, VOCAB = 256, 4, 2, 64, 256, 300
EPS = 1e-5
ARCH = {  # what the independent forward needs to know per architecture
    "llama": dict(theta=10000.0, neox=False, bias=False, qk_norm=False, gemma=False, n_layers=2),
    "qwen2": dict(theta=1e6, neox=True, bias=True, qk_norm=False, gemma=False, n_layers=2),
    "qwen3": dict(theta=1e6, neox=True, bias=False, qk_norm=True, gemma=False, n_layers=2),
    # 3 layers with period 3 -> layers 0, 1 local (window 4), layer 2 global.
    "gemma3": dict(
        theta=1e6, neox=True, bias=False, qk_norm=True, gemma=True, n_layers=3, window=4
    ),
}
GEMMA_LOCAL_THETA = 10000.0


def _make(arch: str, qtype: GGMLQuantizationType, seed: int = 0):
    """(gguf-like object for build_model, float64 weights dict for the independent forward)."""
    spec = ARCH[arch]
    rng = np.random.default_rng(seed)
    tensors, dense = {}, {}

    def add(name, rows, cols, wtype, scale):
        stored = np.ascontiguousarray(_random_weight(rng, rows, cols, wtype, scale, name))
        raw = stored.view(np.uint8).reshape(rows, -1)
        view = {Q.F32: "<f4", Q.F16: "<f2", Q.BF16: "<u2"}.get(wtype)
        data = raw.view(view) if view else raw  # the layout engine.gguf gives each type
        tensors[name] = QTensor(name, wtype, (rows, cols), data)
        dense[name] = np.asarray(gguf_dequantize(raw, wtype), dtype=np.float64).reshape(rows, cols)

    def vector(name, n, center=1.0, spread=0.1):
        values = (center + spread * rng.standard_normal(n)).astype(np.float32)
        tensors[name] = QTensor(name, Q.F32, (n,), values)
        dense[name] = values.astype(np.float64)

    add(
        "token_embd.weight", VOCAB, D_MODEL, Q.F32, 1.0 / np.sqrt(D_MODEL) if spec["gemma"] else 1.0
    )
    for i in range(spec["n_layers"]):
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
        if spec["bias"]:
            vector(p + "attn_q.bias", N_HEAD * HEAD_DIM, 0.0, 0.2)
            vector(p + "attn_k.bias", N_KV * HEAD_DIM, 0.0, 0.2)
            vector(p + "attn_v.bias", N_KV * HEAD_DIM, 0.0, 0.2)
        if spec["qk_norm"]:
            vector(p + "attn_q_norm.weight", HEAD_DIM)
            vector(p + "attn_k_norm.weight", HEAD_DIM)
        if spec["gemma"]:
            vector(p + "post_attention_norm.weight", D_MODEL)
            vector(p + "post_ffw_norm.weight", D_MODEL)
    vector("output_norm.weight", D_MODEL)
    if not spec["gemma"]:  # gemma3 ties the output to the embedding
        add("output.weight", VOCAB, D_MODEL, qtype, 0.1)
    metadata = {
        f"{arch}.{k}": v
        for k, v in {
            "embedding_length": D_MODEL,
            "block_count": spec["n_layers"],
            "feed_forward_length": D_FF,
            "context_length": 64,
            "attention.head_count": N_HEAD,
            "attention.head_count_kv": N_KV,
            "attention.key_length": HEAD_DIM,
            "attention.value_length": HEAD_DIM,
            "rope.freq_base": spec["theta"],
            "attention.layer_norm_rms_epsilon": EPS,
        }.items()
    }
    if spec["gemma"]:
        metadata["gemma3.attention.sliding_window"] = spec["window"]
        metadata["gemma3.attention.sliding_window_pattern"] = 3
    return SimpleNamespace(arch=arch, metadata=metadata, tensors=tensors), dense


def _independent_forward(arch: str, w: dict, ids: list[int]) -> np.ndarray:
    """The textbook decoder in float64 over the whole sequence, no cache."""
    spec = ARCH[arch]

    def rms(x, g):
        return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + EPS) * g

    def rope(x, theta):  # x (T, H, hd)
        ang = np.arange(x.shape[0])[:, None, None] * theta ** (
            -np.arange(0, HEAD_DIM, 2) / HEAD_DIM
        )
        if spec["neox"]:  # rotate_half pairs (i, i + hd/2)
            a, b = x[..., : HEAD_DIM // 2], x[..., HEAD_DIM // 2 :]
            return np.concatenate(
                [a * np.cos(ang) - b * np.sin(ang), a * np.sin(ang) + b * np.cos(ang)], -1
            )
        out = np.empty_like(x)  # GGUF llama: adjacent pairs (2i, 2i+1)
        a, b = x[..., 0::2], x[..., 1::2]
        out[..., 0::2] = a * np.cos(ang) - b * np.sin(ang)
        out[..., 1::2] = a * np.sin(ang) + b * np.cos(ang)
        return out

    def gelu_tanh(g):
        return 0.5 * g * (1 + np.tanh(np.sqrt(2 / np.pi) * (g + 0.044715 * g**3)))

    T = len(ids)
    x = w["token_embd.weight"][ids] * (np.sqrt(D_MODEL) if spec["gemma"] else 1.0)
    i_pos, j_pos = np.arange(T)[:, None], np.arange(T)[None, :]
    for i in range(spec["n_layers"]):
        p = f"blk.{i}."
        local = spec["gemma"] and i % 3 != 2
        theta = GEMMA_LOCAL_THETA if local else spec["theta"]
        allowed = (j_pos <= i_pos) & ((j_pos > i_pos - spec["window"]) if local else True)
        h = rms(x, w[p + "attn_norm.weight"])
        q, k, v = (
            h @ w[p + f"attn_{n}.weight"].T + (w[p + f"attn_{n}.bias"] if spec["bias"] else 0)
            for n in "qkv"
        )
        q, k, v = (
            q.reshape(T, N_HEAD, HEAD_DIM),
            k.reshape(T, N_KV, HEAD_DIM),
            v.reshape(T, N_KV, HEAD_DIM),
        )
        if spec["qk_norm"]:
            q, k = rms(q, w[p + "attn_q_norm.weight"]), rms(k, w[p + "attn_k_norm.weight"])
        q, k = rope(q, theta), rope(k, theta)
        heads = []
        for hd in range(N_HEAD):
            kv = hd // (N_HEAD // N_KV)
            s = np.where(allowed, q[:, hd] @ k[:, kv].T / np.sqrt(HEAD_DIM), -np.inf)
            pr = np.exp(s - s.max(-1, keepdims=True))
            heads.append((pr / pr.sum(-1, keepdims=True)) @ v[:, kv])
        o = np.concatenate(heads, axis=1) @ w[p + "attn_output.weight"].T
        x = x + (rms(o, w[p + "post_attention_norm.weight"]) if spec["gemma"] else o)
        h = rms(x, w[p + "ffn_norm.weight"])
        g, u = h @ w[p + "ffn_gate.weight"].T, h @ w[p + "ffn_up.weight"].T
        act = gelu_tanh(g) if spec["gemma"] else g / (1 + np.exp(-g))
        f = (act * u) @ w[p + "ffn_down.weight"].T
        x = x + (rms(f, w[p + "post_ffw_norm.weight"]) if spec["gemma"] else f)
    out_w = w["token_embd.weight"] if spec["gemma"] else w["output.weight"]
    return rms(x, w["output_norm.weight"]) @ out_w.T


IDS = [3, 141, 59, 265, 35, 89, 79, 32, 38, 46]
CASES = [(arch, t) for arch in ARCH for t in ALL_QTYPES]


@pytest.mark.parametrize("arch,qtype", CASES, ids=lambda v: getattr(v, "name", v))
def test_forward_matches_independent_float64_model(arch, qtype):
    gguf_like, dense = _make(arch, qtype)
    model = build_model(gguf_like, backend=ReferenceBackend())
    ours = model.forward(IDS, model.new_cache(16), all_logits=True)
    expected = _independent_forward(arch, dense, IDS)
    scale = np.abs(expected).max()
    assert scale > 0.5  # the random model produces non-trivial logits
    # float32 activations + float16 K/V against float64: ~1e-3 relative.
    np.testing.assert_allclose(ours, expected, atol=5e-3 * scale, rtol=0)
