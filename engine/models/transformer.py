"""The decoder-only transformer shared by every supported architecture (engine.config).

The architectures differ only in switches that ModelConfig carries (RoPE pairing and scaling,
per-layer RoPE on/off, q/k norms per head or over the whole projection, q/k/v/o biases, pre- and
post-norms, Gemma's GeGLU / scaled embeddings / sliding window / soft-caps, Granite's
multipliers, qwen3moe's routed experts, gpt-oss's attention sinks and biased experts with a
clamped SwiGLU), so one forward pass serves all of them. Fused tensors
(Phi-3's attn_qkv and gate+up ffn_up) and stacked experts are split into zero-copy row views at
load, so the pass never sees them. Attribute names match the GGUF tensor names (`blk.N.attn_q`
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
  and its token ids), which is how engine/batching decodes concurrent requests together.
The layer is described once, in `_run_layers`: prefill runs it op by op (through LoopOps), and
a one-token decode runs it as the native step lists recorded from one run of that same code
(engine/models/decode_plan.py; LOCALCHAT_DECODE_STEPS=0 keeps the op-by-op loop).
A forward pass waiting for the lock, or running a chunk, polls its cancel token between its
sub-steps (each layer's q/k/v projections, attention in blocks of ATTENTION_QUERY_BLOCK queries,
the output projection, the feed-forward), so Stop lands within one such step (milliseconds)
instead of one 256-token chunk (seconds at a long context; bench/bench_cancel_latency.py). The
cancelled chunk is not committed to the KV cache (`engine.cancel.ForwardCancelled`).
"""

from __future__ import annotations

import math
import threading
from dataclasses import dataclass, field
from typing import Literal

import numpy as np

from engine.cancel import ForwardCancelled
from engine.config import GPT_OSS_SWIGLU_ALPHA, GPT_OSS_SWIGLU_LIMIT, ModelConfig
from engine.errors import ModelFileError
from engine.kernels.reference import dequantize_full
from engine.kv_cache import KVCache
from engine.models import decode_plan
from engine.models.batch_decode import decode_batch
from engine.models.decode_plan import DecodePlan, LoopOps
from engine.qtensor import QTensor
from engine.types import KvCacheType

DEFAULT_MAX_BATCH = 256
# Attention over a long context dominates a prefill chunk (SmolLM2 at 4k positions: ~3/4 of
# it); computing it in blocks of this many queries gives Stop a place to land between blocks.
# Each (query, head) is computed on its own, so the blocks give exactly the unsplit result.
ATTENTION_QUERY_BLOCK = 32
# How often a forward pass waiting for another request's chunk rechecks its cancel token.
_LOCK_POLL_SECONDS = 0.01


@dataclass
class Layer:
    attn_norm: np.ndarray | None  # (d_model,) f32; None without pre-norms (olmo2)
    attn_q: QTensor  # (q_dim, d_model)
    attn_k: QTensor  # (kv_dim, d_model)
    attn_v: QTensor  # (kv_dim, d_model)
    attn_output: QTensor  # (d_model, q_dim)
    ffn_norm: np.ndarray | None  # (d_model,) f32; None without pre-norms
    ffn_gate: QTensor | None  # (n_ff, d_model); None in a mixture-of-experts layer
    ffn_up: QTensor | None  # (n_ff, d_model)
    ffn_down: QTensor | None  # (d_model, n_ff)
    attn_q_bias: np.ndarray | None = None  # (q_dim,) qwen2
    attn_k_bias: np.ndarray | None = None  # (kv_dim,)
    attn_v_bias: np.ndarray | None = None  # (kv_dim,)
    attn_output_bias: np.ndarray | None = None  # (d_model,) gpt-oss
    attn_sinks: np.ndarray | None = None  # (n_head,) gpt-oss: a logit per head in each softmax
    # (head_dim,) per head (qwen3, gemma3) or (q_dim,) / (kv_dim,) over the projection (olmo2)
    attn_q_norm: np.ndarray | None = None
    attn_k_norm: np.ndarray | None = None
    post_attention_norm: np.ndarray | None = None  # (d_model,) gemma2/3, olmo2
    post_ffw_norm: np.ndarray | None = None  # (d_model,)
    ffn_gate_inp: QTensor | None = None  # (n_expert, d_model) the MoE router
    # Per expert (gate, up, down): zero-copy row views of the stacked *_exps tensors, so a
    # token reads only the weights of the experts it is routed to.
    experts: list[tuple[QTensor, QTensor, QTensor]] | None = None
    # gpt-oss: the router's bias (n_expert,) and per expert (gate, up, down) bias rows, views
    # of the (n_expert, rows) float32 stacks.
    ffn_gate_inp_bias: np.ndarray | None = None
    expert_biases: list[tuple[np.ndarray, np.ndarray, np.ndarray]] | None = None


