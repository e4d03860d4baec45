"""Element layouts of KV cache rows: float16, or ggml's q8_0 (8-bit, half the bytes).

A row is the head_dim values of one (position, kv head). q8_0 packs each 32 values as a
block_q8_0: a float16 scale d = max|x| / 127, then 32 int8 q = round(x / d) (llama.cpp's
quantize_row_q8_0_ref, ties away from zero); value = d * q. A q8_0 row is therefore
head_dim / 32 * 34 bytes against 2 * head_dim for float16 (0.53x).
"""

from __future__ import annotations

import numpy as np

Q8_0_BLOCK = 32
Q8_0_BLOCK_BYTES = 34  # float16 scale + 32 int8


def q8_0_row_bytes(head_dim: int) -> int:
    return head_dim // Q8_0_BLOCK * Q8_0_BLOCK_BYTES


def quantize_q8_0(x: np.ndarray) -> np.ndarray:
    """float (..., head_dim) with head_dim a multiple of 32 -> uint8 (..., head_dim/32*34)."""
    *lead, head_dim = x.shape
    blocks = np.asarray(x, np.float32).reshape(-1, Q8_0_BLOCK)
    amax = np.abs(blocks).max(axis=1, keepdims=True)
    d = amax / np.float32(127.0)
    inv = np.divide(np.float32(1.0), d, out=np.zeros_like(d), where=d != 0)
    q = np.trunc(blocks * inv + np.copysign(np.float32(0.5), blocks))  # roundf: ties away
    packed = np.empty((blocks.shape[0], Q8_0_BLOCK_BYTES), np.uint8)
    packed[:, :2] = d.astype(np.float16).view(np.uint8)
    packed[:, 2:] = np.clip(q, -127, 127).astype(np.int8).view(np.uint8)
    return packed.reshape(*lead, q8_0_row_bytes(head_dim))


def dequantize_q8_0(rows: np.ndarray, head_dim: int) -> np.ndarray:
    """uint8 (..., head_dim/32*34) -> float32 (..., head_dim)."""
    *lead, _ = rows.shape
    blocks = np.ascontiguousarray(rows).reshape(-1, Q8_0_BLOCK_BYTES)
    d = blocks[:, :2].copy().view(np.float16).astype(np.float32)
    q = blocks[:, 2:].view(np.int8).astype(np.float32)
    return (q * d).reshape(*lead, head_dim)


def element_layout(cache: np.ndarray, head_dim: int) -> str | None:
    """ "f16" or "q8_0" for a (capacity, n_kv, row) cache array of head_dim-value rows, None
    for anything else."""
    if cache.dtype == np.float16 and cache.shape[-1] == head_dim:
        return "f16"
    if (
        cache.dtype == np.uint8
        and head_dim % Q8_0_BLOCK == 0
        and cache.shape[-1] == q8_0_row_bytes(head_dim)
    ):
        return "q8_0"
    return None


def as_float(cache: np.ndarray, head_dim: int) -> np.ndarray:
    """The cache's values as float32 (..., head_dim), whichever the layout."""
    layout = element_layout(cache, head_dim)
    if layout == "f16":
        return cache.astype(np.float32)
    if layout == "q8_0":
        return dequantize_q8_0(cache, head_dim)
    raise ValueError(
        f"KV cache of {cache.dtype} rows of {cache.shape[-1]} is neither float16 nor q8_0 "
        f"for head_dim {head_dim}"
    )
