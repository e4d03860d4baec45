"""IR for `out = x @ W.T` over Q4_K / Q6_K weights repacked into 16-row records (repack.py).

The row-major kernels (quant_matmul.py) give each weight row its own vector accumulators and
pay, per row and token and 64 values, a dot product plus a conversion, a scale multiply, an fma
and scalar min terms, besides unpacking every row's 6-bit scales with scalar byte code. Here one
zmm holds 16 rows (lane i = row i, 4 bytes = 4 consecutive values), so per 32 values of one
token the 16 rows take 8 `vpdpbusd` with a broadcast activation dword (an embedded broadcast,
no shuffle) and then, once for all 16 rows: int -> float, times (scale * da), added; Q4_K's mins
are one more fma with the token's d * sum(q) over the 32. The scales are decoded once per record
per tile, as 16-lane vectors, and shared by the tile's tokens.

  Q4_K  w = d*sc*q - dmin*m:      acc += cvt(dot(q, a)) * (d*sc * da) + (-dmin*m) * (da*sum a)
  Q6_K  w = d*sc*(u - 32), u = q + 32, per 16 values:
        the dot chain starts at -32 * sum(a) (an integer, act_quant's `is`), so
        acc += cvt(dot(u, a) - 32 sum(a)) * (d*sc * da)

Tiles are 16 rows x TILE tokens, then at most one tile of each SMALL_TILES size for what is left;
every (row, token) accumulator runs the same instructions in every tile shape, so a token's
result does not depend on the tile it lands in or on the batch (tests/test_batching_exact.py).
Row groups are split across the pool's threads; the last group of a weight whose row count is
not a multiple of 16 stores only its real rows (a masked store).

The non-VNNI paths run the same records with the same lane semantics, so only the instructions
differ: AVX2 adds up to 8 `pmaddubsw` pair sums in i16 before one `pmaddwd` widens them
(_token_dots picks the path), the generic path uses widening multiplies.
Argument block: quant_matmul.QuantMatmulSlots, with ROW_BYTES = bytes per row group.
"""

from __future__ import annotations

from engine.kernels.ir import Fn, mask, splat, thread_range
from engine.kernels.quant_matmul import DECLARATIONS, QuantMatmulSlots, udot512
from engine.kernels.repack import GROUP_ROWS, RECORD_BYTES

TILE = 8  # tokens per pass over a row group's records
SMALL_TILES = (4, 2, 1)  # for the tokens left after the TILE passes, largest first
# Software prefetch distance in records (0: none). Measured on a 65536 x 1536 mat-vec from
# memory, 1 thread, distances 0/2/4/8: Q6_K 9.5/5.8/6.1/6.6 ms (its 6-bit unpacking keeps the
# hardware prefetcher behind). Q4_K looked streaming-bound there, but in a real decode (the
# 1.5B model, records on huge pages, every weight read once per token from DRAM) its weights
# streamed at 15-17 GB/s without a prefetch and 31-33 GB/s with distance 2 (4 was slower, 1
# too); on the AVX2 path (LOCALCHAT_CPU=haswell) 9 -> 31 GB/s (bench/profile_decode.py).
PREFETCH_RECORDS = {"Q4_K": 2, "Q6_K": 2}
PACKED_TYPES = tuple(RECORD_BYTES)
# Dot chains per token by tile size (see _dot_chains); tiles of 4+ tokens already interleave
# that many independent chains, and more would run out of vector registers.
DOT_CHAINS = {1: 4, 2: 2}

V64I8 = "<64 x i8>"
V16I32 = "<16 x i32>"
V16F = "<16 x float>"


def splat16(f: Fn, ty: str, x: str) -> str:
    ins = f.op(f"insertelement <16 x {ty}> poison, {ty} {x}, i32 0")
    return f.op(f"shufflevector <16 x {ty}> {ins}, <16 x {ty}> poison, {mask([0] * 16)}")


def act_dword(f: Fn, aq: str, e: str) -> str:
    """Activation bytes e..e+3 broadcast to every lane, as <64 x i8>."""
    word = f.load("i32", f.gep(aq, e), 1, "aw")
    return f.op(f"bitcast {V16I32} {splat16(f, 'i32', word)} to {V64I8}", "ab")