@dataclass(frozen=True)
class _LayerAttention:
    """What attention needs per layer, looked up once at load."""

    theta: float  # RoPE base
    freq_scale: float  # linear RoPE scaling
    window: int  # 0 = full attention
    scale: float  # multiplies q.k
    rope: bool  # False: no RoPE on this layer (SmolLM3's every fourth)
    scaled: bool  # the long-context RoPE factors apply (global layers)
    q_gain: float  # multiplies the rotated dims of q after a partial RoPE (attention factor^2)


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


class _MoeBuffers:
    """One-token buffers of the MoE decode path, allocated once (shared like _RunState)."""

    def __init__(self, cfg: ModelConfig):
        f32 = np.float32
        self.router1 = np.zeros((1, cfg.n_expert), f32)
        self.gate1 = np.zeros((1, cfg.n_ff_exp), f32)
        self.up1 = np.zeros((1, cfg.n_ff_exp), f32)
        self.down1 = np.zeros((1, cfg.d_model), f32)


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
        # How new caches store K/V (load_model sets it from its cache_type argument).
        self.cache_type: KvCacheType = KvCacheType.F16
        self.token_embd = _require(tensors, "token_embd.weight")
        # Tied output: many small models reuse the embedding matrix as the output projection.
        self.output = tensors.get("output.weight", self.token_embd)
        _check_shape(self.token_embd, (config.n_vocab, config.d_model))
        _check_shape(self.output, (config.n_vocab, config.d_model))
        self.output_norm = _vector(_require(tensors, "output_norm.weight"))
        self.layers = [self._load_layer(tensors, i) for i in range(config.n_layers)]
        self._layer_attention = [
            _LayerAttention(
                theta=config.layer_rope_theta(i),
                freq_scale=config.layer_rope_freq_scale(i),
                window=config.layer_window(i),
                scale=config.layer_attn_scale(i),
                rope=config.layer_rope(i),
                scaled=config.layer_rope_scaled(i),
                q_gain=config.layer_rope_gain(i) if config.rope_dims else 1.0,
            )
            for i in range(config.n_layers)
        ]
        self._rope_factors, self._rope_factors_long = rope_factors(config, tensors)
        # Per layer, q's multipliers after a partial RoPE as a (q_dim,) row: the gain on each
        # head's rotated dims, 1.0 (an exact product) on the rest; None where there is none.
        self._q_gains = [
            _q_gain_row(config, la.q_gain) if la.q_gain != 1.0 else None
            for la in self._layer_attention
        ]
        self._moe = _MoeBuffers(config) if config.n_expert else None
        self._state = _RunState(config, max_batch)
        # The one-token decode's recorded step lists (engine/models/decode_plan.py), per KV
        # cache type: recorded on first use, False where this backend has none.
        self._plans: dict[KvCacheType, DecodePlan | Literal[False]] = {}
        # Guards _state and the backend's shared buffers; held for one chunk at a time.
        self.forward_lock = threading.Lock()

    def matrices(self) -> list[QTensor]:
        """Every weight a forward pass multiplies by, once each, in the order a forward pass
        first uses them (the record cache lays its file out in this order)."""
        out: dict[int, QTensor] = {}
        for layer in self.layers:
            ws: list[QTensor | None] = [layer.attn_q, layer.attn_k, layer.attn_v, layer.attn_output]
            ws += [layer.ffn_gate_inp, layer.ffn_gate, layer.ffn_up, layer.ffn_down]
            for expert in layer.experts or ():
                ws += expert
            for w in ws:
                if w is not None:
                    out.setdefault(id(w), w)
        out.setdefault(id(self.output), self.output)
        return list(out.values())

    def _load_layer(self, tensors: dict[str, QTensor], i: int) -> Layer:
        cfg = self.config
        p = f"blk.{i}."

        def need(name: str) -> QTensor:
            return _require(tensors, p + name + ".weight")

        def vector(name: str, suffix: str = ".weight") -> np.ndarray:
            return _vector(_require(tensors, p + name + suffix))

        if p + "attn_qkv.weight" in tensors:
            qkv = need("attn_qkv")
            _check_shape(qkv, (cfg.q_dim + 2 * cfg.kv_dim, cfg.d_model))
            attn_q = _rows(qkv, 0, cfg.q_dim, p + "attn_q.weight")
            attn_k = _rows(qkv, cfg.q_dim, cfg.q_dim + cfg.kv_dim, p + "attn_k.weight")
            attn_v = _rows(
                qkv, cfg.q_dim + cfg.kv_dim, cfg.q_dim + 2 * cfg.kv_dim, p + "attn_v.weight"
            )
        else:
            attn_q, attn_k, attn_v = need("attn_q"), need("attn_k"), need("attn_v")
        ffn_gate: QTensor | None
        ffn_up: QTensor | None
        ffn_down: QTensor | None
        if cfg.n_expert:
            ffn_gate = ffn_up = ffn_down = None
        elif cfg.fused_gate_up:
            # Phi-3: gate rows first, then up (transformers' gate_up_proj.chunk(2)).
            gate_up = need("ffn_up")
            _check_shape(gate_up, (2 * cfg.n_ff, cfg.d_model))
            ffn_gate = _rows(gate_up, 0, cfg.n_ff, p + "ffn_gate.weight")
            ffn_up = _rows(gate_up, cfg.n_ff, 2 * cfg.n_ff, p + "ffn_up.weight")
        else:
            ffn_gate, ffn_up = need("ffn_gate"), need("ffn_up")
        if not cfg.n_expert:
            ffn_down = need("ffn_down")
        layer = Layer(
            attn_norm=vector("attn_norm") if cfg.pre_norms else None,
            attn_q=attn_q,
            attn_k=attn_k,
            attn_v=attn_v,
            attn_output=need("attn_output"),
            ffn_norm=vector(cfg.ffn_norm_tensor) if cfg.pre_norms else None,
            ffn_gate=ffn_gate,
            ffn_up=ffn_up,
            ffn_down=ffn_down,
        )
        if cfg.qkv_bias:
            layer.attn_q_bias = vector("attn_q", ".bias")
            layer.attn_k_bias = vector("attn_k", ".bias")
            layer.attn_v_bias = vector("attn_v", ".bias")
        if cfg.attn_output_bias:
            layer.attn_output_bias = vector("attn_output", ".bias")
        if cfg.attn_sinks:
            layer.attn_sinks = vector("attn_sinks")
            if layer.attn_sinks.shape != (cfg.n_head,):
                raise ModelFileError(
                    f"{p}attn_sinks.weight holds {layer.attn_sinks.size} values, expected "
                    f"{cfg.n_head} (one per query head)"
                )
        if cfg.qk_norm:
            layer.attn_q_norm = vector("attn_q_norm")
            layer.attn_k_norm = vector("attn_k_norm")
            q_norm, k_norm = (cfg.q_dim, cfg.kv_dim) if cfg.qk_norm_full else (cfg.head_dim,) * 2
            if layer.attn_q_norm.shape != (q_norm,) or layer.attn_k_norm.shape != (k_norm,):
                raise ModelFileError(
                    f"{p}attn_q_norm/attn_k_norm hold {layer.attn_q_norm.size}/"
                    f"{layer.attn_k_norm.size} values, expected {q_norm}/{k_norm}"
                )
        if cfg.sandwich_norms:
            layer.post_attention_norm = vector("post_attention_norm")
            layer.post_ffw_norm = vector("post_ffw_norm")
        _check_shape(layer.attn_q, (cfg.q_dim, cfg.d_model))
        _check_shape(layer.attn_k, (cfg.kv_dim, cfg.d_model))
        _check_shape(layer.attn_v, (cfg.kv_dim, cfg.d_model))
        _check_shape(layer.attn_output, (cfg.d_model, cfg.q_dim))
        if cfg.n_expert:
            e, ff, d = cfg.n_expert, cfg.n_ff_exp, cfg.d_model
            layer.ffn_gate_inp = need("ffn_gate_inp")
            _check_shape(layer.ffn_gate_inp, (e, d))
            # llama.cpp also takes gate and up as one stack (convert_hf_to_gguf's
            # --fuse-gate-up-exps): per expert, its ff gate rows, then its ff up rows.
            fused = p + "ffn_gate_up_exps.weight" in tensors
            if fused:
                gate_up = need("ffn_gate_up_exps")
                stacks = [gate_up, gate_up, need("ffn_down_exps")]
                shapes = ((e, 2 * ff, d), (e, 2 * ff, d), (e, d, ff))
            else:
                stacks = [need("ffn_gate_exps"), need("ffn_up_exps"), need("ffn_down_exps")]
                shapes = ((e, ff, d), (e, ff, d), (e, d, ff))
            for stack, shape in zip(stacks, shapes, strict=True):
                if tuple(stack.shape) != shape:
                    raise ModelFileError(
                        f"tensor '{stack.name}' has shape {tuple(stack.shape)}, expected {shape}"
                    )
            per_expert = 2 * ff if fused else ff  # rows of one expert in the gate / up stacks
            layer.experts = [
                (
                    _expert(stacks[0], j, ff, f"{p}ffn_gate.{j}.weight", per_expert),
                    _expert(
                        stacks[1], j, ff, f"{p}ffn_up.{j}.weight", per_expert, ff if fused else 0
                    ),
                    _expert(stacks[2], j, d, f"{p}ffn_down.{j}.weight"),
                )
                for j in range(e)
            ]
            if cfg.moe_bias:
                layer.ffn_gate_inp_bias = vector("ffn_gate_inp", ".bias")
                down_bias = _bias_rows(_require(tensors, f"{p}ffn_down_exps.bias"), e, d)
                if fused:
                    both = _bias_rows(_require(tensors, f"{p}ffn_gate_up_exps.bias"), e, 2 * ff)
                    biases = [both[:, :ff], both[:, ff:], down_bias]
                else:
                    biases = [
                        _bias_rows(_require(tensors, f"{p}{part}.bias"), e, ff)
                        for part in ("ffn_gate_exps", "ffn_up_exps")
                    ] + [down_bias]
                if layer.ffn_gate_inp_bias.shape != (e,):
                    raise ModelFileError(
                        f"{p}ffn_gate_inp.bias holds {layer.ffn_gate_inp_bias.size} values, "
                        f"expected {e} (one per expert)"
                    )
                layer.expert_biases = [(biases[0][j], biases[1][j], biases[2][j]) for j in range(e)]
            return layer
        assert layer.ffn_gate is not None and layer.ffn_up is not None
        assert layer.ffn_down is not None
        _check_shape(layer.ffn_gate, (cfg.n_ff, cfg.d_model))
        _check_shape(layer.ffn_up, (cfg.n_ff, cfg.d_model))
        _check_shape(layer.ffn_down, (cfg.d_model, cfg.n_ff))
        return layer

    # ------------------------------------------------------------------------------------------
    def new_cache(self, n_ctx: int) -> KVCache:
        return KVCache.for_config(self.config, n_ctx, self.cache_type)

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
        cfg, st = self.config, self._state
        ids = np.concatenate([np.asarray(seg.ids, dtype=np.int64).reshape(-1) for seg in segments])
        n = ids.size
        runs = _SegmentRuns(segments)
        if n == 1:
            plan = self.decode_plan(runs[0].cache.cache_type)
            if plan is not None:
                return [self._planned_decode(plan, runs[0], cancel)]
        if n > 1 and len(runs) == n:  # batched decode: N sequences, one token each
            batched = decode_batch(self, runs, ids, cancel)
            if batched is not None:
                return batched
        x = st.x[:n]
        self.backend.embedding(self.token_embd, ids, out=x)
        if cfg.embed_scale != 1.0:
            # Gemma multiplies by sqrt(d_model) rounded to the activation dtype (float32 here).
            x *= np.float32(cfg.embed_scale)
        self._run_layers(LoopOps(self.backend), runs, cancel)
        for run in runs:
            run.cache.commit(run.ids)

        # One output projection for every segment's rows (the largest matrix of a small model:
        # reading it once per step, not once per sequence, is much of what batching saves).
        wanted = runs.logit_rows()
        logits = self._logits(x, np.concatenate(wanted))
        bounds = np.cumsum([0] + [rows.size for rows in wanted])
        return [logits[a:b] for a, b in zip(bounds[:-1], bounds[1:], strict=True)]

    def _run_layers(self, ops, runs: _SegmentRuns, cancel) -> None:
        """The layer, described once: every layer over the chunk's rows of the residual stream
        (_RunState.x, embedded). `ops` is LoopOps (run each op now) or decode_plan's recorder
        (capture each op as a native step), so the decode plan is this code recorded."""
        cfg, st = self.config, self._state
        n = sum(run.n for run in runs)
        x = st.x[:n]
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

        # LongRoPE picks its table by each sequence's largest position: one rope call over all
        # rows while every segment uses the same table, else one per segment.
        run_factors = [self._factors_for(run.p0 + run.n) for run in runs]
        # (q rows, k rows, their positions, factors); the views made once per chunk, like
        # run.blocks, so the backend's pointer cache hits in every layer
        if all(f is run_factors[0] for f in run_factors):
            rope_groups = [(q_heads, k_heads, positions, run_factors[0])]
        else:
            rope_groups = [
                (
                    q_heads[run.r0 : run.r0 + run.n],
                    k_heads[run.r0 : run.r0 + run.n],
                    positions[run.r0 : run.r0 + run.n],
                    f,
                )
                for run, f in zip(runs, run_factors, strict=True)
            ]
        for li, (layer, la) in enumerate(zip(self.layers, self._layer_attention, strict=True)):
            poll()
            ops.layer_start()  # a recorded plan checks the cancel token here too
            # --- attention ---
            src = h
            if layer.attn_norm is not None:
                ops.rmsnorm(x, layer.attn_norm, cfg.norm_eps, out=h)
            else:  # OLMo 2: the sub-block reads the residual stream itself
                src = x
            # q, k and v read the same input: one call, which the JIT runs as one pool job
            ops.linear_many((layer.attn_q, layer.attn_k, layer.attn_v), src, (q, k, v))
            for qkv, bias in (
                (q, layer.attn_q_bias),
                (k, layer.attn_k_bias),
                (v, layer.attn_v_bias),
            ):
                if bias is not None:  # Qwen2 has all three; each is optional in the file
                    ops.add(qkv, bias, qkv)
            if layer.attn_q_norm is not None and cfg.qk_norm_full:
                ops.rmsnorm(q, layer.attn_q_norm, cfg.norm_eps, out=q)
                ops.rmsnorm(k, layer.attn_k_norm, cfg.norm_eps, out=k)
            elif layer.attn_q_norm is not None:
                qr = q.reshape(n * cfg.n_head, cfg.head_dim)
                kr = k.reshape(n * cfg.n_kv_head, cfg.head_dim)
                ops.rmsnorm(qr, layer.attn_q_norm, cfg.norm_eps, out=qr)
                ops.rmsnorm(kr, layer.attn_k_norm, cfg.norm_eps, out=kr)
            if la.rope:
                rope_args: dict = dict(theta=la.theta, neox=cfg.rope_neox, freq_scale=la.freq_scale)
                if cfg.rope_dims:
                    rope_args["n_rot"] = cfg.rope_dims
                for q_rows, k_rows, rows_positions, factors in rope_groups:
                    args = rope_args
                    if la.scaled and factors is not None:
                        args = {**rope_args, "freq_factors": factors}
                    ops.rope(q_rows, rows_positions, **args)
                    ops.rope(k_rows, rows_positions, **args)
                gain = self._q_gains[li]
                if gain is not None:
                    ops.mul(q, gain)
            if cfg.attn_temp_scale > 0.0:  # a per-position query multiplier
                ops.mul_by_position(q, positions, self._attn_temperature)
            for run in runs:  # attention: each sequence against its own cache
                rows = slice(run.r0, run.r0 + run.n)
                ops.kv_write(run.cache, li, run.p0, k_heads[rows], v_heads[rows])
                k_cache, v_cache = run.cache.layer(li)
                for b0, q_block, att_block in run.blocks:
                    poll()
                    ops.attention(
                        q_block,
                        k_cache,
                        v_cache,
                        p0=run.p0 + b0,
                        scale=la.scale,
                        window=la.window,
                        softcap=cfg.attn_logit_softcap,
                        sinks=layer.attn_sinks,
                        out=att_block,
                    )
            poll()
            ops.linear(layer.attn_output, att, out=proj)
            if layer.attn_output_bias is not None:
                ops.add(proj, layer.attn_output_bias, proj)
            if layer.post_attention_norm is not None:
                ops.rmsnorm(proj, layer.post_attention_norm, cfg.norm_eps, out=proj)
            if cfg.residual_scale != 1.0:  # Granite's residual_multiplier
                ops.scale(proj, cfg.residual_scale)
            ops.add(x, proj, x)
            # --- feed-forward ---
            poll()
            src = h
            if layer.ffn_norm is not None:
                ops.rmsnorm(x, layer.ffn_norm, cfg.norm_eps, out=h)
            else:
                src = x
            if layer.experts is not None:
                # routing picks the expert weights per token: no fixed step list
                ops.moe_ffn(self, layer, src, proj, poll)
            else:
                ops.linear_many((layer.ffn_gate, layer.ffn_up), src, (gate, up))
                self._gated(ops, gate, up)
                poll()
                ops.linear(layer.ffn_down, gate, out=proj)
            if layer.post_ffw_norm is not None:
                ops.rmsnorm(proj, layer.post_ffw_norm, cfg.norm_eps, out=proj)
            if cfg.residual_scale != 1.0:
                ops.scale(proj, cfg.residual_scale)
            ops.add(x, proj, x)

    def _attn_temperature(self, positions: np.ndarray) -> np.ndarray:
        """Llama 4 / Ministral 3's per-position query multiplier, (n, 1) float32."""
        cfg = self.config
        return (
            1.0
            + cfg.attn_temp_scale
            * np.log1p(np.floor(positions.astype(np.float64) / cfg.attn_temp_length))
        ).astype(np.float32)[:, None]

    def decode_plan(self, cache_type: KvCacheType) -> DecodePlan | None:
        """The recorded one-token decode for caches of `cache_type`, recorded on first use; None
        where the backend has no native steps (or LOCALCHAT_DECODE_STEPS=0)."""
        plan = self._plans.get(cache_type)
        if plan is None:
            plan = decode_plan.record(self, cache_type) or False
            self._plans[cache_type] = plan
        return plan or None

    def decode_path(self, cache_type: KvCacheType | None = None) -> tuple[str, list[str]]:
        """("steps" | "mixed" | "ops", the ops recorded as Python fallbacks) of a one-token
        decode into a cache of `cache_type` (default: the model's)."""
        with self.forward_lock:
            plan = self.decode_plan(cache_type or self.cache_type)
        if plan is None:
            return "ops", []
        return plan.path, sorted(set(plan.fallbacks))

    def _planned_decode(self, plan: DecodePlan, run: _Run, cancel) -> np.ndarray:
        """One token through the recorded layers (the same kernels on the same arrays as the
        op-by-op loop, so the same bits), then the logits."""
        cfg, x = self.config, self._state.x[:1]
        self.backend.embedding(self.token_embd, run.ids, out=x)
        if cfg.embed_scale != 1.0:
            x *= np.float32(cfg.embed_scale)
        plan.run(run.cache, run.p0, cancel)
        run.cache.commit(run.ids)
        rows = run.logit_rows  # segment rows of a one-token segment: each is row 0
        if rows.size == 0:
            return np.zeros((0, cfg.n_vocab), np.float32)
        logits = self._logits(x, np.zeros(1, np.int64))
        return logits if rows.size == 1 else logits[np.zeros(rows.size, np.int64)]

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
        if cfg.logit_scale != 1.0:  # Granite divides the logits by logits_scaling
            logits /= np.float32(cfg.logit_scale)
        if cfg.final_logit_softcap > 0.0:
            cap = np.float32(cfg.final_logit_softcap)
            logits = cap * np.tanh(logits / cap)
        return logits

    def _moe_router(self, ops, layer: Layer, h: np.ndarray) -> None:
        """One token's router logits (plus the router bias, gpt-oss) into the MoE buffers."""
        moe = self._moe
        assert moe is not None and layer.ffn_gate_inp is not None
        ops.linear(layer.ffn_gate_inp, h, out=moe.router1)
        if layer.ffn_gate_inp_bias is not None:
            ops.add(moe.router1, layer.ffn_gate_inp_bias, moe.router1)

    def _moe_route(self) -> tuple[list[int], list[float]]:
        """The experts one token goes to (ascending ids) and their weights: the top
        n_expert_used router logits, softmax over just those."""
        assert self._moe is not None
        router, k = self._moe.router1[0], self.config.n_expert_used
        chosen = np.sort(np.argpartition(router, -k)[-k:])
        weights = np.exp(router[chosen] - router[chosen].max())
        weights /= weights.sum()
        return chosen.tolist(), weights.tolist()

    def _moe_expert(self, ops, layer: Layer, expert: int, h: np.ndarray) -> None:
        """One expert's gated FFN (with its biases, gpt-oss) of one token into moe.down1."""
        moe = self._moe
        assert moe is not None and layer.experts is not None
        gate_w, up_w, down_w = layer.experts[expert]
        biases = layer.expert_biases[expert] if layer.expert_biases is not None else None
        ops.linear_many((gate_w, up_w), h, (moe.gate1, moe.up1))
        if biases is not None:
            ops.add(moe.gate1, biases[0], moe.gate1)
            ops.add(moe.up1, biases[1], moe.up1)
        self._gated(ops, moe.gate1, moe.up1)
        ops.linear(down_w, moe.gate1, out=moe.down1)
        if biases is not None:
            ops.add(moe.down1, biases[2], moe.down1)

    def _moe_ffn(self, layer: Layer, h: np.ndarray, out: np.ndarray, poll) -> None:
        """Mixture of experts (transformers' Qwen3MoeSparseMoeBlock and GptOssMLP, llama.cpp's
        build_moe_ffn with softmax gating over the chosen logits): the top n_expert_used experts
        per token by router logit (plus the router bias, gpt-oss), weighted by the softmax over
        the chosen logits (the same as softmax over all, then the chosen probabilities
        renormalised to sum 1); each chosen expert runs its gated FFN (with its biases, gpt-oss)
        on just the tokens routed to it. A decode step reads the weights of n_expert_used
        experts, not all of them."""
        ops, k, moe = self.backend, self.config.n_expert_used, self._moe
        assert layer.ffn_gate_inp is not None and layer.experts is not None and moe is not None
        biases = layer.expert_biases
        n = h.shape[0]
        if n == 1:  # decode: fixed buffers (the backend's pointer caches keep hitting)
            loop = LoopOps(ops)
            self._moe_router(loop, layer, h)
            chosen, weights = self._moe_route()
            out[...] = 0.0
            for expert, weight in zip(chosen, weights, strict=True):
                self._moe_expert(loop, layer, expert, h)
                out += np.float32(weight) * moe.down1
            return
        logits = ops.linear(layer.ffn_gate_inp, h)  # (n, n_expert)
        if layer.ffn_gate_inp_bias is not None:
            logits += layer.ffn_gate_inp_bias
        logits = logits.astype(np.float64)
        order = np.argsort(-logits, axis=1, kind="stable")[:, :k]  # (n, k), ties: lower id
        picked = np.take_along_axis(logits, order, axis=1)
        weights = np.exp(picked - picked.max(axis=1, keepdims=True))
        weights /= weights.sum(axis=1, keepdims=True)
        out[...] = 0.0
        for expert in np.unique(order).tolist():
            poll()
            rows, slots = np.nonzero(order == expert)
            gate_w, up_w, down_w = layer.experts[expert]
            xe = np.ascontiguousarray(h[rows])
            gate = ops.linear(gate_w, xe)
            up = ops.linear(up_w, xe)
            if biases is not None:
                gate += biases[expert][0]
                up += biases[expert][1]
            self._gated(self.backend, gate, up)
            down = ops.linear(down_w, gate)
            if biases is not None:
                down += biases[expert][2]
            out[rows] += down * weights[rows, slots].astype(np.float32)[:, None]

    def _gated(self, ops, gate: np.ndarray, up: np.ndarray) -> None:
        """gate <- the architecture's gated activation of (gate, up), in place (ops: the backend,
        LoopOps or the decode-plan recorder)."""
        if self.config.activation == "swiglu_oai":
            ops.swiglu_oai(
                gate, up, alpha=GPT_OSS_SWIGLU_ALPHA, limit=GPT_OSS_SWIGLU_LIMIT, out=gate
            )
        elif self.config.activation == "gelu_tanh":
            ops.geglu(gate, up, out=gate)
        else:
            ops.swiglu(gate, up, out=gate)

    def _factors_for(self, seq_len: int) -> np.ndarray | None:
        """The per-frequency RoPE divisors for a chunk whose last position is seq_len - 1:
        LongRoPE's long factors once the sequence is longer than the original training context
        (transformers' longrope_frequency_update on max(position_ids) + 1, and llama.cpp's
        choice by the batch's largest position), else the short / only table."""
        if self._rope_factors_long is not None and seq_len > self.config.rope_orig_context:
            return self._rope_factors_long
        return self._rope_factors


