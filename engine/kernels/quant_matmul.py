"""IR for `out = x @ W.T` straight from quantized GGUF blocks (decode mat-vec and prefill mat-mul).

How it works (the llama.cpp recipe, written as explicit vector IR):
  * the activations are quantized once per call to int8 in blocks of 32 (`quantize_q8` in
    activation_ir.py): int8 values, one float scale per 32, and the integer sum of every 16;
  * every 32 weights of a block are unpacked to 32 *unsigned* bytes u (nibbles, 5/6-bit values,
    |q| for Q8_0) so that weight = s * u + b, with the scale s and offset b constant over each
    half of 16 (K-quants with 16-wide sub-blocks need the halves; the others repeat one value);
  * dot(u, a) is one `vpdpbusd` (AVX512-VNNI), or `pmaddubsw`+`pmaddwd` (AVX2), or widening
    multiplies (generic) into <8 x i32>, lanes 0-3 covering the first 16 elements;
  * sum_i w_i x_i = da * (sum_h s_h * dot_h(u, a) + sum_h b_h * sum_h(a)), accumulated in float.
  * prefill processes a tile of TILE tokens per weight row: each block is unpacked once and used
    TILE times, and the row stays in L1 while the tokens' activations stream from L2.

Rows are split across the pool threads. A kernel's argument block holds i64 slots:
  0 w, 1 row_bytes, 2 n_rows, 3 n_blocks (per row), 4 n_tokens, 5 aq (int8 [T, n]),
  6 ad (f32 [T, n/32]), 7 as (f32 [T, n/16], scale * sum of 16 int8), 8 out (f32), 9 n (= cols), 10 out_stride (floats)
"""

from __future__ import annotations

from dataclasses import dataclass

from engine.kernels.ir import Fn, f32, mask, splat, thread_range

TILE = 4  # tokens per weight-row pass in prefill
ROWS = 4  # weight rows per pass (decode and prefill)
PREFETCH_TILES = 2  # software prefetch distance in row tiles (rows are one contiguous stream)

V32I8 = "<32 x i8>"
V8I32 = "<8 x i32>"
V8F = "<8 x float>"


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
}


@dataclass
class Chunk:
    """32 unpacked weights: value_i = s_h * u_i + b_h for half h = i // 16."""

    u: str  # <32 x i8>, unsigned values (or |q| when signed_src is set)
    s: tuple[str, str]
    b: tuple[str, str] | None  # None: no offset term
    signed_src: str | None = None  # the original signed <32 x i8> (Q8_0): sign moves to a


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
    b = _fmul(f, d, f32(-8.0))
    return Chunk(u, (d, d), (b, b))


def unpack_q4_1(f, blk, c):
    d = f.half_to_float(blk)
    m = f.half_to_float(f.gep(blk, 2))
    u = _nibbles(f, f.gep(blk, 4))
    return Chunk(u, (d, d), (m, m))


def unpack_q5_0(f, blk, c):
    d = f.half_to_float(blk)
    qh = f.load("i32", f.gep(blk, 2))
    u = f.op(f"or {V32I8} {_nibbles(f, f.gep(blk, 6))}, {_bits_to_bytes(f, qh, 4)}")
    b = _fmul(f, d, f32(-16.0))
    return Chunk(u, (d, d), (b, b))


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
    if c % 2 == 0:
        u = _v(f, "and", q, 15)
    else:
        u = _v(f, "lshr", q, 4)
    s = _fmul(f, d, _u8_to_float(f, sc))
    b = _fneg(f, _fmul(f, dmin, _u8_to_float(f, m)))
    return Chunk(u, (s, s), (b, b))


