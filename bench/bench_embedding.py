"""Embedding throughput side by side: our engine (engine.embedding.Embedder) vs llama.cpp's
embedding mode (llama_cpp.Llama(model_path, embedding=True)) on the same GGUF.

Each engine runs in its own spawned worker process (neither shares the other's threads, allocator
or OpenMP runtime) and loads the file once; then each round embeds the same corpus, ours then
llama.cpp's, alternately, so load from other processes on the machine hits both alike. The corpus
is generated (seeded): N document-like chunks of 3-14 sentences (about 40-250 tokens each,
truncated at the model's limit), embedded in one call per round, as an indexer does. After one
warm-up round, medians of texts/s and tokens/s ([CLS] and [SEP] included) by the wall clock and
of tokens per CPU-second (the worker's CPU time, all threads) are printed per side,
with the ratio of the medians, the median of the per-round ratios, and the lowest cosine between
the two engines' vectors of the same text (they run the same model, so ~1.0).

Usage: python bench/bench_embedding.py [MODEL] [-n 200] [-t 2] [-r 5] [--json]
MODEL: an embedding GGUF (bert / nomic-bert) or "default" (all-MiniLM-L6-v2 from set-up).
llama-cpp-python is the `peer` extra (tools/bootstrap.sh test,peer builds it).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import random
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

SENTENCES = [
    "The quarterly report shows revenue grew by twelve percent over the previous year.",
    "Install the package with pip and run the set-up script before the first launch.",
    "Photosynthesis converts light energy into chemical energy stored in glucose.",
    "The court ruled that the contract was void because one party lacked capacity.",
    "Use a context manager so the file is closed even when an exception is raised.",
    "Mount Everest's summit is 8,849 metres above sea level according to the 2020 survey.",
    "Our support team answers within two business days; urgent issues go to on-call.",
    "A hash table gives constant expected time for inserts, lookups and deletions.",
    "The recipe calls for two eggs, a cup of flour and a pinch of salt.",
    "Encrypted PDF files are skipped with a message naming the file and the reason.",
    "Rain is expected over the weekend, with temperatures dropping to four degrees.",
    "Each chunk keeps its page number and heading so that citations can open it.",
    "Die Bahn verkehrt wegen Bauarbeiten zwischen Köln und Bonn nur stündlich.",
    "Le musée est fermé le lundi et ouvre à dix heures les autres jours.",
    "Refunds are issued to the original payment method within fourteen days.",
    "The mitochondria is where most of the cell's ATP is produced.",
    "Set the environment variable before starting the server, then restart it.",
    "Version 2.3 fixes a crash when the configuration file contains a tab.",
]


def corpus(n: int, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    return [" ".join(rng.choices(SENTENCES, k=rng.randint(3, 14))) for _ in range(n)]


class Ours:
    def __init__(self, path: str, threads: int):
        from engine.embedding import Embedder

        self.embedder = Embedder.load(path, n_threads=threads)

    def embed(self, texts: list[str]) -> np.ndarray:
        return self.embedder.embed(texts)

    def tokens(self, texts: list[str]) -> int:
        return sum(len(self.embedder.token_ids(t)) for t in texts)


class LlamaCpp:
    def __init__(self, path: str, threads: int, batch: int):
        import llama_cpp

        # batch: tokens per llama_decode (n_ctx = n_batch = n_ubatch; every text must fit in
        # one). llama.cpp attends over the whole ubatch with a mask, so its attention cost grows
        # with the square of the batch, not of each text: on MiniLM (limit 256) it managed 1176
        # tokens per CPU-second at 256, 548 at 512 and 468 at 1024, so the default is the limit.
        self.model = llama_cpp.Llama(
            model_path=path,
            embedding=True,
            n_ctx=batch,
            n_batch=batch,
            n_ubatch=batch,
            n_threads=threads,
            n_threads_batch=threads,
            verbose=False,
        )

    def embed(self, texts: list[str]) -> np.ndarray:
        return np.asarray(self.model.embed(texts, normalize=True, truncate=True), np.float32)


def _worker(side: str, path: str, threads: int, batch: int, conn) -> None:
    engine = Ours(path, threads) if side == "ours" else LlamaCpp(path, threads, batch)
    conn.send("ready")
    while (texts := conn.recv()) is not None:
        cpu0, start = _cpu_seconds(), time.perf_counter()
        vectors = engine.embed(texts)
        conn.send((time.perf_counter() - start, _cpu_seconds() - cpu0, vectors))


def _cpu_seconds() -> float:
    """This process's CPU time, all threads (a side that spins while it waits pays for it)."""
    t = os.times()
    return t.user + t.system


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", nargs="?", default="default")
    parser.add_argument("-n", "--texts", type=int, default=200)
    parser.add_argument("-t", "--threads", type=int, default=2)
    parser.add_argument("-r", "--rounds", type=int, default=5)
    parser.add_argument(
        "--peer-batch",
        type=int,
        default=None,
        help="llama.cpp's n_batch = n_ubatch = n_ctx (default: the model's token limit, its "
        "fastest setting; at least that)",
    )
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()

    from engine.embedding import default_embedding_model_path

    path = str(default_embedding_model_path() if args.model == "default" else args.model)
    texts = corpus(args.texts)
    probe = Ours(path, 1)
    n_tokens = probe.tokens(texts)  # the same ids both engines run (tests check ids)
    if args.peer_batch is None:
        args.peer_batch = probe.embedder.max_tokens
    probe.embedder.close()

    ctx = mp.get_context("spawn")
    sides = {}
    for side in ("ours", "llama.cpp"):
        parent, child = ctx.Pipe()
        proc = ctx.Process(
            target=_worker, args=(side, path, args.threads, args.peer_batch, child), daemon=True
        )
        proc.start()
        if parent.recv() != "ready":
            raise SystemExit(f"{side} worker failed to start")
        sides[side] = (proc, parent)

    seconds: dict[str, list[float]] = {s: [] for s in sides}
    cpu: dict[str, list[float]] = {s: [] for s in sides}
    vectors: dict[str, np.ndarray] = {}
    for round_no in range(args.rounds + 1):  # round 0 warms up
        for side, (_, conn) in sides.items():
            conn.send(texts)
            took, cpu_took, vecs = conn.recv()
            vectors[side] = vecs
            if round_no:
                seconds[side].append(took)
                cpu[side].append(cpu_took)
    for proc, conn in sides.values():
        conn.send(None)
        proc.join(timeout=10)

    ours, peer = vectors["ours"], vectors["llama.cpp"]
    agreement = float(np.min(np.sum(ours * peer, axis=1)))
    rows = {}
    for side, times in seconds.items():
        med = statistics.median(times)
        rows[side] = {
            "texts_per_s": len(texts) / med,
            "tokens_per_s": n_tokens / med,
            "rounds_s": [round(t, 4) for t in times],
            "tokens_per_cpu_s": n_tokens / statistics.median(cpu[side]),
            "rounds_cpu_s": [round(t, 4) for t in cpu[side]],
        }
    paired = [p / o for o, p in zip(seconds["ours"], seconds["llama.cpp"], strict=True)]
    result = {
        "model": Path(path).name,
        "threads": args.threads,
        "peer_batch": args.peer_batch,
        "texts": len(texts),
        "tokens": n_tokens,
        "sides": rows,
        "ratio_of_medians": rows["ours"]["texts_per_s"] / rows["llama.cpp"]["texts_per_s"],
        "median_paired_ratio": statistics.median(paired),
        "min_cosine_ours_vs_llama_cpp": agreement,
    }
    if args.json:
        print(json.dumps(result))
        return 0
    print(
        f"{result['model']}: {len(texts)} texts, {n_tokens} tokens, {args.threads} threads, "
        f"{args.rounds} rounds (after a warm-up), llama.cpp batch {args.peer_batch}"
    )
    print("| engine | texts/s | tokens/s | tokens per CPU-second | rounds: wall s (CPU s) |")
    print("|---|---|---|---|---|")
    for side, row in rows.items():
        shown = " / ".join(
            f"{w:.2f} ({c:.2f})" for w, c in zip(row["rounds_s"], row["rounds_cpu_s"], strict=True)
        )
        print(
            f"| {side} | {row['texts_per_s']:.1f} | {row['tokens_per_s']:.0f} | "
            f"{row['tokens_per_cpu_s']:.0f} | {shown} |"
        )
    print(
        f"ours / llama.cpp: {result['ratio_of_medians']:.2f}x (ratio of medians), "
        f"{result['median_paired_ratio']:.2f}x (median of paired ratios); lowest cosine between "
        f"the engines' vectors: {agreement:.6f}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
