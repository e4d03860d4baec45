"""The q8_0 KV cache: layout and byte accounting (0.53x of float16), rows written through
`write` equal gguf-py's Q8_0 quantization, clone keeps the type, unknown types and head sizes
q8_0 cannot hold are refused with a ConfigValidationError naming the value, and a whole model
over a q8_0 cache gives the numpy reference's logits over the same cache (sliding window,
sinks and GQA layers included) and stays close to its float16-cache logits."""

from types import SimpleNamespace

import numpy as np
import pytest
from gguf import GGMLQuantizationType
from gguf import quants as gguf_quants

from engine.errors import ConfigValidationError
from engine.gguf import open_gguf
from engine.kernels.jit_backend import JitBackend
from engine.kernels.reference import ReferenceBackend
from engine.kv_cache import KVCache
from engine.loader import load_model
from engine.models import build_model
from engine.types import KV_CACHE_TYPES, KvCacheType

CFG = SimpleNamespace(n_layers=3, n_kv_head=2, head_dim=64)


def test_q8_0_layout_and_bytes_are_0_53x_of_f16():
    cache = KVCache.for_config(CFG, 16, "q8_0")
    assert cache.cache_type is KvCacheType.Q8_0
    assert cache.k.shape == cache.v.shape == (3, 16, 2, 2 * 34) and cache.k.dtype == np.uint8
    assert cache.nbytes == KVCache.bytes_needed(CFG, 16, "q8_0") == 2 * 3 * 16 * 2 * 68
    f16 = KVCache.bytes_needed(CFG, 16, "f16")
    assert KVCache.bytes_needed(CFG, 16, "q8_0") / f16 == pytest.approx(34 / 64)


def test_write_quantizes_like_gguf_py_and_clone_keeps_the_type():
    rng = np.random.default_rng(3)
    cache = KVCache.for_config(CFG, 8, "q8_0")
    k = rng.standard_normal((3, 2, 64)).astype(np.float32)
    v = rng.standard_normal((3, 2, 64)).astype(np.float32) * 7
    cache.write(1, 2, k, v)
    cache.commit([5, 6, 7])  # positions 0..2 "valid" so clone copies rows 0..2
    want_k = gguf_quants.quantize(k.reshape(-1, 64), GGMLQuantizationType.Q8_0)
    np.testing.assert_array_equal(cache.k[1, 2:5].reshape(want_k.shape), want_k)
    np.testing.assert_array_equal(
        cache.v[1, 2:5].reshape(-1, 68),
        gguf_quants.quantize(v.reshape(-1, 64), GGMLQuantizationType.Q8_0),
    )
    copy = cache.clone()
    assert copy.cache_type is KvCacheType.Q8_0 and copy.k.dtype == np.uint8
    np.testing.assert_array_equal(copy.k[:, :3], cache.k[:, :3])


def test_f16_write_rounds_to_half():
    cache = KVCache.for_config(CFG, 4)
    k = np.full((1, 2, 64), 1 / 3, np.float32)
    cache.write(0, 0, k, -k)
    assert cache.k.dtype == np.float16
    np.testing.assert_array_equal(cache.k[0, 0], np.float16(1 / 3))
    np.testing.assert_array_equal(cache.v[0, 0], -np.float16(1 / 3))


@pytest.mark.parametrize("bad", ["q4_0", "F16", "", None, 8])
def test_unknown_cache_types_are_refused_naming_them(bad):
    with pytest.raises(ConfigValidationError) as info:
        KVCache.for_config(CFG, 4, bad)
    assert info.value.field == "cache_type" and repr(bad) in str(info.value)
    for name in KV_CACHE_TYPES:
        assert name in info.value.allowed


def test_q8_0_needs_whole_32_value_blocks_per_head():
    with pytest.raises(ConfigValidationError, match="multiple of 32"):
        KVCache(2, 4, 2, 48, "q8_0")


def test_load_model_refuses_an_unknown_cache_type_before_loading():
    from pathlib import Path

    path = Path(__file__).parent / "fixtures" / "tiny_llama.gguf"
    with pytest.raises(ConfigValidationError) as info:
        load_model(path, cache_type="q4_k")
    assert info.value.field == "cache_type" and "q4_k" in str(info.value)
    with pytest.raises(ConfigValidationError, match="multiple of 32"):  # head_dim 8
        load_model(path, cache_type="q8_0")


@pytest.fixture(scope="module")
def jit():
    b = JitBackend(n_threads=2)
    yield b
    b.close()


@pytest.mark.parametrize(
    "arch,dims",
    [
        ("qwen2", dict(n_heads=8, n_kv_heads=2, head_dim=32, d_model=128)),
        ("gemma3", dict(n_heads=4, n_kv_heads=1, head_dim=64, d_model=128, sliding_window=5)),
        ("gpt-oss", dict(n_heads=4, n_kv_heads=2, head_dim=32, d_model=64, sliding_window=4)),
    ],
)
def test_model_over_a_q8_0_cache_matches_the_reference_and_stays_near_f16(
    tiny_model_factory, jit, arch, dims
):
    gguf_file = open_gguf(tiny_model_factory(arch, **dims))
    tokens = [1, 17, 200, 5, 42, 9, 77, 100, 3, 11, 60, 8]
    logits = {}
    for name, backend, cache_type in (
        ("jit_q8", jit, "q8_0"),
        ("ref_q8", ReferenceBackend(), "q8_0"),
        ("jit_f16", jit, "f16"),
    ):
        model = build_model(gguf_file, backend=backend)
        model.cache_type = KvCacheType(cache_type)
        cache = model.new_cache(16)
        assert cache.cache_type == cache_type
        rows = [model.forward(tokens[:7], cache)] + [model.forward([t], cache) for t in tokens[7:]]
        logits[name] = np.concatenate([np.atleast_2d(r) for r in rows])
    assert not any(key.startswith("attention") for key in jit.fallbacks)
    scale = np.abs(logits["ref_q8"]).max()
    # int8 activations in the JIT's mat-muls move logits by ~1.5% of their range
    np.testing.assert_allclose(logits["jit_q8"], logits["ref_q8"], atol=0.04 * scale, rtol=0)
    np.testing.assert_allclose(logits["jit_q8"], logits["jit_f16"], atol=0.05 * scale, rtol=0)
    assert not np.array_equal(logits["jit_q8"], logits["jit_f16"])  # the cache type took effect
