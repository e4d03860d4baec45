"""No silent slow paths: an op that the JIT backend hands to the numpy reference says so once
(a log line), is counted per op and reason, and shows in `info`, the load line and `bench`."""

import logging

import numpy as np
import pytest
from gguf import GGMLQuantizationType as Q

from engine.bench import run_bench
from engine.gguf import open_gguf
from engine.kernels import quant_matmul
from engine.kernels.jit_backend import JitBackend
from engine.load_summary import kernel_path, planned_kernel_path
from engine.models import build_model

HEAD8 = "attention: head_dim 8 is not a multiple of 16"


@pytest.fixture(scope="module")
def jit():
    backend = JitBackend(n_threads=2)
    yield backend
    backend.close()


@pytest.fixture(scope="module")
def head8_model(tiny_model_factory):
    # The attention kernel takes head sizes in multiples of 16: this one must fall back.
    return tiny_model_factory("llama", Q.Q8_0, seed=2, head_dim=8, n_layers=2)


def test_a_forced_fallback_is_logged_once_and_counted(jit, head8_model, caplog):
    jit.fallbacks.clear()
    model = build_model(open_gguf(head8_model), backend=jit)
    with caplog.at_level(logging.WARNING, logger="engine.kernels.jit_backend"):
        cache = model.new_cache(8)
        model.forward([1, 2, 3], cache)
        model.forward([4], cache)
    assert jit.fallbacks == {HEAD8: 4}  # 2 layers x 2 forwards, nothing else
    warned = [r for r in caplog.records if "head_dim 8" in r.getMessage()]
    assert len(warned) == 1 and "numpy" in warned[0].getMessage()
    assert kernel_path(jit).endswith(f"numpy fallback: {HEAD8} (4 calls)")


def test_a_weight_type_without_a_kernel_is_counted(jit, tiny_model_factory, monkeypatch):
    jit.fallbacks.clear()
    # As if Q8_0 had no kernel (both tables linear may consult: compiled and known layouts).
    monkeypatch.delitem(jit._kernels, "Q8_0")
    monkeypatch.delitem(quant_matmul.LAYOUTS, "Q8_0")
    monkeypatch.setattr(jit, "_weights", {})
    model = build_model(open_gguf(tiny_model_factory("llama", Q.Q8_0, seed=3)), backend=jit)
    model.forward([1, 2], model.new_cache(4))
    assert jit.fallbacks.get("linear: Q8_0 weights", 0) > 0


def test_the_kernel_paths_count_nothing(jit, tiny_model_factory):
    jit.fallbacks.clear()
    model = build_model(open_gguf(tiny_model_factory("llama", Q.Q8_0, seed=4)), backend=jit)
    logits = model.forward([1, 2, 3], model.new_cache(4))
    assert np.isfinite(logits).all() and jit.fallbacks == {}
    assert "fallback" not in kernel_path(jit)


def test_info_predicts_the_fallback_from_the_file():
    assert planned_kernel_path(quant_mix={"Q8_0": {}, "F32": {}}, head_dim=64).count(";") == 0
    line = planned_kernel_path(quant_mix={"Q8_0": {}, "IQ9_Z": {}}, head_dim=8)
    assert line.startswith("JIT ") and "linear: IQ9_Z weights" in line and HEAD8 in line


def test_bench_json_counts_the_fallbacks(head8_model, tiny_model_factory):
    r = run_bench(head8_model, n_prompt=4, n_gen=2, repetitions=1, cold_compile=False)
    # 2 layers x (2 prefills + 2 x 2 decode steps) = 12 attention calls, all on numpy
    assert r["fallbacks"] == {HEAD8: 12} and HEAD8 in r["kernels"]
    clean = run_bench(
        tiny_model_factory("llama", Q.Q8_0, seed=4),
        n_prompt=4,
        n_gen=2,
        repetitions=1,
        cold_compile=False,
    )
    assert clean["fallbacks"] == {}
