"""`python -m engine embed MODEL TEXT [TEXT ...] [--json]`: embed texts with a GGUF embedding
model (engine/embedding.py) and print the vectors. MODEL is a path, or `default` for the
default embedding model (all-MiniLM-L6-v2 in the models cache)."""

from __future__ import annotations

import argparse
import json
import time

import numpy as np

PREVIEW_VALUES = 6  # values shown per vector without --json (the JSON has all of them)


def add_embed_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("model", help="GGUF embedding model (bert / nomic-bert), or 'default'")
    p.add_argument("texts", nargs="+", metavar="TEXT", help="texts to embed, one vector each")
    p.add_argument("--json", action="store_true", help="every vector in full, as JSON")
    p.add_argument(
        "--threads",
        type=int,
        default=None,
        help="worker threads for the kernels, 1 to 256 (default: physical cores)",
    )


def cmd_embed(args) -> int:
    from engine.embedding import Embedder, default_embedding_model_path

    path = default_embedding_model_path() if args.model == "default" else args.model
    with Embedder.load(path, n_threads=args.threads) as embedder:
        started = time.perf_counter()
        vectors = embedder.embed(args.texts)
        seconds = time.perf_counter() - started
        counts = [embedder.count_tokens(text) for text in args.texts]
        limit = embedder.max_tokens
        if args.json:
            print(
                json.dumps(
                    {
                        "model": embedder.model_id,
                        "architecture": embedder.config.arch,
                        "dim": embedder.dim,
                        "pooling": embedder.pooling.name.lower(),
                        "max_tokens": limit,
                        "seconds": round(seconds, 4),
                        "embeddings": [
                            {
                                "text": text,
                                "tokens": min(n, limit),
                                "truncated": n > limit,
                                "embedding": [float(v) for v in row],
                            }
                            for text, n, row in zip(args.texts, counts, vectors, strict=True)
                        ],
                    },
                    ensure_ascii=False,
                )
            )
            return 0
        print(
            f"{embedder.model_id}: {embedder.config.arch}, dim {embedder.dim}, "
            f"{embedder.pooling.name.lower()} pooling, {len(vectors)} text(s) in {seconds:.3f} s"
        )
        for text, n, row in zip(args.texts, counts, vectors, strict=True):
            note = f", truncated to {limit}" if n > limit else ""
            print(f"{_short(text)!r} ({n} tokens{note}): {_preview(row)}")
    return 0


def _short(text: str, width: int = 48) -> str:
    return text if len(text) <= width else text[: width - 1] + "…"


def _preview(row: np.ndarray) -> str:
    shown = " ".join(f"{v:+.4f}" for v in row[:PREVIEW_VALUES])
    return f"[{shown} ...]" if row.size > PREVIEW_VALUES else f"[{shown}]"
