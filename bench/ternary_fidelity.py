"""Which side is right on the ternary types (TQ1_0 / TQ2_0): teacher-forced logits of one file
from llama.cpp, our JIT kernels and our numpy reference, each against a float64 judge.

    .venv/bin/python bench/ternary_fidelity.py MODEL.gguf [--engines q8k,q8k-jitter,numpy,jit,llamacpp]
    .venv/bin/python bench/ternary_fidelity.py OUT.gguf --requantize SRC.gguf --type TQ1_0

`--requantize` first writes OUT.gguf (if absent) from SRC.gguf with llama.cpp's quantizer, as
tools/make_quant_variants.py does (every `blk.*` weight whose rows fit the type's blocks).

The judge is the numpy reference backend with every mat-mul replaced by gguf-py's dequantizer
(an implementation independent of ours) times the activations, both in float64. `q8k` is the
judge with the activations of every mat-mul whose llama.cpp dot product runs on q8_K (the
ternary and K-quant types: every weight of a ternary-requantized Qwen2.5 file) first rounded the
way llama.cpp's CPU backend rounds them (ggml's quantize_row_q8_K: int8 with one float scale per
256 values), the only arithmetic llama.cpp's ternary dot products add to the exact weights
(tests/test_ternary_fidelity.py checks that on one layer). `q8k-jitter` is `q8k` with every
rounded activation first scaled by (1 + 2^-20), a change the size of float32 summation-order
noise: how far two runs of the same 8-bit arithmetic drift apart on this model. If llama.cpp's
logits sit close to `q8k` and far from the judge, llama.cpp's 8-bit activations are the
difference. Metrics per engine, over every position of the text (ids from llama.cpp's tokenizer
when llama-cpp-python is installed, else ours): the largest and mean |log-prob difference| over
the judge's top 5 ids, and at how many positions the argmax differs where the judge's top-1
margin is >= 0.5 nat. llama-cpp-python is optional (not a project dependency).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

TEXT = (
    "def fibonacci(n):\n"
    '    """Return the n-th Fibonacci number."""\n'
    "    a, b = 0, 1\n"
    "    for _ in range(n):\n"
    "        a, b = b, a + b\n"
    "    return a\n\n"
    "The function above runs in linear time and uses constant memory."
)
CLEAR_MARGIN = 0.5  # nat: positions where the judge's top-1 is clearly ahead
TOP = 5


def q8k_round_trip(x: np.ndarray) -> np.ndarray:
    """Rows of x through ggml's quantize_row_q8_K_ref (float64 result): per 256 values,
    iscale = -127 / (the value of largest magnitude, with its sign), q = min(127, round(iscale *
    x)), back as q / iscale. Written from ggml-quants.c, not from our kernels."""
    b = np.asarray(x, dtype=np.float32).reshape(x.shape[0], -1, 256)
    at = np.abs(b).argmax(axis=-1)[..., None]
    mx = np.take_along_axis(b, at, axis=-1)
    safe = np.where(mx == 0, np.float32(1), mx)
    iscale = np.where(mx == 0, np.float32(0), np.float32(-127.0) / safe).astype(np.float32)
    q = np.minimum(np.float32(127), np.rint(iscale * b))  # ggml's nearest_int: round half even
    d = np.where(mx == 0, np.float32(0), np.float32(1) / np.where(iscale == 0, 1, iscale))
    return (q.astype(np.float64) * d.astype(np.float32).astype(np.float64)).reshape(x.shape)


def judge_backend(round_like_llama_cpp: bool, jitter: float = 1.0):
    """The numpy reference with float64 mat-muls over gguf-py's dequantization."""
    from gguf import GGMLQuantizationType as Q
    from gguf.quants import dequantize as gguf_dequantize

    # ggml-cpu's type_traits_cpu: the types whose vec_dot_type is GGML_TYPE_Q8_K
    Q8K_TYPES = (Q.TQ1_0, Q.TQ2_0, Q.Q2_K, Q.Q3_K, Q.Q4_K, Q.Q5_K, Q.Q6_K)

    from engine.kernels.reference import ReferenceBackend

    class Judge(ReferenceBackend):
        name = "judge-q8k" if round_like_llama_cpp else "judge"

        def linear(self, w, x, out=None):
            if w.qtype in (Q.F32, Q.F16, Q.BF16):
                dense = np.asarray(w.data, dtype=np.float64).reshape(w.rows, w.cols)
            else:
                dense = gguf_dequantize(np.asarray(w.data), w.qtype).reshape(w.rows, w.cols)
            xx = np.asarray(x, dtype=np.float64)
            if round_like_llama_cpp and w.qtype in Q8K_TYPES:
                xx = q8k_round_trip(np.asarray(x, dtype=np.float32) * np.float32(jitter))
            y = (xx @ dense.astype(np.float64).T).astype(np.float32)
            if out is None:
                return y
            out[...] = y
            return out

    return Judge()


