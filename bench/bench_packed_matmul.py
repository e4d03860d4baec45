"""Repacked-record mat-mul (packed_matmul.py, packed_legacy.py) vs the row-major kernels.

Two JIT backends in one process, one with LOCALCHAT_REPACK=0 (main's row-major kernels) and
one repacking; each weight is timed on both, alternating, by process CPU time (robust on a
shared machine); medians of `--rounds` pairs of 2 calls each. Random K-quant blocks, the 1.5B
model's shapes, or with `--small` the small models' legacy-quant weights (gemma-3-270m's Q8_0
output head and Q5_0 projections, SmolLM2-135M's Q8_0 head and Q4_1 projections). The first
call's time (which includes the repack) is printed too, and each side's rate (GB/s of weight
bytes for one token, else Gop/s).

Usage: python bench/bench_packed_matmul.py [-t THREADS] [-T TOKENS] [-r ROUNDS] [--small]
Set LOCALCHAT_CPU=haswell (or x86-64-v2) to time the AVX2 (generic) path.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType as Q

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from engine.kernels.jit_backend import REPACK_ENV, JitBackend
from tests.test_kernels_linear import make_weight

SHAPES = [(Q.Q4_K, 8960, 1536), (Q.Q6_K, 1536, 8960), (Q.Q4_K, 1536, 1536)]
SMALL_SHAPES = [
    (Q.Q8_0, 262144, 640),  # gemma-3-270m's tied output head
    (Q.Q5_0, 2048, 640),  # its ffn_gate / ffn_up
    (Q.Q8_0, 49152, 576),  # SmolLM2-135M's tied output head
    (Q.Q4_1, 1536, 576),  # its ffn_gate / ffn_up
    (Q.Q4_1, 576, 1536),  # its ffn_down
    (Q.Q4_0, 2048, 640),
    (Q.Q5_1, 2048, 640),
]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-t", "--threads", type=int, default=1)
    ap.add_argument("-T", "--tokens", type=int, default=512)
    ap.add_argument("-r", "--rounds", type=int, default=7)
    ap.add_argument("--small", action="store_true", help="the small models' legacy-quant shapes")
    args = ap.parse_args(argv)
    os.environ[REPACK_ENV] = "0"
    rowwise = JitBackend(args.threads)
    os.environ[REPACK_ENV] = "1"
    packed = JitBackend(args.threads)
    rng = np.random.default_rng(0)
    for qtype, rows, cols in SMALL_SHAPES if args.small else SHAPES:
        w = make_weight(qtype, rows, cols, rng)
        x = rng.standard_normal((args.tokens, cols)).astype(np.float32)
        t0 = time.perf_counter()
        new = packed.linear(w, x)
        first = time.perf_counter() - t0
        old = rowwise.linear(w, x)
        times: dict[str, list[float]] = {"row-major": [], "repacked": []}
        for _ in range(args.rounds):
            for key, backend in (("row-major", rowwise), ("repacked", packed)):
                c0 = time.process_time()
                backend.linear(w, x)
                backend.linear(w, x)
                times[key].append((time.process_time() - c0) / 2)
        mo, mn = (float(np.median(times[k])) for k in ("row-major", "repacked"))

        def rate(seconds: float, w=w, tokens=args.tokens) -> str:
            """Weight bytes streamed per second for one token, else integer ops per second."""
            if tokens == 1:
                return f"{w.data.nbytes / 1e9 / seconds:.1f} GB/s"
            return f"{2 * w.rows * w.cols * tokens / 1e9 / seconds:.0f} Gop/s"

        print(
            f"{qtype.name} {rows}x{cols} T={args.tokens} threads={args.threads}: "
            f"row-major {mo * 1e3:.2f} ms ({rate(mo)}), repacked {mn * 1e3:.2f} ms "
            f"({rate(mn)}), {mo / mn:.2f}x; "
            f"max rel diff {np.abs(new - old).max() / np.abs(old).max():.1e}; "
            f"first call incl. repack {first * 1e3:.0f} ms"
        )
    rowwise.close()
    packed.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
