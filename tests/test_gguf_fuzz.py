"""Fuzzing the GGUF header: every mutated file either loads or raises an EngineError subclass,
quickly and without large allocations. Fixed seeds, so a failure reproduces.

Two bases: a tiny model (whole header a few KB, 400 cases) and SmolLM2's real header (1.8 MB:
metadata, 49k-token vocabulary, 272 tensor infos) written into a sparse file of the real size, so
an unmutated copy loads and tensor-table mutations reach the offset/size checks (100 cases).
"""

from __future__ import annotations

import struct
import sys
import time
import tracemalloc
from pathlib import Path

import numpy as np
import pytest
from gguf import GGMLQuantizationType

from engine.errors import EngineError
from engine.gguf import open_gguf


def reset_peak_rss() -> bool:
    """Restart the kernel's peak-RSS counter (VmHWM) for this process so the next reading is the
    peak of what ran since, not of everything earlier in the test session. Linux only (>= 4.0);
    False where it cannot be done, and then the memory check is skipped."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
        return True
    except OSError:
        return False


def proc_status_bytes(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024  # reported in kB
    raise KeyError(field)


INTERESTING_U64 = [
    0,
    1,
    2,
    31,
    32,
    255,
    2**16,
    2**31 - 1,
    2**31,
    2**32 - 1,
    2**32,
    2**40,
    2**62,
    2**63,
    2**64 - 1,
]
INTERESTING_U32 = [0, 1, 2, 3, 4, 5, 8, 9, 12, 13, 14, 15, 16, 30, 31, 99, 2**16, 2**31, 2**32 - 1]
INTERESTING_BYTES = [0x00, 0x01, 0x7F, 0x80, 0xFF, 0x0A, 0xC3]


def mutate(rng: np.random.Generator, data: bytes, region: tuple[int, int]) -> tuple[bytes, str]:
    """One random mutation at an offset inside `region`; returns the new bytes and a description."""
    lo, hi = region
    at = int(rng.integers(lo, hi))
    buf = bytearray(data)
    kind = int(rng.integers(0, 7))
    if kind == 0:
        bit = int(rng.integers(0, 8))
        buf[at] ^= 1 << bit
        return bytes(buf), f"flip bit {bit} at {at}"
    if kind == 1:
        value = (
            INTERESTING_BYTES[int(rng.integers(len(INTERESTING_BYTES)))]
            if rng.random() < 0.5
            else int(rng.integers(0, 256))
        )
        buf[at] = value
        return bytes(buf), f"byte {value:#x} at {at}"
    if kind == 2:
        value = INTERESTING_U64[int(rng.integers(len(INTERESTING_U64)))]
        buf[at : at + 8] = struct.pack("<Q", value)
        return bytes(buf[: len(data)]), f"u64 {value} at {at}"
    if kind == 3:
        value = INTERESTING_U32[int(rng.integers(len(INTERESTING_U32)))]
        buf[at : at + 4] = struct.pack("<I", value)
        return bytes(buf[: len(data)]), f"u32 {value} at {at}"
    if kind == 4:
        return bytes(buf[:at]), f"truncate at {at}"
    if kind == 5:
        n = int(rng.integers(1, 64))
        del buf[at : at + n]
        return bytes(buf), f"delete {n} bytes at {at}"
    n = int(rng.integers(1, 64))
    buf[at:at] = rng.integers(0, 256, size=n, dtype=np.uint8).tobytes()
    return bytes(buf), f"insert {n} random bytes at {at}"


def check_case(
    path: Path, description: str, max_seconds: float, max_alloc_bytes: int | None
) -> str:
    """Open the file; return "loaded" or the error class name; fail on anything else.

    With `max_alloc_bytes`, Python allocations are traced (peak per case); tracing costs ~20x on
    a 49k-token vocabulary, so the real-header fuzz checks the peak RSS of its own cases instead.
    """
    if max_alloc_bytes is not None:
        tracemalloc.start()
    started = time.perf_counter()
    try:
        g = open_gguf(path)
        outcome = "loaded"
        assert isinstance(g.metadata, dict) and all(
            t.data.nbytes <= g.file_size for t in g.tensors.values()
        )
    except EngineError as exc:
        outcome = type(exc).__name__
        assert str(path) in str(exc), description
    except Exception as exc:
        pytest.fail(f"{description}: untyped {type(exc).__name__}: {exc}")
    finally:
        elapsed = time.perf_counter() - started
        if max_alloc_bytes is not None:
            _, peak = tracemalloc.get_traced_memory()
            tracemalloc.stop()
    assert elapsed < max_seconds, f"{description}: took {elapsed:.2f} s"
    if max_alloc_bytes is not None:
        assert peak < max_alloc_bytes, f"{description}: allocated {peak / 1e6:.1f} MB"
    return outcome


def test_fuzz_tiny_model_header(tmp_path, tiny_model_factory):
    source = tiny_model_factory("qwen2", GGMLQuantizationType.Q8_0, tokenizer=None)
    whole = source.read_bytes()
    header_end = open_gguf(source).data_offset
    rng = np.random.default_rng(20261129)
    outcomes: dict[str, int] = {}
    path = tmp_path / "fuzz.gguf"
    for case in range(400):
        data, description = mutate(rng, whole, (0, header_end))
        path.write_bytes(data)
        outcome = check_case(
            path, f"case {case}: {description}", max_seconds=2.0, max_alloc_bytes=8 << 20
        )
        outcomes[outcome] = outcomes.get(outcome, 0) + 1
    # The fuzzer must reach both sides: files that still load and several kinds of refusal.
    assert outcomes.get("loaded", 0) >= 10, outcomes
    assert outcomes.get("ModelFileError", 0) >= 100, outcomes
    assert outcomes.get("UnsupportedModelError", 0) >= 1, outcomes


def test_fuzz_real_smollm2_header(tmp_path, smollm2_path):
    real = open_gguf(smollm2_path)
    with open(smollm2_path, "rb") as f:
        header = f.read(real.data_offset)
    tensor_table = header.find(struct.pack("<Q", len("token_embd.weight")) + b"token_embd.weight")
    assert 0 < tensor_table < real.data_offset
    regions = [
        (0, 4096),
        (tensor_table, real.data_offset),
        (0, real.data_offset),
    ]  # keys, tensors, anywhere
    rng = np.random.default_rng(7)
    measured = sys.platform.startswith("linux") and reset_peak_rss()
    rss_before = proc_status_bytes("VmRSS") if measured else 0
    outcomes: dict[str, int] = {}
    path = tmp_path / "fuzz-real.gguf"
    for case in range(100):
        data, description = mutate(rng, header, regions[case % 3])
        with open(path, "wb") as f:
            f.write(data)
            f.truncate(
                real.file_size
            )  # sparse: the real size, zero-filled tensor data, no disk cost
        outcome = check_case(
            path, f"case {case}: {description}", max_seconds=5.0, max_alloc_bytes=None
        )
        outcomes[outcome] = outcomes.get(outcome, 0) + 1
    # Loading the real vocabulary takes ~25 MB of Python objects; a bad length must not take more.
    if measured:  # the peak of these 100 opens over the RSS they started from
        peak_rss_growth = proc_status_bytes("VmHWM") - rss_before
        assert peak_rss_growth < 48 << 20, f"peak RSS grew by {peak_rss_growth / 1e6:.0f} MB"
    assert outcomes.get("loaded", 0) >= 5, outcomes
    assert outcomes.get("ModelFileError", 0) >= 20, outcomes
