"""Hybrid retrieval: BM25 (FTS5) top-k and vector top-k, fused by reciprocal rank fusion.

RRF (Cormack et al. 2009): score(d) = sum over the lists that hold d of 1 / (k + rank), rank
from 1, k = 60. It needs no calibration between BM25's and cosine's scales, and a chunk found by
both lists outranks one found by either alone at the same rank.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from engine.documents.collection import Collection, StoredChunk
from engine.documents.defaults import DEFAULT_TOP_K
from engine.documents.embedder import TextEmbedder
from engine.documents.vectors import vector_search
from engine.errors import ConfigValidationError

RRF_K = 60
# Each list is searched deeper than the final top-k, so a chunk ranked modestly by both lists can
# still fuse into the top.
CANDIDATES_PER_LIST = 4


@dataclass(frozen=True)
class RetrievalSettings:
    top_k: int = DEFAULT_TOP_K
    rrf_k: int = RRF_K
    candidates: int = DEFAULT_TOP_K * CANDIDATES_PER_LIST

    def to_dict(self) -> dict:
        return {"top_k": self.top_k, "rrf_k": self.rrf_k, "candidates": self.candidates}


@dataclass(frozen=True)
class Retrieved:
    chunk: StoredChunk
    score: float  # fused RRF score
    bm25_rank: int | None  # 1-based rank in the keyword list; None: not in it
    vector_rank: int | None
    similarity: float | None  # cosine with the query, when in the vector list


@dataclass
class Retrieval:
    query: str
    settings: RetrievalSettings
    results: list[Retrieved] = field(default_factory=list)


def fuse(lists: list[list[int]], rrf_k: int = RRF_K) -> list[tuple[int, float]]:
    """Reciprocal rank fusion of ranked id lists: (id, score) best first; ties keep the order in
    which ids were first seen (the first list's order wins)."""
    scores: dict[int, float] = {}
    for ranked in lists:
        for rank, item in enumerate(ranked, start=1):
            scores[item] = scores.get(item, 0.0) + 1.0 / (rrf_k + rank)
    return sorted(scores.items(), key=lambda kv: -kv[1])


def retrieve(
    collection: Collection,
    embedder: TextEmbedder,
    query: str,
    settings: RetrievalSettings | None = None,
) -> Retrieval:
    settings = settings or RetrievalSettings()
    if settings.top_k < 1:
        raise ConfigValidationError("top_k", settings.top_k, "at least 1")
    if collection.embed_model_id not in (None, embedder.model_id):
        raise ConfigValidationError(
            "embedding model",
            embedder.model_id,
            f"the collection's own, {collection.embed_model_id!r}",
        )
    depth = max(settings.candidates, settings.top_k)
    keyword = collection.keyword_search(query, depth)
    vector = vector_search(collection, embedder.embed([query])[0], depth)
    vector_ids = [cid for cid, _ in vector]
    similarity = dict(vector)
    fused = fuse([keyword, vector_ids], settings.rrf_k)[: settings.top_k]
    chunks = collection.chunks([cid for cid, _ in fused])
    bm25_rank = {cid: r for r, cid in enumerate(keyword, start=1)}
    vector_rank = {cid: r for r, cid in enumerate(vector_ids, start=1)}
    out = Retrieval(query, settings)
    for cid, score in fused:
        if cid in chunks:  # a chunk dropped between the two reads is simply not returned
            out.results.append(
                Retrieved(
                    chunks[cid],
                    score,
                    bm25_rank.get(cid),
                    vector_rank.get(cid),
                    similarity.get(cid),
                )
            )
    return out
