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

Only the matrices the first token reads from the file are prefetched:
- with an untied output projection the embedding matrix is read one row per prompt token, so its
  pages are left to fault in as used (on a 7B Q4_K_M file, 300 MB that would otherwise be
  resident for nothing);
- a weight the backend copies into its own layout at first use (the JIT's repacked records) is
  read once, by that copy, which maps each pass of the file itself and releases it when done.
  Prefetching it as well kept the file's pages resident beside the copy until the copy caught up,
  and re-mapped pages the copy had already released whenever the prefetch ran behind it (the
  1.5B's peak RSS: 1303 MB, with 78 MB of such pages left mapped to the end).

Where MADV_POPULATE_READ is missing (older kernels, other systems), one byte per page is read
with numpy (its loops release the GIL too), which costs the same faults but off the critical path.
Nothing here changes what is computed: a forward pass that starts before the prefetch ends just
takes the remaining faults itself.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable

import numpy as np

from engine.file_pages import PAGE, populate
from engine.qtensor import QTensor

log = logging.getLogger(__name__)

EMBEDDING = "token_embd.weight"
UNTIED_OUTPUT = "output.weight"


def first_token_tensors(
    tensors: dict[str, QTensor], copied: Callable[[QTensor], bool] = lambda t: False
) -> list[QTensor]:
    """Every matrix but an embedding that the output projection does not share, and but those
    `copied` says the backend reads once into its own layout (Backend.copies_weight). Vectors
    (norms, biases, RoPE factors) are left out too: the model converts them to float32 while it
    loads and never reads the file's copy again. Mapping their pages now would also map whole
    2 MiB page-cache folios around them (the kernel maps a large folio with one huge-page entry):
    ~250 MB of a 7B's repacked matrices, resident for nothing when the records come from the
    record cache."""
    untied = UNTIED_OUTPUT in tensors
    return [
        t
        for name, t in tensors.items()
        if len(t.shape) > 1 and not (untied and name == EMBEDDING) and not copied(t)
    ]


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


def prefetch(tensors: Iterable[QTensor]) -> None:
    """Map the tensors' pages into this process (blocking; run it on a thread)."""
    tensors = list(tensors)
    ranges = page_ranges(tensors)
    if all(populate(start, end) for start, end in ranges):
        return
    log.debug("MADV_POPULATE_READ refused or missing; touching pages")
    for t in tensors:
        flat = t.data.reshape(-1).view(np.uint8)
        np.bitwise_or.reduce(flat[::PAGE])  # one read per page; the result is not needed


def start_prefetch(
    tensors: dict[str, QTensor], copied: Callable[[QTensor], bool] = lambda t: False
) -> threading.Thread:
    """A daemon thread prefetching what the first token reads from the file (`copied`: as in
    first_token_tensors); the thread holds the tensor views, so the memory map stays open while
    it runs."""
    thread = threading.Thread(
        target=prefetch,
        args=(first_token_tensors(tensors, copied),),
        name="localchat-weight-prefetch",
        daemon=True,
    )
    thread.start()
    return thread
