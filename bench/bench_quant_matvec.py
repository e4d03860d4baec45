"""Decode mat-vec time per tensor type, side by side in one run (issue 10's speed bar: every
new type within 1.3x of Q4_K on the same shape).

    nice .venv/bin/python bench/bench_quant_matvec.py [--shapes 2048x2048,4096x4096]
        [--threads 1] [--rounds 15] [--calls 50] [--types Q4_K,IQ4_XS,...] [--json]

For each shape (rows x cols, numpy order) one random weight per type (random blocks with
finite fp16 scales, as the kernel tests make them), one token of activations. A round times
`calls` back-to-back `linear` calls of every type in turn, so load on the shared machine hits
every type alike; the table gives the median over rounds of microseconds per call and the
ratio to Q4_K's median on that shape. With one thread the calling thread runs every kernel
itself (engine/kernels/threads.py), so its CPU time (`time.thread_time`) is the kernel's cost
without the time other processes hold the core; that is the figure compared. Wall time is in
the JSON.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from engine.kernels.jit_backend import JitBackend
from engine.qtensor import QTensor
from tests.quant_blocks import random_blocks, scale_down

Q = GGMLQuantizationType
DEFAULT_TYPES = [
    "Q4_K", "Q4_0", "Q8_0", "IQ4_XS", "IQ4_NL", "MXFP4", "TQ2_0", "TQ1_0", "IQ3_S", "IQ3_XXS",
    "IQ2_XS", "IQ2_XXS", "IQ2_S", "IQ1_S", "IQ1_M",
]  # fmt: skip


def make_weight(name: str, rows: int, cols: int, rng: np.random.Generator) -> QTensor:
    qtype = Q[name]
    block = GGML_QUANT_SIZES[qtype][0]
    blocks = random_blocks(rng, qtype, rows * (cols // block))
    scale_down(qtype, blocks)
    return QTensor(name, qtype, (rows, cols), blocks.reshape(rows, -1))


def run(shapes, types, threads: int, rounds: int, calls: int) -> dict:
    backend = JitBackend(n_threads=threads)
    rng = np.random.default_rng(0)
    result: dict = {"isa": backend.isa, "threads": backend.n_threads, "shapes": {}}
    try:
        for rows, cols in shapes:
            weights = {t: make_weight(t, rows, cols, rng) for t in types}
            x = rng.standard_normal((1, cols)).astype(np.float32)
            out = np.empty((1, rows), np.float32)
            for w in weights.values():  # warm up: argument blocks, caches
                for _ in range(3):
                    backend.linear(w, x, out=out)
            cpu: dict[str, list[float]] = {t: [] for t in types}
            wall: dict[str, list[float]] = {t: [] for t in types}
            for _ in range(rounds):
                for t, w in weights.items():
                    start, start_cpu = time.perf_counter(), time.thread_time()
                    for _ in range(calls):
                        backend.linear(w, x, out=out)
                    cpu[t].append((time.thread_time() - start_cpu) / calls * 1e6)
                    wall[t].append((time.perf_counter() - start) / calls * 1e6)
            med = {t: statistics.median(v) for t, v in cpu.items()}
            base = med.get("Q4_K")
            result["shapes"][f"{rows}x{cols}"] = {
                t: {
                    "us": med[t],
                    "wall_us": statistics.median(wall[t]),
                    "ratio_q4_k": med[t] / base if base else None,
                    "bytes": weights[t].nbytes,
                }
                for t in types
            }
    finally:
        backend.close()
    return result


def format_table(result: dict, types) -> str:
    shapes = list(result["shapes"])
    head = "| type | " + " | ".join(f"{s} CPU us | vs Q4_K" for s in shapes) + " |"
    sep = "|---|" + "---:|---:|" * len(shapes)
    lines = [f"ISA {result['isa']}, {result['threads']} thread(s)", "", head, sep]
    for t in types:
        cells = []
        for s in shapes:
            r = result["shapes"][s][t]
            cells.append(f"{r['us']:.1f} | {r['ratio_q4_k']:.2f}x")
        lines.append(f"| {t} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--shapes", default="2048x2048,4096x4096")
    ap.add_argument("--types", default=",".join(DEFAULT_TYPES))
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--calls", type=int, default=50)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    shapes = [tuple(int(n) for n in s.split("x")) for s in args.shapes.split(",")]
    types = args.types.split(",")
    result = run(shapes, types, args.threads, args.rounds, args.calls)
    print(json.dumps(result, indent=1) if args.json else format_table(result, types))
    return 0


if __name__ == "__main__":
    sys.exit(main())
