"""IR for causal multi-head attention straight over the float16 KV cache (decode and prefill).

One work item = one (query token, head) pair; items are dealt round-robin to the pool's chunks.
For each item, over the keys it may see (causal, optional sliding window, GQA kv head
h // (n_head / n_kv)):
  1. scores s_j = (q . k_j) * scale (16 lanes at a time, f16 widened in registers), optional
     soft-cap, running max;
  2. p_j = exp(s_j - max) with the vector exp, and their sum, in a per-thread scratch row;
     with attention sinks (gpt-oss) the head's sink logit joins the max and the sum;
  3. out = sum_j p_j v_j / sum, accumulated in the (L1-resident) output row.
The cache layout is engine/kv_cache.py's: (capacity, n_kv, head_dim) float16, row = position.

Argument slots: `AttentionSlots` (the IR reads them, engine/kernels/jit_backend.py fills them).
"""

from __future__ import annotations

from engine.kernels.ir import Fn
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

V16H = "<16 x half>"


class AttentionSlots:
    """q (T, H, hd) f32, k cache, v cache, out (T, H*hd) f32, T, H, n_kv, hd (multiple of 16),
    p0, window (0 = none), scale (f32 bits), softcap (f32 bits, 0 = none), scratch (f32),
    scratch floats per thread, sinks (f32 [H], 0 = none); SIZE: block length."""

    (
        Q,
        K_CACHE,
        V_CACHE,
        OUT,
        N_TOKENS,
        N_HEAD,
        N_KV,
        HEAD_DIM,
        P0,
        WINDOW,
        SCALE,
        SOFTCAP,
        SCRATCH,
        SCRATCH_STRIDE,
        SINKS,
        SIZE,
    ) = range(16)


