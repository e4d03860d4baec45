"""Side-by-side prefill/decode throughput: our engine vs llama.cpp (llama-cpp-python), one process.

Both load the same GGUF once; then each round runs, alternately, our pp, llama.cpp's pp, our tg,
llama.cpp's tg, so load from other processes on the machine hits both sides alike. Medians over
rounds (after one warm-up round), the ratio of the medians and the median of the per-round
(paired) ratios ours / llama.cpp are printed, plus a JSON line.

  pp: N random prompt ids into an empty context, logits for the last token only (llama-bench pp)
  tg: M single-token decode steps from an empty context feeding a fixed id (llama-bench tg)

Usage: python bench/compare_llamacpp.py MODEL [-p 512] [-n 128] [-t 2] [-r 5]
MODEL: a GGUF path, "default" (SmolLM2-135M-Instruct) or "gemma3".
llama-cpp-python is an optional extra: `pip install llama-cpp-python` (builds llama.cpp).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from engine.__main__ import resolve_model_path
from engine.bench import time_decode, time_prefill
from engine.loader import load_model


class LlamaCppSide:
    def __init__(self, path: Path, n_ctx: int, n_threads: int, n_batch: int):
        from llama_cpp import Llama

        self.llm = Llama(
            model_path=str(path),
            n_ctx=n_ctx,
            n_threads=n_threads,
            n_threads_batch=n_threads,
            n_batch=n_batch,
            n_ubatch=n_batch,
            logits_all=False,
            verbose=False,
        )

    def prefill(self, prompt: list[int]) -> float:
        self.llm.reset()  # n_tokens = 0: eval() drops the old KV entries itself
        t0 = time.perf_counter()
        self.llm.eval(prompt)
        return time.perf_counter() - t0

    def decode(self, token: int, n_gen: int) -> float:
        self.llm.reset()  # n_tokens = 0: eval() drops the old KV entries itself
        t0 = time.perf_counter()
        for _ in range(n_gen):
            self.llm.eval([token])
        return time.perf_counter() - t0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model")
    ap.add_argument("-p", "--n-prompt", type=int, default=512)
    ap.add_argument("-n", "--n-gen", type=int, default=128)
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("-r", "--rounds", type=int, default=5)
    args = ap.parse_args(argv)

    path = resolve_model_path(args.model)
    n_ctx = max(args.n_prompt, args.n_gen) + 16
    ours = load_model(path, n_ctx=n_ctx, n_threads=args.threads)
    theirs = LlamaCppSide(path, n_ctx, args.threads, max(args.n_prompt, 32))
    rng = np.random.default_rng(1234)
    vocab = ours.config.n_vocab
    prompt = [int(i) for i in rng.integers(0, vocab, args.n_prompt)]
    token = int(rng.integers(0, vocab))

    runs = {"ours_pp": [], "llama_pp": [], "ours_tg": [], "llama_tg": []}
    for r in range(args.rounds + 1):  # round 0 warms both up and is not counted
        sample = {
            "ours_pp": args.n_prompt / time_prefill(ours.model, prompt),
            "llama_pp": args.n_prompt / theirs.prefill(prompt),
            "ours_tg": args.n_gen / time_decode(ours.model, token, args.n_gen)[0],
            "llama_tg": args.n_gen / theirs.decode(token, args.n_gen),
        }
        if r:
            for k, v in sample.items():
                runs[k].append(v)
        print(
            f"round {r}{' (warm-up)' if not r else ''}: "
            + "  ".join(f"{k} {v:7.1f}" for k, v in sample.items()),
            flush=True,
        )

    med = {k: statistics.median(v) for k, v in runs.items()}
    # Paired per-round ratios: both sides of a round saw the same machine load, so their ratio
    # is steadier than the ratio of medians when other processes come and go.
    pp_ratios = [o / t for o, t in zip(runs["ours_pp"], runs["llama_pp"], strict=True)]
    tg_ratios = [o / t for o, t in zip(runs["ours_tg"], runs["llama_tg"], strict=True)]
    print()
    print(
        f"model {path.name}, threads {args.threads}, pp{args.n_prompt} / tg{args.n_gen}, "
        f"{args.rounds} rounds, medians (tok/s); load average {os.getloadavg()[0]:.1f}"
    )
    print(
        "| test | ours | llama.cpp | ratio of medians | median of paired ratios |\n|---|---|---|---|---|"
    )
    print(
        f"| pp{args.n_prompt} | {med['ours_pp']:.1f} | {med['llama_pp']:.1f} | "
        f"{med['ours_pp'] / med['llama_pp']:.2f}x | {statistics.median(pp_ratios):.2f}x |"
    )
    print(
        f"| tg{args.n_gen} | {med['ours_tg']:.1f} | {med['llama_tg']:.1f} | "
        f"{med['ours_tg'] / med['llama_tg']:.2f}x | {statistics.median(tg_ratios):.2f}x |"
    )
    print(
        json.dumps(
            {
                "model": path.name,
                "threads": args.threads,
                "runs": runs,
                "medians": med,
                "prefill_ratio": med["ours_pp"] / med["llama_pp"],
                "decode_ratio": med["ours_tg"] / med["llama_tg"],
                "prefill_paired_ratios": pp_ratios,
                "decode_paired_ratios": tg_ratios,
                "loadavg": os.getloadavg()[0],
            }
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
