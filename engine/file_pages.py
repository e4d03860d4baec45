"""Which pages of a memory-mapped model file count in this process's memory: madvise, typed and
looked up once, for the three things the engine asks of it.

- `populate(start, end)` maps a range in one call (MADV_POPULATE_READ, Linux 5.14+) instead of
  one page fault per 4 KiB (or per fault-around window) taken by whoever reads it first.
- `release_file_pages(arr)` drops the resident pages of a file mapping (MADV_DONTNEED) once the
  engine has copied them into its own layout (engine/kernels/repack.py), so the original and the
  copy are never both counted; a later read faults them back in from the page cache.
- `advise(arr, advice)` for anything else (record_memory.py's MADV_HUGEPAGE).

Everything here is a hint: where madvise is missing (not Linux) or refuses, nothing changes but
residency, and each function says whether it did anything.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import mmap
import sys

import numpy as np

PAGE = mmap.PAGESIZE
MADV_POPULATE_READ = 22  # linux/mman.h (5.14+); Python's mmap module does not name it
_MADV_DONTNEED = getattr(mmap, "MADV_DONTNEED", None)


@functools.cache
def _madvise():
    """libc's madvise with argument types, or None off Linux. Looked up once: find_library runs
    `ldconfig -p` in a subprocess (~2 ms), which once per repack pass was a third of the whole
    repack's time."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        lib = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    except OSError:
        return None
    madvise = lib.madvise
    madvise.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
    madvise.restype = ctypes.c_int
    return madvise


def advise(start: int, length: int, advice: int) -> bool:
    """madvise(start, length, advice); False where it is missing or refused."""
    madvise = _madvise()
    return madvise is not None and length > 0 and madvise(start, length, advice) == 0


def populate(start: int, end: int) -> bool:
    """Map the pages of [start, end) (rounded out to pages) into this process in one call,
    reading from disk whatever the page cache lacks; False where the kernel cannot (before
    5.14, not Linux). Blocking, with the GIL released (ctypes)."""
    start -= start % PAGE
    end += -end % PAGE
    return advise(start, end - start, MADV_POPULATE_READ)


def populate_array(arr: np.ndarray) -> bool:
    """`populate` over an array's bytes (a view into a file mapping)."""
    return arr.nbytes > 0 and populate(arr.ctypes.data, arr.ctypes.data + arr.nbytes)


def mapped_by_a_file(arr: np.ndarray) -> bool:
    """Whether arr's memory belongs to an mmap.mmap (a file mapping), found down its base chain.
    Anonymous memory must never be released: MADV_DONTNEED would zero it."""
    base: object = arr
    while base is not None:
        if isinstance(base, mmap.mmap):
            return True
        if isinstance(base, memoryview):
            base = base.obj
            continue
        base = getattr(base, "base", None)
    return False


def release_file_pages(arr: np.ndarray) -> bool:
    """Drop the resident pages wholly inside arr's part of a read-only file mapping (Linux): a
    later read faults them back in from the page cache, so this only stops them counting twice
    in the process's memory. False where nothing was released (not a file mapping, no madvise)."""
    if _MADV_DONTNEED is None or not mapped_by_a_file(arr):
        return False
    start = arr.ctypes.data
    end = start + arr.nbytes
    lo, hi = -(-start // PAGE) * PAGE, end // PAGE * PAGE
    return hi > lo and advise(lo, hi - lo, _MADV_DONTNEED)
