"""Load time and first forward pass (`warm_up`, where Q4_K/Q6_K weights are repacked), with and
without the repack, alternating fresh child processes; medians of wall and CPU seconds.

Usage: python bench/bench_first_forward.py MODEL [-r 3]
MODEL: a GGUF path, "default" (SmolLM2-135M-Instruct) or "gemma3". Each round runs one child
with the repacked kernels and one with `LOCALCHAT_REPACK=0` (the row-major kernels), so load from
other processes hits both alike.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

CHILD = """
import json, sys, time
from engine.__main__ import resolve_model_path
from engine.loader import load_model, warm_up
t0, c0 = time.perf_counter(), time.process_time()
lm = load_model(resolve_model_path(sys.argv[1]))
t1, c1 = time.perf_counter(), time.process_time()
warm_up(lm)
t2, c2 = time.perf_counter(), time.process_time()
print(json.dumps({"load": t1 - t0, "load_cpu": c1 - c0, "warm": t2 - t1, "warm_cpu": c2 - c1}))
"""


def run_child(model: str, repack: bool) -> dict[str, float]:
    env = dict(os.environ, PYTHONPATH=str(ROOT), LOCALCHAT_REPACK="1" if repack else "0")
    out = subprocess.run(
        [sys.executable, "-c", CHILD, model], env=env, capture_output=True, text=True, check=True
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model")
    ap.add_argument("-r", "--rounds", type=int, default=3)
    args = ap.parse_args()
    runs: dict[bool, list[dict[str, float]]] = {True: [], False: []}
    for _ in range(args.rounds):
        for repack in (True, False):
            runs[repack].append(run_child(args.model, repack))
    print(f"{'':12} {'load s':>8} {'load cpu':>9} {'warm_up s':>10} {'warm cpu':>9}")
    for repack, label in ((True, "repacked"), (False, "row-major")):
        med = {k: statistics.median(r[k] for r in runs[repack]) for k in runs[repack][0]}
        print(
            f"{label:12} {med['load']:8.2f} {med['load_cpu']:9.2f} "
            f"{med['warm']:10.2f} {med['warm_cpu']:9.2f}"
        )


if __name__ == "__main__":
    main()
