"""numpy dequantizers of the codebook and ternary tensor types: IQ4_NL, IQ4_XS, MXFP4, TQ1_0,
TQ2_0, IQ3_S, IQ3_XXS, IQ2_XS, IQ2_XXS, IQ2_S, IQ1_S and IQ1_M.

Same contract as engine/quants.py (which registers these): `_blocks_<type>(blocks)` turns uint8
blocks (n_blocks, type_size) into float32 (n_blocks, block_size), following ggml's layouts
(ggml-common.h `block_*`, ggml-quants.c `dequantize_row_*`). The float operations are the ones
ggml does, in its order, so results are bit-identical to ggml and to gguf-py. Lookup tables are
in engine/quant_grids.py.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
from gguf import GGMLQuantizationType

from engine.quant_grids import IQ4NL_VALUES, KSIGNS, MXFP4_VALUES, grid

Q = GGMLQuantizationType
QK_K = 256
_IQ4NL = np.array(IQ4NL_VALUES, dtype=np.float32)
_MXFP4 = np.array(MXFP4_VALUES, dtype=np.float32)
_KSIGNS = np.array(KSIGNS, dtype=np.uint8)
_BIT = np.arange(8, dtype=np.uint8)


def _f16(blocks: np.ndarray, at: int) -> np.ndarray:
    """The fp16 field at byte `at` of every block as a float32 column (n_blocks, 1)."""
    return blocks[:, at : at + 2].copy().view("<f2").astype(np.float32)


def _u16(blocks: np.ndarray, at: int, count: int) -> np.ndarray:
    return blocks[:, at : at + 2 * count].copy().view("<u2")


def _u32(blocks: np.ndarray, at: int, count: int) -> np.ndarray:
    return blocks[:, at : at + 4 * count].copy().view("<u4")


def _nibbles(qs: np.ndarray) -> np.ndarray:
    """(n, 16k) bytes -> (n, 32k): per 16 bytes, the 16 low nibbles then the 16 high nibbles."""
    n = len(qs)
    q = qs.reshape(n, -1, 1, 16) >> np.array([0, 4], np.uint8).reshape(1, 1, 2, 1)
    return (q & 0x0F).reshape(n, -1)


def _grid_f32(name: str) -> np.ndarray:
    return grid(name).astype(np.float32)


def _sign_bits(bytes_: np.ndarray) -> np.ndarray:
    """(n, k) sign bytes -> (n, 8k) float32 +1 / -1, bit j of byte i for value 8i + j."""
    bits = (bytes_[:, :, None] >> _BIT) & 1
    return np.where(bits == 0, np.float32(1), np.float32(-1)).reshape(len(bytes_), -1)


def _half_scales(scale_bytes: np.ndarray) -> np.ndarray:
    """(n, k) bytes of two 4-bit scales (low nibble first) -> (n, 2k) float32."""
    s = scale_bytes[:, :, None] >> np.array([0, 4], np.uint8)
    return (s & 0x0F).reshape(len(scale_bytes), -1).astype(np.float32)


# --- 4-bit codebooks ------------------------------------------------------------------------------
def _blocks_iq4_nl(b: np.ndarray) -> np.ndarray:
    # d f16 | qs[16]: value i = d * kvalues_iq4nl[nibble_i]
    q = _IQ4NL[_nibbles(b[:, 2:18])]
    q *= _f16(b, 0)
    return q


def _blocks_iq4_xs(b: np.ndarray) -> np.ndarray:
    # d f16 | scales_h u16 | scales_l[4] | qs[128]; 32-value sub-block j has the 6-bit scale
    # (nibble j of scales_l) | (2-bit field j of scales_h) << 4, minus 32, and qs[16j..16j+15]
    n = len(b)
    low = _half_scales(b[:, 4:8]).astype(np.uint8)
    high = (_u16(b, 2, 1) >> (2 * np.arange(8, dtype=np.uint16))) & 3
    scales = (low | (high.astype(np.uint8) << 4)).astype(np.float32) - np.float32(32)
    dl = _f16(b, 0) * scales  # (n, 8)
    q = _IQ4NL[_nibbles(b[:, 8:136])].reshape(n, 8, 32)
    q *= dl[:, :, None]
    return q.reshape(n, QK_K)


def e8m0_half(e: np.ndarray) -> np.ndarray:
    """The e8m0 exponent byte as float32 2^(e-128) (ggml_e8m0_to_fp32_half; subnormal below 2)."""
    e32 = e.astype(np.uint32)
    bits = np.where(e32 < 2, np.uint32(0x00200000) << e32, (e32 - 1) << np.uint32(23))
    return bits.astype(np.uint32).view(np.float32)


def _blocks_mxfp4(b: np.ndarray) -> np.ndarray:
    # e e8m0 | qs[16]: value i = e8m0_half(e) * kvalues_mxfp4[nibble_i]
    q = _MXFP4[_nibbles(b[:, 1:17])]
    q *= e8m0_half(b[:, 0:1])
    return q


# --- ternary --------------------------------------------------------------------------------------
_POW3 = np.array([1, 3, 9, 27, 81], dtype=np.uint8)


def _trits(packed: np.ndarray, digits: int) -> np.ndarray:
    """(n, k) bytes of base-3 digits in fixed point -> (n, digits * k) in 0..2: digit m of every
    byte first (m = 0..digits-1); digit m is the top of (byte * 3^m mod 256) * 3 >> 8."""
    n = len(packed)
    shifted = packed[:, None, :] * _POW3[:digits, None]  # uint8: wraps mod 256 as in ggml
    return ((shifted.astype(np.uint16) * 3) >> 8).reshape(n, -1)


def tq1_0_values(b: np.ndarray) -> np.ndarray:
    """(n, 256) uint16 values in 0..2 (the weight is d * (value - 1)) of TQ1_0 blocks."""
    # qs[48] | qh[4] | d f16: qs[0..31] hold 5 digits of 32 values each, qs[32..47] 5 of 16,
    # qh 4 of 4
    return np.concatenate(
        [_trits(b[:, 0:32], 5), _trits(b[:, 32:48], 5), _trits(b[:, 48:52], 4)], axis=1
    )


def _blocks_tq1_0(b: np.ndarray) -> np.ndarray:
    q = tq1_0_values(b).astype(np.float32)
    q -= 1.0
    q *= _f16(b, 52)
    return q


def _blocks_tq2_0(b: np.ndarray) -> np.ndarray:
    # qs[64] | d f16: value (h, j, l) at h*128 + j*32 + l is 2-bit field j of qs[h*32 + l], minus 1
    n = len(b)
    qs = b[:, 0:64].reshape(n, 2, 1, 32) >> np.array([0, 2, 4, 6], np.uint8).reshape(1, 1, 4, 1)
    q = (qs & 3).astype(np.float32).reshape(n, QK_K)
    q -= 1.0
    q *= _f16(b, 64)
    return q


# --- grid types: sign-free grid rows, one index per 8 (IQ2/IQ1) or 4 (IQ3) values -----------------
def _ksign_values(sign_indices: np.ndarray) -> np.ndarray:
    """(n, k) 7-bit ksigns indices -> (n, 8k) float32 +1 / -1."""
    return _sign_bits(_KSIGNS[sign_indices])


def _grid_product(db: np.ndarray, rows: np.ndarray, signs: np.ndarray, per_scale: int):
    """db (n, s) * grid rows (n, s * per_scale) * signs, in ggml's order ((db * grid) * sign)."""
    n = len(db)
    q = rows.reshape(n, db.shape[1], per_scale) * db[:, :, None]
    q *= signs.reshape(q.shape)
    return q.reshape(n, -1)