def dot(f: Fn, isa: str, u: str, a: str, acc: str) -> str:
    """<16 x i32>: acc + (lane i = sum of u[4i+k] * a[4i+k], k < 4), u unsigned (< 64), a
    signed. quant_matmul.udot512 keeps these lane semantics on VNNI and AVX2; its generic
    path sums lanes in another order (its callers only reduce them), so this one pairs
    neighbours: u * a fits i16 (|63 * -128|), a pair sum too, then pairs of pairs in i32."""
    if isa != "generic":
        return udot512(f, isa, u, a, acc)
    uw = f.op(f"zext {V64I8} {u} to <64 x i16>")
    aw = f.op(f"sext {V64I8} {a} to <64 x i16>")
    p = f.op(f"mul <64 x i16> {uw}, {aw}")
    ev = f.op(f"shufflevector <64 x i16> {p}, <64 x i16> poison, {mask(range(0, 64, 2))}")
    od = f.op(f"shufflevector <64 x i16> {p}, <64 x i16> poison, {mask(range(1, 64, 2))}")
    pair = f.op(f"sext <32 x i16> {f.op(f'add <32 x i16> {ev}, {od}')} to <32 x i32>")
    ev2 = f.op(f"shufflevector <32 x i32> {pair}, <32 x i32> poison, {mask(range(0, 32, 2))}")
    od2 = f.op(f"shufflevector <32 x i32> {pair}, <32 x i32> poison, {mask(range(1, 32, 2))}")
    quad = f.op(f"add {V16I32} {ev2}, {od2}")
    return quad if acc == "zeroinitializer" else f.op(f"add {V16I32} {quad}, {acc}", "dot")


def fma(f: Fn, a: str, b: str, c: str) -> str:
    return f.op(f"call {V16F} @llvm.fma.v16f32({V16F} {a}, {V16F} {b}, {V16F} {c})", "acc")


def _byte_scales(f: Fn, rec: str, at: str, signed: bool, d: str) -> str:
    """<16 x float> d * scale for the 16 rows, from 16 scale bytes at rec + at."""
    raw = f.load("<16 x i8>", f.gep(rec, at), 1, "scb")
    conv = "sitofp" if signed else "uitofp"
    return f.op(f"fmul {V16F} {f.op(f'{conv} <16 x i8> {raw} to {V16F}')}, {d}", "sc")


def _vec_op(f: Fn, opname: str, v: str, k: int) -> str:
    return f.op(f"{opname} {V64I8} {v}, {splat(64, 'i8', k)}")


def _at(f: Fn, base: str, k: int) -> str:
    """base + k as an i64 value (base an SSA name)."""
    return f.op(f"add i64 {base}, {k}", "o")


def _units_q4_k(f: Fn, rec: str, c: str) -> list[str]:
    base = f.op(f"mul i64 {c}, 256", "o")
    packed = [f.load(V64I8, f.gep(rec, _at(f, base, 64 * p)), 1, "wq") for p in range(4)]
    return [_vec_op(f, "and", p, 15) for p in packed] + [_vec_op(f, "lshr", p, 4) for p in packed]


