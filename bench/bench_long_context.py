"""Long context side by side: our engine vs llama.cpp (llama-cpp-python), one process, alternating.

Each round runs, in turn: our prefill of a DEPTH-token prompt into an empty f16 cache (pp), our
decode of N tokens on top of it (tg at depth), the same decode over a q8_0 cache holding the same
prompt (the f16 rows quantized, so no second prefill), then llama.cpp's pp and tg at depth. Load
from other processes on the machine hits every side alike; medians over rounds (after one short
warm-up), the ratio of medians and the median of the per-round (paired) ratios are printed, plus
a JSON line. `--clock cpu` times with process CPU time (all threads) instead of wall time.

  pp:  DEPTH random prompt ids into an empty context, last-token logits (llama-bench pp)
  tg:  N single-token decode steps at positions DEPTH .. DEPTH+N-1 (llama-bench tg with -d)

`--logit-error` instead measures what the q8_0 cache costs in accuracy: a real text prompt
(this repository's engine source, tokenized, cut to DEPTH tokens) through our engine with an
f16 and with a q8_0 cache, logits at every 16th position (--logit-stride); with --peer also
llama.cpp's own f16 vs q8_0 KV error on the same tokens' text (flash attention on, as its q8_0 V
cache requires); prints max |dlogit|, the KL divergence
KL(p_f16 || p_q8) per position (mean / max), the top-1 agreement, and both caches' bytes.

`--kernel` times the attention op alone on one model's shapes (`--shape`: Qwen2.5-1.5B's 12 query
heads, 2 KV heads, head_dim 128, or SmolLM2-135M's 9 / 3 / 64): one decode query at DEPTH and one
32-query prefill block ending at DEPTH, per cache type, -t threads, wall and process CPU time,
median of 20 calls per layer; `--layers 30` cycles through 30 distinct caches, so that like a
real decode step each call streams its rows from memory, not L3 (MODEL is not loaded).

Usage: python bench/bench_long_context.py MODEL [--depth 4096] [-n 32] [-t 2] [-r 3]
       python bench/bench_long_context.py - --kernel [--depth 4096] [--shape smollm2] [-t 1]
       python bench/bench_long_context.py MODEL --logit-error [--depth 4096]
MODEL: a GGUF path, "default" (SmolLM2-135M-Instruct) or "gemma3".
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
from engine.kv_cache import KVCache
from engine.kv_quant import quantize_q8_0
from engine.loader import load_model
from engine.types import KvCacheType

CLOCKS = {"wall": time.perf_counter, "cpu": time.process_time}
# --kernel shapes: (query heads, KV heads, head_dim)
KERNEL_SHAPES = {"qwen1.5b": (12, 2, 128), "smollm2": (9, 3, 64)}


class LlamaCppSide:
    def __init__(self, path: Path, n_ctx: int, n_threads: int):
        from llama_cpp import Llama

        self.llm = Llama(
            model_path=str(path),
            n_ctx=n_ctx,
            n_threads=n_threads,
            n_threads_batch=n_threads,
            n_batch=512,
            n_ubatch=512,
            logits_all=False,
            verbose=False,
        )

    def prefill(self, prompt: list[int], clock) -> float:
        self.llm.reset()  # n_tokens = 0: eval() drops the old KV entries itself
        t0 = clock()
        self.llm.eval(prompt)
        return clock() - t0

    def decode_at_depth(self, token: int, n_gen: int, clock) -> float:
        """n_gen decode steps on top of the prompt prefilled last; rolls back afterwards."""
        depth = self.llm.n_tokens
        t0 = clock()
        for _ in range(n_gen):
            self.llm.eval([token])
        seconds = clock() - t0
        self.llm.n_tokens = depth  # eval() removes KV entries past n_tokens
        return seconds


def _q8_copy(cache: KVCache) -> KVCache:
    """A q8_0 cache holding the f16 cache's rows (quantized), same capacity and tokens."""
    n_layers, capacity, n_kv, head_dim = cache.k.shape
    copy = KVCache(n_layers, capacity, n_kv, head_dim, KvCacheType.Q8_0)
    n = cache.n_tokens
    for layer in range(n_layers):
        copy.k[layer, :n] = quantize_q8_0(cache.k[layer, :n].astype(np.float32))
        copy.v[layer, :n] = quantize_q8_0(cache.v[layer, :n].astype(np.float32))
    copy.commit(cache.tokens)
    return copy