DECODE_STEPS_ENV = decode_plan.DECODE_STEPS_ENV  # kept importable from here


def rope_factors(
    cfg: ModelConfig, tensors: dict[str, QTensor]
) -> tuple[np.ndarray | None, np.ndarray | None]:
    """(factors, long_factors): per-frequency divisors of the global layers' RoPE frequencies.
    Llama 3.1+ stores them (rope_freqs.weight); YaRN's are computed from the metadata; Phi-3's
    LongRoPE stores a short and a long table (the long one is returned second)."""
    half = cfg.rope_rot // 2

    def table(name: str) -> np.ndarray | None:
        tensor = tensors.get(name)
        if tensor is None:
            return None
        values = _vector(tensor)
        if values.shape != (half,) or not np.all(np.isfinite(values)) or not np.all(values > 0):
            raise ModelFileError(
                f"tensor '{name}' must hold {half} positive finite values; got shape {values.shape}"
            )
        return values

    if cfg.rope_scaling == "longrope":
        short, long = table("rope_factors_short.weight"), table("rope_factors_long.weight")
        if (short is None) != (long is None):
            missing = "rope_factors_short" if short is None else "rope_factors_long"
            raise ModelFileError(f"tensor '{missing}.weight' is missing (LongRoPE needs both)")
        return short, long
    if cfg.rope_scaling == "yarn":
        return yarn_freq_factors(cfg), None
    return table("rope_freqs.weight"), None


