"""IR for `out = x @ W.T` over Q4_0 / Q4_1 / Q5_0 / Q5_1 / Q8_0 weights repacked into 16-row
records of one 32-value block each (repack.py's docstring has the layouts).

The same scheme as packed_matmul.py's K-quant kernels: one zmm holds 16 rows (lane i = row i,
4 bytes = 4 consecutive values), so per 32 values of one token the 16 rows take 8 `vpdpbusd`
with a broadcast activation dword and then, once for all 16 rows, int -> float, times d * da,
added. The record's 16 f16 scales are converted once per record per tile and shared by the
tile's tokens. Per format (u the unsigned value the dot product multiplies, sum the token's
integer sum over the 32 values, act_quant's `is`):

  Q4_0  w = d*(u - 8):    the dot chain starts at -8 * sum;  acc += cvt(chain) * (d * da)
  Q5_0  w = d*(u - 16):   the same with -16 * sum (u = nibble | fifth bit << 4)
  Q4_1  w = d*u + m, Q5_1 likewise:  acc += cvt(dot) * (d * da) + m * (da * sum)
  Q8_0  w = d*q, q int8:  VNNI: u = q + 128 (q xor 0x80), the chain starts at -128 * sum;
        AVX2 / generic: u = |q| and the activation takes q's sign (pmaddubsw's pair sums of
        255 * 127 would saturate i16; |q| <= 128 keeps them below 2^15)

Every integer dot is exact on every path, so the ISAs differ only in speed. The tiles and the
threaded driver are packed_matmul.py's (16 rows x TILE tokens, then SMALL_TILES): a token's
result does not depend on the tile it lands in or on the batch.
Argument block: quant_matmul.QuantMatmulSlots, with ROW_BYTES = bytes per row group and
N_BLOCKS = 32-value blocks per row.
"""

from __future__ import annotations

from engine.kernels import packed_matmul
from engine.kernels.ir import Fn, splat
from engine.kernels.packed_matmul import SMALL_TILES, TILE, V16F, V16I32, V64I8
from engine.kernels.quant_matmul import DECLARATIONS
from engine.kernels.repack import LEGACY_RECORD_BYTES

PACKED_TYPES = tuple(LEGACY_RECORD_BYTES)
# Software prefetch distance in records (0: none): a row group's records are one contiguous
# stream, which the hardware prefetcher follows.
PREFETCH_RECORDS = {q: 0 for q in PACKED_TYPES}
# The constant the dot chain starts at, times the token's integer sum (0: a min term instead).
_OFFSET = {"Q4_0": 8, "Q5_0": 16, "Q4_1": 0, "Q5_1": 0}
_HAS_MIN = ("Q4_1", "Q5_1")
_HAS_HIGH = ("Q5_0", "Q5_1")


def _scale_at(qname: str) -> int:
    """Byte offset of d (f16 [row]) in the record; m follows it."""
    if qname == "Q8_0":
        return 512
    return 320 if qname in _HAS_HIGH else 256


def _vec_op(f: Fn, opname: str, v: str, k: int) -> str:
    return f.op(f"{opname} {V64I8} {v}, {splat(64, 'i8', k)}")


def _units_nibbles(f: Fn, qname: str, rec: str) -> list[str]:
    """The 8 unsigned unit vectors (values 0..31) of a Q4_x / Q5_x record."""
    packed = [f.load(V64I8, f.gep(rec, 64 * p), 1, "wq") for p in range(4)]
    units = [_vec_op(f, "and", p, 15) for p in packed] + [_vec_op(f, "lshr", p, 4) for p in packed]
    if qname not in _HAS_HIGH:
        return units
    high = f.load(V64I8, f.gep(rec, 256), 1, "wh")
    for k in range(8):
        # bit k of each byte moved to bit 4
        moved = high if k == 4 else _vec_op(f, "shl" if k < 4 else "lshr", high, abs(4 - k))
        units[k] = f.op(f"or {V64I8} {units[k]}, {_vec_op(f, 'and', moved, 0x10)}", "wu")
    return units


def _int_sum(f: Fn, is_: str, i: str) -> str:
    """The token's integer sum over block i (two of act_quant's 16-value sums)."""
    p = f.op(f"getelementptr inbounds i32, ptr {is_}, i64 {f.op(f'shl i64 {i}, 1')}")
    lo = f.load("i32", p, 4, "is")
    hi = f.load("i32", f.gep(p, 4), 4, "is")
    return f.op(f"add i32 {lo}, {hi}")


