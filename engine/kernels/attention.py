"""IR for causal multi-head attention, tiled with an online softmax, over the KV cache.

One work item = one query token and a run of `HEADS_PER_ITEM` query heads of one GQA group (all
of the group unless that leaves threads idle, see jit_backend). Items are dealt round-robin to
the pool's chunks. For each item the keys it may see (causal, optional sliding window; GQA kv
head h // (n_head / n_kv)) are streamed once, in tiles of TILE rows in the cache's own layout:
  1. scores: each key row is loaded once and dotted with every query head of the item (the
     loads are shared by the whole group), times scale, optional soft-cap, per-head tile max;
  2. online softmax per head: m' = max(m, tile max), the running sum and the output row are
     rescaled by exp(m - m') (skipped when the max did not move), p_j = exp(s_j - m');
  3. values: each value row is loaded once and added, p-weighted, into every head's output
     row (L1-resident), divided by the running sum at the end.
Attention sinks (gpt-oss) start each head's running max at its sink logit and its sum at 1 (the
sink's own exp(sink - max)), so the sink joins the softmax denominator and mixes no value.
No scratch grows with the context: per thread HEADS_PER_ITEM * (TILE + 2) floats.

Two element layouts share the code, differing only in how 16 values of a row are loaded:
  f16:  (capacity, n_kv, head_dim) float16 (engine/kv_cache.py's default);
  q8_0: (capacity, n_kv, head_dim / 32 * 34) bytes, each 32 values a ggml block_q8_0
        (float16 scale d, then 32 int8 q; value = d * q).

Every vector load is unaligned-safe (align 1/2/4): rows sit at any offset in the cache.

Argument slots: `AttentionSlots` (the IR reads them, engine/kernels/jit_backend.py fills them).
"""

from __future__ import annotations

from collections.abc import Callable

from engine.kernels.ir import Fn, mask
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
V16B = "<16 x i8>"
V32B = "<32 x i8>"
V4F = "<4 x float>"
NEG_INF = "0xFFF0000000000000"
NEG_INF16 = "<" + ", ".join(["float 0xFFF0000000000000"] * 16) + ">"

# Keys per tile: the online-softmax rescale (head_dim multiplies per head) is paid once per
# TILE keys, against 2 * head_dim multiply-adds per key and head.
TILE = 64
Q8_BLOCK, Q8_BLOCK_BYTES = 32, 34
# Keys whose scores (and value rows) are computed together: independent multiply-add chains
# instead of one chain per key, whose latency bounded the one-key loop.
KEYS_AT_ONCE = 4
# Query heads of an item whose dot products (and value sums) share each K (V) row load, per
# ISA path, widest first (an item's heads go in runs of the first width while they last, then
# the next): 3 x KEYS_AT_ONCE accumulators fit AVX-512's 32 registers (Qwen2.5's groups of 6
# are two runs of 3, SmolLM2's of 3 one run: each K/V row widened once per 3 heads, not per
# 2); with 16 registers (AVX2, SSE) 2 heads spill, and measured no faster than one at a time.
HEADS_AT_ONCE = {"vnni": (3, 2, 1), "avx2": (1,), "generic": (1,)}

# Kernel name per KV element layout (the cache's `cache_type`).
KERNELS = {"f16": "attention_f16", "q8_0": "attention_q8_0"}
# Combines the key splits' partial rows (split-K decode, see merge_ir).
MERGE_KERNEL = "attention_merge"


class AttentionSlots:
    """q (T, H, hd) f32, k cache, v cache, out (T, H*hd) f32, T, H, n_kv, hd (multiple of 16;
    of 32 for q8_0), p0, window (0 = none), scale (f32 bits), softcap (f32 bits, 0 = none),
    scratch (f32), scratch floats per thread, sinks (f32 [H], 0 = none), heads per item
    (divides H / n_kv), key splits per (token, head run) (1 = none), partial results (f32,
    `partial_floats`; read only with splits > 1); SIZE: block length."""

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
        HEADS_PER_ITEM,
        N_SPLITS,
        PARTIAL,
        SIZE,
    ) = range(19)


def scratch_floats_per_thread(heads_per_item: int) -> int:
    """Scores of one tile per head, then each head's running max and sum."""
    return heads_per_item * (TILE + 2)


def partial_floats(n_splits: int, tokens: int, n_head: int, head_dim: int) -> int:
    """Split-K partials: per split and (token, head) the unnormalised output row, then (after
    all of them) its running max and sum."""
    return n_splits * tokens * n_head * (head_dim + 2)


