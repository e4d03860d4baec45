"""IR for `out = x @ W.T` straight from quantized GGUF blocks (decode mat-vec and prefill mat-mul).

How it works (the llama.cpp recipe, written as explicit vector IR):
  * the activations are quantized once per call to int8 in blocks of 32 (`quantize_q8` in
    act_quant.py): int8 values, one float scale da per 32, and da * (sum of every 16 values);
  * every 32 weights of a block are unpacked to 32 *unsigned* bytes u (nibbles, 5/6-bit values,
    |q| for Q8_0, whose sign moves onto the activations) so that
        weight = s_h * (u - offset) + b_h,
    s_h and b_h constant over each half h of 16 values (K-quants with 16-wide sub-blocks need
    the halves; the others repeat one value) and `offset` a per-format constant (8 for Q4_0,
    16 for Q5_0, 32 for Q6_K, 4 for Q3_K);
  * dot(u, a) is one `vpdpbusd` (AVX512-VNNI), or `pmaddubsw`+`pmaddwd` (AVX2), or widening
    multiplies (generic); two chunks go through one 512-bit instruction (<16 x i32>, lanes 0-3
    covering the first 16 values, 4-7 the next 16, ...). The constant offset is folded into
    the integer accumulator, which starts at -offset * sum(a) (computed once per token and
    shared by the tile's rows); the per-row mins b_h cost two scalar fmas;
  * sum_i w_i x_i = sum over chunks of da * (s . dot(u, a) + b . sums(a)), in float;
  * tiles of ROWS weight rows x TILE tokens: each block is unpacked once for TILE tokens and each
    activation chunk loaded once for ROWS rows; rows stay in L1 while activations stream from L2;
  * the rows of a tile are contiguous in memory, one stream, which the hardware prefetcher
    follows badly in short row-sized pieces: a software prefetch PREFETCH_TILES tiles ahead
    took the 262144 x 640 Q8_0 output mat-vec from 28 to 16 ms of CPU time.

Rows are split across the pool's work chunks. A kernel's argument block holds the i64 slots of
`QuantMatmulSlots` (the IR reads them, engine/kernels/jit_backend.py fills them).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

from engine.kernels.ir import Fn, mask, splat, thread_range
from engine.kernels.quant_chunk import Chunk
from engine.kernels.quant_iq import LAYOUTS_IQ, UNPACK_IQ, globals_ir, tile_rows_iq

TILE = 8  # tokens per weight-row pass in prefill (4 x 8 tiles: best of 4x4, 2x8, 4x6, 4x8)
ROWS = 4  # weight rows per pass (decode and prefill)
# Tiles for what is left after the TILE-token passes, largest first (batched decoding runs a few
# rows per step). Every (row, token) accumulator runs the same instructions in every tile shape,
# so a token's result does not depend on the tile it lands in (tests/test_batching_exact.py).
SMALL_TILES = (4, 2)
PREFETCH_TILES = 2  # software prefetch distance in row tiles (rows are one contiguous stream)


class QuantMatmulSlots:
    """w, row_bytes, n_rows, n_blocks (per row), n_tokens, aq (int8 [T, n]), ad (f32 [T, n/32]),
    sums (f32 [T, n/16], scale * sum of 16 int8), out (f32), n (= cols), out_stride (floats),
    sums32 (f32 [T, n/32]) and isums (i32 [T, n/16]), which only the repacked kernels read
    (packed_matmul.py, where ROW_BYTES is the bytes of a 16-row group); AQ..SUMS and
    SUMS32..ISUMS are act_quant's outputs. SIZE: block length."""

    W, ROW_BYTES, N_ROWS, N_BLOCKS, N_TOKENS, AQ, AD, SUMS, OUT, N, OUT_STRIDE = range(11)
    SUMS32, ISUMS, SIZE = 11, 12, 13


V32I8 = "<32 x i8>"
V8I32 = "<8 x i32>"
V8F = "<8 x float>"
V64I8 = "<64 x i8>"
V16I32 = "<16 x i32>"
V16F = "<16 x float>"


@dataclass(frozen=True)
class QuantLayout:
    name: str
    block: int  # weights per block
    size: int  # bytes per block


LAYOUTS = {
    "Q4_0": QuantLayout("Q4_0", 32, 18),
    "Q4_1": QuantLayout("Q4_1", 32, 20),
    "Q5_0": QuantLayout("Q5_0", 32, 22),
    "Q5_1": QuantLayout("Q5_1", 32, 24),
    "Q8_0": QuantLayout("Q8_0", 32, 34),
    "Q2_K": QuantLayout("Q2_K", 256, 84),
    "Q3_K": QuantLayout("Q3_K", 256, 110),
    "Q4_K": QuantLayout("Q4_K", 256, 144),
    "Q5_K": QuantLayout("Q5_K", 256, 176),
    "Q6_K": QuantLayout("Q6_K", 256, 210),
    **{name: QuantLayout(name, block, size) for name, (block, size) in LAYOUTS_IQ.items()},
}


