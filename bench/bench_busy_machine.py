"""Decode throughput on a busy machine: our engine and llama.cpp (llama-cpp-python), each in its
own process with the same thread count, with and without another process spinning on one core.

llama.cpp's worker threads spin at their barriers (OpenMP); when another process holds a core,
a spinning thread waits for a preempted one and throughput collapses. Our pool spins briefly,
then yields and blocks (engine/kernels/threads.py). Issue 11 asks ours to stay ahead under that
load; this script measures it.

    python bench/bench_busy_machine.py coder -t 2 -n 64 -r 3
    python bench/bench_busy_machine.py 7b -t 2 -n 32 -r 3

Each engine loads the model once in its own child process and then answers "decode" requests
(n single-token forward steps from an empty cache feeding a fixed id, llama-bench's tg test).
Every round measures, alternately: ours quiet, llama.cpp quiet, ours busy, llama.cpp busy; the
"busy" measurements run while a third process (`while True: pass`) keeps one core busy; it is
started just before and stopped just after each one. One warm-up round is not counted. Medians
per engine and condition, and the medians of the paired (same round) ratios, are printed.
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
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

ENGINES = ("ours", "llama.cpp")
SPINNER = "while True: pass"
TOKEN = 1234  # the fed id (any id inside the vocabulary; the cost does not depend on it)


def serve(engine: str, path: Path, n_threads: int, n_ctx: int) -> None:
    """Child: load once, then answer each stdin line `N` with tok/s of N decode steps."""
    if engine == "ours":
        from engine.bench import time_decode
        from engine.loader import load_model

        lm = load_model(path, n_ctx=n_ctx, n_threads=n_threads)

        def decode(n: int) -> float:
            return time_decode(lm.model, TOKEN, n)[0]
    else:
        from bench.compare_llamacpp import LlamaCppSide

        side = LlamaCppSide(path, n_ctx, n_threads, 32)

        def decode(n: int) -> float:
            return side.decode(TOKEN, n)

    print("ready", flush=True)
    for line in sys.stdin:
        n = int(line)
        print(json.dumps({"tok_s": n / decode(n)}), flush=True)


class Child:
    def __init__(self, engine: str, path: Path, args) -> None:
        cmd = [sys.executable, str(Path(__file__).resolve()), "--serve", engine, str(path)]
        cmd += ["-t", str(args.threads), "--n-ctx", str(args.n_gen + 16)]
        self.proc = subprocess.Popen(
            cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=ROOT
        )
        assert self.proc.stdout is not None and self.proc.stdin is not None
        self.stdin, self.stdout = self.proc.stdin, self.proc.stdout
        if self.stdout.readline().strip() != "ready":
            raise SystemExit(f"{engine} child failed to load {path}")

    def decode(self, n: int) -> float:
        self.stdin.write(f"{n}\n")
        self.stdin.flush()
        return json.loads(self.stdout.readline())["tok_s"]

    def close(self) -> None:
        self.stdin.close()
        self.proc.wait(timeout=60)


def measure(child: Child, n: int, busy: bool) -> float:
    spinner = subprocess.Popen([sys.executable, "-c", SPINNER]) if busy else None
    try:
        if spinner is not None:
            time.sleep(0.2)  # let the spinner get scheduled before the measurement starts
        return child.decode(n)
    finally:
        if spinner is not None:
            spinner.kill()
            spinner.wait()


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description="decode tok/s with one core kept busy, vs llama.cpp")
    p.add_argument("model", nargs="?", default="coder", help="coder, 7b or a GGUF path")
    p.add_argument("-t", "--threads", type=int, default=2)
    p.add_argument("-n", "--n-gen", type=int, default=64)
    p.add_argument("-r", "--rounds", type=int, default=3)
    p.add_argument("--n-ctx", type=int, default=0, help=argparse.SUPPRESS)
    p.add_argument("--serve", help=argparse.SUPPRESS)
    args, rest = p.parse_known_args(argv)
    if args.serve:
        serve(args.serve, Path(rest[0] if rest else args.model), args.threads, args.n_ctx)
        return
    from bench.bench_memory import model_path

    path = model_path(args.model)
    load_before = os.getloadavg()
    children = {engine: Child(engine, path, args) for engine in ENGINES}
    runs: dict[str, list[float]] = {f"{e} {c}": [] for c in ("quiet", "busy") for e in ENGINES}
    try:
        for r in range(args.rounds + 1):  # round 0 warms both up and is not counted
            sample = {}
            for condition in ("quiet", "busy"):
                for engine in ENGINES:
                    key = f"{engine} {condition}"
                    sample[key] = measure(children[engine], args.n_gen, condition == "busy")
            if r:
                for key, value in sample.items():
                    runs[key].append(value)
            print(
                f"round {r}{' (warm-up)' if not r else ''}: "
                + "  ".join(f"{k} {v:6.2f}" for k, v in sample.items()),
                flush=True,
            )
    finally:
        for child in children.values():
            child.close()
    med = {k: statistics.median(v) for k, v in runs.items()}
    paired = {
        c: statistics.median(
            o / t for o, t in zip(runs[f"ours {c}"], runs[f"llama.cpp {c}"], strict=True)
        )
        for c in ("quiet", "busy")
    }
    load_after = os.getloadavg()
    print()
    print(
        f"{path.name}, {args.threads} threads, tg{args.n_gen}, {args.rounds} rounds; load "
        f"average {load_before[0]:.1f} before, {load_after[0]:.1f} after"
    )
    print("| condition | ours tok/s | llama.cpp tok/s | ratio of medians | median paired ratio |")
    print("|---|---|---|---|---|")
    for c in ("quiet", "busy"):
        ours, theirs = med[f"ours {c}"], med[f"llama.cpp {c}"]
        print(f"| {c} | {ours:.2f} | {theirs:.2f} | {ours / theirs:.2f}x | {paired[c]:.2f}x |")
    for engine in ENGINES:
        kept = med[f"{engine} busy"] / med[f"{engine} quiet"]
        print(f"{engine}: busy / quiet = {kept:.2f}")
    print(json.dumps({"model": path.name, "threads": args.threads, "runs": runs, "medians": med,
                      "paired_ratios": paired, "load_before": load_before,
                      "load_after": load_after}))  # fmt: skip


if __name__ == "__main__":
    main()
