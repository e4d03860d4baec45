"""Write a Qwen2.5-7B-shaped Q4_K_M GGUF with random weights, for speed and memory runs only:

    python -m tools.make_synthetic_7b            # prints the path (4.7 GB; first run ~20 min)
    python -m tools.make_synthetic_7b --layers 2 # a 2-layer file of the same widths (quick check)

No real 7B-8B file is installable here (issue 11), so the file is synthetic: the shapes of
Qwen2.5-7B (hidden 3584, 28 layers, 28 query heads over 4 KV heads of 128, FFN 18944, q/k/v
biases, untied output), written as F16 with gguf-py one tensor at a time (never the whole 15 GB in
memory), then quantized to Q4_K_M by llama.cpp's own quantizer (`llama_model_quantize` from
llama-cpp-python, the `peer` extra), so the file has llama.cpp's real Q4_K/Q6_K mix. The F16
intermediate (15.2 GB on disk) is deleted afterwards. Output goes to ~/.cache/localchat-bench/ and is never
committed; tests never make it.

The tokenizer (and chat template) is copied from the Qwen2.5-Coder-1.5B GGUF, so prompts tokenize
as they would for a real Qwen2.5 model; the vocabulary dimension of token_embd/output is the
number of tokens it holds (151936).

Weights are N(0, 0.02) like a freshly initialised transformer: with RMSNorm in front of every
projection, each mat-vec output has std ~0.02 * sqrt(fan_in) (~1.2 for 3584 inputs, ~2.8 for the
FFN's 18944), far from F16's range, so both engines run it without inf/NaN. The random values
come from one 64 Mi-value pool read at random offsets: drawing 7.6 billion normals would cost
minutes of CPU that buy nothing for a speed run.
"""

from __future__ import annotations

import argparse
import ctypes
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np

TOKENIZER_SOURCE = (
    Path.home() / ".cache" / "LocalChat" / "models" / "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf"
)
OUTPUT_DIR = Path.home() / ".cache" / "localchat-bench"
WEIGHT_STD = 0.02
POOL_VALUES = 1 << 26
LLAMA_FTYPE_MOSTLY_Q4_K_M = 15


@dataclass(frozen=True)
class Shape:
    """Qwen2.5-7B's widths (config.json of Qwen/Qwen2.5-7B-Instruct)."""

    n_layers: int = 28
    hidden: int = 3584
    ffn: int = 18944
    n_heads: int = 28
    n_kv_heads: int = 4
    head_dim: int = 128
    context: int = 32768
    rope_base: float = 1_000_000.0
    rms_eps: float = 1e-6


def output_path(n_layers: int) -> Path:
    suffix = "" if n_layers == Shape.n_layers else f"-{n_layers}layers"
    return OUTPUT_DIR / f"synthetic-qwen2.5-7b{suffix}-q4_k_m.gguf"


def tensor_plan(shape: Shape, vocab: int) -> list[tuple[str, tuple[int, ...]]]:
    """(name, numpy shape: rows x columns) of every tensor, in llama.cpp's qwen2 naming."""
    q_rows = shape.n_heads * shape.head_dim
    kv_rows = shape.n_kv_heads * shape.head_dim
    plan: list[tuple[str, tuple[int, ...]]] = [("token_embd.weight", (vocab, shape.hidden))]
    for i in range(shape.n_layers):
        b = f"blk.{i}."
        plan += [
            (b + "attn_norm.weight", (shape.hidden,)),
            (b + "attn_q.weight", (q_rows, shape.hidden)),
            (b + "attn_q.bias", (q_rows,)),
            (b + "attn_k.weight", (kv_rows, shape.hidden)),
            (b + "attn_k.bias", (kv_rows,)),
            (b + "attn_v.weight", (kv_rows, shape.hidden)),
            (b + "attn_v.bias", (kv_rows,)),
            (b + "attn_output.weight", (shape.hidden, q_rows)),
            (b + "ffn_norm.weight", (shape.hidden,)),
            (b + "ffn_gate.weight", (shape.ffn, shape.hidden)),
            (b + "ffn_up.weight", (shape.ffn, shape.hidden)),
            (b + "ffn_down.weight", (shape.hidden, shape.ffn)),
        ]
    plan += [("output_norm.weight", (shape.hidden,)), ("output.weight", (vocab, shape.hidden))]
    return plan


def is_matrix(name: str, dims: tuple[int, ...]) -> bool:
    return len(dims) == 2 and name.endswith(".weight")