# --- unpacking, one function per quant type ------------------------------------------------------


def _v(f: Fn, opname: str, v: str, k: int) -> str:
    """<32 x i8> op with a splatted constant (lshr/shl/and)."""
    return f.op(f"{opname} {V32I8} {v}, {splat(32, 'i8', k)}")


def _vor(f: Fn, a: str, b: str) -> str:
    return f.op(f"or {V32I8} {a}, {b}")


def _s(f: Fn, opname: str, v: str, k: int) -> str:
    """Scalar i8 op with a constant."""
    return f.op(f"{opname} i8 {v}, {k}")


def _sor(f: Fn, a: str, b: str) -> str:
    return f.op(f"or i8 {a}, {b}")


def _nibbles(f: Fn, ptr: str) -> str:
    """16 bytes -> 32 values: low nibbles then high nibbles (Q4_0/Q4_1/Q5_x element order)."""
    q = f.load("<16 x i8>", ptr)
    lo = f.op(f"and <16 x i8> {q}, {splat(16, 'i8', 15)}")
    hi = f.op(f"lshr <16 x i8> {q}, {splat(16, 'i8', 4)}")
    return f.op(f"shufflevector <16 x i8> {lo}, <16 x i8> {hi}, {mask(range(32))}")


def _bits_to_bytes(f: Fn, bits_i32: str, shift: int) -> str:
    """i32 bit mask -> <32 x i8> with (bit << shift) per lane."""
    m = f.op(f"bitcast i32 {bits_i32} to <32 x i1>")
    z = f.op(f"zext <32 x i1> {m} to {V32I8}")
    return f.op(f"shl {V32I8} {z}, {splat(32, 'i8', shift)}") if shift else z


def _fmul(f: Fn, a: str, b: str) -> str:
    return f.op(f"fmul float {a}, {b}", "fm")


def _fneg(f: Fn, a: str) -> str:
    return f.op(f"fneg float {a}", "fn")


def _byte(f: Fn, blk: str, off: int) -> str:
    return f.load("i8", f.gep(blk, off), 1, "b")


def _u8_to_float(f: Fn, v: str) -> str:
    return f.op(f"uitofp i8 {v} to float", "uf")


def _s8_to_float(f: Fn, v: str) -> str:
    return f.op(f"sitofp i8 {v} to float", "sf")


def unpack_q4_0(f, blk, c):
    d = f.half_to_float(blk)
    u = _nibbles(f, f.gep(blk, 2))
    return Chunk(u, (d, d), None, offset=8)


def unpack_q4_1(f, blk, c):
    d = f.half_to_float(blk)
    m = f.half_to_float(f.gep(blk, 2))
    u = _nibbles(f, f.gep(blk, 4))
    return Chunk(u, (d, d), (m, m))


def unpack_q5_0(f, blk, c):
    d = f.half_to_float(blk)
    qh = f.load("i32", f.gep(blk, 2))
    u = f.op(f"or {V32I8} {_nibbles(f, f.gep(blk, 6))}, {_bits_to_bytes(f, qh, 4)}")
    return Chunk(u, (d, d), None, offset=16)


def unpack_q5_1(f, blk, c):
    d = f.half_to_float(blk)
    m = f.half_to_float(f.gep(blk, 2))
    qh = f.load("i32", f.gep(blk, 4))
    u = f.op(f"or {V32I8} {_nibbles(f, f.gep(blk, 8))}, {_bits_to_bytes(f, qh, 4)}")
    return Chunk(u, (d, d), (m, m))


def unpack_q8_0(f, blk, c):
    d = f.half_to_float(blk)
    q = f.load(V32I8, f.gep(blk, 2))
    neg = f.op(f"sub {V32I8} zeroinitializer, {q}")
    isneg = f.op(f"icmp slt {V32I8} {q}, zeroinitializer")
    u = f.op(f"select <32 x i1> {isneg}, {V32I8} {neg}, {V32I8} {q}")
    return Chunk(u, (d, d), None, signed_src=q)


def _scale_min_k4(f: Fn, sc_ptr: str, j: int) -> tuple[str, str]:
    """6-bit (scale, min) of sub-block j from the 12 packed bytes of Q4_K/Q5_K."""
    if j < 4:
        sc = f.op(f"and i8 {_byte(f, sc_ptr, j)}, 63")
        m = f.op(f"and i8 {_byte(f, sc_ptr, j + 4)}, 63")
    else:
        hi4 = _byte(f, sc_ptr, j + 4)
        lo_j = _byte(f, sc_ptr, j - 4)
        lo_m = _byte(f, sc_ptr, j)
        sc = _sor(f, _s(f, "and", hi4, 15), _s(f, "shl", _s(f, "lshr", lo_j, 6), 4))
        m = _sor(f, _s(f, "lshr", hi4, 4), _s(f, "shl", _s(f, "lshr", lo_m, 6), 4))
    return sc, m


