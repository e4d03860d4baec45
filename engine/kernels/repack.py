"""Q4_K / Q6_K and Q4_0 / Q4_1 / Q5_0 / Q5_1 / Q8_0 weights repacked once at load into 16-row
interleaved records.

The GGUF layout keeps each row's blocks together, so a mat-mul kernel unpacks one row at a time
and reduces every dot product across vector lanes. A record here holds one 256-value super-block
of 16 consecutive rows, laid out for `vpdpbusd` with a broadcast activation dword: vector k of a
32-value sub-block holds, in lane i (4 bytes), values 4k..4k+3 of row i. One instruction then
advances 16 row accumulators by 4 products each and no lane is ever reduced (the llama.cpp
"repack" idea, engine/kernels/packed_matmul.py streams it). The scales are pre-decoded:

  Q4_K record (2368 bytes, 148 per row; the GGUF block is 144):
    [0, 2048)     8 sub-blocks x 4 vectors x 64 bytes: vector p of sub-block j holds unit p in
                  its low nibbles and unit p + 4 in its high nibbles (unit k = values 4k..4k+3
                  of the sub-block, lane i = row i)
    [2048, 2176)  scale (6 bits, u8) [sub-block][row]
    [2176, 2304)  min (6 bits, u8) [sub-block][row]
    [2304, 2336)  d (f16) [row];  [2336, 2368) dmin (f16) [row]
  Q6_K record (3392 bytes, 212 per row; the GGUF block is 210):
    [0, 3072)     8 chunks of 32 values x 384 bytes: 4 vectors of low nibbles (unit p low,
                  unit p + 4 high), then 2 vectors of high 2-bit pairs (vector q holds units
                  4q..4q+3 at bits 0, 2, 4, 6); each value is q + 32 in 0..63
    [3072, 3328)  scale (i8) [16-value group][row]
    [3328, 3392)  d (f32) [row]

Q4_K's super-block scales stay f16, as in the file, and the kernel converts 16 at a time (one
vcvtph2ps): f32 copies cost 4 bytes per row, ~87 MB of a 7B model's memory for no accuracy
(the conversion is exact either way). Q6_K's d stays f32: as f16 its record would be 3360
bytes, not a whole number of 64-byte lines, so every other record's vector loads would split
cache lines, for 2 bytes a row.

The legacy types' records hold one 32-value block of 16 rows (their rows are whole 32-value
blocks, not always whole 256-value super-blocks: SmolLM2's 576 and gemma-3's 640 columns), the
same bytes per row as the GGUF block; unit k = values 4k..4k+3 of the block, lane i = row i, and
the f16 scales are kept as f16 here too (f32 would also cost bandwidth: a tenth of a Q4_0
record):

  Q4_0 (288 bytes), Q4_1 (320):  [0, 256) 4 vectors: vector p holds unit p in its low nibbles
                  and unit p + 4 in its high nibbles (lane i = bytes 4p..4p+3 of row i's qs);
                  then d (f16) [row]; Q4_1: then m (f16) [row]
  Q5_0 (352 bytes), Q5_1 (384):  the same 4 nibble vectors; [256, 320) the high bits: bit k of
                  byte e of lane i is the fifth bit of value 4k + e of row i; then d (f16)
                  [row]; Q5_1: then m (f16) [row]
  Q8_0 (544 bytes):  [0, 512) 8 vectors: vector k holds unit k as int8; [512, 544) d (f16) [row]

Rows past the last multiple of 16 are zero (their outputs are never stored). Once a tensor is
repacked its pages of the memory-mapped file are released (madvise DONTNEED), so the process
holds the repacked bytes instead of the original ones, not both; the file's other tensors are
untouched.

The JIT backend repacks through its compiled kernels (repack_jit.py, passed in as `fill`); the
numpy code here is the fallback without them and the tests' reference for their bytes.
"""

from __future__ import annotations

import os
import threading
import weakref
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np

from engine.file_pages import populate_array, release_file_pages
from engine.kernels.record_memory import record_array
from engine.qtensor import QTensor

