"""The decoder-only transformer shared by llama, qwen2, qwen3 and gemma3.

The architectures differ only in switches that ModelConfig carries (RoPE pairing, q/k norms,
q/k/v biases, Gemma's sandwich norms / GeGLU / scaled embeddings / sliding window), so one
forward pass serves all four. Attribute names match the GGUF tensor names (`blk.N.attn_q`
-> `layers[N].attn_q`). Prefill (T tokens) and decode (T = 1) run through the same code; all
activation buffers are allocated once for `max_batch` tokens and longer prompts go in chunks.

Concurrency: what one request owns and what every request shares.
- Shared and read-only: the weights (memory-mapped QTensors), norm vectors and RoPE tables.
- Per request (per sequence): the KVCache given to `forward` (its rows and token list), and in
  the generation loop the sampler, penalties, stop matcher and constraint. Two requests never
  share a KVCache, so two generations on one loaded model can be interleaved step by step.
- Shared and mutable, hence serialised: the activation buffers (`_RunState`) and the backend's
  bound argument blocks, activation-quantization buffers, attention scratch and thread pool
  (engine/kernels/jit_backend.py). Each chunk of a forward pass holds the model's forward lock,
  so one chunk runs at a time; between chunks another request may run its own. On a 2-core CPU
  one forward at a time loses nothing (every forward already uses every core). Several
  sequences share one pass through `forward_segments` (one segment per sequence: its KVCache
  and its token ids), which is how engine/batching decodes concurrent requests together;
  prefill, decode and batched decode all run the one layer loop in `_forward_chunk`.
A forward pass waiting for the lock, or running a chunk, polls its cancel token between its
sub-steps (each layer's q/k/v projections, attention in blocks of ATTENTION_QUERY_BLOCK queries,
the output projection, the feed-forward), so Stop lands within one such step (milliseconds)
instead of one 256-token chunk (seconds at a long context; bench/bench_cancel_latency.py). The
cancelled chunk is not committed to the KV cache (`engine.cancel.ForwardCancelled`).
"""

from __future__ import annotations

import inspect
import threading
from dataclasses import dataclass, field

import numpy as np

from engine.cancel import ForwardCancelled
from engine.config import ModelConfig
from engine.errors import ModelFileError
from engine.kernels.reference import ReferenceBackend, dequantize_full
from engine.kv_cache import KVCache
from engine.qtensor import QTensor

DEFAULT_MAX_BATCH = 256
# Attention over a long context dominates a prefill chunk (SmolLM2 at 4k positions: ~3/4 of
# it); computing it in blocks of this many queries gives Stop a place to land between blocks.
# Each (query, head) is computed on its own, so the blocks give exactly the unsplit result.
ATTENTION_QUERY_BLOCK = 32
# How often a forward pass waiting for another request's chunk rechecks its cancel token.
_LOCK_POLL_SECONDS = 0.01


@dataclass
class Layer:
    attn_norm: np.ndarray  # (d_model,) f32
    attn_q: QTensor  # (q_dim, d_model)
    attn_k: QTensor  # (kv_dim, d_model)
    attn_v: QTensor  # (kv_dim, d_model)
    attn_output: QTensor  # (d_model, q_dim)
    ffn_norm: np.ndarray  # (d_model,) f32
    ffn_gate: QTensor  # (n_ff, d_model)
    ffn_up: QTensor  # (n_ff, d_model)
    ffn_down: QTensor  # (d_model, n_ff)
    attn_q_bias: np.ndarray | None = None  # (q_dim,) qwen2
    attn_k_bias: np.ndarray | None = None  # (kv_dim,)
    attn_v_bias: np.ndarray | None = None  # (kv_dim,)
    attn_q_norm: np.ndarray | None = None  # (head_dim,) qwen3, gemma3
    attn_k_norm: np.ndarray | None = None  # (head_dim,)
    post_attention_norm: np.ndarray | None = None  # (d_model,) gemma3
    post_ffw_norm: np.ndarray | None = None  # (d_model,) gemma3


class _RunState:
    """Activation buffers for up to `max_batch` tokens, allocated once (shapes per row block)."""

    def __init__(self, cfg: ModelConfig, max_batch: int):
        f32 = np.float32
        self.x = np.zeros((max_batch, cfg.d_model), f32)  # residual stream
        self.h = np.zeros((max_batch, cfg.d_model), f32)  # normed input of a sub-block
        self.proj = np.zeros((max_batch, cfg.d_model), f32)  # sub-block output before residual add
        self.q = np.zeros((max_batch, cfg.q_dim), f32)
        self.k = np.zeros((max_batch, cfg.kv_dim), f32)
        self.v = np.zeros((max_batch, cfg.kv_dim), f32)
        self.att = np.zeros((max_batch, cfg.q_dim), f32)  # attention output, heads concatenated
        self.gate = np.zeros((max_batch, cfg.n_ff), f32)
        self.up = np.zeros((max_batch, cfg.n_ff), f32)
        self.last = np.zeros((1, cfg.d_model), f32)  # final-normed last token
        self.logits = np.zeros((1, cfg.n_vocab), f32)