def _units_q6_k(f: Fn, rec: str, c: str) -> list[str]:
    base = f.op(f"mul i64 {c}, 384", "o")
    low = [f.load(V64I8, f.gep(rec, _at(f, base, 64 * p)), 1, "wl") for p in range(4)]
    high = [f.load(V64I8, f.gep(rec, _at(f, base, 256 + 64 * q)), 1, "wh") for q in range(2)]
    units = []
    for k in range(8):
        lo = _vec_op(f, "and", low[k], 15) if k < 4 else _vec_op(f, "lshr", low[k - 4], 4)
        h, pair = high[k // 4], k % 4
        # bits 2*pair..2*pair+1 of the high vector moved to bits 4-5
        moved = {0: ("shl", 4), 1: ("shl", 2), 2: (None, 0), 3: ("lshr", 2)}[pair]
        hv = h if moved[0] is None else _vec_op(f, moved[0], h, moved[1])
        units.append(f.op(f"or {V64I8} {lo}, {_vec_op(f, 'and', hv, 0x30)}", "wu"))
    return units


def _dot_chains(ntok: int) -> int:
    """Independent integer dot chains per token and 32 values. One chain of 8 dependent
    `vpdpbusd` per 32 values is latency-bound when a tile has one token (decode): its only
    other independent work is the next chunk's chain, further than the scheduler looks ahead.
    Integer sums are exact in any order, so splitting changes no bit of the result."""
    return DOT_CHAINS.get(ntok, 1)


def _sum_chains(f: Fn, chains: list[str]) -> str:
    """The chains' lanewise sum, pairwise (a tree: the adds of one level are independent)."""
    while len(chains) > 1:
        chains = [
            f.op(f"add {V16I32} {chains[i]}, {chains[i + 1]}", "dot")
            if i + 1 < len(chains)
            else chains[i]
            for i in range(0, len(chains), 2)
        ]
    return chains[0]


def f16_lanes(f: Fn, rec: str, at: int) -> str:
    """The record's 16 f16 values at byte `at` (a scale per row), as <16 x float>."""
    raw = f.load("<16 x half>", f.gep(rec, at), 2, "h")
    return f.op(f"fpext <16 x half> {raw} to {V16F}", "hf")


def _chunk_q4_k(f: Fn, isa: str, rec: str, c: str, i: str, toks, acc) -> None:
    """Values 32c..32c+31 of the record at rec (i = the chunk's index over the whole row)."""
    d = f16_lanes(f, rec, 2304)
    dmin = f16_lanes(f, rec, 2336)
    c16 = f.op(f"shl i64 {c}, 4", "o")
    s = _byte_scales(f, rec, _at(f, c16, 2048), False, d)
    mneg = f.op(f"fneg {V16F} {_byte_scales(f, rec, _at(f, c16, 2176), False, dmin)}", "mn")
    units = _units_q4_k(f, rec, c)
    e_c = f.op(f"shl i64 {i}, 5", "e")
    n_chains = _dot_chains(len(toks))
    for j, (aq, ad, s32, _is) in enumerate(toks):
        acts = [act_dword(f, aq, _at(f, e_c, 4 * k)) for k in range(8)]
        chain = _token_dots(f, isa, units, acts, "zeroinitializer", 15, n_chains)
        df = f.op(f"sitofp {V16I32} {chain} to {V16F}", "df")
        da = f.load("float", f.op(f"getelementptr inbounds float, ptr {ad}, i64 {i}"), 4)
        sda = f.op(f"fmul {V16F} {s}, {splat16(f, 'float', da)}", "sda")
        acc[j] = fma(f, df, sda, acc[j])
        sm = f.load("float", f.op(f"getelementptr inbounds float, ptr {s32}, i64 {i}"), 4)
        acc[j] = fma(f, mneg, splat16(f, "float", sm), acc[j])


def _chunk_q6_k(f: Fn, isa: str, rec: str, c: str, i: str, toks, acc) -> None:
    d = f.load(V16F, f.gep(rec, 3328), 4, "d")
    units = _units_q6_k(f, rec, c)
    c32 = f.op(f"shl i64 {c}, 5", "o")
    scales = [_byte_scales(f, rec, _at(f, c32, 3072 + 16 * h), True, d) for h in (0, 1)]
    e_c = f.op(f"shl i64 {i}, 5", "e")
    i16 = f.op(f"shl i64 {i}, 1", "o")
    for j, (aq, ad, _s32, is_) in enumerate(toks):
        da = f.load("float", f.op(f"getelementptr inbounds float, ptr {ad}, i64 {i}"), 4)
        dab = splat16(f, "float", da)
        for h in (0, 1):
            isp = f.op(f"getelementptr inbounds i32, ptr {is_}, i64 {i16}")
            isum = f.load("i32", f.gep(isp, 4 * h), 4, "is")
            start = splat16(f, "i32", f.op(f"mul i32 {isum}, -32"))
            acts = [act_dword(f, aq, _at(f, e_c, 4 * k)) for k in range(4 * h, 4 * h + 4)]
            chain = _token_dots(f, isa, units[4 * h : 4 * h + 4], acts, start, 63, 1)
            df = f.op(f"sitofp {V16I32} {chain} to {V16F}", "df")
            sda = f.op(f"fmul {V16F} {scales[h]}, {dab}", "sda")
            acc[j] = fma(f, df, sda, acc[j])


def _token_dots(
    f: Fn, isa: str, units: list[str], acts: list[str], start: str, u_max: int, n_chains: int
) -> str:
    """<16 x i32>: start + the sum over k of dot(units[k], acts[k]), units <= u_max. The one
    place the ISAs differ in a chunk: AVX2 groups its pmaddubsw results in i16 (dots); VNNI and
    generic run `n_chains` independent chains (_dot_chains) summed pairwise. Integer sums are
    exact in any order, so every path gives the same bits."""
    if isa == "avx2":
        return dots(f, units, acts, start, i16_group(u_max))
    chains = [start] + ["zeroinitializer"] * (n_chains - 1)
    for k, (u, a) in enumerate(zip(units, acts, strict=True)):
        chains[k % n_chains] = dot(f, isa, u, a, chains[k % n_chains])
    return _sum_chains(f, chains)


# --- the AVX2 path ------------------------------------------------------------------------------
# _token_dots sums the same integers as the other paths, grouped for pmaddubsw + pmaddwd, and
# the chunks run the same float steps: its outputs are bit-identical to the VNNI path's
# (tests/test_packed_matmul.py checks it).

# The AVX2 path's distances. There Q4_K without a prefetch streamed at 9.7 GB/s from memory
# (its two-instruction dots fill the out-of-order window with fewer bytes in flight), with one
# 3 records ahead at 33-36 GB/s, Q6_K's rate (24 distinct 8960 x 1536 weights, 1 token, 1
# thread, LOCALCHAT_CPU=haswell on a Zen 4; distances 1/2/3/4/6/8: 27/30/36/34/34/29 GB/s).
PREFETCH_RECORDS_AVX2 = {"Q4_K": 3, "Q6_K": 2}

# act_quant's int8 activations lie in [-127, 127] (round(x / (max|x| / 127))).
ACT_MAX = 127


def i16_group(u_max: int) -> int:
    """How many pmaddubsw results of unsigned values <= u_max may be added in i16: each i16
    lane is a pair sum of at most 2 * u_max * ACT_MAX, and the group's sum must stay below 2^15
    (no wrap, so the later i32 sums are exact)."""
    return max(1, (2**15 - 1) // (2 * u_max * ACT_MAX))


def dot_half(f: Fn, units: list[str], acts: list[str], acc: str, group: int) -> str:
    """AVX2, one 8-row half (<32 x i8> units and activations): <8 x i32> acc + lane i = the
    sum over the units of their 4 products in lane i. Per `group` consecutive units (group =
    i16_group of the units' bound) the pmaddubsw pair sums are added in i16 and ONE pmaddwd
    widens the lot, not one pmaddwd and one add per unit (llama.cpp's AVX2 Q4_K trick): fewer
    multiply-port uops, which is what the AVX2 dot is short of. Integers: exact in any order."""
    ones = splat(16, "i16", 1)
    wide = []
    for g0 in range(0, len(units), group):
        prods = [
            f.op(f"call <16 x i16> @llvm.x86.avx2.pmadd.ub.sw(<32 x i8> {u}, <32 x i8> {a})")
            for u, a in zip(units[g0 : g0 + group], acts[g0 : g0 + group], strict=True)
        ]
        p16 = _tree(f, "<16 x i16>", prods)
        wide.append(
            f.op(f"call <8 x i32> @llvm.x86.avx2.pmadd.wd(<16 x i16> {p16}, <16 x i16> {ones})")
        )
    d = _tree(f, "<8 x i32>", wide)
    return d if acc == "zeroinitializer" else f.op(f"add <8 x i32> {d}, {acc}", "dot")


def dots(f: Fn, units: list[str], acts: list[str], acc: str, group: int) -> str:
    """AVX2: acc + sum over k of dot(units[k], acts[k]), the same <16 x i32> lanes, each
    32-byte half (rows 0-7, 8-15) through dot_half. Only the AVX2 path calls this (VNNI's
    one-instruction dots have nothing to merge; the generic path keeps its own)."""
    if group == 1:
        for u, a in zip(units, acts, strict=True):
            acc = dot(f, "avx2", u, a, acc)
        return acc
    halves = []
    for h in (0, 1):
        sel = mask(range(32 * h, 32 * h + 32))
        uh = [f.op(f"shufflevector {V64I8} {u}, {V64I8} poison, {sel}") for u in units]
        ah = [f.op(f"shufflevector {V64I8} {a}, {V64I8} poison, {sel}") for a in acts]
        acc_h = acc
        if acc != "zeroinitializer":
            sel8 = mask(range(8 * h, 8 * h + 8))
            acc_h = f.op(f"shufflevector {V16I32} {acc}, {V16I32} poison, {sel8}")
        halves.append(dot_half(f, uh, ah, acc_h, group))
    return f.op(
        f"shufflevector <8 x i32> {halves[0]}, <8 x i32> {halves[1]}, {mask(range(16))}", "dot"
    )


def _tree(f: Fn, ty: str, terms: list[str]) -> str:
    """The sum of terms as a balanced tree of adds (short dependency chains)."""
    while len(terms) > 1:
        pairs = [f.op(f"add {ty} {a}, {b}") for a, b in zip(terms[0::2], terms[1::2], strict=False)]
        terms = pairs + terms[len(pairs) * 2 :]
    return terms[0]


_CHUNK = {"Q4_K": _chunk_q4_k, "Q6_K": _chunk_q6_k}


def tile_function(qname: str, isa: str, ntok: int) -> str:
    """`ptile(rec0, nblocks, aq, ad, s32, is, n, t, out, ostride, col, valid)`: out[t + j,
    col + i] for j < ntok, i < valid (<= 16), over one row group's records from rec0."""
    f = Fn()
    toks = []
    for j in range(ntok):
        tj = f.op(f"add i64 %t, {j}")
        aq = f.gep("%aq", f.op(f"mul i64 {tj}, %n"))
        per32 = f.op(f"mul i64 {tj}, %nb32")
        ad = f.op(f"getelementptr inbounds float, ptr %ad, i64 {per32}")
        s32 = f.op(f"getelementptr inbounds float, ptr %s32, i64 {per32}")
        is_ = f.op(f"getelementptr inbounds i32, ptr %is, i64 {f.op(f'mul i64 {tj}, %nb16')}")
        toks.append((aq, ad, s32, is_))
    # one iteration per 32 values (a loop, not 8 unrolled chunks: an eighth of the code, which
    # the generic path's compile time needs, for a loop overhead the 8 x TILE dots hide)
    nchunks = f.op("shl i64 %nblocks, 3")
    f("br label %head")
    f.put_label("head")
    f("%i = phi i64 [0, %entry], [%i_next, %body]")
    phi_at = len(f.lines)
    f(f"%more = icmp ult i64 %i, {nchunks}")
    f("br i1 %more, label %body, label %done")
    f.put_label("body")
    acc_phi = [f"%acc_{j}" for j in range(ntok)]
    acc = list(acc_phi)
    b = f.op("lshr i64 %i, 3")
    rec = f.gep("%rec0", f.op(f"mul i64 {b}, {RECORD_BYTES[qname]}"), "rec")
    distance = (PREFETCH_RECORDS_AVX2 if isa == "avx2" else PREFETCH_RECORDS)[qname]
    if distance:
        # The group's records are one contiguous stream; fetch the eighth of a record that
        # this chunk's position maps to, `distance` records ahead (decode is a stream from
        # memory).
        span = RECORD_BYTES[qname] // 8
        ahead = f.gep("%rec0", f.op(f"mul i64 %i, {span}"), "pf")
        ahead = f.gep(ahead, distance * RECORD_BYTES[qname], "pf")
        for line in range(0, span + 63, 64):
            f(f"call void @llvm.prefetch.p0(ptr {f.gep(ahead, line, 'pf')}, i32 0, i32 3, i32 1)")
    _CHUNK[qname](f, isa, rec, f.op("and i64 %i, 7"), "%i", toks, acc)
    return close_tile(f, qname, ntok, acc_phi, acc, phi_at)


def close_tile(
    f: Fn, qname: str, ntok: int, acc_phi: list[str], acc: list[str], phi_at: int
) -> str:
    """Close a tile's record loop (the accumulators' phis go in at `phi_at`), store its 16 rows
    x ntok tokens (rows past `%valid` masked off) and return the tile function's IR; shared by
    the K-quant and legacy-quant tiles (packed_legacy.py)."""
    f.lines[phi_at:phi_at] = [
        f"  {acc_phi[j]} = phi {V16F} [zeroinitializer, %entry], [{acc[j]}, %body]"
        for j in range(ntok)
    ]
    f("%i_next = add i64 %i, 1")
    f("br label %head")
    f.put_label("done")
    lane = f"<16 x i64> <{', '.join(f'i64 {i}' for i in range(16))}>"
    keep = f.op(f"icmp ult {lane}, {splat16(f, 'i64', '%valid')}", "keep")
    for j in range(ntok):
        tj = f.op(f"add i64 %t, {j}")
        row0 = f.op(f"add i64 {f.op(f'mul i64 {tj}, %ostride')}, %col")
        dst = f.op(f"getelementptr inbounds float, ptr %out, i64 {row0}")
        f(
            f"call void @llvm.masked.store.v16f32.p0({V16F} {acc_phi[j]}, ptr {dst}, i32 4, "
            f"<16 x i1> {keep})"
        )
    f("ret void")
    return (
        f"define internal void @ptile_{qname}_{ntok}(ptr %rec0, i64 %nblocks, ptr %aq, ptr %ad, "
        f"ptr %s32, ptr %is, i64 %n, i64 %t, ptr %out, i64 %ostride, i64 %col, i64 %valid) "
        f"noinline {{\nentry:\n  %nb32 = lshr i64 %n, 5\n  %nb16 = lshr i64 %n, 4\n"
        f"{f.text()}\n}}\n"
    )


def kernel_function(qname: str) -> str:
    """`pmm_<type>(args, tid, n_threads)`: this thread's row groups x all tokens."""
    f = Fn()
    s = QuantMatmulSlots
    w = f.arg("%args", s.W, "ptr")
    group_bytes = f.arg("%args", s.ROW_BYTES)
    n_rows = f.arg("%args", s.N_ROWS)
    nblocks = f.arg("%args", s.N_BLOCKS)
    ntok = f.arg("%args", s.N_TOKENS)
    aq, ad, s32, is_ = (f.arg("%args", i, "ptr") for i in (s.AQ, s.AD, s.SUMS32, s.ISUMS))
    out = f.arg("%args", s.OUT, "ptr")
    n = f.arg("%args", s.N)
    ostride = f.arg("%args", s.OUT_STRIDE)
    groups = f.op(f"lshr i64 {f.op(f'add i64 {n_rows}, {GROUP_ROWS - 1}')}, 4")
    g0, g1 = thread_range(f, groups, "%tid", "%nth")
    f("br label %gh")
    f.put_label("gh")
    f(f"%g = phi i64 [{g0}, %entry], [%g_next, %gnext]")
    f(f"%gmore = icmp ult i64 %g, {g1}")
    f("br i1 %gmore, label %gbody, label %exit")
    f.put_label("gbody")
    rec0 = f.gep(w, f.op(f"mul i64 %g, {group_bytes}"), "rec0")
    col = f.op("shl i64 %g, 4", "col")
    left = f.op(f"sub i64 {n_rows}, {col}")
    short = f.op(f"icmp ult i64 {left}, {GROUP_ROWS}")
    valid = f.op(f"select i1 {short}, i64 {left}, i64 {GROUP_ROWS}", "valid")

    def call(size: int, t: str) -> None:
        f(
            f"call void @ptile_{qname}_{size}(ptr {rec0}, i64 {nblocks}, ptr {aq}, ptr {ad}, "
            f"ptr {s32}, ptr {is_}, i64 {n}, i64 {t}, ptr {out}, i64 {ostride}, i64 {col}, "
            f"i64 {valid})"
        )

    f("br label %th")
    f.put_label("th")
    f("%t = phi i64 [0, %gbody], [%tn, %tb]")
    f(f"%tfits = icmp ule i64 {f.op(f'add i64 %t, {TILE}')}, {ntok}")
    f(f"br i1 %tfits, label %tb, label %s{SMALL_TILES[0]}")
    f.put_label("tb")
    call(TILE, "%t")
    f(f"%tn = add i64 %t, {TILE}")
    f("br label %th")
    t = "%t"
    for size in SMALL_TILES:
        f.put_label(f"s{size}")
        f(f"%s{size}_e = add i64 {t}, {size}")
        f(f"%s{size}_fits = icmp ule i64 %s{size}_e, {ntok}")
        f(f"br i1 %s{size}_fits, label %s{size}_b, label %s{size}_j")
        f.put_label(f"s{size}_b")
        call(size, t)
        f(f"br label %s{size}_j")
        f.put_label(f"s{size}_j")
        f(f"%s{size}_t = phi i64 [{t}, %s{size}], [%s{size}_e, %s{size}_b]")
        t = f"%s{size}_t"
        nxt = f"s{SMALL_TILES[SMALL_TILES.index(size) + 1]}" if size != SMALL_TILES[-1] else "gnext"
        f(f"br label %{nxt}")
    f.put_label("gnext")
    f("%g_next = add i64 %g, 1")
    f("br label %gh")
    f.put_label("exit")
    f("ret void")
    return f"define void @pmm_{qname}(ptr %args, i32 %tid, i32 %nth) {{\nentry:\n{f.text()}\n}}\n"


def module_ir(qname: str, isa: str) -> str:
    """One module per repacked type: the tile shapes plus the threaded driver."""
    return "\n".join(
        [
            DECLARATIONS,
            f"declare void @llvm.masked.store.v16f32.p0({V16F}, ptr, i32, <16 x i1>)",
            *(tile_function(qname, isa, nt) for nt in (TILE, *SMALL_TILES)),
            kernel_function(qname),
        ]
    )
