"""Documents: indexing speed on 1,000 generated pages and query latency over 10,000 chunks.

    .venv/bin/python bench/bench_documents.py [--pages 1000] [--chunks 10000] [--queries 50]
        [--embed-model FILE] [--threads N] [--json]

Indexing: `--pages` pages of generated English-like text (a seeded Zipf draw over a few
thousand words, ~280 words a page) written as real PDFs of 50 pages each, indexed with the
default embedding model (all-MiniLM-L6-v2) into a fresh collection: extraction, chunking,
embedding and the SQLite writes, end to end. Reports pages/s and chunks/s, and the share of the
time the embedding took.

Query: a collection of `--chunks` chunks (generated text, 384-dim unit vectors drawn at random,
since search time does not depend on the vectors' values and embedding 10,000 chunks would take
minutes), then `--queries` questions through retrieve(): the query's real embedding, BM25 over
FTS5, the exact matrix product, RRF and fetching the chunks. Median and p90 wall time, the first
(cold: loads the matrix from SQLite) reported apart.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from documents_helpers import HashEmbedder, write_pdf

from engine.documents.chunk import Chunk
from engine.documents.collection import STOPWORDS, Collection
from engine.documents.embedder import TextEmbedder
from engine.documents.index import index_paths
from engine.documents.retrieve import retrieve
from engine.embedding import Embedder, default_embedding_model_path

SYLLABLES = [
    "ka",
    "lo",
    "mi",
    "ne",
    "ru",
    "sa",
    "te",
    "vo",
    "di",
    "pa",
    "ga",
    "li",
    "mo",
    "ro",
    "su",
    "ta",
    "be",
    "fi",
    "na",
    "zo",
]


def vocabulary(n: int, rng: np.random.Generator) -> list[str]:
    """English's function words as the most frequent ranks (as in real text, where they are
    the top of the Zipf curve), then made-up words."""
    words: set[str] = set()
    while len(words) < n:
        words.add("".join(rng.choice(SYLLABLES, size=rng.integers(1, 4))))
    return sorted(STOPWORDS) + sorted(words - STOPWORDS)


def text_lines(rng: np.random.Generator, vocab: list[str], n_words: int) -> list[str]:
    ranks = np.minimum(rng.zipf(1.3, size=n_words), len(vocab)) - 1
    words = [vocab[r] for r in ranks]
    return [" ".join(words[i : i + 14]) + "." for i in range(0, len(words), 14)]


class Precomputed:
    """The embedder, answering embed() for the benchmark's questions from vectors made before."""

    def __init__(self, embedder, vectors: dict) -> None:
        self.dim, self.model_id, self.max_tokens = (
            embedder.dim,
            embedder.model_id,
            embedder.max_tokens,
        )
        self.vectors = vectors

    def count_tokens(self, text: str) -> int:
        raise AssertionError("not used by retrieve()")

    def embed(self, texts, cancel=None):
        return np.concatenate([self.vectors[t] for t in texts])


class HashOnModelTokens(HashEmbedder):
    """The hashed bag of words, counting tokens with the model's tokenizer (same chunks)."""

    def __init__(self, embedder: Embedder) -> None:
        super().__init__(dim=embedder.dim, max_tokens=embedder.max_tokens, model_id="hash")
        self.model = embedder

    def count_tokens(self, text: str) -> int:
        return self.model.count_tokens(text)


class Timed:
    """The embedder, with the time its embed() calls take added up."""

    def __init__(self, embedder: TextEmbedder) -> None:
        self.inner, self.seconds = embedder, 0.0
        self.dim, self.model_id, self.max_tokens = (
            embedder.dim,
            embedder.model_id,
            embedder.max_tokens,
        )

    def count_tokens(self, text: str) -> int:
        return self.inner.count_tokens(text)

    def embed(self, texts, cancel=None):
        t = time.perf_counter()
        try:
            return self.inner.embed(texts, cancel=cancel)
        finally:
            self.seconds += time.perf_counter() - t