def _decode(model, cache: KVCache, token: int, n_gen: int, clock) -> float:
    depth = cache.n_tokens
    t0 = clock()
    for _ in range(n_gen):
        model.forward([token], cache)
    seconds = clock() - t0
    cache.truncate(depth)
    return seconds


def speed(args) -> int:
    clock = CLOCKS[args.clock]
    path = resolve_model_path(args.model)
    n_ctx = args.depth + args.n_gen + 8
    ours = load_model(path, n_ctx=n_ctx, n_threads=args.threads)
    model = ours.model
    theirs = LlamaCppSide(path, n_ctx, args.threads)
    rng = np.random.default_rng(1234)
    prompt = [int(i) for i in rng.integers(0, ours.config.n_vocab, args.depth)]
    token = int(rng.integers(0, ours.config.n_vocab))

    # Warm-up: a short prefill and decode on each side (kernels, pools, pages of the weights).
    warm = model.new_cache(80)
    model.forward(prompt[:64], warm)
    _decode(model, warm, token, 4, clock)
    theirs.prefill(prompt[:64], clock)
    theirs.decode_at_depth(token, 4, clock)

    runs: dict[str, list[float]] = {
        k: [] for k in ("ours_pp", "llama_pp", "ours_tg_f16", "ours_tg_q8_0", "llama_tg")
    }
    kv_bytes = {}
    for r in range(args.rounds):
        cache = model.new_cache(n_ctx)
        t0 = clock()
        model.forward(prompt, cache)
        sample = {"ours_pp": args.depth / (clock() - t0)}
        sample["ours_tg_f16"] = args.n_gen / _decode(model, cache, token, args.n_gen, clock)
        q8 = _q8_copy(cache)
        sample["ours_tg_q8_0"] = args.n_gen / _decode(model, q8, token, args.n_gen, clock)
        kv_bytes = {"f16": cache.nbytes, "q8_0": q8.nbytes}
        del cache, q8
        sample["llama_pp"] = args.depth / theirs.prefill(prompt, clock)
        sample["llama_tg"] = args.n_gen / theirs.decode_at_depth(token, args.n_gen, clock)
        for k, v in sample.items():
            runs[k].append(v)
        print(f"round {r}: " + "  ".join(f"{k} {v:7.2f}" for k, v in sample.items()), flush=True)

    med = {k: statistics.median(v) for k, v in runs.items()}

    def paired(ours_key: str, theirs_key: str) -> float:
        return statistics.median(
            o / t for o, t in zip(runs[ours_key], runs[theirs_key], strict=True)
        )

    print()
    print(
        f"model {path.name}, threads {args.threads}, pp{args.depth} / tg{args.n_gen} at depth "
        f"{args.depth}, {args.rounds} rounds, {args.clock} clock, medians (tok/s); "
        f"load average {os.getloadavg()[0]:.1f}"
    )
    print("| test | ours | llama.cpp | ratio of medians | median of paired ratios |")
    print("|---|---|---|---|---|")
    rows = [
        (f"pp{args.depth}", "ours_pp", "llama_pp"),
        (f"tg{args.n_gen} @ d{args.depth}, f16 KV", "ours_tg_f16", "llama_tg"),
        (f"tg{args.n_gen} @ d{args.depth}, q8_0 KV (ours)", "ours_tg_q8_0", "llama_tg"),
    ]
    for label, o, t in rows:
        print(
            f"| {label} | {med[o]:.2f} | {med[t]:.2f} | {med[o] / med[t]:.2f}x | "
            f"{paired(o, t):.2f}x |"
        )
    mib = {k: v / 2**20 for k, v in kv_bytes.items()}
    print(f"our KV cache at {n_ctx} tokens: f16 {mib['f16']:.1f} MiB, q8_0 {mib['q8_0']:.1f} MiB")
    print(
        json.dumps(
            {
                "model": path.name,
                "threads": args.threads,
                "depth": args.depth,
                "n_gen": args.n_gen,
                "clock": args.clock,
                "runs": runs,
                "medians": med,
                "kv_bytes": kv_bytes,
                "fallbacks": dict(getattr(ours.backend, "fallbacks", {})),
                "loadavg": os.getloadavg()[0],
            }
        )
    )
    return 0


