"""Unpackers for the codebook, ternary and MXFP4 types, for the mat-mul template in
engine/kernels/quant_matmul.py (see its docstring for the int8-activation design).

Each `unpack_<type>(f, blk, c, isa)` turns values 32c..32c+31 of the block at `blk` into a Chunk:
    weight_i = s_h * sign_i * (u_i - offset)     (sign_i = -1 where signed_src is negative)
with u unsigned bytes. How each family gets there:
  * IQ4_NL / IQ4_XS / MXFP4: a nibble indexes a 16-entry signed codebook (`vpshufb` on AVX2 and
    VNNI, a select chain in generic IR); u = |value|, the value itself is the sign source;
  * TQ2_0 / TQ1_0: ternary digits 0..2 with offset 1 (TQ1_0 packs 5 base-3 digits per byte in
    fixed point: digit m of byte q is ((q * 3^m mod 256) * 3) >> 8);
  * IQ2 / IQ3: each 8 (IQ2) or 4 (IQ3) values are one row of a grid of unsigned magnitudes,
    loaded from a constant table in the module; signs come from explicit sign bytes or from a
    7-bit index into ksigns, expanded here to a table of 0x00/0xFF byte masks. On the VNNI
    and AVX2 paths the grid types decode a super-block's side data (scales, signs, wide row
    indices) once with vector code instead (engine/kernels/quant_iq_vnni.py,
    engine/kernels/quant_iq_avx2.py); this per-chunk code is the generic path's;
  * IQ1_S / IQ1_M: grid values g in {-1, 0, 1} plus a per-8 or per-32 delta of +-1/8 become
    exact integers u = 8g + 8*delta + 9 (offset 9, scale d/8): the grid table stores 8(g + 1)
    and the delta adds 0 or 2 to every byte of an 8-value row.
Tables come from engine/quant_grids.py (ggml-common.h's values).
"""

from __future__ import annotations

import functools

import numpy as np

from engine.kernels import quant_iq_avx2, quant_iq_vnni
from engine.kernels.ir import Fn, f32, mask, splat
from engine.kernels.quant_chunk import Chunk
from engine.quant_grids import IQ4NL_VALUES, KSIGNS, MXFP4_VALUES, grid

V32I8 = "<32 x i8>"

# name -> (weights per block, bytes per block), as ggml-common.h's block_* structs
LAYOUTS_IQ = {
    "IQ4_NL": (32, 18),
    "IQ4_XS": (256, 136),
    "MXFP4": (32, 17),
    "TQ2_0": (256, 66),
    "TQ1_0": (256, 54),
    "IQ3_S": (256, 110),
    "IQ3_XXS": (256, 98),
    "IQ2_XS": (256, 74),
    "IQ2_XXS": (256, 66),
    "IQ2_S": (256, 82),
    "IQ1_S": (256, 50),
    "IQ1_M": (256, 56),
}

# Weight rows per tile for the grid types (the others use quant_matmul.ROWS = 4), per ISA.
# Scalar table loads (AVX2, generic): one row; with 4 rows of a super-block in one loop body
# LLVM hoists every row's index math and spills to the stack (1.5-3x slower per call, 2048 x
# 2048 decode mat-vec). The VNNI path decodes a block in vector registers, which leaves room
# for rows that share each activation load and hide each other's lookup latency; measured
# side by side (1 vs 2 vs 4 rows, bench/RESULTS.md), best per type. AVX2 with its block-level
# decoding (quant_iq_avx2.py), 1 vs 2 rows in three runs: IQ3_S 6-10% and IQ1_S 6-9% faster at
# 2, IQ2_XS and IQ2_S 7-9% slower, the others within 2%; so 2 for IQ3_S and IQ1_S only.
GRID_TYPES = ("IQ3_S", "IQ3_XXS", "IQ2_XS", "IQ2_XXS", "IQ2_S", "IQ1_S", "IQ1_M")
_TILE_ROWS_VNNI = {
    "IQ3_S": 4,
    "IQ3_XXS": 4,
    "IQ2_XXS": 4,
    "IQ2_XS": 2,
    "IQ2_S": 4,
    "IQ1_S": 2,
    "IQ1_M": 4,
}
TILE_ROWS_IQ = {
    "vnni": _TILE_ROWS_VNNI,
    "avx2": {**dict.fromkeys(GRID_TYPES, 1), "IQ3_S": 2, "IQ1_S": 2},
    "generic": dict.fromkeys(GRID_TYPES, 1),
}


