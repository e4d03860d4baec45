"""engine.quants against gguf-py's dequantizers (gguf.quants.dequantize), type by type."""

from __future__ import annotations

import numpy as np
import pytest
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType
from gguf import quants as gguf_quants

from engine.gguf import SUPPORTED_QTYPES, open_gguf
from engine.qtensor import QTensor
from engine.quants import dequantize, dequantize_blocks, dequantize_rows
from tests.quant_blocks import random_blocks

Q = GGMLQuantizationType
BLOCK_TYPES = [t for t in SUPPORTED_QTYPES if t not in (Q.F32, Q.F16, Q.BF16)]


def random_tensor(rng, qtype, rows: int, blocks_per_row: int) -> QTensor:
    block_size, type_size = GGML_QUANT_SIZES[qtype]
    data = random_blocks(rng, qtype, rows * blocks_per_row).reshape(
        rows, blocks_per_row * type_size
    )
    return QTensor("w", qtype, (rows, blocks_per_row * block_size), data)


@pytest.mark.parametrize("qtype", BLOCK_TYPES, ids=lambda t: t.name)
def test_blocks_match_gguf_py(qtype):
    rng = np.random.default_rng(int(qtype))
    blocks = random_blocks(rng, qtype, 257)
    np.testing.assert_array_equal(
        dequantize_blocks(qtype, blocks), gguf_quants.dequantize(blocks, qtype)
    )


def test_random_blocks_have_finite_scales():
    # the block generator must not hide a broken dequantizer behind inf/nan on both sides
    rng = np.random.default_rng(0)
    for qtype in BLOCK_TYPES:
        assert np.isfinite(gguf_quants.dequantize(random_blocks(rng, qtype, 64), qtype)).all()


@pytest.mark.parametrize("qtype", [Q.TQ1_0, Q.TQ2_0, Q.MXFP4], ids=lambda t: t.name)
def test_blocks_quantized_by_gguf_py(qtype):
    # the types gguf-py can also quantize: blocks as a quantizer writes them
    rng = np.random.default_rng(int(qtype))
    block_size = GGML_QUANT_SIZES[qtype][0]
    values = rng.standard_normal((64, 4 * block_size)).astype(np.float32)
    values[0] = 0.0  # an all-zero block (scale 0)
    data = gguf_quants.quantize(values, qtype)
    blocks = data.reshape(-1, GGML_QUANT_SIZES[qtype][1])
    expected = gguf_quants.dequantize(data, qtype).reshape(len(blocks), block_size)
    np.testing.assert_array_equal(dequantize_blocks(qtype, blocks), expected)


@pytest.mark.parametrize("qtype", BLOCK_TYPES, ids=lambda t: t.name)
@pytest.mark.parametrize("rows,blocks_per_row", [(1, 1), (3, 2), (7, 3), (33, 1)])
def test_tensor_and_rows_match_gguf_py(qtype, rows, blocks_per_row):
    rng = np.random.default_rng(rows * 100 + blocks_per_row)
    t = random_tensor(rng, qtype, rows, blocks_per_row)
    expected = gguf_quants.dequantize(t.data, qtype)
    assert expected.shape == t.shape
    got = dequantize(t)
    assert got.dtype == np.float32 and got.shape == t.shape
    np.testing.assert_array_equal(got, expected)
    picks = rng.integers(0, rows, size=5)  # repeats allowed, order kept
    np.testing.assert_array_equal(dequantize_rows(t, picks), expected[picks])


def test_large_tensor_is_dequantized_in_chunks_exactly():
    # More blocks than one chunk, so the chunk boundary is exercised.
    rng = np.random.default_rng(5)
    t = random_tensor(rng, Q.Q4_K, 7, 97)  # 679 blocks: one full chunk of 512 and a partial one
    np.testing.assert_array_equal(dequantize(t), gguf_quants.dequantize(t.data, Q.Q4_K))


@pytest.mark.parametrize("qtype", [Q.F32, Q.F16, Q.BF16], ids=lambda t: t.name)
def test_float_types(qtype):
    rng = np.random.default_rng(1)
    values = rng.standard_normal((5, 8)).astype(np.float32)
    if qtype == Q.F32:
        data = values
        expected = values
    elif qtype == Q.F16:
        data = values.astype(np.float16)
        expected = data.astype(np.float32)
    else:
        raw = gguf_quants.quantize(values, Q.BF16)  # uint8 (5, 16), round-to-nearest-even
        expected = gguf_quants.dequantize(raw, Q.BF16)
        data = raw.view(np.uint16)  # engine.gguf stores BF16 as uint16 bit patterns
        # Independent check of the bit math: bf16 is the top 16 bits of a float32.
        assert np.all(np.abs(expected - values) <= np.abs(values) * 2.0**-8)
    t = QTensor("w", qtype, (5, 8), data)
    np.testing.assert_array_equal(dequantize(t), expected)
    np.testing.assert_array_equal(dequantize_rows(t, [4, 0, 4]), expected[[4, 0, 4]])


def test_rows_out_of_range_are_refused():
    t = random_tensor(np.random.default_rng(0), Q.Q8_0, 4, 1)
    with pytest.raises(IndexError, match="row 4 is out of range"):
        dequantize_rows(t, [0, 4])


@pytest.mark.parametrize(
    "name",
    [
        "token_embd.weight",
        "blk.0.attn_k.weight",
        "blk.0.attn_output.weight",
        "blk.0.ffn_down.weight",
        "blk.0.attn_norm.weight",
    ],
)
def test_real_gemma3_tensors(gemma3_path, name):
    # Q8_0, Q5_0, Q4_K, Q6_K and F32 as stored in a real file; a few rows keep it fast.
    t = open_gguf(gemma3_path).tensors[name]
    if t.qtype == Q.F32:
        np.testing.assert_array_equal(dequantize(t), t.data)
        return
    picks = np.array([0, 1, 2, t.rows - 1, 106])
    expected = gguf_quants.dequantize(np.ascontiguousarray(t.data[picks]), t.qtype)
    np.testing.assert_array_equal(dequantize_rows(t, picks), expected)


def test_real_smollm2_q4_1_tensor(smollm2_path):
    t = open_gguf(smollm2_path).tensors["blk.0.ffn_gate.weight"]
    assert t.qtype == Q.Q4_1
    np.testing.assert_array_equal(dequantize(t), gguf_quants.dequantize(t.data, Q.Q4_1))
