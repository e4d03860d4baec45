"""numpy dequantizers for the tensor types the engine runs: the reference the JIT kernels are
tested against, and the embedding-row lookup of the forward pass. The classic and K-quant
types are here; the codebook, ternary and MXFP4 types are in engine/quants_iq.py.

Each `_blocks_<type>(blocks)` turns uint8 blocks (n_blocks, type_size) into float32
(n_blocks, block_size) following ggml's block layouts (ggml-common.h / ggml-quants.c
`dequantize_row_*`). Comments give each layout; the index maps are derived from the reference
loops. Whole tensors are dequantized in chunks of blocks so temporaries stay small.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

from engine.qtensor import QTensor
from engine.quants_iq import BLOCK_DEQUANTIZERS as _IQ_DEQUANTIZERS

Q = GGMLQuantizationType
QK_K = 256
# Values per step when dequantizing many rows: the temporaries of one step (~0.5-2 MB) stay in
# cache, which measured ~1.5-2x faster than steps of 8M values.
_CHUNK_VALUES = 1 << 17


def _f16(blocks: np.ndarray, at: int) -> np.ndarray:
    """The fp16 field at byte `at` of every block, as a float32 column (n_blocks, 1).

    Every block size and fp16 field offset is even, so this is a strided view, not a copy.
    """
    return blocks.view("<f2")[:, at // 2 : at // 2 + 1].astype(np.float32)


def _nibbles(qs: np.ndarray) -> np.ndarray:
    """(n, k) bytes -> (n, 2k): all low nibbles first, then all high nibbles (ggml's order)."""
    out = np.empty((len(qs), 2, qs.shape[1]), dtype=np.uint8)
    np.bitwise_and(qs, 0x0F, out=out[:, 0])
    np.right_shift(qs, 4, out=out[:, 1])
    return out.reshape(len(qs), -1)


def _bits(words: np.ndarray, count: int) -> np.ndarray:
    """(n, 4) little-endian bytes of a u32 -> (n, count) bits, bit i at column i."""
    return np.unpackbits(words, axis=1, bitorder="little")[:, :count]


# Arithmetic below is done in place on the one float32 array each function returns: numpy
# temporaries, not arithmetic, are what costs time here (measured 2.5x on Q4_0).


# --- 32-value blocks ------------------------------------------------------------------------------
def _blocks_q4_0(b: np.ndarray) -> np.ndarray:
    # d f16 | qs[16]: value i = d * (nibble_i - 8)
    q = _nibbles(b[:, 2:18]).astype(np.float32)
    q -= 8.0
    q *= _f16(b, 0)
    return q


def _blocks_q4_1(b: np.ndarray) -> np.ndarray:
    # d f16 | m f16 | qs[16]: value i = d * nibble_i + m
    q = _nibbles(b[:, 4:20]).astype(np.float32)
    q *= _f16(b, 0)
    q += _f16(b, 2)
    return q


def _blocks_q5_0(b: np.ndarray) -> np.ndarray:
    # d f16 | qh u32 (bit i = 5th bit of value i) | qs[16]: value i = d * (q5_i - 16)
    q5 = _nibbles(b[:, 6:22])
    q5 |= _bits(b[:, 2:6], 32) << 4
    q = q5.astype(np.float32)
    q -= 16.0
    q *= _f16(b, 0)
    return q


def _blocks_q5_1(b: np.ndarray) -> np.ndarray:
    # d f16 | m f16 | qh u32 | qs[16]: value i = d * q5_i + m
    q5 = _nibbles(b[:, 8:24])
    q5 |= _bits(b[:, 4:8], 32) << 4
    q = q5.astype(np.float32)
    q *= _f16(b, 0)
    q += _f16(b, 2)
    return q


def _blocks_q8_0(b: np.ndarray) -> np.ndarray:
    # d f16 | qs int8[32]
    q = b[:, 2:34].view(np.int8).astype(np.float32)
    q *= _f16(b, 0)
    return q


# --- 256-value super-blocks (K-quants) ------------------------------------------------------------
_SHIFTS_2BIT = np.array([0, 2, 4, 6], np.uint8)


def _blocks_q2_k(b: np.ndarray) -> np.ndarray:
    # scales[16] (low nibble scale, high nibble min per 16 values) | qs[64] | d f16 | dmin f16
    # value (half h, shift j, l in 0..31) at h*128 + j*32 + l = 2-bit field j of qs[h*32 + l]
    n = len(b)
    qs = b[:, 16:80].reshape(n, 2, 1, 32)
    q = ((qs >> _SHIFTS_2BIT.reshape(1, 1, 4, 1)) & 3).astype(np.float32).reshape(n, 16, 16)
    scales = b[:, 0:16]
    dl = (scales & 0x0F).astype(np.float32)
    dl *= _f16(b, 80)
    ml = (scales >> 4).astype(np.float32)
    ml *= _f16(b, 82)
    q *= dl[:, :, None]
    q -= ml[:, :, None]
    return q.reshape(n, QK_K)


def _q3_k_scales(s: np.ndarray) -> np.ndarray:
    # 16 signed 6-bit scales: low 4 bits in nibbles of s[0..7], high 2 bits in 2-bit fields of s[8..11]
    i = np.arange(16)
    low = (s[:, i % 8] >> (4 * (i // 8)).astype(np.uint8)) & 0x0F
    high = (s[:, 8 + i % 4] >> (2 * (i // 4)).astype(np.uint8)) & 0x03
    scales = (low | (high << 4)).astype(np.float32)
    scales -= 32.0
    return scales


def _blocks_q3_k(b: np.ndarray) -> np.ndarray:
    # hmask[32] | qs[64] | scales[12] | d f16
    # value (h, j, l) at h*128 + j*32 + l: 2-bit field j of qs[h*32 + l], minus 4 unless bit
    # (h*4 + j) of hmask[l] is set
    n = len(b)
    hmask, qs = b[:, 0:32], b[:, 32:96]
    low = (qs.reshape(n, 2, 1, 32) >> _SHIFTS_2BIT.reshape(1, 1, 4, 1)) & 3
    high = (hmask.reshape(n, 1, 1, 32) >> np.arange(8, dtype=np.uint8).reshape(1, 2, 4, 1)) & 1
    # low + 4 * high is in 0..7; the value is that minus 4
    low |= high << 2
    q = low.astype(np.float32).reshape(n, 16, 16)
    q -= 4.0
    dl = _q3_k_scales(b[:, 96:108])
    dl *= _f16(b, 108)
    q *= dl[:, :, None]
    return q.reshape(n, QK_K)


def _k4_scales_mins(s: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    # 8 (scale, min) pairs of 6 bits in 12 bytes (ggml get_scale_min_k4):
    #   j < 4: scale = s[j] & 63, min = s[j+4] & 63
    #   j >= 4: scale = (s[j+4] & 15) | (s[j-4] >> 6) << 4, min = (s[j+4] >> 4) | (s[j] >> 6) << 4
    scales = np.concatenate([s[:, 0:4] & 63, (s[:, 8:12] & 0x0F) | ((s[:, 0:4] >> 6) << 4)], axis=1)
    mins = np.concatenate([s[:, 4:8] & 63, (s[:, 8:12] >> 4) | ((s[:, 4:8] >> 6) << 4)], axis=1)
    return scales.astype(np.float32), mins.astype(np.float32)


def _k_scale_and_subtract(b: np.ndarray, q: np.ndarray) -> np.ndarray:
    """Q4_K/Q5_K: value = d * scale_k * q - dmin * min_k for sub-block k; q is (n, 8, 32) float32."""
    scales, mins = _k4_scales_mins(b[:, 4:16])
    scales *= _f16(b, 0)
    mins *= _f16(b, 2)
    q *= scales[:, :, None]
    q -= mins[:, :, None]
    return q.reshape(len(b), QK_K)


def _blocks_q4_k(b: np.ndarray) -> np.ndarray:
    # d f16 | dmin f16 | scales[12] | qs[128]; sub-block k (32 values) of chunk c = k // 2 uses
    # the low (k even) or high (k odd) nibbles of qs[c*32 .. c*32+31]
    n = len(b)
    qs = b[:, 16:144].reshape(n, 4, 1, 32)
    q = ((qs >> np.array([0, 4], np.uint8).reshape(1, 1, 2, 1)) & 0x0F).astype(np.float32)
    return _k_scale_and_subtract(b, q.reshape(n, 8, 32))


def _blocks_q5_k(b: np.ndarray) -> np.ndarray:
    # d f16 | dmin f16 | scales[12] | qh[32] | qs[128]; as Q4_K plus a 5th bit: bit k of qh[l]
    # for value l of sub-block k
    n = len(b)
    qs = b[:, 48:176].reshape(n, 4, 1, 32)
    q5 = ((qs >> np.array([0, 4], np.uint8).reshape(1, 1, 2, 1)) & 0x0F).reshape(n, 8, 32)
    q5 |= (
        (b[:, 16:48].reshape(n, 1, 32) >> np.arange(8, dtype=np.uint8).reshape(1, 8, 1)) & 1
    ) << 4
    return _k_scale_and_subtract(b, q5.astype(np.float32))


def _blocks_q6_k(b: np.ndarray) -> np.ndarray:
    # ql[128] | qh[64] | scales int8[16] | d f16
    # value (h, k, l) at h*128 + k*32 + l: nibble (k // 2) of ql[h*64 + (k % 2)*32 + l] with
    # 2-bit field k of qh[h*32 + l] on top, minus 32; scale index = position // 16
    n = len(b)
    ql = b[:, 0:128].reshape(n, 2, 1, 2, 32)  # (h, nibble, k % 2, l)
    q6 = ((ql >> np.array([0, 4], np.uint8).reshape(1, 1, 2, 1, 1)) & 0x0F).reshape(n, 2, 4, 32)
    qh = b[:, 128:192].reshape(n, 2, 1, 32)
    q6 |= ((qh >> _SHIFTS_2BIT.reshape(1, 1, 4, 1)) & 3) << 4
    q = q6.astype(np.float32).reshape(n, 16, 16)
    q -= 32.0
    dl = b[:, 192:208].view(np.int8).astype(np.float32)  # (n, 16)
    dl *= _f16(b, 208)
    q *= dl[:, :, None]
    return q.reshape(n, QK_K)


_BLOCK_DEQUANTIZERS: dict[GGMLQuantizationType, Callable[[np.ndarray], np.ndarray]] = {
    Q.Q4_0: _blocks_q4_0,
    Q.Q4_1: _blocks_q4_1,
    Q.Q5_0: _blocks_q5_0,
    Q.Q5_1: _blocks_q5_1,
    Q.Q8_0: _blocks_q8_0,
    Q.Q2_K: _blocks_q2_k,
    Q.Q3_K: _blocks_q3_k,
    Q.Q4_K: _blocks_q4_k,
    Q.Q5_K: _blocks_q5_k,
    Q.Q6_K: _blocks_q6_k,
    **_IQ_DEQUANTIZERS,
}
FLOAT_TYPES = (Q.F32, Q.F16, Q.BF16)
SUPPORTED = (*FLOAT_TYPES, *_BLOCK_DEQUANTIZERS)


def dequantize_blocks(qtype: GGMLQuantizationType, blocks: np.ndarray) -> np.ndarray:
    """uint8 (n_blocks, type_size) -> float32 (n_blocks, block_size) for one block type."""
    try:
        fn = _BLOCK_DEQUANTIZERS[qtype]
    except KeyError:
        raise ValueError(
            f"{GGMLQuantizationType(qtype).name} is not a block type; block types: "
            f"{', '.join(t.name for t in _BLOCK_DEQUANTIZERS)}"
        ) from None
    return fn(np.ascontiguousarray(blocks, dtype=np.uint8))


def _floats(qtype: GGMLQuantizationType, data: np.ndarray) -> np.ndarray:
    if qtype == Q.F32:
        return np.asarray(data, dtype=np.float32)
    if qtype == Q.F16:
        return data.astype(np.float32)
    # BF16 is the top half of a float32 (stored as uint16 bit patterns, see engine/gguf.py).
    return (data.view(np.uint16).astype(np.uint32) << 16).view(np.float32)


def _dequantize_row_bytes(qtype: GGMLQuantizationType, rows: np.ndarray, cols: int) -> np.ndarray:
    """uint8 (n_rows, row_bytes) -> float32 (n_rows, cols)."""
    block_size, type_size = GGML_QUANT_SIZES[qtype]
    fn = _BLOCK_DEQUANTIZERS[qtype]
    blocks = rows.reshape(-1, type_size)
    out = np.empty((len(blocks), block_size), dtype=np.float32)
    step = max(1, _CHUNK_VALUES // block_size)
    for start in range(0, len(blocks), step):
        part = np.ascontiguousarray(blocks[start : start + step])
        out[start : start + len(part)] = fn(part)
    return out.reshape(len(rows), cols)


def _check(t: QTensor) -> None:
    if t.qtype not in SUPPORTED:
        raise ValueError(
            f"tensor {t.name!r} has type {t.qtype.name}; dequantizable types: "
            f"{', '.join(q.name for q in SUPPORTED)}"
        )


def dequantize(t: QTensor) -> np.ndarray:
    """The whole tensor as float32 in `t.shape` (a fresh array: for references and tests)."""
    _check(t)
    if t.qtype in FLOAT_TYPES:
        return np.array(_floats(t.qtype, t.data), dtype=np.float32).reshape(t.shape)
    rows = t.data.reshape(-1, t.data.shape[-1])
    return _dequantize_row_bytes(t.qtype, rows, t.cols).reshape(t.shape)


def dequantize_rows(t: QTensor, rows: np.ndarray) -> np.ndarray:
    """float32 (len(rows), cols) of the selected rows only, e.g. an embedding lookup."""
    _check(t)
    rows = np.asarray(rows, dtype=np.intp).reshape(-1)
    n_rows = t.rows
    if rows.size and (rows.min() < -n_rows or rows.max() >= n_rows):
        bad = rows[(rows < -n_rows) | (rows >= n_rows)][0]
        raise IndexError(f"row {bad} is out of range for tensor {t.name!r} with {n_rows} rows")
    if t.qtype in FLOAT_TYPES:
        return np.array(_floats(t.qtype, t.data.reshape(n_rows, t.cols)[rows]), dtype=np.float32)
    data = t.data.reshape(n_rows, -1)
    return _dequantize_row_bytes(t.qtype, data[rows], t.cols)
