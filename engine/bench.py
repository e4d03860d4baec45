"""Prefill / decode throughput in the shape of llama-bench (pp512 / tg128), plus memory and JIT
start-up costs.

  * prefill: `forward` over n_prompt random token ids into an empty cache (logits of the last
    token only, as llama-bench does), tok/s = n_prompt / seconds;
  * decode: n_gen single-token `forward` calls into an empty cache, feeding a fixed token like
    llama-bench's tg test (no sampling cost), tok/s = n_gen / seconds;
  * each repeated `repetitions` times after one warm-up; medians reported;
  * peak RSS (ru_maxrss), RSS right after decoding, KV-cache bytes, model file bytes;
  * cold compile: every kernel module compiled into an empty cache directory; warm start: a
    new kernel library loaded from the populated cache (what a second launch pays).
"""

from __future__ import annotations

import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from engine.load_summary import kernel_path


def _rss_mb() -> float:
    with open("/proc/self/statm") as fh:
        pages = int(fh.read().split()[1])
    return pages * os.sysconf("SC_PAGE_SIZE") / 2**20


def _peak_rss_mb() -> float:
    # ru_maxrss (KiB on Linux) comes from the kernel's per-thread batched RSS counters and can
    # trail /proc/self/statm by a few hundred KiB, so a peak read right after a sample could be
    # below that sample; the peak is at least the current RSS.
    return max(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, _rss_mb())


def cold_compile_seconds() -> float:
    """Seconds to compile every kernel module into an empty cache directory (this process)."""
    from engine.kernels.compiler import KernelLibrary
    from engine.kernels.jit_backend import kernel_modules, select_isa

    with tempfile.TemporaryDirectory() as tmp:
        t = time.perf_counter()
        lib = KernelLibrary(cache_dir=Path(tmp))
        lib.add_modules(kernel_modules(select_isa(lib.cpu)))
        return time.perf_counter() - t


def jit_start_times(cold: bool = True) -> dict:
    """Seconds to compile all kernels from scratch (cold; in a child process so LLVM's memory
    does not count in this process's peak RSS) and to load them from the cache (warm)."""
    from engine.kernels.compiler import KernelLibrary
    from engine.kernels.jit_backend import kernel_modules, select_isa

    result = {}
    if cold:
        code = "from engine.bench import cold_compile_seconds; print(cold_compile_seconds())"
        root = Path(__file__).resolve().parent.parent
        out = subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=root
        )
        result["cold_compile_s"] = float(out.stdout.strip().splitlines()[-1])
    probe = KernelLibrary()
    probe.add_modules(kernel_modules(select_isa(probe.cpu)))  # populate the default cache
    t = time.perf_counter()  # what a later launch pays: generate the IR text (the cache key), load
    lib = KernelLibrary()
    lib.add_modules(kernel_modules(select_isa(lib.cpu)))
    result["warm_start_s"] = time.perf_counter() - t
    return result


def time_prefill(model, prompt) -> float:
    """Seconds for one prefill of `prompt` into a fresh cache (last-token logits only)."""
    cache = model.new_cache(len(prompt) + 1)
    t0 = time.perf_counter()
    model.forward(prompt, cache)
    return time.perf_counter() - t0


def time_decode(model, token: int, n_gen: int):
    """(seconds, kv_bytes) for n_gen single-token forwards from an empty cache."""
    cache = model.new_cache(n_gen + 1)
    t0 = time.perf_counter()
    for _ in range(n_gen):
        model.forward([token], cache)
    return time.perf_counter() - t0, cache.nbytes


def run_bench(
    model_path,
    *,
    n_prompt: int = 512,
    n_gen: int = 128,
    n_threads: int | None = None,
    repetitions: int = 3,
    cold_compile: bool = True,
    progress=None,
    cache_type: str = "f16",
) -> dict:
    from engine.loader import load_model

    report = progress or (lambda stage, fraction: None)
    result: dict = {"model": str(model_path), "n_prompt": n_prompt, "n_gen": n_gen}
    result.update(jit_start_times(cold_compile))
    t = time.perf_counter()
    lm = load_model(
        model_path, n_ctx=max(n_prompt, n_gen) + 16, n_threads=n_threads, cache_type=cache_type
    )
    result["cache_type"] = str(lm.model.cache_type)
    result["load_s"] = time.perf_counter() - t
    backend = lm.backend
    result["backend"] = backend.name
    result["isa"] = getattr(backend, "isa", "numpy")
    result["threads"] = getattr(backend, "n_threads", 1)
    result["kernels"] = kernel_path(backend)  # says why when it is the (slow) numpy fallback
    library = getattr(backend, "library", None)
    result["cpu"] = library.cpu.label() if library is not None else None
    result["file_bytes"] = Path(model_path).stat().st_size
    model = lm.model
    rng = np.random.default_rng(1234)
    vocab = lm.config.n_vocab
    prompt = rng.integers(0, vocab, n_prompt) if n_prompt else None
    token = int(rng.integers(0, vocab))

    runs = repetitions + 1  # the first of each is a warm-up
    pp, tg = [], []
    for i in range(runs):
        if n_prompt:
            pp.append(n_prompt / time_prefill(model, prompt))
        if n_gen:
            seconds, kv_bytes = time_decode(model, token, n_gen)
            tg.append(n_gen / seconds)
            result["kv_bytes"] = kv_bytes
            result["rss_generating_mb"] = _rss_mb()
        report("bench", (i + 1) / runs)
    if pp:
        result["prefill_runs"] = pp[1:]
        result["prefill_tok_s"] = statistics.median(pp[1:])
    if tg:
        result["decode_runs"] = tg[1:]
        result["decode_tok_s"] = statistics.median(tg[1:])
    # Ops that ran on numpy instead of a kernel, by "op: reason" -> calls (never silent).
    result["fallbacks"] = dict(getattr(backend, "fallbacks", {}))
    result.update(decode_path_report(model))
    result["kernels"] = kernel_path(backend)
    # The peak is at least every RSS we sampled ourselves (see _peak_rss_mb on counter lag).
    result["peak_rss_mb"] = max(_peak_rss_mb(), result.get("rss_generating_mb", 0.0))
    close = getattr(backend, "close", None)
    if close is not None:
        close()
    return result