def log_softmax(z: np.ndarray) -> np.ndarray:
    z = z.astype(np.float64)
    z = z - z.max(axis=-1, keepdims=True)
    return z - np.log(np.exp(z).sum(axis=-1, keepdims=True))


def engine_logits(path: Path, ids: list[int], which: str) -> np.ndarray:
    from engine.loader import load_model

    if which == "jit":
        os.environ.pop("LOCALCHAT_KERNELS", None)
    else:
        os.environ["LOCALCHAT_KERNELS"] = "numpy"
    lm = load_model(path, n_ctx=512)
    if which in ("judge", "q8k", "q8k-jitter"):
        jitter = 1.0 + 2.0**-20 if which == "q8k-jitter" else 1.0
        lm.model.backend = judge_backend(which != "judge", jitter)
    cache = lm.model.new_cache(512)
    return lm.model.forward(ids, cache, all_logits=True).astype(np.float64)


def llamacpp_logits(path: Path, ids: list[int]) -> np.ndarray:
    from llama_cpp import Llama

    llm = Llama(str(path), n_ctx=512, logits_all=True, verbose=False, n_threads=2)
    llm.eval(ids)
    return np.array(llm.scores[: len(ids)], dtype=np.float64)


def token_ids(path: Path) -> list[int]:
    try:
        from llama_cpp import Llama

        llm = Llama(str(path), n_ctx=512, vocab_only=True, verbose=False)
        return list(llm.tokenize(TEXT.encode(), add_bos=False))
    except ImportError:
        from engine.loader import load_model

        return list(load_model(path, n_ctx=512).tokenizer.encode(TEXT))


def compare(judge: np.ndarray, other: np.ndarray) -> tuple[float, float, int, int]:
    lj, lo = log_softmax(judge), log_softmax(other)
    top = np.argsort(-lj, axis=-1)[:, :TOP]
    diff = np.abs(np.take_along_axis(lj, top, -1) - np.take_along_axis(lo, top, -1))
    srt = np.sort(judge, axis=-1)
    clear = (srt[:, -1] - srt[:, -2]) >= CLEAR_MARGIN
    flips = int(np.sum(clear & (judge.argmax(-1) != other.argmax(-1))))
    return float(diff.max()), float(diff.mean()), flips, int(clear.sum())


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("model", type=Path)
    ap.add_argument("--engines", default="q8k,q8k-jitter,numpy,jit,llamacpp")
    ap.add_argument("--requantize", type=Path, metavar="SRC")
    ap.add_argument("--type", default="TQ1_0", choices=["TQ1_0", "TQ2_0"])
    args = ap.parse_args()
    if args.requantize is not None and not args.model.exists():
        from gguf import GGMLQuantizationType

        from tools.make_quant_variants import _ggml, requantize

        n = requantize(args.requantize, args.model, GGMLQuantizationType[args.type], _ggml())
        print(f"wrote {args.model} ({n} tensors {args.type})")
    ids = token_ids(args.model)
    judge = engine_logits(args.model, ids, "judge")
    print(f"{args.model.name}: {len(ids)} positions, float64 judge vs each engine")
    print(f"| engine | max top-{TOP} logprob diff | mean | argmax flips (judge margin >= 0.5) |")
    print("|---|---|---|---|")
    results = {}
    for which in args.engines.split(","):
        if which == "llamacpp":
            logits = llamacpp_logits(args.model, ids)
        else:
            logits = engine_logits(args.model, ids, which)
        results[which] = logits
        mx, mean, flips, clear = compare(judge, logits)
        print(f"| {which} | {mx:.3f} | {mean:.3f} | {flips} of {clear} |", flush=True)
    # the framing, llama.cpp as the reference (its top 5, its margins), and llama.cpp
    # against its own arithmetic emulated over the judge's weights
    for which in ("jit", "numpy", "q8k", "q8k-jitter"):
        if "llamacpp" in results and which in results:
            mx, mean, flips, clear = compare(results["llamacpp"], results[which])
            print(f"| {which} vs llamacpp | {mx:.3f} | {mean:.3f} | {flips} of {clear} |")
    if "q8k" in results and "q8k-jitter" in results:
        mx, mean, flips, clear = compare(results["q8k"], results["q8k-jitter"])
        print(f"| q8k-jitter vs q8k | {mx:.3f} | {mean:.3f} | {flips} of {clear} |")


if __name__ == "__main__":
    main()
