"""AVX2 unpackers for the lookup-grid types (IQ3 / IQ2 / IQ1), used on the AVX2 path instead of
engine/kernels/quant_iq.py's per-chunk scalar decoding (which stays for generic IR).

Why: per 32 weights, the per-chunk path spent ~35 instructions before the dot product: an index
extraction per grid row, four ksigns mask loads with their shifts and masks, and a scalar scale
chain (convert, add, two multiplies, broadcast); IQ1_M also rebuilt its split fp16 scale for
every chunk. These kernels run at ~4.5 instructions per cycle, so their cost is their
instruction count (repacked Q4_K, packed_matmul.py, takes ~2 cycles per 32 weights; this
row-major path cannot get that close, bench/RESULTS.md). Here, as on the VNNI path
(quant_iq_vnni.py, whose vector helpers this module reuses where they are plain AVX2), a
super-block's side data is decoded once with a few 256-bit operations and shared by its 8
chunks (the template emits all chunks of a block in one loop iteration):
  * scales: one 8- or 16-lane float vector per block; a chunk takes its lane(s);
  * ksigns indices (IQ2_XXS, IQ2_XS, IQ3_XXS) become sign bytes arithmetically (ksigns[i] is i
    with bit 7 its parity, quant_iq_vnni.ksign_bits), spilled to a stack buffer; a chunk
    reads its 32 sign bits with one load and expands them with quant_iq._sign_mask_bits
    (byte broadcast + bit test: AVX2 has no mask registers);
  * grid row indices that take more than one byte (IQ2_XS, IQ2_S, IQ3_S, IQ1) are built as
    one <32 x i16> vector per 32 rows and spilled; each row then costs one index load and one
    row load (indices that are plain block bytes, IQ2_XXS / IQ3_XXS, are read from the block);
  * IQ1 deltas: 2 in each byte of a row whose delta is +1/8, one byte per row (IQ1_M) or per
    32 values (IQ1_S) in a spilled vector, broadcast to the chunk's bytes and added.
Grid rows stay scalar loads: AVX2 has no two-table permutes for the 256-2048-row grids, and
vpgather was slower (bench/RESULTS.md). Chunks carry the same u / scale / sign values as
quant_iq.py's, so results are identical.
"""

from __future__ import annotations

from collections.abc import Callable

from engine.kernels import quant_iq
from engine.kernels.ir import Fn, mask, splat
from engine.kernels.quant_chunk import Chunk
from engine.kernels.quant_iq_vnni import (
    _aux_scales,
    _bcast,
    _high_bits,
    _k,
    _low_bytes,
    _nibble_scales,
    _odd_eighths,
    ksign_bits,
    spill,
    spread7,
)

V32I8 = "<32 x i8>"
V32I16 = "<32 x i16>"


def _cached(f: Fn, qname: str, blk: str, build: Callable[[Fn, str], tuple]) -> tuple:
    """The block-level values of `qname`'s block `blk`, built once per loop body (the block
    pointer's SSA name is unique to it)."""
    cache = f.__dict__.setdefault("_iq_avx2_blocks", {})
    key = (qname, blk)
    if key not in cache:
        cache[key] = build(f, blk)
    return cache[key]


def _table(name: str) -> tuple[str, int]:
    """(element type, rows) of quant_iq's constant table `name`."""
    ty, values = quant_iq._tables()[name]
    return ty, len(values)


def _row(f: Fn, name: str, idx64: str) -> str:
    ty, n = _table(name)
    p = f.op(f"getelementptr inbounds [{n} x {ty}], ptr @{name}, i64 0, i64 {idx64}", "gp")
    # volatile: the SLP vectoriser would merge a chunk's loads into a vpgather, slower here
    return f.op(f"load volatile {ty}, ptr {p}, align {8 if ty == 'i64' else 4}", "g")


def _rows_from_bytes(f: Fn, name: str, blk: str, off: int, n: int) -> list[str]:
    """Rows indexed by the n block bytes at `off` (IQ2_XXS, IQ3_XXS)."""
    rows = []
    for k in range(n):
        i = f.op(f"zext i8 {f.load('i8', f.gep(blk, off + k), 1, 'b')} to i64", "ix")
        rows.append(_row(f, name, i))
    return rows