def tile_rows_iq(qname: str, isa: str) -> int | None:
    """Rows per tile for `qname` on `isa`, or None for the template's default."""
    return TILE_ROWS_IQ[isa].get(qname)


DECLARATIONS_IQ = f"""
declare {V32I8} @llvm.x86.avx2.pshuf.b({V32I8}, {V32I8})
declare {V32I8} @llvm.abs.v32i8({V32I8}, i1)
{quant_iq_vnni.DECLARATIONS_VNNI}"""


# --- constant tables in the module ----------------------------------------------------------------
def _i64_rows(rows: np.ndarray) -> list[int]:
    """(n, 8) bytes -> n little-endian i64 constants (signed, as LLVM's text form wants)."""
    return [int(v) for v in np.ascontiguousarray(rows, dtype=np.uint8).view("<i8").reshape(-1)]


def _i32_rows(rows: np.ndarray) -> list[int]:
    return [int(v) for v in np.ascontiguousarray(rows, dtype=np.uint8).view("<i4").reshape(-1)]


@functools.cache
def _tables() -> dict[str, tuple[str, list[int]]]:
    """global name -> (element type, values)."""
    ksigns = np.array(KSIGNS, dtype=np.uint8)
    sign_masks = np.where((ksigns[:, None] >> np.arange(8)) & 1, 0xFF, 0).astype(np.uint8)
    iq1 = (8 * (grid("IQ1_S") + 1)).astype(np.uint8)
    return {
        "ksign_masks": ("i64", _i64_rows(sign_masks)),
        "grid_IQ2_XXS": ("i64", _i64_rows(grid("IQ2_XXS").astype(np.uint8))),
        "grid_IQ2_XS": ("i64", _i64_rows(grid("IQ2_XS").astype(np.uint8))),
        "grid_IQ2_S": ("i64", _i64_rows(grid("IQ2_S").astype(np.uint8))),
        "grid_IQ3_XXS": ("i32", _i32_rows(grid("IQ3_XXS").astype(np.uint8))),
        "grid_IQ3_S": ("i32", _i32_rows(grid("IQ3_S").astype(np.uint8))),
        "grid_IQ1": ("i64", _i64_rows(iq1)),
    }


_TABLES_OF = {
    "IQ2_XXS": ("ksign_masks", "grid_IQ2_XXS"),
    "IQ2_XS": ("ksign_masks", "grid_IQ2_XS"),
    "IQ2_S": ("grid_IQ2_S",),
    "IQ3_XXS": ("ksign_masks", "grid_IQ3_XXS"),
    "IQ3_S": ("grid_IQ3_S",),
    "IQ1_S": ("grid_IQ1",),
    "IQ1_M": ("grid_IQ1",),
}


def globals_ir(qname: str) -> str:
    """The declarations and constant tables the module of `qname` needs."""
    tables = _tables()
    lines = [DECLARATIONS_IQ]
    for name in _TABLES_OF.get(qname, ()):
        ty, values = tables[name]
        body = ", ".join(f"{ty} {v}" for v in values)
        lines.append(f"@{name} = internal unnamed_addr constant [{len(values)} x {ty}] [{body}]")
    return "\n".join(lines) + "\n"


def _table_row(f: Fn, name: str, idx: str) -> str:
    ty, values = _tables()[name]
    p = f.op(f"getelementptr inbounds [{len(values)} x {ty}], ptr @{name}, i64 0, i64 {idx}", "gp")
    # volatile keeps the lookups scalar: the SLP vectoriser otherwise merges a chunk's 4-8
    # lookups into one vpgather, much slower than plain loads here
    return f.op(f"load volatile {ty}, ptr {p}, align {8 if ty == 'i64' else 4}", "g")


