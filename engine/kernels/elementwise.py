"""IR for the small per-token ops: RMSNorm, RoPE, the gated activations (SwiGLU, GeGLU,
gpt-oss's clamped SwiGLU), and for a decode step's native step list (jit_backend's `step_*`):
a float add (residual and bias adds) and the float16 KV-row store.

Each is one call instead of the 3-6 numpy passes (and temporaries) the reference needs.
Vector loops run 16 floats at a time with masked loads/stores for the tail, so any length works.
Work is split by (tid, n) like every pool kernel, so they can run on the pool or be called
directly with tid=0, n=1 (what the backend does for decode-sized inputs).

Argument slots: `RmsnormSlots`, `RopeSlots`, `GluSlots`, `AddSlots`, `KvStoreSlots` (the IR reads them, jit_backend fills them).
"""

from __future__ import annotations

from engine.kernels.ir import Fn, f32, thread_range
from engine.kernels.vec16 import (
    MASKED_F32_DECLS,
    V16F,
    float_arg,
    mask16,
    masked_load16,
    masked_store16,
    splat16,
)
from engine.kernels.vmath import VEXP16


class RmsnormSlots:
    """x, out, weight (f32), rows, d (row length), eps (float32 bits); SIZE: block length."""

    X, OUT, WEIGHT, ROWS, D, EPS, SIZE = range(7)


class RopeSlots:
    """x (T, H, hd) rotated in place, positions (i64 [T]), T, H, hd, inv_freq (f64 [n_rot/2],
    freq_scale and per-pair divisors folded in), neox (0/1), n_rot (the leading dims of each
    head that rotate, even, <= hd; Phi-4-mini's partial RoPE); SIZE: block length."""

    X, POSITIONS, N_TOKENS, HEADS, HEAD_DIM, INV_FREQ, NEOX, N_ROT, SIZE = range(9)


class AddSlots:
    """add_f32: a, b, out (f32), count; SIZE: block length."""

    A, B, OUT, COUNT, SIZE = range(5)


class KvStoreSlots:
    """kv_store_f16: src (f32 [count]), dst (f16 cache rows), pos (ptr to the i64 position),
    count (values per position); SIZE: block length."""

    SRC, DST, POS, COUNT, SIZE = range(5)


class GluSlots:
    """swiglu / geglu / swiglu_oai: gate, up, out (f32), count, alpha and limit (float32 bits,
    read by swiglu_oai only); SIZE: block length."""

    GATE, UP, OUT, COUNT, ALPHA, LIMIT, SIZE = range(7)


def rmsnorm_ir() -> str:
    f = Fn()
    s = RmsnormSlots
    x, out, w = (f.arg("%args", i, "ptr") for i in (s.X, s.OUT, s.WEIGHT))
    rows = f.arg("%args", s.ROWS)
    d = f.arg("%args", s.D)
    eps = float_arg(f, s.EPS)
    r0, r1 = thread_range(f, rows, "%tid", "%nth")
    df = f.op(f"uitofp i64 {d} to float")
    f("br label %rh")
    f.put_label("rh")
    f(f"%r = phi i64 [{r0}, %entry], [%r_next, %nb_end]")
    f(f"%rmore = icmp ult i64 %r, {r1}")
    f("br i1 %rmore, label %rb, label %exit")
    f.put_label("rb")
    base = f.op(f"mul i64 %r, {d}")
    xr = f.op(f"getelementptr inbounds float, ptr {x}, i64 {base}")
    orow = f.op(f"getelementptr inbounds float, ptr {out}, i64 {base}")
    f("br label %sh")
    f.put_label("sh")
    f("%i = phi i64 [0, %rb], [%i_next, %sb]")
    f(f"%ss = phi {V16F} [zeroinitializer, %rb], [%ss_next, %sb]")
    f(f"%smore = icmp ult i64 %i, {d}")
    f("br i1 %smore, label %sb, label %sdone")
    f.put_label("sb")
    m = mask16(f, "%i", d)
    xv = masked_load16(f, xr, "%i", m)
    f(f"%ss_next = call {V16F} @llvm.fma.v16f32({V16F} {xv}, {V16F} {xv}, {V16F} %ss)")
    f("%i_next = add i64 %i, 16")
    f("br label %sh")
    f.put_label("sdone")
    tot = f.op(f"call reassoc float @llvm.vector.reduce.fadd.v16f32(float 0.0, {V16F} %ss)")
    mean = f.op(f"fdiv float {tot}, {df}")
    root = f.op(f"call float @llvm.sqrt.f32(float {f.op(f'fadd float {mean}, {eps}')})")
    inv = f.op(f"fdiv float 1.0, {root}")
    invv = splat16(f, inv)
    f("br label %nh")
    f.put_label("nh")
    f("%j = phi i64 [0, %sdone], [%j_next, %nb]")
    f(f"%jmore = icmp ult i64 %j, {d}")
    f("br i1 %jmore, label %nb, label %nb_end")
    f.put_label("nb")
    m2 = mask16(f, "%j", d)
    xv2 = masked_load16(f, xr, "%j", m2)
    wv = masked_load16(f, w, "%j", m2)
    y = f.op(f"fmul {V16F} {f.op(f'fmul {V16F} {xv2}, {invv}')}, {wv}")
    masked_store16(f, y, orow, "%j", m2)
    f("%j_next = add i64 %j, 16")
    f("br label %nh")
    f.put_label("nb_end")
    f("%r_next = add i64 %r, 1")
    f("br label %rh")
    f.put_label("exit")
    f("ret void")
    return f"define void @rmsnorm(ptr %args, i32 %tid, i32 %nth) {{\nentry:\n{f.text()}\n}}\n"


