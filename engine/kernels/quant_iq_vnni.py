"""AVX-512 unpackers for the lookup-grid types (IQ3 / IQ2 / IQ1), used on the VNNI path instead
of engine/kernels/quant_iq.py's scalar table loads (which stay for AVX2 and generic IR).

Why: the scalar path costs ~40 instructions per 32 weights (an index extraction, a load and a
vector insert per grid row, the same again for ksigns masks, a scalar scale chain), against ~30
for Q4_K. Here a whole super-block is decoded with a few 512-bit operations, once per block and
shared by its 8 chunks:
  * every grid row is replaced by its code: 2 bits per value for the 3-level IQ2 / IQ1 grids
    (16 bits per 8-value row), 3 bits for the 8-level IQ3 grids (12 bits per 4-value row). The
    code tables (256-2048 u16) are looked up 32 indices at a time with `vpermi2w` (64 entries
    per instruction) and a select tree on the higher index bits;
  * a unit's codes are spread to one byte per value with shifts and masks, and the bytes
    mapped to grid values with one `vpshufb` (levels as the u bytes quant_iq.py's tables hold);
  * ksigns indices (IQ2_XXS, IQ2_XS, IQ3_XXS) become sign bits arithmetically: ksigns[i] is i
    with bit 7 the parity of i (ggml-common.h), the parity from a nibble `vpshufb`;
  * scales of the 8 chunks are one 8- or 16-lane float vector.
Chunks hand the template (engine/kernels/quant_matmul.py) the same u / scale / sign values as
quant_iq.py does, so results are identical; per (Fn, block) the block work is emitted once, in
the loop body that the first chunk of the block is emitted in (all chunks of a 256-block are
emitted in one iteration).
"""

from __future__ import annotations

import functools

import numpy as np

from engine.kernels.ir import Fn, f32, mask, splat
from engine.kernels.quant_chunk import Chunk
from engine.quant_grids import grid

V32I8 = "<32 x i8>"
V64I8 = "<64 x i8>"
V32I16 = "<32 x i16>"

DECLARATIONS_VNNI = f"""
declare {V32I16} @llvm.x86.avx512.vpermi2var.hi.512({V32I16}, {V32I16}, {V32I16})
declare {V64I8} @llvm.x86.avx512.pshuf.b.512({V64I8}, {V64I8})
"""

# grid -> the u byte of each level (quant_iq.py: IQ2/IQ3 grids as stored, IQ1 as 8(g + 1))
_IQ1_U = {-1: 0, 0: 8, 1: 16}


def _vec(ty: str, values) -> str:
    return "<" + ", ".join(f"{ty} {int(v)}" for v in values) + ">"


@functools.cache
def code_tables(name: str) -> tuple[tuple[str, ...], str, int]:
    """(u16 code tables as <32 x i16> constants, <64 x i8> level -> u byte pshufb table, bits
    per value) for grid `name` (IQ1_S's grid serves IQ1_M too)."""
    g = grid(name).astype(np.int64)
    levels = np.unique(g)
    bits = 2 if len(levels) <= 4 else 3
    codes = np.zeros(len(g), np.int64)
    for b in range(g.shape[1]):
        codes |= np.searchsorted(levels, g[:, b]) << (bits * b)
    # vpermi2w takes 64 entries per pair of tables: pad to a multiple of 64
    codes = np.concatenate([codes, np.zeros(-len(codes) % 64, np.int64)])
    as_i16 = codes.astype(np.uint16).view(np.int16)
    tables = tuple(_vec("i16", as_i16[k : k + 32]) for k in range(0, len(as_i16), 32))
    u = [_IQ1_U[int(v)] for v in levels] if name == "IQ1_S" else [int(v) for v in levels]
    lut = (u + [0] * (16 - len(u))) * 4  # vpshufb looks up within each 128-bit lane
    return tables, _vec("i8", lut), bits