def _block(f: Fn, qname: str, isa: str, rec: str, i: str, toks, acc) -> None:
    """Values 32i..32i+31 of the record at rec, for every token of the tile."""
    d = packed_matmul.f16_lanes(f, rec, _scale_at(qname))
    m = packed_matmul.f16_lanes(f, rec, _scale_at(qname) + 32) if qname in _HAS_MIN else None
    if qname == "Q8_0":
        q = [f.load(V64I8, f.gep(rec, 64 * k), 1, "wq") for k in range(8)]
        if isa == "vnni":
            units, signs, offset = [_vec_op(f, "xor", v, 0x80) for v in q], None, 128
        else:
            units = [f.op(f"call {V64I8} @llvm.abs.v64i8({V64I8} {v}, i1 false)", "wu") for v in q]
            signs = [f.op(f"icmp slt {V64I8} {v}, zeroinitializer", "neg") for v in q]
            offset = 0
        u_max = 128  # |q|
    else:
        units, signs, offset = _units_nibbles(f, qname, rec), None, _OFFSET[qname]
        u_max = 31 if qname in _HAS_HIGH else 15
    e_c = f.op(f"shl i64 {i}, 5", "e")
    for j, (aq, ad, s32, is_) in enumerate(toks):
        chain = "zeroinitializer"
        if offset:
            chain = packed_matmul.splat16(
                f, "i32", f.op(f"mul i32 {_int_sum(f, is_, i)}, -{offset}")
            )
        group = packed_matmul.i16_group(u_max) if isa == "avx2" else 1
        acts = []
        for k, u in enumerate(units):
            a = packed_matmul.act_dword(f, aq, f.op(f"add i64 {e_c}, {4 * k}", "o"))
            if signs is not None:
                na = f.op(f"sub {V64I8} zeroinitializer, {a}")
                a = f.op(f"select <64 x i1> {signs[k]}, {V64I8} {na}, {V64I8} {a}", "sa")
            if group == 1:
                chain = packed_matmul.dot(f, isa, u, a, chain)
            else:
                acts.append(a)
        if group > 1:  # AVX2: pmaddubsw sums added in i16 (packed_matmul.dot_half)
            chain = packed_matmul.dots(f, units, acts, chain, group)
        df = f.op(f"sitofp {V16I32} {chain} to {V16F}", "df")
        da = f.load("float", f.op(f"getelementptr inbounds float, ptr {ad}, i64 {i}"), 4)
        sda = f.op(f"fmul {V16F} {d}, {packed_matmul.splat16(f, 'float', da)}", "sda")
        acc[j] = packed_matmul.fma(f, df, sda, acc[j])
        if m is not None:
            sm = f.load("float", f.op(f"getelementptr inbounds float, ptr {s32}, i64 {i}"), 4)
            acc[j] = packed_matmul.fma(f, m, packed_matmul.splat16(f, "float", sm), acc[j])


def tile_function(qname: str, isa: str, ntok: int) -> str:
    """`ptile(rec0, nblocks, aq, ad, s32, is, n, t, out, ostride, col, valid)` as
    packed_matmul.tile_function, over one row group's `nblocks` 32-value records from rec0."""
    f = Fn()
    toks = []
    for j in range(ntok):
        tj = f.op(f"add i64 %t, {j}")
        aq = f.gep("%aq", f.op(f"mul i64 {tj}, %n"))
        per32 = f.op(f"mul i64 {tj}, %nb32")
        ad = f.op(f"getelementptr inbounds float, ptr %ad, i64 {per32}")
        s32 = f.op(f"getelementptr inbounds float, ptr %s32, i64 {per32}")
        is_ = f.op(f"getelementptr inbounds i32, ptr %is, i64 {f.op(f'mul i64 {tj}, %nb16')}")
        toks.append((aq, ad, s32, is_))
    f("br label %head")
    f.put_label("head")
    f("%i = phi i64 [0, %entry], [%i_next, %body]")
    phi_at = len(f.lines)
    f("%more = icmp ult i64 %i, %nblocks")
    f("br i1 %more, label %body, label %done")
    f.put_label("body")
    acc_phi = [f"%acc_{j}" for j in range(ntok)]
    acc = list(acc_phi)
    size = LEGACY_RECORD_BYTES[qname]
    rec = f.gep("%rec0", f.op(f"mul i64 %i, {size}"), "rec")
    distance = PREFETCH_RECORDS[qname]
    if distance:
        ahead = f.gep(rec, distance * size, "pf")
        for line in range(0, size, 64):
            f(f"call void @llvm.prefetch.p0(ptr {f.gep(ahead, line, 'pf')}, i32 0, i32 3, i32 1)")
    _block(f, qname, isa, rec, "%i", toks, acc)
    return packed_matmul.close_tile(f, qname, ntok, acc_phi, acc, phi_at)


def module_ir(qname: str, isa: str) -> str:
    """One module per repacked legacy type: the tile shapes plus packed_matmul's driver."""
    return "\n".join(
        [
            DECLARATIONS,
            f"declare void @llvm.masked.store.v16f32.p0({V16F}, ptr, i32, <16 x i1>)",
            f"declare {V64I8} @llvm.abs.v64i8({V64I8}, i1)",
            *(tile_function(qname, isa, nt) for nt in (TILE, *SMALL_TILES)),
            packed_matmul.kernel_function(qname),
        ]
    )