def _log_softmax(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.float64)
    x = x - x.max(axis=-1, keepdims=True)
    return x - np.log(np.exp(x).sum(axis=-1, keepdims=True))


def _llama_logit_error(path: Path, text: str, depth: int, stride: int, n_threads: int) -> dict:
    """llama.cpp's own f16 vs q8_0 KV cache error on the same text (its q8_0 V cache needs
    flash attention, so both runs use it): the yardstick for ours."""
    from llama_cpp import Llama

    scores = {}
    for name, kv in (("f16", {}), ("q8_0", {"type_k": 8, "type_v": 8})):  # 8 = GGML_TYPE_Q8_0
        llm = Llama(
            model_path=str(path),
            n_ctx=depth + 8,
            n_batch=512,
            n_ubatch=512,
            n_threads=n_threads,
            logits_all=True,
            flash_attn=True,
            verbose=False,
            **kv,
        )
        ids = llm.tokenize(text.encode())[:depth]
        llm.eval(ids)
        at = list(range(len(ids) - 1, -1, -stride))[::-1]
        scores[name] = np.array(llm.scores[at], dtype=np.float64)
        del llm
    return _errors(scores["f16"], scores["q8_0"])


def _errors(a: np.ndarray, b: np.ndarray) -> dict:
    lp, lq = _log_softmax(a), _log_softmax(b)
    kl = (np.exp(lp) * (lp - lq)).sum(axis=-1)
    return {
        "max_abs_logit_diff": float(np.abs(a - b).max()),
        "mean_abs_logit_diff": float(np.abs(a - b).mean()),
        "kl_mean": float(kl.mean()),
        "kl_max": float(kl.max()),
        "top1_agreement": float((a.argmax(-1) == b.argmax(-1)).mean()),
    }


def logit_error(args) -> int:
    path = resolve_model_path(args.model)
    lm = load_model(path, n_ctx=args.depth, n_threads=args.threads)
    root = Path(__file__).resolve().parent.parent
    text = "\n".join(p.read_text() for p in sorted((root / "engine").rglob("*.py")))
    ids = lm.tokenizer.encode(text)[: args.depth]
    # Every STRIDE-th position (the last included): all 4,096 rows of a 151k vocabulary would be
    # 2.5 GB per cache type.
    at = list(range(len(ids) - 1, -1, -args.logit_stride))[::-1]
    logits = {}
    nbytes = {}
    for cache_type in (KvCacheType.F16, KvCacheType.Q8_0):
        lm.model.cache_type = cache_type
        cache = lm.model.new_cache(len(ids))
        logits[cache_type] = lm.model.forward(ids, cache, logits_at=at)
        nbytes[cache_type] = cache.nbytes
    lm.model.cache_type = KvCacheType.F16
    a, b = logits[KvCacheType.F16], logits[KvCacheType.Q8_0]
    result = {
        "model": path.name,
        "tokens": len(ids),
        "positions_compared": len(at),
        **_errors(a, b),
        "logit_range_f16": float(a.max() - a.min()),
        "kv_bytes_f16": nbytes[KvCacheType.F16],
        "kv_bytes_q8_0": nbytes[KvCacheType.Q8_0],
    }
    print(
        f"model {path.name}, {len(ids)} tokens of engine/*.py source (logits at {len(at)} "
        f"positions), f16 vs q8_0 KV cache:\n"
        f"  max |dlogit| {result['max_abs_logit_diff']:.4f} (mean {result['mean_abs_logit_diff']:.5f},"
        f" f16 logit range {result['logit_range_f16']:.1f})\n"
        f"  KL(f16 || q8_0) per position: mean {result['kl_mean']:.2e}, max {result['kl_max']:.2e}\n"
        f"  top-1 agreement {result['top1_agreement']:.4f}\n"
        f"  KV bytes f16 {nbytes[KvCacheType.F16] / 2**20:.1f} MiB, q8_0 "
        f"{nbytes[KvCacheType.Q8_0] / 2**20:.1f} MiB "
        f"({nbytes[KvCacheType.Q8_0] / nbytes[KvCacheType.F16]:.3f}x)"
    )
    if args.peer:
        peer = _llama_logit_error(path, text, args.depth, args.logit_stride, args.threads)
        result["llama_cpp"] = peer
        print(
            f"  llama.cpp on the same text, f16 vs q8_0 KV: max |dlogit| "
            f"{peer['max_abs_logit_diff']:.4f}, KL mean {peer['kl_mean']:.2e} max "
            f"{peer['kl_max']:.2e}, top-1 agreement {peer['top1_agreement']:.4f}"
        )
    print(json.dumps(result))
    return 0


