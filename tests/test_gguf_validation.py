"""Structurally valid GGUF files whose metadata or tensors do not describe a runnable model: each
is refused by ModelConfig.from_gguf (so `info` and `load` both see it) with a typed error naming
the key or tensor, before anything is allocated from the bad values.

Files are written with gguf-py's GGUFWriter (tests/tiny_models.py, or `rewritten` below), so the
defect is only the one each test plants.
"""

from __future__ import annotations

import math
import resource
import time

import numpy as np
import pytest
from gguf import GGMLQuantizationType, GGUFValueType, GGUFWriter

from engine.config import ModelConfig
from engine.errors import EngineError, ModelFileError
from engine.gguf import open_gguf
from tests.tiny_models import write_tiny_model

Q = GGMLQuantizationType
V = GGUFValueType


def virtual_memory_bytes() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmSize:"):
                return int(line.split()[1]) * 1024
    raise LookupError("VmSize")


def config_error(path, match: str) -> str:
    """Assert the file opens but is refused as a model with a message matching `match`."""
    g = open_gguf(path)
    with pytest.raises(ModelFileError, match=match) as info:
        ModelConfig.from_gguf(g)
    return str(info.value)


def rewritten(tmp_path, arch: str, *, tensors=None, add=None, drop=(), **tiny_kwargs):
    """A tiny F32 model of `arch` written again with GGUFWriter, `tensors` replacing named
    tensors' values ({name: array}), `add` adding tensors and `drop` removing them."""
    source = write_tiny_model(tmp_path / "source.gguf", arch, tokenizer=None, **tiny_kwargs)
    g = open_gguf(source)
    path = tmp_path / "model.gguf"
    writer = GGUFWriter(path, arch)
    for key, value in g.metadata.items():
        if key in ("general.architecture", "GGUF.kv_count"):
            continue
        vtype = g.metadata_types[key]
        writer.add_key_value(key, value, vtype.type, vtype.element_type)
    replaced = {**{n: np.array(t.data) for n, t in g.tensors.items()}, **(tensors or {})}
    for name, values in {**replaced, **(add or {})}.items():
        if name not in drop:
            writer.add_tensor(name, np.ascontiguousarray(values, dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


# --- metadata values of the wrong type: an integer key must hold an integer ----------------------
@pytest.mark.parametrize(
    "key,value,vtype",
    [
        ("block_count", math.nan, V.FLOAT32),
        ("block_count", math.inf, V.FLOAT32),
        ("block_count", 2.0, V.FLOAT64),
        ("block_count", "2", V.STRING),
        ("embedding_length", math.nan, V.FLOAT32),
        ("attention.head_count", -math.inf, V.FLOAT32),
        ("attention.head_count_kv", True, V.BOOL),
        ("feed_forward_length", [128], V.ARRAY),
        ("context_length", "2048", V.STRING),
        ("attention.key_length", 16.5, V.FLOAT32),
        ("expert_count", math.nan, V.FLOAT32),
    ],
)
def test_integer_key_with_a_non_integer_value(tmp_path, key, value, vtype):
    path = write_tiny_model(
        tmp_path / "m.gguf",
        "llama",
        tokenizer=None,
        extra_metadata={f"llama.{key}": (value, vtype)},
    )
    message = config_error(path, rf"llama\.{key}=.*must be")
    assert "integer" in message


@pytest.mark.parametrize(
    "key,value,vtype",
    [
        ("attention.layer_norm_rms_epsilon", math.nan, V.FLOAT32),
        ("rope.freq_base", math.inf, V.FLOAT32),
        ("rope.freq_base", "1e4", V.STRING),
        ("final_logit_softcapping", -math.inf, V.FLOAT32),
    ],
)
def test_float_key_with_a_bad_value(tmp_path, key, value, vtype):
    path = write_tiny_model(
        tmp_path / "m.gguf",
        "llama",
        tokenizer=None,
        extra_metadata={f"llama.{key}": (value, vtype)},
    )
    config_error(path, rf"llama\.{key}=.*must be")


@pytest.mark.parametrize(
    "value,vtype",
    [("6", V.STRING), ("local", V.STRING), (math.nan, V.FLOAT32), (0, V.UINT32),
     (["a"] * 6, V.ARRAY), ([True, False], V.ARRAY)],
)  # fmt: skip
def test_gemma3_sliding_window_pattern_of_the_wrong_type(tmp_path, value, vtype):
    path = write_tiny_model(
        tmp_path / "m.gguf",
        "gemma3",
        tokenizer=None,
        extra_metadata={"gemma3.attention.sliding_window_pattern": (value, vtype)},
    )
    config_error(path, r"gemma3\.attention\.sliding_window_pattern")


def test_rope_scaling_type_not_a_string(tmp_path):
    path = write_tiny_model(
        tmp_path / "m.gguf",
        "llama",
        tokenizer=None,
        extra_metadata={"llama.rope.scaling.type": (3, V.UINT32)},
    )
    config_error(path, r"llama\.rope\.scaling\.type=3 must be a string")


# --- counts that would allocate or loop per layer before any tensor is looked at ----------------
@pytest.mark.parametrize("block_count", [10**9, 2**32 - 1, 2**63 - 1, 3, 1000])
def test_block_count_inconsistent_with_the_tensors(tmp_path, block_count):
    vtype = V.UINT64 if block_count >= 2**32 else V.UINT32
    path = write_tiny_model(
        tmp_path / "m.gguf",
        "llama",
        tokenizer=None,
        extra_metadata={"llama.block_count": (block_count, vtype)},
    )
    g = open_gguf(path)
    # An 8 GB allocation fails under this cap (1 GB above what the process has mapped now)
    # instead of swapping the machine to death.
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    cap = virtual_memory_bytes() + (1 << 30)
    if soft != resource.RLIM_INFINITY:
        cap = min(cap, soft)
    resource.setrlimit(resource.RLIMIT_AS, (cap, hard))
    cpu_started = time.process_time()
    try:
        with pytest.raises(ModelFileError, match=rf"llama\.block_count={block_count}|blk\.2\."):
            ModelConfig.from_gguf(g)
    finally:
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))
    assert time.process_time() - cpu_started < 5.0  # refused up front, not after a long loop