def _vector_of(f: Fn, ty: str, parts: list[str]) -> str:
    """<32 x i8> made of the i64 (4) or i32 (8) scalars `parts`, lowest lanes first."""
    vec = "poison"
    vt = f"<{len(parts)} x {ty}>"
    for k, p in enumerate(parts):
        vec = f.op(f"insertelement {vt} {vec}, {ty} {p}, i32 {k}")
    return f.op(f"bitcast {vt} {vec} to {V32I8}")


# --- scalar helpers -------------------------------------------------------------------------------
def _u8(f: Fn, blk: str, off: int) -> str:
    return f.load("i8", f.gep(blk, off), 1, "b")


def _u32(f: Fn, blk: str, off: int) -> str:
    return f.load("i32", f.gep(blk, off), 1, "w")


def _field(f: Fn, ty: str, v: str, shift: int, bits: int) -> str:
    """(v >> shift) & (2^bits - 1), zero-extended to i64 (a table index)."""
    x = f.op(f"lshr {ty} {v}, {shift}") if shift else v
    if not (ty == "i8" and bits == 8):  # a whole byte needs no mask (and i8 has no 255)
        x = f.op(f"and {ty} {x}, {(1 << bits) - 1}")
    return x if ty == "i64" else f.op(f"zext {ty} {x} to i64", "ix")


def _to_float(f: Fn, ty: str, v: str) -> str:
    return f.op(f"uitofp {ty} {v} to float", "uf")


def _fmul(f: Fn, a: str, b: str) -> str:
    return f.op(f"fmul float {a}, {b}", "fm")


def _sign_mask_bits(f: Fn, bits_i32: str) -> str:
    """i32 of sign bits (bit i for value i) -> <32 x i8>, -1 where the bit is set. Spelled out
    as byte broadcast + bit test (vpshufb, vpand, vpcmpeqb): without AVX-512 mask registers
    LLVM turned a bitcast to <32 x i1> into 32 scalar bit tests and byte inserts."""
    v = f.op(
        f"bitcast <1 x i32> {f.op(f'insertelement <1 x i32> poison, i32 {bits_i32}, i32 0')} to <4 x i8>"
    )
    spread = f.op(
        f"shufflevector <4 x i8> {v}, <4 x i8> poison, {mask([i // 8 for i in range(32)])}"
    )
    bit = _vconst([1 << (i % 8) for i in range(32)])
    hit = f.op(f"icmp eq {V32I8} {f.op(f'and {V32I8} {spread}, {bit}')}, {bit}")
    return f.op(f"sext <32 x i1> {hit} to {V32I8}")


# --- 16-entry codebooks ---------------------------------------------------------------------------
def _nibbles(f: Fn, ptr: str) -> str:
    """16 bytes -> 32 indices: low nibbles then high nibbles."""
    q = f.load("<16 x i8>", ptr)
    lo = f.op(f"and <16 x i8> {q}, {splat(16, 'i8', 15)}")
    hi = f.op(f"lshr <16 x i8> {q}, {splat(16, 'i8', 4)}")
    return f.op(f"shufflevector <16 x i8> {lo}, <16 x i8> {hi}, {mask(range(32))}")


def _lookup16(f: Fn, isa: str, idx: str, table: tuple[int, ...]) -> str:
    """<32 x i8> table[idx] for indices 0..15."""
    if isa in ("vnni", "avx2"):
        # vpshufb looks up within each 128-bit lane: the table is repeated in both
        tv = "<" + ", ".join(f"i8 {v}" for v in table * 2) + ">"
        return f.op(f"call {V32I8} @llvm.x86.avx2.pshuf.b({V32I8} {tv}, {V32I8} {idx})", "lut")
    out = splat(32, "i8", table[0])
    for k in range(1, 16):
        hit = f.op(f"icmp eq {V32I8} {idx}, {splat(32, 'i8', k)}")
        out = f.op(f"select <32 x i1> {hit}, {V32I8} {splat(32, 'i8', table[k])}, {V32I8} {out}")
    return out


