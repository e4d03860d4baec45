"""engine.gguf against gguf-py's GGUFReader (an independent parser) on real and tiny files."""

from __future__ import annotations

import math

import numpy as np
import pytest
from gguf import GGMLQuantizationType, GGUFReader, GGUFValueType

from engine.gguf import SUPPORTED_QTYPES, NumericArray, StringArray, open_gguf
from tests.tiny_models import ALL_QTYPES, ARCHS, K_QUANTS

Q = GGMLQuantizationType
K_DIMS = dict(d_model=256, d_ff=512, n_heads=4, n_kv_heads=2, head_dim=64)


def assert_same_as_reader(path) -> None:
    """Every metadata value and tensor must equal what GGUFReader reads from the same file."""
    ours = open_gguf(path)
    reader = GGUFReader(path)
    fields = {k: f for k, f in reader.fields.items() if not k.startswith("GGUF.")}
    assert set(ours.metadata) == set(fields)
    for key, field in fields.items():
        expected = field.contents()
        got = ours.metadata[key]
        assert ours.metadata_types[key].type == field.types[0], key
        if isinstance(expected, float):
            assert math.isclose(got, expected, rel_tol=0, abs_tol=0) or got == expected, key
        else:
            assert got == expected, key
    assert [t.name for t in reader.tensors] == list(ours.tensors)
    for rt in reader.tensors:
        qt = ours.tensors[rt.name]
        assert qt.qtype == rt.tensor_type
        assert qt.shape == tuple(reversed(rt.shape.tolist()))
        assert ours.tensor_offsets[rt.name] == rt.data_offset
        raw = rt.data.view(np.uint8) if qt.qtype == Q.BF16 else rt.data
        mine = qt.data.view(np.uint8).reshape(raw.shape) if qt.qtype == Q.BF16 else qt.data
        assert mine.shape == raw.shape and mine.dtype == raw.dtype
        assert np.array_equal(mine, raw)
    assert ours.data_offset == reader.data_offset
    assert ours.alignment == reader.alignment


@pytest.mark.parametrize("arch", ARCHS)
def test_tiny_models_of_every_arch_match_reader(tiny_model_factory, arch):
    # Without tokenizer metadata: GGUFReader needs ~4 s per 49k-token vocabulary.
    assert_same_as_reader(tiny_model_factory(arch, Q.Q8_0, tokenizer=None))


@pytest.mark.parametrize("qtype", ALL_QTYPES, ids=lambda t: t.name)
def test_tiny_models_of_every_qtype_match_reader(tiny_model_factory, qtype):
    dims = K_DIMS if qtype in K_QUANTS else {}
    assert_same_as_reader(tiny_model_factory("llama", qtype, tokenizer=None, **dims))


@pytest.mark.slow
def test_smollm2_matches_reader(smollm2_path):
    assert_same_as_reader(smollm2_path)


def test_smollm2_header(smollm2_path):
    g = open_gguf(smollm2_path)
    assert g.version == 3 and g.arch == "llama"
    assert g.arch_value("block_count") == 30
    assert g.arch_value("embedding_length") == 576
    assert g.metadata["tokenizer.ggml.model"] == "gpt2"
    tokens = g.metadata["tokenizer.ggml.tokens"]
    assert (
        isinstance(tokens, StringArray)  # one blob + offsets, not 49k str objects (issue 32)
        and len(tokens) == 49152
        and all(isinstance(t, str) for t in tokens[:100])
    )
    assert tokens[2] == "<|im_end|>"
    assert isinstance(g.metadata["tokenizer.ggml.add_bos_token"], bool)
    assert g.metadata_types["tokenizer.ggml.token_type"].element_type == GGUFValueType.INT32
    assert "output.weight" not in g.tensors  # tied embeddings
    embd = g.tensors["token_embd.weight"]
    assert (
        embd.qtype == Q.Q8_0 and embd.shape == (49152, 576) and embd.data.shape == (49152, 18 * 34)
    )
    q = g.tensors["blk.0.attn_q.weight"]
    assert q.qtype == Q.Q4_1 and q.shape == (576, 576) and q.data.dtype == np.uint8
    norm = g.tensors["blk.0.attn_norm.weight"]
    assert norm.qtype == Q.F32 and norm.data.dtype == np.float32 and norm.data.shape == (576,)
    # Real sizes from the model card: 134.5M parameters.
    assert g.parameter_count() == 134_515_008
    mix = g.quant_mix()
    assert mix["Q4_1"][0] == 210 and mix["Q8_0"][0] == 1 and mix["F32"][0] == 61
    assert sum(b for _, b in mix.values()) == g.tensor_bytes() <= g.file_size