def test_block_count_smaller_than_the_layers_present(tmp_path):
    path = write_tiny_model(
        tmp_path / "m.gguf",
        "llama",
        tokenizer=None,
        extra_metadata={"llama.block_count": (1, V.UINT32)},
    )
    config_error(path, r"'blk\.1\..*' belongs to layer 1, but metadata llama\.block_count=1")


def test_context_length_beyond_int32_positions(tmp_path):
    path = write_tiny_model(
        tmp_path / "m.gguf",
        "llama",
        tokenizer=None,
        extra_metadata={"llama.context_length": (2**40, V.UINT64)},
    )
    config_error(path, r"llama\.context_length=1099511627776 must be a positive integer up to")


def test_head_count_not_dividing_the_width(tmp_path):
    path = write_tiny_model(
        tmp_path / "m.gguf",
        "llama",
        tokenizer=None,
        omit_keys=("llama.attention.key_length", "llama.attention.value_length",
                   "llama.rope.dimension_count"),
        extra_metadata={"llama.attention.head_count": (6, V.UINT32),
                        "llama.attention.head_count_kv": (6, V.UINT32)},
    )  # fmt: skip
    config_error(path, r"embedding_length=64 is not a multiple of llama\.attention\.head_count=6")


def test_tokenizer_larger_than_the_embedding(tmp_path):
    path = write_tiny_model(
        tmp_path / "m.gguf",
        "llama",
        tokenizer=None,
        vocab_size=32,
        extra_metadata={"tokenizer.ggml.tokens": ([f"t{i}" for i in range(40)], V.ARRAY)},
    )
    config_error(path, r"tokenizer\.ggml\.tokens has 40 tokens, but token_embd\.weight has only 32")


# --- tensor shapes: every vector and matrix the forward pass reads, against the config -----------
@pytest.mark.parametrize(
    "arch,name,shape",
    [
        ("llama", "blk.0.attn_norm.weight", (63,)),
        ("llama", "blk.1.ffn_norm.weight", (65,)),
        ("llama", "output_norm.weight", (32,)),
        ("llama", "blk.0.attn_norm.weight", (1, 64)),
        ("qwen2", "blk.0.attn_q.bias", (32,)),
        ("qwen2", "blk.1.attn_v.bias", (64,)),
        ("qwen3", "blk.0.attn_q_norm.weight", (8,)),
        ("qwen3", "blk.1.attn_k_norm.weight", (17,)),
        ("gemma3", "blk.0.post_attention_norm.weight", (60,)),
        ("gemma3", "blk.5.post_ffw_norm.weight", (16,)),
        ("llama", "blk.0.attn_q.weight", (64, 32)),
        ("llama", "blk.1.ffn_down.weight", (64, 64)),
        ("llama", "token_embd.weight", (256, 32)),
        ("llama", "output.weight", (255, 64)),
    ],
)
def test_tensor_shape_that_does_not_match_the_config(tmp_path, arch, name, shape):
    values = np.ones(shape, np.float32)
    message = config_error(
        rewritten(tmp_path, arch, tensors={name: values}), rf"tensor '{name}' has shape"
    )
    assert "expected" in message


@pytest.mark.parametrize(
    "arch,name",
    [("qwen2", "blk.1.attn_k.bias"), ("qwen3", "blk.0.attn_q_norm.weight"),
     ("gemma3", "blk.3.post_ffw_norm.weight"), ("llama", "output_norm.weight")],
)  # fmt: skip
def test_missing_vector(tmp_path, arch, name):
    config_error(rewritten(tmp_path, arch, drop=(name,)), rf"tensor '{name}' is missing")


def test_bad_rope_freqs_shape(tmp_path):
    path = rewritten(tmp_path, "llama", add={"rope_freqs.weight": np.ones(5, np.float32)})
    config_error(path, r"tensor 'rope_freqs\.weight' has shape \(5,\), expected \(8,\)")


def test_valid_tiny_models_pass_every_check(tmp_path):
    for arch in ("llama", "qwen2", "qwen3", "gemma3"):
        path = write_tiny_model(tmp_path / f"{arch}.gguf", arch, Q.Q8_0, tokenizer=None)
        assert ModelConfig.from_gguf(open_gguf(path)).arch == arch


# --- non-finite weights reach the sampler as a typed error, not a ValueError traceback ----------
def test_nan_weights_give_a_typed_error_when_generating(tmp_path):
    from engine.errors import ModelOutputError
    from engine.events import Finished
    from engine.generate import GenerationRequest, generate
    from engine.loader import load_model

    path = write_tiny_model(tmp_path / "m.gguf", "llama", Q.Q8_0, embedding_qtype=Q.F32)
    g = open_gguf(path)
    start = g.tensor_offsets["output_norm.weight"]
    with open(path, "r+b") as f:
        f.seek(start)
        f.write(np.full(64, np.nan, np.float32).tobytes())
    with load_model(path, n_threads=1) as lm:
        request = GenerationRequest(prompt="Hello", overrides={"max_new_tokens": 2})
        events = list(generate(lm, request))
    done = events[-1]
    assert isinstance(done, Finished) and done.finish_reason == "error"
    assert done.error.startswith("every logit is -inf or not finite")
    assert issubclass(ModelOutputError, EngineError)
