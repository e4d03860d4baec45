"""Mixture-of-experts decode speed follows the active parameters, not the total (issue 10).

    .venv/bin/python bench/bench_moe.py [--tokens 32] [--rounds 5] [--threads 2] [--json]

Writes four random-weight Q8_0 models of the same attention (tests/tiny_models.py) into a
temporary directory and decodes `--tokens` tokens with each on the JIT kernels, rounds
interleaved, medians reported:
  * moe:          qwen3moe, 32 experts of 256 rows, top 4 per token (1,024 active FFN rows)
  * gpt-oss:      the same expert layout in MXFP4 (gpt-oss's expert format), with its biases,
                  attention sinks, clamped SwiGLU and 128-position window on every other layer
  * dense-active: qwen3 with a 1,024-row FFN (the MoE's active parameters)
  * dense-total:  qwen3 with an 8,192-row FFN (the MoE's total parameters)
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from gguf import GGMLQuantizationType

from engine.gguf import open_gguf
from engine.kernels.jit_backend import JitBackend
from engine.models import build_model
from tests.tiny_models import write_tiny_model

COMMON = dict(
    d_model=512, n_heads=8, n_kv_heads=2, head_dim=64, n_layers=6, tokenizer=None, vocab_size=4096
)
MODELS = {
    "moe": dict(arch="qwen3moe", d_ff=256, d_ff_exp=256, n_expert=32, n_expert_used=4),
    "gpt-oss": dict(
        arch="gpt-oss",
        d_ff=256,
        d_ff_exp=256,
        n_expert=32,
        n_expert_used=4,
        expert_qtype=GGMLQuantizationType.MXFP4,
    ),
    "dense-active": dict(arch="qwen3", d_ff=1024),
    "dense-total": dict(arch="qwen3", d_ff=8192),
}


def decode_seconds(model, n_tokens: int) -> float:
    cache = model.new_cache(n_tokens + 8)
    model.forward([1, 2, 3, 4], cache)
    token = 5
    start = time.perf_counter()
    for _ in range(n_tokens):
        token = int(model.forward([token], cache).argmax()) % 4096
    return (time.perf_counter() - start) / n_tokens


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    backend = JitBackend(n_threads=args.threads)
    results: dict[str, dict] = {}
    with tempfile.TemporaryDirectory() as tmp:
        models = {}
        for name, spec in MODELS.items():
            spec = dict(spec)
            arch = spec.pop("arch")
            path = write_tiny_model(
                Path(tmp) / f"{name}.gguf", arch, GGMLQuantizationType.Q8_0, **COMMON, **spec
            )
            gguf_file = open_gguf(path)
            models[name] = build_model(gguf_file, backend=backend)
            results[name] = dict(
                parameters=gguf_file.parameter_count(), file_mib=path.stat().st_size / 2**20
            )
        times: dict[str, list[float]] = {name: [] for name in models}
        for model in models.values():  # warm-up: JIT argument blocks, caches
            decode_seconds(model, 4)
        for _ in range(args.rounds):
            for name, model in models.items():
                times[name].append(decode_seconds(model, args.tokens))
    backend.close()
    for name, samples in times.items():
        median = statistics.median(samples)
        results[name].update(ms_per_token=median * 1e3, tokens_per_s=1.0 / median)
    if args.json:
        print(json.dumps(results, indent=2))
        return 0
    print(f"decode, {args.tokens} tokens x {args.rounds} rounds, {args.threads} threads (median)")
    for name, r in results.items():
        print(
            f"  {name:13} {r['parameters'] / 1e6:6.1f} M params  {r['file_mib']:6.1f} MiB  "
            f"{r['ms_per_token']:7.2f} ms/token  {r['tokens_per_s']:7.1f} tok/s"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