def _rows_from_spill(f: Fn, name: str, buf: str, first: int, n: int) -> list[str]:
    """Rows indexed by the i16 indices buf[first..first+n-1] (a `spill` of computed indices;
    volatile, so LLVM does not forward the store into vpextrw, slower)."""
    rows = []
    for k in range(n):
        ip = f.op(f"getelementptr inbounds i16, ptr {buf}, i64 {first + k}")
        i = f.op(f"zext i16 {f.op(f'load volatile i16, ptr {ip}, align 2')} to i64", "ix")
        rows.append(_row(f, name, i))
    return rows


def _spilled_signs(f: Fn, buf: str, c: int) -> str:
    """<32 x i8> sign mask of chunk c from a spilled <32 x i8> of sign bytes."""
    p = f.gep(buf, 4 * c)
    return quant_iq._sign_mask_bits(f, f.op(f"load volatile i32, ptr {p}, align 4", "sg"))


def _block_signs(f: Fn, blk: str, off: int, c: int) -> str:
    """<32 x i8> sign mask of chunk c from the block's explicit sign bits at `off`."""
    return quant_iq._sign_mask_bits(f, f.load("i32", f.gep(blk, off + 4 * c), 1, "sg"))


def _lane(f: Fn, vec: str, n: int, k: int) -> str:
    return f.op(f"extractelement <{n} x float> {vec}, i32 {k}", "sc")


def _u(f: Fn, ty: str, rows: list[str]) -> str:
    return quant_iq._vector_of(f, ty, rows)


# --- IQ2_XXS / IQ3_XXS: byte indices, ksigns in aux words ----------------------------------------
def _build_iq2_xxs(f: Fn, blk: str) -> tuple:
    d = f.half_to_float(blk)
    q = f.load("<16 x i32>", f.gep(blk, 2))  # 8 x (4 grid indices, aux32)
    aux = f.op(f"shufflevector <16 x i32> {q}, <16 x i32> poison, {mask(range(1, 16, 2))}")
    signs = spill(f, V32I8, ksign_bits(f, spread7(f, aux)))
    return signs, _aux_scales(f, aux, d, 0.25)


def unpack_iq2_xxs(f: Fn, blk: str, c: int) -> Chunk:
    signs, scales = _cached(f, "IQ2_XXS", blk, _build_iq2_xxs)
    u = _u(f, "i64", _rows_from_bytes(f, "grid_IQ2_XXS", blk, 2 + 8 * c, 4))
    s = _lane(f, scales, 8, c)
    return Chunk(u, (s, s), None, signed_src=_spilled_signs(f, signs, c))


def _build_iq3_xxs(f: Fn, blk: str) -> tuple:
    d = f.half_to_float(blk)
    aux = f.load("<8 x i32>", f.gep(blk, 66))
    signs = spill(f, V32I8, ksign_bits(f, spread7(f, aux)))
    return signs, _aux_scales(f, aux, d, 0.5)


def unpack_iq3_xxs(f: Fn, blk: str, c: int) -> Chunk:
    signs, scales = _cached(f, "IQ3_XXS", blk, _build_iq3_xxs)
    u = _u(f, "i32", _rows_from_bytes(f, "grid_IQ3_XXS", blk, 2 + 8 * c, 8))
    s = _lane(f, scales, 8, c)
    return Chunk(u, (s, s), None, signed_src=_spilled_signs(f, signs, c))


# --- IQ2_XS / IQ2_S / IQ3_S: wider indices, built as vectors -------------------------------------
def _build_iq2_xs(f: Fn, blk: str) -> tuple:
    d = f.half_to_float(blk)
    q = f.load(V32I16, f.gep(blk, 2))  # 9-bit grid index | 7-bit ksigns index << 9
    idx = spill(f, V32I16, f.op(f"and {V32I16} {q}, {splat(32, 'i16', 511)}"))
    s7 = f.op(f"trunc {V32I16} {_k(f, 'lshr', V32I16, q, 9)} to {V32I8}")
    signs = spill(f, V32I8, ksign_bits(f, s7))
    return idx, signs, _nibble_scales(f, blk, 66, d, 0.25)


