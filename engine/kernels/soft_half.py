"""The half -> float conversion LLVM calls when the target CPU has no F16C (pre-Haswell x86, or
LOCALCHAT_CPU=x86-64 / x86-64-v2 on any machine).

Without F16C, LLVM lowers every `fpext half` in the kernels (f16 weights, the f16 KV cache, the
f16 block scales of the quant types) to a call of the runtime helper `__extendhfsf2`. MCJIT
looks that up in the process, where it usually is not (libgcc_s is loaded only on demand and
Windows has none); an unresolved symbol leaves the whole object's relocations unapplied, so the
pool then calls address 0. Defining the helper in its own module makes the generic path
self-contained. Exact for every half: normals, subnormals (scaled in float, no rounding),
zeros, infinities and NaNs (payload kept).
"""

from __future__ import annotations

MODULE_NAME = "soft_half"

MODULE_IR = """
define float @__extendhfsf2(half %h) {
  %b16 = bitcast half %h to i16
  %b = zext i16 %b16 to i32
  %sign = and i32 %b, 32768
  %sign32 = shl i32 %sign, 16
  %e = lshr i32 %b, 10
  %exp = and i32 %e, 31
  %mant = and i32 %b, 1023
  %m13 = shl i32 %mant, 13
  %is_special = icmp eq i32 %exp, 31
  %is_small = icmp eq i32 %exp, 0
  %rebias = add i32 %exp, 112
  %e32 = shl i32 %rebias, 23
  %normal = or i32 %e32, %m13
  %special = or i32 2139095040, %m13
  %big = select i1 %is_special, i32 %special, i32 %normal
  %mf = uitofp i32 %mant to float
  %sub = fmul float %mf, 0x3E70000000000000
  %subbits = bitcast float %sub to i32
  %mag = select i1 %is_small, i32 %subbits, i32 %big
  %bits = or i32 %mag, %sign32
  %f = bitcast i32 %bits to float
  ret float %f
}
"""


def needed(cpu, triple: str) -> bool:
    """True when code for `cpu` calls __extendhfsf2 (x86 without F16C)."""
    return triple.startswith(("x86_64", "i386", "i686")) and not cpu.has("f16c")
