"""AVX-512 unpackers for the lookup-grid types (IQ3 / IQ2 / IQ1), used on the VNNI path instead
of engine/kernels/quant_iq.py's scalar table loads (which stay for AVX2 and generic IR).

Why: the scalar path costs ~40 instructions per 32 weights (an index extraction, a load and a
vector insert per grid row, the same again for ksigns masks, a scalar scale chain), against ~30
for Q4_K. Here a whole super-block's indices, signs and scales are decoded with a few 512-bit
operations, once per block and shared by its 8 chunks:
  * small grids (IQ2_XXS, IQ3_XXS: 256 rows; IQ3_S: 512) are looked up in registers: every
    row is replaced by its code, 2 bits per value for the 3-level IQ2 grids (16 bits per
    8-value row), 3 bits for the 8-level IQ3 grids (12 bits per 4-value row). IQ3 codes go
    64 indices at a time as two byte planes through `vpermi2b` (AVX512-VBMI, 128 rows per
    instruction), else (and for IQ2_XXS) 32 at a time through `vpermi2w` (64 rows), each with
    a select tree on the higher index bits. A unit's codes are spread to one byte per value
    with shifts and masks and mapped to grid values with one `vpshufb`;
  * large grids (IQ2_XS: 512 rows, IQ2_S: 1024, IQ1: 2048) would take 16-64 permutes per
    block, and vpgatherdd was slower still: their row indices are computed as one vector,
    spilled to a stack buffer and read back by scalar loads that feed the row loads;
  * ksigns indices (IQ2_XXS, IQ2_XS, IQ3_XXS) become sign bits arithmetically: ksigns[i] is i
    with bit 7 the parity of i (ggml-common.h), the parity from a nibble `vpshufb`. A unit's
    64 sign bits are one 64-bit load (from the block, or a spill of the computed bits), so
    they reach a mask register with one kmovq;
  * scales of the 8 chunks are one 8- or 16-lane float vector; IQ1 deltas one byte vector.
Chunks hand the template (engine/kernels/quant_matmul.py) the same u / scale / sign values as
quant_iq.py does, so results are identical; per (Fn, block) the block work is emitted once, in
the loop body that the first chunk of the block is emitted in (all chunks of a 256-block are
emitted in one iteration). Measurements: bench/RESULTS.md (tensor types, decode mat-vec).
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable

import numpy as np

from engine.kernels import compiler
from engine.kernels.ir import Fn, f32, mask, splat
from engine.kernels.quant_chunk import Chunk
from engine.quant_grids import grid

V32I8 = "<32 x i8>"
V64I8 = "<64 x i8>"
V32I16 = "<32 x i16>"

DECLARATIONS_VNNI = f"""
declare {V32I16} @llvm.x86.avx512.vpermi2var.hi.512({V32I16}, {V32I16}, {V32I16})
declare {V64I8} @llvm.x86.avx512.pshuf.b.512({V64I8}, {V64I8})
declare {V64I8} @llvm.x86.avx512.vpermi2var.qi.512({V64I8}, {V64I8}, {V64I8})
"""


def _vec(ty: str, values) -> str:
    return "<" + ", ".join(f"{ty} {int(v)}" for v in values) + ">"


@functools.cache
def _codes(name: str) -> tuple[np.ndarray, list[int], int]:
    """(u16 code per grid row, u byte per level, bits per value) of grid `name`."""
    g = grid(name).astype(np.int64)
    levels = np.unique(g)
    bits = 2 if len(levels) <= 4 else 3
    codes = np.zeros(len(g), np.int64)
    for b in range(g.shape[1]):
        codes |= np.searchsorted(levels, g[:, b]) << (bits * b)
    return codes, [int(v) for v in levels], bits


@functools.cache
def code_tables(name: str) -> tuple[tuple[str, ...], str, int]:
    """(u16 code tables as <32 x i16> constants, <64 x i8> level -> u byte pshufb table, bits
    per value) for grid `name` (IQ2_XXS, IQ3_XXS, IQ3_S: the grids looked up in registers)."""
    codes, u, bits = _codes(name)
    # vpermi2w takes 64 entries per pair of tables: pad to a multiple of 64
    codes = np.concatenate([codes, np.zeros(-len(codes) % 64, np.int64)])
    as_i16 = codes.astype(np.uint16).view(np.int16)
    tables = tuple(_vec("i16", as_i16[k : k + 32]) for k in range(0, len(as_i16), 32))
    lut = (u + [0] * (16 - len(u))) * 4  # vpshufb looks up within each 128-bit lane
    return tables, _vec("i8", lut), bits


# Grids looked up row by row with scalar loads from quant_iq.py's tables (name, rows): the ones
# whose code tables take too many vpermi2w (16-32 per super-block cost more than the loads)
SCALAR_ROWS = {
    "IQ2_S": ("grid_IQ2_S", 1024),
    "IQ1_S": ("grid_IQ1", 2048),
    "IQ1_M": ("grid_IQ1", 2048),
    "IQ2_XS": ("grid_IQ2_XS", 512),
}


def spill(f: Fn, ty: str, value: str) -> str:
    """Store `value` to a stack buffer (allocated in the function's entry block) and return
    it: reading its parts back with scalar loads costs one load each, where extracting them
    from the vector (vpextrw / vpextrd) costs two micro-ops and a shuffle port each. Volatile,
    so LLVM does not forward the store to the loads (back into extracts)."""
    buf = f.t("spill")
    # prefixed to the function's first line (in its entry block: tile_function's row pointers
    # come first), not inserted as a line of its own: the template keeps line positions for
    # the phis it adds later. An alloca inside the loop would grow the stack every iteration.
    assert f.lines and f.lines[0].startswith("  "), "the tile function must open with an op"
    f.lines[0] = f"  {buf} = alloca {ty}, align 64\n{f.lines[0]}"
    f(f"store volatile {ty} {value}, ptr {buf}, align 64")
    return buf


def spill_indices(f: Fn, idx: str) -> str:
    """The <32 x i16> row indices in a stack buffer, for `scalar_unit`."""
    return spill(f, V32I16, idx)


def scalar_unit(f: Fn, name: str, buf: str, first: int) -> str:
    """<64 x i8>: the 8-byte grid rows buf[first..first+7], one load each (volatile: the SLP
    vectoriser would merge them into a vpgatherqq, slower here)."""
    table, n = SCALAR_ROWS[name]
    vec = "poison"
    for k in range(8):
        ip = f.op(f"getelementptr inbounds i16, ptr {buf}, i64 {first + k}")
        i = f.op(f"load volatile i16, ptr {ip}, align 2")
        i64 = f.op(f"zext i16 {i} to i64")
        p = f.op(f"getelementptr inbounds [{n} x i64], ptr @{table}, i64 0, i64 {i64}", "gp")
        row = f.op(f"load volatile i64, ptr {p}, align 8", "g")
        vec = f.op(f"insertelement <8 x i64> {vec}, i64 {row}, i32 {k}")
    return f.op(f"bitcast <8 x i64> {vec} to {V64I8}", "u")


def has_vbmi() -> bool:
    """Whether the CPU the kernels are compiled for (compiler.target_cpu: the host or
    LOCALCHAT_CPU's) has AVX512-VBMI's byte permutes; AVX512-VNNI CPUs without it (Cascade
    Lake) take the vpermi2w lookups."""
    return _has_vbmi(os.environ.get(compiler.CPU_ENV, "").strip())


@functools.cache
def _has_vbmi(cpu_env: str) -> bool:
    return compiler.target_cpu().has("avx512vbmi")


@functools.cache
def byte_tables(name: str) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """The code tables as low and high bytes, <64 x i8> constants (vpermi2b: 128 per pair)."""
    codes, _, _ = _codes(name)
    codes = np.concatenate([codes, np.zeros(-len(codes) % 128, np.int64)])
    planes = []
    for part in (codes & 255, codes >> 8):
        as_i8 = part.astype(np.uint8).view(np.int8)
        planes.append(tuple(_vec("i8", as_i8[k : k + 64]) for k in range(0, len(as_i8), 64)))
    return planes[0], planes[1]


def lookup_codes64(f: Fn, name: str, idx8: str, high: list[str]) -> list[str]:
    """Codes of 64 grid rows as two <32 x i16> halves, with VBMI byte permutes: `idx8` holds
    the index bits 0-7 (<64 x i8>), `high` the <64 x i1> masks of bits 8, 9, ... Each plane
    (code bits 0-7, 8-15) is one vpermi2b per 128 rows plus a select tree on bits 7, 8, ..."""
    bit7 = f.op(f"icmp slt {V64I8} {idx8}, zeroinitializer")
    planes = []
    for tables in byte_tables(name):
        level = [
            f.op(
                f"call {V64I8} @llvm.x86.avx512.vpermi2var.qi.512({V64I8} {tables[2 * p]}, "
                f"{V64I8} {idx8}, {V64I8} {tables[2 * p + 1]})",
                "cd",
            )
            for p in range(len(tables) // 2)
        ]
        for sel in [bit7, *high]:
            if len(level) == 1:
                break
            level = [
                f.op(f"select <64 x i1> {sel}, {V64I8} {level[i + 1]}, {V64I8} {level[i]}", "cd")
                for i in range(0, len(level), 2)
            ]
        planes.append(level[0])
    lo, hi = planes
    halves = []
    for h in (0, 1):
        pairs = [k for r in range(32 * h, 32 * h + 32) for k in (r, 64 + r)]
        both = f.op(f"shufflevector {V64I8} {lo}, {V64I8} {hi}, {mask(pairs)}")
        halves.append(f.op(f"bitcast {V64I8} {both} to {V32I16}"))
    return halves


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
    """(x | x << shift) & keep."""
    y = f.op(f"or {ty} {x}, {f.op(f'shl {ty} {x}, {splat_like(ty, shift)}')}")
    return f.op(f"and {ty} {y}, {keep}")


def _k(f: Fn, op: str, ty: str, x: str, k: int) -> str:
    """`op ty x, splat(k)`."""
    return f.op(f"{op} {ty} {x}, {splat_like(ty, k)}")


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
        # code bytes 0, 1 of row k to bytes 8k and 8k + 4 (a byte shuffle: written as
        # (x | x << 24) & mask, LLVM made the disjoint `or` a vpmullq)
        cb = f.op(f"bitcast <8 x i16> {c} to <16 x i8>")
        place = [z for k in range(8) for z in (2 * k, 16, 16, 16, 2 * k + 1, 16, 16, 16)]
        x = f.op(f"shufflevector <16 x i8> {cb}, <16 x i8> zeroinitializer, {mask(place)}")
        ty = "<8 x i64>"
        x = f.op(f"bitcast {V64I8} {x} to {ty}")
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


def _sign_chunk(f: Fn, bits: str, c: int, volatile: bool = False) -> str:
    """<32 x i8>, -1 where bit i of the 32 sign bits of chunk c is set; `bits` points to the
    block's 32 bytes of them (block memory, or a `spill` buffer: then `volatile`). The two
    chunks of a unit come from one 64-bit load, so the template's concatenation of them folds
    back into a single kmovq instead of two vpextrd + kmovd + kunpckdq."""
    units = f.__dict__.setdefault("_iq_signs", {})
    key = (bits, c // 2)
    if key not in units:
        p = f.gep(bits, 8 * (c // 2))
        w = f.op(f"load {'volatile ' if volatile else ''}i64, ptr {p}, align 1", "sg")
        m = f.op(f"bitcast i64 {w} to <64 x i1>")
        units[key] = f.op(f"sext <64 x i1> {m} to {V64I8}")
    return _half(f, units[key], c)


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
    signs = spill(f, V32I8, ksign_bits(f, spread7(f, aux)))
    return codes, signs, _aux_scales(f, aux, d, 0.25)


def unpack_iq2_xxs(f, blk, c):
    codes, signs, scales = _cached(f, "IQ2_XXS", blk, _build_iq2_xxs)
    u = _unit(f, "IQ2_XXS", blk, codes, c, 4)
    s = _lane(f, scales, 8, c)
    return Chunk(_half(f, u, c), (s, s), None, signed_src=_sign_chunk(f, signs, c, True))


def _unit(f: Fn, name: str, blk: str, codes: str, c: int, rows_per_chunk: int, add=None) -> str:
    """The <64 x i8> u values of chunks c - c % 2 and the next one, built once per block
    (`add`: a <64 x i8> to add, IQ1's deltas)."""
    units = f.__dict__.setdefault("_iq_units", {})
    key = (name, blk, c // 2)
    if key not in units:
        first = rows_per_chunk * (c - c % 2) % 32
        if name in SCALAR_ROWS:  # `codes` holds the grid row indices
            u = scalar_unit(f, name, codes, first)
        else:
            u = expand_unit(f, name, codes, first)
        units[key] = u if add is None else f.op(f"add {V64I8} {u}, {add(c // 2)}", "u")
    return units[key]


def _build_iq3_xxs(f: Fn, blk: str):
    d = f.half_to_float(blk)
    qs = f.load(V64I8, f.gep(blk, 2))
    if has_vbmi():
        codes = lookup_codes64(f, "IQ3_XXS", qs, [])
    else:
        codes = []
        for h in (0, 1):
            part = f.op(
                f"shufflevector {V64I8} {qs}, {V64I8} poison, {mask(range(32 * h, 32 * h + 32))}"
            )
            codes.append(lookup_codes(f, "IQ3_XXS", f.op(f"zext {V32I8} {part} to {V32I16}")))
    aux = f.load("<8 x i32>", f.gep(blk, 66))
    signs = spill(f, V32I8, ksign_bits(f, spread7(f, aux)))
    return codes, signs, _aux_scales(f, aux, d, 0.5)


def unpack_iq3_xxs(f, blk, c):
    codes, signs, scales = _cached(f, "IQ3_XXS", blk, _build_iq3_xxs)
    u = _unit(f, "IQ3_XXS", blk, codes[c // 4], c, 8)
    s = _lane(f, scales, 8, c)
    return Chunk(_half(f, u, c), (s, s), None, signed_src=_sign_chunk(f, signs, c, True))


def _build_iq2_xs(f: Fn, blk: str):
    d = f.half_to_float(blk)
    q = f.load(V32I16, f.gep(blk, 2))  # 9-bit grid index | 7-bit ksigns index << 9
    idx = f.op(f"and {V32I16} {q}, {splat(32, 'i16', 511)}")
    codes = spill_indices(f, idx)
    s7 = f.op(f"trunc {V32I16} {_k(f, 'lshr', V32I16, q, 9)} to {V32I8}")
    signs = spill(f, V32I8, ksign_bits(f, s7))
    return codes, signs, _nibble_scales(f, blk, 66, d, 0.25)


def _two_scales(f: Fn, scales: str, c: int) -> tuple[str, str]:
    return _lane(f, scales, 16, 2 * c), _lane(f, scales, 16, 2 * c + 1)


def unpack_iq2_xs(f, blk, c):
    codes, signs, scales = _cached(f, "IQ2_XS", blk, _build_iq2_xs)
    u = _unit(f, "IQ2_XS", blk, codes, c, 4)
    return Chunk(_half(f, u, c), _two_scales(f, scales, c), None, _sign_chunk(f, signs, c, True))


def _high_bits(f: Fn, qh: str, n: int, rows_per: int, width: int) -> str:
    """<32 x i16>: for row r, field r % rows_per (width bits) of byte r // rows_per of the
    <n x i8> `qh`, shifted to bit 8 (the grid index's high bits)."""
    w = f.op(f"zext <{n} x i8> {qh} to <{n} x i16>")
    lanes = f.op(
        f"shufflevector <{n} x i16> {w}, <{n} x i16> poison, "
        f"{mask([r // rows_per for r in range(32)])}"
    )
    shifts = "<" + ", ".join(f"i16 {width * (r % rows_per)}" for r in range(32)) + ">"
    x = f.op(f"lshr {V32I16} {lanes}, {shifts}")
    x = f.op(f"and {V32I16} {x}, {splat(32, 'i16', (1 << width) - 1)}")
    return f.op(f"shl {V32I16} {x}, {splat(32, 'i16', 8)}")


def _low_bytes(f: Fn, blk: str, off: int) -> str:
    return f.op(f"zext {V32I8} {f.load(V32I8, f.gep(blk, off))} to {V32I16}")


def _build_iq2_s(f: Fn, blk: str):
    d = f.half_to_float(blk)
    qh = f.load("<8 x i8>", f.gep(blk, 66))
    idx = f.op(f"or {V32I16} {_low_bytes(f, blk, 2)}, {_high_bits(f, qh, 8, 4, 2)}")
    codes = spill_indices(f, idx)
    signs = f.gep(blk, 34)
    return codes, signs, _nibble_scales(f, blk, 74, d, 0.25)


def unpack_iq2_s(f, blk, c):
    codes, signs, scales = _cached(f, "IQ2_S", blk, _build_iq2_s)
    u = _unit(f, "IQ2_S", blk, codes, c, 4)
    return Chunk(_half(f, u, c), _two_scales(f, scales, c), None, _sign_chunk(f, signs, c))


def _build_iq3_s(f: Fn, blk: str):
    d = f.half_to_float(blk)
    codes = []
    if has_vbmi():  # index bit 8 of row r is bit r of qh
        high = f.op(f"bitcast i64 {f.load('i64', f.gep(blk, 66))} to <64 x i1>")
        codes = lookup_codes64(f, "IQ3_S", f.load(V64I8, f.gep(blk, 2)), [high])
    for h in (0, 1) if not codes else ():
        hb = f.op(f"bitcast i32 {f.load('i32', f.gep(blk, 66 + 4 * h))} to <32 x i1>")
        hi = f.op(f"shl {V32I16} {f.op(f'zext <32 x i1> {hb} to {V32I16}')}, {splat(32, 'i16', 8)}")
        idx = f.op(f"or {V32I16} {_low_bytes(f, blk, 2 + 32 * h)}, {hi}")
        codes.append(lookup_codes(f, "IQ3_S", idx))
    signs = f.gep(blk, 74)
    q = f.load("<4 x i8>", f.gep(blk, 106))
    lo = f.op(f"and <4 x i8> {q}, {splat(4, 'i8', 15)}")
    hi = f.op(f"lshr <4 x i8> {q}, {splat(4, 'i8', 4)}")
    nib = f.op(f"shufflevector <4 x i8> {lo}, <4 x i8> {hi}, {mask([0, 4, 1, 5, 2, 6, 3, 7])}")
    odd = f.op(f"or <8 x i8> {_k(f, 'shl', '<8 x i8>', nib, 1)}, {splat(8, 'i8', 1)}")
    fl = f.op(f"uitofp <8 x i8> {odd} to <8 x float>")
    return codes, signs, f.op(f"fmul <8 x float> {_bcast(f, d, 8)}, {fl}")


def unpack_iq3_s(f, blk, c):
    codes, signs, scales = _cached(f, "IQ3_S", blk, _build_iq3_s)
    u = _unit(f, "IQ3_S", blk, codes[c // 4], c, 8)
    s = _lane(f, scales, 8, c)
    return Chunk(_half(f, u, c), (s, s), None, signed_src=_sign_chunk(f, signs, c))


def _odd_eighths(f: Fn, fields: str, n: int, d: str) -> str:
    """<n x float> d * (2 * field + 1) * 0.125 for 3-bit fields (<n x i16>)."""
    odd = f.op(f"or <{n} x i16> {_k(f, 'shl', f'<{n} x i16>', fields, 1)}, {splat(n, 'i16', 1)}")
    fl = f.op(f"uitofp <{n} x i16> {odd} to <{n} x float>")
    ds = f.op(f"fmul <{n} x float> {_bcast(f, d, n)}, {fl}")
    return f.op(f"fmul <{n} x float> {ds}, {splat(n, 'float', f32(0.125))}")


def _delta_bytes(f: Fn, plus: str, n: int, per: int) -> Callable[[int], str]:
    """unit u -> <64 x i8>: 2 in the bytes of each group of `per` values whose delta is +1/8
    (`plus`: <n x i8>, 1 per group)."""
    two = f.op(f"shl <{n} x i8> {plus}, {splat(n, 'i8', 1)}")

    def add(u: int) -> str:
        first = 64 * u // per
        return f.op(
            f"shufflevector <{n} x i8> {two}, <{n} x i8> poison, "
            f"{mask([first + j // per for j in range(64)])}"
        )

    return add


def _build_iq1_s(f: Fn, blk: str):
    d = f.half_to_float(blk)
    qh = f.load("<8 x i16>", f.gep(blk, 34))
    qh8 = f.op(
        f"shufflevector <8 x i16> {qh}, <8 x i16> poison, {mask([r // 4 for r in range(32)])}"
    )
    shifts = "<" + ", ".join(f"i16 {3 * (r % 4)}" for r in range(32)) + ">"
    hi = f.op(f"and {V32I16} {f.op(f'lshr {V32I16} {qh8}, {shifts}')}, {splat(32, 'i16', 7)}")
    idx = f.op(f"or {V32I16} {_low_bytes(f, blk, 2)}, {_k(f, 'shl', V32I16, hi, 8)}")
    codes = spill_indices(f, idx)
    minus = f.op(f"trunc <8 x i16> {_k(f, 'lshr', '<8 x i16>', qh, 15)} to <8 x i8>")
    plus = f.op(f"xor <8 x i8> {minus}, {splat(8, 'i8', 1)}")
    sc = f.op(f"and <8 x i16> {_k(f, 'lshr', '<8 x i16>', qh, 12)}, {splat(8, 'i16', 7)}")
    return codes, _delta_bytes(f, plus, 8, 32), _odd_eighths(f, sc, 8, d)


def unpack_iq1_s(f, blk, c):
    codes, add, scales = _cached(f, "IQ1_S", blk, _build_iq1_s)
    u = _unit(f, "IQ1_S", blk, codes, c, 4, add)
    s = _lane(f, scales, 8, c)
    return Chunk(_half(f, u, c), (s, s), None, offset=9)


def _build_iq1_m(f: Fn, blk: str, d: str):
    qh = f.load("<16 x i8>", f.gep(blk, 32))
    w = f.op(f"zext <16 x i8> {qh} to <16 x i16>")
    lanes = f.op(
        f"shufflevector <16 x i16> {w}, <16 x i16> poison, {mask([r // 2 for r in range(32)])}"
    )
    shifts = "<" + ", ".join(f"i16 {4 * (r % 2)}" for r in range(32)) + ">"
    nib = f.op(f"and {V32I16} {f.op(f'lshr {V32I16} {lanes}, {shifts}')}, {splat(32, 'i16', 15)}")
    hi = f.op(f"shl {V32I16} {_k(f, 'and', V32I16, nib, 7)}, {splat(32, 'i16', 8)}")
    idx = f.op(f"or {V32I16} {_low_bytes(f, blk, 0)}, {hi}")
    codes = spill_indices(f, idx)
    minus = f.op(f"trunc {V32I16} {_k(f, 'lshr', V32I16, nib, 3)} to {V32I8}")
    plus = f.op(f"xor {V32I8} {minus}, {splat(32, 'i8', 1)}")
    sw = f.load("<4 x i16>", f.gep(blk, 48))
    s16 = f.op(
        f"shufflevector <4 x i16> {sw}, <4 x i16> poison, {mask([i // 4 for i in range(16)])}"
    )
    sh = "<" + ", ".join(f"i16 {3 * (i % 4)}" for i in range(16)) + ">"
    fields = f.op(f"and <16 x i16> {f.op(f'lshr <16 x i16> {s16}, {sh}')}, {splat(16, 'i16', 7)}")
    return codes, _delta_bytes(f, plus, 32, 8), _odd_eighths(f, fields, 16, d)


def unpack_iq1_m(f, blk, c, d_of):
    """`d_of(f, blk)`: IQ1_M's fp16 super-block scale (quant_iq._iq1_m_scale)."""
    codes, add, scales = _cached(f, "IQ1_M", blk, lambda f, blk: _build_iq1_m(f, blk, d_of(f, blk)))
    u = _unit(f, "IQ1_M", blk, codes, c, 4, add)
    return Chunk(_half(f, u, c), _two_scales(f, scales, c), None, offset=9)


UNPACK_VNNI = {
    "IQ2_XXS": unpack_iq2_xxs,
    "IQ3_XXS": unpack_iq3_xxs,
    "IQ2_XS": unpack_iq2_xs,
    "IQ2_S": unpack_iq2_s,
    "IQ3_S": unpack_iq3_s,
    "IQ1_S": unpack_iq1_s,
}
