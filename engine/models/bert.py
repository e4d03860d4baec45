"""The encoder of GGUF embedding models: `bert` (MiniLM, bge, e5, ...) and `nomic-bert`.

Layout as llama.cpp's converter writes it and its graph (src/models/bert.cpp) runs it:

    x = token_embd[id] + token_types[0] + position_embd[pos]     (position_embd: bert only)
    x = LayerNorm(x; token_embd_norm)
    per layer (post-norm):
        q, k, v = x Wq + bq, ...        (or one fused attn_qkv, split into rows)
        nomic-bert: RoPE (NeoX pairing) on q and k
        a = softmax(q k^T / sqrt(head_dim)) v   over the whole sequence (no causal mask)
        x = LayerNorm(x + a Wo + bo; attn_output_norm)
        bert: f = GELU(x Wup + bup) Wdown + bdown;  nomic-bert: f = (silu(x Wgate) * x Wup) Wdown
        x = LayerNorm(x + f; layer_output_norm)

Every text of a batch sits in one (tokens, d_model) matrix, so each weight is read once per
batch by the engine's mat-mul kernels (backend.linear: F16/F32 weights as stored, quantized ones
with their kernels); attention runs per text on its own rows, which is exactly the padded batch
with its mask, without the padding. Biases, LayerNorm and the exact (erf) GELU are a few numpy
operations per row: the backend has RMSNorm and tanh-GELU kernels only, and these are not where
the time goes (the mat-muls are). Token types are always 0 ("sentence A"), as in llama.cpp.
"""

from __future__ import annotations

import math
import os
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from enum import IntEnum
from typing import Any

import numpy as np
from threadpoolctl import ThreadpoolController

from engine.config import ENCODER_ARCHS
from engine.errors import ModelFileError, UnsupportedModelError
from engine.kernels.reference import dequantize_full
from engine.qtensor import QTensor

# From this many tokens in a pass, float weights go through BLAS (EncoderModel._linear); below
# it the JIT kernel wins (measured 1536x384 F16: 16 tokens 0.5 vs 0.9 ms, 64 tokens 2.2 vs 1.1).
BLAS_MIN_TOKENS = 32
_FLOAT_TYPES = ("F16", "BF16", "F32")


