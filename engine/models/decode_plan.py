"""The one-token decode as native step lists, captured by recording the layer loop once.

The layer is described once, in TransformerModel._run_layers (the op-by-op loop prefill and
batched decode run). A decode plan is that loop run one time with `RecordingOps` in place of the
backend: each op the JIT backend can express as a native step (JitBackend.step_*: rmsnorm, the
activation quantization and mat-vec jobs, bias and residual adds, RoPE with any frequency table,
the float16 K/V row store, attention over a float16 or q8_0 cache with windows, soft-caps and
sinks, the gated activations) is appended as that step instead of being run; an op with no step
form (a weight type with no quantized kernel, a scale, the q8_0 row store, MoE routing) is
recorded as a Python callable that runs that op alone, and its name is kept in
`DecodePlan.fallbacks`. Consecutive steps form one table, run by one call from Python, so a layer
without fallbacks is one call instead of ~15 op calls with their argument checks.

Every step runs its kernel with the arguments and chunking the op would use on the same
_RunState rows, and every fallback runs the op itself, so the plan's logits and K/V rows are the
loop's bit for bit (tests/test_decode_plan_all_archs.py). What changes per token (the position,
the cache's layer addresses, LongRoPE's table choice) is patched into the steps' argument blocks
before each run (`DecodePlan.run`).
"""

from __future__ import annotations

import os
import weakref
from collections.abc import Callable
from typing import Any

import numpy as np

from engine.kernels.attention import AttentionSlots
from engine.kernels.elementwise import KvStoreSlots, RopeSlots
from engine.kv_cache import KVCache
from engine.types import KvCacheType

DECODE_STEPS_ENV = "LOCALCHAT_DECODE_STEPS"  # "0": decode op by op (side-by-side checks)


def steps_enabled() -> bool:
    return os.environ.get(DECODE_STEPS_ENV, "1").strip() != "0"


class LoopOps:
    """The backend as the layer loop sees it: every backend op passes through, plus the few
    numpy operations of the layer (adds, scales, the cache write, a whole-op fallback) as named
    ops, so that a recording run sees them too."""

    def __init__(self, backend: Any):
        self.backend = backend

    def __getattr__(self, name: str) -> Any:
        return getattr(self.backend, name)

    @staticmethod
    def add(a: np.ndarray, b: np.ndarray, out: np.ndarray) -> None:
        np.add(a, b, out=out)

    @staticmethod
    def scale(a: np.ndarray, factor: float) -> None:
        a *= np.float32(factor)

    @staticmethod
    def mul(a: np.ndarray, factors: np.ndarray) -> None:
        """a *= factors (a row of per-value multipliers, broadcast over a's rows)."""
        np.multiply(a, factors, out=a)

    @staticmethod
    def mul_by_position(a: np.ndarray, positions: np.ndarray, factors_at) -> None:
        """a *= factors_at(positions), (n, 1): a multiplier per row that its position decides."""
        a *= factors_at(positions)

    @staticmethod
    def moe_ffn(model: Any, layer: Any, h: np.ndarray, out: np.ndarray, poll) -> None:
        model._moe_ffn(layer, h, out, poll)

    @staticmethod
    def kv_write(cache: KVCache, layer: int, p0: int, k: np.ndarray, v: np.ndarray) -> None:
        cache.write(layer, p0, k, v)

    @staticmethod
    def layer_start() -> None:
        """Where a layer begins (the loop polls its cancel token there already)."""