def unpack_iq2_xs(f: Fn, blk: str, c: int) -> Chunk:
    idx, signs, scales = _cached(f, "IQ2_XS", blk, _build_iq2_xs)
    u = _u(f, "i64", _rows_from_spill(f, "grid_IQ2_XS", idx, 4 * c, 4))
    s = (_lane(f, scales, 16, 2 * c), _lane(f, scales, 16, 2 * c + 1))
    return Chunk(u, s, None, signed_src=_spilled_signs(f, signs, c))


def _build_iq2_s(f: Fn, blk: str) -> tuple:
    d = f.half_to_float(blk)
    qh = f.load("<8 x i8>", f.gep(blk, 66))
    idx = f.op(f"or {V32I16} {_low_bytes(f, blk, 2)}, {_high_bits(f, qh, 8, 4, 2)}")
    return spill(f, V32I16, idx), _nibble_scales(f, blk, 74, d, 0.25)


def unpack_iq2_s(f: Fn, blk: str, c: int) -> Chunk:
    idx, scales = _cached(f, "IQ2_S", blk, _build_iq2_s)
    u = _u(f, "i64", _rows_from_spill(f, "grid_IQ2_S", idx, 4 * c, 4))
    s = (_lane(f, scales, 16, 2 * c), _lane(f, scales, 16, 2 * c + 1))
    return Chunk(u, s, None, signed_src=_block_signs(f, blk, 34, c))


def _build_iq3_s(f: Fn, blk: str) -> tuple:
    d = f.half_to_float(blk)
    idx = []
    for h in (0, 1):  # rows 32h..32h+31: index bit 8 of row r is bit r of qh
        qh = f.load("<4 x i8>", f.gep(blk, 66 + 4 * h))
        low = _low_bytes(f, blk, 2 + 32 * h)
        idx.append(spill(f, V32I16, f.op(f"or {V32I16} {low}, {_high_bits(f, qh, 4, 8, 1)}")))
    q = f.load("<4 x i8>", f.gep(blk, 106))
    lo = f.op(f"and <4 x i8> {q}, {splat(4, 'i8', 15)}")
    hi = f.op(f"lshr <4 x i8> {q}, {splat(4, 'i8', 4)}")
    nib = f.op(f"shufflevector <4 x i8> {lo}, <4 x i8> {hi}, {mask([0, 4, 1, 5, 2, 6, 3, 7])}")
    odd = _k(f, "or", "<8 x i8>", _k(f, "shl", "<8 x i8>", nib, 1), 1)
    fl = f.op(f"uitofp <8 x i8> {odd} to <8 x float>")
    return idx, f.op(f"fmul <8 x float> {_bcast(f, d, 8)}, {fl}")


