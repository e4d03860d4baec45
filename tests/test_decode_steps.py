"""The one-token decode as native step lists (decode_plan.DecodePlan, JitBackend.step_*).

The claim is bit equality with the op-by-op loop the steps replace (LOCALCHAT_DECODE_STEPS=0):
the same logits and the same float16 K/V rows, token after token, at 1 and 2 threads; and, for
the float16 row store written in integer IR, equality with numpy's float32 -> float16 rounding
(an independent implementation) on every kind of value, on every CPU path.
"""

from __future__ import annotations

import numpy as np
import pytest
from gguf import GGMLQuantizationType as Q
from tiny_models import write_tiny_model

from engine.config import ModelConfig
from engine.gguf import open_gguf
from engine.kernels import elementwise
from engine.kernels.compiler import KernelLibrary
from engine.kernels.elementwise import KvStoreSlots
from engine.kernels.jit_backend import JitBackend
from engine.kernels.threads import ThreadPool, pool_module, step_table
from engine.models import build_model
from engine.models.decode_plan import DECODE_STEPS_ENV, DecodePlan
from tests.cpu_targets import target_or_skip

# K-quant rows are whole 256-value super-blocks; the others take the same shapes
SHAPES = dict(d_model=256, n_heads=4, n_kv_heads=2, head_dim=64, d_ff=512, tokenizer=None)
TOKENS = [5, 17, 3, 200, 41, 9, 77, 1, 128, 64]


def _decode(path, threads: int):
    gguf_file = open_gguf(path)
    backend = JitBackend(threads)
    try:
        model = build_model(gguf_file, ModelConfig.from_gguf(gguf_file), backend)
        cache = model.new_cache(32)
        logits = np.stack([model.forward([t], cache) for t in TOKENS])
        n = cache.n_tokens
        return (
            logits,
            cache.k[:, :n].copy(),
            cache.v[:, :n].copy(),
            model._plans.get(model.cache_type),
        )
    finally:
        backend.close()


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize(
    ("arch", "qtype"),
    [("llama", Q.Q4_0), ("qwen2", Q.Q4_K), ("qwen2", Q.Q6_K), ("smollm3", Q.Q8_0)],
)
def test_step_decode_gives_the_op_by_op_bits(tmp_path, monkeypatch, arch, qtype, threads):
    # qwen2: q/k/v biases (the bias steps); smollm3: layers without RoPE
    path = write_tiny_model(tmp_path / "m.gguf", arch, qtype, seed=3, **SHAPES)
    logits, k, v, plan = _decode(path, threads)
    assert isinstance(plan, DecodePlan) and plan.path == "steps", "the step lists were not used"
    monkeypatch.setenv(DECODE_STEPS_ENV, "0")
    ref_logits, ref_k, ref_v, ref_plan = _decode(path, threads)
    assert ref_plan is False
    assert np.isfinite(ref_logits).all() and ref_logits.std() > 0
    np.testing.assert_array_equal(k.view(np.uint16), ref_k.view(np.uint16))
    np.testing.assert_array_equal(v.view(np.uint16), ref_v.view(np.uint16))
    np.testing.assert_array_equal(logits, ref_logits)


def test_q_k_norms_and_sandwich_norms_take_the_steps_too(tmp_path):
    # gemma3: per-head q/k norms and sandwich norms, once outside the steps (issue 32)
    path = write_tiny_model(tmp_path / "g.gguf", "gemma3", Q.Q8_0, **SHAPES)
    *_, plan = _decode(path, 1)
    assert isinstance(plan, DecodePlan) and plan.path == "steps", plan and plan.fallbacks


def _library_or_skip(cpu, monkeypatch) -> KernelLibrary:
    lib = KernelLibrary(cpu=target_or_skip(cpu, monkeypatch))
    lib.add_modules([pool_module(), ("elementwise", elementwise.module_ir())])
    return lib


@pytest.mark.parametrize("cpu", [None, "haswell", "x86-64-v2"])
def test_the_f16_row_store_rounds_like_numpy(cpu, monkeypatch):
    lib = _library_or_skip(cpu, monkeypatch)
    rng = np.random.default_rng(0)
    half_bits = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16).view(np.float16)
    finite = half_bits[np.isfinite(half_bits)].astype(np.float32)
    # every half value, the midpoints between neighbours (ties go to even), a nudge either
    # side of them, the overflow edge, subnormals, and random floats over the whole range
    below = np.nextafter(finite[:-1], np.float32(-np.inf))
    mids = ((finite[:-1].astype(np.float64) + finite[1:]) / 2).astype(np.float32)
    special = np.array(
        [0.0, -0.0, 65504.0, 65519.99, 65520.0, 65536.0, 1e30, -1e30, np.inf, -np.inf, 2**-25,
         2**-25 * 1.0001, 2**-24, 3 * 2**-26, 1e-30, -1e-30],
        np.float32,
    )  # fmt: skip
    wide = (rng.standard_normal(8192) * np.exp(rng.uniform(-40, 15, 8192))).astype(np.float32)
    values = np.concatenate([finite, mids, np.nextafter(mids, below[: mids.size]), special, wide])
    values = np.concatenate([values, np.zeros(-values.size % 16, np.float32)])
    dst = np.full((3, values.size), 7.0, np.float16)  # row 1 is written, rows 0 and 2 not
    position = np.array([1], np.int64)
    args = np.zeros(KvStoreSlots.SIZE, np.int64)
    args[KvStoreSlots.SRC], args[KvStoreSlots.DST] = values.ctypes.data, dst.ctypes.data
    args[KvStoreSlots.POS], args[KvStoreSlots.COUNT] = position.ctypes.data, values.size
    pool = ThreadPool(lib, 1)
    try:
        pool.run_steps(
            step_table([(lib.address("kv_store_f16"), args.ctypes.data, 0)]).ctypes.data, 1
        )
    finally:
        pool.close()
    with np.errstate(over="ignore"):  # the values past 65504 round to infinity, as intended
        expected = values.astype(np.float16)
    np.testing.assert_array_equal(dst[1].view(np.uint16), expected.view(np.uint16))
    assert (dst[[0, 2]] == 7.0).all()


def test_a_nan_stays_a_nan(monkeypatch):
    lib = _library_or_skip(None, monkeypatch)
    values = np.full(16, np.nan, np.float32)
    values[1] = -np.nan
    dst = np.zeros((1, 16), np.float16)
    position = np.zeros(1, np.int64)
    args = np.array([values.ctypes.data, dst.ctypes.data, position.ctypes.data, 16], np.int64)
    pool = ThreadPool(lib, 1)
    try:
        pool.run_steps(
            step_table([(lib.address("kv_store_f16"), args.ctypes.data, 0)]).ctypes.data, 1
        )
    finally:
        pool.close()
    assert np.isnan(dst).all()
