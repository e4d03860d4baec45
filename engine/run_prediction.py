"""Will it run here? Memory and speed of a GGUF model on this machine, predicted from the file's
header and tensor table before any weight is loaded.

Memory = weights as the process will hold them + the KV cache at the chosen context and cache
type + the engine's own overhead:
  * weights: every tensor's bytes, except an untied token embedding (a lookup table: only the
    rows of tokens actually seen are ever paged in, and those pages are file-backed, so the
    kernel can drop them under pressure). Tensors the JIT repacks into 16-row records
    (engine/kernels/repack.py) count at their record size (Q4_K: 2368 bytes per 16 rows of a
    super-block instead of 16 x 144), rows rounded up to 16.
  * KV cache: KVCache.bytes_needed, the exact allocation the loader makes.
  * overhead: the interpreter, numpy, llvmlite and the kernel library, the tokenizer's Python
    objects (grows with the vocabulary) and the activation buffers. OVERHEAD_* below were
    measured, not guessed: peak RSS of `python -m engine bench` minus the two terms above,
    on three models with 49k, 152k and 262k vocabularies (bench/bench_prediction.py prints
    the comparison; bench/RESULTS.md has the numbers).

Decode speed: a decoded token reads every weight once (the output projection included; the
untied token embedding one row), plus the KV cache written so far. Time per token =
sum over tensor types of bytes / (read bandwidth x efficiency of that type's kernel), with the
read bandwidth measured on this machine (engine/bandwidth_probe.py, cached) and the
efficiencies below calibrated once per kernel path. The codebook and ternary types (IQ*, TQ*,
MXFP4) have kernels bound by their unpacking arithmetic rather than by memory, which shows up
as efficiencies of a few percent; on this model that is still "bytes / effective rate".

Prefill speed: a prompt token costs 2 x (matrix weights, the output projection excepted: only
the last token's logits are computed) + attention over the prompt so far; each type's mat-mul
kernel does PREFILL_MACS_PER_THREAD multiply-adds per second per thread.

Calibration (the constants' source): `python bench/bench_prediction.py --calibrate` on a 2-core
Xeon (Rocket Lake, AVX512-VNNI), the models the tests install: SmolLM2-135M Q4_1 and its
quant variants (one tensor group in each IQ/TQ/MXFP4 type), gemma-3-270m Q4_K_M (Q8_0 / Q5_0
/ Q4_K / Q6_K) and qwen2.5-coder-1.5B Q4_K_M (Q4_K / Q6_K). Types no installed model holds take
the constant of the closest measured kernel family and are named in `uncalibrated`.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from pathlib import Path

from engine.types import DEFAULT_KV_CACHE_TYPE

# --- calibrated constants ------------------------------------------------------------------

# Fraction of the probe's read bandwidth (bandwidth_probe: numpy max over 128 MiB, all threads,
# 50.9 GB/s here when quiet) that one decode step reaches per tensor type, on the JIT's
# AVX512-VNNI path. Fitted from one quiet run of all 15 test models (bench/RESULTS.md, "Will it
# run here?"; an earlier fit was spoiled by benchmarks running side by side).
VNNI_DECODE_EFFICIENCY: dict[str, float] = {
    # repacked 16-row records (repack.py), streamed at one rate whatever the type: the mean
    # over two quiet runs of SmolLM2 Q4_1 (0.45, 0.54), gemma-3 Q4_K_M (0.37, 0.43) and
    # qwen2.5 1.5B Q4_K_M (0.38, 0.39)
    "Q4_0": 0.42,
    "Q4_1": 0.42,
    "Q5_0": 0.42,
    "Q5_1": 0.42,
    "Q8_0": 0.42,
    "Q4_K": 0.42,
    "Q6_K": 0.42,
    "F32": 0.42,  # norms and biases, part of every calibration model (a fraction of a percent)
    # Types that hold most of their variant's weights (its time is mostly theirs), measured:
    "IQ4_NL": 0.37,
    "MXFP4": 0.37,
    # Types whose group (5-15 MB) took under 10% of the variant's time: indistinguishable from
    # the repacked rate at that share (a rate of 0.05 would have made the variant ~40% slower
    # than measured), so they take it. (IQ1_M and IQ2_S first read 2x slower: that run was
    # their first use, before their lazily compiled kernels were in the disk cache.)
    "IQ1_M": 0.42,
    "IQ2_S": 0.42,
    "IQ1_S": 0.42,
    "IQ2_XXS": 0.42,
    "IQ2_XS": 0.42,
    "IQ3_XXS": 0.42,
    "IQ3_S": 0.42,
    "IQ4_XS": 0.42,
    "TQ1_0": 0.42,
    "TQ2_0": 0.42,
}
# Multiply-adds per second per thread of each type's mat-mul kernel at prefill (VNNI path),
# fitted the same way from `engine bench -p 128` (repacked: 84 / 74 / 123 G, mean 94 G; each
# other type from its variant, where it takes 40-70% of the prefill time; IQ1_M and IQ2_S
# from a second run with their kernels in the disk cache).
VNNI_PREFILL_MACS_PER_THREAD: dict[str, float] = {
    "Q4_0": 94e9,
    "Q4_1": 94e9,
    "Q5_0": 94e9,
    "Q5_1": 94e9,
    "Q8_0": 94e9,
    "Q4_K": 94e9,
    "Q6_K": 94e9,
    "F32": 94e9,
    "IQ1_S": 31.5e9,
    "IQ1_M": 30.9e9,
    "IQ2_XXS": 32.5e9,
    "IQ2_XS": 30.8e9,
    "IQ2_S": 29.9e9,
    "IQ3_XXS": 31.6e9,
    "IQ3_S": 32.4e9,
    "IQ4_XS": 34.2e9,
    "IQ4_NL": 33.0e9,
    "MXFP4": 33.1e9,
    "TQ1_0": 41.4e9,
    "TQ2_0": 38.0e9,
}
# Types without a measurement take the constant of the nearest measured kernel family.
NEAREST_MEASURED: dict[str, str] = {
    "Q2_K": "IQ4_NL",  # not repacked: row-major K-quant kernels, like the codebook types
    "Q3_K": "IQ4_NL",
    "Q5_K": "IQ4_NL",
    "F16": "Q8_0",
    "BF16": "Q8_0",
}
# The other kernel paths relative to VNNI, measured on the same machine (LOCALCHAT_CPU=haswell
# for AVX2, LOCALCHAT_CPU=x86-64 for the generic path, LOCALCHAT_KERNELS=numpy) on SmolLM2 Q4_1
# and gemma-3-270m, the mean of the two ratios (they differ: avx2 decode 0.66 / 0.90, prefill
# 0.39 / 0.56; generic decode 0.26 / 0.25, prefill 0.061 / 0.069; numpy decode 0.014 / 0.0054,
# prefill 0.072 / 0.010, so numpy predictions are rough). Checked again on a quiet machine at
# 22:52 UTC with bench_prediction (SmolLM2, gemma-3, qwen2.5 1.5B): generic decode +4 / -22 /
# -5%; AVX2 +2 / -9 / +3% at the VNNI key's bandwidth (its own probe read 31 GB/s at load 1.5
# and the predictions 37-45% low). The numpy backend runs one thread
# and its probe measures one thread's bandwidth (17 vs 35 GB/s here); its factors are scaled
# so that the same formula applies: decode x 35/17, prefill x 2 threads / 1.
PATH_DECODE_FACTOR: dict[str, float] = {
    "vnni": 1.0,
    "avx2": 0.78,
    "generic": 0.25,
    "numpy": 0.020,
}
PATH_PREFILL_FACTOR: dict[str, float] = {
    "vnni": 1.0,
    "avx2": 0.47,
    "generic": 0.065,
    "numpy": 0.082,
}

# Engine overhead in bytes: a fixed part plus a part per vocabulary entry (the tokenizer's
# Python strings and dicts), fitted to peak RSS minus weights and KV (see the docstring).
# Least squares over (49152, 144.2 MiB), (262144, 278.7 MiB), (151936, 230.7 MiB): SmolLM2,
# gemma-3-270m, qwen2.5 1.5B, `engine bench -p 128 -n 32` (residuals +7, +7, -14 MiB).
OVERHEAD_BASE_BYTES = 121 * 2**20
# Issue 32 stored the vocabulary flat (one blob + offsets, no per-token objects): its steady cost
# measured on gemma-3's 262k entries fell from 604 to 388 B per entry (metadata + tokenizer,
# fresh process, heap trimmed; bench/RESULTS.md "The vocabulary stored flat"), so the fitted
# 660 B per entry drops by those 216 B; the base is unchanged.
OVERHEAD_PER_VOCAB_BYTES = 444
# Prompt length the prefill prediction is for (llama-bench's pp512).
PREFILL_TOKENS = 512
# Context position a decode prediction is for: the KV read per token grows with it; a chat's
# first reply is the common case.
DECODE_POSITION = 256
MIB = 2**20


@dataclass(frozen=True)
class RunPrediction:
    path: str
    n_ctx: int
    cache_type: str
    threads: int
    kernel_path: str  # "vnni", "avx2", "generic" or "numpy"
    weights_bytes: int
    kv_bytes: int
    overhead_bytes: int
    available_bytes: int | None  # MemAvailable now; None where the system does not say
    decode_tok_s: float
    prefill_tok_s: float
    bandwidth_bytes_per_s: float
    uncalibrated: tuple[str, ...] = field(default=())  # types that borrowed a constant

    @property
    def memory_bytes(self) -> int:
        return self.weights_bytes + self.kv_bytes + self.overhead_bytes

    @property
    def memory_mb(self) -> float:
        return self.memory_bytes / MIB

    @property
    def fits(self) -> bool | None:
        if self.available_bytes is None:
            return None
        return self.memory_bytes <= self.available_bytes

    def to_json(self) -> dict:
        return {
            "memory_mb": round(self.memory_mb, 1),
            "prefill_tok_s": round(self.prefill_tok_s, 1),
            "decode_tok_s": round(self.decode_tok_s, 1),
            "threads": self.threads,
            "weights_mb": round(self.weights_bytes / MIB, 1),
            "kv_cache_mb": round(self.kv_bytes / MIB, 1),
            "overhead_mb": round(self.overhead_bytes / MIB, 1),
            "available_mb": None
            if self.available_bytes is None
            else round(self.available_bytes / MIB, 1),
            "fits": self.fits,
            "n_ctx": self.n_ctx,
            "cache_type": self.cache_type,
            "kernel_path": self.kernel_path,
            "read_bandwidth_gb_s": round(self.bandwidth_bytes_per_s / 1e9, 2),
            "uncalibrated_types": list(self.uncalibrated),
        }

    def summary(self) -> str:
        """'needs ~1.3 GB of 9.8 GB free · ~30 tok/s' (the library's line)."""
        need = f"needs ~{_gb(self.memory_bytes)}"
        if self.available_bytes is not None:
            need += f" of {_gb(self.available_bytes)} free"
        return f"{need} · ~{_rate(self.decode_tok_s)} tok/s"


def _gb(n: int) -> str:
    return f"{n / 1e9:.1f} GB" if n >= 1e8 else f"{n / 1e6:.0f} MB"


def _rate(tok_s: float) -> str:
    return f"{tok_s:.0f}" if tok_s >= 10 else f"{tok_s:.1f}"


def prediction_error(measured: float, predicted: float) -> str:
    """'+7%': how far the prediction was off, as a share of the measured value (positive:
    the prediction was too high)."""
    if measured <= 0:
        return "n/a"
    return f"{100 * (predicted - measured) / measured:+.0f}%"


# --- memory -------------------------------------------------------------------------------


def available_memory_bytes() -> int | None:
    """/proc/meminfo MemAvailable (what can be allocated without swapping), else what sysconf
    calls available pages, else None."""
    try:
        with open("/proc/meminfo", encoding="ascii") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


def resident_weight_bytes(tensors: dict) -> int:
    """Bytes the weights take in the process (module docstring): record size for repacked
    tensors, file size for the rest, an untied token embedding left out."""
    from engine.kernels import repack

    tied = "output.weight" not in tensors
    total = 0
    for name, t in tensors.items():
        if name == "token_embd.weight" and not tied:
            continue
        total += _record_bytes(t, repack) if repack.packable(t) else t.nbytes
    return total


def _record_bytes(t, repack) -> int:
    groups, blocks, record = repack.record_shape(t)
    return groups * blocks * record


def overhead_bytes(n_vocab: int) -> int:
    return OVERHEAD_BASE_BYTES + OVERHEAD_PER_VOCAB_BYTES * int(n_vocab)


# --- speed --------------------------------------------------------------------------------


def _constant(table: dict[str, float], qtype: str, borrowed: set[str]) -> float:
    if qtype in table:
        return table[qtype]
    borrowed.add(qtype)
    return table[NEAREST_MEASURED.get(qtype, "Q8_0")]


def decode_bytes_by_type(tensors: dict) -> dict[str, int]:
    """Bytes one decoded token reads from each tensor type: all weights, the untied token
    embedding excepted (it reads one row)."""
    tied = "output.weight" not in tensors
    read: dict[str, int] = {}
    for name, t in tensors.items():
        if name == "token_embd.weight" and not tied:
            continue
        read[t.qtype.name] = read.get(t.qtype.name, 0) + t.nbytes
    return read


def prefill_macs_by_type(tensors: dict) -> dict[str, int]:
    """Multiply-adds per prompt token in each type's mat-muls: every 2-D weight except the
    token embedding (a lookup) and the output projection (run for the last token only)."""
    macs: dict[str, int] = {}
    for name, t in tensors.items():
        if name in ("token_embd.weight", "output.weight") or len(t.shape) < 2:
            continue
        macs[t.qtype.name] = macs.get(t.qtype.name, 0) + math.prod(t.shape)
    return macs


def decode_tok_s(
    tensors: dict,
    kv_bytes_per_position: int,
    bandwidth: float,
    kernel_path: str,
    borrowed: set[str],
    position: int = DECODE_POSITION,
) -> float:
    factor = PATH_DECODE_FACTOR.get(kernel_path, 1.0)
    seconds = 0.0
    for qtype, nbytes in decode_bytes_by_type(tensors).items():
        eff = _constant(VNNI_DECODE_EFFICIENCY, qtype, borrowed) * factor
        seconds += nbytes / (bandwidth * eff)
    # the KV cache read so far, streamed like the repacked weights
    kv_eff = VNNI_DECODE_EFFICIENCY["Q8_0"] * factor
    seconds += kv_bytes_per_position * position / (bandwidth * kv_eff)
    return 1.0 / seconds if seconds > 0 else 0.0


def prefill_tok_s(
    tensors: dict,
    config,
    threads: int,
    kernel_path: str,
    borrowed: set[str],
    n_prompt: int = PREFILL_TOKENS,
) -> float:
    factor = PATH_PREFILL_FACTOR.get(kernel_path, 1.0)
    seconds = 0.0
    for qtype, macs in prefill_macs_by_type(tensors).items():
        rate = _constant(VNNI_PREFILL_MACS_PER_THREAD, qtype, borrowed) * factor * threads
        seconds += macs / rate
    # attention: QK^T and AV over n_prompt / 2 earlier positions on average, per head
    attn = 2 * config.n_layers * config.n_head * config.head_dim * (n_prompt / 2)
    seconds += attn / (VNNI_PREFILL_MACS_PER_THREAD["Q8_0"] * factor * threads)
    return 1.0 / seconds if seconds > 0 else 0.0


# --- putting it together ------------------------------------------------------------------


@dataclass(frozen=True)
class Machine:
    """What the prediction needs to know about this machine (tests pass their own)."""

    threads: int
    kernel_path: str
    bandwidth_bytes_per_s: float
    available_bytes: int | None


def planned_path(n_threads: int | None = None) -> tuple[int, str, str]:
    """(threads, kernel path, target CPU name) a load would use here, compiling nothing."""
    from engine.errors import ConfigValidationError
    from engine.kernels.backend import KERNELS_ENV
    from engine.kernels.threads import MAX_THREADS, physical_cores

    if n_threads is not None and (
        isinstance(n_threads, bool)
        or not isinstance(n_threads, int)
        or not 1 <= n_threads <= MAX_THREADS
    ):  # the load would refuse it the same way (ThreadPool)
        raise ConfigValidationError("n_threads", n_threads, f"an integer from 1 to {MAX_THREADS}")
    threads = int(n_threads or physical_cores())
    if os.environ.get(KERNELS_ENV, "").strip().lower() == "numpy":
        return 1, "numpy", ""  # the reference backend runs its ops on one thread
    from engine.kernels.compiler import CpuSelectionError

    try:
        from engine.kernels.compiler import target_cpu
        from engine.kernels.jit_backend import select_isa

        cpu = target_cpu()
        return threads, select_isa(cpu), cpu.name
    except CpuSelectionError:
        raise  # a bad LOCALCHAT_CPU stops a load too (load_summary.planned_kernel_path)
    except Exception:  # the load would fall back to numpy the same way
        return 1, "numpy", ""


def this_machine(
    n_threads: int | None = None, cache_path: Path | None = None, *, remeasure: bool = False
) -> Machine:
    """Threads, kernel path, read bandwidth (probed once per machine, then cached; remeasure:
    probe again and keep the better, see bandwidth_probe.read_bandwidth) and free memory now."""
    from engine.bandwidth_probe import machine_key, read_bandwidth

    threads, path, cpu = planned_path(n_threads)
    bandwidth = read_bandwidth(machine_key(threads, path, cpu), cache_path, remeasure=remeasure)
    return Machine(threads, path, bandwidth.bytes_per_s, available_memory_bytes())


def predict_gguf(
    gguf_file,
    config,
    machine: Machine,
    *,
    n_ctx: int,
    cache_type: str,
    n_prompt: int = PREFILL_TOKENS,
    position: int = DECODE_POSITION,
):
    from engine.kv_cache import KVCache

    borrowed: set[str] = set()
    tensors = gguf_file.tensors
    kv = KVCache.bytes_needed(config, n_ctx, cache_type)
    kv_per_position = KVCache.bytes_needed(config, 1, cache_type)
    decode = decode_tok_s(
        tensors,
        kv_per_position,
        machine.bandwidth_bytes_per_s,
        machine.kernel_path,
        borrowed,
        position,
    )
    prefill = prefill_tok_s(
        tensors, config, machine.threads, machine.kernel_path, borrowed, n_prompt
    )
    return RunPrediction(
        path=str(gguf_file.path),
        n_ctx=int(n_ctx),
        cache_type=str(cache_type),
        threads=machine.threads,
        kernel_path=machine.kernel_path,
        weights_bytes=resident_weight_bytes(tensors),
        kv_bytes=kv,
        overhead_bytes=overhead_bytes(config.n_vocab),
        available_bytes=machine.available_bytes,
        decode_tok_s=decode,
        prefill_tok_s=prefill,
        bandwidth_bytes_per_s=machine.bandwidth_bytes_per_s,
        uncalibrated=tuple(sorted(borrowed)),
    )


def predict_file(
    path: str | os.PathLike[str],
    *,
    n_ctx: int | None = None,
    cache_type: str = DEFAULT_KV_CACHE_TYPE.value,
    machine: Machine | None = None,
    n_prompt: int = PREFILL_TOKENS,
    position: int = DECODE_POSITION,
) -> RunPrediction:
    """The prediction for one GGUF file at n_ctx (default: what a load would choose, the
    model's context capped at the loader's default) and cache type; prefill for an n_prompt
    token prompt, decode at context position `position`. Raises the loader's own
    errors (UnsupportedModelError, ModelFileError, ConfigValidationError for a bad n_ctx or
    cache type) for a file that cannot be run."""
    from engine.config import ModelConfig
    from engine.errors import ConfigValidationError
    from engine.gguf import open_gguf
    from engine.kv_cache import check_cache_type
    from engine.loader import DEFAULT_MAX_CONTEXT

    gguf_file = open_gguf(Path(path), skip_string_arrays=True)
    config = ModelConfig.from_gguf(gguf_file)
    if n_ctx is None:
        n_ctx = min(config.context_length, DEFAULT_MAX_CONTEXT)
    if isinstance(n_ctx, bool) or not isinstance(n_ctx, int) or n_ctx < 1:
        raise ConfigValidationError("n_ctx", n_ctx, "a positive integer")
    n_ctx = min(n_ctx, config.context_length)  # the loader clamps the same way
    check_cache_type(cache_type, config.head_dim)
    return predict_gguf(
        gguf_file,
        config,
        machine or this_machine(),
        n_ctx=n_ctx,
        cache_type=cache_type,
        n_prompt=n_prompt,
        position=position,
    )
