"""This machine's memory read bandwidth, measured once in under half a second and remembered.

Decoding one token reads every weight once, so decode speed is bounded by how fast the cores
can stream memory (engine/run_prediction.py turns bytes per token into tok/s with it). The
probe streams a buffer far larger than any per-core cache with `n_threads` threads, each
reducing its own slice with numpy's SIMD max (a reduction does almost no arithmetic per byte,
and numpy's ufunc loops release the GIL, so the threads really run side by side). Each thread
times itself in its own CPU time (time.thread_time), so time spent waiting for a core that
other programs hold does not count, and the best pass is kept: other processes only ever make
a pass slower, and the prediction wants what the hardware gives, not one unlucky moment.

The result is cached as JSON in the app's data directory together with what it depends on:
the CPU's model name (/proc/cpuinfo), the CPU the kernels are compiled for, the thread count
and the kernel path. Any of those changing (a new machine, LOCALCHAT_CPU, another --threads,
a disk image moved to another host) is a cache miss and the probe runs again.
"""

from __future__ import annotations

import contextlib
import json
import os
import platform
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

BANDWIDTH_CACHE_ENV = "LOCALCHAT_BANDWIDTH_CACHE"
CACHE_FILE = "bandwidth_probe.json"
# 128 MiB: larger than the L2 of any desktop core and than the L3 a core can fill at speed,
# so the passes stream from DRAM as decode does (a 1.5B Q4 model is ~1 GB). Filling it costs
# ~40 ms of the budget (first touch of every page).
PROBE_BYTES = 128 * 2**20
PROBE_SECONDS = 0.25  # no pass starts after this (whole probe: ~0.3 s quiet, 0.6 s at load 7)
PROBE_VERSION = 2  # bump when the measurement changes: old cached numbers are not comparable


@dataclass(frozen=True)
class MachineKey:
    """What a measured bandwidth is valid for."""

    cpu_model: str  # /proc/cpuinfo "model name" (or platform.processor())
    target_cpu: str  # LLVM's name for the CPU the kernels target, e.g. "rocketlake"
    threads: int
    kernel_path: str  # "vnni", "avx2", "generic" or "numpy"
    version: int = PROBE_VERSION


@dataclass(frozen=True)
class Bandwidth:
    bytes_per_s: float
    key: MachineKey
    measured_at: float  # time.time() of the measurement
    seconds: float  # what the probe took
    cached: bool = False  # read from the cache file rather than measured now

    @property
    def gb_per_s(self) -> float:
        return self.bytes_per_s / 1e9


def cpu_model_name() -> str:
    with contextlib.suppress(OSError), open("/proc/cpuinfo", encoding="utf-8") as fh:
        for line in fh:
            if line.startswith("model name"):
                return line.partition(":")[2].strip()
    return platform.processor() or platform.machine() or "unknown"


def default_cache_path() -> Path:
    """LOCALCHAT_BANDWIDTH_CACHE, else bandwidth_probe.json in the app's data directory."""
    explicit = os.environ.get(BANDWIDTH_CACHE_ENV, "").strip()
    if explicit:
        return Path(explicit).expanduser()
    import platformdirs

    return Path(platformdirs.user_data_dir("LocalChat", appauthor=False)) / CACHE_FILE


def measure_read_bandwidth(
    n_threads: int, *, nbytes: int = PROBE_BYTES, seconds: float = PROBE_SECONDS
) -> tuple[float, float]:
    """(best bytes/s over the passes, seconds the whole probe took)."""
    start = time.perf_counter()
    n_threads = max(1, int(n_threads))
    buf = np.ones(nbytes, np.uint8)  # written once, so every page is really backed
    parts = np.array_split(buf, n_threads)
    best = 0.0
    passes = 0
    while passes < 2 or time.perf_counter() - start < seconds:
        barrier = threading.Barrier(n_threads + 1)
        cpu_seconds = [0.0] * n_threads

        def stream(
            i: int, part: np.ndarray, start_line: threading.Barrier, out: list[float]
        ) -> None:
            start_line.wait()
            t = time.thread_time()
            part.max()
            out[i] = time.thread_time() - t

        workers = [
            threading.Thread(target=stream, args=(i, p, barrier, cpu_seconds), daemon=True)
            for i, p in enumerate(parts)
        ]
        for w in workers:
            w.start()
        barrier.wait()
        for w in workers:
            w.join()
        if passes > 0:  # the first pass also pulls the buffer into the TLB / page tables
            # Each thread's own CPU time, not the wall clock: on a busy machine a thread waits
            # for a core between time slices, which says nothing about the memory; the sum of
            # the threads' rates is what they stream side by side.
            rate = sum(p.nbytes / max(c, 1e-9) for p, c in zip(parts, cpu_seconds, strict=True))
            best = max(best, rate)
        passes += 1
    return best, time.perf_counter() - start


def machine_key(threads: int, kernel_path: str, target_cpu: str) -> MachineKey:
    return MachineKey(cpu_model_name(), target_cpu, int(threads), kernel_path)


def read_bandwidth(
    key: MachineKey,
    cache_path: Path | None = None,
    *,
    measure=None,
    remeasure: bool = False,
) -> Bandwidth:
    """The cached bandwidth for `key`, or a fresh measurement (then written to the cache). A
    cache file that is unreadable, damaged or for another machine is measured over; a cache
    that cannot be written costs only the next probe. `remeasure` probes again and keeps the
    better of the two: a probe taken while other programs were busy reads low, and the
    hardware does not get slower (bench/bench_prediction.py remeasures before predicting)."""
    path = default_cache_path() if cache_path is None else Path(cache_path)
    cached = _read_cache(path, key)
    if cached is not None and not remeasure:
        return cached
    bytes_per_s, seconds = (measure or measure_read_bandwidth)(key.threads)
    result = Bandwidth(bytes_per_s, key, time.time(), seconds)
    if cached is not None and cached.bytes_per_s >= result.bytes_per_s:
        return cached
    _write_cache(path, result)
    return result


def _read_cache(path: Path, key: MachineKey) -> Bandwidth | None:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        if data.get("key") != asdict(key):
            return None
        value = float(data["bytes_per_s"])
        if not value > 0:
            return None
        return Bandwidth(
            value, key, float(data["measured_at"]), float(data["seconds"]), cached=True
        )
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None


def _write_cache(path: Path, result: Bandwidth) -> None:
    record = {
        "key": asdict(result.key),
        "bytes_per_s": result.bytes_per_s,
        "measured_at": result.measured_at,
        "seconds": result.seconds,
    }
    tmp = path.with_name(path.name + f".{os.getpid()}.tmp")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp.write_text(json.dumps(record, indent=1), encoding="utf-8")
        os.replace(tmp, path)  # readers see the old file or the new one, never half of one
    except OSError:
        with contextlib.suppress(OSError):
            tmp.unlink()