class _OneBlasThread:
    """While any encoder pass runs, numpy's BLAS uses one thread; the setting before the first
    of them comes back when the last one ends. Counted, because the limit is process-wide and
    passes of two Embedders (documents indexing beside a question's embedding) overlap: nested
    threadpoolctl limits would restore each other's values out of order."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._active = 0
        self._limit: Any = None
        self._controller: ThreadpoolController | None = None

    def __enter__(self) -> None:
        with self._lock:
            if self._active == 0:
                if self._controller is None:  # scans the loaded libraries: once
                    self._controller = ThreadpoolController()
                self._limit = self._controller.limit(limits=1, user_api="blas")
            self._active += 1

    def __exit__(self, *exc: object) -> None:
        with self._lock:
            self._active -= 1
            if self._active == 0 and self._limit is not None:
                self._limit.restore_original_limits()
                self._limit = None


_ONE_BLAS_THREAD = _OneBlasThread()


class Pooling(IntEnum):
    """`{arch}.pooling_type` values (llama.cpp's enum llama_pooling_type)."""

    NONE = 0
    MEAN = 1
    CLS = 2
    LAST = 3
    RANK = 4


@dataclass(frozen=True)
class EncoderConfig:
    arch: str
    n_vocab: int
    d_model: int
    n_layers: int
    n_head: int
    n_ff: int
    context_length: int  # the most positions a text may use (position table rows for bert)
    norm_eps: float
    pooling: Pooling
    rope_theta: float  # nomic-bert only

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_head

    @classmethod
    def from_gguf(cls, gguf_file) -> EncoderConfig:
        """Raises UnsupportedModelError for an architecture other than bert / nomic-bert (or a
        reranker), ModelFileError naming a missing or invalid key."""
        md = gguf_file.metadata
        arch = md.get("general.architecture")
        if arch not in ENCODER_ARCHS:
            raise UnsupportedModelError(
                f"{gguf_file.path.name}: architecture {arch!r} is not an embedding model this "
                f"engine runs; supported: {', '.join(ENCODER_ARCHS)}"
            )

        def positive(key: str, default: int | None = None) -> int:
            value = md.get(f"{arch}.{key}", default)
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ModelFileError(f"{arch}.{key} is {value!r}; expected a positive integer")
            return value

        d_model = positive("embedding_length")
        n_head = positive("attention.head_count")
        if d_model % n_head:
            raise ModelFileError(
                f"{arch}.embedding_length {d_model} is not a multiple of "
                f"{arch}.attention.head_count {n_head}"
            )
        raw_pooling = md.get(f"{arch}.pooling_type", Pooling.NONE)
        try:
            pooling = Pooling(int(raw_pooling))
        except (TypeError, ValueError):
            raise ModelFileError(f"{arch}.pooling_type is {raw_pooling!r}; expected 0-4") from None
        if pooling is Pooling.RANK:
            raise UnsupportedModelError(
                f"{gguf_file.path.name} is a reranker ({arch}.pooling_type = rank), not an "
                "embedding model"
            )
        if md.get(f"{arch}.attention.causal", False):
            raise UnsupportedModelError(f"{arch}.attention.causal is true: not an encoder")
        if md.get(f"{arch}.expert_count", 0):
            raise UnsupportedModelError(
                f"{arch} with experts (mixture of experts) is not supported"
            )
        eps = md.get(f"{arch}.attention.layer_norm_epsilon", 1e-12)
        theta = md.get(f"{arch}.rope.freq_base", 10000.0)
        if not isinstance(eps, (int, float)) or not 0 <= eps < 1:
            raise ModelFileError(f"{arch}.attention.layer_norm_epsilon is {eps!r}")
        if not isinstance(theta, (int, float)) or theta <= 0:
            raise ModelFileError(f"{arch}.rope.freq_base is {theta!r}")
        embd = gguf_file.tensors.get("token_embd.weight")
        if embd is None:
            raise ModelFileError(f"{gguf_file.path.name}: tensor token_embd.weight is missing")
        return cls(
            arch=arch,
            n_vocab=embd.shape[0],
            d_model=d_model,
            n_layers=positive("block_count"),
            n_head=n_head,
            n_ff=positive("feed_forward_length"),
            context_length=positive("context_length"),
            norm_eps=float(eps),
            pooling=pooling,
            rope_theta=float(theta),
        )


@dataclass
class EncoderLayer:
    attn_q: QTensor
    attn_k: QTensor
    attn_v: QTensor
    attn_q_b: np.ndarray | None
    attn_k_b: np.ndarray | None
    attn_v_b: np.ndarray | None
    attn_output: QTensor
    attn_output_b: np.ndarray | None
    attn_output_norm: tuple[np.ndarray, np.ndarray | None]
    ffn_up: QTensor
    ffn_up_b: np.ndarray | None
    ffn_gate: QTensor | None  # nomic-bert's SwiGLU
    ffn_down: QTensor
    ffn_down_b: np.ndarray | None
    layer_output_norm: tuple[np.ndarray, np.ndarray | None]


class EncoderModel:
    """Forward pass of a bert / nomic-bert GGUF over its memory-mapped weights."""

    def __init__(self, config: EncoderConfig, tensors: dict[str, QTensor], backend):
        self.config = config
        self.backend = backend
        cfg = config
        self.token_embd = _need(tensors, "token_embd.weight", (cfg.n_vocab, cfg.d_model))
        types = tensors.get("token_types.weight")
        # Every text is "sentence A": only type row 0 is ever added.
        self.type_row0 = None if types is None else _float(types)[0].copy()
        self.position_embd: np.ndarray | None = None
        if cfg.arch == "bert":
            pos = _need(tensors, "position_embd.weight", None)
            if pos.shape[1] != cfg.d_model or pos.shape[0] < cfg.context_length:
                raise ModelFileError(
                    f"position_embd.weight has shape {pos.shape}; expected at least "
                    f"({cfg.context_length}, {cfg.d_model})"
                )
            self.position_embd = _float(pos)
        self.embd_norm = _norm(tensors, "token_embd_norm", cfg.d_model)
        self.layers = [self._layer(tensors, i) for i in range(cfg.n_layers)]
        # The numpy steps (per-text attention, GELU) run on this many threads: numpy releases
        # the GIL inside its loops, so they split across cores like the backend's kernels do.
        self.n_threads = max(1, int(getattr(backend, "n_threads", 0) or os.cpu_count() or 1))
        self._pool = ThreadPoolExecutor(self.n_threads, thread_name_prefix="localchat-encoder")

    def close(self) -> None:
        self._pool.shutdown(wait=True)

    def _layer(self, tensors: dict[str, QTensor], i: int) -> EncoderLayer:
        cfg = self.config
        p = f"blk.{i}."
        d = cfg.d_model
        fused = tensors.get(p + "attn_qkv.weight")
        if fused is not None:
            _check(fused, (3 * d, d))
            q, k, v = (_row_view(fused, j * d, d) for j in range(3))
            fused_b = _optional(tensors, p + "attn_qkv.bias", 3 * d)
            qb, kb, vb = (None, None, None) if fused_b is None else np.split(fused_b, 3)
        else:
            q = _need(tensors, p + "attn_q.weight", (d, d))
            k = _need(tensors, p + "attn_k.weight", (d, d))
            v = _need(tensors, p + "attn_v.weight", (d, d))
            qb = _optional(tensors, p + "attn_q.bias", d)
            kb = _optional(tensors, p + "attn_k.bias", d)
            vb = _optional(tensors, p + "attn_v.bias", d)
        gate = None
        if cfg.arch == "nomic-bert":
            gate = _need(tensors, p + "ffn_gate.weight", (cfg.n_ff, d))
        return EncoderLayer(
            attn_q=q,
            attn_k=k,
            attn_v=v,
            attn_q_b=qb,
            attn_k_b=kb,
            attn_v_b=vb,
            attn_output=_need(tensors, p + "attn_output.weight", (d, d)),
            attn_output_b=_optional(tensors, p + "attn_output.bias", d),
            attn_output_norm=_norm(tensors, p + "attn_output_norm", d),
            ffn_up=_need(tensors, p + "ffn_up.weight", (cfg.n_ff, d)),
            ffn_up_b=_optional(tensors, p + "ffn_up.bias", cfg.n_ff),
            ffn_gate=gate,
            ffn_down=_need(tensors, p + "ffn_down.weight", (d, cfg.n_ff)),
            ffn_down_b=_optional(tensors, p + "ffn_down.bias", d),
            layer_output_norm=_norm(tensors, p + "layer_output_norm", d),
        )

    def matrices(self) -> list[QTensor]:
        out: list[QTensor] = []
        for layer in self.layers:
            out += [layer.attn_q, layer.attn_k, layer.attn_v, layer.attn_output, layer.ffn_up]
            out += [w for w in (layer.ffn_gate, layer.ffn_down) if w is not None]
        return out

    def forward(
        self,
        ids: np.ndarray,
        lengths: list[int],
        check: Callable[[], None] = lambda: None,
    ) -> np.ndarray:
        """Final hidden states (sum(lengths), d_model) float32 for the texts whose token ids
        are concatenated in `ids` (each at most context_length long). `check` runs between
        layers (it raises to cancel)."""
        cfg, be = self.config, self.backend
        ids = np.ascontiguousarray(ids, dtype=np.int64)
        positions = np.concatenate([np.arange(n, dtype=np.int64) for n in lengths])
        x = be.embedding(self.token_embd, ids)
        if self.type_row0 is not None:
            x += self.type_row0
        if self.position_embd is not None:
            x += self.position_embd[positions]
        x = _layer_norm(x, *self.embd_norm, cfg.norm_eps)
        starts = np.cumsum([0, *lengths])
        # One BLAS thread per call: the products are split over the encoder's own threads.
        with _ONE_BLAS_THREAD:
            for layer in self.layers:
                check()
                x = self._layer_forward(layer, x, positions, starts)
        return x

    def _each(self, fn: Callable[[tuple[int, int]], None], spans: list[tuple[int, int]]) -> None:
        """fn over the spans on the encoder's threads (inline when there is one span)."""
        if len(spans) == 1 or self.n_threads == 1:
            for span in spans:
                fn(span)
            return
        for done in [self._pool.submit(fn, span) for span in spans]:
            done.result()  # re-raises a worker's exception here

    def _linear(self, w: QTensor, x: np.ndarray) -> np.ndarray:
        """x @ W.T. Quantized weights: the backend's kernels. Float weights (F16, BF16, F32) in
        a batch of BLAS_MIN_TOKENS tokens or more: numpy's BLAS sgemm on the weight widened to
        float32 for this call only (no float32 copy is kept). The JIT's float kernel is built
        for one-token decode: on MiniLM's ffn_up with 2048 tokens it ran at 21 GFLOP/s against
        OpenBLAS's 120 (and the Q8_0 kernels' 281, but requantizing an F16 file to Q8_0 moved
        the embeddings to cosine 0.998 of sentence-transformers', below the 0.999 we hold)."""
        n = x.shape[0]
        if n >= BLAS_MIN_TOKENS and w.qtype.name in _FLOAT_TYPES:
            weight = (w.data if w.qtype.name == "F32" else _float(w)).T
            out = np.empty((n, w.shape[0]), np.float32)

            def rows(span: tuple[int, int]) -> None:
                np.matmul(x[span[0] : span[1]], weight, out=out[span[0] : span[1]])

            self._each(rows, _row_spans(n, self.n_threads))
            return out
        return self.backend.linear(w, x)

    def _layer_forward(
        self, layer: EncoderLayer, x: np.ndarray, positions: np.ndarray, starts: np.ndarray
    ) -> np.ndarray:
        cfg, be = self.config, self.backend
        n, h, hd = x.shape[0], cfg.n_head, cfg.head_dim
        q = _biased(self._linear(layer.attn_q, x), layer.attn_q_b)
        k = _biased(self._linear(layer.attn_k, x), layer.attn_k_b)
        v = _biased(self._linear(layer.attn_v, x), layer.attn_v_b)
        q3, k3, v3 = q.reshape(n, h, hd), k.reshape(n, h, hd), v.reshape(n, h, hd)
        if cfg.arch == "nomic-bert":
            be.rope(q3, positions, theta=cfg.rope_theta, neox=True)
            be.rope(k3, positions, theta=cfg.rope_theta, neox=True)
        att = np.empty((n, h * hd), np.float32)
        scale = 1.0 / math.sqrt(hd)

        def attend(span: tuple[int, int]) -> None:
            a, b = span
            att[a:b] = _attention(q3[a:b], k3[a:b], v3[a:b], scale)

        self._each(attend, list(zip(starts[:-1].tolist(), starts[1:].tolist(), strict=True)))
        o = _biased(self._linear(layer.attn_output, att), layer.attn_output_b)
        o += x
        x = _layer_norm(o, *layer.attn_output_norm, cfg.norm_eps)
        up = _biased(self._linear(layer.ffn_up, x), layer.ffn_up_b)
        if layer.ffn_gate is not None:
            act = be.swiglu(self._linear(layer.ffn_gate, x), up)
        else:
            act = up

            def activate(span: tuple[int, int]) -> None:
                act[span[0] : span[1]] = gelu(up[span[0] : span[1]])

            self._each(activate, _row_spans(n, self.n_threads))
        f = _biased(self._linear(layer.ffn_down, act), layer.ffn_down_b)
        f += x
        return _layer_norm(f, *layer.layer_output_norm, cfg.norm_eps)


def _row_spans(n: int, parts: int) -> list[tuple[int, int]]:
    """[0, n) cut into `parts` nearly equal row ranges (fewer when n is small)."""
    edges = np.linspace(0, n, min(parts, max(n, 1)) + 1).astype(int).tolist()
    return [(a, b) for a, b in zip(edges[:-1], edges[1:], strict=True) if b > a]


def pool(hidden: np.ndarray, lengths: list[int], pooling: Pooling) -> np.ndarray:
    """One float32 row per text, L2-normalised: the mean of its tokens' rows ([CLS] and [SEP]
    included, as sentence-transformers' mean pooling), its first ([CLS]) row, or its last row.
    NONE (a file that names no pooling) pools by the mean, the usual sentence embedding."""
    out = np.empty((len(lengths), hidden.shape[1]), np.float32)
    start = 0
    for i, n in enumerate(lengths):
        rows = hidden[start : start + n]
        if pooling is Pooling.CLS:
            out[i] = rows[0]
        elif pooling is Pooling.LAST:
            out[i] = rows[-1]
        else:
            out[i] = rows.mean(axis=0, dtype=np.float64)
        start += n
    norms = np.linalg.norm(out.astype(np.float64), axis=1, keepdims=True)
    return (out / np.maximum(norms, 1e-12)).astype(np.float32)


def _attention(q: np.ndarray, k: np.ndarray, v: np.ndarray, scale: float) -> np.ndarray:
    """Bidirectional attention of one text: (n, h, hd) each -> (n, h * hd). Heads first and
    contiguous, so each product is one batched BLAS call (5x faster than einsum on the strided
    views: 0.4 vs 2.0 ms for 150 tokens x 12 heads)."""
    qt = np.ascontiguousarray(q.transpose(1, 0, 2))  # (h, n, hd)
    kt = np.ascontiguousarray(k.transpose(1, 2, 0))  # (h, hd, n)
    vt = np.ascontiguousarray(v.transpose(1, 0, 2))  # (h, n, hd)
    scores = np.matmul(qt, kt)  # (h, n, n)
    scores *= np.float32(scale)
    scores -= scores.max(axis=-1, keepdims=True)
    np.exp(scores, out=scores)
    scores /= scores.sum(axis=-1, keepdims=True)
    out = np.matmul(scores, vt)  # (h, n, hd)
    return out.transpose(1, 0, 2).reshape(q.shape[0], -1)


def gelu(x: np.ndarray) -> np.ndarray:
    """Exact GELU, x * Phi(x) = 0.5 x (1 + erf(x / sqrt 2)) (BERT's "gelu"), with erf from
    Abramowitz & Stegun 7.1.26 (absolute error under 1.5e-7, below float32's resolution of
    the result): numpy has no erf and a per-element math.erf would cost more than the layer.
    In-place steps on float32 (1.5x faster than the plain expression: fewer temporaries)."""
    z = np.abs(x)
    z *= np.float32(1.0 / math.sqrt(2.0))
    t = z * np.float32(0.3275911)
    t += 1
    np.reciprocal(t, out=t)
    tail = t * np.float32(1.061405429)  # Horner: ((((a5 t + a4) t + a3) t + a2) t + a1) t
    for c in (-1.453152027, 1.421413741, -0.284496736, 0.254829592):
        tail += np.float32(c)
        tail *= t
    np.square(z, out=z)
    np.negative(z, out=z)
    np.exp(z, out=z)
    tail *= z  # 1 - erf(|x| / sqrt 2)
    np.copysign(tail, x, out=tail)
    out = np.sign(x)  # 1 + erf(x / sqrt 2) = 1 + sign(x) - sign(x) * tail
    out += 1
    out -= tail
    out *= x
    out *= np.float32(0.5)
    return out


def _layer_norm(
    x: np.ndarray, weight: np.ndarray, bias: np.ndarray | None, eps: float
) -> np.ndarray:
    mean = x.mean(axis=-1, keepdims=True)
    centered = x - mean
    var = np.mean(np.square(centered), axis=-1, keepdims=True)
    out = centered / np.sqrt(var + np.float32(eps))
    out *= weight
    if bias is not None:
        out += bias
    return out.astype(np.float32, copy=False)


def _biased(x: np.ndarray, bias: np.ndarray | None) -> np.ndarray:
    if bias is not None:
        x += bias
    return x


def _float(t: QTensor) -> np.ndarray:
    return np.asarray(dequantize_full(t), dtype=np.float32).reshape(t.shape)


def _vector(t: QTensor) -> np.ndarray:
    return _float(t).reshape(-1)


def _need(tensors: dict[str, QTensor], name: str, shape: tuple[int, ...] | None) -> QTensor:
    t = tensors.get(name)
    if t is None:
        raise ModelFileError(f"tensor {name} is missing")
    if shape is not None:
        _check(t, shape)
    return t


def _check(t: QTensor, shape: tuple[int, ...]) -> None:
    if tuple(t.shape) != shape:
        raise ModelFileError(f"tensor {t.name} has shape {tuple(t.shape)}; expected {shape}")


def _optional(tensors: dict[str, QTensor], name: str, size: int) -> np.ndarray | None:
    t = tensors.get(name)
    if t is None:
        return None
    v = _vector(t)
    if v.shape != (size,):
        raise ModelFileError(f"tensor {name} has {v.size} values; expected {size}")
    return v


def _norm(
    tensors: dict[str, QTensor], name: str, size: int
) -> tuple[np.ndarray, np.ndarray | None]:
    weight = _optional(tensors, name + ".weight", size)
    if weight is None:
        raise ModelFileError(f"tensor {name}.weight is missing")
    return weight, _optional(tensors, name + ".bias", size)


def _row_view(t: QTensor, start: int, rows: int) -> QTensor:
    """Rows [start, start + rows) of a 2-D weight, sharing its memory (a fused q/k/v split)."""
    return QTensor(
        f"{t.name}[{start}:{start + rows}]",
        t.qtype,
        (rows, t.shape[1]),
        t.data[start : start + rows],
    )