class DecodePlan:
    """A recorded one-token decode: items (a step table and its length, or a fallback callable)
    and the per-token argument slots to patch."""

    def __init__(self, backend: Any, cache_type: KvCacheType):
        self.backend = backend
        self.cache_type = cache_type
        self.position = np.zeros(1, np.int64)  # what every step and fallback reads
        self.items: list[tuple[np.ndarray, int] | Callable[[], None]] = []
        self.fallbacks: list[str] = []  # the op names recorded as callables, in order
        # Control flow run in Python between step tables (MoE routing: which experts' tables
        # run): not an op, so not a fallback; `bench --json` lists it as decode_routed.
        self.routed: list[str] = []
        self.per_token: list[Callable[[int], None]] = []  # position-dependent factor rows
        self.attention_args: list[np.ndarray] = []  # P0 patched per token
        self.cache_slots: list[tuple[np.ndarray, int, int, int]] = []  # (args, slot, layer, k0/v1)
        # LongRoPE: (args, short inv_freq address, long inv_freq address)
        self.rope_switch: list[tuple[np.ndarray, int, int]] = []
        self.long_after = 0  # positions past this use the long table
        self.keep: list[Any] = []  # steps and tables the argument blocks point at
        self.cache: KVCache | None = None  # the cache of the current token (fallbacks read it)
        self._cache_ref: weakref.ref[KVCache] | None = None
        self._long: bool | None = None

    @property
    def path(self) -> str:
        return "mixed" if self.fallbacks else "steps"

    def run(self, cache: KVCache, p0: int, cancel) -> None:
        """The layers of one token at position p0 into `cache` (its row is not committed)."""
        from engine.cancel import ForwardCancelled

        self.position[0] = p0
        for a in self.attention_args:
            a[AttentionSlots.P0] = p0
        self._point_at(cache)
        for hook in self.per_token:
            hook(p0)
        if self.rope_switch:
            long = p0 + 1 > self.long_after
            if long != self._long:
                for a, short_ptr, long_ptr in self.rope_switch:
                    a[RopeSlots.INV_FREQ] = long_ptr if long else short_ptr
                self._long = long
        run_steps = self.backend.run_steps
        try:
            for item in self.items:
                if cancel is not None and cancel.cancelled:
                    raise ForwardCancelled()
                if callable(item):
                    item()
                else:
                    run_steps(*item)
        finally:
            self.cache = None

    def run_items(self, items: list) -> None:
        """Run a sub-list of items (one MoE expert's) in order."""
        for item in items:
            if callable(item):
                item()
            else:
                self.backend.run_steps(*item)

    def _point_at(self, cache: KVCache) -> None:
        self.cache = cache
        if self._cache_ref is not None and self._cache_ref() is cache:
            return
        for args, slot, layer, which in self.cache_slots:
            args[slot] = cache.layer(layer)[which].ctypes.data
        self._cache_ref = weakref.ref(cache)


