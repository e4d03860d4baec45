"""How right is the prefill's time left? (issue 35: within 20% after the first chunk)

For each model: load it as the app does (load_model + warm_up), then read a long prompt twice
(the first request after the load, then a second one with the kernels and pages warm). Every
PrefillProgress event's eta_s is compared with the time the prefill really took from that event
on: error = (eta - actual) / actual. Reported: the error after the first chunk, the largest error
over the chunks until 80% of the prompt is read (later, the seconds left are too few for a
percentage to mean much), and what a plain remaining / rate estimate would have said after the
first chunk, for comparison.

    .venv/bin/python bench/bench_prefill_eta.py [--tokens 3000] [--runs 2] [--threads N] [MODEL ...]

The load average is printed with each run: on a machine shared with other programs a chunk can
take 50% longer than its neighbours, and no estimate of the time left can foresee that. So the
same estimator (engine/prefill_progress.py) is also replayed on each chunk's CPU time (this
process's, all threads): what other programs take from the machine mostly leaves that alone, so
its error is closer to the cost model's own.

Default models: gemma-3-270m and qwen2.5-coder-1.5b from ~/.cache/LocalChat/models.
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

from engine.events import PrefillProgress
from engine.generate import generate
from engine.loader import load_model, warm_up
from engine.prefill_progress import PrefillEstimate, ratio_for_config
from engine.types import GenerationRequest

MODELS = Path.home() / ".cache" / "LocalChat" / "models"
DEFAULT_MODELS = ("gemma-3-270m-q4_k_m.gguf", "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf")
TEXT_SOURCE = Path(__file__).resolve().parent.parent / "ARCHITECTURE.md"


def prompt_ids(lm, n_tokens: int) -> list[int]:
    text = TEXT_SOURCE.read_text(encoding="utf-8")
    ids: list[int] = []
    while len(ids) < n_tokens:
        ids.extend(int(t) for t in lm.tokenizer.encode(text, add_special=False))
    return ids[:n_tokens]


def one_run(lm, ids: list[int]) -> dict:
    """Read the prompt (one new token), timing each progress event."""
    request = GenerationRequest(prompt_ids=ids, overrides={"max_new_tokens": 1, "do_sample": False})
    marks: list[tuple[float, PrefillProgress]] = []
    cpu: list[float] = []
    for event in generate(lm, request):
        if isinstance(event, PrefillProgress):
            marks.append((time.perf_counter(), event))
            cpu.append(time.process_time())
    start_t, end_t = marks[0][0], marks[-1][0]
    total = marks[-1][1].total
    errors = []
    for t, p in marks[1:-1]:
        actual = end_t - t
        assert p.eta_s is not None  # measured after every chunk
        errors.append((p.done, (p.eta_s - actual) / actual))
    t1, first = marks[1]
    assert first.tok_s is not None
    plain = (total - first.done) / first.tok_s
    actual_after_first = end_t - t1
    early = [abs(e) for done, e in errors if done <= 0.8 * total]
    cpu_first, cpu_early = _replay_on_cpu_time(lm, marks, cpu)
    return {
        "cpu_first": cpu_first,
        "cpu_max_early": cpu_early,
        "seconds": end_t - start_t,
        "tok_s": total / (end_t - start_t),
        "first": errors[0][1],
        "plain_first": (plain - actual_after_first) / actual_after_first,
        "max_early": max(early),
        "chunks": len(marks) - 1,
    }


def _replay_on_cpu_time(lm, marks, cpu: list[float]) -> tuple[float, float]:
    """The estimator fed each chunk's CPU seconds instead of its wall seconds -> (error after
    the first chunk, largest error until 80% read)."""
    total = marks[-1][1].total
    estimate = PrefillEstimate(0, total, ratio_for_config(lm.config))
    errors = []
    for i in range(1, len(marks)):
        start, end = marks[i - 1][1].done, marks[i][1].done
        estimate.record(start, end, cpu[i] - cpu[i - 1])
        actual = cpu[-1] - cpu[i]
        left = estimate.seconds_left()
        if actual > 0 and left is not None:
            errors.append((end, (left - actual) / actual))
    early = [abs(e) for done, e in errors if done <= 0.8 * total]
    return errors[0][1], max(early)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("models", nargs="*")
    parser.add_argument("--tokens", type=int, default=3000)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--runs", type=int, default=2, help="reads of the prompt per model")
    args = parser.parse_args()
    paths = [Path(m) for m in args.models] or [MODELS / m for m in DEFAULT_MODELS]
    print(
        "| model | run | tokens | prefill s | tok/s | ETA error after chunk 1 | "
        "max error to 80% | plain rate after chunk 1 | CPU-time: after chunk 1 | "
        "CPU-time: max to 80% | load avg |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for path in paths:
        with load_model(path, n_ctx=args.tokens + 64, n_threads=args.threads) as lm:
            warm_up(lm)
            ids = prompt_ids(lm, args.tokens)
            for i in range(args.runs):
                load = os.getloadavg()[0]
                r = one_run(lm, ids)
                run = "first after load" if i == 0 else f"{i + 1}"
                print(
                    f"| {path.stem} | {run} | {args.tokens} | {r['seconds']:.1f} | "
                    f"{r['tok_s']:.0f} | {r['first']:+.1%} | {r['max_early']:.1%} | "
                    f"{r['plain_first']:+.1%} | {r['cpu_first']:+.1%} | "
                    f"{r['cpu_max_early']:.1%} | {load:.1f} |",
                    flush=True,
                )


if __name__ == "__main__":
    main()