def _blocks_iq2_xxs(b: np.ndarray) -> np.ndarray:
    # d f16 | 8 x (u32 grid bytes: 4 indices, u32: 4 x 7-bit sign indices, 4-bit scale on top)
    n = len(b)
    aux = _u32(b, 2, 16).reshape(n, 8, 2)
    db = _f16(b, 0) * (np.float32(0.5) + (aux[:, :, 1] >> 28).astype(np.float32))
    db *= np.float32(0.25)
    idx = b[:, 2:66].reshape(n, 8, 8)[:, :, 0:4].reshape(n, 32)
    signs = (aux[:, :, 1:2] >> np.array([0, 7, 14, 21], np.uint32)) & 0x7F
    rows = _grid_f32("IQ2_XXS")[idx]
    return _grid_product(db, rows, _ksign_values(signs.reshape(n, 32)), 32)


def _blocks_iq2_xs(b: np.ndarray) -> np.ndarray:
    # d f16 | qs u16[32] (9-bit grid index, 7-bit ksigns index) | scales[8]: a 4-bit scale per 16
    qs = _u16(b, 2, 32)
    db = _f16(b, 0) * (np.float32(0.5) + _half_scales(b[:, 66:74])) * np.float32(0.25)
    rows = _grid_f32("IQ2_XS")[qs & 511]
    return _grid_product(db, rows, _ksign_values(qs >> 9), 16)


def _blocks_iq2_s(b: np.ndarray) -> np.ndarray:
    # d f16 | qs[32] (low 8 index bits) | signs[32] | qh[8] (2 high bits per index) | scales[8]
    n = len(b)
    high = (b[:, 66:74, None] >> np.array([0, 2, 4, 6], np.uint8)) & 3
    idx = b[:, 2:34].astype(np.uint16) | (high.reshape(n, 32).astype(np.uint16) << 8)
    db = _f16(b, 0) * (np.float32(0.5) + _half_scales(b[:, 74:82])) * np.float32(0.25)
    rows = _grid_f32("IQ2_S")[idx]
    return _grid_product(db, rows, _sign_bits(b[:, 34:66]), 16)