def row_bytes(cache_type: str, head_dim: int) -> int:
    """Bytes of one (position, kv head) row of K or V in the cache."""
    if cache_type == "f16":
        return 2 * head_dim
    return head_dim // Q8_BLOCK * Q8_BLOCK_BYTES


class _Loop:
    """A counted loop `for i in range(lo, hi, step)` with loop-carried values; the body may
    contain further loops (the latch block is whichever block the body ends in)."""

    def __init__(self, f: Fn, name: str, lo: str, hi: str, step: int | str, carried=()):
        self.f, self.name, self.step = f, name, step
        self.pre = f.cur
        f(f"br label %{name}_h")
        f.put_label(f"{name}_h")
        self.phi_at = len(f.lines)
        self.iv = f"%{name}_i"
        self.carried = [(f"%{name}_c{n}", ty, init) for n, (ty, init) in enumerate(carried)]
        f("; phi placeholder")
        for _ in self.carried:
            f("; phi placeholder")
        more = f.op(f"icmp ult i64 {self.iv}, {hi}")
        f(f"br i1 {more}, label %{name}_b, label %{name}_x")
        f.put_label(f"{name}_b")
        self.lo = lo

    @property
    def values(self) -> list[str]:
        return [name for name, _, _ in self.carried]

    def end(self, nexts=()) -> list[str]:
        f = self.f
        nxt = f.op(f"add i64 {self.iv}, {self.step}")
        latch = f.cur
        f(f"br label %{self.name}_h")
        f.lines[self.phi_at] = f"  {self.iv} = phi i64 [{self.lo}, %{self.pre}], [{nxt}, %{latch}]"
        for n, ((name, ty, init), value) in enumerate(zip(self.carried, nexts, strict=True)):
            f.lines[self.phi_at + 1 + n] = (
                f"  {name} = phi {ty} [{init}, %{self.pre}], [{value}, %{latch}]"
            )
        f.put_label(f"{self.name}_x")
        return self.values


def _load_f16(f: Fn, row: str, d: str) -> list[str]:
    """Values d .. d+15 of a float16 row, as float32."""
    p = f.op(f"getelementptr inbounds half, ptr {row}, i64 {d}")
    return [f.op(f"fpext {V16H} {f.load(V16H, p, 2)} to {V16F}")]


def _load_q8_0(f: Fn, row: str, d: str) -> list[str]:
    """Values d .. d+31 (d a multiple of 32: one block) of a q8_0 row, as two float32 vectors
    d_block * q: the block's scale is read and broadcast once for its 32 values."""
    base = f.gep(row, f.op(f"mul i64 {f.op(f'lshr i64 {d}, 5')}, {Q8_BLOCK_BYTES}"))
    scale = splat16(f, f.half_to_float(base))
    ints = f.load(V32B, f.gep(base, "2"), 1)
    halves = []
    for lanes in (range(16), range(16, 32)):
        part = f.op(f"shufflevector {V32B} {ints}, {V32B} poison, {mask(lanes)}")
        halves.append(f.op(f"fmul {V16F} {f.op(f'sitofp {V16B} {part} to {V16F}')}, {scale}"))
    return halves


# Row element formats: (values per load step, the loader).
Loader = Callable[[Fn, str, str], list[str]]
ROW_FORMATS: dict[str, tuple[int, Loader]] = {"f16": (16, _load_f16), "q8_0": (32, _load_q8_0)}


def _rows_at(f: Fn, base: str, j0: str, jj: str, last: str, pos_stride: str) -> list[str]:
    """Pointers to the rows of keys j0+jj .. j0+jj+KEYS_AT_ONCE-1, each clamped to j0+last."""
    rows = []
    for u in range(KEYS_AT_ONCE):
        k = f.op(f"add i64 {jj}, {u}")
        k = f.op(f"select i1 {f.op(f'icmp ult i64 {k}, {last}')}, i64 {k}, i64 {last}")
        rows.append(f.gep(base, f.op(f"mul i64 {f.op(f'add i64 {j0}, {k}')}, {pos_stride}")))
    return rows


