"""Batched decode as native step lists: N sequences, one new token each, one call per layer.

A batched decode step (engine/batching: N streams, each adding one token) went through the
op-by-op layer loop of TransformerModel._forward_chunk: ~10 op calls per layer for the shared
mat-muls, plus a K/V write and an attention call per sequence per layer, each with its Python
argument checks and its own pool hand-off. On SmolLM2 at 8 streams that Python and hand-off
work was most of the step (bench/RESULTS.md, issue 32), while a single stream's decode already
ran as one native step list per layer (engine/models/decode_plan.py). This is the same idea for
N rows: per layer one table of the JIT backend's steps (JitBackend.step_*):

    rmsnorm(N rows) -> quantize -> q/k/v job (N rows) -> per-row bias adds -> per-head q/k
    norms -> RoPE(N positions) -> per sequence: K/V store at its position, attention against
    its own cache -> quantize -> output projection (-> per-row bias, post-attention norm)
    -> residual add -> rmsnorm -> quantize -> gate/up job -> gated activation -> quantize
    -> ffn_down (-> post-FFN norm) -> residual add

Float16 KV caches only (the q8_0 row store has no step form); a step with a prefill slice or a
speculative draft (a segment of several tokens) runs the layer loop.

Every step runs its kernel with the arguments and chunking of the op it replaces on the same
_RunState rows, so each row is bit-identical to the op-by-op loop's, and hence (as that loop's
rows are, tests/test_batching_exact.py) to the same sequence decoded alone.

One plan per row count N (built on first use, a few kB of argument blocks per layer); each
sequence slot is aimed at its cache's layer arrays only when a different cache takes the slot,
so a steady batch pays one vectorised write of the positions per step.
"""

from __future__ import annotations

import weakref
from typing import TYPE_CHECKING, Literal

import numpy as np

from engine.cancel import ForwardCancelled
from engine.kernels.attention import AttentionSlots
from engine.kernels.elementwise import KvStoreSlots
from engine.kv_cache import KVCache
from engine.models.decode_plan import DECODE_STEPS_ENV, steps_enabled
from engine.types import KvCacheType

if TYPE_CHECKING:  # the model calls in here; only the types are needed
    from engine.models.transformer import TransformerModel, _SegmentRuns

__all__ = ["DECODE_STEPS_ENV", "BatchDecodePlan", "decode_batch", "supported"]

# per model, per row count: its plan, or False where the model or backend has none
_plans: weakref.WeakKeyDictionary[TransformerModel, dict[int, BatchDecodePlan | Literal[False]]]
_plans = weakref.WeakKeyDictionary()


def decode_batch(
    model: TransformerModel, runs: _SegmentRuns, ids: np.ndarray, cancel
) -> list[np.ndarray] | None:
    """One token for each of the runs (2 or more, one token each, float16 caches) through the
    batched step lists, then their logits: per run (len(run.logit_rows), n_vocab). None where
    there is no plan for this model and row count; the caller then runs the op-by-op loop."""
    n = len(runs)
    if n < 2 or ids.size != n or any(r.cache.cache_type is not KvCacheType.F16 for r in runs):
        return None
    per_model = _plans.setdefault(model, {})
    plan = per_model.get(n)
    if plan is None:
        plan = (supported(model) and BatchDecodePlan.build(model, n)) or False
        per_model[n] = plan
    if plan is False:
        return None
    plan.run(model, ids, [r.cache for r in runs], runs.positions, cancel)
    for r in runs:
        r.cache.commit(r.ids)
    # one output projection for every sequence's rows, as the loop takes them
    wanted = runs.logit_rows()
    logits = model._logits(plan.x, np.concatenate(wanted))
    bounds = np.cumsum([0] + [rows.size for rows in wanted])
    return [logits[a:b] for a, b in zip(bounds[:-1], bounds[1:], strict=True)]


def supported(model: TransformerModel) -> bool:
    """True where every op of the layer loop has a step form that these plans build: pre-norms
    (with or without per-head q/k norms and sandwich norms: Qwen3, Gemma 2 and 3), biases, a
    dense SwiGLU/GeGLU FFN, no residual, attention or RoPE multipliers, one RoPE table, a
    backend with native steps and no key splits."""
    cfg, ops = model.config, model.backend
    if not steps_enabled():  # LOCALCHAT_DECODE_STEPS=0: every decode op by op
        return False
    if not hasattr(ops, "step_linear") or getattr(ops, "split_keys", False):
        return False
    if (
        not cfg.pre_norms
        or cfg.qk_norm_full  # OLMo 2 (it has no pre-norms either)
        or cfg.n_expert
        or cfg.residual_scale != 1.0
        or cfg.attn_temp_scale > 0.0
        or cfg.activation == "swiglu_oai"  # its clamps have no step form
        or model._rope_factors_long is not None
        or cfg.head_dim % 16
        or cfg.n_head % cfg.n_kv_head
        or (cfg.rope_dims and cfg.rope_dims % 2)
    ):
        return False
    return not any(la.q_gain != 1.0 for la in model._layer_attention)


