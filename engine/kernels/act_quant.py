"""IR for quantizing activations to int8 blocks of 32 before a quantized mat-mul (Q8_0 style).

Per token row x (n floats, n a multiple of 32) it writes
  aq: int8 [n]       q_i = round(x_i / d) with d = max|x| / 127 over the block of 32
  ad: f32 [n/32]     d per block
  as: f32 [n/16]     d * (sum of q over every 16 values): the weight formats' offset terms
  s32: f32 [n/32]    d * (sum of q over the block): the repacked kernels' min terms
  is: i32 [n/16]     sum of q over every 16 values: the repacked kernels' integer offsets
Tokens are split across the pool threads. Argument slots: `QuantizeSlots`.
"""

from __future__ import annotations

from engine.kernels.ir import Fn, f32, mask, thread_range

V32F = "<32 x float>"


class QuantizeSlots:
    """quantize_q8's i64 argument block: x (f32 [T, n]), n_tokens, n, and the five outputs;
    SIZE is the block's length (the IR reads these slots, engine/kernels/jit_backend.py fills them)."""

    X, N_TOKENS, N, AQ, AD, SUMS, SUMS32, ISUMS, SIZE = range(9)


def module_ir() -> str:
    f = Fn()
    s = QuantizeSlots
    x = f.arg("%args", s.X, "ptr")
    ntok = f.arg("%args", s.N_TOKENS)
    n = f.arg("%args", s.N)
    aq, ad, as_ = (f.arg("%args", i, "ptr") for i in (s.AQ, s.AD, s.SUMS))
    s32, is_ = (f.arg("%args", i, "ptr") for i in (s.SUMS32, s.ISUMS))
    nb = f.op(f"lshr i64 {n}, 5")
    total = f.op(f"mul i64 {ntok}, {nb}")  # every block of every token is independent
    b0, b1 = thread_range(f, total, "%tid", "%nth", 1)
    f("br label %head")
    f.put_label("head")
    f(f"%b = phi i64 [{b0}, %entry], [%b_next, %body]")
    f(f"%more = icmp ult i64 %b, {b1}")
    f("br i1 %more, label %body, label %exit")
    f.put_label("body")
    e = f.op("shl i64 %b, 5")
    xv = f.load(V32F, f.op(f"getelementptr inbounds float, ptr {x}, i64 {e}"), 4)
    ax = f.op(f"call {V32F} @llvm.fabs.v32f32({V32F} {xv})")
    amax = f.op(f"call float @llvm.vector.reduce.fmax.v32f32({V32F} {ax})")
    d = f.op(f"fdiv float {amax}, {f32(127.0)}")
    nz = f.op(f"fcmp ogt float {amax}, 0.0")
    inv = f.op(f"fdiv float {f32(127.0)}, {amax}")
    inv = f.op(f"select i1 {nz}, float {inv}, float 0.0")
    iv = f.op(f"insertelement {V32F} poison, float {inv}, i32 0")
    iv = f.op(f"shufflevector {V32F} {iv}, {V32F} poison, {mask([0] * 32)}")
    scaled = f.op(f"fmul {V32F} {xv}, {iv}")
    rounded = f.op(f"call {V32F} @llvm.roundeven.v32f32({V32F} {scaled})")
    qi = f.op(f"fptosi {V32F} {rounded} to <32 x i32>")
    q8 = f.op(f"trunc <32 x i32> {qi} to <32 x i8>")
    f(f"store <32 x i8> {q8}, ptr {f.gep(aq, e)}, align 1")
    f(f"store float {d}, ptr {f.op(f'getelementptr inbounds float, ptr {ad}, i64 %b')}, align 4")
    lane_sums = []
    for h in (0, 1):
        half = f.op(
            f"shufflevector <32 x i32> {qi}, <32 x i32> poison, {mask(range(16 * h, 16 * h + 16))}"
        )
        lane_sum = f.op(f"call i32 @llvm.vector.reduce.add.v16i32(<16 x i32> {half})")
        lane_sums.append(lane_sum)
        sd = f.op(f"fmul float {f.op(f'sitofp i32 {lane_sum} to float')}, {d}")
        idx = f.op(f"add i64 {f.op('shl i64 %b, 1')}, {h}")
        f(
            f"store float {sd}, ptr {f.op(f'getelementptr inbounds float, ptr {as_}, i64 {idx}')}, align 4"
        )
        f(
            f"store i32 {lane_sum}, ptr {f.op(f'getelementptr inbounds i32, ptr {is_}, i64 {idx}')}, align 4"
        )
    total = f.op(f"add i32 {lane_sums[0]}, {lane_sums[1]}")
    s32d = f.op(f"fmul float {f.op(f'sitofp i32 {total} to float')}, {d}")
    f(
        f"store float {s32d}, ptr {f.op(f'getelementptr inbounds float, ptr {s32}, i64 %b')}, align 4"
    )
    f("%b_next = add i64 %b, 1")
    f("br label %head")
    f.put_label("exit")
    f("ret void")
    return f"""
declare {V32F} @llvm.fabs.v32f32({V32F})
declare float @llvm.vector.reduce.fmax.v32f32({V32F})
declare {V32F} @llvm.roundeven.v32f32({V32F})
declare i32 @llvm.vector.reduce.add.v16i32(<16 x i32>)
define void @quantize_q8(ptr %args, i32 %tid, i32 %nth) {{
entry:
{f.text()}
}}
"""