class TransformerModel:
    def __init__(
        self,
        config: ModelConfig,
        tensors: dict[str, QTensor],
        backend,
        max_batch: int = DEFAULT_MAX_BATCH,
    ):
        self.config = config
        self.backend = backend
        self.max_batch = max_batch
        self.token_embd = _require(tensors, "token_embd.weight")
        # Tied output: many small models reuse the embedding matrix as the output projection.
        self.output = tensors.get("output.weight", self.token_embd)
        _check_shape(self.token_embd, (config.n_vocab, config.d_model))
        _check_shape(self.output, (config.n_vocab, config.d_model))
        self.output_norm = _vector(_require(tensors, "output_norm.weight"))
        self.layers = [self._load_layer(tensors, i) for i in range(config.n_layers)]
        # Per layer: (RoPE base, RoPE frequency scale, attention window), looked up once.
        self._layer_attention = [
            (config.layer_rope_theta(i), config.layer_rope_freq_scale(i), config.layer_window(i))
            for i in range(config.n_layers)
        ]
        self._rope, self._rope_extra = self._choose_rope(tensors)
        self._state = _RunState(config, max_batch)
        # Guards _state and the backend's shared buffers; held for one chunk at a time.
        self.forward_lock = threading.Lock()

    def _choose_rope(self, tensors: dict[str, QTensor]):
        """The rope op and extra keyword arguments. Llama 3.1+ files carry per-frequency divisors
        (`rope_freqs.weight`); a backend whose rope() lacks `freq_factors` gets the numpy rope
        for such models rather than silently wrong positions."""
        factors_tensor = tensors.get("rope_freqs.weight")
        if factors_tensor is None:
            return self.backend.rope, {}
        factors = _vector(factors_tensor)
        if factors.shape != (self.config.head_dim // 2,) or not np.all(factors > 0):
            raise ModelFileError(
                f"tensor 'rope_freqs.weight' must hold {self.config.head_dim // 2} "
                f"positive values; got shape {factors.shape}"
            )
        rope = self.backend.rope
        if "freq_factors" not in inspect.signature(rope).parameters:
            rope = ReferenceBackend().rope
        return rope, {"freq_factors": factors}

    def _load_layer(self, tensors: dict[str, QTensor], i: int) -> Layer:
        cfg = self.config
        p = f"blk.{i}."

        def need(name: str) -> QTensor:
            return _require(tensors, p + name + ".weight")

        def vector(name: str, suffix: str = ".weight") -> np.ndarray:
            return _vector(_require(tensors, p + name + suffix))

        layer = Layer(
            attn_norm=vector("attn_norm"),
            attn_q=need("attn_q"),
            attn_k=need("attn_k"),
            attn_v=need("attn_v"),
            attn_output=need("attn_output"),
            ffn_norm=vector("ffn_norm"),
            ffn_gate=need("ffn_gate"),
            ffn_up=need("ffn_up"),
            ffn_down=need("ffn_down"),
        )
        if cfg.qkv_bias:
            layer.attn_q_bias = vector("attn_q", ".bias")
            layer.attn_k_bias = vector("attn_k", ".bias")
            layer.attn_v_bias = vector("attn_v", ".bias")
        if cfg.qk_norm:
            layer.attn_q_norm = vector("attn_q_norm")
            layer.attn_k_norm = vector("attn_k_norm")
        if cfg.sandwich_norms:
            layer.post_attention_norm = vector("post_attention_norm")
            layer.post_ffw_norm = vector("post_ffw_norm")
        _check_shape(layer.attn_q, (cfg.q_dim, cfg.d_model))
        _check_shape(layer.attn_k, (cfg.kv_dim, cfg.d_model))
        _check_shape(layer.attn_v, (cfg.kv_dim, cfg.d_model))
        _check_shape(layer.attn_output, (cfg.d_model, cfg.q_dim))
        _check_shape(layer.ffn_gate, (cfg.n_ff, cfg.d_model))
        _check_shape(layer.ffn_up, (cfg.n_ff, cfg.d_model))
        _check_shape(layer.ffn_down, (cfg.d_model, cfg.n_ff))
        return layer

    # ------------------------------------------------------------------------------------------
    def new_cache(self, n_ctx: int) -> KVCache:
        return KVCache.for_config(self.config, n_ctx)

    def forward(
        self, tokens, cache: KVCache, *, all_logits: bool = False, logits_at=None, cancel=None
    ) -> np.ndarray:
        """Append `tokens` at positions cache.n_tokens.. and return float32 logits.

        Default: (n_vocab,) for the last token. all_logits=True: (T, n_vocab) for every token.
        logits_at=[i, ...] (indices into `tokens`): (len, n_vocab) for just those tokens, which
        is what scoring and long-prompt checks need without a (T, n_vocab) array. The returned
        array is a fresh copy the caller may keep.

        Thread-safe: each chunk runs under `forward_lock` (see the module docstring), so threads
        with their own caches may call it at the same time. `cancel` (anything with a
        `cancelled` property, e.g. engine.cancel.CancelToken) is polled while waiting for the
        lock and between layers; when it is set, ForwardCancelled is raised and the chunk being
        computed is not committed (chunks finished before it stay in the cache).
        """
        ids = np.asarray(tokens, dtype=np.int64).reshape(-1)
        n = ids.size
        if n == 0:
            raise ValueError("forward() needs at least one token")
        self.check_ids(ids)
        if not all_logits and logits_at is None and n <= self.max_batch:
            # The common case (decode, short prefill): one chunk, last row only.
            cache.reserve(n)
            return self._locked_chunk(ids, cache, np.array([n - 1]), cancel)[0]
        if all_logits:
            wanted = np.arange(n)
        elif logits_at is not None:
            wanted = np.asarray(logits_at, dtype=np.int64).reshape(-1)
            if wanted.size and (wanted.min() < 0 or wanted.max() >= n):
                raise ValueError(f"logits_at indices must be in [0, {n}); got {wanted.tolist()}")
        else:
            wanted = np.array([n - 1])
        unique = np.unique(wanted)  # sorted: chunks emit their rows in ascending order
        cache.reserve(n)
        rows: list[np.ndarray] = []
        for c0 in range(0, n, self.max_batch):
            chunk = ids[c0 : c0 + self.max_batch]
            in_chunk = unique[(unique >= c0) & (unique < c0 + chunk.size)] - c0
            rows.append(self._locked_chunk(chunk, cache, in_chunk, cancel))
        logits = np.concatenate(rows, axis=0)
        if all_logits:
            return logits
        if logits_at is None:
            return logits[0]
        return logits[np.searchsorted(unique, wanted)]  # the caller's order, duplicates kept

    def forward_segments(self, segments: list[Segment], cancel=None) -> list[np.ndarray]:
        """One pass over the weights for several sequences at once (batched decoding): each
        segment appends its token ids to its own KVCache at its own positions; every mat-mul
        runs over the rows of all segments together and attention runs per segment against its
        own cache. -> per segment, float32 logits (len(segment.logit_rows), n_vocab).

        At most max_batch tokens in all, one segment per cache, every cache with room (all
        checked before anything runs). Each segment's logits and KV rows are exactly what
        forward() gives for that sequence alone: the kernels compute every row on its own
        (tests/test_batching_exact.py). Locking and `cancel` as in forward()."""
        if not segments:
            raise ValueError("forward_segments() needs at least one segment")
        total = 0
        for seg in segments:
            ids = np.asarray(seg.ids, dtype=np.int64).reshape(-1)
            if ids.size == 0:
                raise ValueError("forward_segments(): a segment has no tokens")
            self.check_ids(ids)
            rows = np.asarray(seg.logit_rows, dtype=np.int64).reshape(-1)
            if rows.size and (rows.min() < 0 or rows.max() >= ids.size):
                raise ValueError(f"logit_rows must be in [0, {ids.size}); got {rows.tolist()}")
            seg.cache.reserve(ids.size)
            total += ids.size
        if total > self.max_batch:
            raise ValueError(
                f"forward_segments(): {total} tokens exceed max_batch={self.max_batch}"
            )
        if len({id(seg.cache) for seg in segments}) != len(segments):
            raise ValueError("forward_segments(): two segments write the same KV cache")
        self._acquire(cancel)
        try:
            return self._forward_chunk(segments, cancel)
        finally:
            self.forward_lock.release()

    def check_ids(self, ids: np.ndarray) -> None:
        bad = (ids < 0) | (ids >= self.config.n_vocab)
        if bad.any():
            raise ValueError(
                f"token id {int(ids[bad][0])} is out of range [0, {self.config.n_vocab})"
            )

    def _acquire(self, cancel) -> None:
        lock = self.forward_lock
        if cancel is None:
            lock.acquire()
        else:
            while not lock.acquire(timeout=_LOCK_POLL_SECONDS):
                if cancel.cancelled:
                    raise ForwardCancelled()

    def _locked_chunk(self, ids: np.ndarray, cache: KVCache, logit_rows: np.ndarray, cancel):
        self._acquire(cancel)
        try:
            return self._forward_chunk([Segment(ids, cache, logit_rows)], cancel)[0]
        finally:
            self.forward_lock.release()

    def _forward_chunk(self, segments: list[Segment], cancel=None) -> list[np.ndarray]:
        """Run one chunk of at most max_batch tokens made of one or more segments (one sequence
        each, rows concatenated in order); return each segment's logits (len(logit_rows),
        n_vocab) for its segment-relative rows. Prefill is one segment of T tokens, decode one
        of 1 token, batched decode N segments of 1 token: one layer loop serves them all."""
        cfg, ops, st = self.config, self.backend, self._state
        ids = np.concatenate([np.asarray(seg.ids, dtype=np.int64).reshape(-1) for seg in segments])
        n = ids.size
        runs = _SegmentRuns(segments)
        x = st.x[:n]
        ops.embedding(self.token_embd, ids, out=x)
        if cfg.embed_scale != 1.0:
            # Gemma multiplies by sqrt(d_model) rounded to the activation dtype (float32 here).
            x *= np.float32(cfg.embed_scale)

        h, proj, att = st.h[:n], st.proj[:n], st.att[:n]
        q, k, v = st.q[:n], st.k[:n], st.v[:n]
        gate, up = st.gate[:n], st.up[:n]
        q_heads = q.reshape(n, cfg.n_head, cfg.head_dim)
        k_heads = k.reshape(n, cfg.n_kv_head, cfg.head_dim)
        v_heads = v.reshape(n, cfg.n_kv_head, cfg.head_dim)
        # Per segment: its rows, its first position, and (first query, its heads, its output
        # rows) per attention block; views made once per chunk so the backend's per-array
        # pointer cache keeps hitting across layers.
        for run in runs:
            r0, r1 = run.r0, run.r0 + run.n
            run.blocks = [
                (
                    b0,
                    q_heads[r0 + b0 : min(r1, r0 + b0 + ATTENTION_QUERY_BLOCK)],
                    att[r0 + b0 : min(r1, r0 + b0 + ATTENTION_QUERY_BLOCK)],
                )
                for b0 in range(0, run.n, ATTENTION_QUERY_BLOCK)
            ]
        positions = runs.positions

        def poll() -> None:
            # Nothing of this chunk is committed until the end: rows p0.. written so far are
            # scratch that the next write at these positions replaces.
            if cancel is not None and cancel.cancelled:
                raise ForwardCancelled()

        for li, (layer, (theta, fscale, window)) in enumerate(
            zip(self.layers, self._layer_attention, strict=True)
        ):
            poll()
            # --- attention ---
            ops.rmsnorm(x, layer.attn_norm, cfg.norm_eps, out=h)
            ops.linear(layer.attn_q, h, out=q)
            poll()
            ops.linear(layer.attn_k, h, out=k)
            ops.linear(layer.attn_v, h, out=v)
            for qkv, bias in (
                (q, layer.attn_q_bias),
                (k, layer.attn_k_bias),
                (v, layer.attn_v_bias),
            ):
                if bias is not None:  # Qwen2 has all three; each is optional in the file
                    qkv += bias
            if layer.attn_q_norm is not None:
                qr = q.reshape(n * cfg.n_head, cfg.head_dim)
                kr = k.reshape(n * cfg.n_kv_head, cfg.head_dim)
                ops.rmsnorm(qr, layer.attn_q_norm, cfg.norm_eps, out=qr)
                ops.rmsnorm(kr, layer.attn_k_norm, cfg.norm_eps, out=kr)
            rope_args = dict(theta=theta, neox=cfg.rope_neox, freq_scale=fscale, **self._rope_extra)
            self._rope(q_heads, positions, **rope_args)
            self._rope(k_heads, positions, **rope_args)
            for run in runs:  # attention: each sequence against its own cache
                k_cache, v_cache = run.cache.layer(li)
                k_cache[run.p0 : run.p0 + run.n] = k_heads[run.r0 : run.r0 + run.n]
                v_cache[run.p0 : run.p0 + run.n] = v_heads[run.r0 : run.r0 + run.n]
                for b0, q_block, att_block in run.blocks:
                    poll()
                    ops.attention(
                        q_block,
                        k_cache,
                        v_cache,
                        p0=run.p0 + b0,
                        scale=cfg.attn_scale,
                        window=window,
                        softcap=cfg.attn_logit_softcap,
                        out=att_block,
                    )
            poll()
            ops.linear(layer.attn_output, att, out=proj)
            if layer.post_attention_norm is not None:
                ops.rmsnorm(proj, layer.post_attention_norm, cfg.norm_eps, out=proj)
            x += proj
            # --- feed-forward ---
            poll()
            ops.rmsnorm(x, layer.ffn_norm, cfg.norm_eps, out=h)
            ops.linear(layer.ffn_gate, h, out=gate)
            poll()
            ops.linear(layer.ffn_up, h, out=up)
            if cfg.activation == "gelu_tanh":
                ops.geglu(gate, up, out=gate)
            else:
                ops.swiglu(gate, up, out=gate)
            poll()
            ops.linear(layer.ffn_down, gate, out=proj)
            if layer.post_ffw_norm is not None:
                ops.rmsnorm(proj, layer.post_ffw_norm, cfg.norm_eps, out=proj)
            x += proj
        for run in runs:
            run.cache.commit(run.ids)

        # One output projection for every segment's rows (the largest matrix of a small model:
        # reading it once per step, not once per sequence, is much of what batching saves).
        wanted = runs.logit_rows()
        logits = self._logits(x, np.concatenate(wanted))
        bounds = np.cumsum([0] + [rows.size for rows in wanted])
        return [logits[a:b] for a, b in zip(bounds[:-1], bounds[1:], strict=True)]

    def _logits(self, x: np.ndarray, logit_rows: np.ndarray) -> np.ndarray:
        """Final norm + output projection for the chunk rows asked for: (len(rows), n_vocab)."""
        cfg, ops, st = self.config, self.backend, self._state
        if logit_rows.size == 0:
            return np.zeros((0, cfg.n_vocab), np.float32)
        if logit_rows.size == 1:
            # The decode case: reuse the preallocated single-row buffers.
            ops.rmsnorm(
                x[logit_rows[0] : logit_rows[0] + 1], self.output_norm, cfg.norm_eps, out=st.last
            )
            logits = ops.linear(self.output, st.last, out=st.logits).copy()
        else:
            normed = ops.rmsnorm(
                np.ascontiguousarray(x[logit_rows]), self.output_norm, cfg.norm_eps
            )
            logits = ops.linear(self.output, normed)
        if cfg.final_logit_softcap > 0.0:
            cap = np.float32(cfg.final_logit_softcap)
            logits = cap * np.tanh(logits / cap)
        return logits


@dataclass
class Segment:
    """One sequence's part of a batched forward: token ids appended to `cache` at its next
    positions, and the segment-relative rows whose logits are wanted."""

    ids: np.ndarray | list[int]
    cache: KVCache
    logit_rows: np.ndarray | list[int]


@dataclass
class _Run:
    """A segment placed in the chunk: rows r0..r0+n of the activations, positions p0..p0+n."""

    ids: np.ndarray
    cache: KVCache
    logit_rows: np.ndarray
    r0: int
    p0: int
    n: int
    blocks: list = field(default_factory=list)


class _SegmentRuns(list):
    """The segments of one chunk laid out one after another (rows and positions)."""

    def __init__(self, segments: list[Segment]):
        super().__init__()
        r0 = 0
        for seg in segments:
            ids = np.asarray(seg.ids, dtype=np.int64).reshape(-1)
            rows = np.asarray(seg.logit_rows, dtype=np.int64).reshape(-1)
            p0 = seg.cache.reserve(ids.size)
            self.append(_Run(ids, seg.cache, rows, r0, p0, ids.size))
            r0 += ids.size
        self.positions = np.concatenate(
            [np.arange(run.p0, run.p0 + run.n, dtype=np.int32) for run in self]
        )

    def logit_rows(self) -> list[np.ndarray]:
        """Each segment's wanted rows as chunk rows."""
        return [run.logit_rows + run.r0 for run in self]


def _require(tensors: dict[str, QTensor], name: str) -> QTensor:
    tensor = tensors.get(name)
    if tensor is None:
        raise ModelFileError(f"tensor '{name}' is missing from the model file")
    return tensor


def _vector(t: QTensor) -> np.ndarray:
    """Norm weights and biases: tiny, so converted to float32 once at load."""
    return np.ascontiguousarray(dequantize_full(t).reshape(-1), dtype=np.float32)


def _check_shape(t: QTensor, expected: tuple[int, int]) -> None:
    if tuple(t.shape) != expected:
        raise ModelFileError(f"tensor '{t.name}' has shape {tuple(t.shape)}, expected {expected}")