def _codebook_chunk(f: Fn, isa: str, idx: str, table: tuple[int, ...], s: str) -> Chunk:
    q = _lookup16(f, isa, idx, table)
    u = f.op(f"call {V32I8} @llvm.abs.v32i8({V32I8} {q}, i1 false)")
    return Chunk(u, (s, s), None, signed_src=q)


def unpack_iq4_nl(f, blk, c, isa):
    return _codebook_chunk(f, isa, _nibbles(f, f.gep(blk, 2)), IQ4NL_VALUES, f.half_to_float(blk))


def unpack_iq4_xs(f, blk, c, isa):
    d = f.half_to_float(blk)
    low = f.op(f"lshr i8 {_u8(f, blk, 4 + c // 2)}, {4 * (c % 2)}")
    low = f.op(f"and i8 {low}, 15")
    high = f.op(f"lshr i8 {_u8(f, blk, 2 + c // 4)}, {2 * (c % 4)}")
    high = f.op(f"shl i8 {high}, 4")  # bits 6-7 fall off: the 2-bit field lands in bits 4-5
    sc = f.op(f"or i8 {low}, {f.op(f'and i8 {high}, 48')}")
    sc = f.op(f"sub i8 {sc}, 32")
    s = _fmul(f, d, f.op(f"sitofp i8 {sc} to float", "sf"))
    return _codebook_chunk(f, isa, _nibbles(f, f.gep(blk, 8 + 16 * c)), IQ4NL_VALUES, s)


def _e8m0_half(f: Fn, e8: str) -> str:
    """float 2^(e - 128) of an e8m0 byte (ggml_e8m0_to_fp32_half: subnormal for e < 2)."""
    e = f.op(f"zext i8 {e8} to i32")
    sub = f.op(f"shl i32 2097152, {e}")  # 0x00200000 << e
    norm = f.op(f"shl i32 {f.op(f'sub i32 {e}, 1')}, 23")
    small = f.op(f"icmp ult i32 {e}, 2")
    bits = f.op(f"select i1 {small}, i32 {sub}, i32 {norm}")
    return f.op(f"bitcast i32 {bits} to float", "f")


def unpack_mxfp4(f, blk, c, isa):
    d = _e8m0_half(f, _u8(f, blk, 0))
    return _codebook_chunk(f, isa, _nibbles(f, f.gep(blk, 1)), MXFP4_VALUES, d)


# --- ternary ------------------------------------------------------------------------------------
def unpack_tq2_0(f, blk, c, isa):
    n, j = divmod(c, 4)
    q = f.load(V32I8, f.gep(blk, 32 * n))
    if j:
        q = f.op(f"lshr {V32I8} {q}, {splat(32, 'i8', 2 * j)}")
    u = f.op(f"and {V32I8} {q}, {splat(32, 'i8', 3)}")
    d = f.half_to_float(f.gep(blk, 64))
    return Chunk(u, (d, d), None, offset=1)


def _vconst(values) -> str:
    return "<" + ", ".join(f"i8 {int(v)}" for v in values) + ">"


def unpack_tq1_0(f, blk, c, isa):
    # values 0..159: digit m of qs[0..31] at 32m + l; 160..239: digit m of qs[32..47] at
    # 160 + 16m + l; 240..255: digit m of qh[0..3] at 240 + 4m + l
    if c < 5:
        v = f.load(V32I8, blk)
        mult = [3**c] * 32
    else:
        q16 = f.load("<16 x i8>", f.gep(blk, 32))
        if c < 7:
            v = f.op(
                f"shufflevector <16 x i8> {q16}, <16 x i8> poison, {mask(list(range(16)) * 2)}"
            )
            m0 = 2 * (c - 5)
            mult = [3**m0] * 16 + [3 ** (m0 + 1)] * 16
        else:
            qh = f.load("<4 x i8>", f.gep(blk, 48))
            qh16 = f.op(f"shufflevector <4 x i8> {qh}, <4 x i8> poison, {mask(list(range(4)) * 4)}")
            v = f.op(f"shufflevector <16 x i8> {q16}, <16 x i8> {qh16}, {mask(range(32))}")
            mult = [81] * 16 + [3**m for m in range(4) for _ in range(4)]
    shifted = f.op(f"mul {V32I8} {v}, {_vconst(mult)}")  # wraps mod 256, as ggml's uint8 math
    wide = f.op(f"zext {V32I8} {shifted} to <32 x i16>")
    wide = f.op(f"mul <32 x i16> {wide}, {splat(32, 'i16', 3)}")
    wide = f.op(f"lshr <32 x i16> {wide}, {splat(32, 'i16', 8)}")
    u = f.op(f"trunc <32 x i16> {wide} to {V32I8}")
    d = f.half_to_float(f.gep(blk, 52))
    return Chunk(u, (d, d), None, offset=1)


