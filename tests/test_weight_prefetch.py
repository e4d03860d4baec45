"""The load maps the weight pages the first token reads (engine/weight_prefetch.py) and leaves an
untied embedding matrix unread; measured on the file's own mapping in /proc/self/smaps."""

from __future__ import annotations

import sys

import numpy as np
import pytest
from gguf import GGMLQuantizationType as Q

from engine.gguf import open_gguf
from engine.loader import load_model
from engine.weight_prefetch import PAGE, first_token_tensors, page_ranges, prefetch
from tests.tiny_models import write_tiny_model

pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="reads /proc/self/smaps"
)


def mapped_rss_bytes(path) -> int:
    """Resident bytes of this process's mappings of `path` (summed over its smaps entries)."""
    target = str(path)
    total, inside = 0, False
    with open("/proc/self/smaps") as fh:
        for line in fh:
            fields = line.split()
            if fields and "-" in fields[0] and len(fields) >= 5 and ":" not in fields[0]:
                inside = len(fields) >= 6 and fields[5] == target
            elif inside and fields[0] == "Rss:":
                total += int(fields[1]) * 1024
    return total


@pytest.fixture
def untied_model(tmp_path):
    # SmolLM2's 49,152-token vocabulary x 64 F32 columns: a 12 MiB embedding, an equal untied
    # output projection, and small layers; the file is in the page cache right after writing.
    return write_tiny_model(tmp_path / "untied.gguf", "llama", tie_embeddings=False)


def test_load_maps_every_weight_but_the_untied_embedding(untied_model):
    g = open_gguf(untied_model)
    embedding = g.tensors["token_embd.weight"].nbytes
    needed = sum(t.nbytes for name, t in g.tensors.items() if name != "token_embd.weight")
    assert embedding > 8 * 2**20 and "output.weight" in g.tensors
    del g
    with load_model(untied_model, n_ctx=32, n_threads=1) as lm:
        assert lm.prefetch is not None
        lm.prefetch.join()
        resident = mapped_rss_bytes(untied_model)
        # every prefetched byte is resident (page rounding can only add)...
        assert resident >= needed
        # ...and the embedding is not: what is resident beyond the needed tensors is at most the
        # header pages plus the kernel's fault-around, far below the 12 MiB embedding
        assert resident - needed < embedding // 4


def test_the_weights_the_backend_repacks_are_left_to_the_repack(tmp_path):
    # Q8_0 weights: the JIT repacks them into records at first use, reading each pass of the
    # file itself, so the load must not map them (they would stay resident beside the records).
    path = write_tiny_model(
        tmp_path / "q8.gguf", "llama", Q.Q8_0, tie_embeddings=False, d_model=256, head_dim=64
    )
    with load_model(path, n_ctx=32, n_threads=1) as lm:
        tensors = lm.gguf.tensors
        copied = [
            t
            for name, t in tensors.items()
            if lm.backend.copies_weight(t) and name != "token_embd.weight"  # untied: not repacked
        ]
        if not copied:
            pytest.skip(f"the {lm.backend.name} backend repacks nothing")
        copied_bytes = sum(t.nbytes for t in copied)
        assert tensors["output.weight"] in copied and copied_bytes > 12 * 2**20
        assert lm.prefetch is not None
        lm.prefetch.join()
        prefetched = sum(
            t.nbytes
            for name, t in tensors.items()
            if t not in copied and name != "token_embd.weight"
        )
        # what is resident beyond the prefetched tensors (header and metadata pages the reader
        # touched) is far below what the repack will read
        assert mapped_rss_bytes(path) - prefetched < copied_bytes // 4


def test_a_tied_embedding_is_prefetched(tmp_path):
    path = write_tiny_model(tmp_path / "tied.gguf", "llama", tie_embeddings=True)
    g = open_gguf(path)
    assert "output.weight" not in g.tensors
    matrices = [t for t in g.tensors.values() if len(t.shape) == 2]
    assert first_token_tensors(g.tensors) == matrices  # vectors are float32 copies after a load
    prefetch(first_token_tensors(g.tensors))
    assert mapped_rss_bytes(path) >= sum(t.nbytes for t in matrices)


def test_page_ranges_merge_adjacent_tensors_and_cover_every_byte(untied_model):
    g = open_gguf(untied_model)
    tensors = list(g.tensors.values())
    ranges = page_ranges(tensors)
    assert all(start % PAGE == 0 and end % PAGE == 0 for start, end in ranges)
    assert all(
        a_end < b_start for (_, a_end), (b_start, _) in zip(ranges, ranges[1:], strict=False)
    )
    for t in tensors:
        lo, hi = t.data.ctypes.data, t.data.ctypes.data + t.data.nbytes
        assert any(start <= lo and hi <= end for start, end in ranges), t.name
    # the tensors are stored back to back, so they form one range
    assert len(ranges) == 1


def test_the_touch_fallback_maps_the_pages_too(untied_model, monkeypatch):
    import engine.weight_prefetch as wp

    monkeypatch.setattr(wp, "populate", lambda start, end: False)  # as on a system without it
    g = open_gguf(untied_model)
    out = g.tensors["output.weight"]
    before = mapped_rss_bytes(untied_model)
    prefetch([out])
    assert mapped_rss_bytes(untied_model) - before >= out.nbytes - 2 * PAGE
    assert np.isfinite(np.asarray(out.data, dtype=np.float32)).all()