def attention_ir() -> str:
    f = Fn()
    s = AttentionSlots
    q, kc, vc, out = (f.arg("%args", i, "ptr") for i in (s.Q, s.K_CACHE, s.V_CACHE, s.OUT))
    ntok, nh, nkv, hd, p0, window = (
        f.arg("%args", i) for i in (s.N_TOKENS, s.N_HEAD, s.N_KV, s.HEAD_DIM, s.P0, s.WINDOW)
    )
    scale = float_arg(f, s.SCALE)
    softcap = float_arg(f, s.SOFTCAP)
    scratch = f.arg("%args", s.SCRATCH, "ptr")
    sstride = f.arg("%args", s.SCRATCH_STRIDE)
    sinks = f.arg("%args", s.SINKS, "ptr")
    has_sinks = f.op(f"icmp ne ptr {sinks}, null")
    group = f.op(f"udiv i64 {nh}, {nkv}")
    has_cap = f.op(f"fcmp ogt float {softcap}, 0.0")
    items = f.op(f"mul i64 {ntok}, {nh}")
    # Items are dealt round-robin (chunk c takes items c, c+n, ...): a causal query's work grows
    # with its position, so contiguous ranges would leave the last chunk with the most keys.
    i0 = f.op("sext i32 %tid to i64")
    step = f.op("sext i32 %nth to i64")
    tid64 = f.op("sext i32 %tid to i64")
    sc = f.op(
        f"getelementptr inbounds float, ptr {scratch}, i64 {f.op(f'mul i64 {sstride}, {tid64}')}"
    )
    f("br label %item_h")
    f.put_label("item_h")
    f(f"%it = phi i64 [{i0}, %entry], [%it_next, %p3_end]")
    f(f"%it_more = icmp ult i64 %it, {items}")
    f("br i1 %it_more, label %item_b, label %exit")
    f.put_label("item_b")
    t = f.op(f"udiv i64 %it, {nh}")
    h = f.op(f"urem i64 %it, {nh}")
    kvh = f.op(f"udiv i64 {h}, {group}")
    pos = f.op(f"add i64 {p0}, {t}")
    hi = f.op(f"add i64 {pos}, 1")
    wlo = f.op(f"sub i64 {hi}, {window}")  # first allowed key when windowed (may be "negative")
    use_w = f.op(f"icmp sgt i64 {wlo}, 0")
    has_w = f.op(f"icmp ne i64 {window}, 0")
    use_w = f.op(f"and i1 {use_w}, {has_w}")
    lo = f.op(f"select i1 {use_w}, i64 {wlo}, i64 0")
    nkeys = f.op(f"sub i64 {hi}, {lo}")
    qrow = f.op(f"getelementptr inbounds float, ptr {q}, i64 {f.op(f'mul i64 %it, {hd}')}")
    orow = f.op(f"getelementptr inbounds float, ptr {out}, i64 {f.op(f'mul i64 %it, {hd}')}")
    kv_stride = f.op(f"mul i64 {nkv}, {hd}")
    kv_off = f.op(f"mul i64 {kvh}, {hd}")
    # --- pass 1: scores and max ---
    f("br label %p1_h")
    f.put_label("p1_h")
    f(f"%j = phi i64 [{lo}, %item_b], [%j_next, %p1_store]")
    f("%mx = phi float [0xFFF0000000000000, %item_b], [%mx_next, %p1_store]")
    f(f"%j_more = icmp ult i64 %j, {hi}")
    f("br i1 %j_more, label %p1_b, label %p2_pre")
    f.put_label("p1_b")
    krow_at = f.op(f"mul i64 %j, {kv_stride}")
    krow = f.op(
        f"getelementptr inbounds half, ptr {kc}, i64 {f.op(f'add i64 {krow_at}, {kv_off}')}"
    )
    f("br label %d1_h")
    f.put_label("d1_h")
    f("%d = phi i64 [0, %p1_b], [%d_next, %d1_b]")
    f(f"%acc = phi {V16F} [zeroinitializer, %p1_b], [%acc_next, %d1_b]")
    f(f"%d_more = icmp ult i64 %d, {hd}")
    f("br i1 %d_more, label %d1_b, label %d1_done")
    f.put_label("d1_b")
    kv = f.op(
        f"fpext {V16H} {f.load(V16H, f.op(f'getelementptr inbounds half, ptr {krow}, i64 %d'), 2)} to {V16F}"
    )
    qv = f.load(V16F, f.op(f"getelementptr inbounds float, ptr {qrow}, i64 %d"), 4)
    f(f"%acc_next = call {V16F} @llvm.fma.v16f32({V16F} {kv}, {V16F} {qv}, {V16F} %acc)")
    f("%d_next = add i64 %d, 16")
    f("br label %d1_h")
    f.put_label("d1_done")
    score = f.op(
        f"fmul float {f.op(f'call reassoc float @llvm.vector.reduce.fadd.v16f32(float 0.0, {V16F} %acc)')}, {scale}"
    )
    f(f"br i1 {has_cap}, label %p1_cap, label %p1_store")
    f.put_label("p1_cap")  # soft-cap only when asked: tanh is a libm call per key
    ratio = f.op(f"fdiv float {score}, {softcap}")
    capped = f.op(f"fmul float {softcap}, {f.op(f'call float @llvm.tanh.f32(float {ratio})')}")
    f("br label %p1_store")
    f.put_label("p1_store")
    score = f.op(f"phi float [{score}, %d1_done], [{capped}, %p1_cap]")
    slot = f.op(f"sub i64 %j, {lo}")
    f(
        f"store float {score}, ptr {f.op(f'getelementptr inbounds float, ptr {sc}, i64 {slot}')}, align 4"
    )
    f(f"%mx_next = call float @llvm.maxnum.f32(float %mx, float {score})")
    f("%j_next = add i64 %j, 1")
    f("br label %p1_h")
    # --- pass 2: exp and sum ---
    f.put_label("p2_pre")
    f(f"br i1 {has_sinks}, label %sink_b, label %sink_done")
    f.put_label("sink_b")  # the head's sink logit (-inf without sinks: no share, no max)
    sink_at = f.op(f"getelementptr inbounds float, ptr {sinks}, i64 {h}")
    sink_loaded = f.load("float", sink_at, 4)
    f("br label %sink_done")
    f.put_label("sink_done")
    sink = f.op(f"phi float [0xFFF0000000000000, %p2_pre], [{sink_loaded}, %sink_b]")
    peak = f.op(f"call float @llvm.maxnum.f32(float %mx, float {sink})")
    mxv = splat16(f, peak)
    f("br label %p2_h")
    f.put_label("p2_h")
    f("%e = phi i64 [0, %sink_done], [%e_next, %p2_b]")
    f(f"%sum = phi {V16F} [zeroinitializer, %sink_done], [%sum_next, %p2_b]")
    f(f"%e_more = icmp ult i64 %e, {nkeys}")
    f("br i1 %e_more, label %p2_b, label %p3_pre")
    f.put_label("p2_b")
    m = mask16(f, "%e", nkeys)
    sv = masked_load16(f, sc, "%e", m)
    ev = f.op(f"call {V16F} @vexp16({V16F} {f.op(f'fsub {V16F} {sv}, {mxv}')})")
    ev = f.op(f"select <16 x i1> {m}, {V16F} {ev}, {V16F} zeroinitializer")
    masked_store16(f, ev, sc, "%e", m)
    f(f"%sum_next = fadd {V16F} %sum, {ev}")
    f("%e_next = add i64 %e, 16")
    f("br label %p2_h")
    # --- pass 3: weighted sum of values ---
    f.put_label("p3_pre")
    tot = f.op(f"call reassoc float @llvm.vector.reduce.fadd.v16f32(float 0.0, {V16F} %sum)")
    # exp(-inf) = +0 without sinks, so the sum is unchanged bit for bit
    sink_share = f.op(f"call float @llvm.exp.f32(float {f.op(f'fsub float {sink}, {peak}')})")
    tot = f.op(f"fadd float {tot}, {sink_share}")
    inv = f.op(f"fdiv float 1.0, {tot}")
    f("br label %z_h")
    f.put_label("z_h")
    f("%z = phi i64 [0, %p3_pre], [%z_next, %z_b]")
    f(f"%z_more = icmp ult i64 %z, {hd}")
    f("br i1 %z_more, label %z_b, label %p3_h0")
    f.put_label("z_b")
    f(
        f"store {V16F} zeroinitializer, ptr {f.op(f'getelementptr inbounds float, ptr {orow}, i64 %z')}, align 4"
    )
    f("%z_next = add i64 %z, 16")
    f("br label %z_h")
    f.put_label("p3_h0")
    f("br label %p3_h")
    f.put_label("p3_h")
    f(f"%k = phi i64 [{lo}, %p3_h0], [%k_next, %d3_done]")
    f(f"%k_more = icmp ult i64 %k, {hi}")
    f("br i1 %k_more, label %p3_b, label %p3_end")
    f.put_label("p3_b")
    p = f.load(
        "float", f.op(f"getelementptr inbounds float, ptr {sc}, i64 {f.op(f'sub i64 %k, {lo}')}"), 4
    )
    pv = splat16(f, f.op(f"fmul float {p}, {inv}"))
    vrow_at = f.op(f"mul i64 %k, {kv_stride}")
    vrow = f.op(
        f"getelementptr inbounds half, ptr {vc}, i64 {f.op(f'add i64 {vrow_at}, {kv_off}')}"
    )
    f("br label %d3_h")
    f.put_label("d3_h")
    f("%d3 = phi i64 [0, %p3_b], [%d3_next, %d3_b]")
    f(f"%d3_more = icmp ult i64 %d3, {hd}")
    f("br i1 %d3_more, label %d3_b, label %d3_done")
    f.put_label("d3_b")
    vv = f.op(
        f"fpext {V16H} {f.load(V16H, f.op(f'getelementptr inbounds half, ptr {vrow}, i64 %d3'), 2)} to {V16F}"
    )
    op = f.op(f"getelementptr inbounds float, ptr {orow}, i64 %d3")
    o = f.load(V16F, op, 4)
    f(
        f"store {V16F} {f.op(f'call {V16F} @llvm.fma.v16f32({V16F} {vv}, {V16F} {pv}, {V16F} {o})')}, ptr {op}, align 4"
    )
    f("%d3_next = add i64 %d3, 16")
    f("br label %d3_h")
    f.put_label("d3_done")
    f("%k_next = add i64 %k, 1")
    f("br label %p3_h")
    f.put_label("p3_end")
    f(f"%it_next = add i64 %it, {step}")
    f("br label %item_h")
    f.put_label("exit")
    f("ret void")
    return f"define void @attention(ptr %args, i32 %tid, i32 %nth) {{\nentry:\n{f.text()}\n}}\n"


def module_ir() -> str:
    return "\n".join(
        [
            VEXP16,
            MASKED_F32_DECLS,
            "declare float @llvm.maxnum.f32(float, float)",
            "declare float @llvm.tanh.f32(float)",
            "declare float @llvm.exp.f32(float)",
            attention_ir(),
        ]
    )