# --- IQ2 / IQ3 grids ------------------------------------------------------------------------------
def _half_scale(f: Fn, blk: str, off: int, h: int, d: str, factor: float) -> str:
    """d * (0.5 + nibble h of byte `off`) * factor (IQ2_XS / IQ2_S / IQ2_XXS-style scales)."""
    nib = f.op(f"and i8 {f.op(f'lshr i8 {_u8(f, blk, off)}, {4 * h}')}, 15")
    sc = f.op(f"fadd float {_to_float(f, 'i8', nib)}, {f32(0.5)}")
    return _fmul(f, _fmul(f, d, sc), f32(factor))


def unpack_iq2_xxs(f, blk, c, isa):
    if isa == "vnni":
        return quant_iq_vnni.UNPACK_VNNI["IQ2_XXS"](f, blk, c)
    if isa == "avx2":
        return quant_iq_avx2.UNPACK_AVX2["IQ2_XXS"](f, blk, c)
    d = f.half_to_float(blk)
    aux1 = _u32(f, blk, 2 + 8 * c + 4)
    rows = [
        _table_row(f, "grid_IQ2_XXS", _field(f, "i8", _u8(f, blk, 2 + 8 * c + k), 0, 8))
        for k in range(4)
    ]
    signs = [_table_row(f, "ksign_masks", _field(f, "i32", aux1, 7 * k, 7)) for k in range(4)]
    sc = f.op(f"fadd float {_to_float(f, 'i32', f.op(f'lshr i32 {aux1}, 28'))}, {f32(0.5)}")
    s = _fmul(f, _fmul(f, d, sc), f32(0.25))
    return Chunk(_vector_of(f, "i64", rows), (s, s), None, signed_src=_vector_of(f, "i64", signs))


def unpack_iq2_xs(f, blk, c, isa):
    if isa == "vnni":
        return quant_iq_vnni.UNPACK_VNNI["IQ2_XS"](f, blk, c)
    if isa == "avx2":
        return quant_iq_avx2.UNPACK_AVX2["IQ2_XS"](f, blk, c)
    d = f.half_to_float(blk)
    rows, signs = [], []
    for k in range(4):
        q = f.load("i16", f.gep(blk, 2 + 8 * c + 2 * k), 1, "w")
        rows.append(_table_row(f, "grid_IQ2_XS", _field(f, "i16", q, 0, 9)))
        signs.append(_table_row(f, "ksign_masks", _field(f, "i16", q, 9, 7)))
    s = (_half_scale(f, blk, 66 + c, 0, d, 0.25), _half_scale(f, blk, 66 + c, 1, d, 0.25))
    return Chunk(_vector_of(f, "i64", rows), s, None, signed_src=_vector_of(f, "i64", signs))


def unpack_iq2_s(f, blk, c, isa):
    if isa == "vnni":
        return quant_iq_vnni.UNPACK_VNNI["IQ2_S"](f, blk, c)
    if isa == "avx2":
        return quant_iq_avx2.UNPACK_AVX2["IQ2_S"](f, blk, c)
    d = f.half_to_float(blk)
    qh = f.op(f"zext i8 {_u8(f, blk, 66 + c)} to i64")
    rows = []
    for k in range(4):
        lo = f.op(f"zext i8 {_u8(f, blk, 2 + 4 * c + k)} to i64")
        hi = f.op(f"shl i64 {_field(f, 'i64', qh, 2 * k, 2)}, 8")
        rows.append(_table_row(f, "grid_IQ2_S", f.op(f"or i64 {lo}, {hi}")))
    s = (_half_scale(f, blk, 74 + c, 0, d, 0.25), _half_scale(f, blk, 74 + c, 1, d, 0.25))
    signs = _sign_mask_bits(f, _u32(f, blk, 34 + 4 * c))
    return Chunk(_vector_of(f, "i64", rows), s, None, signed_src=signs)