def test_repr_is_short(smollm2_path):
    text = repr(open_gguf(smollm2_path))
    assert len(text) < 300 and "llama" in text and "272 tensors" in text


def test_tensors_are_read_only_views_not_copies(smollm2_path):
    g = open_gguf(smollm2_path)
    t = g.tensors["blk.3.ffn_down.weight"]
    assert not t.data.flags.writeable
    assert not t.data.flags.owndata
    # The bytes at the recorded file offset are exactly the tensor's bytes.
    with open(smollm2_path, "rb") as f:
        f.seek(g.tensor_offsets[t.name])
        assert f.read(64) == t.data.reshape(-1)[:64].tobytes()


def test_gemma3_header(gemma3_path):
    g = open_gguf(gemma3_path)
    assert g.arch == "gemma3"
    assert g.arch_value("attention.sliding_window") == 512
    assert g.arch_value("attention.key_length") == 256
    assert len(g.metadata["tokenizer.ggml.tokens"]) == 262144
    scores = g.metadata["tokenizer.ggml.scores"]
    # a list-like over the file's float32 array, not 262k float objects (issue 32)
    assert isinstance(scores, NumericArray) and scores.array.dtype == np.float32
    assert isinstance(scores[0], float) and len(scores) == 262144
    types = {t.qtype for t in g.tensors.values()}
    assert types <= set(SUPPORTED_QTYPES) and Q.Q4_K in types and Q.Q6_K in types
    assert g.tensors["blk.0.ffn_down.weight"].data.shape == (640, 2048 // 256 * 210)


def test_tiny_model_layout(tiny_model_factory):
    g = open_gguf(tiny_model_factory("gemma3", Q.F32))
    assert g.arch == "gemma3"
    assert g.arch_value("block_count") == 6
    assert g.arch_value("attention.sliding_window") == 8
    assert "output.weight" not in g.tensors  # gemma3 ties the output to the embeddings
    for name in ("attn_q_norm", "attn_k_norm", "post_attention_norm", "post_ffw_norm"):
        assert f"blk.5.{name}.weight" in g.tensors
    assert g.tensors["blk.0.attn_q.weight"].shape == (4 * 16, 64)
    assert g.tensors["blk.0.attn_k.weight"].shape == (2 * 16, 64)
    assert g.tensors["blk.0.ffn_down.weight"].shape == (64, 128)
    qwen2 = open_gguf(tiny_model_factory("qwen2", Q.F32))
    assert qwen2.tensors["blk.1.attn_v.bias"].shape == (32,)
    assert "output.weight" in qwen2.tensors
    assert qwen2.metadata["tokenizer.ggml.pre"] == "smollm"


# --- the tiny-model writer itself ------------------------------------------------------------------
def test_tiny_model_copies_the_real_tokenizer(tiny_model_factory, smollm2_path):
    real = open_gguf(smollm2_path)
    tiny = open_gguf(tiny_model_factory("qwen3", Q.F32))
    real_tok = {k: v for k, v in real.metadata.items() if k.startswith("tokenizer.")}
    tiny_tok = {k: v for k, v in tiny.metadata.items() if k.startswith("tokenizer.")}
    assert tiny_tok == real_tok
    assert all(tiny.metadata_types[k] == real.metadata_types[k] for k in real_tok)
    assert tiny.tensors["token_embd.weight"].shape == (49152, 64)


@pytest.mark.slow
def test_tiny_gemma3_with_gemma_tokenizer(tmp_path, gemma3_path):
    from tests.tiny_models import write_tiny_model

    path = write_tiny_model(tmp_path / "g.gguf", "gemma3", Q.Q8_0, tokenizer="gemma3")
    g = open_gguf(path)
    assert g.metadata["tokenizer.ggml.model"] == "llama"
    assert len(g.metadata["tokenizer.ggml.scores"]) == 262144
    assert g.tensors["token_embd.weight"].shape == (262144, 64)


@pytest.mark.parametrize("qtype", ALL_QTYPES, ids=lambda t: t.name)
def test_tiny_weights_have_the_requested_spread(tiny_model_factory, qtype):
    from engine.quants import dequantize

    dims = K_DIMS if qtype in K_QUANTS else {}
    g = open_gguf(tiny_model_factory("llama", qtype, tokenizer=None, **dims))
    w = dequantize(g.tensors["blk.1.ffn_up.weight"])
    assert np.isfinite(w).all()
    assert 0.04 < w.std() < 0.06  # weight_scale=0.05
    assert abs(w.mean()) < 0.01
    assert g.tensors["blk.1.ffn_up.weight"].qtype == qtype
    assert g.tensors["blk.1.ffn_norm.weight"].qtype == Q.F32


# --- round trip: anything gguf-py's writer produces reads back equal ------------------------------
from gguf import GGML_QUANT_SIZES, GGUFWriter  # noqa: E402
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

V = GGUFValueType
_INT_RANGES = {
    V.UINT8: (0, 2**8 - 1), V.INT8: (-(2**7), 2**7 - 1), V.UINT16: (0, 2**16 - 1),
    V.INT16: (-(2**15), 2**15 - 1), V.UINT32: (0, 2**32 - 1), V.INT32: (-(2**31), 2**31 - 1),
    V.UINT64: (0, 2**64 - 1), V.INT64: (-(2**63), 2**63 - 1),
}  # fmt: skip


def _scalar(vtype: GGUFValueType) -> st.SearchStrategy:
    if vtype in _INT_RANGES:
        return st.integers(*_INT_RANGES[vtype])
    if vtype == V.FLOAT32:
        return st.floats(width=32, allow_nan=False)
    if vtype == V.FLOAT64:
        return st.floats(allow_nan=False)
    if vtype == V.BOOL:
        return st.booleans()
    return st.text(max_size=20)


_SCALAR_TYPES = [t for t in V if t != V.ARRAY]


@st.composite
def _metadata_entry(draw):
    vtype = draw(st.sampled_from([*_SCALAR_TYPES, V.ARRAY]))
    if vtype != V.ARRAY:
        return vtype, None, draw(_scalar(vtype))
    element = draw(st.sampled_from(_SCALAR_TYPES))
    return vtype, element, draw(st.lists(_scalar(element), min_size=1, max_size=8))


@st.composite
def _tensor(draw, index: int):
    qtype = draw(st.sampled_from(SUPPORTED_QTYPES))
    block_size, type_size = GGML_QUANT_SIZES[qtype]
    ne0 = block_size * draw(st.integers(1, 3))
    outer = draw(st.lists(st.integers(1, 3), max_size=3))
    shape = (*reversed(outer), ne0)  # numpy order
    n_bytes = int(np.prod(shape[:-1], dtype=np.int64)) * ne0 // block_size * type_size
    data = np.frombuffer(draw(st.binary(min_size=n_bytes, max_size=n_bytes)), dtype=np.uint8)
    return f"t{index}", qtype, shape, data.reshape(*shape[:-1], -1)


@settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    entries=st.lists(_metadata_entry(), max_size=6),
    alignment=st.sampled_from([None, 1, 8, 64, 4096]),
    tensors=st.integers(0, 4).flatmap(lambda n: st.tuples(*[_tensor(i) for i in range(n)])),
)
def test_writer_round_trip(tmp_path, entries, alignment, tensors):
    path = tmp_path / "round.gguf"
    writer = GGUFWriter(path, "llama")
    if alignment is not None:
        writer.add_custom_alignment(alignment)
    expected = {}
    for i, (vtype, element, value) in enumerate(entries):
        key = f"test.k{i}"
        writer.add_key_value(key, value, vtype, element)
        expected[key] = value
    for name, qtype, _, data in tensors:
        writer.add_tensor(
            name, data, raw_dtype=qtype
        )  # uint8 byte rows; the writer derives the shape
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()

    g = open_gguf(path)
    assert g.arch == "llama"
    assert g.alignment == (alignment or 32)
    for key, value in expected.items():
        assert g.metadata[key] == value, key
    assert list(g.tensors) == [t[0] for t in tensors]
    for name, qtype, shape, data in tensors:
        t = g.tensors[name]
        assert t.qtype == qtype and t.shape == shape
        assert t.data.view(np.uint8).tobytes() == data.tobytes()
        assert g.tensor_offsets[name] % g.alignment == 0