def glu_ir(kind: str) -> str:
    """out = act(gate) * up; act = silu (swiglu) or gelu_tanh (geglu). swiglu_oai (gpt-oss):
    g = min(gate, limit), out = g * sigmoid(alpha g) * (clamp(up, -limit, limit) + 1)."""
    f = Fn()
    s = GluSlots
    gate, up, out = (f.arg("%args", i, "ptr") for i in (s.GATE, s.UP, s.OUT))
    count = f.arg("%args", s.COUNT)
    if kind == "swiglu_oai":
        alpha = splat16(f, float_arg(f, s.ALPHA))
        limit = float_arg(f, s.LIMIT)
        hi = splat16(f, limit)
        lo = splat16(f, f.op(f"fneg float {limit}"))
    c0, c1 = thread_range(f, count, "%tid", "%nth", 16)
    f("br label %h")
    f.put_label("h")
    f(f"%i = phi i64 [{c0}, %entry], [%i_next, %b]")
    f(f"%more = icmp ult i64 %i, {c1}")
    f("br i1 %more, label %b, label %exit")
    f.put_label("b")
    m = mask16(f, "%i", c1)
    g = masked_load16(f, gate, "%i", m)
    u = masked_load16(f, up, "%i", m)
    if kind == "swiglu":
        e = f.op(f"call {V16F} @vexp16({V16F} {f.op(f'fneg {V16F} {g}')})")
        den = f.op(f"fadd {V16F} {e}, splat (float 1.0)")
        act = f.op(f"fdiv {V16F} {g}, {den}")
    elif kind == "swiglu_oai":  # (VEXP16 declares minnum / maxnum)
        g = f.op(f"call {V16F} @llvm.minnum.v16f32({V16F} {g}, {V16F} {hi})")
        u = f.op(f"call {V16F} @llvm.minnum.v16f32({V16F} {u}, {V16F} {hi})")
        u = f.op(f"call {V16F} @llvm.maxnum.v16f32({V16F} {u}, {V16F} {lo})")
        u = f.op(f"fadd {V16F} {u}, splat (float 1.0)")
        ag = f.op(f"fmul {V16F} {g}, {alpha}")
        e = f.op(f"call {V16F} @vexp16({V16F} {f.op(f'fneg {V16F} {ag}')})")
        den = f.op(f"fadd {V16F} {e}, splat (float 1.0)")
        act = f.op(f"fdiv {V16F} {g}, {den}")
    else:
        g3 = f.op(f"fmul {V16F} {f.op(f'fmul {V16F} {g}, {g}')}, {g}")
        inner = f.op(
            f"call {V16F} @llvm.fma.v16f32({V16F} {g3}, {V16F} splat (float {f32(0.044715)}), {V16F} {g})"
        )
        y2 = f.op(f"fmul {V16F} {inner}, splat (float {f32(2.0 * 0.7978845608028654)})")
        e = f.op(f"call {V16F} @vexp16({V16F} {y2})")
        # tanh(y) = 1 - 2 / (exp(2y) + 1); exact limits at +-inf
        e1 = f.op(f"fadd {V16F} {e}, splat (float 1.0)")
        th = f.op(f"fsub {V16F} splat (float 1.0), {f.op(f'fdiv {V16F} splat (float 2.0), {e1}')}")
        half_g = f.op(f"fmul {V16F} {g}, splat (float 0.5)")
        act = f.op(f"call {V16F} @llvm.fma.v16f32({V16F} {half_g}, {V16F} {th}, {V16F} {half_g})")
    masked_store16(f, f.op(f"fmul {V16F} {act}, {u}"), out, "%i", m)
    f("%i_next = add i64 %i, 16")
    f("br label %h")
    f.put_label("exit")
    f("ret void")
    return f"define void @{kind}(ptr %args, i32 %tid, i32 %nth) {{\nentry:\n{f.text()}\n}}\n"


