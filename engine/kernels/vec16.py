"""16-lane float32 IR helpers shared by the elementwise and attention kernels: masked loads and
stores for ragged tails (any length works without a scalar epilogue), splats, and float
arguments passed as their 32-bit patterns in the i64 argument block."""

from __future__ import annotations

from engine.kernels.ir import Fn

V16F = "<16 x float>"
LANES = "<i64 0, i64 1, i64 2, i64 3, i64 4, i64 5, i64 6, i64 7, i64 8, i64 9, i64 10, i64 11, i64 12, i64 13, i64 14, i64 15>"


def mask16(f: Fn, i: str, n: str) -> str:
    """<16 x i1>: lane k is i + k < n."""
    iv = f.op(f"insertelement <16 x i64> poison, i64 {i}, i32 0")
    iv = f.op(f"shufflevector <16 x i64> {iv}, <16 x i64> poison, <16 x i32> zeroinitializer")
    idx = f.op(f"add <16 x i64> {iv}, {LANES}")
    nv = f.op(f"insertelement <16 x i64> poison, i64 {n}, i32 0")
    nv = f.op(f"shufflevector <16 x i64> {nv}, <16 x i64> poison, <16 x i32> zeroinitializer")
    return f.op(f"icmp ult <16 x i64> {idx}, {nv}", "m")


def masked_load16(f: Fn, base: str, i: str, m: str) -> str:
    p = f.op(f"getelementptr inbounds float, ptr {base}, i64 {i}")
    return f.op(
        f"call {V16F} @llvm.masked.load.v16f32.p0(ptr {p}, i32 4, <16 x i1> {m}, {V16F} zeroinitializer)"
    )


def masked_store16(f: Fn, v: str, base: str, i: str, m: str) -> None:
    p = f.op(f"getelementptr inbounds float, ptr {base}, i64 {i}")
    f(f"call void @llvm.masked.store.v16f32.p0({V16F} {v}, ptr {p}, i32 4, <16 x i1> {m})")


def splat16(f: Fn, s: str) -> str:
    v = f.op(f"insertelement {V16F} poison, float {s}, i32 0")
    return f.op(f"shufflevector {V16F} {v}, {V16F} poison, <16 x i32> zeroinitializer")


def float_arg(f: Fn, slot: int) -> str:
    raw = f.arg("%args", slot)
    return f.op(f"bitcast i32 {f.op(f'trunc i64 {raw} to i32')} to float")


# What a module using masked_load16 / masked_store16 must declare.
MASKED_F32_DECLS = "\n".join(
    [
        f"declare {V16F} @llvm.masked.load.v16f32.p0(ptr, i32, <16 x i1>, {V16F})",
        f"declare void @llvm.masked.store.v16f32.p0({V16F}, ptr, i32, <16 x i1>)",
        f"declare float @llvm.vector.reduce.fadd.v16f32(float, {V16F})",
    ]
)
