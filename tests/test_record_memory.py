"""Huge-page memory for repacked records: arrays carved from 2 MiB-aligned chunks never overlap,
start on a cache line, are backed by huge pages where the kernel gives them, and free their
chunk when the last of them dies."""

import gc
import sys
import weakref
from pathlib import Path

import numpy as np
import pytest

from engine.kernels import record_memory
from engine.kernels.record_memory import ALIGN, HUGE_PAGE, RecordMemory


def test_arrays_are_aligned_and_disjoint_and_keep_their_bytes():
    mem = RecordMemory(chunk_bytes=4 * HUGE_PAGE)
    sizes = [100, 64, 3 * HUGE_PAGE, 1, 5 * HUGE_PAGE + 7, 4096, 2432 * 37]
    arrays = [mem.take(n) for n in sizes]
    spans = []
    for i, (a, n) in enumerate(zip(arrays, sizes, strict=True)):
        assert a.dtype == np.uint8 and a.shape == (n,) and a.flags.c_contiguous
        assert a.ctypes.data % ALIGN == 0
        a[...] = i + 1
        spans.append((a.ctypes.data, a.ctypes.data + n))
    spans.sort()
    assert all(end <= nxt for (_, end), (nxt, _) in zip(spans, spans[1:], strict=False))
    for i, a in enumerate(arrays):  # nobody wrote into anybody else's bytes
        assert (a == i + 1).all()


def test_a_chunk_starts_on_a_huge_page_and_is_freed_with_its_last_array():
    mem = RecordMemory(chunk_bytes=2 * HUGE_PAGE)
    first = mem.take(1000)
    assert first.ctypes.data % HUGE_PAGE == 0  # the first array opens the chunk
    second = mem.take(1000)
    assert second.base is first.base  # carved from the same chunk
    owner = weakref.ref(first.base)
    del first, second
    gc.collect()
    assert owner() is None  # nothing else (the allocator included) kept the chunk
    third = mem.take(1000)
    assert third.ctypes.data % HUGE_PAGE == 0  # so a new one was opened


def test_a_big_array_gets_its_own_chunk_and_small_ones_keep_filling_the_old():
    mem = RecordMemory(chunk_bytes=2 * HUGE_PAGE)
    small = mem.take(HUGE_PAGE)
    big = mem.take(3 * HUGE_PAGE)  # leaves 1 MiB of its chunk; the old one has 2 MiB - 1 MiB
    after = mem.take(1000)
    assert big.base is not small.base
    assert after.base is small.base or after.base is big.base


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc smaps is Linux's")
def test_the_records_are_advised_onto_huge_pages(monkeypatch):
    enabled = Path("/sys/kernel/mm/transparent_hugepage/enabled").read_text()
    if "[never]" in enabled:
        pytest.skip("transparent huge pages are off on this machine")
    calls = []
    real = record_memory._advise_huge
    monkeypatch.setattr(record_memory, "_advise_huge", lambda a: (calls.append(a), real(a)))
    a = RecordMemory().take(8 << 20)
    a[...] = 1  # fault it in
    assert calls and calls[0].ctypes.data % HUGE_PAGE == 0 and calls[0].nbytes >= a.nbytes
    start, end = a.ctypes.data, a.ctypes.data + a.nbytes
    huge_kb = 0
    in_range = False
    for line in Path("/proc/self/smaps").read_text().splitlines():
        head = line.split()[0]
        if "-" in head and not head.endswith(":"):
            lo, hi = (int(x, 16) for x in head.split("-"))
            in_range = lo < end and hi > start
        elif in_range and head == "AnonHugePages:":
            huge_kb += int(line.split()[1])
    if huge_kb == 0:
        pytest.skip("the kernel gave no huge page (fragmented memory); advice is best effort")
    assert huge_kb >= 4 * 2048  # at least 4 of the array's 2 MiB pages are huge


def _resident_pages(start: int, end: int) -> int:
    """How many pages of [start, end) (page-aligned) are resident, by mincore(2)."""
    import ctypes
    import mmap

    libc = ctypes.CDLL(None, use_errno=True)
    libc.mincore.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_char_p)
    n = (end - start) // mmap.PAGESIZE
    vec = ctypes.create_string_buffer(n)
    assert libc.mincore(start, end - start, vec) == 0, ctypes.get_errno()
    return sum(b & 1 for b in vec.raw)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="mincore and THP are Linux's")
def test_the_tail_of_a_chunk_that_is_left_for_a_new_one_is_not_resident():
    import mmap

    mem = RecordMemory(chunk_bytes=4 * HUGE_PAGE)
    first = mem.take(3 * HUGE_PAGE + 4096)  # ends one page into the chunk's last huge page
    first[...] = 1
    page = mmap.PAGESIZE
    tail = (first.ctypes.data + first.nbytes + page - 1) // page * page
    chunk_end = first.ctypes.data + 4 * HUGE_PAGE  # `first` opened the chunk
    if _resident_pages(tail, chunk_end) == 0:
        pytest.skip("the kernel gave no huge page here, so the tail was never resident")
    second = mem.take(2 * HUGE_PAGE)  # does not fit: a new chunk, with more room, takes over
    assert second.base is not first.base
    assert _resident_pages(tail, chunk_end) == 0  # the old chunk's tail was given back
    assert (first == 1).all()  # and nothing handed out was touched
