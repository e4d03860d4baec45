"""What the generation loop itself costs per token, apart from the forward pass (issue 4).

    .venv/bin/python bench/bench_generation_overhead.py [--vocab 262144] [--tokens 200] [--json]

A model whose forward pass returns a precomputed logits vector (so it costs one copy) runs
through engine.generate.generate() with several sampling presets; the time per generated token
is then everything the loop adds: processors, sampler, log-normalizer for TokenSampled, the
detokenizer, stop-string matching and event objects. It also times the sampler alone on the same
logits. The logits are a realistic shape, not white noise: a peaked head (a few dozen plausible
tokens) over a long low tail, as language models produce.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from engine.generate import GenerationRequest, generate
from engine.generation_config import GenerationConfig
from engine.kv_cache import KVCache
from engine.sampling import make_sampler

PRESETS = {
    "greedy": {"do_sample": False},
    "top_k40_p0.95_min_p0.05_T0.8": {
        "do_sample": True,
        "top_k": 40,
        "top_p": 0.95,
        "min_p": 0.05,
        "temperature": 0.8,
    },
    "top_k0_top_p0.9": {"do_sample": True, "top_k": 0, "top_p": 0.9},
    "top_k0_min_p0.05": {"do_sample": True, "top_k": 0, "min_p": 0.05},
    "penalties_rep1.1_pres0.5_freq0.5": {
        "do_sample": False,
        "repetition_penalty": 1.1,
        "presence_penalty": 0.5,
        "frequency_penalty": 0.5,
    },
}


def realistic_logits(vocab: int, seed: int = 0) -> np.ndarray:
    """Shaped like SmolLM2's and gemma3's next-token logits measured on ordinary English: peak
    ~20, ~1e2-1e3 tokens within 8 of it, ~1e4 within 16, the bulk 15-30 below."""
    rng = np.random.default_rng(seed)
    logits = rng.normal(0.0, 4.5, vocab).astype(np.float32)  # the bulk of the vocabulary
    head = rng.choice(vocab, 200, replace=False)
    logits[head] = rng.normal(12.0, 3.0, 200)  # the plausible continuations
    return logits


class ConstantLogitsModel:
    def __init__(self, logits: np.ndarray):
        self.logits = logits
        self.config = type("Config", (), {"n_layers": 1, "n_kv_head": 1, "head_dim": 1})()

    def new_cache(self, n_ctx: int) -> KVCache:
        return KVCache.for_config(self.config, n_ctx)

    def forward(self, tokens, cache, *, all_logits=False, cancel=None):
        cache.reserve(len(tokens))
        cache.commit(tokens)
        return np.repeat(self.logits[None], len(tokens), 0) if all_logits else self.logits.copy()


class PlainTokenizer:
    """Every id is a one-character piece; no end-of-generation ids, so runs reach max tokens."""

    def __init__(self, vocab: int):
        self.vocab_size, self.bos_id, self.eos_id, self.eog_ids = vocab, 0, None, frozenset()

    def piece(self, token_id: int) -> str:
        return chr(0x4E00 + token_id % 20000)

    def decode(self, ids) -> str:
        return "".join(self.piece(i) for i in ids)


class PieceDetokenizer:
    def __init__(self, tokenizer):
        self.tokenizer = tokenizer

    def add(self, token_id: int) -> str:
        return self.tokenizer.piece(token_id)

    def flush(self) -> str:
        return ""


class FakeLoaded:
    def __init__(self, vocab: int, n_ctx: int):
        self.model = ConstantLogitsModel(realistic_logits(vocab))
        self.config = self.model.config
        self.tokenizer = PlainTokenizer(vocab)
        self.n_ctx, self.path, self.gguf = n_ctx, None, None


def time_loop(lm, overrides: dict, n_tokens: int, top_logprobs: int) -> float:
    request = GenerationRequest(
        prompt_ids=[0, 1, 2, 3],
        overrides={**overrides, "max_new_tokens": n_tokens, "seed": 1, "stop": ["\x00\x01"]},
        top_logprobs=top_logprobs,
        speculative=False,
    )
    started = time.perf_counter()
    count = sum(1 for _ in generate(lm, request))
    elapsed = time.perf_counter() - started
    assert count > n_tokens
    return elapsed / n_tokens * 1000.0


def time_sampler(logits: np.ndarray, overrides: dict, n: int) -> float:
    sample = make_sampler(GenerationConfig.from_values({**overrides, "seed": 1}))
    started = time.perf_counter()
    for _ in range(n):
        sample(logits.copy())
    return (time.perf_counter() - started) / n * 1000.0


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--vocab", type=int, default=262_144)
    parser.add_argument("--tokens", type=int, default=200)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()

    import engine.generate

    engine.generate.new_detokenizer = (
        PieceDetokenizer  # the fake vocabulary has no real detokenizer
    )
    lm = FakeLoaded(args.vocab, n_ctx=args.tokens + 16)
    rows = []
    for name, overrides in PRESETS.items():
        rows.append(
            {
                "preset": name,
                "sampler_ms": round(time_sampler(lm.model.logits, overrides, args.tokens), 3),
                "loop_ms_per_token": round(time_loop(lm, overrides, args.tokens, 0), 3),
                "loop_ms_per_token_top5": round(time_loop(lm, overrides, args.tokens, 5), 3),
            }
        )
    if args.json:
        print(json.dumps({"vocab": args.vocab, "tokens": args.tokens, "rows": rows}, indent=2))
        return
    print(f"vocab {args.vocab}, {args.tokens} tokens per run (forward pass = one logits copy)")
    print(f"{'preset':40} {'sampler ms':>10} {'loop ms/tok':>12} {'+top5 ms/tok':>13}")
    for row in rows:
        print(
            f"{row['preset']:40} {row['sampler_ms']:>10.3f} {row['loop_ms_per_token']:>12.3f} "
            f"{row['loop_ms_per_token_top5']:>13.3f}"
        )


if __name__ == "__main__":
    main()