def lookup_codes(f: Fn, name: str, idx: str) -> str:
    """<32 x i16> codes of grid rows `idx` (<32 x i16>, each < the grid's length)."""
    tables, _, _ = code_tables(name)
    level = [
        f.op(
            f"call {V32I16} @llvm.x86.avx512.vpermi2var.hi.512({V32I16} {tables[2 * p]}, "
            f"{V32I16} {idx}, {V32I16} {tables[2 * p + 1]})",
            "cd",
        )
        for p in range(len(tables) // 2)
    ]
    bit = 6  # vpermi2w used index bits 0-5; each further bit picks between pairs of results
    while len(level) > 1:
        hit = f.op(f"and {V32I16} {idx}, {splat(32, 'i16', 1 << bit)}")
        sel = f.op(f"icmp ne {V32I16} {hit}, zeroinitializer")
        level = [
            f.op(f"select <32 x i1> {sel}, {V32I16} {level[i + 1]}, {V32I16} {level[i]}", "cd")
            for i in range(0, len(level), 2)
        ]
        bit += 1
    return level[0]


def _or_and(f: Fn, ty: str, x: str, shift: int, keep: str) -> str:
    """(x | x << shift) & keep (one vpternlog after the shift)."""
    y = f.op(f"or {ty} {x}, {f.op(f'shl {ty} {x}, {splat_like(ty, shift)}')}")
    return f.op(f"and {ty} {y}, {keep}")


def splat_like(ty: str, v: int) -> str:
    n, elem = ty.strip("<>").split(" x ")
    return splat(int(n), elem, v)


def expand_unit(f: Fn, name: str, codes: str, first: int) -> str:
    """<64 x i8> u values of 64 weights: rows first.. of `codes` (<32 x i16>), 8 (2-bit codes)
    or 16 (3-bit codes) of them."""
    _, lut, bits = code_tables(name)
    if bits == 2:
        c = f.op(
            f"shufflevector {V32I16} {codes}, {V32I16} poison, {mask(range(first, first + 8))}"
        )
        x = f.op(f"zext <8 x i16> {c} to <8 x i64>")
        ty = "<8 x i64>"
        x = _or_and(f, ty, x, 24, splat(8, "i64", 0x000000FF000000FF))
        x = _or_and(f, ty, x, 12, splat(8, "i64", 0x000F000F000F000F))
        x = _or_and(f, ty, x, 6, splat(8, "i64", 0x0303030303030303))
    else:
        c = f.op(
            f"shufflevector {V32I16} {codes}, {V32I16} poison, {mask(range(first, first + 16))}"
        )
        x = f.op(f"zext <16 x i16> {c} to <16 x i32>")
        ty = "<16 x i32>"
        x = _or_and(f, ty, x, 10, splat(16, "i32", 0x003F003F))
        x = _or_and(f, ty, x, 5, splat(16, "i32", 0x07070707))
    b = f.op(f"bitcast {ty} {x} to {V64I8}")
    return f.op(f"call {V64I8} @llvm.x86.avx512.pshuf.b.512({V64I8} {lut}, {V64I8} {b})", "u")


_PARITY_HI = _vec("i8", [128 * (bin(n).count("1") % 2) for n in range(16)] * 2)


def ksign_bits(f: Fn, s: str) -> str:
    """<32 x i8> of 7-bit ksigns indices -> <32 x i8> sign bytes (bit i: value i negative)."""
    lo = f.op(f"and {V32I8} {s}, {splat(32, 'i8', 15)}")
    hi = f.op(f"lshr {V32I8} {s}, {splat(32, 'i8', 4)}")
    p_lo = f.op(f"call {V32I8} @llvm.x86.avx2.pshuf.b({V32I8} {_PARITY_HI}, {V32I8} {lo})")
    p_hi = f.op(f"call {V32I8} @llvm.x86.avx2.pshuf.b({V32I8} {_PARITY_HI}, {V32I8} {hi})")
    return f.op(f"or {V32I8} {s}, {f.op(f'xor {V32I8} {p_lo}, {p_hi}')}")


def spread7(f: Fn, aux: str) -> str:
    """<8 x i32> words of four 7-bit fields (bits 0-27) -> <32 x i8>, field k in byte k."""
    ty = "<8 x i32>"
    out = f.op(f"and {ty} {aux}, {splat(8, 'i32', 127)}")
    for k in (1, 2, 3):
        x = f.op(f"shl {ty} {aux}, {splat(8, 'i32', k)}")
        x = f.op(f"and {ty} {x}, {splat(8, 'i32', 127 << (8 * k))}")
        out = f.op(f"or {ty} {out}, {x}")
    return f.op(f"bitcast {ty} {out} to {V32I8}")


def _sign_chunk(f: Fn, bits8: str, c: str | int) -> str:
    """<32 x i8>, -1 where bit i of word c of `bits8` (<8 x i32>) is set."""
    w = f.op(f"extractelement <8 x i32> {bits8}, i32 {c}")
    m = f.op(f"bitcast i32 {w} to <32 x i1>")
    return f.op(f"sext <32 x i1> {m} to {V32I8}")


def _half(f: Fn, unit: str, c: int) -> str:
    return f.op(
        f"shufflevector {V64I8} {unit}, {V64I8} poison, {mask(range(32 * (c % 2), 32 * (c % 2) + 32))}"
    )


def _lane(f: Fn, vec: str, n: int, k: int) -> str:
    return f.op(f"extractelement <{n} x float> {vec}, i32 {k}", "sc")


def _cached(f: Fn, qname: str, blk: str, build):
    cache = f.__dict__.setdefault("_iq_blocks", {})
    key = (qname, blk)
    if key not in cache:
        cache[key] = build(f, blk)
    return cache[key]


def _nibble_scales(f: Fn, blk: str, off: int, d: str, factor: float) -> str:
    """<16 x float>: lane 2c + h = d * (0.5 + nibble h of byte off + c) * factor."""
    q = f.load("<8 x i8>", f.gep(blk, off))
    lo = f.op(f"and <8 x i8> {q}, {splat(8, 'i8', 15)}")
    hi = f.op(f"lshr <8 x i8> {q}, {splat(8, 'i8', 4)}")
    both = f.op(
        f"shufflevector <8 x i8> {lo}, <8 x i8> {hi}, "
        f"{mask([k for c in range(8) for k in (c, c + 8)])}"
    )
    fl = f.op(f"uitofp <16 x i8> {both} to <16 x float>")
    sc = f.op(f"fadd <16 x float> {fl}, {splat(16, 'float', f32(0.5))}")
    ds = f.op(f"fmul <16 x float> {_bcast(f, d, 16)}, {sc}")
    return f.op(f"fmul <16 x float> {ds}, {splat(16, 'float', f32(factor))}")


def _bcast(f: Fn, x: str, n: int) -> str:
    ins = f.op(f"insertelement <{n} x float> poison, float {x}, i32 0")
    return f.op(f"shufflevector <{n} x float> {ins}, <{n} x float> poison, {mask([0] * n)}")


def _aux_scales(f: Fn, aux: str, d: str, factor: float) -> str:
    """<8 x float> d * (0.5 + (aux >> 28)) * factor (IQ2_XXS / IQ3_XXS)."""
    top = f.op(f"lshr <8 x i32> {aux}, {splat(8, 'i32', 28)}")
    fl = f.op(f"uitofp <8 x i32> {top} to <8 x float>")
    sc = f.op(f"fadd <8 x float> {fl}, {splat(8, 'float', f32(0.5))}")
    ds = f.op(f"fmul <8 x float> {_bcast(f, d, 8)}, {sc}")
    return f.op(f"fmul <8 x float> {ds}, {splat(8, 'float', f32(factor))}")


# --- per type -------------------------------------------------------------------------------------
def _build_iq2_xxs(f: Fn, blk: str):
    d = f.half_to_float(blk)
    q = f.load("<16 x i32>", f.gep(blk, 2))  # 8 x (4 grid indices, aux32)
    idx8 = f.op(f"shufflevector <16 x i32> {q}, <16 x i32> poison, {mask(range(0, 16, 2))}")
    aux = f.op(f"shufflevector <16 x i32> {q}, <16 x i32> poison, {mask(range(1, 16, 2))}")
    idx = f.op(f"zext {V32I8} {f.op(f'bitcast <8 x i32> {idx8} to {V32I8}')} to {V32I16}")
    codes = lookup_codes(f, "IQ2_XXS", idx)
    signs = f.op(f"bitcast {V32I8} {ksign_bits(f, spread7(f, aux))} to <8 x i32>")
    return codes, signs, _aux_scales(f, aux, d, 0.25)


def unpack_iq2_xxs(f, blk, c):
    codes, signs, scales = _cached(f, "IQ2_XXS", blk, _build_iq2_xxs)
    u = _unit(f, "IQ2_XXS", blk, codes, c, 4)
    s = _lane(f, scales, 8, c)
    return Chunk(_half(f, u, c), (s, s), None, signed_src=_sign_chunk(f, signs, c))


def _unit(f: Fn, name: str, blk: str, codes: str, c: int, rows_per_chunk: int) -> str:
    """The <64 x i8> u values of chunks c - c % 2 and the next one, built once per block."""
    units = f.__dict__.setdefault("_iq_units", {})
    key = (name, blk, c // 2)
    if key not in units:
        units[key] = expand_unit(f, name, codes, rows_per_chunk * (c - c % 2) % 32)
    return units[key]


def _build_iq3_xxs(f: Fn, blk: str):
    d = f.half_to_float(blk)
    qs = f.load(V64I8, f.gep(blk, 2))
    codes = []
    for h in (0, 1):
        part = f.op(
            f"shufflevector {V64I8} {qs}, {V64I8} poison, {mask(range(32 * h, 32 * h + 32))}"
        )
        codes.append(lookup_codes(f, "IQ3_XXS", f.op(f"zext {V32I8} {part} to {V32I16}")))
    aux = f.load("<8 x i32>", f.gep(blk, 66))
    signs = f.op(f"bitcast {V32I8} {ksign_bits(f, spread7(f, aux))} to <8 x i32>")
    return codes, signs, _aux_scales(f, aux, d, 0.5)


def unpack_iq3_xxs(f, blk, c):
    codes, signs, scales = _cached(f, "IQ3_XXS", blk, _build_iq3_xxs)
    u = _unit(f, "IQ3_XXS", blk, codes[c // 4], c, 8)
    s = _lane(f, scales, 8, c)
    return Chunk(_half(f, u, c), (s, s), None, signed_src=_sign_chunk(f, signs, c))


UNPACK_VNNI = {
    "IQ2_XXS": unpack_iq2_xxs,
    "IQ3_XXS": unpack_iq3_xxs,
}