class RecordingOps:
    """Stands in for LoopOps during the one recording run of the layer loop (one token)."""

    def __init__(self, plan: DecodePlan, cache: KVCache, positions: np.ndarray, model: Any):
        self.plan = plan
        self.backend = plan.backend
        # the recording's own one-row cache: its layer arrays tell attention which layer it is
        self._layer_of = {id(cache.layer(i)[0]): i for i in range(model.config.n_layers)}
        self._positions = positions  # the loop's positions array: stands for plan.position
        # The model holds its plans: what the plan's callables keep of it is a weak proxy, so
        # no reference cycle keeps an unloaded model's buffers alive until a gc pass.
        self._model = weakref.proxy(model)
        self._steps: list[Any] = []
        self.items = plan.items  # where finished tables and fallbacks go
        self._quantized: dict[tuple[int, tuple[int, ...]], tuple[Any, Any]] = {}

    def _child(self) -> RecordingOps:
        """A recorder into a list of its own (one MoE expert's items), sharing the rest."""
        child = object.__new__(RecordingOps)
        child.__dict__.update(self.__dict__)
        child._steps, child.items = [], []
        return child

    # --- recording helpers ---------------------------------------------------------------
    def _step(self, step: Any) -> None:
        self._steps.append(step)

    def _flush(self) -> None:
        if self._steps:
            table = self.backend.step_list(self._steps)
            self.items.append((table, len(self._steps)))
            self.plan.keep.append((table, self._steps))
            self._steps = []

    def _fallback(self, name: str, fn: Callable[[], None]) -> None:
        self._flush()
        self.items.append(fn)
        self.plan.fallbacks.append(name)

    def finish(self) -> DecodePlan:
        self._flush()
        return self.plan

    def _pos(self, arr: Any) -> Any:
        return self.plan.position if arr is self._positions else arr

    def __getattr__(self, name: str) -> Any:
        # A backend op with no step form: run that op alone, as the loop would.
        op = getattr(self.backend, name)

        def record(*args: Any, **kwargs: Any) -> Any:
            args = tuple(self._pos(a) for a in args)
            kwargs = {key: self._pos(a) for key, a in kwargs.items()}
            self._fallback(name, lambda: op(*args, **kwargs))
            return kwargs.get("out", args[0] if args else None)

        return record

    # --- the ops the loop uses ------------------------------------------------------------
    def rmsnorm(self, x: np.ndarray, weight: np.ndarray, eps: float, out: np.ndarray) -> Any:
        try:
            self._step(self.backend.step_rmsnorm(x, weight, eps, out))
        except ValueError:
            self._fallback("rmsnorm", lambda: self.backend.rmsnorm(x, weight, eps, out))
        return out

    def _linear(self, weights: tuple, x: np.ndarray, outs: tuple) -> None:
        key = (x.ctypes.data, x.shape)
        quant = self._quantized.get(key)
        if quant is None:
            try:
                quant = self.backend.step_quantize(x)
            except ValueError:
                quant = (None, None)
            self._quantized[key] = quant
        step = None
        if quant[0] is not None:
            step = self.backend.step_linear(weights, quant[1], outs)
        if step is None:  # float weights (an F32 MoE router): their own kernel, one per weight
            floats = [
                self.backend.step_linear_float(w, x, out)
                for w, out in zip(weights, outs, strict=True)
            ]
            if all(s is not None for s in floats):
                for s in floats:
                    self._step(s)
                return
            backend = self.backend
            if len(weights) == 1:
                self._fallback("linear", lambda: backend.linear(weights[0], x, out=outs[0]))
            else:
                self._fallback("linear_many", lambda: backend.linear_many(weights, x, outs))
            return
        self._step(quant[0])
        self._step(step)

    def linear(self, w: Any, x: np.ndarray, out: np.ndarray) -> np.ndarray:
        self._linear((w,), x, (out,))
        return out

    def linear_many(self, weights, x: np.ndarray, outs) -> list[np.ndarray]:
        self._linear(tuple(weights), x, tuple(outs))
        return list(outs)

    def add(self, a: np.ndarray, b: np.ndarray, out: np.ndarray) -> None:
        try:
            self._step(self.backend.step_add(a, b, out))
        except ValueError:
            self._fallback("add", lambda: np.add(a, b, out=out))

    def scale(self, a: np.ndarray, factor: float) -> None:
        # a row of the factor: the same IEEE product per value as numpy's `a *= factor`
        self.mul(a, np.full(a.size, factor, np.float32), name="scale")

    def mul(self, a: np.ndarray, factors: np.ndarray, name: str = "mul") -> None:
        try:
            self._step(self.backend.step_mul(a, factors, a))
        except ValueError:
            self._fallback(name, lambda: np.multiply(a, factors, out=a))
            return
        self.plan.keep.append(factors)

    def mul_by_position(self, a: np.ndarray, positions: np.ndarray, factors_at) -> None:
        row = np.zeros(a.size, np.float32)  # refilled for each token's position
        method = weakref.WeakMethod(factors_at)  # a bound method of the model (see __init__)

        def refill(p0: int) -> None:
            fn = method()
            assert fn is not None, "the model of this plan is gone"
            row[:] = fn(np.array([p0], np.int64))[0, 0]

        self.plan.per_token.append(refill)
        self.mul(a, row, name="mul_by_position")

    def moe_ffn(self, model: Any, layer: Any, h: np.ndarray, out: np.ndarray, poll) -> None:
        """The router's mat-vec as steps; then, in Python, the routing (which experts) and for
        each chosen expert its own recorded items (its mat-vecs, biases and activation as
        steps) and the weighted sum, in the loop's order (TransformerModel._moe_ffn)."""
        model = self._model  # the weak proxy (see __init__)
        model._moe_router(self, layer, h)
        experts = []
        for expert in range(len(layer.experts)):
            child = self._child()
            model._moe_expert(child, layer, expert, h)
            child._flush()
            experts.append(child.items)
        plan, down = self.plan, model._moe.down1

        def route() -> None:
            chosen, weights = model._moe_route()
            out[...] = 0.0
            for expert, weight in zip(chosen, weights, strict=True):
                plan.run_items(experts[expert])
                np.add(out, np.float32(weight) * down, out=out)

        self._flush()
        self.items.append(route)
        plan.routed.append("moe_routing")
        plan.keep.append(experts)

    def layer_start(self) -> None:
        # one table per layer: DecodePlan.run checks the cancel token between them, so Stop
        # lands within a layer of a big model's token, as in the loop
        self._flush()

    def _glu(self, kind: str, gate, up, out, **params: float) -> np.ndarray:
        try:
            self._step(self.backend.step_glu(kind, gate, up, out, **params))
        except ValueError:
            op = getattr(self.backend, kind)
            self._fallback(kind, lambda: op(gate, up, out=out, **params))
        return out

    def swiglu(self, gate, up, out):
        return self._glu("swiglu", gate, up, out)

    def geglu(self, gate, up, out):
        return self._glu("geglu", gate, up, out)

    def swiglu_oai(self, gate, up, *, alpha: float, limit: float, out):
        return self._glu("swiglu_oai", gate, up, out, alpha=alpha, limit=limit)

    def rope(self, x: np.ndarray, positions: np.ndarray, **args: Any) -> np.ndarray:
        plan, model = self.plan, self._model
        try:
            step = self.backend.step_rope(x, plan.position, **args)
        except ValueError:
            self._fallback("rope", self._rope_fallback(x, args))
            return x
        long = model._rope_factors_long
        if long is not None and args.get("freq_factors") is model._rope_factors:
            # LongRoPE picks its table by the position: the same step with the long table's
            # frequencies swapped in past the original context (the loop's _factors_for).
            long_step = self.backend.step_rope(x, plan.position, **{**args, "freq_factors": long})
            slot = RopeSlots.INV_FREQ
            plan.rope_switch.append((step.args, int(step.args[slot]), int(long_step.args[slot])))
            plan.long_after = model.config.rope_orig_context
            plan.keep.append(long_step)
        self._step(step)
        return x

    def _rope_fallback(self, x: np.ndarray, args: dict) -> Callable[[], None]:
        plan, model = self.plan, self._model

        def run() -> None:
            a = args
            if args.get("freq_factors") is model._rope_factors:
                factors = model._factors_for(int(plan.position[0]) + 1)
                a = {**args, "freq_factors": factors}
            self.backend.rope(x, plan.position, **a)

        return run

    def kv_write(self, cache: KVCache, layer: int, p0: int, k: np.ndarray, v: np.ndarray) -> None:
        plan = self.plan
        if plan.cache_type in (KvCacheType.F16, KvCacheType.Q8_0):
            try:
                kind = plan.cache_type.value
                k_store = self.backend.step_kv_store(k, plan.position, kind)
                v_store = self.backend.step_kv_store(v, plan.position, kind)
            except ValueError:
                pass
            else:
                plan.cache_slots.append((k_store.args, KvStoreSlots.DST, layer, 0))
                plan.cache_slots.append((v_store.args, KvStoreSlots.DST, layer, 1))
                self._step(k_store)
                self._step(v_store)
                return

        def write() -> None:
            assert plan.cache is not None
            plan.cache.write(layer, int(plan.position[0]), k, v)

        self._fallback(f"kv_store_{plan.cache_type.value}", write)

    def attention(self, q, k_cache, v_cache, *, p0: int, out, **kw: Any) -> np.ndarray:
        plan = self.plan
        layer = self._layer_of[id(k_cache)]
        try:
            step = self.backend.step_attention(
                q, out, k_cache.shape[1], cache_type=plan.cache_type.value, **kw
            )
        except ValueError:
            backend = self.backend

            def attend() -> None:
                assert plan.cache is not None
                k_layer, v_layer = plan.cache.layer(layer)
                backend.attention(q, k_layer, v_layer, p0=int(plan.position[0]), out=out, **kw)

            self._fallback("attention", attend)
            return out
        s = AttentionSlots
        plan.attention_args.append(step.args)
        plan.cache_slots.append((step.args, s.K_CACHE, layer, 0))
        plan.cache_slots.append((step.args, s.V_CACHE, layer, 1))
        self._step(step)
        return out


def record(model: Any, cache_type: KvCacheType) -> DecodePlan | None:
    """Record the layer loop of `model` for one token into a cache of `cache_type`; None where
    the backend has no native steps (the numpy reference backend) or LOCALCHAT_DECODE_STEPS=0."""
    backend = model.backend
    if not steps_enabled() or not hasattr(backend, "step_linear"):
        return None
    plan = DecodePlan(backend, cache_type)
    cache = KVCache.for_config(model.config, 1, cache_type)
    from engine.models.transformer import Segment, _SegmentRuns  # (it imports this module)

    runs = _SegmentRuns([Segment(np.zeros(1, np.int64), cache, np.zeros(1, np.int64))])
    recorder = RecordingOps(plan, cache, runs.positions, model)
    model._run_layers(recorder, runs, None)
    return recorder.finish()
