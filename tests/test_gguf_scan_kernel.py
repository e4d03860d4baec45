"""The compiled string-array walk (engine/kernels/gguf_scan.py) against a Python walk of the
same bytes, on hand-built arrays and a real vocabulary; malformed input gives -1."""

from __future__ import annotations

import struct

import pytest

from engine.gguf import UnreadStrings, open_gguf
from engine.kernels import gguf_scan


def _strings(items: list[bytes]) -> bytes:
    return b"".join(struct.pack("<Q", len(s)) + s for s in items)


@pytest.fixture(scope="module")
def kernel():
    if gguf_scan.compiled_skip() is None:
        pytest.skip("LLVM is not usable here; the Python walk is used instead")
    return gguf_scan.skip_strings


def test_matches_hand_built_arrays(kernel):
    items = [b"", b"a", "é".encode(), b"x" * 300, b"\x00" * 9]
    buf = b"HEAD" + _strings(items) + b"TAIL"
    assert kernel(buf, 4, len(items), 1 << 24) == len(buf) - 4
    assert kernel(buf, 4, 0, 1 << 24) == 4
    assert kernel(buf, 4, 2, 1 << 24) == 4 + 8 + 8 + 1


def test_malformed_gives_minus_one(kernel):
    buf = _strings([b"abc", b"defg"])
    assert kernel(buf[:-1], 0, 2, 1 << 24) == -1  # the last string runs past the end
    assert kernel(buf[:12], 0, 2, 1 << 24) == -1  # the second length is cut off
    assert kernel(buf, 0, 3, 1 << 24) == -1  # claims a third string
    assert kernel(buf, 0, 2, 3) == -1  # "defg" is longer than the limit
    huge = struct.pack("<Q", 1 << 62) + b"x"
    assert kernel(huge, 0, 1, 1 << 24) == -1


def test_real_vocabulary_same_offsets_with_and_without_kernel(kernel, smollm2_path, monkeypatch):
    fast = open_gguf(smollm2_path, skip_string_arrays=True)
    monkeypatch.setattr(gguf_scan, "compiled_skip", lambda: None)
    slow = open_gguf(smollm2_path, skip_string_arrays=True)
    assert isinstance(fast.metadata["tokenizer.ggml.merges"], UnreadStrings)
    assert fast.data_offset == slow.data_offset and fast.tensor_offsets == slow.tensor_offsets
    assert len(fast.metadata["tokenizer.ggml.merges"]) == len(
        slow.metadata["tokenizer.ggml.merges"]
    )