def _prefetch_rows(f: Fn, base: str, j: str, jj: str, rowb: str, pos_stride: str) -> None:
    """Prefetch every cache line of the rows of keys j+jj .. j+jj+KEYS_AT_ONCE-1 (one tile
    ahead of the ones being read). Rows past the cache's end are harmless: a prefetch never
    faults, and the address is formed without `inbounds`."""
    for u in range(KEYS_AT_ONCE):
        key = f.op(f"add i64 {f.op(f'add i64 {j}, {jj}')}, {u}")
        row = f.op(f"getelementptr i8, ptr {base}, i64 {f.op(f'mul i64 {key}, {pos_stride}')}")
        lines = _Loop(f, f.label("pf"), "0", rowb, 64)
        line = f.op(f"getelementptr i8, ptr {row}, i64 {lines.iv}")
        f(f"call void @llvm.prefetch.p0(ptr {line}, i32 0, i32 2, i32 1)")
        lines.end()
        tail = f.op(f"getelementptr i8, ptr {row}, i64 {f.op(f'sub i64 {rowb}, 1')}")
        f(f"call void @llvm.prefetch.p0(ptr {tail}, i32 0, i32 2, i32 1)")


def _splat4(f: Fn, x: str) -> str:
    v = f.op(f"insertelement {V4F} poison, float {x}, i32 0")
    return f.op(f"shufflevector {V4F} {v}, {V4F} poison, <4 x i32> zeroinitializer")


def _sum4(f: Fn, accs: list[str]) -> str:
    """<4 x float> of the lane sums of four <16 x float>: halves, then quarters, pairwise."""
    a, b, c, d = accs

    def fold(x: str, y: str, keep_lo: list[int], keep_hi: list[int], ty: str) -> str:
        lo = f.op(f"shufflevector {ty} {x}, {ty} {y}, {mask(keep_lo)}")
        hi = f.op(f"shufflevector {ty} {x}, {ty} {y}, {mask(keep_hi)}")
        width = len(keep_lo)
        return f.op(f"fadd <{width} x float> {lo}, {hi}")

    # lanes 0-7 = a's halves summed, 8-15 = b's (and c, d)
    ab = fold(a, b, [*range(8), *range(16, 24)], [*range(8, 16), *range(24, 32)], V16F)
    cd = fold(c, d, [*range(8), *range(16, 24)], [*range(8, 16), *range(24, 32)], V16F)
    # 4 lanes each of a, b, c, d
    quarter_lo = [i + q * 8 for q in range(4) for i in range(4)]
    abcd = fold(ab, cd, quarter_lo, [i + 4 for i in quarter_lo], V16F)
    # 2 lanes each, then 1
    pairs = fold(abcd, abcd, [0, 1, 4, 5, 8, 9, 12, 13], [2, 3, 6, 7, 10, 11, 14, 15], V16F)
    return fold(pairs, pairs, [0, 2, 4, 6], [1, 3, 5, 7], "<8 x float>")


def _fptr(f: Fn, base: str, index: str) -> str:
    return f.op(f"getelementptr inbounds float, ptr {base}, i64 {index}")


