"""What a quant type's unpacker hands the mat-mul template (engine/kernels/quant_matmul.py) for
each 32 weights of a block; shared by the classic/K-quant unpackers and engine/kernels/quant_iq.py.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class Chunk:
    """32 unpacked weights: value_i = s_h * (u_i - offset) + b_h for half h = i // 16.

    A constant integer `offset` is folded into the integer dot product (its accumulator starts
    at -offset * sum(a), computed once per token and shared by all rows of the tile); the float
    term b_h (per-row mins of Q4_1/Q5_1/Q2_K/Q4_K/Q5_K) costs two scalar fmas per row and token.
    """

    u: str  # <32 x i8>, unsigned values (or |q| when signed_src is set)
    s: tuple[str, str]
    b: tuple[str, str] | None  # None: no float offset term
    # <32 x i8> whose negative lanes negate the weight (Q8_0: the signed value; codebook types:
    # a sign mask): that sign moves onto the activation, so u stays unsigned
    signed_src: str | None = None
    offset: int = 0