def add_ir() -> str:
    """out = a + b over `count` floats (the residual adds and bias adds of a decode step; the
    same IEEE sums numpy's `+=` gives)."""
    return binary_f32_ir("add_f32", "fadd", AddSlots)


def binary_f32_ir(name: str, instruction: str, s: type[AddSlots]) -> str:
    """`out = a <instruction> b` over `count` floats, 16 lanes at a time with a masked tail, the
    threads taking contiguous ranges. `s` names the slots A, B, OUT and COUNT of the block (any
    class with AddSlots' layout)."""
    f = Fn()
    a, b, out = (f.arg("%args", i, "ptr") for i in (s.A, s.B, s.OUT))
    count = f.arg("%args", s.COUNT)
    c0, c1 = thread_range(f, count, "%tid", "%nth", 16)
    f("br label %h")
    f.put_label("h")
    f(f"%i = phi i64 [{c0}, %entry], [%i_next, %b]")
    f(f"%more = icmp ult i64 %i, {c1}")
    f("br i1 %more, label %b, label %exit")
    f.put_label("b")
    m = mask16(f, "%i", c1)
    y = f.op(f"{instruction} {V16F} {masked_load16(f, a, '%i', m)}, {masked_load16(f, b, '%i', m)}")
    masked_store16(f, y, out, "%i", m)
    f("%i_next = add i64 %i, 16")
    f("br label %h")
    f.put_label("exit")
    f("ret void")
    return f"define void @{name}(ptr %args, i32 %tid, i32 %nth) {{\nentry:\n{f.text()}\n}}\n"


def kv_store_ir() -> str:
    """dst[pos * count + i] = half(src[i]) for i < count (a multiple of 16), pos read from
    *pos_ptr at the call: one position's K or V rows into a float16 cache. Rounded to nearest
    even as numpy's float32 -> float16 assignment rounds, in integer code (F Giesen's
    float_to_half_fast3_rtne): `fptrunc` to half would call the runtime's __truncsfhf2 on CPUs
    without F16C, which MCJIT cannot resolve. Not split across threads (a row is a few hundred
    values)."""
    v16i = "<16 x i32>"
    f = Fn()
    s = KvStoreSlots
    src, dst, pos_p = (f.arg("%args", i, "ptr") for i in (s.SRC, s.DST, s.POS))
    count = f.arg("%args", s.COUNT)
    pos = f.load("i64", pos_p, 8)
    row = f.op(f"getelementptr inbounds half, ptr {dst}, i64 {f.op(f'mul i64 {pos}, {count}')}")
    f("br label %h")
    f.put_label("h")
    f("%i = phi i64 [0, %entry], [%i_next, %b]")
    f(f"%more = icmp ult i64 %i, {count}")
    f("br i1 %more, label %b, label %exit")
    f.put_label("b")
    xv = f.load(V16F, f.op(f"getelementptr inbounds float, ptr {src}, i64 %i"), 4)
    bits = f.op(f"bitcast {V16F} {xv} to {v16i}")
    sign = f.op(f"and {v16i} {bits}, splat (i32 -2147483648)")
    mag = f.op(f"xor {v16i} {bits}, {sign}")
    # |x| >= 65536: infinity, or a quiet NaN for NaNs
    nan = f.op(f"icmp ugt {v16i} {mag}, splat (i32 2139095040)")
    big = f.op(f"select <16 x i1> {nan}, {v16i} splat (i32 32256), {v16i} splat (i32 31744)")
    # |x| < 2^-14: a half subnormal; adding 0.5 rounds it to the 2^-24 grid (in float, RNE)
    magf = f.op(f"bitcast {v16i} {mag} to {V16F}")
    den = f.op(f"fadd {V16F} {magf}, splat (float 0.5)")
    den = f.op(f"sub {v16i} {f.op(f'bitcast {V16F} {den} to {v16i}')}, splat (i32 1056964608)")
    # normal: rebias the exponent, round the 13 dropped bits to nearest even
    odd = f.op(f"and {v16i} {f.op(f'lshr {v16i} {mag}, splat (i32 13)')}, splat (i32 1)")
    nrm = f.op(f"add {v16i} {mag}, splat (i32 -939520001)")  # (15 - 127) << 23, + 0xfff
    nrm = f.op(f"lshr {v16i} {f.op(f'add {v16i} {nrm}, {odd}')}, splat (i32 13)")
    is_big = f.op(f"icmp uge {v16i} {mag}, splat (i32 1199570944)")  # 143 << 23
    is_den = f.op(f"icmp ult {v16i} {mag}, splat (i32 947912704)")  # 113 << 23
    h = f.op(f"select <16 x i1> {is_den}, {v16i} {den}, {v16i} {nrm}")
    h = f.op(f"select <16 x i1> {is_big}, {v16i} {big}, {v16i} {h}")
    h = f.op(f"or {v16i} {h}, {f.op(f'lshr {v16i} {sign}, splat (i32 16)')}")
    dp = f.op(f"getelementptr inbounds i16, ptr {row}, i64 %i")
    f(f"store <16 x i16> {f.op(f'trunc {v16i} {h} to <16 x i16>')}, ptr {dp}, align 2")
    f("%i_next = add i64 %i, 16")
    f("br label %h")
    f.put_label("exit")
    f("ret void")
    return f"define void @kv_store_f16(ptr %args, i32 %tid, i32 %nth) {{\nentry:\n{f.text()}\n}}\n"


