"""Random quantized blocks for tests and benches: every bit pattern of a block is valid, except
that scale fields must be finite for the oracles to compare values (inf/nan would hide bugs)."""

from __future__ import annotations

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

Q = GGMLQuantizationType

# Byte offsets of the fp16 scale fields in each block layout (ggml-common.h).
FP16_FIELDS = {
    Q.Q4_0: (0,),
    Q.Q4_1: (0, 2),
    Q.Q5_0: (0,),
    Q.Q5_1: (0, 2),
    Q.Q8_0: (0,),
    Q.Q2_K: (80, 82),
    Q.Q3_K: (108,),
    Q.Q4_K: (0, 2),
    Q.Q5_K: (0, 2),
    Q.Q6_K: (208,),
    Q.IQ4_NL: (0,),
    Q.IQ4_XS: (0,),
    Q.MXFP4: (),  # e8m0 exponent byte instead, see random_blocks
    Q.TQ1_0: (52,),
    Q.TQ2_0: (64,),
    Q.IQ3_S: (0,),
    Q.IQ3_XXS: (0,),
    Q.IQ2_XS: (0,),
    Q.IQ2_XXS: (0,),
    Q.IQ2_S: (0,),
    Q.IQ1_S: (0,),
    Q.IQ1_M: (),  # fp16 split over the top nibbles of 4 words, see random_blocks
}


def random_blocks(
    rng: np.random.Generator, qtype: GGMLQuantizationType, n_blocks: int
) -> np.ndarray:
    """Random bytes (every bit pattern is a valid block) with finite fp16 scales of both signs."""
    type_size = GGML_QUANT_SIZES[qtype][1]
    blocks = rng.integers(0, 256, size=(n_blocks, type_size), dtype=np.uint8)
    for at in FP16_FIELDS[qtype]:
        scale = rng.standard_normal((n_blocks, 1)).astype(np.float16)
        blocks[:, at : at + 2] = scale.view(np.uint8)
    if qtype == Q.MXFP4:
        # e8m0 exponents 2^-28..2^11 (an exponent near 255 would overflow to inf), plus the
        # two subnormal codes 0 and 1
        blocks[:, 0] = rng.integers(100, 140, size=n_blocks)
        blocks[: min(2, n_blocks), 0] = [0, 1][:n_blocks]
    if qtype == Q.IQ1_M:
        # the fp16 scale's nibbles sit at the top of the u16 words at bytes 48, 50, 52, 54
        scale = rng.standard_normal(n_blocks).astype(np.float16).view(np.uint16)
        for k in range(4):
            word = blocks[:, 48 + 2 * k : 50 + 2 * k].copy().view("<u2")[:, 0]
            word = (word & 0x0FFF) | (((scale >> (4 * k)) & 0xF) << 12)
            blocks[:, 48 + 2 * k : 50 + 2 * k] = word.astype("<u2").view(np.uint8).reshape(-1, 2)
    return blocks


def scale_down(qtype, blocks: np.ndarray) -> None:
    """Keep the random weights' scales near 1 (as the K-quant weights here): MXFP4's e8m0
    exponents to 2^-8..2^4, other fp16 scales unchanged (standard normal)."""
    if qtype == Q.MXFP4:
        blocks[:, 0] = 120 + blocks[:, 0] % 12
