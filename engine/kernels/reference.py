"""Plain numpy implementation of the Backend protocol (engine/kernels/backend.py).

It is the oracle the JIT kernels are tested against and the fallback when they cannot be
compiled, so it favours obvious code over speed. Weights are dequantized a slice of rows at a
time and thrown away after use: keeping a float32 copy would need ~4-8x the file's memory.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from engine.kv_quant import as_float
from engine.qtensor import QTensor
from engine.quants import dequantize, dequantize_rows

# Rows dequantized per slice in `linear`: bounded so a 262k-row tied embedding never turns into
# one 670 MB float32 temporary.
_SLICE_FLOATS = 1 << 22


def dequantize_rows_range(w: QTensor, r0: int, r1: int) -> np.ndarray:
    """Rows r0..r1-1 of a 2-D weight as float32 (r1 - r0, cols)."""
    return dequantize_rows(w, np.arange(r0, r1))


def dequantize_rows_at(w: QTensor, rows: np.ndarray) -> np.ndarray:
    """The given rows of a 2-D weight as float32 (len(rows), cols)."""
    return dequantize_rows(w, np.asarray(rows, dtype=np.int64))


def dequantize_full(w: QTensor) -> np.ndarray:
    """A whole (small) tensor as float32 in its numpy shape: for norm weights and biases."""
    return np.asarray(dequantize(w), dtype=np.float32).reshape(w.shape)


def _gelu_tanh(g: np.ndarray) -> np.ndarray:
    return (
        0.5
        * g
        * (1.0 + np.tanh(np.float32(np.sqrt(2.0 / np.pi)) * (g + np.float32(0.044715) * g * g * g)))
    )


def _silu(g: np.ndarray) -> np.ndarray:
    return g / (np.float32(1.0) + np.exp(-g))


class ReferenceBackend:
    name = "numpy"
    fallback_reason: str | None = None  # set when get_backend chose numpy because the JIT failed

    def copies_weight(self, w: QTensor) -> bool:
        """numpy reads every weight from the file mapping as it is (dequantizing slices)."""
        return False

    def linear(self, w: QTensor, x: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
        n_out, n_in = w.rows, w.cols
        if x.ndim != 2 or x.shape[1] != n_in:
            raise ValueError(f"linear {w.name}: x has shape {x.shape}, expected (T, {n_in})")
        if out is None:
            out = np.empty((x.shape[0], n_out), dtype=np.float32)
        step = max(1, _SLICE_FLOATS // n_in)
        for r0 in range(0, n_out, step):
            r1 = min(n_out, r0 + step)
            # Into a temporary, not `out=out[:, r0:r1]`: numpy skips BLAS for a strided output
            # (measured 17 s vs <1 s per SmolLM2 forward).
            out[:, r0:r1] = x @ dequantize_rows_range(w, r0, r1).T
        return out

    def linear_many(
        self, weights: Sequence[QTensor], x: np.ndarray, outs: Sequence[np.ndarray]
    ) -> list[np.ndarray]:
        return [self.linear(w, x, out=o) for w, o in zip(weights, outs, strict=True)]

    def embedding(self, w: QTensor, ids: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
        rows = dequantize_rows_at(w, ids)
        if out is None:
            return rows
        out[...] = rows
        return out

    def rmsnorm(
        self, x: np.ndarray, weight: np.ndarray, eps: float, out: np.ndarray | None = None
    ) -> np.ndarray:
        mean_sq = np.mean(np.square(x, dtype=np.float64), axis=-1, keepdims=True)
        inv = (1.0 / np.sqrt(mean_sq + eps)).astype(np.float32)
        if out is None:
            out = np.empty_like(x)
        np.multiply(x, inv, out=out)
        out *= weight
        return out

    def rope(
        self,
        x: np.ndarray,
        positions: np.ndarray,
        *,
        theta: float,
        neox: bool,
        freq_scale: float = 1.0,
        freq_factors: np.ndarray | None = None,
        n_rot: int = 0,
    ) -> np.ndarray:
        if 0 < n_rot < x.shape[-1]:  # partial RoPE: the leading n_rot dims of each head
            self.rope(
                x[..., :n_rot],
                positions,
                theta=theta,
                neox=neox,
                freq_scale=freq_scale,
                freq_factors=freq_factors,
            )
            return x
        head_dim = x.shape[-1]
        half = head_dim // 2
        inv_freq = theta ** (-np.arange(half, dtype=np.float64) * 2.0 / head_dim)
        if freq_factors is not None:
            inv_freq = inv_freq / np.asarray(freq_factors, dtype=np.float64)
        angles = (np.asarray(positions, dtype=np.float64)[:, None] * freq_scale) * inv_freq[None, :]
        cos = np.cos(angles).astype(np.float32)[:, None, :]  # (T, 1, half)
        sin = np.sin(angles).astype(np.float32)[:, None, :]
        if neox:
            a, b = x[..., :half].copy(), x[..., half:].copy()
            x[..., :half] = a * cos - b * sin
            x[..., half:] = a * sin + b * cos
        else:
            a, b = x[..., 0::2].copy(), x[..., 1::2].copy()
            x[..., 0::2] = a * cos - b * sin
            x[..., 1::2] = a * sin + b * cos
        return x

    def attention(
        self,
        q: np.ndarray,
        k_cache: np.ndarray,
        v_cache: np.ndarray,
        *,
        p0: int,
        scale: float,
        window: int = 0,
        softcap: float = 0.0,
        sinks: np.ndarray | None = None,
        out: np.ndarray | None = None,
    ) -> np.ndarray:
        n_tokens, n_head, head_dim = q.shape
        n_kv = k_cache.shape[1]
        group = n_head // n_kv
        n_keys = p0 + n_tokens
        keys = as_float(k_cache[:n_keys], head_dim)  # (n_keys, n_kv, head_dim) float32
        values = as_float(v_cache[:n_keys], head_dim)
        # Batched matmul over (kv head, group) rather than einsum, which takes a slow non-BLAS path.
        qg = q.reshape(n_tokens, n_kv, group, head_dim).transpose(
            1, 2, 0, 3
        )  # (n_kv, group, T, hd)
        scores = (qg @ keys.transpose(1, 2, 0)[:, None]) * np.float32(
            scale
        )  # (n_kv, group, T, n_keys)
        if softcap > 0.0:
            scores = np.float32(softcap) * np.tanh(scores / np.float32(softcap))
        query_pos = p0 + np.arange(n_tokens)[:, None]
        key_pos = np.arange(n_keys)[None, :]
        allowed = key_pos <= query_pos
        if window > 0:
            allowed &= key_pos > query_pos - window
        scores = np.where(allowed, scores, -np.inf)
        peak = scores.max(axis=-1, keepdims=True)  # (n_kv, group, T, 1)
        if sinks is not None:
            sink = np.asarray(sinks, np.float32).reshape(n_kv, group, 1, 1)
            peak = np.maximum(peak, sink)
        probs = np.exp(scores - peak)
        denominator = probs.sum(axis=-1, keepdims=True)
        if sinks is not None:  # the sink's share of the softmax, which mixes no value
            denominator += np.exp(sink - peak)
        probs /= denominator
        mixed = probs @ values.transpose(1, 0, 2)[:, None]  # (n_kv, group, T, hd)
        mixed = mixed.transpose(2, 0, 1, 3).reshape(n_tokens, n_head * head_dim)
        if out is None:
            return np.ascontiguousarray(mixed, dtype=np.float32)
        out[...] = mixed
        return out

    def swiglu(self, gate: np.ndarray, up: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
        result = _silu(gate) * up
        if out is None:
            return result
        out[...] = result
        return out

    def geglu(self, gate: np.ndarray, up: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
        result = _gelu_tanh(gate) * up
        if out is None:
            return result
        out[...] = result
        return out

    def swiglu_oai(
        self,
        gate: np.ndarray,
        up: np.ndarray,
        *,
        alpha: float,
        limit: float,
        out: np.ndarray | None = None,
    ) -> np.ndarray:
        g = np.minimum(gate, np.float32(limit))
        u = np.clip(up, np.float32(-limit), np.float32(limit))
        result = (g / (np.float32(1.0) + np.exp(np.float32(-alpha) * g))) * (u + np.float32(1.0))
        if out is None:
            return result.astype(np.float32, copy=False)
        out[...] = result
        return out
