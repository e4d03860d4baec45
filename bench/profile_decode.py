"""Per-op profile of one decode step: where a token's time goes.

Loads MODEL, decodes `-n` tokens from an empty cache (as bench/compare_llamacpp.py does) and
reports per token:
  * the step time unwrapped (wall and process CPU), the first number to compare against;
  * with every backend op wrapped by a timer: time per op kind (mat-vecs split by weight type
    and shape, the output head on its own; activation quantization inside them timed apart),
    calls per token, and the rest of the step: the transformer's own Python between ops;
  * pool hand-offs per token and one hand-off's cost (an empty job) at this thread count;
  * each mat-vec's weight GB/s, and the whole step's (weight bytes of a token / step time).
The wrappers cost ~0.3 us a call, so op times are slight overestimates and the "Python" row a
slight underestimate.

Usage: python bench/profile_decode.py MODEL [-t THREADS] [-n TOKENS] [-r ROUNDS]
MODEL is a GGUF path or `default` (the bundled SmolLM2-135M).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections import defaultdict
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def _model_path(name: str) -> Path:
    if name == "default":
        from engine.model_files import default_model_path

        return default_model_path()
    return Path(name).expanduser()


def _decode(model, n: int) -> tuple[float, float]:
    cache = model.new_cache(n + 1)
    model.forward([1], cache)  # position 0 outside the timing, like a warm decode
    w0, c0 = time.perf_counter(), time.process_time()
    for _ in range(n):
        model.forward([1], cache)
    return (time.perf_counter() - w0) / n, (time.process_time() - c0) / n


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model")
    ap.add_argument("-t", "--threads", type=int, default=1)
    ap.add_argument("-n", "--tokens", type=int, default=32)
    ap.add_argument("-r", "--rounds", type=int, default=3)
    args = ap.parse_args(argv)

    from engine.loader import load_model

    lm = load_model(_model_path(args.model), n_ctx=args.tokens + 8, n_threads=args.threads)
    model, ops = lm.model, lm.model.backend
    _decode(model, 4)  # repack and warm every weight

    plain = [_decode(model, args.tokens) for _ in range(args.rounds)]
    wall = statistics.median(p[0] for p in plain)
    cpu = statistics.median(p[1] for p in plain)

    # --- pool hand-off cost: an empty job (a 0-row rmsnorm) run on the pool ---
    from engine.kernels.elementwise import RmsnormSlots

    a = np.zeros(RmsnormSlots.SIZE, np.int64)
    kernel = ops.library.address("rmsnorm")
    reps = 20000
    t0 = time.perf_counter()
    for _ in range(reps):
        ops.pool.run(kernel, a.ctypes.data)
    handoff = (time.perf_counter() - t0) / reps

    # --- wrapped run ---
    times: dict[str, float] = defaultdict(float)
    calls: dict[str, int] = defaultdict(int)
    byte_counts: dict[str, int] = {}
    output = model.output

    def label(w) -> str:
        if w is output:
            return f"matvec head {w.qtype.name} {w.rows}x{w.cols}"
        return f"matvec {w.qtype.name} {w.rows}x{w.cols}"

    def wrap(name, fn, key=None):
        def timed(*a, **k):
            t = time.perf_counter()
            r = fn(*a, **k)
            lab = key(*a) if key else name
            times[lab] += time.perf_counter() - t
            calls[lab] += 1
            return r

        return timed

    def linear_key(w, *_):
        byte_counts[label(w)] = w.data.nbytes
        return label(w)

    def many_key(ws, *_):
        lab = " + ".join(label(w) for w in ws)
        byte_counts[lab] = sum(w.data.nbytes for w in ws)
        return lab

    for name in ("rmsnorm", "rope", "attention", "swiglu", "geglu", "embedding"):
        setattr(ops, name, wrap(name, getattr(ops, name)))
    ops.linear = wrap("linear", ops.linear, linear_key)
    ops.linear_many = wrap("linear_many", ops.linear_many, many_key)
    ops._quantized = wrap("quantize (inside mat-vecs)", ops._quantized)
    runs = [0]
    real_run = ops.pool.run

    def counted(*a):
        runs[0] += 1
        return real_run(*a)

    ops.pool.run = counted
    wrapped_wall = []
    for _ in range(args.rounds):
        wrapped_wall.append(_decode(model, args.tokens)[0])
    n_tok = args.rounds * (args.tokens + 1)
    wrapped_total = statistics.mean(wrapped_wall)

    print(f"model {args.model}  threads {args.threads}  tokens {args.tokens} x {args.rounds}")
    print(f"step (unwrapped): wall {wall * 1e3:.3f} ms, cpu {cpu * 1e3:.3f} ms per token")
    print(f"  = {1 / wall:.2f} tok/s wall, {1 / cpu:.2f} tok/CPU-s")
    print(f"pool hand-offs per token: {runs[0] / n_tok:.1f}; an empty job {handoff * 1e6:.2f} us")
    print(f"step (wrapped): {wrapped_total * 1e3:.3f} ms per token")
    print(f"{'op':<58} {'calls/tok':>9} {'ms/tok':>8} {'%':>6} {'GB/s':>6}")
    accounted = 0.0
    weight_bytes = 0
    for lab in sorted(times, key=lambda k: -times[k]):
        per_tok = times[lab] / n_tok
        c = calls[lab] / n_tok
        gbs = ""
        if lab in byte_counts:
            gbs = f"{byte_counts[lab] * calls[lab] / times[lab] / 1e9:6.1f}"
            weight_bytes += byte_counts[lab] * c
        if not lab.startswith("quantize"):
            accounted += per_tok
        print(f"{lab:<58} {c:9.1f} {per_tok * 1e3:8.3f} {100 * per_tok / wrapped_total:6.1f} {gbs}")
    rest = wrapped_total - accounted
    print(
        f"{'python between ops (rest)':<58} {'':9} {rest * 1e3:8.3f} {100 * rest / wrapped_total:6.1f}"
    )
    print(
        f"weight bytes per token {weight_bytes / 1e6:.1f} MB; over the unwrapped step "
        f"{weight_bytes / wall / 1e9:.1f} GB/s"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