def rope_ir() -> str:
    f = Fn()
    s = RopeSlots
    x = f.arg("%args", s.X, "ptr")
    pos = f.arg("%args", s.POSITIONS, "ptr")
    ntok = f.arg("%args", s.N_TOKENS)
    heads = f.arg("%args", s.HEADS)
    hd = f.arg("%args", s.HEAD_DIM)
    invf = f.arg("%args", s.INV_FREQ, "ptr")
    neox = f.op(f"icmp ne i64 {f.arg('%args', s.NEOX)}, 0")
    half = f.op(f"lshr i64 {f.arg('%args', s.N_ROT)}, 1")
    t0, t1 = thread_range(f, ntok, "%tid", "%nth")
    f("br label %th")
    f.put_label("th")
    f(f"%t = phi i64 [{t0}, %entry], [%t_next, %ih]")
    f(f"%tmore = icmp ult i64 %t, {t1}")
    f("br i1 %tmore, label %tb, label %exit")
    f.put_label("tb")
    p = f.load("i64", f.op(f"getelementptr inbounds i64, ptr {pos}, i64 %t"), 8)
    pf = f.op(f"sitofp i64 {p} to double")
    trow = f.op(f"mul i64 %t, {f.op(f'mul i64 {heads}, {hd}')}")
    f("%t_next = add i64 %t, 1")
    f("br label %ih")
    f.put_label("ih")
    f("%i = phi i64 [0, %tb], [%i_next, %hh]")
    f(f"%imore = icmp ult i64 %i, {half}")
    f("br i1 %imore, label %ib, label %th")
    f.put_label("ib")
    fr = f.load("double", f.op(f"getelementptr inbounds double, ptr {invf}, i64 %i"), 8)
    ang = f.op(f"fmul double {pf}, {fr}")
    c = f.op(f"fptrunc double {f.op(f'call double @llvm.cos.f64(double {ang})')} to float")
    sin = f.op(f"fptrunc double {f.op(f'call double @llvm.sin.f64(double {ang})')} to float")
    ia = f.op(f"select i1 {neox}, i64 %i, i64 {f.op('shl i64 %i, 1')}")
    ib = f.op(
        f"select i1 {neox}, i64 {f.op(f'add i64 %i, {half}')}, i64 {f.op(f'add i64 {ia}, 1')}"
    )
    f("%i_next = add i64 %i, 1")
    f("br label %hh")
    f.put_label("hh")
    f("%h = phi i64 [0, %ib], [%h_next, %hb]")
    f(f"%hmore = icmp ult i64 %h, {heads}")
    f("br i1 %hmore, label %hb, label %ih")
    f.put_label("hb")
    base = f.op(f"add i64 {trow}, {f.op(f'mul i64 %h, {hd}')}")
    pa = f.op(f"getelementptr inbounds float, ptr {x}, i64 {f.op(f'add i64 {base}, {ia}')}")
    pb = f.op(f"getelementptr inbounds float, ptr {x}, i64 {f.op(f'add i64 {base}, {ib}')}")
    a = f.load("float", pa, 4)
    b = f.load("float", pb, 4)
    na = f.op(f"fsub float {f.op(f'fmul float {a}, {c}')}, {f.op(f'fmul float {b}, {sin}')}")
    nb = f.op(f"fadd float {f.op(f'fmul float {a}, {sin}')}, {f.op(f'fmul float {b}, {c}')}")
    f(f"store float {na}, ptr {pa}, align 4")
    f(f"store float {nb}, ptr {pb}, align 4")
    f("%h_next = add i64 %h, 1")
    f("br label %hh")
    f.put_label("exit")
    f("ret void")
    return f"define void @rope(ptr %args, i32 %tid, i32 %nth) {{\nentry:\n{f.text()}\n}}\n"


def module_ir() -> str:
    return "\n".join(
        [
            VEXP16,
            MASKED_F32_DECLS,
            "declare float @llvm.sqrt.f32(float)",
            "declare double @llvm.cos.f64(double)",
            "declare double @llvm.sin.f64(double)",
            rmsnorm_ir(),
            glu_ir("swiglu"),
            glu_ir("geglu"),
            glu_ir("swiglu_oai"),
            rope_ir(),
            add_ir(),
            kv_store_ir(),
        ]
    )