def yarn_freq_factors(cfg: ModelConfig) -> np.ndarray:
    """YaRN as transformers computes it (_compute_yarn_parameters): frequencies below the
    correction range are interpolated (divided by the factor), those above kept, and a linear
    ramp blends them in between. The range ends are rounded outwards to whole dims unless
    cfg.yarn_truncate is off (gpt-oss). Returned as divisors of the plain RoPE frequencies."""
    dim, base, factor = cfg.rope_rot, cfg.rope_theta, cfg.rope_scaling_factor
    orig = cfg.rope_orig_context

    def correction_dim(rotations: float) -> float:
        return dim * math.log(orig / (rotations * 2 * math.pi)) / (2 * math.log(base))

    low: float = correction_dim(cfg.yarn_beta_fast)
    high: float = correction_dim(cfg.yarn_beta_slow)
    if cfg.yarn_truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001  # transformers' guard against a zero-width ramp
    ramp = np.clip((np.arange(dim // 2, dtype=np.float32) - low) / (high - low), 0, 1)
    extrapolation = (1 - ramp).astype(np.float64)
    pos_freqs = base ** (np.arange(0, dim, 2, dtype=np.float64) / dim)
    inv_extra = 1.0 / pos_freqs
    inv_inter = 1.0 / (factor * pos_freqs)
    inv = inv_inter * (1 - extrapolation) + inv_extra * extrapolation
    return np.ascontiguousarray(inv_extra / inv, dtype=np.float64)


def _expert(
    stack: QTensor, index: int, rows: int, name: str, per_expert: int = 0, offset: int = 0
) -> QTensor:
    """Expert `index` of a stacked (n_expert, per_expert, cols) weight as a zero-copy 2-D
    QTensor: its `rows` rows from `offset` (per_expert 0 = rows, a plain stack)."""
    first = index * (per_expert or rows) + offset
    data = stack.data.reshape(stack.rows, -1)[first : first + rows]
    return QTensor(name, stack.qtype, (rows, stack.cols), data)


def _bias_rows(stack: QTensor, n_expert: int, rows: int) -> np.ndarray:
    """A stacked (n_expert, rows) expert bias as float32, one row per expert."""
    values = _vector(stack)
    if values.size != n_expert * rows:
        raise ModelFileError(
            f"tensor '{stack.name}' holds {values.size} values, expected {n_expert} x {rows}"
        )
    return values.reshape(n_expert, rows)


def _q_gain_row(cfg: ModelConfig, gain: float) -> np.ndarray:
    """(q_dim,) float32: `gain` on the first rope_dims dims of every head, 1.0 elsewhere."""
    row = np.ones((cfg.n_head, cfg.head_dim), np.float32)
    row[:, : cfg.rope_dims] = np.float32(gain)
    return row.reshape(-1)


def _rows(t: QTensor, start: int, stop: int, name: str) -> QTensor:
    """Rows start..stop of a 2-D weight as a zero-copy QTensor (rows are whole blocks)."""
    return QTensor(name, t.qtype, (stop - start, t.cols), t.data[start:stop])


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
