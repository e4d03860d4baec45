"""IR for the two decode-step ops the layer loop does in numpy and the step lists lacked
(issue 32): a float multiply (Granite's residual multiplier, Phi-4-mini's gain on the rotated
dims, Ministral 3's per-position query temperature, each `a *= b` with b a row of factors) and
the q8_0 K/V row store (engine/kv_quant.quantize_q8_0, ggml's quantize_row_q8_0_ref).

Both compute exactly what numpy computes for the same arrays: one IEEE multiply per value; and
per 32-value block amax = max |x|, d = amax / 127, inv = 1 / d (0 for d = 0), q = trunc(x * inv
+ copysign(0.5, x)) clamped to +-127, d rounded to float16 to nearest even (in integer code, as
elementwise.kv_store_ir does, so no runtime helper is needed on CPUs without F16C).

Argument slots: `MulSlots`, `KvStoreQ8Slots`.
"""

from __future__ import annotations

from engine.kernels.elementwise import AddSlots, binary_f32_ir
from engine.kernels.ir import Fn
from engine.kernels.vec16 import MASKED_F32_DECLS, V16F


class MulSlots(AddSlots):
    """mul_f32: a, b, out (f32), count; SIZE: block length (add_f32's layout)."""


class KvStoreQ8Slots:
    """kv_store_q8_0: src (f32 [count]), dst (q8_0 cache rows), pos (ptr to the i64 position),
    count (values per position, a multiple of 32); SIZE: block length."""

    SRC, DST, POS, COUNT, SIZE = range(5)


def mul_ir() -> str:
    """out = a * b over `count` floats."""
    return binary_f32_ir("mul_f32", "fmul", MulSlots)


def _half_bits(f: Fn, x: str) -> str:
    """i16 float16 bits of the float x, rounded to nearest even (scalar elementwise.kv_store_ir)."""
    bits = f.op(f"bitcast float {x} to i32")
    sign = f.op(f"and i32 {bits}, -2147483648")
    mag = f.op(f"xor i32 {bits}, {sign}")
    nan = f.op(f"icmp ugt i32 {mag}, 2139095040")
    big = f.op(f"select i1 {nan}, i32 32256, i32 31744")
    magf = f.op(f"bitcast i32 {mag} to float")
    den = f.op(f"fadd float {magf}, 0.5")
    den = f.op(f"sub i32 {f.op(f'bitcast float {den} to i32')}, 1056964608")
    odd = f.op(f"and i32 {f.op(f'lshr i32 {mag}, 13')}, 1")
    nrm = f.op(f"add i32 {mag}, -939520001")
    nrm = f.op(f"lshr i32 {f.op(f'add i32 {nrm}, {odd}')}, 13")
    is_big = f.op(f"icmp uge i32 {mag}, 1199570944")
    is_den = f.op(f"icmp ult i32 {mag}, 947912704")
    h = f.op(f"select i1 {is_den}, i32 {den}, i32 {nrm}")
    h = f.op(f"select i1 {is_big}, i32 {big}, i32 {h}")
    h = f.op(f"or i32 {h}, {f.op(f'lshr i32 {sign}, 16')}")
    return f.op(f"trunc i32 {h} to i16")


def kv_store_q8_0_ir() -> str:
    """One position's K or V rows (count floats) as q8_0 blocks into the cache at row *pos."""
    v16i = "<16 x i32>"
    f = Fn()
    s = KvStoreQ8Slots
    src, dst, pos_p = (f.arg("%args", i, "ptr") for i in (s.SRC, s.DST, s.POS))
    count = f.arg("%args", s.COUNT)
    pos = f.load("i64", pos_p, 8)
    n_blocks = f.op(f"lshr i64 {count}, 5")
    row = f.gep(dst, f.op(f"mul i64 {pos}, {f.op(f'mul i64 {n_blocks}, 34')}"))
    f("br label %h")
    f.put_label("h")
    f("%j = phi i64 [0, %entry], [%j_next, %b]")
    f(f"%more = icmp ult i64 %j, {n_blocks}")
    f("br i1 %more, label %b, label %exit")
    f.put_label("b")
    x0p = f.op(f"getelementptr inbounds float, ptr {src}, i64 {f.op('shl i64 %j, 5')}")
    x1p = f.op(f"getelementptr inbounds float, ptr {x0p}, i64 16")
    xs = [f.load(V16F, p, 4) for p in (x0p, x1p)]
    absv = []
    for x in xs:
        xbits = f.op(f"bitcast {V16F} {x} to {v16i}")
        mag = f.op(f"and {v16i} {xbits}, splat (i32 2147483647)")
        absv.append(f.op(f"bitcast {v16i} {mag} to {V16F}"))
    both = f.op(f"call {V16F} @llvm.maxnum.v16f32({V16F} {absv[0]}, {V16F} {absv[1]})")
    amax = f.op(f"call float @llvm.vector.reduce.fmax.v16f32({V16F} {both})")
    d = f.op(f"fdiv float {amax}, 127.0")
    nonzero = f.op(f"fcmp une float {d}, 0.0")
    inv = f.op(f"select i1 {nonzero}, float {f.op(f'fdiv float 1.0, {d}')}, float 0.0")
    inv_v = f.op(f"insertelement {V16F} poison, float {inv}, i32 0")
    inv_v = f.op(f"shufflevector {V16F} {inv_v}, {V16F} poison, <16 x i32> zeroinitializer")
    block = f.gep(row, f.op("mul i64 %j, 34"))
    f(f"store i16 {_half_bits(f, d)}, ptr {block}, align 1")
    for half, x in enumerate(xs):
        xbits = f.op(f"bitcast {V16F} {x} to {v16i}")
        sign = f.op(f"and {v16i} {xbits}, splat (i32 -2147483648)")
        halfv = f.op(
            f"bitcast {v16i} {f.op(f'or {v16i} {sign}, splat (i32 1056964608)')} to {V16F}"
        )
        y = f.op(f"fadd {V16F} {f.op(f'fmul {V16F} {x}, {inv_v}')}, {halfv}")
        y = f.op(f"call {V16F} @llvm.trunc.v16f32({V16F} {y})")
        q = f.op(f"fptosi {V16F} {y} to {v16i}")
        q = f.op(f"call {v16i} @llvm.smax.v16i32({v16i} {q}, {v16i} splat (i32 -127))")
        q = f.op(f"call {v16i} @llvm.smin.v16i32({v16i} {q}, {v16i} splat (i32 127))")
        qb = f.op(f"trunc {v16i} {q} to <16 x i8>")
        f(f"store <16 x i8> {qb}, ptr {f.gep(block, 2 + 16 * half)}, align 1")
    f("%j_next = add i64 %j, 1")
    f("br label %h")
    f.put_label("exit")
    f("ret void")
    return f"define void @kv_store_q8_0(ptr %args, i32 %tid, i32 %nth) {{\nentry:\n{f.text()}\n}}\n"


def module_ir() -> str:
    return "\n".join(
        [
            MASKED_F32_DECLS,
            f"declare {V16F} @llvm.maxnum.v16f32({V16F}, {V16F})",
            f"declare float @llvm.vector.reduce.fmax.v16f32({V16F})",
            f"declare {V16F} @llvm.trunc.v16f32({V16F})",
            "declare <16 x i32> @llvm.smax.v16i32(<16 x i32>, <16 x i32>)",
            "declare <16 x i32> @llvm.smin.v16i32(<16 x i32>, <16 x i32>)",
            mul_ir(),
            kv_store_q8_0_ir(),
        ]
    )
