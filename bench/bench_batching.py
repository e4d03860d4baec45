"""Batched decoding (issue 13): aggregate decode throughput at 1, 2, 4, 8 concurrent streams, and
the worst inter-token gap a running stream sees while another request's prompt is prefilled.

    nice .venv/bin/python bench/bench_batching.py [--model smollm2|gemma3 ...] [--streams 1 2 4 8]
        [--tokens 64] [--trials 3] [--prefill-tokens 400] [--json]

Baseline: the same request alone through engine.generate.generate (no scheduler).
Throughput: N requests (different prompts, seeded sampling, no speculative drafts, so every
token costs one decode row) are submitted together to one BatchScheduler. Every stream's token
times are recorded; the aggregate rate counts the tokens of all streams inside the window where
all N are decoding (from the last stream's first token to the first stream's last token), so
prefill and the ragged end are left out. Median over trials.

Gap: one stream decodes; once it is going, a request with a `--prefill-tokens` prompt is
submitted. Reported: the stream's median gap between tokens before the prompt arrives, its worst
gap while the prompt is prefilled (sliced into PREFILL_SLICE-token pieces beside its decode
steps), and what the whole prefill takes alone in one piece (the gap the stream would see if
prefill were not interleaved). Median over trials.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from engine.batching import BatchScheduler
from engine.batching.forward_work import PREFILL_SLICE
from engine.cancel import CancelToken
from engine.events import Finished, TokenSampled
from engine.generate import generate
from engine.loader import load_model
from engine.model_files import default_model_path, gemma3_270m_path
from engine.types import GenerationRequest

MODELS = {"smollm2": default_model_path, "gemma3": gemma3_270m_path}
TOPICS = [
    "a lighthouse",
    "the desert",
    "a violin maker",
    "winter rain",
    "a chess club",
    "an old train",
    "the harbour",
    "a bakery at dawn",
]


def _request(topic: str, tokens: int, seed: int) -> GenerationRequest:
    return GenerationRequest(
        prompt=f"Once upon a time, in a story about {topic}, there was",
        overrides={
            "max_new_tokens": tokens,
            "temperature": 1.0,
            "top_k": 0,
            "top_p": 1.0,
            "min_p": 0.0,
            "seed": seed,
        },
        speculative=False,
    )


class _Stream:
    def __init__(self, ticket):
        self.times: list[float] = []
        self.first_token = threading.Event()
        self.finished: Finished | None = None
        self.thread = threading.Thread(target=self._read, args=(ticket,), daemon=True)
        self.thread.start()

    def _read(self, ticket):
        for event in ticket.events():
            if isinstance(event, TokenSampled):
                self.times.append(time.perf_counter())
                self.first_token.set()
            elif isinstance(event, Finished):
                self.finished = event


def aggregate_rate(lm, n: int, tokens: int, trial: int) -> float:
    with BatchScheduler(lm, max_concurrency=n) as scheduler:
        streams = [
            _Stream(
                scheduler.submit(
                    _request(TOPICS[i % len(TOPICS)], tokens, 100 * trial + i), CancelToken()
                )
            )
            for i in range(n)
        ]
        for s in streams:
            s.thread.join()
    start = max(s.times[0] for s in streams)
    end = min(s.times[-1] for s in streams)
    if end <= start:
        raise SystemExit("a stream ended before all had started; use more --tokens")
    inside = sum(sum(1 for t in s.times if start < t <= end) for s in streams)
    return inside / (end - start)


def step_phases(lm, n: int, tokens: int, trial: int) -> dict:
    """Where a decode step of n streams goes (issue 32), from the same run as aggregate_rate:
    per step in which all n streams decode one token, the median wall time of the batched
    forward (all layers, then the output projection: "logits_ms", part of "forward_ms"), and
    of the time between two such steps ("between_ms": every request's own pipeline of
    sampling, detokenizing, stop strings and events, the greenlet switches and the scheduler's
    bookkeeping). "cpu_ms_per_token" is the process's CPU time (every thread) per token of the
    run: less sensitive to other processes than wall time on a shared machine."""
    model = lm.model
    # per forward_segments call: (start, end, rows or -1 unless one row per stream, logits s)
    spans: list[tuple[float, float, int, float]] = []
    logits = [0.0]  # the output projection's time inside the call running now
    forward_segments, project = model.forward_segments, model._logits

    def timed_forward(segments, cancel=None):
        t0 = time.perf_counter()
        logits[0] = float("nan")
        out = forward_segments(segments, cancel)
        rows = sum(len(seg.ids) for seg in segments)
        one_each = rows if rows == len(segments) else -1
        spans.append((t0, time.perf_counter(), one_each, logits[0]))
        return out

    def timed_logits(x, rows):
        t0 = time.perf_counter()
        out = project(x, rows)
        logits[0] = time.perf_counter() - t0
        return out

    model.forward_segments, model._logits = timed_forward, timed_logits
    cpu0 = time.process_time()
    try:
        with BatchScheduler(lm, max_concurrency=n) as scheduler:
            streams = [
                _Stream(
                    scheduler.submit(
                        _request(TOPICS[i % len(TOPICS)], tokens, 100 * trial + i), CancelToken()
                    )
                )
                for i in range(n)
            ]
            for s in streams:
                s.thread.join()
    finally:
        del model.forward_segments, model._logits  # the class's methods again
    cpu = time.process_time() - cpu0
    full = [i for i, span in enumerate(spans) if span[2] == n]
    between = [
        spans[i + 1][0] - spans[i][1] for i in full if i + 1 < len(spans) and spans[i + 1][2] == n
    ]
    return {
        "forward_ms": 1000 * statistics.median(spans[i][1] - spans[i][0] for i in full),
        "logits_ms": 1000 * statistics.median(spans[i][3] for i in full),
        "between_ms": 1000 * statistics.median(between),
        "cpu_ms_per_token": 1000 * cpu / sum(len(s.times) for s in streams),
    }


def alone_rate(lm, tokens: int, trial: int) -> float:
    """One request through engine.generate.generate directly (no scheduler): the baseline."""
    times = []
    for event in generate(lm, _request(TOPICS[0], tokens, 100 * trial), CancelToken()):
        if isinstance(event, TokenSampled):
            times.append(time.perf_counter())
    return (len(times) - 1) / (times[-1] - times[0])


def prefill_gap(lm, prefill_tokens: int, tokens: int, trial: int) -> dict:
    text = " ".join(f"Item {i}: the traveller crossed the river at dawn." for i in range(400))
    long_ids = list(lm.tokenizer.encode(text, add_special=True))[:prefill_tokens]
    # the prefill alone in one piece (what a stream would wait for without interleaving)
    cache = lm.model.new_cache(prefill_tokens + 1)
    t0 = time.perf_counter()
    lm.model.forward(long_ids, cache)
    whole = time.perf_counter() - t0
    with BatchScheduler(lm, max_concurrency=2) as scheduler:
        runner = _Stream(scheduler.submit(_request("a lighthouse", tokens, trial), CancelToken()))
        while len(runner.times) < 12:
            time.sleep(0.001)
        arrive = time.perf_counter()
        long_request = GenerationRequest(
            prompt_ids=long_ids, overrides={"max_new_tokens": 1}, speculative=False
        )
        other = _Stream(scheduler.submit(long_request, CancelToken()))
        other.thread.join()
        runner.thread.join()
    assert other.finished is not None
    prefill_end = arrive + other.finished.usage.ttft_ms / 1000.0
    before = [b - a for a, b in zip(runner.times, runner.times[1:], strict=False) if b <= arrive]
    during = [
        b - a
        for a, b in zip(runner.times, runner.times[1:], strict=False)
        if b > arrive and a < prefill_end
    ]
    return {
        "median_gap_ms": 1000 * statistics.median(before),
        "worst_gap_during_prefill_ms": 1000 * max(during) if during else float("nan"),
        "prefill_alone_ms": 1000 * whole,
        "prefill_in_batch_ms": other.finished.usage.ttft_ms,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", nargs="+", choices=sorted(MODELS), default=["smollm2", "gemma3"])
    ap.add_argument("--streams", nargs="+", type=int, default=[1, 2, 4, 8])
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--trials", type=int, default=3)
    ap.add_argument("--prefill-tokens", type=int, default=400)
    ap.add_argument("--json", action="store_true")
    ap.add_argument(
        "--phases",
        action="store_true",
        help="also split each step into forward / logits / between steps (step_phases)",
    )
    ap.add_argument(
        "--skip-gap", action="store_true", help="throughput only (no prefill-gap measurement)"
    )
    args = ap.parse_args()
    report: dict = {"load_average": os.getloadavg(), "prefill_slice": PREFILL_SLICE, "models": {}}
    for name in args.model:
        with load_model(MODELS[name](), n_ctx=1024) as lm:
            alone = statistics.median(alone_rate(lm, args.tokens, t) for t in range(args.trials))
            if not args.json:
                print(f"{name}: alone (generate(), no scheduler): {alone:.1f} tok/s", flush=True)
            rates = {}
            for n in args.streams:
                runs = [aggregate_rate(lm, n, args.tokens, t) for t in range(args.trials)]
                rates[n] = statistics.median(runs)
                if not args.json:
                    print(
                        f"{name}: {n} streams: {rates[n]:.1f} tok/s aggregate "
                        f"(runs {', '.join(f'{r:.1f}' for r in runs)})",
                        flush=True,
                    )
            phases = {}
            if args.phases:
                for n in args.streams:
                    runs = [step_phases(lm, n, args.tokens, t) for t in range(args.trials)]
                    phases[n] = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
                    if not args.json:
                        print(
                            f"{name}: {n} streams, per step: "
                            + ", ".join(f"{k} {v:.2f}" for k, v in phases[n].items()),
                            flush=True,
                        )
            gap: dict = {}
            if not args.skip_gap:
                gaps = [prefill_gap(lm, args.prefill_tokens, 48, t) for t in range(args.trials)]
                gap = {k: statistics.median(g[k] for g in gaps) for k in gaps[0]}
            if not args.json:
                base = rates.get(1)
                for n, r in rates.items():
                    if base:
                        print(f"{name}: {n} streams = {r / base:.2f}x one stream")
                if gap:
                    print(
                        f"{name}: gap while a {args.prefill_tokens}-token prompt prefills: "
                        + ", ".join(f"{k} {v:.1f}" for k, v in gap.items()),
                        flush=True,
                    )
            report["models"][name] = {
                "alone_tok_s": alone,
                "aggregate_tok_s": rates,
                "prefill_gap": gap,
                "step_phases": phases,
            }
    report["load_average_after"] = os.getloadavg()
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        print(f"load average before {report['load_average']}, after {report['load_average_after']}")


if __name__ == "__main__":
    main()
