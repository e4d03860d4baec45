"""Map a model's weight pages into the process before the first forward pass needs them.

The GGUF file is memory-mapped (engine/gguf.py), so opening it reads only the header. The first
forward pass then touches every weight page, and each touch is a page fault taken by a kernel
worker thread in the middle of a mat-vec: a 4.5 GB 7B file is ~1.1 million 4 KiB pages (tens of
thousands of faults even with the kernel's fault-around), measured at ~0.45 s of the first
one-token forward pass on this machine. Here one background thread asks the kernel
to map them instead (`madvise(MADV_POPULATE_READ)`, Linux 5.14+: the kernel walks the range,
reading from disk whatever the page cache lacks, in large sequential requests), while the load
goes on building the tokenizer and the kernel library on the main thread. The call releases the
GIL (ctypes), so it overlaps the load's Python work.

Only the tensors the first token reads are prefetched: with an untied output projection the
embedding matrix is read one row per prompt token, so its pages are left to fault in as used
(on a 7B Q4_K_M file, 300 MB that would otherwise be resident for nothing).

Where MADV_POPULATE_READ is missing (older kernels, other systems), one byte per page is read
with numpy (its loops release the GIL too), which costs the same faults but off the critical path.
Nothing here changes what is computed: a forward pass that starts before the prefetch ends just
takes the remaining faults itself.
"""

from __future__ import annotations

import ctypes
import logging
import mmap
import sys
import threading
from collections.abc import Iterable

import numpy as np

from engine.qtensor import QTensor

log = logging.getLogger(__name__)

MADV_POPULATE_READ = 22  # linux/mman.h (5.14+)
PAGE = mmap.PAGESIZE
EMBEDDING = "token_embd.weight"
UNTIED_OUTPUT = "output.weight"


def first_token_tensors(tensors: dict[str, QTensor]) -> list[QTensor]:
    """Every tensor but an embedding matrix that the output projection does not share."""
    if UNTIED_OUTPUT in tensors:
        return [t for name, t in tensors.items() if name != EMBEDDING]
    return list(tensors.values())


def page_ranges(tensors: Iterable[QTensor]) -> list[tuple[int, int]]:
    """(start, end) addresses covering the tensors' bytes, page-aligned, adjacent ones merged
    (a model's tensors are laid out back to back: a few hundred calls become a handful)."""
    spans = sorted(
        (t.data.ctypes.data, t.data.ctypes.data + t.data.nbytes) for t in tensors if t.data.nbytes
    )
    merged: list[tuple[int, int]] = []
    for start, end in spans:
        start -= start % PAGE
        end += -end % PAGE
        if merged and start <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(end, merged[-1][1]))
        else:
            merged.append((start, end))
    return merged


def _populate_read():
    """libc madvise bound with argument types, or None where MADV_POPULATE_READ cannot exist."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        madvise = ctypes.CDLL(None, use_errno=True).madvise
    except (OSError, AttributeError):
        return None
    madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    madvise.restype = ctypes.c_int
    return madvise


def prefetch(tensors: Iterable[QTensor]) -> None:
    """Map the tensors' pages into this process (blocking; run it on a thread)."""
    tensors = list(tensors)
    madvise = _populate_read()
    if madvise is not None:
        failed = [(s, e) for s, e in page_ranges(tensors) if madvise(s, e - s, MADV_POPULATE_READ)]
        if not failed:
            return
        log.debug("MADV_POPULATE_READ refused (errno %d); touching pages", ctypes.get_errno())
    for t in tensors:
        flat = t.data.reshape(-1).view(np.uint8)
        np.bitwise_or.reduce(flat[::PAGE])  # one read per page; the result is not needed


def start_prefetch(tensors: dict[str, QTensor]) -> threading.Thread:
    """A daemon thread prefetching what the first token reads; the thread holds the tensor views,
    so the memory map stays open while it runs."""
    thread = threading.Thread(
        target=prefetch,
        args=(first_token_tensors(tensors),),
        name="localchat-weight-prefetch",
        daemon=True,
    )
    thread.start()
    return thread