def bench_index(embedder: Embedder, pages: int, work: Path, which: str) -> dict:
    rng = np.random.default_rng(34)
    vocab = vocabulary(4000, rng)
    docs = work / "docs"
    docs.mkdir()
    per_file = 50
    for f in range(0, pages, per_file):
        n = min(per_file, pages - f)
        write_pdf(
            docs / f"doc{f // per_file:03d}.pdf", [text_lines(rng, vocab, 280) for _ in range(n)]
        )
    timed = Timed(embedder if which == "model" else HashOnModelTokens(embedder))
    with Collection.open("bench", root=work / "collections") as c:
        report = index_paths(c, [docs], timed)
    assert not report.problems, report.problems
    return {
        "embedder": which,
        "pages": report.pages,
        "chunks": report.chunks,
        "seconds": round(report.elapsed_s, 2),
        "pages_per_s": round(report.pages_per_s, 1),
        "chunks_per_s": round(report.chunks_per_s, 1),
        "embedding_share": round(timed.seconds / report.elapsed_s, 3),
    }


def bench_query(embedder: Embedder, n_chunks: int, n_queries: int, work: Path) -> dict:
    rng = np.random.default_rng(35)
    vocab = vocabulary(4000, rng)
    with Collection.open("query", root=work / "collections") as c:
        c.bind_model(embedder.model_id, embedder.dim, None)
        per_file = 100
        for f in range(0, n_chunks, per_file):
            chunks = []
            for i in range(per_file):
                text = " ".join(text_lines(rng, vocab, 150))
                chunks.append(Chunk(i, text, i // 5 + 1, (), 0, len(text), 200))
            vectors = rng.standard_normal((per_file, embedder.dim)).astype(np.float32)
            vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
            name = f"/virtual/file{f // per_file:04d}.pdf"
            sha = hashlib.sha256(name.encode()).hexdigest()
            c.replace_file(name, sha256=sha, size=1, mtime=0.0, kind="pdf", pages=20,
                           chunks=chunks, embeddings=vectors, problem=None)  # fmt: skip
        assert c.chunk_count() == n_chunks
        questions = [" ".join(text_lines(rng, vocab, 12)) + "?" for _ in range(n_queries + 1)]
        # the query's embedding (the model's speed) and the search (ours) are timed apart
        embed_ms: list[float] = []
        query_vectors: dict[str, np.ndarray] = {}
        for q in questions:
            t = time.perf_counter()
            query_vectors[q] = embedder.embed([q])
            embed_ms.append((time.perf_counter() - t) * 1000)
        known = Precomputed(embedder, query_vectors)
        times = []
        for q in questions:
            t = time.perf_counter()
            result = retrieve(c, known, q)
            times.append((time.perf_counter() - t) * 1000)
            assert len(result.results) == 8
    warm = times[1:]
    return {
        "chunks": n_chunks,
        "queries": n_queries,
        "cold_ms": round(times[0], 1),
        "median_ms": round(statistics.median(warm), 2),
        "p90_ms": round(sorted(warm)[int(0.9 * len(warm))], 2),
        "query_embedding_median_ms": round(statistics.median(embed_ms[1:]), 2),
        "total_median_ms": round(statistics.median(warm) + statistics.median(embed_ms[1:]), 2),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pages", type=int, default=1000)
    ap.add_argument("--chunks", type=int, default=10000)
    ap.add_argument("--queries", type=int, default=50)
    ap.add_argument("--embed-model", default=None)
    ap.add_argument(
        "--index-embedder",
        choices=["model", "hash"],
        default="model",
        help="'hash': index with the tests' hashed bag of words, to time extraction, chunking "
        "and writes without the model (chunk sizes still come from the model's tokenizer)",
    )
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    path = args.embed_model or default_embedding_model_path()
    with (
        Embedder.load(path, n_threads=args.threads) as embedder,
        tempfile.TemporaryDirectory() as tmp,
    ):
        embedder.embed(["warm up the kernels"])
        result: dict[str, Any] = {
            "model": embedder.model_id,
            "index": bench_index(embedder, args.pages, Path(tmp), args.index_embedder),
            "query": bench_query(embedder, args.chunks, args.queries, Path(tmp)),
        }
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        i, q = result["index"], result["query"]
        print(f"model {result['model']}")
        print(f"index ({i['embedder']} embedder): {i['pages']} pages, {i['chunks']} chunks in {i['seconds']} s: "
              f"{i['pages_per_s']} pages/s, {i['chunks_per_s']} chunks/s "
              f"(embedding {i['embedding_share']:.0%} of the time)")  # fmt: skip
        print(f"query over {q['chunks']} chunks: search median {q['median_ms']} ms, p90 "
              f"{q['p90_ms']} ms ({q['queries']} queries; first, cold: {q['cold_ms']} ms) + the "
              f"query's embedding median {q['query_embedding_median_ms']} ms = "
              f"{q['total_median_ms']} ms")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