def unpack_iq3_s(f: Fn, blk: str, c: int) -> Chunk:
    idx, scales = _cached(f, "IQ3_S", blk, _build_iq3_s)
    u = _u(f, "i32", _rows_from_spill(f, "grid_IQ3_S", idx[c // 4], 8 * (c % 4), 8))
    s = _lane(f, scales, 8, c)
    return Chunk(u, (s, s), None, signed_src=_block_signs(f, blk, 74, c))


# --- IQ1 ----------------------------------------------------------------------------------------
def _plus_bytes(f: Fn, buf: str, c: int, per_row: bool) -> str:
    """<32 x i8>: 2 where the delta of the chunk's value is +1/8, from the spilled delta bytes
    (one per row of 8 values, or one per chunk)."""
    if per_row:
        w = f.op(f"load volatile <4 x i8>, ptr {f.gep(buf, 4 * c)}, align 4", "dl")
        return f.op(
            f"shufflevector <4 x i8> {w}, <4 x i8> poison, {mask([j // 8 for j in range(32)])}"
        )
    b = f.op(f"load volatile i8, ptr {f.gep(buf, c)}, align 1", "dl")
    v = f.op(f"insertelement {V32I8} poison, i8 {b}, i32 0")
    return f.op(f"shufflevector {V32I8} {v}, {V32I8} poison, <32 x i32> zeroinitializer")


def _iq1_u(f: Fn, idx: str, plus: str, c: int, per_row: bool) -> str:
    u = _u(f, "i64", _rows_from_spill(f, "grid_IQ1", idx, 4 * c, 4))
    return f.op(f"add {V32I8} {u}, {_plus_bytes(f, plus, c, per_row)}")  # bytes stay <= 18


def _build_iq1_s(f: Fn, blk: str) -> tuple:
    d = f.half_to_float(blk)
    qh = f.load("<8 x i16>", f.gep(blk, 34))
    qh32 = f.op(
        f"shufflevector <8 x i16> {qh}, <8 x i16> poison, {mask([r // 4 for r in range(32)])}"
    )
    shifts = "<" + ", ".join(f"i16 {3 * (r % 4)}" for r in range(32)) + ">"
    hi = _k(f, "and", V32I16, f.op(f"lshr {V32I16} {qh32}, {shifts}"), 7)
    hi = _k(f, "shl", V32I16, hi, 8)
    idx = spill(f, V32I16, f.op(f"or {V32I16} {_low_bytes(f, blk, 2)}, {hi}"))
    minus = f.op(f"trunc <8 x i16> {_k(f, 'lshr', '<8 x i16>', qh, 15)} to <8 x i8>")
    two = _k(f, "shl", "<8 x i8>", _k(f, "xor", "<8 x i8>", minus, 1), 1)  # 2 * (delta > 0)
    sc = _k(f, "and", "<8 x i16>", _k(f, "lshr", "<8 x i16>", qh, 12), 7)
    return idx, spill(f, "<8 x i8>", two), _odd_eighths(f, sc, 8, d)


def unpack_iq1_s(f: Fn, blk: str, c: int) -> Chunk:
    idx, plus, scales = _cached(f, "IQ1_S", blk, _build_iq1_s)
    s = _lane(f, scales, 8, c)
    return Chunk(_iq1_u(f, idx, plus, c, False), (s, s), None, offset=9)


def _build_iq1_m(f: Fn, blk: str, d: str) -> tuple:
    qh = f.load("<16 x i8>", f.gep(blk, 32))
    w = f.op(f"zext <16 x i8> {qh} to <16 x i16>")
    lanes = f.op(
        f"shufflevector <16 x i16> {w}, <16 x i16> poison, {mask([r // 2 for r in range(32)])}"
    )
    shifts = "<" + ", ".join(f"i16 {4 * (r % 2)}" for r in range(32)) + ">"
    nib = _k(f, "and", V32I16, f.op(f"lshr {V32I16} {lanes}, {shifts}"), 15)
    hi = _k(f, "shl", V32I16, _k(f, "and", V32I16, nib, 7), 8)
    idx = spill(f, V32I16, f.op(f"or {V32I16} {_low_bytes(f, blk, 0)}, {hi}"))
    minus = f.op(f"trunc {V32I16} {_k(f, 'lshr', V32I16, nib, 3)} to {V32I8}")
    two = _k(f, "shl", V32I8, _k(f, "xor", V32I8, minus, 1), 1)  # 2 * (delta > 0)
    sw = f.load("<4 x i16>", f.gep(blk, 48))
    s16 = f.op(
        f"shufflevector <4 x i16> {sw}, <4 x i16> poison, {mask([i // 4 for i in range(16)])}"
    )
    sh = "<" + ", ".join(f"i16 {3 * (i % 4)}" for i in range(16)) + ">"
    fields = _k(f, "and", "<16 x i16>", f.op(f"lshr <16 x i16> {s16}, {sh}"), 7)
    return idx, spill(f, V32I8, two), _odd_eighths(f, fields, 16, d)


def unpack_iq1_m(f: Fn, blk: str, c: int, d_of: Callable[[Fn, str], str]) -> Chunk:
    """`d_of(f, blk)`: IQ1_M's fp16 super-block scale (quant_iq._iq1_m_scale), once per block."""
    idx, plus, scales = _cached(f, "IQ1_M", blk, lambda f, blk: _build_iq1_m(f, blk, d_of(f, blk)))
    s = (_lane(f, scales, 16, 2 * c), _lane(f, scales, 16, 2 * c + 1))
    return Chunk(_iq1_u(f, idx, plus, c, True), s, None, offset=9)


UNPACK_AVX2 = {
    "IQ2_XXS": unpack_iq2_xxs,
    "IQ3_XXS": unpack_iq3_xxs,
    "IQ2_XS": unpack_iq2_xs,
    "IQ2_S": unpack_iq2_s,
    "IQ3_S": unpack_iq3_s,
    "IQ1_S": unpack_iq1_s,
}