class BatchDecodePlan:
    """The step tables of a decode of exactly `rows` sequences, one token each."""

    def __init__(self, rows: int) -> None:
        self.rows = rows
        self.x = np.zeros((rows, 1), np.float32)  # the residual rows (the model's _RunState)
        # one int64 position per sequence, read by the RoPE and K/V store steps when they run
        self.positions = np.zeros(rows, np.int64)
        # (layer, sequence, AttentionSlots.SIZE): one attention block per layer per sequence, so
        # a step sets every P0 with one write
        self.attention_args = np.zeros((0, rows, AttentionSlots.SIZE), np.int64)
        self.kv_args: list[list[tuple[np.ndarray, np.ndarray]]] = []  # [layer][seq] (k, v)
        self.tables: list[tuple[np.ndarray, int]] = []
        self._steps: list = []  # every Step, kept alive with the tables that point at them
        self._caches: list[weakref.ref[KVCache] | None] = [None] * rows

    @classmethod
    def build(cls, model: TransformerModel, rows: int) -> BatchDecodePlan | None:
        """The plan, or None where a step refuses its arrays (the caller keeps the op loop).
        The caller checks the architecture first: it must be one the single-token plan
        (`_DecodePlan`) accepts, which needs exactly these steps."""
        try:
            return cls._build(model, rows)
        except ValueError:
            return None

    @classmethod
    def _build(cls, model: TransformerModel, n: int) -> BatchDecodePlan | None:
        cfg, ops, st = model.config, model.backend, model._state
        plan = cls(n)
        x, h, proj, att = st.x[:n], st.h[:n], st.proj[:n], st.att[:n]
        q, k, v, gate, up = st.q[:n], st.k[:n], st.v[:n], st.gate[:n], st.up[:n]
        plan.x = x
        q_heads = q.reshape(n, cfg.n_head, cfg.head_dim)
        k_heads = k.reshape(n, cfg.n_kv_head, cfg.head_dim)
        quant_h, bufs_h = ops.step_quantize(h)
        quant_att, bufs_att = ops.step_quantize(att)
        quant_gate, bufs_gate = ops.step_quantize(gate)
        glu = "geglu" if cfg.activation == "gelu_tanh" else "swiglu"
        # each sequence's rows and position as views made once: the steps hold their addresses
        position_of = [plan.positions[i : i + 1] for i in range(n)]
        attention_blocks = []
        for layer, la in zip(model.layers, model._layer_attention, strict=True):
            assert layer.attn_norm is not None and layer.ffn_norm is not None
            qkv = ops.step_linear((layer.attn_q, layer.attn_k, layer.attn_v), bufs_h, (q, k, v))
            out_proj = ops.step_linear((layer.attn_output,), bufs_att, (proj,))
            gate_up = ops.step_linear((layer.ffn_gate, layer.ffn_up), bufs_h, (gate, up))
            down = ops.step_linear((layer.ffn_down,), bufs_gate, (proj,))
            if qkv is None or out_proj is None or gate_up is None or down is None:
                return None
            steps = [ops.step_rmsnorm(x, layer.attn_norm, cfg.norm_eps, h), quant_h, qkv]
            for all_rows, bias in (
                (q, layer.attn_q_bias),
                (k, layer.attn_k_bias),
                (v, layer.attn_v_bias),
            ):
                if bias is not None:  # the loop's add of one bias row, row by row
                    steps += cls._bias_rows(ops, all_rows, bias)
            if layer.attn_q_norm is not None:  # per head, over (n * heads, head_dim) rows
                q_rows = q.reshape(n * cfg.n_head, cfg.head_dim)
                k_rows = k.reshape(n * cfg.n_kv_head, cfg.head_dim)
                steps.append(ops.step_rmsnorm(q_rows, layer.attn_q_norm, cfg.norm_eps, q_rows))
                steps.append(ops.step_rmsnorm(k_rows, layer.attn_k_norm, cfg.norm_eps, k_rows))
            if la.rope:
                rope_args: dict = dict(theta=la.theta, neox=cfg.rope_neox, freq_scale=la.freq_scale)
                if cfg.rope_dims:
                    rope_args["n_rot"] = cfg.rope_dims
                if la.scaled and model._rope_factors is not None:
                    rope_args["freq_factors"] = model._rope_factors
                steps.append(ops.step_rope(q_heads, plan.positions, **rope_args))
                steps.append(ops.step_rope(k_heads, plan.positions, **rope_args))
            layer_kv, layer_attention = [], []
            for i in range(n):
                k_store = ops.step_kv_store(k[i : i + 1], position_of[i])
                v_store = ops.step_kv_store(v[i : i + 1], position_of[i])
                attend = ops.step_attention(
                    q_heads[i : i + 1],
                    att[i : i + 1],
                    cfg.n_kv_head,
                    scale=la.scale,
                    window=la.window,
                    softcap=cfg.attn_logit_softcap,
                    sinks=layer.attn_sinks,
                )
                layer_kv.append((k_store.args, v_store.args))
                layer_attention.append(attend)
                steps += [k_store, v_store, attend]
            plan.kv_args.append(layer_kv)
            attention_blocks.append(layer_attention)
            steps += [quant_att, out_proj]
            if layer.attn_output_bias is not None:
                steps += cls._bias_rows(ops, proj, layer.attn_output_bias)
            if layer.post_attention_norm is not None:
                steps.append(ops.step_rmsnorm(proj, layer.post_attention_norm, cfg.norm_eps, proj))
            steps += [ops.step_add(x, proj, x)]
            steps += [ops.step_rmsnorm(x, layer.ffn_norm, cfg.norm_eps, h), quant_h, gate_up]
            steps += [ops.step_glu(glu, gate, up, gate), quant_gate, down]
            if layer.post_ffw_norm is not None:
                steps.append(ops.step_rmsnorm(proj, layer.post_ffw_norm, cfg.norm_eps, proj))
            steps += [ops.step_add(x, proj, x)]
            plan._steps.append(steps)
        # every attention block as a row of one array: a step sets all P0s at once
        plan.attention_args = np.stack(
            [np.stack([a.args for a in blocks]) for blocks in attention_blocks]
        )
        for li, (steps, blocks) in enumerate(zip(plan._steps, attention_blocks, strict=True)):
            for i, attend in enumerate(blocks):
                j = next(j for j, s in enumerate(steps) if s is attend)
                row = plan.attention_args[li, i]
                steps[j] = type(attend)(attend.fn, row, attend.chunks, attend.keep)
            plan.tables.append((ops.step_list(steps), len(steps)))
        return plan

    @staticmethod
    def _bias_rows(ops, rows: np.ndarray, bias: np.ndarray) -> list:
        """rows[i] += bias for every row, one add step each (a step adds equal-sized arrays)."""
        return [ops.step_add(rows[i : i + 1], bias, rows[i : i + 1]) for i in range(rows.shape[0])]

    def run(self, model: TransformerModel, ids: np.ndarray, caches: list[KVCache], p0s, cancel):
        """Decode ids[i] into caches[i] at position p0s[i] for every sequence; the rows' final
        hidden states are left in self.x (the caller commits the caches and takes the logits)."""
        cfg, ops = model.config, model.backend
        ops.embedding(model.token_embd, ids, out=self.x)
        if cfg.embed_scale != 1.0:
            self.x *= np.float32(cfg.embed_scale)
        self.positions[:] = p0s
        self.attention_args[:, :, AttentionSlots.P0] = self.positions
        for i, cache in enumerate(caches):
            self._point_at(i, cache)
        for table, count in self.tables:
            if cancel is not None and cancel.cancelled:
                raise ForwardCancelled()
            ops.run_steps(table, count)

    def _point_at(self, i: int, cache: KVCache) -> None:
        """Aim sequence slot i's K/V stores and attention at this cache's layers (only when a
        different cache takes the slot)."""
        held = self._caches[i]
        if held is not None and held() is cache:
            return
        s = AttentionSlots
        for li, layer_kv in enumerate(self.kv_args):
            k_layer, v_layer = cache.layer(li)
            k_args, v_args = layer_kv[i]
            k_args[KvStoreSlots.DST] = k_layer.ctypes.data
            v_args[KvStoreSlots.DST] = v_layer.ctypes.data
            self.attention_args[li, i, s.K_CACHE] = k_layer.ctypes.data
            self.attention_args[li, i, s.V_CACHE] = v_layer.ctypes.data
        self._caches[i] = weakref.ref(cache)