GROUP_ROWS = 16  # rows per record: one 512-bit vector of i32 lanes
BLOCK = 256
RECORD_BYTES = {"Q4_K": 2368, "Q6_K": 3392}
SOURCE_BLOCK_BYTES = {"Q4_K": 144, "Q6_K": 210}
# The legacy types: one record per 32-value block of 16 rows (same bytes per row as the file).
LEGACY_BLOCK = 32
LEGACY_RECORD_BYTES = {"Q4_0": 288, "Q4_1": 320, "Q5_0": 352, "Q5_1": 384, "Q8_0": 544}
LEGACY_SOURCE_BLOCK_BYTES = {"Q4_0": 18, "Q4_1": 20, "Q5_0": 22, "Q5_1": 24, "Q8_0": 34}
# File bytes repacked per numpy pass: bounds the temporaries (~3x the pass) on a 150k-row output
# matrix and keeps them in cache; passes run on up to _REPACK_THREADS threads.
_PASS_BYTES = 1 << 20
_REPACK_THREADS = min(4, os.cpu_count() or 1)


@dataclass(frozen=True, eq=False)
class PackedWeight:
    """A repacked weight: `data` is uint8 [groups, n_blocks, record bytes]."""

    qname: str
    rows: int
    cols: int
    data: np.ndarray

    @property
    def group_bytes(self) -> int:
        return int(self.data.shape[1] * self.data.shape[2])


def block_values(qname: str) -> int:
    """Values of one row in one record: a K-quant super-block or a legacy 32-value block."""
    return BLOCK if qname in RECORD_BYTES else LEGACY_BLOCK


def record_bytes(qname: str) -> int:
    return RECORD_BYTES.get(qname) or LEGACY_RECORD_BYTES[qname]


def source_block_bytes(qname: str) -> int:
    return SOURCE_BLOCK_BYTES.get(qname) or LEGACY_SOURCE_BLOCK_BYTES[qname]