def _blocks_iq3_xxs(b: np.ndarray) -> np.ndarray:
    # d f16 | qs[64] (grid indices, 4 values each) | u32[8]: 4 x 7-bit ksigns indices + scale
    n = len(b)
    aux = _u32(b, 66, 8)
    db = _f16(b, 0) * (np.float32(0.5) + (aux >> 28).astype(np.float32)) * np.float32(0.5)
    signs = (aux[:, :, None] >> np.array([0, 7, 14, 21], np.uint32)) & 0x7F
    rows = _grid_f32("IQ3_XXS")[b[:, 2:66]]
    return _grid_product(db, rows, _ksign_values(signs.reshape(n, 32)), 32)


def _blocks_iq3_s(b: np.ndarray) -> np.ndarray:
    # d f16 | qs[64] | qh[8] (9th index bit) | signs[32] | scales[4]: odd scale 1 + 2s per 32
    n = len(b)
    high = (b[:, 66:74, None] >> _BIT) & 1
    idx = b[:, 2:66].astype(np.uint16) | (high.reshape(n, 64).astype(np.uint16) << 8)
    scales = _half_scales(b[:, 106:110]).astype(np.uint8)
    db = _f16(b, 0) * (1 + 2 * scales)
    rows = _grid_f32("IQ3_S")[idx]
    return _grid_product(db, rows, _sign_bits(b[:, 74:106]), 32)


IQ1_DELTA = np.float32(0.125)


def _blocks_iq1_s(b: np.ndarray) -> np.ndarray:
    # d f16 | qs[32] (low 8 index bits) | qh u16[8]: per 32 values, 4 x 3 high index bits, a
    # 3-bit odd scale, the delta's sign on top; value = d * (2s + 1) * (grid +- 1/8)
    n = len(b)
    qh = _u16(b, 34, 8)
    dl = _f16(b, 0) * (2 * ((qh >> 12) & 7) + 1)
    delta = np.where(qh & 0x8000 == 0, IQ1_DELTA, -IQ1_DELTA)
    high = (qh[:, :, None] >> np.array([0, 3, 6, 9], np.uint16)) & 7
    idx = b[:, 2:34].astype(np.uint16) | (high.reshape(n, 32) << 8)
    q = _grid_f32("IQ1_S")[idx].reshape(n, 8, 32)
    q += delta[:, :, None]
    q *= dl[:, :, None]
    return q.reshape(n, QK_K)


def iq1_m_scale(b: np.ndarray) -> np.ndarray:
    """The fp16 super-block scale of IQ1_M, stored in the top nibbles of its 4 scale words."""
    s = _u16(b, 48, 4)
    bits = (s[:, 0] >> 12) | ((s[:, 1] >> 8) & 0xF0) | ((s[:, 2] >> 4) & 0xF00) | (s[:, 3] & 0xF000)
    return bits.astype(np.uint16).view("<f2").astype(np.float32).reshape(-1, 1)


def _blocks_iq1_m(b: np.ndarray) -> np.ndarray:
    # qs[32] | qh[16] (per nibble: 3 high index bits, delta sign) | scales u16[4] (4 x 3-bit
    # scales each, one per 16 values, plus a nibble of d): value = d * (2s + 1) * (grid +- 1/8)
    n = len(b)
    s = _u16(b, 48, 4)
    scales = ((s[:, :, None] >> np.array([0, 3, 6, 9], np.uint16)) & 7).reshape(n, 16)
    dl = iq1_m_scale(b) * (2 * scales + 1)
    nib = (b[:, 32:48, None] >> np.array([0, 4], np.uint8)).reshape(n, 32)
    idx = b[:, 0:32].astype(np.uint16) | ((nib & 7).astype(np.uint16) << 8)
    delta = np.where(nib & 0x08 == 0, IQ1_DELTA, -IQ1_DELTA)
    q = _grid_f32("IQ1_S")[idx]  # (n, 32, 8)
    q += delta[:, :, None]
    q = q.reshape(n, 16, 16)
    q *= dl[:, :, None]
    return q.reshape(n, QK_K)


BLOCK_DEQUANTIZERS: dict[GGMLQuantizationType, Callable[[np.ndarray], np.ndarray]] = {
    Q.IQ4_NL: _blocks_iq4_nl,
    Q.IQ4_XS: _blocks_iq4_xs,
    Q.MXFP4: _blocks_mxfp4,
    Q.TQ1_0: _blocks_tq1_0,
    Q.TQ2_0: _blocks_tq2_0,
    Q.IQ3_S: _blocks_iq3_s,
    Q.IQ3_XXS: _blocks_iq3_xxs,
    Q.IQ2_XS: _blocks_iq2_xs,
    Q.IQ2_XXS: _blocks_iq2_xxs,
    Q.IQ2_S: _blocks_iq2_s,
    Q.IQ1_S: _blocks_iq1_s,
    Q.IQ1_M: _blocks_iq1_m,
}
