"""Side-by-side prefill/decode throughput: our engine vs llama.cpp (llama-cpp-python).

Each engine runs in its own worker process (spawned, so neither shares the other's threads,
allocator or OpenMP runtime) and loads the same GGUF once; then each round runs, alternately, our
pp, llama.cpp's pp, our tg, llama.cpp's tg, so load from other processes on the machine hits both
sides alike. Medians over rounds (after one warm-up round), the ratio of the medians and the
median of the per-round (paired) ratios ours / llama.cpp are printed, plus a JSON line.

  pp: N random prompt ids into an empty context, logits for the last token only (llama-bench pp)
  tg: M single-token decode steps from an empty context feeding a fixed id (llama-bench tg)

--clock wall (default) times each run by the wall clock. --clock cpu divides by the worker
process's CPU time (all its threads) instead: on a shared machine, time spent descheduled does
not count, so the figure is tokens per CPU-second (with t threads, up to t times the wall
rate); a side that spins while it waits pays for the spinning. Both clocks are recorded.
--ours-env NAME=VALUE (repeatable) sets an environment variable in our worker only, e.g.
LOCALCHAT_REPACK=0 for the row-major kernels; --against-ours NAME=VALUE runs a second "ours"
worker with that variable instead of llama.cpp (our two paths side by side). --against-src DIR
runs the second "ours" worker on another source tree's engine (e.g. `git archive OLD engine | tar
-x -C DIR`: before / after a change, side by side in one run).

Usage: python bench/compare_llamacpp.py MODEL [-p 512] [-n 128] [-t 2] [-r 5] [--clock cpu]
       [--json] [--ours-env K=V] [--against-ours K=V] [--against-src DIR]
MODEL: a GGUF path, "default" (SmolLM2-135M-Instruct) or "gemma3".
llama-cpp-python is an optional extra: `pip install llama-cpp-python` (builds llama.cpp).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import resource
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


class OursSide:
    def __init__(self, path: Path, n_ctx: int, n_threads: int, n_batch: int):
        from engine.loader import load_model

        self.lm = load_model(path, n_ctx=n_ctx, n_threads=n_threads)
        self.n_vocab = self.lm.config.n_vocab

    def prefill(self, prompt: list[int]) -> None:
        model = self.lm.model
        model.forward(prompt, model.new_cache(len(prompt) + 1))

    def decode(self, token: int, n_gen: int) -> None:
        model = self.lm.model
        cache = model.new_cache(n_gen + 1)
        for _ in range(n_gen):
            model.forward([token], cache)


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
        self.n_vocab = self.llm.n_vocab()

    def prefill(self, prompt: list[int]) -> None:
        self.llm.reset()  # n_tokens = 0: eval() drops the old KV entries itself
        self.llm.eval(prompt)

    def decode(self, token: int, n_gen: int) -> None:
        self.llm.reset()
        for _ in range(n_gen):
            self.llm.eval([token])


SIDES = {"ours": OursSide, "llama": LlamaCppSide}


def _worker(
    conn,
    kind: str,
    env: dict[str, str],
    path: str,
    n_ctx: int,
    threads: int,
    batch: int,
    src: str | None = None,
):
    """One engine in its own process: load, then answer ("pp", prompt) / ("tg", token, n) with
    (wall seconds, process CPU seconds) until ("quit",). src: the directory whose `engine`
    package to run (imported first; nothing has imported engine in this fresh process yet)."""
    os.environ.update(env)
    if src is not None:
        sys.path.insert(0, src)
    t0 = time.perf_counter()
    side = SIDES[kind](Path(path), n_ctx, threads, batch)
    engine = sys.modules.get("engine")
    conn.send(
        {
            "load_s": time.perf_counter() - t0,
            "n_vocab": side.n_vocab,
            "engine": str(Path(engine.__file__).parent) if engine and engine.__file__ else "",
        }
    )
    while True:
        msg = conn.recv()
        if msg[0] == "quit":
            conn.send({"max_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024})
            return
        w0, c0 = time.perf_counter(), time.process_time()
        if msg[0] == "pp":
            side.prefill(msg[1])
        else:
            side.decode(msg[1], msg[2])
        conn.send((time.perf_counter() - w0, time.process_time() - c0))


class Worker:
    def __init__(self, kind: str, env: dict[str, str], path: Path, n_ctx, threads, batch, src=None):
        ctx = mp.get_context("spawn")
        self.conn, child = ctx.Pipe()
        self.proc = ctx.Process(
            target=_worker,
            args=(child, kind, env, str(path), n_ctx, threads, batch, src),
            daemon=True,
        )
        self.proc.start()
        self.info = self.conn.recv()

    def run(self, *msg) -> tuple[float, float]:
        self.conn.send(msg)
        return self.conn.recv()

    def close(self) -> dict:
        self.conn.send(("quit",))
        info = self.conn.recv()
        self.proc.join()
        return info


def _env_pairs(items: list[str]) -> dict[str, str]:
    out = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep:
            raise SystemExit(f"expected NAME=VALUE, got {item!r}")
        out[key] = value
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model")
    ap.add_argument("-p", "--n-prompt", type=int, default=512)
    ap.add_argument("-n", "--n-gen", type=int, default=128)
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("-r", "--rounds", type=int, default=5)
    ap.add_argument("--clock", choices=("wall", "cpu"), default="wall")
    ap.add_argument("--json", action="store_true", help="print only the JSON result")
    ap.add_argument("--ours-env", action="append", default=[], metavar="NAME=VALUE")
    ap.add_argument("--against-ours", action="append", default=[], metavar="NAME=VALUE")
    ap.add_argument("--against-src", metavar="DIR", help="another source tree's engine")
    args = ap.parse_args(argv)

    from engine.__main__ import resolve_model_path

    path = resolve_model_path(args.model)
    n_ctx = max(args.n_prompt, args.n_gen) + 16
    common = (path, n_ctx, args.threads, max(args.n_prompt, 32))
    ours = Worker("ours", _env_pairs(args.ours_env), *common)
    if args.against_src:
        src = str(Path(args.against_src).resolve())
        theirs = Worker("ours", _env_pairs(args.against_ours), *common, src=src)
        if not theirs.info["engine"].startswith(src):
            raise SystemExit(f"--against-src: the worker ran {theirs.info['engine']}, not {src}")
        their_name = f"ours[{args.against_src}]"
    elif args.against_ours:
        theirs = Worker("ours", _env_pairs(args.against_ours), *common)
        their_name = "ours[" + ",".join(args.against_ours) + "]"
    else:
        theirs = Worker("llama", {}, *common)
        their_name = "llama.cpp"
    rng = np.random.default_rng(1234)
    vocab = ours.info["n_vocab"]
    prompt = [int(i) for i in rng.integers(0, vocab, args.n_prompt)]
    token = int(rng.integers(0, vocab))

    pick = 1 if args.clock == "cpu" else 0
    keys = ("ours_pp", "llama_pp", "ours_tg", "llama_tg")
    runs: dict[str, list[float]] = {k: [] for k in keys}
    raw: dict[str, list[tuple[float, float]]] = {k: [] for k in keys}
    say = (lambda *a, **k: None) if args.json else print
    for r in range(args.rounds + 1):  # round 0 warms both up and is not counted
        times = {
            "ours_pp": ours.run("pp", prompt),
            "llama_pp": theirs.run("pp", prompt),
            "ours_tg": ours.run("tg", token, args.n_gen),
            "llama_tg": theirs.run("tg", token, args.n_gen),
        }
        sample = {
            k: (args.n_prompt if k.endswith("pp") else args.n_gen) / t[pick]
            for k, t in times.items()
        }
        if r:
            for k, v in sample.items():
                runs[k].append(v)
                raw[k].append(times[k])
        say(
            f"round {r}{' (warm-up)' if not r else ''}: "
            + "  ".join(f"{k} {v:7.1f}" for k, v in sample.items()),
            flush=True,
        )
    loads = {"ours": ours.info["load_s"], "theirs": theirs.info["load_s"]}
    rss = {"ours": ours.close()["max_rss_mb"], "theirs": theirs.close()["max_rss_mb"]}

    med = {k: statistics.median(v) for k, v in runs.items()}
    # Paired per-round ratios: both sides of a round saw the same machine load, so their ratio
    # is steadier than the ratio of medians when other processes come and go.
    pp_ratios = [o / t for o, t in zip(runs["ours_pp"], runs["llama_pp"], strict=True)]
    tg_ratios = [o / t for o, t in zip(runs["ours_tg"], runs["llama_tg"], strict=True)]
    unit = "tok/s" if args.clock == "wall" else "tok per CPU-s"
    say()
    say(
        f"model {path.name}, threads {args.threads}, pp{args.n_prompt} / tg{args.n_gen}, "
        f"{args.rounds} rounds, clock {args.clock}, medians ({unit}); "
        f"load average {os.getloadavg()[0]:.1f}; ours env {args.ours_env or '-'}"
    )
    say(
        f"| test | ours | {their_name} | ratio of medians | median of paired ratios |\n"
        "|---|---|---|---|---|"
    )
    say(
        f"| pp{args.n_prompt} | {med['ours_pp']:.1f} | {med['llama_pp']:.1f} | "
        f"{med['ours_pp'] / med['llama_pp']:.2f}x | {statistics.median(pp_ratios):.2f}x |"
    )
    say(
        f"| tg{args.n_gen} | {med['ours_tg']:.1f} | {med['llama_tg']:.1f} | "
        f"{med['ours_tg'] / med['llama_tg']:.2f}x | {statistics.median(tg_ratios):.2f}x |"
    )
    say(
        f"load s: ours {loads['ours']:.2f}, {their_name} {loads['theirs']:.2f}; "
        f"peak RSS MB: ours {rss['ours']:.0f}, {their_name} {rss['theirs']:.0f}"
    )
    print(
        json.dumps(
            {
                "model": path.name,
                "threads": args.threads,
                "clock": args.clock,
                "against": their_name,
                "ours_env": args.ours_env,
                "runs": runs,
                "wall_cpu_seconds": raw,
                "medians": med,
                "prefill_ratio": med["ours_pp"] / med["llama_pp"],
                "decode_ratio": med["ours_tg"] / med["llama_tg"],
                "prefill_paired_ratios": pp_ratios,
                "decode_paired_ratios": tg_ratios,
                "load_s": loads,
                "max_rss_mb": rss,
                "loadavg": os.getloadavg()[0],
            }
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