def unpack_iq3_xxs(f, blk, c, isa):
    if isa == "vnni":
        return quant_iq_vnni.UNPACK_VNNI["IQ3_XXS"](f, blk, c)
    if isa == "avx2":
        return quant_iq_avx2.UNPACK_AVX2["IQ3_XXS"](f, blk, c)
    d = f.half_to_float(blk)
    aux = _u32(f, blk, 66 + 4 * c)
    rows = [
        _table_row(f, "grid_IQ3_XXS", _field(f, "i8", _u8(f, blk, 2 + 8 * c + k), 0, 8))
        for k in range(8)
    ]
    signs = [_table_row(f, "ksign_masks", _field(f, "i32", aux, 7 * k, 7)) for k in range(4)]
    sc = f.op(f"fadd float {_to_float(f, 'i32', f.op(f'lshr i32 {aux}, 28'))}, {f32(0.5)}")
    s = _fmul(f, _fmul(f, d, sc), f32(0.5))
    return Chunk(_vector_of(f, "i32", rows), (s, s), None, signed_src=_vector_of(f, "i64", signs))


def unpack_iq3_s(f, blk, c, isa):
    if isa == "vnni":
        return quant_iq_vnni.UNPACK_VNNI["IQ3_S"](f, blk, c)
    if isa == "avx2":
        return quant_iq_avx2.UNPACK_AVX2["IQ3_S"](f, blk, c)
    d = f.half_to_float(blk)
    qh = f.op(f"zext i8 {_u8(f, blk, 66 + c)} to i64")
    rows = []
    for k in range(8):
        lo = f.op(f"zext i8 {_u8(f, blk, 2 + 8 * c + k)} to i64")
        hi = f.op(f"shl i64 {_field(f, 'i64', qh, k, 1)}, 8")
        rows.append(_table_row(f, "grid_IQ3_S", f.op(f"or i64 {lo}, {hi}")))
    nib = f.op(f"and i8 {f.op(f'lshr i8 {_u8(f, blk, 106 + c // 2)}, {4 * (c % 2)}')}, 15")
    odd = f.op(f"or i8 {f.op(f'shl i8 {nib}, 1')}, 1")  # 1 + 2 * scale
    s = _fmul(f, d, _to_float(f, "i8", odd))
    signs = _sign_mask_bits(f, _u32(f, blk, 74 + 4 * c))
    return Chunk(_vector_of(f, "i32", rows), (s, s), None, signed_src=signs)


# --- IQ1 ------------------------------------------------------------------------------------------
_PLUS_DELTA = 0x0202020202020202  # +2 in each byte of a grid row: delta +1/8


def _iq1_row(f: Fn, idx: str, minus_bit: str) -> str:
    """One 8-value row of 8(g + 1), plus 2 per byte unless the delta is negative (`minus_bit`
    is 1, i64). Arithmetic, not a select: selects on i1 became mask-register shuffles."""
    row = _table_row(f, "grid_IQ1", idx)
    plus = f.op(f"xor i64 {minus_bit}, 1")
    add = f.op(f"mul i64 {plus}, {_PLUS_DELTA}")
    return f.op(f"add i64 {row}, {add}")  # bytes stay <= 18: no carry between them


def _odd_scale(f: Fn, field: str, d: str) -> str:
    """d * (2 * field + 1) / 8 for a 3-bit field (i64)."""
    odd = f.op(f"or i64 {f.op(f'shl i64 {field}, 1')}, 1")
    return _fmul(f, _fmul(f, d, _to_float(f, "i64", odd)), f32(0.125))


