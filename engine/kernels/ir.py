"""A tiny helper for writing LLVM IR text: fresh SSA names, vector type spelling, and loops.

Kernels are written as explicit vector IR (the auto-vectoriser turns block loops into gathers),
generated from Python so one template covers every quant type and every ISA path.
"""

from __future__ import annotations


def splat(n: int, elem: str, value) -> str:
    """A constant vector with every lane = value."""
    return "<" + ", ".join(f"{elem} {value}" for _ in range(n)) + ">"


def mask(indices) -> str:
    """A shufflevector mask operand, type included."""
    indices = list(indices)
    return f"<{len(indices)} x i32> <" + ", ".join(f"i32 {i}" for i in indices) + ">"


def f32(x: float) -> str:
    """A float constant LLVM accepts exactly (hex form of the double of a float32)."""
    import struct

    bits = struct.unpack(
        "<Q", struct.pack("<d", float(struct.unpack("<f", struct.pack("<f", x))[0]))
    )[0]
    return f"0x{bits:016X}"


class Fn:
    """Accumulates the body of one function; `t()` returns a fresh local name."""

    def __init__(self):
        self.lines: list[str] = []
        self._n = 0
        self.cur = "entry"  # the block being written: the predecessor name phi nodes need

    def t(self, hint: str = "v") -> str:
        self._n += 1
        return f"%{hint}{self._n}"

    def label(self, hint: str) -> str:
        self._n += 1
        return f"{hint}{self._n}"

    def __call__(self, line: str) -> None:
        self.lines.append("  " + line)

    def put_label(self, name: str) -> None:
        self.lines.append(f"{name}:")
        self.cur = name

    def op(self, expr: str, hint: str = "v") -> str:
        name = self.t(hint)
        self(f"{name} = {expr}")
        return name

    def gep(self, base: str, offset, hint: str = "p") -> str:
        return self.op(f"getelementptr inbounds i8, ptr {base}, i64 {offset}", hint)

    def load(self, ty: str, ptr: str, align: int = 1, hint: str = "l") -> str:
        return self.op(f"load {ty}, ptr {ptr}, align {align}", hint)

    def arg(self, args: str, slot: int, ty: str = "i64") -> str:
        """Slot `slot` of the i64 argument block (pointers are stored as i64 too)."""
        p = self.gep(args, 8 * slot)
        v = self.load("i64", p, 8, "a")
        if ty == "ptr":
            return self.op(f"inttoptr i64 {v} to ptr", "ap")
        return v

    def half_to_float(self, ptr: str) -> str:
        h = self.load("half", ptr, 1, "h")
        return self.op(f"fpext half {h} to float", "f")

    def text(self) -> str:
        return "\n".join(self.lines)


def thread_range(f: Fn, total: str, tid: str, nth: str, granule: int = 1) -> tuple[str, str]:
    """[start, end) of this thread's share of `total` items, shares rounded to `granule`."""
    n64 = f.op(f"sext i32 {nth} to i64")
    t64 = f.op(f"sext i32 {tid} to i64")
    per = f.op(f"add i64 {total}, {n64}")
    per = f.op(f"sub i64 {per}, 1")
    per = f.op(f"udiv i64 {per}, {n64}")
    if granule > 1:
        per = f.op(f"add i64 {per}, {granule - 1}")
        per = f.op(f"udiv i64 {per}, {granule}")
        per = f.op(f"mul i64 {per}, {granule}")
    start = f.op(f"mul i64 {per}, {t64}")
    end = f.op(f"add i64 {start}, {per}")
    c1 = f.op(f"icmp ult i64 {start}, {total}")
    start = f.op(f"select i1 {c1}, i64 {start}, i64 {total}")
    c2 = f.op(f"icmp ult i64 {end}, {total}")
    end = f.op(f"select i1 {c2}, i64 {end}, i64 {total}")
    return start, end
