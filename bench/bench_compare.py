"""Compare side by side (issue 14): what running the columns together costs against running
them one after the other, through the app's own bridge (app/engine_bridge.py RealEngine).

    nice .venv/bin/python bench/bench_compare.py [--tokens 64] [--trials 3] [--columns 2]

Together: `RealEngine.compare` submits every column to the model's BatchScheduler (one forward
pass per step for all of them; the compare view's path). One after the other: the same requests
through `RealEngine.generate` in turn, on a bridge without a scheduler (what a compare without
batching would do). Each trial uses a new question after the same chat history, so the history
can come from the prefix cache but the question cannot. Reported per mode: median wall time of
the whole comparison, and each column's median TTFT and cached prompt tokens. Trials alternate
between the modes, so machine noise hits both alike.
"""

from __future__ import annotations

import argparse
import itertools
import statistics
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from app.engine_bridge import RealEngine
from engine.cancel import CancelToken
from engine.events import Finished
from engine.model_files import default_model_path
from engine.types import GenerationRequest

HISTORY = (
    {"role": "user", "content": "Hello! Who are you?"},
    {"role": "assistant", "content": "I am a small assistant. How can I help you today?"},
)
QUESTIONS = (
    "Give me three tips for learning to cook.",
    "Name three rivers in Europe and one fact about each.",
    "How do I keep a plant alive in winter?",
    "Explain what a prime number is.",
    "What should I pack for a day at the beach?",
    "Describe a good morning routine.",
)


def requests(question: str, columns: int, tokens: int) -> list[GenerationRequest]:
    presets = [{"do_sample": False}] + [
        {"do_sample": True, "temperature": 0.8, "seed": 7 + i} for i in range(columns - 1)
    ]
    return [
        GenerationRequest(
            messages=(*HISTORY, {"role": "user", "content": question}),
            overrides={**p, "max_new_tokens": tokens},
            top_logprobs=5,
        )
        for p in presets
    ]


def finish(events) -> Finished:
    return next(e for e in events if isinstance(e, Finished))


def together(bridge, lm, reqs) -> tuple[float, list[Finished]]:
    start = time.perf_counter()
    streams = bridge.compare(lm, reqs, [CancelToken() for _ in reqs])
    results: list = [None] * len(reqs)

    def pump(i, stream):
        results[i] = finish(stream)

    threads = [threading.Thread(target=pump, args=(i, s)) for i, s in enumerate(streams)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return time.perf_counter() - start, results


def one_after_the_other(bridge, lm, reqs) -> tuple[float, list[Finished]]:
    start = time.perf_counter()
    results = [finish(bridge.generate(lm, r, CancelToken())) for r in reqs]
    return time.perf_counter() - start, results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--trials", type=int, default=3)
    parser.add_argument("--columns", type=int, default=2)
    args = parser.parse_args(argv)
    path = default_model_path()
    batched, serial = RealEngine(), RealEngine()
    noop = lambda stage, fraction: None  # noqa: E731
    lm_b = batched.load(str(path), n_ctx=2048, n_threads=None, progress=noop)
    lm_s = serial.load(str(path), n_ctx=2048, n_threads=None, progress=noop)
    # the history in both prefix caches, as after a chat turn
    for bridge, lm in ((batched, lm_b), (serial, lm_s)):
        finish(bridge.generate(lm, requests("Hi.", 1, 4)[0], CancelToken()))
    modes = {
        "together": (together, batched, lm_b),
        "one after the other": (one_after_the_other, serial, lm_s),
    }
    walls: dict[str, list[float]] = {m: [] for m in modes}
    ttfts: dict[str, list[list[float]]] = {m: [[] for _ in range(args.columns)] for m in modes}
    cached: dict[str, list[list[int]]] = {m: [[] for _ in range(args.columns)] for m in modes}
    generated = dict.fromkeys(modes, 0)
    questions = itertools.cycle(QUESTIONS)
    for _ in range(args.trials):
        question = next(questions)
        for mode, (run, bridge, lm) in modes.items():
            reqs = requests(question, args.columns, args.tokens)
            wall, results = run(bridge, lm, reqs)
            walls[mode].append(wall)
            for i, f in enumerate(results):
                assert f.error is None, f.error
                ttfts[mode][i].append(f.usage.ttft_ms)
                cached[mode][i].append(f.usage.cached_tokens or 0)
                generated[mode] += f.usage.completion_tokens
    print(
        f"SmolLM2 {path.name}, {args.columns} columns x {args.tokens} tokens, {args.trials} trials"
    )
    for mode in modes:
        cols = ", ".join(
            f"col {i + 1}: TTFT {statistics.median(ttfts[mode][i]):.0f} ms, "
            f"cached {statistics.median(cached[mode][i]):.0f}"
            for i in range(args.columns)
        )
        print(
            f"  {mode:20s} wall {statistics.median(walls[mode]):.2f} s, "
            f"{generated[mode]} tokens in all   ({cols})"
        )
    for bridge, lm in ((batched, lm_b), (serial, lm_s)):
        bridge.unload(lm)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