def decode_path_report(model) -> dict:
    """How a one-token decode of this model runs (engine/models/decode_plan.py): decode_path
    "steps" (every op a native step), "mixed" (some ops recorded as Python fallbacks, named in
    decode_fallbacks) or "ops" (the op-by-op loop: no step backend, or LOCALCHAT_DECODE_STEPS=0);
    decode_routed names the control flow run in Python between step tables (MoE routing)."""
    describe = getattr(model, "decode_path", None)
    if describe is None:  # a model without a layer loop (the encoder): nothing to report
        return {}
    path, fallbacks = describe()
    plan = model.decode_plan(model.cache_type) if path != "ops" else None
    routed = sorted(set(plan.routed)) if plan is not None else []
    return {"decode_path": path, "decode_fallbacks": fallbacks, "decode_routed": routed}


def format_table(r: dict) -> str:
    """llama-bench style rows."""
    size = r["file_bytes"] / 2**20
    head = "| model | size | backend | threads | test | t/s |\n|---|---|---|---|---|---|"
    rows = []
    name = Path(r["model"]).name
    if "prefill_tok_s" in r:
        rows.append(
            f"| {name} | {size:.1f} MiB | {r['backend']}/{r['isa']} | {r['threads']} | "
            f"pp{r['n_prompt']} | {r['prefill_tok_s']:.1f} |"
        )
    if "decode_tok_s" in r:
        rows.append(
            f"| {name} | {size:.1f} MiB | {r['backend']}/{r['isa']} | {r['threads']} | "
            f"tg{r['n_gen']} | {r['decode_tok_s']:.1f} |"
        )
    extra = [f"peak RSS {r['peak_rss_mb']:.0f} MB"]
    if "rss_generating_mb" in r:
        extra.append(f"RSS while generating {r['rss_generating_mb']:.0f} MB")
    if "kv_bytes" in r:
        extra.append(f"KV cache {r['kv_bytes'] / 2**20:.1f} MiB")
    extra.append(f"file {size:.0f} MiB")
    if "cold_compile_s" in r:
        extra.append(f"cold compile {r['cold_compile_s']:.2f} s")
    extra.append(f"warm start {r['warm_start_s']:.3f} s")
    extra.append(f"model load {r['load_s']:.2f} s")
    decode = ""
    if "decode_path" in r:
        fell = r["decode_fallbacks"]
        decode = f"decode path: {r['decode_path']}" + (
            f" (fell back: {', '.join(fell)})" if fell else ""
        )
    lines = [head, *rows, "", f"kernels: {r['kernels']}", ", ".join(extra)]
    return "\n".join(lines + ([decode] if decode else []))


def add_arguments(p) -> None:
    """The `bench` subcommand's options (engine/__main__.py owns the parser)."""
    p.add_argument("-p", "--n-prompt", type=int, default=512, help="prompt tokens (pp test)")
    p.add_argument("-n", "--n-gen", type=int, default=128, help="generated tokens (tg test)")
    p.add_argument(
        "-t", "--threads", type=int, default=None, help="kernel threads, 1 to 256 (default: cores)"
    )
    p.add_argument("-r", "--repetitions", type=int, default=3, help="timed runs (median reported)")
    p.add_argument("--skip-cold", action="store_true", help="do not measure the cold compile")


def cmd_bench(args, model_path) -> int:
    import json

    from engine.errors import ConfigValidationError

    for field, value, low in (
        ("n_prompt", args.n_prompt, 0),
        ("n_gen", args.n_gen, 0),
        ("repetitions", args.repetitions, 1),
    ):
        if value < low:
            raise ConfigValidationError(field, value, f"an integer >= {low}")
    r = run_bench(
        model_path,
        n_prompt=args.n_prompt,
        n_gen=args.n_gen,
        n_threads=args.threads,
        repetitions=args.repetitions,
        cold_compile=not args.skip_cold,
        cache_type=args.cache_type,
    )
    print(json.dumps(r) if args.json else format_table(r))
    return 0
