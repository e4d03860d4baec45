"""IR for the small per-token ops: RMSNorm, RoPE, and the gated activations (SwiGLU, GeGLU,
gpt-oss's clamped SwiGLU).

Each is one call instead of the 3-6 numpy passes (and temporaries) the reference needs.
Vector loops run 16 floats at a time with masked loads/stores for the tail, so any length works.
Work is split by (tid, n) like every pool kernel, so they can run on the pool or be called
directly with tid=0, n=1 (what the backend does for decode-sized inputs).

Argument slots: `RmsnormSlots`, `RopeSlots`, `GluSlots` (the IR reads them, jit_backend fills them).
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
        ]
    )
