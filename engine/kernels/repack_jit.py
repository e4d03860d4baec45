"""IR for repacking Q4_K / Q6_K and the legacy types' rows into repack.py's 16-row records (the layout is documented
in repack.py's docstring; repack.py's numpy code is the reference these must match byte for byte).

`repack_<type>(args, tid, n_threads)` writes records [0, groups * n_blocks) of a row range, split
across the pool threads by record. One record is 16 row iterations: each loads one GGUF block,
splits its nibbles / bit pairs in vector registers and stores its 4-byte units at the row's lane
of every record vector (all within the record's 2.4-3.4 KB, so they stay in L1). Rows past
`rows` read an all-zero block, which gives the all-zero record bytes the numpy path pads with.
A pure shuffle plus the f16 -> f32 scale conversion: memory-bound, unlike numpy's many
temporaries, whose page faults were most of its time. Argument slots: `RepackSlots`.
"""

from __future__ import annotations

from engine.kernels.ir import Fn, mask, splat, thread_range
from engine.kernels.repack import (
    GROUP_ROWS,
    LEGACY_RECORD_BYTES,
    RECORD_BYTES,
    record_bytes,
    source_block_bytes,
)

REPACK_TYPES = (*RECORD_BYTES, *LEGACY_RECORD_BYTES)
_LOW4, _LOW2, _LOW6 = 0x0F0F0F0F, 0x03030303, 0x3F3F3F3F
_ZERO_BLOCK = "@repack_zero_block"


class RepackSlots:
    """repack_<type>'s i64 argument block: SRC (GGUF blocks of `rows` rows, row-major), DST
    (records [groups, n_blocks, record bytes]), ROWS, N_BLOCKS (super-blocks per row); SIZE is
    the block's length."""

    SRC, DST, ROWS, N_BLOCKS, SIZE = range(5)


def _vec(n: int) -> str:
    return f"<{n} x i32>"


def _and(f: Fn, n: int, v: str, bits: int) -> str:
    return f.op(f"and {_vec(n)} {v}, {splat(n, 'i32', bits)}")


def _shr(f: Fn, n: int, v: str, k: int) -> str:
    return f.op(f"lshr {_vec(n)} {v}, {splat(n, 'i32', k)}")


def _shl(f: Fn, n: int, v: str, k: int) -> str:
    return f.op(f"shl {_vec(n)} {v}, {splat(n, 'i32', k)}")


def _or(f: Fn, n: int, a: str, b: str) -> str:
    return f.op(f"or {_vec(n)} {a}, {b}")


def _pick(f: Fn, n: int, a: str, b: str, idx: list[int]) -> str:
    """Elements idx of the concatenation a ++ b (each <n x i32>)."""
    return f.op(f"shufflevector {_vec(n)} {a}, {_vec(n)} {b}, {mask(idx)}")


def _store_lanes(f: Fn, n: int, v: str, lane: str, offsets: list[int]) -> None:
    """Element e of v (an i32 unit) to byte offsets[e] of this row's lane (`lane` points at the
    record plus 4 * row)."""
    for e, off in enumerate(offsets):
        x = f.op(f"extractelement {_vec(n)} {v}, i32 {e}")
        f(f"store i32 {x}, ptr {f.gep(lane, off)}, align 1")


def _store_bytes(f: Fn, word: str, rec_row: str, offsets: list[int]) -> None:
    """Byte e of the i32 `word` to byte offsets[e] of this row's column (`rec_row` points at
    the record plus the row index)."""
    for e, off in enumerate(offsets):
        x = f.op(f"trunc i32 {f.op(f'lshr i32 {word}, {8 * e}')} to i8")
        f(f"store i8 {x}, ptr {f.gep(rec_row, off)}, align 1")


def _bits(f: Fn, word: str, shr: int, keep: int, shl: int) -> str:
    """((word >> shr) & keep) << shl on an i32."""
    x = f.op(f"lshr i32 {word}, {shr}") if shr else word
    x = f.op(f"and i32 {x}, {keep}")
    return f.op(f"shl i32 {x}, {shl}") if shl else x


def _copy_half(f: Fn, src: str, dst: str) -> None:
    f(f"store i16 {f.load('i16', src, 1, 'h')}, ptr {dst}, align 1")