def record_shape(w: QTensor) -> tuple[int, int, int]:
    """(groups of GROUP_ROWS rows, blocks per row, record bytes): the shape of w's records."""
    qname = w.qtype.name
    return -(-w.rows // GROUP_ROWS), w.cols // block_values(qname), record_bytes(qname)


def packable(w: QTensor) -> bool:
    qname = w.qtype.name
    known = qname in RECORD_BYTES or qname in LEGACY_RECORD_BYTES
    return known and len(w.shape) == 2 and w.cols % block_values(qname) == 0


# --- unpacking the GGUF blocks to small integers --------------------------------------------


# The fields below work on uint32 views: 4 consecutive values of one row are one element (one
# vpdpbusd lane), so the transposes move a quarter of the elements and the nibble arithmetic
# runs 4 values at a time (no carry crosses a byte: every shift keeps each byte's bits in it).
_LOW4 = np.uint32(0x0F0F0F0F)
_LOW2 = np.uint32(0x03030303)
_LOW6 = np.uint32(0x3F3F3F3F)


def _u32(a: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(a).view(np.uint32)


def _q4_k_fields(blocks: np.ndarray):
    """uint8 [r, nb, 144] -> (q as u32 [r, nb, 8 chunks, 8 units] of 4 nibble values,
    sc u8 [r, nb, 8], m u8 [r, nb, 8], d f16, dmin f16: the records keep the file's f16)."""
    lead = blocks.shape[:-1]
    # d and dmin in one conversion, the 12 scale bytes as 3 u32 (4 sub-blocks each): numpy's
    # per-element overhead on the blocks' short strided byte fields was most of the repack.
    dd = np.ascontiguousarray(blocks[..., 0:4]).view(np.float16)
    d, dmin = dd[..., 0], dd[..., 1]
    s = _u32(blocks[..., 4:16])  # [r, nb, 3]: scale bytes 0-3, 4-7, 8-11
    a, b, c = s[..., 0], s[..., 1], s[..., 2]
    sc32 = np.empty((*lead, 2), np.uint32)
    m32 = np.empty_like(sc32)
    sc32[..., 0] = a & _LOW6
    m32[..., 0] = b & _LOW6
    sc32[..., 1] = (c & _LOW4) | (((a >> 6) & _LOW2) << 4)
    m32[..., 1] = ((c >> 4) & _LOW4) | (((b >> 6) & _LOW2) << 4)
    sc, m = sc32.view(np.uint8), m32.view(np.uint8)
    qs = _u32(blocks[..., 16:144]).reshape(*lead, 4, 8)  # 32-byte run j: sub-blocks 2j, 2j + 1
    q = np.stack([qs & _LOW4, (qs >> 4) & _LOW4], axis=-2)  # [r, nb, 4, 2, 8]
    return q.reshape(*lead, 8, 8), sc, m, d, dmin


def _q6_k_fields(blocks: np.ndarray):
    """uint8 [r, nb, 210] -> (q + 32 as u32 [r, nb, 8 chunks, 8 units] of 4 values,
    scale i8 [r, nb, 16], d f32)."""
    lead = blocks.shape[:-1]
    ql = _u32(blocks[..., 0:128]).reshape(*lead, 2, 2, 8)  # [half n][32-byte run][4 bytes]
    qh = _u32(blocks[..., 128:192]).reshape(*lead, 2, 8)
    run0, run1 = ql[..., 0, :], ql[..., 1, :]
    lo = [run0 & _LOW4, run1 & _LOW4, (run0 >> 4) & _LOW4, (run1 >> 4) & _LOW4]
    q = np.stack([lo[k] | (((qh >> (2 * k)) & _LOW2) << 4) for k in range(4)], axis=-2)
    sc = blocks[..., 192:208].view(np.int8)
    d = blocks[..., 208:210].copy().view(np.float16)[..., 0].astype(np.float32)
    return q.reshape(*lead, 8, 8), sc, d  # value 128n + 32k + l: chunk 4n + k, unit l // 4


def _pad_rows(a: np.ndarray, rows: int) -> np.ndarray:
    if a.shape[0] == rows:
        return a
    pad = np.zeros((rows - a.shape[0], *a.shape[1:]), a.dtype)
    return np.concatenate([a, pad])


def _lanes(q: np.ndarray, g: int) -> np.ndarray:
    """u32 [g*16, nb, 8, 8] -> [g, nb, chunk, unit, row]: the record order."""
    nb = q.shape[1]
    return q.reshape(g, GROUP_ROWS, nb, 8, 8).transpose(0, 2, 3, 4, 1)


def _per_row(a: np.ndarray, g: int) -> np.ndarray:
    """[g*16, nb, width] -> [g, nb, width * 16] laid out [width][row]."""
    nb, width = a.shape[1], a.shape[2]
    return np.ascontiguousarray(
        a.reshape(g, GROUP_ROWS, nb, width).transpose(0, 2, 3, 1).reshape(g, nb, -1)
    )


def _records_q4_k(blocks: np.ndarray) -> np.ndarray:
    """uint8 [g*16, nb, 144] -> records uint8 [g, nb, 2368]."""
    q, sc, m, d, dmin = _q4_k_fields(blocks)
    g, nb = blocks.shape[0] // GROUP_ROWS, blocks.shape[1]
    units = _lanes(q, g)  # [g, nb, c, k, i]
    packed = units[:, :, :, :4] | (units[:, :, :, 4:] << 4)
    rec = np.empty((g, nb, RECORD_BYTES["Q4_K"]), np.uint8)
    rec[..., :2048] = packed.reshape(g, nb, 512).view(np.uint8)
    rec[..., 2048:2176] = _per_row(sc, g)
    rec[..., 2176:2304] = _per_row(m, g)
    rec[..., 2304:2336] = _per_row(d[..., None], g).view(np.uint8)
    rec[..., 2336:2368] = _per_row(dmin[..., None], g).view(np.uint8)
    return rec


def _records_q6_k(blocks: np.ndarray) -> np.ndarray:
    """uint8 [g*16, nb, 210] -> records uint8 [g, nb, 3392]."""
    q, sc, d = _q6_k_fields(blocks)
    g, nb = blocks.shape[0] // GROUP_ROWS, blocks.shape[1]
    units = _lanes(q, g)  # [g, nb, c, k, i]
    low = (units[:, :, :, :4] & _LOW4) | ((units[:, :, :, 4:] & _LOW4) << 4)  # [g,nb,c,4,i]
    top = (units >> 4) & _LOW2
    high = np.stack(
        [
            top[:, :, :, 4 * h]
            | (top[:, :, :, 4 * h + 1] << 2)
            | (top[:, :, :, 4 * h + 2] << 4)
            | (top[:, :, :, 4 * h + 3] << 6)
            for h in (0, 1)
        ],
        axis=3,
    )  # [g, nb, c, 2, i]
    rec = np.empty((g, nb, RECORD_BYTES["Q6_K"]), np.uint8)
    chunks = rec[..., :3072].reshape(g, nb, 8, 384)
    chunks[..., :256] = np.ascontiguousarray(low).reshape(g, nb, 8, 64).view(np.uint8)
    chunks[..., 256:] = high.reshape(g, nb, 8, 32).view(np.uint8)
    rec[..., 3072:3328] = _per_row(sc, g).view(np.uint8)
    rec[..., 3328:3392] = _per_row(d[..., None], g).view(np.uint8)
    return rec


# --- the legacy types: one record per 32-value block --------------------------------------


def _rows_to_lanes(a: np.ndarray, g: int) -> np.ndarray:
    """[g*16, nb, width] (any dtype) -> [g, nb, width, 16]: element [.., w, i] from row i."""
    nb, width = a.shape[1], a.shape[2]
    return a.reshape(g, GROUP_ROWS, nb, width).transpose(0, 2, 3, 1)


def _legacy_high_bits(qh: np.ndarray) -> np.ndarray:
    """u32 [..] of Q5_x fifth bits (bit v = value v) -> u32 [..] whose byte e holds at bit k
    the fifth bit of value 4k + e (unit k, element e: what the kernel shifts into place)."""
    out = np.zeros(qh.shape, np.uint32)
    for k in range(8):
        for e in range(4):
            out |= ((qh >> np.uint32(4 * k + e)) & np.uint32(1)) << np.uint32(8 * e + k)
    return out


def _legacy_records(qname: str):
    """uint8 [g*16, nb, block bytes] -> records uint8 [g, nb, record bytes] for one legacy type."""
    has_min = qname in ("Q4_1", "Q5_1")
    has_high = qname in ("Q5_0", "Q5_1")
    scales = 4 if has_min else 2  # f16 bytes before qh / qs
    qs_at = scales + (4 if has_high else 0)
    units = 8 if qname == "Q8_0" else 4  # u32 words of qs per row

    def build(blocks: np.ndarray) -> np.ndarray:
        g, nb = blocks.shape[0] // GROUP_ROWS, blocks.shape[1]
        rec = np.empty((g, nb, LEGACY_RECORD_BYTES[qname]), np.uint8)
        qs = _u32(blocks[..., qs_at : qs_at + 4 * units])  # [r, nb, units]
        at = 64 * units
        rec[..., :at] = (
            np.ascontiguousarray(_rows_to_lanes(qs, g)).reshape(g, nb, -1).view(np.uint8)
        )
        if has_high:
            high = _legacy_high_bits(_u32(blocks[..., scales : scales + 4])[..., 0])
            rec[..., at : at + 64] = (
                np.ascontiguousarray(_rows_to_lanes(high[..., None], g))
                .reshape(g, nb, -1)
                .view(np.uint8)
            )
            at += 64
        for f in range(scales // 2):  # d, then m
            half = np.ascontiguousarray(blocks[..., 2 * f : 2 * f + 2]).view(np.uint16)
            rec[..., at : at + 32] = (
                np.ascontiguousarray(_rows_to_lanes(half, g)).reshape(g, nb, -1).view(np.uint8)
            )
            at += 32
        assert at == LEGACY_RECORD_BYTES[qname]
        return rec

    return build


_RECORDS = {
    "Q4_K": _records_q4_k,
    "Q6_K": _records_q6_k,
    **{q: _legacy_records(q) for q in LEGACY_RECORD_BYTES},
}


# A compiled repack (repack_jit.py through a backend's pool): fill(qname, src, rows, n_blocks,
# out) writes the records of `rows` rows of GGUF blocks (C-contiguous, from src's address) into
# out's groups. Passes through it are bigger: it makes no temporaries and runs on every thread.
RecordFiller = Callable[[str, np.ndarray, int, int, np.ndarray], None]
_FILL_PASS_BYTES = 1 << 23


def repack(w: QTensor, release: bool = False, fill: RecordFiller | None = None) -> PackedWeight:
    """The records of a packable weight (`packable(w)`), built in passes of about
    _PASS_BYTES of the file on up to _REPACK_THREADS threads (numpy releases the GIL), or by
    `fill` in passes of _FILL_PASS_BYTES; with `release`, each pass's pages of the file mapping
    are released as soon as it is done, so the original and the repacked bytes of a big tensor
    are never both resident."""
    qname = w.qtype.name
    nb = w.cols // block_values(qname)
    src = np.asarray(w.data).reshape(w.rows, nb, source_block_bytes(qname))
    # huge-page memory: decode streams these records once per token (record_memory.py)
    out = record_array(record_shape(w))
    group_file_bytes = GROUP_ROWS * nb * source_block_bytes(qname)
    step = max(1, (_PASS_BYTES if fill is None else _FILL_PASS_BYTES) // group_file_bytes)
    step *= GROUP_ROWS

    def one_pass(r0: int) -> None:
        r1 = min(r0 + step, w.rows)
        g0 = r0 // GROUP_ROWS
        if release:  # the file's pages: mapped in one call, not one fault at a time
            populate_array(src[r0:r1])
        if fill is not None:
            fill(qname, src[r0:r1], r1 - r0, nb, out[g0 : g0 + -(-(r1 - r0) // GROUP_ROWS)])
        else:
            part = _pad_rows(src[r0:r1], -(-(r1 - r0) // GROUP_ROWS) * GROUP_ROWS)
            out[g0 : g0 + part.shape[0] // GROUP_ROWS] = _RECORDS[qname](part)
        if release:
            release_file_pages(src[r0:r1])

    starts = range(0, w.rows, step)
    if len(starts) == 1 or _REPACK_THREADS == 1 or fill is not None:
        for r0 in starts:
            one_pass(r0)
    else:
        with ThreadPoolExecutor(min(_REPACK_THREADS, len(starts))) as ex:
            list(ex.map(one_pass, starts))
    return PackedWeight(qname, w.rows, w.cols, out)


# --- dequantizing records (the tests' round trip and the reference for them) ----------------


def _dequantize_legacy(p: PackedWeight) -> np.ndarray:
    """[g, nb, k, i, e] float32 values of a legacy type's records (unit k, row i, element e),
    computed as gguf-py does (d * q, then + m: two roundings, no fma)."""
    g, nb = p.data.shape[:2]
    rec = p.data
    q: np.ndarray
    if p.qname == "Q8_0":
        q = rec[..., :512].view(np.int8).reshape(g, nb, 8, GROUP_ROWS, 4).astype(np.float32)
        at = 512
    else:
        nib = rec[..., :256].reshape(g, nb, 4, GROUP_ROWS, 4)
        u = np.concatenate([nib & 15, nib >> 4], axis=2)  # [g, nb, k, i, e]
        at = 256
        if p.qname in ("Q5_0", "Q5_1"):
            high = rec[..., 256:320].reshape(g, nb, 1, GROUP_ROWS, 4)
            u = u | (((high >> np.arange(8, dtype=np.uint8).reshape(8, 1, 1)) & 1) << 4)
            at = 320
        q = u.astype(np.float32)
        if p.qname in ("Q4_0", "Q5_0"):
            q -= 8.0 if p.qname == "Q4_0" else 16.0

    shape = (g, nb, 1, GROUP_ROWS, 1)
    vals = _f16_lanes(rec, at).reshape(shape) * q
    if p.qname in ("Q4_1", "Q5_1"):
        vals = vals + _f16_lanes(rec, at + 32).reshape(shape)
    return vals


def _f16_lanes(rec: np.ndarray, at: int) -> np.ndarray:
    """float32 [g, nb, 16]: the records' 16 f16 values (one per row) at byte `at`."""
    return np.ascontiguousarray(rec[..., at : at + 32]).view(np.float16).astype(np.float32)


def dequantize_records(p: PackedWeight) -> np.ndarray:
    """float32 [rows, cols] from the records alone, by the layout in the module docstring."""
    g, nb = p.data.shape[:2]
    rec = p.data
    if p.qname in LEGACY_RECORD_BYTES:
        vals = _dequantize_legacy(p)  # [g, nb, k, i, e] -> [g, i, nb, k, e] -> rows
        return vals.transpose(0, 3, 1, 2, 4).reshape(g * GROUP_ROWS, nb * LEGACY_BLOCK)[: p.rows]
    if p.qname == "Q4_K":
        packed = rec[..., :2048].reshape(g, nb, 8, 4, GROUP_ROWS, 4)
        units = np.concatenate([packed & 15, packed >> 4], axis=3)  # [g,nb,c,k,i,e]
        sc = rec[..., 2048:2176].reshape(g, nb, 8, GROUP_ROWS).astype(np.float32)
        m = rec[..., 2176:2304].reshape(g, nb, 8, GROUP_ROWS).astype(np.float32)
        d = _f16_lanes(rec, 2304).reshape(g, nb, 1, GROUP_ROWS)
        dmin = _f16_lanes(rec, 2336).reshape(g, nb, 1, GROUP_ROWS)
        vals = units.astype(np.float32) * (d * sc)[:, :, :, None, :, None]
        vals -= (dmin * m)[:, :, :, None, :, None]
    else:
        chunks = rec[..., :3072].reshape(g, nb, 8, 384)
        low = chunks[..., :256].reshape(g, nb, 8, 4, GROUP_ROWS, 4)
        high = chunks[..., 256:].reshape(g, nb, 8, 2, GROUP_ROWS, 4)
        lo = np.concatenate([low & 15, low >> 4], axis=3)
        hi = np.stack([(high[:, :, :, k // 4] >> (2 * (k % 4))) & 3 for k in range(8)], axis=3)
        units = (lo | (hi << 4)).astype(np.float32) - 32.0  # [g,nb,c,k,i,e]
        sc6 = rec[..., 3072:3328].view(np.int8).reshape(g, nb, 8, 2, GROUP_ROWS)
        d6 = rec[..., 3328:3392].copy().view(np.float32).reshape(g, nb, 1, 1, GROUP_ROWS)
        scale = (d6 * sc6).repeat(4, axis=3)  # unit k belongs to group k // 4
        vals = units * scale[..., None]
    # [g, nb, c, k, i, e] -> [g, i, nb, c, k, e] -> rows
    return vals.transpose(0, 4, 1, 2, 3, 5).reshape(g * GROUP_ROWS, nb * BLOCK)[: p.rows]


# --- one repacked copy per weight per process, the file's pages released ------------------

_lock = threading.Lock()
_packed: weakref.WeakKeyDictionary[QTensor, PackedWeight] = weakref.WeakKeyDictionary()


# Called once with a weight's records when they are made (record_cache.py writes them to disk).
_on_packed: weakref.WeakKeyDictionary[QTensor, Callable[[PackedWeight], None]] = (
    weakref.WeakKeyDictionary()
)


def packed_for(w: QTensor, fill: RecordFiller | None = None) -> PackedWeight:
    """The process's repacked copy of `w` (every backend over the same weights shares it), made
    by `fill` where given (a compiled repack), else by numpy, or the records `adopt` gave."""
    with _lock:
        hit = _packed.get(w)
        if hit is None:
            hit = _packed[w] = repack(w, release=True, fill=fill)
            release_file_pages(w.data)  # the pages that straddled two passes
            listener = _on_packed.pop(w, None)
            if listener is not None:
                listener(hit)
        return hit


def adopt(w: QTensor, records: np.ndarray) -> None:
    """Use `records` (made earlier, e.g. mapped from the record cache) as w's repacked copy."""
    if records.shape != record_shape(w):
        raise ValueError(f"{w.name}: records of shape {records.shape} do not fit the weight")
    with _lock:
        _packed[w] = PackedWeight(w.qtype.name, w.rows, w.cols, records)


def on_packed(w: QTensor, listener: Callable[[PackedWeight], None]) -> None:
    """Call listener(records) once, when w's records are made (not if they are adopted)."""
    with _lock:
        _on_packed[w] = listener
