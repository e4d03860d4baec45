"""IR for `out = x @ W.T` with float weights (F32, F16, BF16) read as stored.

16 weights at a time are widened to <16 x float> (fpext for F16; BF16 is the high half of an
F32, so zext + shift) and multiplied into a vector accumulator; a scalar loop covers the tail
when the row length is not a multiple of 16. Rows are split across the pool threads; every row
is used for all tokens while it is in L1.

Argument slots: `FloatMatmulSlots` (the IR reads them, engine/kernels/jit_backend.py fills them).
"""

from __future__ import annotations

from engine.kernels.ir import Fn, thread_range

V16F = "<16 x float>"
ELEM = {"F32": ("float", 4), "F16": ("half", 2), "BF16": ("i16", 2)}


class FloatMatmulSlots:
    """w, row_bytes, n_rows, cols, n_tokens, x (f32 [T, cols]), out (f32), out_stride (floats);
    SIZE: block length."""

    W, ROW_BYTES, N_ROWS, COLS, N_TOKENS, X, OUT, OUT_STRIDE, SIZE = range(9)


def _widen(f: Fn, kind: str, ptr: str, vector: bool) -> str:
    ty, _ = ELEM[kind]
    if vector:
        raw = f.load(f"<16 x {ty}>", ptr, 1, "w")
        if kind == "F32":
            return raw
        if kind == "F16":
            return f.op(f"fpext <16 x half> {raw} to {V16F}")
        wide = f.op(f"zext <16 x i16> {raw} to <16 x i32>")
        return f.op(
            f"bitcast <16 x i32> {f.op(f'shl <16 x i32> {wide}, splat (i32 16)')} to {V16F}"
        )
    raw = f.load(ty, ptr, 1, "w")
    if kind == "F32":
        return raw
    if kind == "F16":
        return f.op(f"fpext half {raw} to float")
    wide = f.op(f"zext i16 {raw} to i32")
    return f.op(f"bitcast i32 {f.op(f'shl i32 {wide}, 16')} to float")


def module_ir(kind: str) -> str:
    _, esize = ELEM[kind]
    f = Fn()
    s = FloatMatmulSlots
    w = f.arg("%args", s.W, "ptr")
    row_bytes = f.arg("%args", s.ROW_BYTES)
    n_rows = f.arg("%args", s.N_ROWS)
    cols = f.arg("%args", s.COLS)
    ntok = f.arg("%args", s.N_TOKENS)
    x = f.arg("%args", s.X, "ptr")
    out = f.arg("%args", s.OUT, "ptr")
    ostride = f.arg("%args", s.OUT_STRIDE)
    vec_end = f.op(f"and i64 {cols}, -16")
    r0, r1 = thread_range(f, n_rows, "%tid", "%nth", 4)
    f("br label %rh")
    f.put_label("rh")
    f(f"%r = phi i64 [{r0}, %entry], [%r_next, %th]")
    f(f"%rmore = icmp ult i64 %r, {r1}")
    f("br i1 %rmore, label %rb, label %exit")
    f.put_label("rb")
    wrow = f.gep(w, f.op(f"mul i64 %r, {row_bytes}"), "wrow")
    f("%r_next = add i64 %r, 1")
    f("br label %th")
    f.put_label("th")
    f("%t = phi i64 [0, %rb], [%t_next, %store]")
    f(f"%tmore = icmp ult i64 %t, {ntok}")
    f("br i1 %tmore, label %tb, label %rh")
    f.put_label("tb")
    xrow = f.op(f"getelementptr inbounds float, ptr {x}, i64 {f.op(f'mul i64 %t, {cols}')}")
    f("br label %vh")
    f.put_label("vh")
    f("%i = phi i64 [0, %tb], [%i_next, %vb]")
    f(f"%acc = phi {V16F} [zeroinitializer, %tb], [%acc_next, %vb]")
    f(f"%vmore = icmp ult i64 %i, {vec_end}")
    f("br i1 %vmore, label %vb, label %vdone")
    f.put_label("vb")
    wv = _widen(f, kind, f.gep(wrow, f.op(f"mul i64 %i, {esize}")), True)
    xv = f.load(V16F, f.op(f"getelementptr inbounds float, ptr {xrow}, i64 %i"), 4, "x")
    f(f"%acc_next = call {V16F} @llvm.fma.v16f32({V16F} {wv}, {V16F} {xv}, {V16F} %acc)")
    f("%i_next = add i64 %i, 16")
    f("br label %vh")
    f.put_label("vdone")
    f(f"%vsum = call reassoc float @llvm.vector.reduce.fadd.v16f32(float 0.0, {V16F} %acc)")
    f("br label %sh")
    f.put_label("sh")
    f("%j = phi i64 [%i, %vdone], [%j_next, %sb]")
    f("%s = phi float [%vsum, %vdone], [%s_next, %sb]")
    f(f"%smore = icmp ult i64 %j, {cols}")
    f("br i1 %smore, label %sb, label %store")
    f.put_label("sb")
    ws = _widen(f, kind, f.gep(wrow, f.op(f"mul i64 %j, {esize}")), False)
    xs = f.load("float", f.op(f"getelementptr inbounds float, ptr {xrow}, i64 %j"), 4, "x")
    f(f"%s_next = call float @llvm.fma.f32(float {ws}, float {xs}, float %s)")
    f("%j_next = add i64 %j, 1")
    f("br label %sh")
    f.put_label("store")
    idx = f.op(f"add i64 {f.op(f'mul i64 %t, {ostride}')}, %r")
    f(f"store float %s, ptr {f.op(f'getelementptr inbounds float, ptr {out}, i64 {idx}')}, align 4")
    f("%t_next = add i64 %t, 1")
    f("br label %th")
    f.put_label("exit")
    f("ret void")
    return f"""
declare {V16F} @llvm.fma.v16f32({V16F}, {V16F}, {V16F})
declare float @llvm.fma.f32(float, float, float)
declare float @llvm.vector.reduce.fadd.v16f32(float, {V16F})
define void @mmf_{kind}(ptr %args, i32 %tid, i32 %nth) {{
entry:
{f.text()}
}}
"""