def unpack_q5_k(f, blk, c):
    d = f.half_to_float(blk)
    dmin = f.half_to_float(f.gep(blk, 2))
    sc, m = _scale_min_k4(f, f.gep(blk, 4), c)
    q = f.load(V32I8, f.gep(blk, 48 + 32 * (c // 2)))
    if c % 2 == 0:
        lo = _v(f, "and", q, 15)
    else:
        lo = _v(f, "lshr", q, 4)
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
    s = tuple(_fmul(f, d, _s8_to_float(f, _byte(f, blk, 192 + 8 * n + 2 * k + h))) for h in (0, 1))
    b = tuple(_fmul(f, sh, f32(-32.0)) for sh in s)
    return Chunk(u, s, b)


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
    return Chunk(u, tuple(s), tuple(b))


def unpack_q3_k(f, blk, c):
    n, j = divmod(c, 4)
    q = f.load(V32I8, f.gep(blk, 32 + 32 * n))
    lo = _v(f, "and", _v(f, "lshr", q, 2 * j), 3)
    hm = f.load(V32I8, blk)
    hb = _v(f, "and", _v(f, "lshr", hm, 4 * n + j), 1)
    u = _vor(f, lo, _v(f, "shl", hb, 2))  # q + 4, in 0..7
    d = f.half_to_float(f.gep(blk, 108))
    s, b = [], []
    for h in (0, 1):
        i = 8 * n + 2 * j + h
        low4 = (_s(f, "and", _byte(f, blk, 96 + i), 15) if i < 8
                else _s(f, "lshr", _byte(f, blk, 96 + i - 8), 4))
        high2 = _s(f, "and", _s(f, "lshr", _byte(f, blk, 96 + 8 + i % 4), 2 * (i // 4)), 3)
        sc6 = _sor(f, low4, _s(f, "shl", high2, 4))
        sc = f.op(f"sub i8 {sc6}, 32")
        sh = _fmul(f, d, _s8_to_float(f, sc))
        s.append(sh)
        b.append(_fmul(f, sh, f32(-4.0)))
    return Chunk(u, tuple(s), tuple(b))


UNPACK = {
    "Q4_0": unpack_q4_0, "Q4_1": unpack_q4_1, "Q5_0": unpack_q5_0, "Q5_1": unpack_q5_1,
    "Q8_0": unpack_q8_0, "Q2_K": unpack_q2_k, "Q3_K": unpack_q3_k, "Q4_K": unpack_q4_k,
    "Q5_K": unpack_q5_k, "Q6_K": unpack_q6_k,
}


# --- the u8 x s8 dot product per ISA ------------------------------------------------------------

def udot(f: Fn, isa: str, u: str, a: str) -> str:
    """<8 x i32>: lane i = sum of u[4i+k] * a[4i+k], k < 4 (u unsigned, a signed)."""
    if isa == "vnni":
        return f.op(f"call {V8I32} @llvm.x86.avx512.vpdpbusd.256({V8I32} zeroinitializer, "
                    f"{V32I8} {u}, {V32I8} {a})", "dot")
    if isa == "avx2":
        p16 = f.op(f"call <16 x i16> @llvm.x86.avx2.pmadd.ub.sw({V32I8} {u}, {V32I8} {a})")
        return f.op(f"call {V8I32} @llvm.x86.avx2.pmadd.wd(<16 x i16> {p16}, "
                    f"<16 x i16> {splat(16, 'i16', 1)})", "dot")
    uw = f.op(f"zext {V32I8} {u} to <32 x i32>")
    aw = f.op(f"sext {V32I8} {a} to <32 x i32>")
    p = f.op(f"mul <32 x i32> {uw}, {aw}")
    parts = [f.op(f"shufflevector <32 x i32> {p}, <32 x i32> poison, "
                  f"{mask([4 * k + i for i in range(4)] + [16 + 4 * k + i for i in range(4)])}")
             for k in range(4)]
    s01 = f.op(f"add {V8I32} {parts[0]}, {parts[1]}")
    s23 = f.op(f"add {V8I32} {parts[2]}, {parts[3]}")
    return f.op(f"add {V8I32} {s01}, {s23}", "dot")


DECLARATIONS = f"""
declare {V8I32} @llvm.x86.avx512.vpdpbusd.256({V8I32}, {V32I8}, {V32I8})
declare <16 x i16> @llvm.x86.avx2.pmadd.ub.sw({V32I8}, {V32I8})
declare {V8I32} @llvm.x86.avx2.pmadd.wd(<16 x i16>, <16 x i16>)
declare float @llvm.vector.reduce.fadd.v8f32(float, {V8F})
declare void @llvm.prefetch.p0(ptr, i32, i32, i32)
declare {V8F} @llvm.fma.v8f32({V8F}, {V8F}, {V8F})
"""


def _half_splat(f: Fn, s0: str, s1: str, times: str) -> str:
    """<8 x float> (s0*times x4, s1*times x4)."""
    if s0 == s1:
        v = f.op(f"fmul float {s0}, {times}")
        ins = f.op(f"insertelement {V8F} poison, float {v}, i32 0")
        return f.op(f"shufflevector {V8F} {ins}, {V8F} poison, {mask([0] * 8)}")
    a = f.op(f"fmul float {s0}, {times}")
    b = f.op(f"fmul float {s1}, {times}")
    v0 = f.op(f"insertelement {V8F} poison, float {a}, i32 0")
    v1 = f.op(f"insertelement {V8F} {v0}, float {b}, i32 1")
    return f.op(f"shufflevector {V8F} {v1}, {V8F} poison, {mask([0] * 4 + [1] * 4)}")


def tile_function(qname: str, isa: str, nrow: int, ntok: int) -> str:
    """`tile(w, row_bytes, n_blocks, aq, ad, as, n, t, out, out_stride, r)`:
    out[t+j, r+i] for i < nrow, j < ntok. Each block of each row is unpacked once for ntok
    tokens, and each activation block loaded once for nrow rows (independent accumulators also
    hide the fma latency that a single running sum would expose)."""
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
    f("br label %head")
    f.put_label("head")
    f("%b = phi i64 [0, %entry], [%b_next, %body]")
    phi_at = len(f.lines)  # accumulator phis go here once the body has named the next values
    f("%more = icmp ult i64 %b, %nblocks")
    f("br i1 %more, label %body, label %done")
    f.put_label("body")
    accv = {(i, j): f"%accv_{i}_{j}" for i in range(nrow) for j in range(ntok)}
    accs = {(i, j): f"%accs_{i}_{j}" for i in range(nrow) for j in range(ntok)}
    cur_v, cur_s = dict(accv), dict(accs)
    boff = f.op(f"mul i64 %b, {lay.size}")
    blks = [f.gep(r, boff, "blk") for r in rows]
    if PREFETCH_TILES:
        # Rows are separate streams; ask for the bytes a few blocks ahead explicitly.
        # Rows are contiguous, so the tile's rows form one stream: fetch the same blocks of the
        # tile PREFETCH_TILES ahead.
        dist = f.op(f"mul i64 %row_bytes, {PREFETCH_TILES * nrow}")
        for blk in blks:
            ahead = f.gep(blk, dist, "pf")
            f(f"call void @llvm.prefetch.p0(ptr {ahead}, i32 0, i32 3, i32 1)")
    for c in range(chunks):
        chs = [UNPACK[qname](f, blk, c) for blk in blks]
        e = f.op(f"add i64 {f.op(f'mul i64 %b, {lay.block}')}, {32 * c}", "e")
        i32_ = f.op(f"lshr i64 {e}, 5")
        i16_ = f.op(f"lshr i64 {e}, 4")
        for j, (_tj, aq, ad, as_) in enumerate(toks):
            a = f.load(V32I8, f.gep(aq, e), 1, "act")
            da = f.load("float", f.op(f"getelementptr inbounds float, ptr {ad}, i64 {i32_}"), 4, "da")
            sums = None
            if chs[0].b is not None:
                sp = f.op(f"getelementptr inbounds float, ptr {as_}, i64 {i16_}")
                sums = (f.load("float", sp, 4, "sa"), f.load("float", f.gep(sp, 4), 4, "sa"))
            for i, ch in enumerate(chs):
                ai = a
                if ch.signed_src is not None:
                    na = f.op(f"sub {V32I8} zeroinitializer, {a}")
                    isneg = f.op(f"icmp slt {V32I8} {ch.signed_src}, zeroinitializer")
                    ai = f.op(f"select <32 x i1> {isneg}, {V32I8} {na}, {V32I8} {a}")
                dot = udot(f, isa, ch.u, ai)
                df = f.op(f"sitofp {V8I32} {dot} to {V8F}")
                sv = _half_splat(f, ch.s[0], ch.s[1], da)
                cur_v[i, j] = f.op(f"call {V8F} @llvm.fma.v8f32({V8F} {df}, {V8F} {sv}, {V8F} {cur_v[i, j]})")
                if sums is not None:
                    # sums already carry the activation scale: sa_h = da * sum_h(q)
                    acc = f.op(f"call float @llvm.fma.f32(float {ch.b[0]}, float {sums[0]}, float {cur_s[i, j]})")
                    cur_s[i, j] = f.op(f"call float @llvm.fma.f32(float {ch.b[1]}, float {sums[1]}, float {acc})")
    phis = []
    for key in accv:
        phis.append(f"  {accv[key]} = phi {V8F} [zeroinitializer, %entry], [{cur_v[key]}, %body]")
        phis.append(f"  {accs[key]} = phi float [0.0, %entry], [{cur_s[key]}, %body]")
    f.lines[phi_at:phi_at] = phis
    f("%b_next = add i64 %b, 1")
    f("br label %head")
    f.put_label("done")
    for (i, j) in accv:
        tj = toks[j][0]
        red = f.op(f"call reassoc float @llvm.vector.reduce.fadd.v8f32(float 0.0, {V8F} {accv[i, j]})")
        tot = f.op(f"fadd float {red}, {accs[i, j]}")
        idx = f.op(f"add i64 {f.op(f'mul i64 {tj}, %ostride')}, {f.op(f'add i64 %r, {i}')}")
        f(f"store float {tot}, ptr {f.op(f'getelementptr inbounds float, ptr %out, i64 {idx}')}, align 4")
    f("ret void")
    return (f"define internal void @tile_{qname}_{nrow}x{ntok}(ptr %w, i64 %row_bytes, i64 %nblocks, "
            f"ptr %aq, ptr %ad, ptr %as, i64 %n, i64 %t, ptr %out, i64 %ostride, i64 %r) alwaysinline {{\n"
            f"entry:\n  %nb32 = lshr i64 %n, 5\n  %nb16 = lshr i64 %n, 4\n{f.text()}\n}}\n")


def _token_loop(f: Fn, qname: str, nrow: int, common: str, ntok: str, out: str, ostride: str,
                wrow: str, tag: str, after: str) -> None:
    """Emit: all tokens (TILE at a time, then one by one) for `nrow` rows at %r; then br after."""
    pre = f.cur
    f(f"br label %{tag}_th")
    f.put_label(f"{tag}_th")
    f(f"%{tag}_t = phi i64 [0, %{pre}], [%{tag}_tn, %{tag}_tb]")
    f(f"%{tag}_te = add i64 %{tag}_t, {TILE}")
    f(f"%{tag}_fits = icmp ule i64 %{tag}_te, {ntok}")
    f(f"br i1 %{tag}_fits, label %{tag}_tb, label %{tag}_rh")
    f.put_label(f"{tag}_tb")
    f(f"call void @tile_{qname}_{nrow}x{TILE}(ptr {wrow}, {common}, i64 %{tag}_t, ptr {out}, i64 {ostride}, i64 %r)")
    f(f"%{tag}_tn = add i64 %{tag}_t, {TILE}")
    f(f"br label %{tag}_th")
    f.put_label(f"{tag}_rh")
    f(f"%{tag}_t1 = phi i64 [%{tag}_t, %{tag}_th], [%{tag}_t1n, %{tag}_rb]")
    f(f"%{tag}_more = icmp ult i64 %{tag}_t1, {ntok}")
    f(f"br i1 %{tag}_more, label %{tag}_rb, label %{after}")
    f.put_label(f"{tag}_rb")
    f(f"call void @tile_{qname}_{nrow}x1(ptr {wrow}, {common}, i64 %{tag}_t1, ptr {out}, i64 {ostride}, i64 %r)")
    f(f"%{tag}_t1n = add i64 %{tag}_t1, 1")
    f(f"br label %{tag}_rh")


def kernel_function(qname: str) -> str:
    """`mm_<type>(args, tid, n_threads)`: all tokens x this thread's rows, ROWS rows at a time."""
    f = Fn()
    w = f.arg("%args", 0, "ptr")
    row_bytes = f.arg("%args", 1)
    n_rows = f.arg("%args", 2)
    nblocks = f.arg("%args", 3)
    ntok = f.arg("%args", 4)
    aq, ad, as_ = (f.arg("%args", i, "ptr") for i in (5, 6, 7))
    out = f.arg("%args", 8, "ptr")
    n = f.arg("%args", 9)
    ostride = f.arg("%args", 10)
    r0, r1 = thread_range(f, n_rows, "%tid", "%nth", ROWS)
    r1_tiles = f.op(f"sub i64 {r1}, {r0}")
    r1_tiles = f.op(f"and i64 {r1_tiles}, {-ROWS}")
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
    _token_loop(f, qname, ROWS, common, ntok, out, ostride, wrow, "rt", "rnext")
    f.put_label("rnext")
    f(f"%r_next = add i64 %r, {ROWS}")
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
    return "\n".join([
        DECLARATIONS,
        "declare float @llvm.fma.f32(float, float, float)",
        *(tile_function(qname, isa, nr, nt) for nr in (ROWS, 1) for nt in (TILE, 1)),
        kernel_function(qname),
    ])