def unpack_q4_k(f, blk, c):
    d = f.half_to_float(blk)
    dmin = f.half_to_float(f.gep(blk, 2))
    sc, m = _scale_min_k4(f, f.gep(blk, 4), c)
    q = f.load(V32I8, f.gep(blk, 16 + 32 * (c // 2)))
    u = _v(f, "and", q, 15) if c % 2 == 0 else _v(f, "lshr", q, 4)
    s = _fmul(f, d, _u8_to_float(f, sc))
    b = _fneg(f, _fmul(f, dmin, _u8_to_float(f, m)))
    return Chunk(u, (s, s), (b, b))


def unpack_q5_k(f, blk, c):
    d = f.half_to_float(blk)
    dmin = f.half_to_float(f.gep(blk, 2))
    sc, m = _scale_min_k4(f, f.gep(blk, 4), c)
    q = f.load(V32I8, f.gep(blk, 48 + 32 * (c // 2)))
    lo = _v(f, "and", q, 15) if c % 2 == 0 else _v(f, "lshr", q, 4)
    qh = f.load(V32I8, f.gep(blk, 16))
    hb = _v(f, "and", _v(f, "lshr", qh, c), 1)
    u = _vor(f, lo, _v(f, "shl", hb, 4))
    s = _fmul(f, d, _u8_to_float(f, sc))
    b = _fneg(f, _fmul(f, dmin, _u8_to_float(f, m)))
    return Chunk(u, (s, s), (b, b))


def unpack_q6_k(f, blk, c):
    n, k = divmod(c, 4)
    ql = f.load(V32I8, f.gep(blk, 64 * n + 32 * (k % 2)))
    lo = _v(f, "and", ql, 15) if k < 2 else _v(f, "lshr", ql, 4)
    qh = f.load(V32I8, f.gep(blk, 128 + 32 * n))
    hi = _v(f, "and", _v(f, "lshr", qh, 2 * k), 3)
    u = _vor(f, lo, _v(f, "shl", hi, 4))
    d = f.half_to_float(f.gep(blk, 208))
    s = [_fmul(f, d, _s8_to_float(f, _byte(f, blk, 192 + 8 * n + 2 * k + h))) for h in (0, 1)]
    return Chunk(u, (s[0], s[1]), None, offset=32)


def unpack_q2_k(f, blk, c):
    n, j = divmod(c, 4)
    q = f.load(V32I8, f.gep(blk, 16 + 32 * n))
    u = _v(f, "and", _v(f, "lshr", q, 2 * j), 3)
    d = f.half_to_float(f.gep(blk, 80))
    dmin = f.half_to_float(f.gep(blk, 82))
    s, b = [], []
    for h in (0, 1):
        sb = _byte(f, blk, 8 * n + 2 * j + h)
        s.append(_fmul(f, d, _u8_to_float(f, f.op(f"and i8 {sb}, 15"))))
        b.append(_fneg(f, _fmul(f, dmin, _u8_to_float(f, f.op(f"lshr i8 {sb}, 4")))))
    return Chunk(u, (s[0], s[1]), (b[0], b[1]))


def unpack_q3_k(f, blk, c):
    n, j = divmod(c, 4)
    q = f.load(V32I8, f.gep(blk, 32 + 32 * n))
    lo = _v(f, "and", _v(f, "lshr", q, 2 * j), 3)
    hm = f.load(V32I8, blk)
    hb = _v(f, "and", _v(f, "lshr", hm, 4 * n + j), 1)
    u = _vor(f, lo, _v(f, "shl", hb, 2))  # q + 4, in 0..7
    d = f.half_to_float(f.gep(blk, 108))
    s = []
    for h in (0, 1):
        i = 8 * n + 2 * j + h
        low4 = (
            _s(f, "and", _byte(f, blk, 96 + i), 15)
            if i < 8
            else _s(f, "lshr", _byte(f, blk, 96 + i - 8), 4)
        )
        high2 = _s(f, "and", _s(f, "lshr", _byte(f, blk, 96 + 8 + i % 4), 2 * (i // 4)), 3)
        sc6 = _sor(f, low4, _s(f, "shl", high2, 4))
        sc = f.op(f"sub i8 {sc6}, 32")
        s.append(_fmul(f, d, _s8_to_float(f, sc)))
    return Chunk(u, (s[0], s[1]), None, offset=4)


UNPACK = {
    "Q4_0": unpack_q4_0,
    "Q4_1": unpack_q4_1,
    "Q5_0": unpack_q5_0,
    "Q5_1": unpack_q5_1,
    "Q8_0": unpack_q8_0,
    "Q2_K": unpack_q2_k,
    "Q3_K": unpack_q3_k,
    "Q4_K": unpack_q4_k,
    "Q5_K": unpack_q5_k,
    "Q6_K": unpack_q6_k,
}


def unpacker(qname: str, isa: str):
    """`(f, blk, c) -> Chunk` for values 32c..32c+31 of a block of `qname` (codebook types
    look values up differently per ISA)."""
    if qname in UNPACK_IQ:
        return functools.partial(UNPACK_IQ[qname], isa=isa)
    return UNPACK[qname]


# --- the u8 x s8 dot product per ISA ------------------------------------------------------------


def udot(f: Fn, isa: str, u: str, a: str, acc: str = "zeroinitializer") -> str:
    """<8 x i32>: acc + (lane i = sum of u[4i+k] * a[4i+k], k < 4), u unsigned, a signed."""
    if isa == "vnni":
        return f.op(
            f"call {V8I32} @llvm.x86.avx512.vpdpbusd.256({V8I32} {acc}, {V32I8} {u}, {V32I8} {a})",
            "dot",
        )
    if isa == "avx2":
        p16 = f.op(f"call <16 x i16> @llvm.x86.avx2.pmadd.ub.sw({V32I8} {u}, {V32I8} {a})")
        d = f.op(
            f"call {V8I32} @llvm.x86.avx2.pmadd.wd(<16 x i16> {p16}, "
            f"<16 x i16> {splat(16, 'i16', 1)})"
        )
        return d if acc == "zeroinitializer" else f.op(f"add {V8I32} {d}, {acc}", "dot")
    uw = f.op(f"zext {V32I8} {u} to <32 x i32>")
    aw = f.op(f"sext {V32I8} {a} to <32 x i32>")
    p = f.op(f"mul <32 x i32> {uw}, {aw}")
    parts = [
        f.op(
            f"shufflevector <32 x i32> {p}, <32 x i32> poison, "
            f"{mask([4 * k + i for i in range(4)] + [16 + 4 * k + i for i in range(4)])}"
        )
        for k in range(4)
    ]
    s01 = f.op(f"add {V8I32} {parts[0]}, {parts[1]}")
    s23 = f.op(f"add {V8I32} {parts[2]}, {parts[3]}")
    d = f.op(f"add {V8I32} {s01}, {s23}", "dot")
    return d if acc == "zeroinitializer" else f.op(f"add {V8I32} {d}, {acc}", "dot")


DECLARATIONS = f"""
declare {V8I32} @llvm.x86.avx512.vpdpbusd.256({V8I32}, {V32I8}, {V32I8})
declare {V16I32} @llvm.x86.avx512.vpdpbusd.512({V16I32}, {V64I8}, {V64I8})
declare float @llvm.vector.reduce.fadd.v16f32(float, {V16F})
declare {V16F} @llvm.fma.v16f32({V16F}, {V16F}, {V16F})
declare <16 x i16> @llvm.x86.avx2.pmadd.ub.sw({V32I8}, {V32I8})
declare {V8I32} @llvm.x86.avx2.pmadd.wd(<16 x i16>, <16 x i16>)
declare float @llvm.vector.reduce.fadd.v8f32(float, {V8F})
declare void @llvm.prefetch.p0(ptr, i32, i32, i32)
declare {V8F} @llvm.fma.v8f32({V8F}, {V8F}, {V8F})
"""


def _bcast(f: Fn, x: str) -> str:
    ins = f.op(f"insertelement {V8F} poison, float {x}, i32 0")
    return f.op(f"shufflevector {V8F} {ins}, {V8F} poison, {mask([0] * 8)}")


def _scale_vec(f: Fn, s0: str, s1: str) -> str:
    """<8 x float> (s0 x4, s1 x4): lanes 0-3 of a dot product cover the first 16 values."""
    if s0 == s1:
        return _bcast(f, s0)
    v0 = f.op(f"insertelement {V8F} poison, float {s0}, i32 0")
    v1 = f.op(f"insertelement {V8F} {v0}, float {s1}, i32 1")
    return f.op(f"shufflevector {V8F} {v1}, {V8F} poison, {mask([0] * 4 + [1] * 4)}")


def udot512(f: Fn, isa: str, u: str, a: str, acc: str = "zeroinitializer") -> str:
    """<16 x i32> dot of <64 x i8> vectors (two chunks); one vpdpbusd on zmm with VNNI."""
    if isa == "vnni":
        return f.op(
            f"call {V16I32} @llvm.x86.avx512.vpdpbusd.512({V16I32} {acc}, "
            f"{V64I8} {u}, {V64I8} {a})",
            "dot",
        )
    halves = []
    for h in (0, 1):
        sel = mask(range(32 * h, 32 * h + 32))
        uh = f.op(f"shufflevector {V64I8} {u}, {V64I8} poison, {sel}")
        ah = f.op(f"shufflevector {V64I8} {a}, {V64I8} poison, {sel}")
        acc_h = (
            acc
            if acc == "zeroinitializer"
            else f.op(
                f"shufflevector {V16I32} {acc}, {V16I32} poison, {mask(range(8 * h, 8 * h + 8))}"
            )
        )
        halves.append(udot(f, isa, uh, ah, acc_h))
    return f.op(f"shufflevector {V8I32} {halves[0]}, {V8I32} {halves[1]}, {mask(range(16))}", "dot")


def _concat(f: Fn, ty: str, n: int, a: str, b: str) -> str:
    return f.op(f"shufflevector <{n} x {ty}> {a}, <{n} x {ty}> {b}, {mask(range(2 * n))}")


def _emit_units(f: Fn, qname: str, isa: str, blk_of, b: str, units, toks, cur_v, cur_s) -> None:
    """Emit one loop iteration: `units` are lists of (block_delta, chunk) covering 32 (one
    chunk, <8 x float> accumulators) or 64 consecutive values (two chunks, one zmm dot)."""
    lay = LAYOUTS[qname]
    nrow = len(blk_of(0))
    for unit in units:
        width = len(unit)
        lanes = 8 * width
        vf = f"<{lanes} x float>"
        unpack = unpacker(qname, isa)
        per_chunk = [[unpack(f, blk, c) for blk in blk_of(db)] for db, c in unit]
        rows = list(zip(*per_chunk, strict=True))  # rows[i] = chunks of row i in this unit
        db0, c0 = unit[0]
        b0 = f.op(f"add i64 {b}, {db0}")
        e = f.op(f"add i64 {f.op(f'mul i64 {b0}, {lay.block}')}, {32 * c0}", "e")
        i32_ = f.op(f"lshr i64 {e}, 5")
        i16_ = f.op(f"lshr i64 {e}, 4")
        offset = rows[0][0].offset
        # per row: unsigned values, sign source and scale vector for the whole unit
        us, sgn, svs = [], [], []
        for chs in rows:
            if width == 1:
                us.append(chs[0].u)
                sgn.append(chs[0].signed_src)
                svs.append(_scale_vec(f, chs[0].s[0], chs[0].s[1]))
            else:
                us.append(_concat(f, "i8", 32, chs[0].u, chs[1].u))
                sgn.append(
                    None
                    if chs[0].signed_src is None
                    else _concat(f, "i8", 32, chs[0].signed_src, chs[1].signed_src)
                )
                svs.append(
                    _concat(
                        f,
                        "float",
                        8,
                        _scale_vec(f, chs[0].s[0], chs[0].s[1]),
                        _scale_vec(f, chs[1].s[0], chs[1].s[1]),
                    )
                )
        vi8 = f"<{32 * width} x i8>"
        vi32 = f"<{lanes} x i32>"
        for j, (_tj, aq, ad, as_) in enumerate(toks):
            a = f.load(vi8, f.gep(aq, e), 1, "act")
            dap = f.op(f"getelementptr inbounds float, ptr {ad}, i64 {i32_}")
            if width == 1:
                da = _bcast(f, f.load("float", dap, 4, "da"))
            else:
                d2 = f.load("<2 x float>", dap, 4, "da")
                da = f.op(
                    f"shufflevector <2 x float> {d2}, <2 x float> poison, {mask([0] * 8 + [1] * 8)}"
                )
            dot_fn = udot if width == 1 else udot512
            start = "zeroinitializer"
            if offset:
                # -offset * (sums of a over each 4 lanes), shared by every row of the tile
                corr = dot_fn(f, isa, splat(32 * width, "i8", offset), a)
                start = f.op(f"sub {vi32} zeroinitializer, {corr}", "ncorr")
            sums = None
            if rows[0][0].b is not None:
                sp = f.op(f"getelementptr inbounds float, ptr {as_}, i64 {i16_}")
                sums = [f.load("float", f.gep(sp, 4 * k), 4, "sa") for k in range(2 * width)]
                # per-32 sums, shared by the tile's rows (formats with one min per 32 values)
                sums32 = [
                    f.op(f"fadd float {sums[2 * k]}, {sums[2 * k + 1]}") for k in range(width)
                ]
            na = None
            for i in range(nrow):
                ai = a
                if sgn[i] is not None:
                    if na is None:
                        na = f.op(f"sub {vi8} zeroinitializer, {a}")
                    isneg = f.op(f"icmp slt {vi8} {sgn[i]}, zeroinitializer")
                    ai = f.op(f"select <{32 * width} x i1> {isneg}, {vi8} {na}, {vi8} {a}")
                dot = dot_fn(f, isa, us[i], ai, start)
                df = f.op(f"sitofp {vi32} {dot} to {vf}")
                sda = f.op(f"fmul {vf} {svs[i]}, {da}")
                cur_v[i, j] = f.op(
                    f"call {vf} @llvm.fma.v{lanes}f32({vf} {df}, {vf} {sda}, {vf} {cur_v[i, j]})"
                )
                if sums is not None:
                    # sums already carry the activation scale: sa_h = da * sum_h(q)
                    for k, ch in enumerate(rows[i]):
                        if ch.b[0] == ch.b[1]:  # one offset per 32 values: one fma
                            cur_s[i, j] = f.op(
                                f"call float @llvm.fma.f32(float {ch.b[0]}, float {sums32[k]}, float {cur_s[i, j]})"
                            )
                            continue
                        acc = f.op(
                            f"call float @llvm.fma.f32(float {ch.b[0]}, float {sums[2 * k]}, float {cur_s[i, j]})"
                        )
                        cur_s[i, j] = f.op(
                            f"call float @llvm.fma.f32(float {ch.b[1]}, float {sums[2 * k + 1]}, float {acc})"
                        )


def tile_function(qname: str, isa: str, nrow: int, ntok: int) -> str:
    """`tile(w, row_bytes, n_blocks, aq, ad, as, n, t, out, out_stride, r)`:
    out[t+j, r+i] for i < nrow, j < ntok. Each block of each row is unpacked once for ntok
    tokens, and each activation block loaded once for nrow rows (independent accumulators also
    hide the fma latency that a single running sum would expose). Values go 64 at a time (one
    512-bit dot): two chunks of a K-quant block, or two consecutive 32-blocks, then a tail
    loop takes an odd last 32-block."""
    lay = LAYOUTS[qname]
    chunks = lay.block // 32
    f = Fn()
    rows = [f.gep("%w", f.op(f"mul i64 %row_bytes, {i}"), "wr") for i in range(nrow)]
    toks = []
    for j in range(ntok):
        tj = f.op(f"add i64 %t, {j}")
        aq = f.gep("%aq", f.op(f"mul i64 {tj}, %n"))
        ad = f.op(f"getelementptr inbounds float, ptr %ad, i64 {f.op(f'mul i64 {tj}, %nb32')}")
        as_ = f.op(f"getelementptr inbounds float, ptr %as, i64 {f.op(f'mul i64 {tj}, %nb16')}")
        toks.append((tj, aq, ad, as_))
    keys = [(i, j) for i in range(nrow) for j in range(ntok)]
    if chunks > 1:
        step, units = 1, [[(0, c), (0, c + 1)] for c in range(0, chunks, 2)]
        main_end = "%nblocks"
    else:
        step, units = 2, [[(0, 0), (1, 0)]]
        main_end = f.op("and i64 %nblocks, -2")
    passes = [("m", "0", main_end, step, units, 16)]
    if chunks == 1:
        passes.append(("t", main_end, "%nblocks", 1, [[(0, 0)]], 8))
    prev_label, prev_s = "entry", {k: "0.0" for k in keys}
    finals_v = []
    for tag, b_start, b_end, bstep, unit_list, lanes in passes:
        vf = f"<{lanes} x float>"
        f(f"br label %{tag}_head")
        f.put_label(f"{tag}_head")
        b = f"%{tag}_b"
        f(f"{b} = phi i64 [{b_start}, %{prev_label}], [%{tag}_b_next, %{tag}_body]")
        phi_at = len(f.lines)  # accumulator phis go here once the body has named the next values
        f(f"%{tag}_more = icmp ult i64 {b}, {b_end}")
        f(f"br i1 %{tag}_more, label %{tag}_body, label %{tag}_done")
        f.put_label(f"{tag}_body")
        accv = {k: f"%{tag}_accv_{k[0]}_{k[1]}" for k in keys}
        accs = {k: f"%{tag}_accs_{k[0]}_{k[1]}" for k in keys}
        cur_v, cur_s = dict(accv), dict(accs)
        boff = f.op(f"mul i64 {b}, {lay.size}")
        blks = [f.gep(r, boff, "blk") for r in rows]
        if PREFETCH_TILES and tag == "m":
            # Rows are contiguous, so the tile's rows form one stream (too short for the
            # hardware prefetcher per row): fetch the same blocks PREFETCH_TILES tiles ahead.
            dist = f.op(f"mul i64 %row_bytes, {PREFETCH_TILES * nrow}")
            for blk in blks:
                for extra in range(0, lay.size * bstep, 64):
                    ahead = f.gep(f.gep(blk, dist, "pf"), extra, "pf")
                    f(f"call void @llvm.prefetch.p0(ptr {ahead}, i32 0, i32 3, i32 1)")

        def blk_of(db, blks=blks):
            return blks if db == 0 else [f.gep(x, lay.size * db, "blk") for x in blks]

        _emit_units(f, qname, isa, blk_of, b, unit_list, toks, cur_v, cur_s)
        phis = []
        for k in keys:
            phis.append(
                f"  {accv[k]} = phi {vf} [zeroinitializer, %{prev_label}], [{cur_v[k]}, %{tag}_body]"
            )
            phis.append(
                f"  {accs[k]} = phi float [{prev_s[k]}, %{prev_label}], [{cur_s[k]}, %{tag}_body]"
            )
        f.lines[phi_at:phi_at] = phis
        f(f"%{tag}_b_next = add i64 {b}, {bstep}")
        f(f"br label %{tag}_head")
        f.put_label(f"{tag}_done")
        finals_v.append((accv, lanes))
        prev_label, prev_s = f"{tag}_done", accs
    for i, j in keys:
        tj = toks[j][0]
        tot = prev_s[i, j]
        for accv, lanes in finals_v:
            red = f.op(
                f"call reassoc float @llvm.vector.reduce.fadd.v{lanes}f32(float 0.0, <{lanes} x float> {accv[i, j]})"
            )
            tot = f.op(f"fadd float {red}, {tot}")
        idx = f.op(f"add i64 {f.op(f'mul i64 {tj}, %ostride')}, {f.op(f'add i64 %r, {i}')}")
        f(
            f"store float {tot}, ptr {f.op(f'getelementptr inbounds float, ptr %out, i64 {idx}')}, align 4"
        )
    f("ret void")
    return (
        f"define internal void @tile_{qname}_{nrow}x{ntok}(ptr %w, i64 %row_bytes, i64 %nblocks, "
        f"ptr %aq, ptr %ad, ptr %as, i64 %n, i64 %t, ptr %out, i64 %ostride, i64 %r) alwaysinline {{\n"
        f"entry:\n  %nb32 = lshr i64 %n, 5\n  %nb16 = lshr i64 %n, 4\n{f.text()}\n}}\n"
    )


def _token_loop(
    f: Fn,
    qname: str,
    nrow: int,
    common: str,
    ntok: str,
    out: str,
    ostride: str,
    wrow: str,
    tag: str,
    after: str,
) -> None:
    """Emit: all tokens for `nrow` rows at %r (TILE at a time, then at most one tile of each
    SMALL_TILES size, then one by one); then br after."""
    pre = f.cur
    f(f"br label %{tag}_th")
    f.put_label(f"{tag}_th")
    f(f"%{tag}_t = phi i64 [0, %{pre}], [%{tag}_tn, %{tag}_tb]")
    f(f"%{tag}_te = add i64 %{tag}_t, {TILE}")
    f(f"%{tag}_fits = icmp ule i64 %{tag}_te, {ntok}")
    f(f"br i1 %{tag}_fits, label %{tag}_tb, label %{tag}_s{SMALL_TILES[0]}")
    f.put_label(f"{tag}_tb")
    f(
        f"call void @tile_{qname}_{nrow}x{TILE}(ptr {wrow}, {common}, i64 %{tag}_t, ptr {out}, i64 {ostride}, i64 %r)"
    )
    f(f"%{tag}_tn = add i64 %{tag}_t, {TILE}")
    f(f"br label %{tag}_th")
    # fewer than TILE tokens left (a batched decode step of a few sequences): one smaller tile
    # each, so a weight block is still unpacked once for several tokens
    t, t_from = f"%{tag}_t", f"{tag}_th"
    for k, size in enumerate(SMALL_TILES):
        nxt = f"{tag}_s{SMALL_TILES[k + 1]}" if k + 1 < len(SMALL_TILES) else f"{tag}_rh"
        f.put_label(f"{tag}_s{size}")
        f(f"%{tag}_s{size}_e = add i64 {t}, {size}")
        f(f"%{tag}_s{size}_fits = icmp ule i64 %{tag}_s{size}_e, {ntok}")
        f(f"br i1 %{tag}_s{size}_fits, label %{tag}_s{size}_b, label %{tag}_s{size}_j")
        f.put_label(f"{tag}_s{size}_b")
        f(
            f"call void @tile_{qname}_{nrow}x{size}(ptr {wrow}, {common}, i64 {t}, ptr {out}, i64 {ostride}, i64 %r)"
        )
        f(f"br label %{tag}_s{size}_j")
        f.put_label(f"{tag}_s{size}_j")
        f(f"%{tag}_s{size}_t = phi i64 [{t}, %{tag}_s{size}], [%{tag}_s{size}_e, %{tag}_s{size}_b]")
        f(f"br label %{nxt}")
        t, t_from = f"%{tag}_s{size}_t", f"{tag}_s{size}_j"
    f.put_label(f"{tag}_rh")
    f(f"%{tag}_t1 = phi i64 [{t}, %{t_from}], [%{tag}_t1n, %{tag}_rb]")
    f(f"%{tag}_more = icmp ult i64 %{tag}_t1, {ntok}")
    f(f"br i1 %{tag}_more, label %{tag}_rb, label %{after}")
    f.put_label(f"{tag}_rb")
    f(
        f"call void @tile_{qname}_{nrow}x1(ptr {wrow}, {common}, i64 %{tag}_t1, ptr {out}, i64 {ostride}, i64 %r)"
    )
    f(f"%{tag}_t1n = add i64 %{tag}_t1, 1")
    f(f"br label %{tag}_rh")


def tile_rows(qname: str, isa: str) -> int:
    """Weight rows per tile: ROWS, or the grid types' count for this ISA (quant_iq.tile_rows_iq:
    their scalar table lookups for ROWS rows of a super-block exhaust the registers)."""
    rows = tile_rows_iq(qname, isa)
    return ROWS if rows is None else rows


def kernel_function(qname: str, isa: str) -> str:
    """`mm_<type>(args, tid, n_threads)`: all tokens x this thread's rows, ROWS rows at a time."""
    f = Fn()
    s = QuantMatmulSlots
    w = f.arg("%args", s.W, "ptr")
    row_bytes = f.arg("%args", s.ROW_BYTES)
    n_rows = f.arg("%args", s.N_ROWS)
    nblocks = f.arg("%args", s.N_BLOCKS)
    ntok = f.arg("%args", s.N_TOKENS)
    aq, ad, as_ = (f.arg("%args", i, "ptr") for i in (s.AQ, s.AD, s.SUMS))
    out = f.arg("%args", s.OUT, "ptr")
    n = f.arg("%args", s.N)
    ostride = f.arg("%args", s.OUT_STRIDE)
    nrows = tile_rows(qname, isa)
    r0, r1 = thread_range(f, n_rows, "%tid", "%nth", nrows)
    r1_tiles = f.op(f"sub i64 {r1}, {r0}")
    r1_tiles = f.op(f"and i64 {r1_tiles}, {-nrows}")
    r1_tiles = f.op(f"add i64 {r1_tiles}, {r0}")
    common = f"i64 {row_bytes}, i64 {nblocks}, ptr {aq}, ptr {ad}, ptr {as_}, i64 {n}"
    # rows ROWS at a time
    f("br label %rh")
    f.put_label("rh")
    f(f"%r = phi i64 [{r0}, %entry], [%r_next, %rnext], [%r1_next, %r1next]")
    f(f"%rfits = icmp ult i64 %r, {r1_tiles}")
    f("br i1 %rfits, label %rtile, label %rrem")
    f.put_label("rtile")
    wrow = f.gep(w, f.op(f"mul i64 %r, {row_bytes}"), "wrow")
    _token_loop(f, qname, nrows, common, ntok, out, ostride, wrow, "rt", "rnext")
    f.put_label("rnext")
    f(f"%r_next = add i64 %r, {nrows}")
    f("br label %rh")
    # leftover rows one at a time
    f.put_label("rrem")
    f(f"%rmore = icmp ult i64 %r, {r1}")
    f("br i1 %rmore, label %r1body, label %exit")
    f.put_label("r1body")
    wrow1 = f.gep(w, f.op(f"mul i64 %r, {row_bytes}"), "wrow")
    _token_loop(f, qname, 1, common, ntok, out, ostride, wrow1, "r1", "r1next")
    f.put_label("r1next")
    f("%r1_next = add i64 %r, 1")
    f("br label %rh")
    f.put_label("exit")
    f("ret void")
    return f"define void @mm_{qname}(ptr %args, i32 %tid, i32 %nth) {{\nentry:\n{f.text()}\n}}\n"


def module_ir(qname: str, isa: str) -> str:
    """One module per quant type: the tile shapes plus the threaded driver."""
    return "\n".join(
        [
            DECLARATIONS,
            "declare float @llvm.fma.f32(float, float, float)",
            *([globals_ir(qname)] if qname in UNPACK_IQ else []),
            *(
                tile_function(qname, isa, nr, nt)
                for nr in dict.fromkeys((tile_rows(qname, isa), 1))
                for nt in (TILE, *SMALL_TILES, 1)
            ),
            kernel_function(qname, isa),
        ]
    )