def unpack_iq1_s(f, blk, c, isa):
    if isa == "vnni":
        return quant_iq_vnni.UNPACK_VNNI["IQ1_S"](f, blk, c)
    if isa == "avx2":
        return quant_iq_avx2.UNPACK_AVX2["IQ1_S"](f, blk, c)
    d = f.half_to_float(blk)
    qh = f.op(f"zext i16 {f.load('i16', f.gep(blk, 34 + 2 * c), 1, 'w')} to i64")
    minus = f.op(f"lshr i64 {qh}, 15")
    rows = []
    for k in range(4):
        lo = f.op(f"zext i8 {_u8(f, blk, 2 + 4 * c + k)} to i64")
        hi = f.op(f"shl i64 {_field(f, 'i64', qh, 3 * k, 3)}, 8")
        rows.append(_iq1_row(f, f.op(f"or i64 {lo}, {hi}"), minus))
    s = _odd_scale(f, _field(f, "i64", qh, 12, 3), d)
    return Chunk(_vector_of(f, "i64", rows), (s, s), None, offset=9)


def _iq1_m_scale(f: Fn, blk: str) -> str:
    """IQ1_M's fp16 scale, kept in the top nibbles of its 4 scale words."""
    w = [f.load("i16", f.gep(blk, 48 + 2 * k), 1, "w") for k in range(4)]
    parts = [f.op(f"lshr i16 {w[0]}, 12")]
    for k, shift in ((1, 8), (2, 4)):
        parts.append(f.op(f"and i16 {f.op(f'lshr i16 {w[k]}, {shift}')}, {0xF << (4 * k)}"))
    parts.append(f.op(f"and i16 {w[3]}, {-4096}"))  # 0xF000
    bits = f.op(
        f"or i16 {f.op(f'or i16 {parts[0]}, {parts[1]}')}, {f.op(f'or i16 {parts[2]}, {parts[3]}')}"
    )
    return f.op(f"fpext half {f.op(f'bitcast i16 {bits} to half')} to float", "f")


def unpack_iq1_m(f, blk, c, isa):
    if isa == "vnni":
        return quant_iq_vnni.unpack_iq1_m(f, blk, c, _iq1_m_scale)
    if isa == "avx2":
        return quant_iq_avx2.unpack_iq1_m(f, blk, c, _iq1_m_scale)
    d = _iq1_m_scale(f, blk)
    rows = []
    for k in range(4):
        nib = f.op(f"zext i8 {_u8(f, blk, 32 + 2 * c + k // 2)} to i64")
        if k % 2:
            nib = f.op(f"lshr i64 {nib}, 4")
        lo = f.op(f"zext i8 {_u8(f, blk, 4 * c + k)} to i64")
        hi = f.op(f"shl i64 {f.op(f'and i64 {nib}, 7')}, 8")
        minus = _field(f, "i64", nib, 3, 1)
        rows.append(_iq1_row(f, f.op(f"or i64 {lo}, {hi}"), minus))
    s = []
    for h in (0, 1):
        i = 2 * c + h  # 3-bit scale i: field i % 4 of scale word i // 4
        w = f.op(f"zext i16 {f.load('i16', f.gep(blk, 48 + 2 * (i // 4)), 1, 'w')} to i64")
        s.append(_odd_scale(f, _field(f, "i64", w, 3 * (i % 4), 3), d))
    return Chunk(_vector_of(f, "i64", rows), (s[0], s[1]), None, offset=9)


UNPACK_IQ = {
    "IQ4_NL": unpack_iq4_nl,
    "IQ4_XS": unpack_iq4_xs,
    "MXFP4": unpack_mxfp4,
    "TQ2_0": unpack_tq2_0,
    "TQ1_0": unpack_tq1_0,
    "IQ3_S": unpack_iq3_s,
    "IQ3_XXS": unpack_iq3_xxs,
    "IQ2_XS": unpack_iq2_xs,
    "IQ2_XXS": unpack_iq2_xxs,
    "IQ2_S": unpack_iq2_s,
    "IQ1_S": unpack_iq1_s,
    "IQ1_M": unpack_iq1_m,
}
