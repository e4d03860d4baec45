"""What a reply's receipt records about its sources, and the check a replay makes against it.

The record names each chunk the prompt carried by id and text hash, in prompt order with its
marker, plus what was left out and the retrieval settings; the prompt text itself is already in
the receipt's messages, so a replay re-uses those exactly and only needs to say whether the
collection still holds the same passages.
"""

from __future__ import annotations

from dataclasses import dataclass

from engine.documents.collection import Collection
from engine.documents.context import ContextBlock, Source
from engine.documents.retrieve import Retrieval


def source_json(source: Source) -> dict:
    item = source.item
    chunk = item.chunk
    return {
        "marker": source.marker,
        "chunk_id": chunk.id,
        "file": chunk.file,
        "page": chunk.page,
        "heading": list(chunk.heading),
        "char_start": chunk.char_start,
        "char_end": chunk.char_end,
        "text_sha256": chunk.text_sha256,
        "score": round(item.score, 6),
        "bm25_rank": item.bm25_rank,
        "vector_rank": item.vector_rank,
        "similarity": None if item.similarity is None else round(item.similarity, 6),
        "tokens": source.tokens,
    }


def sources_record(collection: Collection, retrieval: Retrieval, block: ContextBlock) -> dict:
    return {
        "collection": collection.name,
        "embed_model": collection.embed_model_id,
        "query": retrieval.query,
        "settings": retrieval.settings.to_dict(),
        "budget_tokens": block.budget_tokens,
        "used_tokens": block.used_tokens,
        "sources": [source_json(s) for s in block.included],
        "left_out": [source_json(s) for s in block.left_out],
    }


@dataclass(frozen=True)
class ChangedSource:
    marker: int | None
    chunk_id: int
    file: str
    why: str  # "removed" (the chunk is gone: file re-indexed or dropped) or "changed"


def changed_since(collection: Collection, record: dict) -> list[ChangedSource]:
    """The recorded sources whose passage is no longer in the collection as it was."""
    wanted = record.get("sources", [])
    now = collection.chunks([int(s["chunk_id"]) for s in wanted])
    out = []
    for s in wanted:
        current = now.get(int(s["chunk_id"]))
        if current is None:
            out.append(ChangedSource(s.get("marker"), int(s["chunk_id"]), s["file"], "removed"))
        elif current.text_sha256 != s["text_sha256"]:
            out.append(ChangedSource(s.get("marker"), int(s["chunk_id"]), s["file"], "changed"))
    return out