class RandomPool:
    """Random F16 values: one N(0, WEIGHT_STD) pool, each tensor row a window at a random offset."""

    def __init__(self, seed: int) -> None:
        self.rng = np.random.default_rng(seed)
        pool = self.rng.standard_normal(POOL_VALUES, dtype=np.float32) * WEIGHT_STD
        self.pool = pool.astype(np.float16)

    def matrix(self, rows: int, cols: int) -> np.ndarray:
        out = np.empty((rows, cols), dtype=np.float16)
        offsets = self.rng.integers(0, POOL_VALUES - cols, size=rows)
        for r, start in enumerate(offsets):
            out[r] = self.pool[start : start + cols]
        return out


def copy_tokenizer(writer, source: Path) -> int:
    """Copies every tokenizer.* key of `source` into `writer`; returns the vocabulary size."""
    import gguf

    reader = gguf.GGUFReader(source)
    vocab = 0
    for key, field in reader.fields.items():
        if not key.startswith("tokenizer."):
            continue
        main = field.types[0]
        sub = field.types[-1] if main == gguf.GGUFValueType.ARRAY else None
        value = field.contents()
        writer.add_key_value(key, value, main, sub_type=sub)
        if key == "tokenizer.ggml.tokens":
            vocab = len(value)
    if vocab == 0:
        raise SystemExit(f"{source} holds no tokenizer.ggml.tokens")
    return vocab


def write_f16(path: Path, shape: Shape, seed: int) -> None:
    import gguf

    writer = gguf.GGUFWriter(path, "qwen2")
    writer.add_name("synthetic Qwen2.5-7B shape (random weights)")
    writer.add_block_count(shape.n_layers)
    writer.add_context_length(shape.context)
    writer.add_embedding_length(shape.hidden)
    writer.add_feed_forward_length(shape.ffn)
    writer.add_head_count(shape.n_heads)
    writer.add_head_count_kv(shape.n_kv_heads)
    writer.add_rope_freq_base(shape.rope_base)
    writer.add_layer_norm_rms_eps(shape.rms_eps)
    writer.add_file_type(gguf.LlamaFileType.MOSTLY_F16)
    vocab = copy_tokenizer(writer, TOKENIZER_SOURCE)
    plan = tensor_plan(shape, vocab)
    for name, dims in plan:
        dtype = np.float16 if is_matrix(name, dims) else np.float32
        nbytes = int(np.prod(dims)) * np.dtype(dtype).itemsize
        writer.add_tensor_info(name, dims, np.dtype(dtype), nbytes)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    pool = RandomPool(seed)
    for i, (name, dims) in enumerate(plan):
        if is_matrix(name, dims):
            data = pool.matrix(*dims)
        elif name.endswith("norm.weight"):
            data = np.ones(dims, dtype=np.float32)
        else:  # q/k/v biases
            data = (pool.rng.standard_normal(dims, dtype=np.float32) * WEIGHT_STD).astype(
                np.float32
            )
        writer.write_tensor_data(data)
        del data  # one tensor in memory at a time (token_embd, the largest, is 1.1 GB)
        print(f"\rF16 {i + 1}/{len(plan)} {name:<28}", end="", file=sys.stderr, flush=True)
    print(file=sys.stderr)
    writer.close()


def quantize_q4_k_m(source: Path, target: Path, n_threads: int) -> None:
    import llama_cpp

    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = LLAMA_FTYPE_MOSTLY_Q4_K_M
    params.nthread = n_threads
    rc = llama_cpp.llama_model_quantize(
        str(source).encode(), str(target).encode(), ctypes.byref(params)
    )
    if rc != 0:
        raise SystemExit(f"llama_model_quantize failed ({rc}) on {source}")


def make(n_layers: int, seed: int, n_threads: int) -> Path:
    target = output_path(n_layers)
    if target.exists():
        return target
    OUTPUT_DIR.mkdir(parents=True, exist_ok=True)
    f16 = target.with_suffix(".f16.tmp")
    partial = target.with_suffix(".partial")
    try:
        write_f16(f16, Shape(n_layers=n_layers), seed)
        quantize_q4_k_m(f16, partial, n_threads)
        partial.rename(target)  # only a complete file ever carries the final name
    finally:
        f16.unlink(missing_ok=True)
        partial.unlink(missing_ok=True)
    return target


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--layers", type=int, default=Shape.n_layers, help="default: 28 (7B)")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--threads", type=int, default=2, help="quantizer threads")
    args = parser.parse_args(argv)
    if args.layers < 1:
        parser.error(f"--layers must be >= 1, got {args.layers}")
    print(make(args.layers, args.seed, args.threads))


if __name__ == "__main__":
    main()
