"""The recorded decode plan (engine/models/decode_plan.py) against the op-by-op loop it was
recorded from, for every architecture and both KV cache types (issue 32).

The claim is bit equality: every step runs its kernel with the arguments and chunking of the op
it stands for, on the same activation rows, and every fallback runs the op itself, so nothing
changes the summation order. Each scenario prefills a prompt (the loop, T > 1), decodes one
token at a time, then continues from a copy of the cache cut back to an earlier position (what
a prefix-cache hit hands the generator: another cache object, another position), 64 decoded
tokens in all, past the sliding window of the windowed architectures. Logits and every stored
K/V byte must match the same run with LOCALCHAT_DECODE_STEPS=0.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from gguf import GGMLQuantizationType as Q
from tiny_models import ARCHS, write_tiny_model

from engine.config import ModelConfig
from engine.gguf import open_gguf
from engine.kernels.jit_backend import JitBackend
from engine.models import build_model
from engine.models.decode_plan import DECODE_STEPS_ENV, DecodePlan
from engine.types import KvCacheType

FIXTURES = Path(__file__).parent / "fixtures"
# Shapes of real models' heads (head_dim 64: the attention and q8_0 kernels' multiples)
SHAPES = dict(d_model=256, n_heads=4, n_kv_heads=2, head_dim=64, d_ff=512, tokenizer=None)
WINDOW = 16  # the windowed architectures' sliding window: the 64 tokens pass it four times
WINDOWED = ("gemma2", "gemma3", "gpt-oss")
PROMPT, FIRST, CUT = 8, 24, 20  # prefill 8, decode 24, restart from a copy cut back to 20
TOTAL = 64  # decoded tokens: FIRST before the cut, TOTAL - FIRST after it


def _scenario(path: Path, cache_type: KvCacheType, backend, steps: bool, monkeypatch):
    """(logits of every decoded token, K/V bytes of both caches, the plan or None)."""
    monkeypatch.setenv(DECODE_STEPS_ENV, "1" if steps else "0")
    gguf_file = open_gguf(path)
    model = build_model(gguf_file, ModelConfig.from_gguf(gguf_file), backend)
    model.cache_type = cache_type
    rng = np.random.default_rng(7)
    ids = rng.integers(0, model.config.n_vocab, PROMPT + TOTAL + 1).tolist()
    cache = model.new_cache(PROMPT + TOTAL + 8)
    model.forward(ids[:PROMPT], cache)
    logits = [model.forward([t], cache) for t in ids[PROMPT : PROMPT + FIRST]]
    hit = cache.clone()  # the prefix cache's copy, cut back: a new cache at an earlier position
    hit.truncate(CUT)
    logits += [model.forward([t], hit) for t in ids[CUT : CUT + TOTAL - FIRST]]
    rows = [(c.k[:, : c.n_tokens].copy(), c.v[:, : c.n_tokens].copy()) for c in (cache, hit)]
    plan = model._plans.get(cache_type) or None
    return np.stack(logits), rows, plan


def _assert_same(path: Path, cache_type: KvCacheType, backend, monkeypatch) -> DecodePlan:
    logits, rows, plan = _scenario(path, cache_type, backend, True, monkeypatch)
    ref_logits, ref_rows, ref_plan = _scenario(path, cache_type, backend, False, monkeypatch)
    assert isinstance(plan, DecodePlan) and ref_plan is None
    assert logits.shape[0] == TOTAL
    assert np.isfinite(ref_logits).all() and ref_logits.std() > 0
    for (k, v), (ref_k, ref_v) in zip(rows, ref_rows, strict=True):
        np.testing.assert_array_equal(k.view(np.uint8), ref_k.view(np.uint8))
        np.testing.assert_array_equal(v.view(np.uint8), ref_v.view(np.uint8))
    np.testing.assert_array_equal(logits, ref_logits)
    return plan


@pytest.fixture(scope="module")
def backend():
    backend = JitBackend(2)  # two threads: the steps' chunking is part of what must match
    yield backend
    backend.close()


@pytest.mark.parametrize("cache_type", [KvCacheType.F16, KvCacheType.Q8_0])
@pytest.mark.parametrize("arch", ARCHS)
def test_every_architecture_decodes_through_the_steps_with_the_loops_bits(
    tmp_path, monkeypatch, backend, arch, cache_type
):
    window = dict(sliding_window=WINDOW) if arch in WINDOWED else {}
    path = write_tiny_model(tmp_path / "m.gguf", arch, Q.Q8_0, seed=5, **SHAPES, **window)
    plan = _assert_same(path, cache_type, backend, monkeypatch)
    assert plan.path == "steps", f"fell back to the loop for {plan.fallbacks}"


# The oracle checkpoints (tools/tiny_hf_models.py): their LongRoPE (phi3, phi4_mini: the long
# table past 16 positions), YaRN, Llama 3.1 factors, Phi-4-mini's partial RoPE gain and
# Ministral 3's per-position temperature are not in the writer above. Their heads are 8 wide,
# below the attention kernel's multiple of 16, so the loop itself runs attention in numpy there
# and the plan records just that op as a fallback (tiny_gemma3's single KV head is 8 values, so
# its row store too); q8_0 caches need head_dim % 32, so these run with f16 caches only.
ORACLE = sorted(p.stem for p in FIXTURES.glob("tiny_*.gguf"))
ORACLE_FALLBACKS = {"attention", "kv_store_f16"}


@pytest.mark.parametrize("name", ORACLE)
def test_every_oracle_checkpoint_decodes_through_the_plan_with_the_loops_bits(
    monkeypatch, backend, name
):
    plan = _assert_same(FIXTURES / f"{name}.gguf", KvCacheType.F16, backend, monkeypatch)
    assert set(plan.fallbacks) <= ORACLE_FALLBACKS, plan.fallbacks


def test_decode_path_names_the_ops_that_fell_back(tmp_path, backend, monkeypatch):
    path = write_tiny_model(tmp_path / "m.gguf", "qwen3moe", Q.Q8_0, seed=5, **SHAPES)
    gguf_file = open_gguf(path)
    model = build_model(gguf_file, ModelConfig.from_gguf(gguf_file), backend)
    assert model.decode_path(KvCacheType.Q8_0) == ("steps", [])
    # a step that refuses its arrays: that op alone runs as itself, and is named
    monkeypatch.setattr(backend, "step_rmsnorm", _refuse)
    fresh = build_model(gguf_file, ModelConfig.from_gguf(gguf_file), backend)
    assert fresh.decode_path(KvCacheType.F16) == ("mixed", ["rmsnorm"])
    monkeypatch.setenv(DECODE_STEPS_ENV, "0")
    other = build_model(gguf_file, ModelConfig.from_gguf(gguf_file), backend)
    assert other.decode_path(KvCacheType.F16) == ("ops", [])


def _refuse(*args, **kwargs):
    raise ValueError("no step form")


def test_a_refused_step_falls_back_for_that_op_with_the_same_bits(tmp_path, backend, monkeypatch):
    path = write_tiny_model(tmp_path / "m.gguf", "gemma3", Q.Q8_0, seed=5, **SHAPES)
    monkeypatch.setattr(backend, "step_attention", _refuse)
    plan = _assert_same(path, KvCacheType.Q8_0, backend, monkeypatch)
    assert plan.path == "mixed" and set(plan.fallbacks) == {"attention"}


@pytest.mark.parametrize("head_dim", [32, 64, 128])
def test_the_q8_0_row_store_step_quantizes_like_kv_quant(backend, head_dim):
    # ggml's quantize_row_q8_0_ref in numpy (engine/kv_quant.py) is the independent side
    from engine.kv_quant import quantize_q8_0

    rng = np.random.default_rng(head_dim)
    rows = 3 * head_dim  # three KV heads of one position
    cases = [
        rng.standard_normal(rows).astype(np.float32) * 3,
        np.zeros(rows, np.float32),  # d = 0: every q 0, no division by zero
        # amax 127, so d = 1 and x / d lands on exact .5 ties (away from zero), signed zeros
        np.tile(np.float32([127, -63.5, 0.5, -0.5, 2.5, -0.0, 1e-30, 3.5]), rows // 8),
        # d past float16's range (infinity), and float16 subnormal scales
        np.tile(np.float32([1e9, -3e8, 1.0, 0.0, 1e-5, -2e-6, 3e-7, 0.25]), rows // 8),
        (rng.standard_normal(rows) * 1e-6).astype(np.float32),
    ]
    position = np.zeros(1, np.int64)
    for src in cases:
        src = np.ascontiguousarray(src)
        cache = np.zeros((4, rows // 32 * 34), np.uint8)
        step = backend.step_kv_store(src, position, "q8_0")
        step.args[1] = cache.ctypes.data  # KvStoreQ8Slots.DST
        position[0] = 2
        backend.run_steps(backend.step_list([step]), 1)
        with np.errstate(over="ignore"):  # numpy warns where the scale overflows float16
            expected = quantize_q8_0(src.reshape(3, head_dim)).reshape(-1)
        np.testing.assert_array_equal(cache[2], expected)
        assert not cache[[0, 1, 3]].any()  # only the row at the position


@pytest.mark.parametrize(
    ("env", "cache_type", "expected"),
    [("1", "f16", "steps"), ("1", "q8_0", "steps"), ("0", "f16", "ops")],
)
def test_bench_json_reports_the_decode_path(
    tmp_path, capsys, monkeypatch, env, cache_type, expected
):
    from engine.__main__ import main

    monkeypatch.setenv(DECODE_STEPS_ENV, env)
    path = write_tiny_model(tmp_path / "g.gguf", "gemma3", Q.Q8_0, head_dim=32)
    argv = ["bench", str(path), "-p", "4", "-n", "3", "-r", "1", "-t", "2", "--skip-cold"]
    assert main([*argv, "--cache-type", cache_type, "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["decode_path"] == expected
    assert report["decode_fallbacks"] == [] and report["decode_routed"] == []


class _CancelAfter:
    """A cancel token that reads as set from its `after`-th look on (counting every look)."""

    def __init__(self, after: int):
        self.after, self.looks = after, 0

    @property
    def cancelled(self) -> bool:
        self.looks += 1
        return self.looks >= self.after


def test_stop_lands_between_layers_of_a_planned_decode(tmp_path, backend):
    from engine.cancel import ForwardCancelled

    path = write_tiny_model(tmp_path / "m.gguf", "gemma3", Q.Q8_0, seed=5, **SHAPES)
    gguf_file = open_gguf(path)
    model = build_model(gguf_file, ModelConfig.from_gguf(gguf_file), backend)
    cache = model.new_cache(16)
    model.forward([1, 2, 3], cache)
    never = _CancelAfter(10**9)
    model.forward([4], cache, cancel=never)
    assert model._plans[model.cache_type].path == "steps"
    assert never.looks >= model.config.n_layers  # looked at before every layer
    stop = _CancelAfter(3)  # set while the third layer is due
    with pytest.raises(ForwardCancelled):
        model.forward([5], cache, cancel=stop)
    assert cache.n_tokens == 4 and cache.tokens == [1, 2, 3, 4]  # the token was not committed


def test_an_op_the_recorder_does_not_know_is_recorded_as_itself(tmp_path, backend, monkeypatch):
    # a backend op with no recording rule (here rmsnorm, its rule removed) still records: as a
    # callable running that op alone on the same arrays, so the bits stay the loop's
    from engine.models.decode_plan import RecordingOps

    monkeypatch.delattr(RecordingOps, "rmsnorm")
    path = write_tiny_model(tmp_path / "m.gguf", "olmo2", Q.Q8_0, seed=5, **SHAPES)
    plan = _assert_same(path, KvCacheType.F16, backend, monkeypatch)
    assert plan.path == "mixed" and set(plan.fallbacks) == {"rmsnorm"}


@pytest.mark.parametrize("source", ["qwen3moe", "tiny_mistral3"])
def test_a_model_with_a_recorded_plan_is_freed_without_a_gc_pass(tmp_path, backend, source):
    # the plan's callables (MoE routing, the per-position temperature) must not hold the model
    # that holds the plan: an unloaded model's buffers go when its last reference does
    import gc
    import weakref

    if source.startswith("tiny_"):
        path = FIXTURES / f"{source}.gguf"
    else:
        path = write_tiny_model(tmp_path / "m.gguf", source, Q.Q8_0, seed=5, **SHAPES)
    gc.collect()
    gc.disable()
    try:
        gguf_file = open_gguf(path)
        model = build_model(gguf_file, ModelConfig.from_gguf(gguf_file), backend)
        cache = model.new_cache(8)
        model.forward([1], cache)
        model.forward([2], cache)
        assert model._plans[model.cache_type]
        ref = weakref.ref(model)
        del model, cache, gguf_file
        assert ref() is None
    finally:
        gc.enable()
