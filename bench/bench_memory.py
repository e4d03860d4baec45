"""Memory and load time of our engine on one model: peak RSS, RSS while generating, and load to
first token, each measured in a fresh child process, against issue 11's targets:

  * peak RSS <= file size + KV cache + 150 MB;
  * load to first token of a 7B model under 3 s warm (file in the page cache, JIT cache warm).

    python bench/bench_memory.py coder 7b -r 3          # the 1.5B and the synthetic 7B
    python bench/bench_memory.py path/to/model.gguf --json
    python bench/bench_memory.py coder --baseline /work/main   # A/B against another checkout
    python bench/bench_memory.py gemma.gguf --fixed-cost -r 3 --baseline /tmp/before
        # issue 32: RSS after each part loaded before any weight (runtime, metadata, tokenizer)

`coder` is Qwen2.5-Coder-1.5B-Instruct Q4_K_M (python -m tools.fetch_qwen_coder), `7b` the file
`python -m tools.make_synthetic_7b` writes. Before the rounds the file is read once (page cache)
and one unmeasured child loads the model (JIT cache warm, tokenizer merges cache warm).

Each child reports its stages (the load_model progress callback, first token, after n_gen
tokens) with seconds since load_model was called and /proc/self/status VmRSS, RssAnon (private
memory: Python objects, numpy buffers, LLVM), RssFile (mapped pages: the model's weights and the
shared libraries) and VmHWM (the kernel's peak RSS). "load to first token" runs from the
load_model call to the first sampled token of a short prompt (greedy), so it includes the
tokenizer, the chat template, the kernel library and the prefill that pages the weights in.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# A child runs the engine of the checkout named by PYTHONPATH (--baseline), else this one.
sys.path.insert(0, os.environ.get("PYTHONPATH", "").split(os.pathsep)[0] or str(ROOT))

PROMPT = "Write a short poem about the sea, the wind and the harbour lights at night."
BUDGET_SLACK_MB = 150
STATUS_KEYS = ("VmRSS", "RssAnon", "RssFile", "VmHWM")


def model_path(name: str) -> Path:
    if name == "coder":
        from tools.fetch_qwen_coder import qwen_coder_target

        return qwen_coder_target()
    if name == "7b":
        from tools.make_synthetic_7b import Shape, output_path

        return output_path(Shape.n_layers)
    return Path(name).expanduser()


def status_mb() -> dict[str, float]:
    """VmRSS, RssAnon, RssFile, VmHWM of this process in MB (2**20 bytes)."""
    out: dict[str, float] = {}
    with open("/proc/self/status") as fh:
        for line in fh:
            key, _, value = line.partition(":")
            if key in STATUS_KEYS:
                out[key] = int(value.split()[0]) / 1024
    return out


def child(path: Path, n_ctx: int, n_gen: int, n_threads: int, prompt: str) -> dict:
    """One measurement in this (fresh) process."""
    t_import = time.perf_counter()
    from engine.events import TokenSampled
    from engine.generate import generate
    from engine.kv_cache import KVCache
    from engine.loader import load_model
    from engine.types import GenerationRequest

    stages: list[dict] = [{"stage": "imports", "s": 0.0, "cpu_s": 0.0, **status_mb()}]
    import_s = time.perf_counter() - t_import
    cpu = time.process_time  # CPU seconds of all this process's threads: steadier when busy
    t0, c0 = time.perf_counter(), cpu()

    def record(stage: str, _fraction: float = 0.0) -> None:
        if stage.startswith("kernels") and stages[-1]["stage"].startswith("kernels"):
            stages.pop()  # one row for the kernel library: its last step
        stages.append(
            {"stage": stage, "s": time.perf_counter() - t0, "cpu_s": cpu() - c0, **status_mb()}
        )

    lm = load_model(path, n_ctx=n_ctx, n_threads=n_threads, progress=record)
    request = GenerationRequest(
        prompt=prompt, overrides={"max_new_tokens": n_gen, "do_sample": False}
    )
    n_prompt = len(lm.tokenizer.encode(prompt, add_special=True))
    first = None
    generated = 0
    for event in generate(lm, request):
        if isinstance(event, TokenSampled):
            generated += 1
            if first is None:
                first = time.perf_counter() - t0
                record("first token")
    record(f"{generated} tokens")
    kv = KVCache.bytes_needed(lm.config, n_prompt + n_gen)
    file_bytes = path.stat().st_size
    peak = max(s["VmHWM"] for s in stages)
    lm.close()
    return {
        "model": path.name,
        "file_mb": file_bytes / 2**20,
        "kv_mb": kv / 2**20,
        "n_prompt": n_prompt,
        "n_gen": generated,
        "import_s": import_s,
        "load_to_first_token_s": first,
        "load_to_first_token_cpu_s": next(
            s["cpu_s"] for s in stages if s["stage"] == "first token"
        ),
        "peak_rss_mb": peak,
        "rss_generating_mb": stages[-1]["VmRSS"],
        "budget_mb": file_bytes / 2**20 + kv / 2**20 + BUDGET_SLACK_MB,
        "stages": stages,
    }


FIXED_COST_STEPS = (
    "python",
    "+ numpy, tokenizers",
    "+ llvmlite",
    "+ kernel library (cached)",
    "+ metadata (open_gguf)",
    "+ tokenizer (heap trimmed)",
)


def fixed_cost_child(path: Path, n_threads: int) -> list[dict]:
    """What a model costs before any weight, one part at a time in this (fresh) process:
    VmRSS / RssAnon / VmHWM after each of FIXED_COST_STEPS (issue 32)."""
    import contextlib
    import ctypes
    import gc

    rows = [{"step": FIXED_COST_STEPS[0], **status_mb()}]
    import numpy  # noqa: F401
    import tokenizers  # noqa: F401

    rows.append({"step": FIXED_COST_STEPS[1], **status_mb()})
    import llvmlite.binding  # noqa: F401

    rows.append({"step": FIXED_COST_STEPS[2], **status_mb()})
    from engine.kernels.backend import get_backend

    get_backend(n_threads=n_threads)
    rows.append({"step": FIXED_COST_STEPS[3], **status_mb()})
    from engine.gguf import open_gguf

    gguf_file = open_gguf(path)
    rows.append({"step": FIXED_COST_STEPS[4], **status_mb()})
    from engine.tokenizer import Tokenizer

    tokenizer = Tokenizer.from_gguf(gguf_file)
    gc.collect()
    with contextlib.suppress(OSError, AttributeError):  # as engine.loader._return_freed_heap
        ctypes.CDLL(None).malloc_trim(0)
    rows.append({"step": FIXED_COST_STEPS[5], **status_mb()})
    assert tokenizer.vocab_size > 0
    return rows


def format_fixed_cost(label: str, runs: list[list[dict]]) -> str:
    lines = [f"[{label}] medians of {len(runs)} (MB)", "", "| step | RSS | anon | peak |"]
    lines.append("|---|---|---|---|")
    for i, step in enumerate(FIXED_COST_STEPS):
        cells = [statistics.median(r[i][k] for r in runs) for k in ("VmRSS", "RssAnon", "VmHWM")]
        lines.append(f"| {step} | " + " | ".join(f"{c:.0f}" for c in cells) + " |")
    return "\n".join(lines)


def run_child(path: Path, args, root: Path = ROOT) -> dict:
    """One child measuring `path` with the engine of the checkout at `root`."""
    cmd = [sys.executable, str(Path(__file__).resolve()), "--child", str(path)]
    cmd += ["--n-ctx", str(args.n_ctx), "-n", str(args.n_gen), "-t", str(args.threads)]
    cmd += ["--prompt", args.prompt]
    if args.fixed_cost:
        cmd.append("--fixed-cost")
    env = {**os.environ, "PYTHONPATH": str(root)}
    out = subprocess.run(cmd, capture_output=True, text=True, cwd=root, env=env)
    if out.returncode != 0:
        raise SystemExit(f"child failed on {path}:\n{out.stderr[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def warm_page_cache(path: Path) -> None:
    with open(path, "rb") as fh:
        while fh.read(1 << 24):
            pass


def summarise(path: Path, runs: list[dict]) -> dict:
    first = runs[0]
    return {
        "model": first["model"],
        "file_mb": first["file_mb"],
        "kv_mb": first["kv_mb"],
        "budget_mb": first["budget_mb"],
        "peak_rss_mb": statistics.median(r["peak_rss_mb"] for r in runs),
        "rss_generating_mb": statistics.median(r["rss_generating_mb"] for r in runs),
        "load_to_first_token_s": statistics.median(r["load_to_first_token_s"] for r in runs),
        "load_to_first_token_cpu_s": statistics.median(
            r["load_to_first_token_cpu_s"] for r in runs
        ),
        "import_s": statistics.median(r["import_s"] for r in runs),
        "rounds": runs,
    }


def format_stages(run: dict) -> str:
    lines = ["| stage | s | CPU s | RSS | anon | file | peak |", "|---|---|---|---|---|---|---|"]
    for s in run["stages"]:
        lines.append(
            f"| {s['stage']} | {s['s']:.2f} | {s['cpu_s']:.2f} | {s['VmRSS']:.0f} | {s['RssAnon']:.0f} | "
            f"{s['RssFile']:.0f} | {s['VmHWM']:.0f} |"
        )
    return "\n".join(lines)


def format_report(summary: dict) -> str:
    ok = summary["peak_rss_mb"] <= summary["budget_mb"]
    head = (
        f"{summary['model']}, {summary['rounds'][0]['n_prompt']}-token prompt: file {summary['file_mb']:.0f} MB, KV {summary['kv_mb']:.1f} MB, "
        f"budget {summary['budget_mb']:.0f} MB; peak RSS {summary['peak_rss_mb']:.0f} MB "
        f"({'within' if ok else 'OVER'} budget), while generating "
        f"{summary['rss_generating_mb']:.0f} MB; load to first token "
        f"{summary['load_to_first_token_s']:.2f} s (median of {len(summary['rounds'])}; rounds "
        + " / ".join(f"{r['load_to_first_token_s']:.2f}" for r in summary["rounds"])
        + f"), CPU {summary['load_to_first_token_cpu_s']:.2f} s; imports {summary['import_s']:.2f} s"
    )
    return (
        head
        + "\n\nStages of the median-time round (MB):\n\n"
        + format_stages(median_round(summary))
    )


def median_round(summary: dict) -> dict:
    rounds = sorted(summary["rounds"], key=lambda r: r["load_to_first_token_s"])
    return rounds[len(rounds) // 2]


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description="peak RSS and load to first token, child per round")
    p.add_argument("models", nargs="*", default=["coder"], help="coder, 7b or GGUF paths")
    p.add_argument("-r", "--rounds", type=int, default=3)
    p.add_argument("-t", "--threads", type=int, default=2)
    p.add_argument("-n", "--n-gen", type=int, default=16, help="tokens generated per round")
    p.add_argument("--n-ctx", type=int, default=4096)
    p.add_argument("--prompt", default=PROMPT, help="raw prompt text (default: ~17 tokens)")
    p.add_argument("--json", action="store_true")
    p.add_argument("--baseline", help="another checkout (e.g. /work/main) measured alternately")
    p.add_argument(
        "--fixed-cost", action="store_true", help="RSS of each part before any weight (issue 32)"
    )
    p.add_argument("--child", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child and args.fixed_cost:
        print(json.dumps(fixed_cost_child(Path(args.child), args.threads)))
        return
    if args.child:
        result = child(Path(args.child), args.n_ctx, args.n_gen, args.threads, args.prompt)
        print(json.dumps(result))
        return
    with open("/proc/loadavg") as fh:
        load_before = fh.read().split()[:3]
    roots = [("this checkout", ROOT)]
    if args.baseline:
        roots.append((f"baseline {args.baseline}", Path(args.baseline).resolve()))
    variants = [(label, root, model_path(m)) for m in args.models for label, root in roots]
    for _, _, path in variants:
        if not path.is_file():
            raise SystemExit(f"{path}: missing (see this script's docstring for how to make it)")
    for _, root, path in variants:
        warm_page_cache(path)
        run_child(path, args, root)  # warm-up: JIT cache, tokenizer caches, page cache
    rounds: dict[int, list] = {i: [] for i in range(len(variants))}
    for _ in range(args.rounds):
        for i, (_, root, path) in enumerate(variants):  # alternate: noise hits every variant
            rounds[i].append(run_child(path, args, root))
    with open("/proc/loadavg") as fh:
        load_after = fh.read().split()[:3]
    if args.fixed_cost:
        print(f"load average before {' '.join(load_before)}, after {' '.join(load_after)}")
        for i, (label, _, path) in enumerate(variants):
            print()
            print(format_fixed_cost(f"{label}] [{path.name}", rounds[i]))
        return
    summaries = []
    for i, (label, _, path) in enumerate(variants):
        summaries.append({"engine": label, **summarise(path, rounds[i])})
    if args.json:
        print(
            json.dumps({"load_before": load_before, "load_after": load_after, "models": summaries})
        )
        return
    print(f"load average before {' '.join(load_before)}, after {' '.join(load_after)}")
    for s in summaries:
        print()
        print(f"[{s['engine']}] " + format_report(s))


if __name__ == "__main__":
    main()