def attention_ir(
    name: str, row_format: tuple[int, Loader], elem_bytes_of_row, head_widths: tuple[int, ...]
) -> str:
    f = Fn()
    s = AttentionSlots
    load_step, load = row_format
    q, kc, vc, out = (f.arg("%args", i, "ptr") for i in (s.Q, s.K_CACHE, s.V_CACHE, s.OUT))
    ntok, nh, nkv, hd, p0, window = (
        f.arg("%args", i) for i in (s.N_TOKENS, s.N_HEAD, s.N_KV, s.HEAD_DIM, s.P0, s.WINDOW)
    )
    scale = float_arg(f, s.SCALE)
    softcap = float_arg(f, s.SOFTCAP)
    scratch = f.arg("%args", s.SCRATCH, "ptr")
    sstride = f.arg("%args", s.SCRATCH_STRIDE)
    sinks = f.arg("%args", s.SINKS, "ptr")
    hpi = f.arg("%args", s.HEADS_PER_ITEM)
    nsplit = f.arg("%args", s.N_SPLITS)
    partial = f.arg("%args", s.PARTIAL, "ptr")
    is_split = f.op(f"icmp ugt i64 {nsplit}, 1")
    scale4, cap4 = _splat4(f, scale), _splat4(f, softcap)
    has_sinks = f.op(f"icmp ne ptr {sinks}, null")
    has_cap = f.op(f"fcmp ogt float {softcap}, 0.0")
    has_w = f.op(f"icmp ne i64 {window}, 0")
    group = f.op(f"udiv i64 {nh}, {nkv}")
    slots_per_token = f.op(f"udiv i64 {nh}, {hpi}")
    items = f.op(f"mul i64 {f.op(f'mul i64 {ntok}, {slots_per_token}')}, {nsplit}")
    part_rows = f.op(f"mul i64 {ntok}, {nh}")  # (token, head) rows of one split's partials
    part_ml = _fptr(f, partial, f.op(f"mul i64 {f.op(f'mul i64 {part_rows}, {nsplit}')}, {hd}"))
    rowb = elem_bytes_of_row(f, hd)  # bytes of one (position, kv head) row
    pos_stride = f.op(f"mul i64 {nkv}, {rowb}")  # bytes from one position to the next
    qh_stride = hd  # floats from one head's q / out row to the next
    tid64 = f.op("sext i32 %tid to i64")
    step = f.op("sext i32 %nth to i64")
    sc = _fptr(f, scratch, f.op(f"mul i64 {sstride}, {tid64}"))  # [hpi][TILE] tile scores
    st_max = _fptr(f, sc, f.op(f"mul i64 {hpi}, {TILE}"))  # [hpi] running max
    st_sum = _fptr(f, st_max, hpi)  # [hpi] running sum

    # Items are dealt round-robin (chunk c takes items c, c+n, ...): a causal query's work grows
    # with its position, so contiguous ranges would leave the last chunk with the most keys.
    items_loop = _Loop(f, "item", tid64, items, step)
    it = items_loop.iv
    # Item = (token, head run, key split), the split fastest: a split's items land on
    # different chunks, so the pool's chunks share one (token, head run)'s keys.
    split = f.op(f"urem i64 {it}, {nsplit}")
    slot_it = f.op(f"udiv i64 {it}, {nsplit}")
    t = f.op(f"udiv i64 {slot_it}, {slots_per_token}")
    h0 = f.op(f"mul i64 {f.op(f'urem i64 {slot_it}, {slots_per_token}')}, {hpi}")
    kvh = f.op(f"udiv i64 {h0}, {group}")
    pos = f.op(f"add i64 {p0}, {t}")
    hi = f.op(f"add i64 {pos}, 1")
    wlo = f.op(f"sub i64 {hi}, {window}")  # first allowed key when windowed (may be "negative")
    use_w = f.op(f"and i1 {f.op(f'icmp sgt i64 {wlo}, 0')}, {has_w}")
    lo_all = f.op(f"select i1 {use_w}, i64 {wlo}, i64 0")
    # This split's keys: whole tiles of ceil(keys / splits), the last split taking the rest
    # (a split past the end is empty: max -inf, sum 0, a zero row, which the merge ignores).
    n_keys = f.op(f"sub i64 {hi}, {lo_all}")
    per = f.op(f"udiv i64 {f.op(f'add i64 {n_keys}, {nsplit}')}, {nsplit}")  # >= ceil
    per = f.op(f"and i64 {f.op(f'add i64 {per}, {TILE - 1}')}, {-TILE}")
    lo = f.op(f"add i64 {lo_all}, {f.op(f'mul i64 {split}, {per}')}")
    lo = f.op(f"select i1 {f.op(f'icmp ult i64 {lo}, {hi}')}, i64 {lo}, i64 {hi}")
    split_hi = f.op(f"add i64 {lo}, {per}")
    hi = f.op(f"select i1 {f.op(f'icmp ult i64 {split_hi}, {hi}')}, i64 {split_hi}, i64 {hi}")
    row0 = f.op(f"add i64 {f.op(f'mul i64 {t}, {nh}')}, {h0}")  # first (token, head) row
    qrow0 = _fptr(f, q, f.op(f"mul i64 {row0}, {hd}"))
    # Split items accumulate into their split's partial rows, whole items into `out`.
    prow = f.op(f"add i64 {f.op(f'mul i64 {split}, {part_rows}')}, {row0}")
    orow0 = f.op(
        f"select i1 {is_split}, ptr {_fptr(f, partial, f.op(f'mul i64 {prow}, {hd}'))}, "
        f"ptr {_fptr(f, out, f.op(f'mul i64 {row0}, {hd}'))}"
    )
    # The sink joins the softmax once: in split 0's sum.
    sink_here = f.op(f"and i1 {has_sinks}, {f.op(f'icmp eq i64 {split}, 0')}")
    kv_off = f.op(f"mul i64 {kvh}, {rowb}")
    kbase = f.gep(kc, kv_off)
    vbase = f.gep(vc, kv_off)
    head_floats = f.op(f"mul i64 {hpi}, {hd}")

    # --- per-head state: max = sink logit (or -inf), sum = 1 with a sink (its own share) ---
    init = _Loop(f, "init", "0", hpi, 1)
    r = init.iv
    f(f"br i1 {sink_here}, label %init_sink, label %init_set")
    f.put_label("init_sink")
    sink_loaded = f.load("float", _fptr(f, sinks, f.op(f"add i64 {h0}, {r}")), 4)
    f("br label %init_set")
    f.put_label("init_set")
    m0 = f.op(f"phi float [{NEG_INF}, %init_b], [{sink_loaded}, %init_sink]")
    l0 = f.op("phi float [0.0, %init_b], [1.0, %init_sink]")
    f(f"store float {m0}, ptr {_fptr(f, st_max, r)}, align 4")
    f(f"store float {l0}, ptr {_fptr(f, st_sum, r)}, align 4")
    init.end()
    zero = _Loop(f, "zero", "0", head_floats, 16)
    f(f"store {V16F} zeroinitializer, ptr {_fptr(f, orow0, zero.iv)}, align 4")
    zero.end()

    # --- key tiles ---
    tiles = _Loop(f, "tile", lo, hi, TILE)
    j0 = tiles.iv
    j1 = f.op(f"add i64 {j0}, {TILE}")
    j1 = f.op(f"select i1 {f.op(f'icmp ult i64 {j1}, {hi}')}, i64 {j1}, i64 {hi}")
    n = f.op(f"sub i64 {j1}, {j0}")
    # 1. scores, KEYS_AT_ONCE keys x a run of heads at a time: independent multiply-add
    # chains, each key row load (and its widening) shared by the heads, each q load by the
    # keys. A key group past the tile's end re-reads its last key (valid memory); those scores
    # land in slots >= n, which the softmax never reads. Heads go in runs of head_widths[0]
    # while whole runs last, then of the next width (no padding head is computed).
    last = f.op(f"sub i64 {n}, 1")
    head_runs = []
    run_lo = "0"
    for width in head_widths:
        left = f.op(f"sub i64 {hpi}, {run_lo}")
        whole = f.op(f"mul i64 {f.op(f'udiv i64 {left}, {width}')}, {width}")
        run_hi = f.op(f"add i64 {run_lo}, {whole}")
        head_runs.append((f"w{width}", run_lo, run_hi, width))
        run_lo = run_hi
    keys = _Loop(f, "key", "0", n, KEYS_AT_ONCE)
    jj = keys.iv
    krows = _rows_at(f, kbase, j0, jj, last, pos_stride)
    _prefetch_rows(f, kbase, j1, jj, rowb, pos_stride)
    for tag, h_lo, h_hi, width in head_runs:
        heads = _Loop(f, f"sh{tag}", h_lo, h_hi, width)
        rs = [f.op(f"add i64 {heads.iv}, {h}") for h in range(width)]
        qrows = [_fptr(f, qrow0, f.op(f"mul i64 {r}, {qh_stride}")) for r in rs]
        pairs = [(h, u) for h in range(width) for u in range(KEYS_AT_ONCE)]
        dots = _Loop(
            f, f"sd{tag}", "0", hd, load_step, carried=[(V16F, "zeroinitializer")] * len(pairs)
        )
        kvs = [load(f, krow, dots.iv) for krow in krows]
        accs = list(dots.values)
        for part in range(load_step // 16):
            at = f.op(f"add i64 {dots.iv}, {16 * part}")
            qvs = [f.load(V16F, _fptr(f, qrow, at), 4) for qrow in qrows]
            accs = [
                f.op(
                    f"call {V16F} @llvm.fma.v16f32({V16F} {kvs[u][part]}, {V16F} {qvs[h]}, {V16F} {acc})"
                )
                for (h, u), acc in zip(pairs, accs, strict=True)
            ]
        accs = dots.end(accs)
        # Each head's KEYS_AT_ONCE dot products summed across lanes together (one shuffle tree
        # for all of them, not a full reduction each), scaled: one <4 x float> per head.
        scores = [
            f.op(
                f"fmul {V4F} {_sum4(f, accs[h * KEYS_AT_ONCE : (h + 1) * KEYS_AT_ONCE])}, {scale4}"
            )
            for h in range(width)
        ]
        f(f"br i1 {has_cap}, label %cap{tag}_b, label %cap{tag}_x")
        f.put_label(f"cap{tag}_b")  # soft-cap only when asked: tanh is a libm call per key
        capped = []
        for x in scores:
            ratio = f.op(f"fdiv {V4F} {x}, {cap4}")
            tanh = f.op(f"call {V4F} @llvm.tanh.v4f32({V4F} {ratio})")
            capped.append(f.op(f"fmul {V4F} {cap4}, {tanh}"))
        f(f"br label %cap{tag}_x")
        f.put_label(f"cap{tag}_x")
        final = [
            f.op(f"phi {V4F} [{x}, %sd{tag}_x], [{c}, %cap{tag}_b]")
            for x, c in zip(scores, capped, strict=True)
        ]
        for h, score in enumerate(final):
            slot = f.op(f"add i64 {f.op(f'mul i64 {rs[h]}, {TILE}')}, {jj}")
            f(f"store {V4F} {score}, ptr {_fptr(f, sc, slot)}, align 4")
        heads.end()
    keys.end()
    # 2. online softmax per head: new max, rescale sum and output row, p = exp(s - max)
    soft = _Loop(f, "sm", "0", hpi, 1)
    r = soft.iv
    srow = _fptr(f, sc, f.op(f"mul i64 {r}, {TILE}"))
    tmax_loop = _Loop(f, "tm", "0", n, 16, carried=[(V16F, NEG_INF16)])
    (tmax,) = tmax_loop.values
    tm_lanes = mask16(f, tmax_loop.iv, n)
    sv = f.op(
        f"select <16 x i1> {tm_lanes}, {V16F} {masked_load16(f, srow, tmax_loop.iv, tm_lanes)}, {V16F} {NEG_INF16}"
    )
    (tmax,) = tmax_loop.end([f.op(f"call {V16F} @llvm.maxnum.v16f32({V16F} {tmax}, {V16F} {sv})")])
    tmax = f.op(f"call float @llvm.vector.reduce.fmax.v16f32({V16F} {tmax})")
    m_at = _fptr(f, st_max, r)
    l_at = _fptr(f, st_sum, r)
    m_old = f.load("float", m_at, 4)
    m_new = f.op(f"call float @llvm.maxnum.f32(float {m_old}, float {tmax})")
    f(f"store float {m_new}, ptr {m_at}, align 4")
    moved = f.op(f"fcmp olt float {m_old}, {m_new}")  # false while both are -inf, or unchanged
    f(f"br i1 {moved}, label %rs_b, label %rs_x")
    f.put_label("rs_b")
    alpha = f.op(f"call float @llvm.exp.f32(float {f.op(f'fsub float {m_old}, {m_new}')})")
    l_old = f.load("float", l_at, 4)
    f(f"store float {f.op(f'fmul float {l_old}, {alpha}')}, ptr {l_at}, align 4")
    alpha_v = splat16(f, alpha)
    orow = _fptr(f, orow0, f.op(f"mul i64 {r}, {qh_stride}"))
    rescale = _Loop(f, "rsd", "0", hd, 16)
    op = _fptr(f, orow, rescale.iv)
    f(f"store {V16F} {f.op(f'fmul {V16F} {f.load(V16F, op, 4)}, {alpha_v}')}, ptr {op}, align 4")
    rescale.end()
    f("br label %rs_x")
    f.put_label("rs_x")
    # p = exp(s - max) 16 scores at a time (masked tail), summed as they are stored back.
    expl = _Loop(f, "ex", "0", n, 16, carried=[(V16F, "zeroinitializer")])
    (psum,) = expl.values
    lanes = mask16(f, expl.iv, n)
    shifted = f.op(f"fsub {V16F} {masked_load16(f, srow, expl.iv, lanes)}, {splat16(f, m_new)}")
    pv = f.op(f"call {V16F} @vexp16({V16F} {shifted})")
    pv = f.op(f"select <16 x i1> {lanes}, {V16F} {pv}, {V16F} zeroinitializer")
    masked_store16(f, pv, srow, expl.iv, lanes)
    (psum,) = expl.end([f.op(f"fadd {V16F} {psum}, {pv}")])
    psum = f.op(f"call reassoc float @llvm.vector.reduce.fadd.v16f32(float 0.0, {V16F} {psum})")
    l_cur = f.load("float", l_at, 4)
    f(f"store float {f.op(f'fadd float {l_cur}, {psum}')}, ptr {l_at}, align 4")
    soft.end()
    # 3. values, KEYS_AT_ONCE rows x a run of heads at a time (one load and store of each
    # output per KEYS_AT_ONCE keys, each value row load shared by the heads), the same head
    # groups as the scores; keys past the tile's end weigh 0.
    vals = _Loop(f, "val", "0", n, KEYS_AT_ONCE)
    jj = vals.iv
    vrows = _rows_at(f, vbase, j0, jj, last, pos_stride)
    _prefetch_rows(f, vbase, j1, jj, rowb, pos_stride)
    for tag, h_lo, h_hi, width in head_runs:
        vheads = _Loop(f, f"vh{tag}", h_lo, h_hi, width)
        weights = {}
        orows = []
        for h in range(width):
            r = f.op(f"add i64 {vheads.iv}, {h}")
            slot0 = f.op(f"add i64 {f.op(f'mul i64 {r}, {TILE}')}, {jj}")
            for u in range(KEYS_AT_ONCE):
                pu = f.load("float", _fptr(f, sc, f.op(f"add i64 {slot0}, {u}")), 4)
                inside = f.op(f"icmp ult i64 {f.op(f'add i64 {jj}, {u}')}, {n}")
                weights[h, u] = splat16(f, f.op(f"select i1 {inside}, float {pu}, float 0.0"))
            orows.append(_fptr(f, orow0, f.op(f"mul i64 {r}, {qh_stride}")))
        vd = _Loop(f, f"vd{tag}", "0", hd, load_step)
        vvs = [load(f, vrow, vd.iv) for vrow in vrows]
        for part in range(load_step // 16):
            at = f.op(f"add i64 {vd.iv}, {16 * part}")
            for h, orow in enumerate(orows):
                op = _fptr(f, orow, at)
                o = f.load(V16F, op, 4)
                for u in range(KEYS_AT_ONCE):
                    o = f.op(
                        f"call {V16F} @llvm.fma.v16f32({V16F} {vvs[u][part]}, {V16F} {weights[h, u]}, {V16F} {o})"
                    )
                f(f"store {V16F} {o}, ptr {op}, align 4")
        vd.end()
        vheads.end()
    vals.end()
    tiles.end()

    # --- out = accumulated / running sum ---
    fin = _Loop(f, "fin", "0", hpi, 1)
    r = fin.iv
    f(f"br i1 {is_split}, label %fin_part, label %fin_norm")
    f.put_label("fin_part")  # a split's row stays unnormalised; its max and sum go beside it
    ml_at = _fptr(f, part_ml, f.op(f"shl i64 {f.op(f'add i64 {prow}, {r}')}, 1"))
    f(f"store float {f.load('float', _fptr(f, st_max, r), 4)}, ptr {ml_at}, align 4")
    f(f"store float {f.load('float', _fptr(f, st_sum, r), 4)}, ptr {_fptr(f, ml_at, '1')}, align 4")
    f("br label %fin_next")
    f.put_label("fin_norm")
    inv = f.op(f"fdiv float 1.0, {f.load('float', _fptr(f, st_sum, r), 4)}")
    inv_v = splat16(f, inv)
    orow = _fptr(f, orow0, f.op(f"mul i64 {r}, {qh_stride}"))
    fd = _Loop(f, "fd", "0", hd, 16)
    op = _fptr(f, orow, fd.iv)
    f(f"store {V16F} {f.op(f'fmul {V16F} {f.load(V16F, op, 4)}, {inv_v}')}, ptr {op}, align 4")
    fd.end()
    f("br label %fin_next")
    f.put_label("fin_next")
    fin.end()
    items_loop.end()
    f("ret void")
    return f"define void @{name}(ptr %args, i32 %tid, i32 %nth) {{\nentry:\n{f.text()}\n}}\n"


def merge_ir(name: str) -> str:
    """Split-K merge: out[row] = sum_s e^(m_s - M) acc_s / sum_s e^(m_s - M) l_s, M = max_s m_s,
    for every (token, head) row (rows dealt round-robin to the chunks)."""
    f = Fn()
    s = AttentionSlots
    out, partial = f.arg("%args", s.OUT, "ptr"), f.arg("%args", s.PARTIAL, "ptr")
    ntok, nh, hd, nsplit = (
        f.arg("%args", i) for i in (s.N_TOKENS, s.N_HEAD, s.HEAD_DIM, s.N_SPLITS)
    )
    rows = f.op(f"mul i64 {ntok}, {nh}")
    ml = _fptr(f, partial, f.op(f"mul i64 {f.op(f'mul i64 {rows}, {nsplit}')}, {hd}"))
    tid64 = f.op("sext i32 %tid to i64")
    step = f.op("sext i32 %nth to i64")
    row_loop = _Loop(f, "mrow", tid64, rows, step)
    row = row_loop.iv
    orow = _fptr(f, out, f.op(f"mul i64 {row}, {hd}"))
    peak_loop = _Loop(f, "mpk", "0", nsplit, 1, carried=[("float", NEG_INF)])
    (peak,) = peak_loop.values
    at = f.op(f"add i64 {f.op(f'mul i64 {peak_loop.iv}, {rows}')}, {row}")
    m_s = f.load("float", _fptr(f, ml, f.op(f"shl i64 {at}, 1")), 4)
    (peak,) = peak_loop.end([f.op(f"call float @llvm.maxnum.f32(float {peak}, float {m_s})")])
    zero = _Loop(f, "mz", "0", hd, 16)
    f(f"store {V16F} zeroinitializer, ptr {_fptr(f, orow, zero.iv)}, align 4")
    zero.end()
    acc_loop = _Loop(f, "mac", "0", nsplit, 1, carried=[("float", "0.0")])
    (total,) = acc_loop.values
    at = f.op(f"add i64 {f.op(f'mul i64 {acc_loop.iv}, {rows}')}, {row}")
    ml_at = _fptr(f, ml, f.op(f"shl i64 {at}, 1"))
    m_s = f.load("float", ml_at, 4)
    l_s = f.load("float", _fptr(f, ml_at, "1"), 4)
    # An empty split (max -inf) weighs exp(-inf) = 0; M is finite (split 0 holds the query's
    # own key, and any sink).
    w = f.op(f"call float @llvm.exp.f32(float {f.op(f'fsub float {m_s}, {peak}')})")
    w_v = splat16(f, w)
    prow = _fptr(f, partial, f.op(f"mul i64 {at}, {hd}"))
    dl = _Loop(f, "mad", "0", hd, 16)
    op = _fptr(f, orow, dl.iv)
    pv = f.load(V16F, _fptr(f, prow, dl.iv), 4)
    o = f.op(
        f"call {V16F} @llvm.fma.v16f32({V16F} {pv}, {V16F} {w_v}, {V16F} {f.load(V16F, op, 4)})"
    )
    f(f"store {V16F} {o}, ptr {op}, align 4")
    dl.end()
    (total,) = acc_loop.end(
        [f.op(f"call float @llvm.fma.f32(float {l_s}, float {w}, float {total})")]
    )
    inv_v = splat16(f, f.op(f"fdiv float 1.0, {total}"))
    fd = _Loop(f, "mfd", "0", hd, 16)
    op = _fptr(f, orow, fd.iv)
    f(f"store {V16F} {f.op(f'fmul {V16F} {f.load(V16F, op, 4)}, {inv_v}')}, ptr {op}, align 4")
    fd.end()
    row_loop.end()
    f("ret void")
    return f"define void @{name}(ptr %args, i32 %tid, i32 %nth) {{\nentry:\n{f.text()}\n}}\n"


def _f16_row_bytes(f: Fn, hd: str) -> str:
    return f.op(f"shl i64 {hd}, 1")


def _q8_0_row_bytes(f: Fn, hd: str) -> str:
    return f.op(f"mul i64 {f.op(f'lshr i64 {hd}, 5')}, {Q8_BLOCK_BYTES}")


def module_ir(isa: str) -> str:
    heads = HEADS_AT_ONCE[isa]  # head run widths
    return "\n".join(
        [
            VEXP16,
            MASKED_F32_DECLS,
            "declare float @llvm.maxnum.f32(float, float)",
            f"declare float @llvm.vector.reduce.fmax.v16f32({V16F})",
            f"declare {V4F} @llvm.tanh.v4f32({V4F})",
            "declare float @llvm.exp.f32(float)",
            "declare float @llvm.fma.f32(float, float, float)",
            "declare void @llvm.prefetch.p0(ptr, i32, i32, i32)",
            attention_ir(KERNELS["f16"], ROW_FORMATS["f16"], _f16_row_bytes, heads),
            attention_ir(KERNELS["q8_0"], ROW_FORMATS["q8_0"], _q8_0_row_bytes, heads),
            merge_ir(MERGE_KERNEL),
        ]
    )
