"""Vector math in IR that LLVM would otherwise turn into one libm call per lane.

`@vexp16(<16 x float>) -> <16 x float>`: exp via 2^k * p(r), r = x - k ln2 in [-ln2/2, ln2/2],
p a degree-6 Taylor/Cephes polynomial (relative error ~2e-7 over the float range); inputs are
clamped to [-87.3, 88.3] so underflow gives ~0 rather than garbage.
"""

from __future__ import annotations

from engine.kernels.ir import f32

V16F = "<16 x float>"


def _splat(x: float) -> str:
    return f"splat (float {f32(x)})"


VEXP16 = f"""
define internal {V16F} @vexp16({V16F} %x0) alwaysinline {{
  %x1 = call {V16F} @llvm.minnum.v16f32({V16F} %x0, {V16F} {_splat(88.3)})
  %x = call {V16F} @llvm.maxnum.v16f32({V16F} %x1, {V16F} {_splat(-87.3)})
  %t = fmul {V16F} %x, {_splat(1.4426950408889634)}
  %k = call {V16F} @llvm.roundeven.v16f32({V16F} %t)
  %r1 = call {V16F} @llvm.fma.v16f32({V16F} %k, {V16F} {_splat(-0.693145751953125)}, {V16F} %x)
  %r = call {V16F} @llvm.fma.v16f32({V16F} %k, {V16F} {_splat(-1.428606765330187e-06)}, {V16F} %r1)
  %p6 = call {V16F} @llvm.fma.v16f32({V16F} %r, {V16F} {_splat(1.0 / 720)}, {V16F} {_splat(1.0 / 120)})
  %p5 = call {V16F} @llvm.fma.v16f32({V16F} %r, {V16F} %p6, {V16F} {_splat(1.0 / 24)})
  %p4 = call {V16F} @llvm.fma.v16f32({V16F} %r, {V16F} %p5, {V16F} {_splat(1.0 / 6)})
  %p3 = call {V16F} @llvm.fma.v16f32({V16F} %r, {V16F} %p4, {V16F} {_splat(0.5)})
  %p2 = call {V16F} @llvm.fma.v16f32({V16F} %r, {V16F} %p3, {V16F} {_splat(1.0)})
  %p = call {V16F} @llvm.fma.v16f32({V16F} %r, {V16F} %p2, {V16F} {_splat(1.0)})
  %ki = fptosi {V16F} %k to <16 x i32>
  %e = add <16 x i32> %ki, splat (i32 127)
  %bits = shl <16 x i32> %e, splat (i32 23)
  %scale = bitcast <16 x i32> %bits to {V16F}
  %y = fmul {V16F} %p, %scale
  ret {V16F} %y
}}
declare {V16F} @llvm.minnum.v16f32({V16F}, {V16F})
declare {V16F} @llvm.maxnum.v16f32({V16F}, {V16F})
declare {V16F} @llvm.roundeven.v16f32({V16F})
declare {V16F} @llvm.fma.v16f32({V16F}, {V16F}, {V16F})
"""
