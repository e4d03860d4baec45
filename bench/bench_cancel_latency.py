"""How long Stop takes during a long prefill: cancel() -> the generator's Finished event (issue 17).

    .venv/bin/python bench/bench_cancel_latency.py [--model smollm2|gemma3] [--context 4000]
        [--trials 12] [--threads N] [--json]

A prompt of ~`--context` tokens is prefilled once up to its last 256-token chunk and kept in a
PrefixCache, so every trial prefills only the slowest chunk (the one at the far end of the
context, where attention over ~4,000 keys costs most) instead of the whole prompt again. Each
trial starts `generate()` on a thread, waits until its prefill has begun, sleeps a random part of
one chunk's measured time, cancels, and records the time from cancel() to the Finished event.
It also reports the time one such chunk takes, which is what Stop used to wait for in the worst
case (the cancel token was checked only between chunks).
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from engine.cancel import CancelToken
from engine.events import Finished
from engine.generate import PREFILL_CHUNK, GenerationRequest, generate
from engine.loader import load_model
from engine.model_files import default_model_path, gemma3_270m_path
from engine.prefix_cache import PrefixCache

MODELS = {"smollm2": default_model_path, "gemma3": gemma3_270m_path}


def long_prompt(lm, n_tokens: int) -> list[int]:
    """Ordinary English text (a numbered list of sentences), tokenized, cut to n_tokens."""
    sentences = [
        f"Item {i}: the {word} crossed the river at dawn and wrote about it in a notebook."
        for i, word in enumerate(["traveller", "merchant", "painter", "sailor"] * 400)
    ]
    ids = list(lm.tokenizer.encode(" ".join(sentences), add_special=True))
    if len(ids) < n_tokens:
        raise SystemExit(f"the sample text has only {len(ids)} tokens")
    return ids[:n_tokens]


def last_chunk_variant(prompt: list[int], n_head: int, variant: int) -> list[int]:
    """The prompt with the first token of its last chunk changed, so the prefix cache reuses
    exactly the first n_head tokens and the whole last chunk is prefilled again."""
    first = prompt[n_head] + 1 + variant
    return prompt[:n_head] + [first] + prompt[n_head + 1 :]


class _Run:
    """One generate() call consumed on its own thread."""

    def __init__(self, lm, prompt: list[int], prefix_cache: PrefixCache):
        self.cancel = CancelToken()
        self.finished_at: float | None = None
        self.finish_reason: str | None = None
        self._lm = lm
        self._request = GenerationRequest(
            prompt_ids=prompt,
            overrides={"max_new_tokens": 1, "do_sample": False},
            speculative=False,
            prefix_cache=prefix_cache,
        )
        self.thread = threading.Thread(target=self._consume, daemon=True)

    def _consume(self) -> None:
        for event in generate(self._lm, self._request, self.cancel):
            if isinstance(event, Finished):
                self.finished_at = time.perf_counter()
                self.finish_reason = event.finish_reason


def observe_forward(model) -> threading.Event:
    """An event set whenever the model's forward pass is entered (prefill has begun)."""
    entered = threading.Event()
    real_forward = model.forward

    def forward(*args, **kwargs):
        entered.set()
        return real_forward(*args, **kwargs)

    model.forward = forward  # on the instance: the prefix cache still sees the same model
    return entered


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", choices=sorted(MODELS), default="smollm2")
    parser.add_argument("--context", type=int, default=4000)
    parser.add_argument("--trials", type=int, default=12)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()

    lm = load_model(MODELS[args.model](), n_ctx=args.context + 16, n_threads=args.threads)
    prompt = long_prompt(lm, args.context)
    head = prompt[: len(prompt) - PREFILL_CHUNK]
    prefix_cache = PrefixCache(budget_bytes=2**31)
    cache = lm.model.new_cache(len(head))
    for start in range(0, len(head), PREFILL_CHUNK):
        lm.model.forward(head[start : start + PREFILL_CHUNK], cache)
    prefix_cache.store(lm, head, cache, None)

    # One uncancelled run of the last chunk: what Stop used to wait for at worst.
    chunk_times = []
    for variant in range(2):
        run = _Run(lm, last_chunk_variant(prompt, len(head), variant), prefix_cache)
        t0 = time.perf_counter()
        run.thread.start()
        run.thread.join()
        chunk_times.append(run.finished_at - t0)
    chunk_s = statistics.median(chunk_times)

    prefill_started = observe_forward(lm.model)
    rng = random.Random(args.seed)
    latencies = []
    for trial in range(args.trials):
        run = _Run(lm, last_chunk_variant(prompt, len(head), 2 + trial), prefix_cache)
        prefill_started.clear()
        run.thread.start()
        prefill_started.wait()
        time.sleep(rng.uniform(0.0, chunk_s))
        cancelled_at = time.perf_counter()
        run.cancel.cancel()
        run.thread.join()
        if run.finish_reason == "cancelled":
            latencies.append((run.finished_at - cancelled_at) * 1000.0)
    result = {
        "model": args.model,
        "context_tokens": len(prompt),
        "n_layers": lm.config.n_layers,
        "threads": lm.backend.n_threads if hasattr(lm.backend, "n_threads") else 1,
        "last_chunk_prefill_ms": round(chunk_s * 1000.0, 1),
        "cancels_landed": len(latencies),
        "trials": args.trials,
        "cancel_latency_median_ms": round(statistics.median(latencies), 1) if latencies else None,
        "cancel_latency_max_ms": round(max(latencies), 1) if latencies else None,
    }
    if args.json:
        print(json.dumps(result))
    else:
        for key, value in result.items():
            print(f"{key:28} {value}")
    lm.close()


if __name__ == "__main__":
    main()