def _row_q4_k(f: Fn, blk: str, rec: str, i: str) -> None:
    lane = f.gep(rec, f.op(f"shl i64 {i}, 2"))
    qs = f.load(_vec(32), f.gep(blk, 16))  # 32-byte run j: sub-blocks 2j (low), 2j + 1 (high)
    lo = _and(f, 32, qs, _LOW4)
    hi = _and(f, 32, _shr(f, 32, qs, 4), _LOW4)
    # element 4c + p: unit p (first) and unit p + 4 (second) of sub-block c = 2j + h
    first = [32 * (c % 2) + 8 * (c // 2) + p for c in range(8) for p in range(4)]
    a = _pick(f, 32, lo, hi, first)
    b = _pick(f, 32, lo, hi, [x + 4 for x in first])
    packed = _or(f, 32, a, _shl(f, 32, b, 4))
    _store_lanes(f, 32, packed, lane, [256 * c + 64 * p for c in range(8) for p in range(4)])
    w = [f.load("i32", f.gep(blk, 4 + 4 * k), 1) for k in range(3)]  # scale bytes 0-3, 4-7, 8-11
    sc_lo = f.op(f"and i32 {w[0]}, {_LOW6}")
    m_lo = f.op(f"and i32 {w[1]}, {_LOW6}")
    top_sc = _bits(f, w[0], 6, _LOW2, 4)
    top_m = _bits(f, w[1], 6, _LOW2, 4)
    sc_hi = f.op(f"or i32 {_bits(f, w[2], 0, _LOW4, 0)}, {top_sc}")
    m_hi = f.op(f"or i32 {_bits(f, w[2], 4, _LOW4, 0)}, {top_m}")
    col = f.gep(rec, i)
    for word, base in ((sc_lo, 2048), (sc_hi, 2048 + 64), (m_lo, 2176), (m_hi, 2176 + 64)):
        _store_bytes(f, word, col, [base + GROUP_ROWS * e for e in range(4)])
    half_lane = f.gep(rec, f.op(f"shl i64 {i}, 1"))
    for src, dst in ((0, 2304), (2, 2336)):  # d, dmin: the file's f16, copied
        _copy_half(f, f.gep(blk, src), f.gep(half_lane, dst))


def _row_q6_k(f: Fn, blk: str, rec: str, i: str) -> None:
    lane = f.gep(rec, f.op(f"shl i64 {i}, 2"))
    ql = f.load(_vec(32), blk)  # [half n][32-byte run][unit]
    qh = f.load(_vec(16), f.gep(blk, 128))  # [half n][unit]
    ql_lo = _and(f, 32, ql, _LOW4)
    ql_hi = _and(f, 32, _shr(f, 32, ql, 4), _LOW4)
    # chunk 4n + k, unit l: k = 0, 1 the low nibbles of run k, k = 2, 3 the high nibbles of run k - 2
    units = [(n, k, u) for n in range(2) for k in range(4) for u in range(8)]
    low = _pick(
        f, 32, ql_lo, ql_hi, [32 * (k // 2) + 16 * n + 8 * (k % 2) + u for n, k, u in units]
    )
    qh64 = f.op(
        f"shufflevector {_vec(16)} {qh}, {_vec(16)} poison, "
        f"{mask([8 * n + u for n, k, u in units])}"
    )
    shifts = "<" + ", ".join(f"i32 {2 * k}" for n, k, u in units) + ">"
    top = _and(f, 64, f.op(f"lshr {_vec(64)} {qh64}, {shifts}"), _LOW2)
    # element 4c + p: units p and p + 4 of chunk c
    first = [8 * c + p for c in range(8) for p in range(4)]
    a = f.op(f"shufflevector {_vec(64)} {low}, {_vec(64)} poison, {mask(first)}")
    b = f.op(f"shufflevector {_vec(64)} {low}, {_vec(64)} poison, {mask([x + 4 for x in first])}")
    packed = _or(f, 32, a, _shl(f, 32, b, 4))
    _store_lanes(f, 32, packed, lane, [384 * c + 64 * p for c in range(8) for p in range(4)])
    # element 2c + h: units 4h .. 4h + 3 of chunk c at bits 0, 2, 4, 6
    high = None
    for s in range(4):
        idx = [8 * c + 4 * h + s for c in range(8) for h in range(2)]
        part = f.op(f"shufflevector {_vec(64)} {top}, {_vec(64)} poison, {mask(idx)}")
        part = _shl(f, 16, part, 2 * s) if s else part
        high = part if high is None else _or(f, 16, high, part)
    assert high is not None
    _store_lanes(f, 16, high, lane, [384 * c + 256 + 64 * h for c in range(8) for h in range(2)])
    col = f.gep(rec, i)
    for k in range(4):  # 16 i8 scales, [group][row]
        word = f.load("i32", f.gep(blk, 192 + 4 * k), 1)
        _store_bytes(f, word, col, [3072 + GROUP_ROWS * (4 * k + e) for e in range(4)])
    d = f.half_to_float(f.gep(blk, 208))
    f(f"store float {d}, ptr {f.gep(lane, 3328)}, align 1")


def _legacy_row(qname: str):
    """The row writer of one legacy type: qs words to the row's lane of the unit vectors, the
    Q5_x fifth bits regrouped by unit (repack._legacy_high_bits), the f16 scales to the row's
    2-byte column."""
    has_min = qname in ("Q4_1", "Q5_1")
    has_high = qname in ("Q5_0", "Q5_1")
    scales = 4 if has_min else 2
    qs_at = scales + (4 if has_high else 0)
    units = 8 if qname == "Q8_0" else 4

    def row(f: Fn, blk: str, rec: str, i: str) -> None:
        lane = f.gep(rec, f.op(f"shl i64 {i}, 2"))
        qs = f.load(_vec(units), f.gep(blk, qs_at))
        _store_lanes(f, units, qs, lane, [64 * w for w in range(units)])
        at = 64 * units
        if has_high:
            qh = f.load("i32", f.gep(blk, scales), 1)
            qhv = f.op(f"insertelement {_vec(32)} poison, i32 {qh}, i32 0")
            qhv = f.op(f"shufflevector {_vec(32)} {qhv}, {_vec(32)} poison, {mask([0] * 32)}")
            order = [(k, e) for k in range(8) for e in range(4)]
            down = "<" + ", ".join(f"i32 {4 * k + e}" for k, e in order) + ">"
            up = "<" + ", ".join(f"i32 {8 * e + k}" for k, e in order) + ">"
            bit = _and(f, 32, f.op(f"lshr {_vec(32)} {qhv}, {down}"), 1)
            placed = f.op(f"shl {_vec(32)} {bit}, {up}")
            high = f.op(f"call i32 @llvm.vector.reduce.or.v32i32({_vec(32)} {placed})")
            f(f"store i32 {high}, ptr {f.gep(lane, at)}, align 1")
            at += 64
        col = f.gep(rec, f.op(f"shl i64 {i}, 1"))
        for k in range(scales // 2):
            h = f.load("i16", f.gep(blk, 2 * k), 1)
            f(f"store i16 {h}, ptr {f.gep(col, at + 32 * k)}, align 1")

    return row


_ROW = {
    "Q4_K": _row_q4_k,
    "Q6_K": _row_q6_k,
    **{q: _legacy_row(q) for q in LEGACY_RECORD_BYTES},
}


def kernel_function(qname: str) -> str:
    """`repack_<type>(args, tid, n_threads)`: this thread's share of the records."""
    f = Fn()
    s = RepackSlots
    src = f.arg("%args", s.SRC, "ptr")
    dst = f.arg("%args", s.DST, "ptr")
    rows = f.arg("%args", s.ROWS)
    nb = f.arg("%args", s.N_BLOCKS)
    groups = f.op(f"lshr i64 {f.op(f'add i64 {rows}, {GROUP_ROWS - 1}')}, 4")
    total = f.op(f"mul i64 {groups}, {nb}")
    r0, r1 = thread_range(f, total, "%tid", "%nth")
    f("br label %rh")
    f.put_label("rh")
    f(f"%r = phi i64 [{r0}, %entry], [%r_next, %rnext]")
    f(f"%rmore = icmp ult i64 %r, {r1}")
    f("br i1 %rmore, label %rbody, label %exit")
    f.put_label("rbody")
    g = f.op(f"udiv i64 %r, {nb}", "g")
    b = f.op(f"urem i64 %r, {nb}", "b")
    rec = f.gep(dst, f.op(f"mul i64 %r, {record_bytes(qname)}"), "rec")
    row0 = f.op(f"shl i64 {g}, 4", "row0")
    f("br label %ih")
    f.put_label("ih")
    f("%i = phi i64 [0, %rbody], [%i_next, %ih]")
    row = f.op(f"add i64 {row0}, %i")
    inside = f.op(f"icmp ult i64 {row}, {rows}")
    at = f.op(f"add i64 {f.op(f'mul i64 {row}, {nb}')}, {b}")
    at = f.op(f"mul i64 {at}, {source_block_bytes(qname)}")
    blk = f.op(f"select i1 {inside}, ptr {f.gep(src, at)}, ptr {_ZERO_BLOCK}", "blk")
    _ROW[qname](f, blk, rec, "%i")
    f("%i_next = add i64 %i, 1")
    f(f"%idone = icmp eq i64 %i_next, {GROUP_ROWS}")
    f("br i1 %idone, label %rnext, label %ih")
    f.put_label("rnext")
    f("%r_next = add i64 %r, 1")
    f("br label %rh")
    f.put_label("exit")
    f("ret void")
    name = f"repack_{qname.lower()}"
    return f"define void @{name}(ptr %args, i32 %tid, i32 %nth) {{\nentry:\n{f.text()}\n}}\n"


def module_ir() -> str:
    """Every type's repack kernel in one module (no ISA-specific instructions: the vector
    shuffles lower on every target)."""
    zero = f"{_ZERO_BLOCK} = private unnamed_addr constant [256 x i8] zeroinitializer, align 64"
    reduce_or = f"declare i32 @llvm.vector.reduce.or.v32i32({_vec(32)})"
    return "\n".join([zero, reduce_or, *(kernel_function(q) for q in REPACK_TYPES)])
