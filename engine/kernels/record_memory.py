"""Memory for repacked weight records: 2 MiB-aligned chunks on transparent huge pages.

Decode streams every weight once per token, so the records' pages are a TLB stream: with 4 KiB
pages, ~250,000 page walks per token on a 1.5B model (nested walks in a virtual machine). numpy
already asks for huge pages on its big allocations, but only the 2 MiB-aligned interior of each
array gets them: the 28 x 4 attention projections of a 1.5B model (0.2-1.4 MB each) got none and
an 8 MB FFN matrix three of its five. Measured on this host (AMD EPYC, KVM guest; the model's
real records copied into either memory, same kernel, alternating, best of 30): the attention
projections 14.9 -> 23.6 GB/s at 1 thread and 19.1 -> 23.9 at 2; ffn_up 22.2 -> 25.9 and
28.6 -> 32.2; ffn_down (2 threads) 26.1 -> 29.2.

So records are carved one after another out of chunks of at least CHUNK_BYTES that start on a
2 MiB boundary and are advised MADV_HUGEPAGE. A chunk lives as long as any record carved from it
(each record is a view of the chunk array); the allocator keeps only a weak reference to the
chunk it is filling, so unloading a model frees its chunks. The waste is the unused tail of a
chunk, which is never touched but for the rest of the huge page the last record ends in; once
no record can be carved from a tail any more its pages are given back (_release_tail).
"""

from __future__ import annotations

import mmap
import threading
import weakref

import numpy as np

from engine.file_pages import PAGE, advise

HUGE_PAGE = 1 << 21
CHUNK_BYTES = 1 << 25  # 32 MiB: a few weights of a 1.5B model, one FFN matrix of a 7B
ALIGN = 64  # every record array starts on a cache line (the kernels' vectors are 64 bytes)

_MADV_HUGEPAGE = getattr(mmap, "MADV_HUGEPAGE", None)
_MADV_DONTNEED = getattr(mmap, "MADV_DONTNEED", None)


def _advise_huge(arr: np.ndarray) -> None:
    """MADV_HUGEPAGE on arr (Linux; elsewhere, or if refused, ordinary pages are used)."""
    if _MADV_HUGEPAGE is not None:
        advise(arr.ctypes.data, arr.nbytes, _MADV_HUGEPAGE)


class RecordMemory:
    """Hands out uint8 arrays carved from huge-page chunks (thread-safe)."""

    def __init__(self, chunk_bytes: int = CHUNK_BYTES):
        self.chunk_bytes = chunk_bytes
        self._lock = threading.Lock()
        # The chunk being filled: a weak reference to the array that owns its memory (every
        # array carved from it is a view whose .base is that owner, and keeps it alive), the
        # offset of its 2 MiB boundary, its usable size and the bytes handed out so far.
        self._owner: weakref.ref[np.ndarray] | None = None
        self._start = self._size = self._used = 0

    def _new_chunk(self, size: int) -> tuple[np.ndarray, int]:
        raw = np.empty(size + HUGE_PAGE, np.uint8)
        start = -raw.ctypes.data % HUGE_PAGE
        _advise_huge(raw[start : start + size])
        return raw, start

    def take(self, nbytes: int) -> np.ndarray:
        """A fresh (uninitialised) uint8 array of nbytes starting on a 64-byte boundary."""
        need = -(-nbytes // ALIGN) * ALIGN
        with self._lock:
            owner = self._owner() if self._owner is not None else None
            left = self._size - self._used if owner is not None else -1
            if need <= left:
                assert owner is not None
                at = self._start + self._used
                self._used += need
                return owner[at : at + nbytes]
            size = max(self.chunk_bytes, -(-need // HUGE_PAGE) * HUGE_PAGE)
            raw, start = self._new_chunk(size)
            if size - need >= left:  # go on filling whichever chunk has more room left
                if owner is not None:
                    _release_tail(owner, self._start + self._used, self._start + self._size)
                self._owner, self._start, self._size, self._used = (
                    weakref.ref(raw),
                    start,
                    size,
                    need,
                )
            else:
                _release_tail(raw, start + need, start + size)
            return raw[start : start + nbytes]


def _release_tail(chunk: np.ndarray, used_end: int, end: int) -> None:
    """Give back the pages of a chunk's tail that no record will be carved from: the last record
    ends inside a huge page, whose whole 2 MiB the kernel made resident (measured on the 1.5B:
    29 MB over the records' own 970 MiB, across ~35 chunks). The kernel splits that huge page;
    the tail is never handed out, so dropping its (untouched or zero) contents is safe."""
    base = chunk.ctypes.data
    lo = -(-(base + used_end) // PAGE) * PAGE
    hi = (base + end) // PAGE * PAGE
    if hi > lo and _MADV_DONTNEED is not None:
        advise(lo, hi - lo, _MADV_DONTNEED)


_default = RecordMemory()


def record_array(shape: tuple[int, ...]) -> np.ndarray:
    """An uninitialised uint8 array of `shape` in the process's huge-page record memory."""
    n = 1
    for s in shape:
        n *= int(s)
    return _default.take(n).reshape(shape)
