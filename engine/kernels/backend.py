"""The op set the model forward passes call, and the choice of which implementation runs them.

Two implementations share this contract:
  * `engine.kernels.reference.ReferenceBackend` - plain numpy, the oracle for tests;
  * `engine.kernels.jit_backend.JitBackend(n_threads=None, progress=None)` - llvmlite-compiled
    kernels, picked by `get_backend()` when they compile.

Conventions shared by every op (kernels may rely on them; models guarantee them):
  * activations are float32, C-contiguous; T is the number of tokens in the batch (1 for decode);
  * ops that take `out=` write into it and return it; `out=None` allocates a new array;
  * weights are `QTensor`s exactly as stored in the GGUF (quantized blocks, never dequantized
    copies kept around); a 2-D weight has shape (out_features, in_features) in numpy order,
    one row = one dot product;
  * norm weights arrive already converted to float32 1-D arrays (the model converts them once at
    load: they are tiny), so the norm ops never see a QTensor;
  * KV cache layout (see engine/kv_cache.py): per layer, K and V are float16 arrays of shape
    (capacity, n_kv_heads, head_dim), C-contiguous; row j holds the (RoPE'd) key / value of the
    token at absolute position j.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Callable, Sequence
from typing import Protocol

import numpy as np

from engine.errors import ConfigValidationError
from engine.qtensor import QTensor

KERNELS_ENV = "LOCALCHAT_KERNELS"  # "numpy" forces the reference backend


class Backend(Protocol):
    name: str

    def copies_weight(self, w: QTensor) -> bool:
        """Whether the first use of `w` copies it into the backend's own layout (the JIT's
        repacked records), after which its pages of the file are no longer read for mat-muls:
        the load does not prefetch them (engine/weight_prefetch.py)."""

    def linear(self, w: QTensor, x: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
        """out[t, o] = sum_i x[t, i] * W[o, i].

        w: QTensor of shape (n_out, n_in), any supported qtype. x: (T, n_in) float32 C-contig.
        out: (T, n_out) float32 C-contig or None. Bias, if any, is added by the caller.
        """

    def linear_many(
        self, weights: Sequence[QTensor], x: np.ndarray, outs: Sequence[np.ndarray]
    ) -> list[np.ndarray]:
        """[linear(w, x, out=o) for w, o in zip(weights, outs)]: projections of one input (q/k/v,
        gate/up). outs[j]: (T, weights[j].rows) float32 C-contig. Each output must hold exactly
        what `linear` gives it; a backend may run them together (the JIT: one quantization of
        x, one pool job)."""

    def embedding(self, w: QTensor, ids: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
        """out[t, :] = W[ids[t], :] dequantized. w: (n_vocab, d); ids: (T,) int32/int64 in range;
        out: (T, d) float32."""

    def rmsnorm(
        self, x: np.ndarray, weight: np.ndarray, eps: float, out: np.ndarray | None = None
    ) -> np.ndarray:
        """out[r, :] = x[r, :] / sqrt(mean(x[r, :]**2) + eps) * weight.

        x: (R, d) float32 (R rows: tokens, or tokens*heads for per-head q/k norms); weight: (d,)
        float32 (Gemma's "1 + w" is already folded into the GGUF weight by the converter).
        out may be x itself (in place). Accumulate in float32 or wider.
        """

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
        """Rotary position embedding, IN PLACE on x: (T, n_heads, head_dim) float32; returns x.
        n_rot: 0 = the whole head; else only its leading n_rot dims rotate (the formulas below
        with head_dim = n_rot), the rest pass through (partial RoPE, Phi-4-mini).

        positions: (T,) int absolute positions. For pair index i in [0, head_dim/2):
          freq_i = freq_scale * positions[t] * theta ** (-2 i / head_dim) / freq_factors[i]
        freq_factors: optional (head_dim/2,) per-pair divisors of the frequencies: Llama 3.1+
        `rope_freqs.weight`, Phi-3's LongRoPE tables, YaRN's ramp (engine.models.transformer).
        Every backend takes it; the JIT folds it into its frequency table.
          neox=False (llama.cpp "NORM", GGUF llama: the converter permuted q/k rows):
              pair = (x[..., 2i], x[..., 2i+1])
          neox=True  (qwen2, qwen3, gemma2/3, phi3, olmo2; HF rotate_half):
              pair = (x[..., i], x[..., i + head_dim/2])
          (a, b) -> (a cos f - b sin f, a sin f + b cos f).
        """

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
        """Causal multi-head attention of T new queries over the cached keys/values.

        q: (T, n_head, head_dim) float32, already RoPE'd; query t sits at position p0 + t.
        k_cache, v_cache: (capacity, n_kv, head_dim) float16; rows 0 .. p0+T-1 are valid (the
        caller wrote the T new tokens' K/V at rows p0.. before calling).
        GQA: query head h reads kv head h // (n_head // n_kv).
        Query at position i attends to key j iff j <= i and (window == 0 or j > i - window)
        (a sliding window of `window` positions including itself).
        score = (q . k) * scale; if softcap > 0: score = softcap * tanh(score / softcap);
        softmax over the allowed j (float32, max-subtracted), out = sum_j p_j v_j.
        sinks: optional (n_head,) float32 logits, one per query head, that join each softmax
        denominator and mix no value (gpt-oss's attention sinks): with m = max(max_j s_j, sink_h),
        p_j = exp(s_j - m) / (sum_j exp(s_j - m) + exp(sink_h - m)).
        out: (T, n_head * head_dim) float32 with head h at columns h*head_dim .. (h+1)*head_dim.
        """

    def swiglu(self, gate: np.ndarray, up: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
        """out = silu(gate) * up, silu(g) = g / (1 + exp(-g)). Shapes (T, n_ff) float32; out may
        alias gate."""

    def geglu(self, gate: np.ndarray, up: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
        """out = gelu_tanh(gate) * up, gelu_tanh(g) = 0.5 g (1 + tanh(sqrt(2/pi) (g + 0.044715 g^3))).
        Shapes (T, n_ff) float32; out may alias gate."""

    def swiglu_oai(
        self,
        gate: np.ndarray,
        up: np.ndarray,
        *,
        alpha: float,
        limit: float,
        out: np.ndarray | None = None,
    ) -> np.ndarray:
        """gpt-oss's clamped SwiGLU: g = min(gate, limit), u = clip(up, -limit, limit),
        out = g * sigmoid(alpha * g) * (u + 1). Shapes (T, n_ff) float32; out may alias gate."""


def _reference(why: str) -> Backend:
    from engine.kernels.reference import ReferenceBackend

    backend = ReferenceBackend()
    backend.fallback_reason = why  # shown by the CLI, bench and the app's load line
    return backend


def get_backend(
    n_threads: int | None = None, progress: Callable[[str, float], None] | None = None
) -> Backend:
    """The fastest backend that works here: the JIT backend unless LOCALCHAT_KERNELS=numpy or
    compiling it failed (then a warning names why and numpy runs)."""
    if os.environ.get(KERNELS_ENV, "").strip().lower() == "numpy":
        return _reference(f"{KERNELS_ENV}=numpy")
    try:
        from engine.kernels.jit_backend import JitBackend

        return JitBackend(n_threads=n_threads, progress=progress)
    except ConfigValidationError:
        raise  # a bad setting (e.g. n_threads) is the caller's to fix, not a reason to run slowly
    except Exception as exc:  # any compile/load failure must not stop the app from working
        why = f"JIT kernels unavailable ({type(exc).__name__}: {exc})"
        warnings.warn(f"{why}; using numpy kernels", RuntimeWarning, stacklevel=2)
        return _reference(why)