def kernel(args) -> int:
    from engine.kernels.jit_backend import JitBackend

    backend = JitBackend(n_threads=args.threads)
    rng = np.random.default_rng(0)
    n_head, n_kv, head_dim = KERNEL_SHAPES[args.shape]
    depth = args.depth
    # One cache per layer, cycled through: a whole model's KV at depth is far larger than L3,
    # so each call streams its rows from memory as a decode step does.
    caches: dict[str, list[tuple[np.ndarray, np.ndarray]]] = {"f16": [], "q8_0": []}
    for _ in range(args.layers):
        k = rng.standard_normal((depth + 1, n_kv, head_dim)).astype(np.float32)
        v = rng.standard_normal((depth + 1, n_kv, head_dim)).astype(np.float32)
        caches["f16"].append((k.astype(np.float16), v.astype(np.float16)))
        caches["q8_0"].append((quantize_q8_0(k), quantize_q8_0(v)))
    result = {}
    for cache_type, layers in caches.items():
        for label, tokens in (("decode", 1), ("prefill32", 32)):
            q = rng.standard_normal((tokens, n_head, head_dim)).astype(np.float32)
            out = np.empty((tokens, n_head * head_dim), np.float32)
            kw = dict(p0=depth + 1 - tokens, scale=head_dim**-0.5, out=out)
            backend.attention(q, *layers[0], **kw)
            cpu, wall = [], []
            for i in range(20 * args.layers):
                t0, w0 = time.process_time(), time.perf_counter()
                backend.attention(q, *layers[i % args.layers], **kw)
                cpu.append(time.process_time() - t0)
                wall.append(time.perf_counter() - w0)
            result[f"{label}_{cache_type}_cpu_ms"] = statistics.median(cpu) * 1e3
            result[f"{label}_{cache_type}_wall_ms"] = statistics.median(wall) * 1e3
    backend.close()
    print(
        f"{args.shape} ({n_head} heads, {n_kv} kv, head_dim {head_dim}), depth {depth}, "
        f"{args.threads} thread(s):"
    )
    print(" ".join(f"{k}={v:.3f}" for k, v in result.items()), dict(backend.fallbacks))
    print(json.dumps({"depth": depth, "shape": args.shape, "threads": args.threads, **result}))
    return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model")
    ap.add_argument("--depth", type=int, default=4096, help="prompt tokens / decode depth")
    ap.add_argument("-n", "--n-gen", type=int, default=32, help="decode steps at depth")
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("-r", "--rounds", type=int, default=3)
    ap.add_argument("--clock", choices=sorted(CLOCKS), default="wall")
    ap.add_argument("--logit-error", action="store_true", help="q8_0 vs f16 logits instead")
    ap.add_argument("--logit-stride", type=int, default=16, help="compare every Nth position")
    ap.add_argument("--kernel", action="store_true", help="time the attention op alone")
    ap.add_argument("--shape", choices=sorted(KERNEL_SHAPES), default="qwen1.5b")
    ap.add_argument(
        "--layers", type=int, default=1, help="--kernel: distinct caches cycled (30: from DRAM)"
    )
    ap.add_argument(
        "--peer", action="store_true", help="with --logit-error: llama.cpp's own q8_0 KV error"
    )
    args = ap.parse_args(argv)
    if args.kernel:
        return kernel(args)
    return logit_error(args) if args.logit_error else speed(args)


if __name__ == "__main__":
    sys.exit(main())
