"""Retrieval over a real collection: BM25 + vectors fused by reciprocal rank, the vector cache,
the cited context block within its budget, and the replay check."""

from __future__ import annotations

import pytest
from documents_helpers import HashEmbedder

from engine.documents.collection import Collection
from engine.documents.context import INSTRUCTIONS, build_context, prompt_messages
from engine.documents.index import index_paths
from engine.documents.record import changed_since, sources_record
from engine.documents.retrieve import RetrievalSettings, fuse, retrieve
from engine.documents.vectors import matrix_for, vector_search


@pytest.fixture
def library(tmp_path):
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "boats.md").write_text(
        "# Sailing\nA catamaran has two hulls joined by a deck.\n\n"
        "# Engines\nOutboard motors are mounted on the transom.\n",
        encoding="utf-8",
    )
    (docs / "garden.md").write_text(
        "# Roses\nPrune roses in late winter before buds swell.\n", encoding="utf-8"
    )
    (docs / "kitchen.txt").write_text(
        "Sourdough needs a lively starter and time.", encoding="utf-8"
    )
    c = Collection.open("lib", root=tmp_path / "collections")
    index_paths(c, [docs], HashEmbedder())
    yield c, docs
    c.close()


def test_reciprocal_rank_fusion_by_hand():
    # k=60: id 7 is 1st in list A and 3rd in B: 1/61 + 1/63; id 9 only 1st in B: 1/61
    fused = fuse([[7, 8], [9, 5, 7]], rrf_k=60)
    assert [i for i, _ in fused] == [7, 9, 8, 5]
    assert fused[0][1] == pytest.approx(1 / 61 + 1 / 63)
    assert fused[1][1] == pytest.approx(1 / 61)
    assert fused[2][1] == pytest.approx(1 / 62)
    assert fused[3][1] == pytest.approx(1 / 62)


def test_the_obvious_passage_comes_first_with_both_ranks(library):
    c, _ = library
    result = retrieve(c, HashEmbedder(), "how many hulls does a catamaran have?")
    top = result.results[0]
    assert top.chunk.text == "# Sailing\nA catamaran has two hulls joined by a deck."
    assert top.chunk.heading == ("Sailing",) and top.chunk.file.endswith("boats.md")
    assert top.bm25_rank == 1 and top.vector_rank == 1
    assert top.score == pytest.approx(2 / 61)
    assert top.chunk.place() == "boats.md > Sailing"


def test_query_punctuation_is_not_fts_syntax(library):
    c, _ = library
    for query in ['roses" OR', "prune AND (roses", "NEAR(roses:", "-roses*", "''"]:
        retrieve(c, HashEmbedder(), query)  # raises on an FTS5 syntax error
    assert c.keyword_search('"roses"', 3) == c.keyword_search("roses", 3) != []


def test_top_k_limits_results(library):
    c, _ = library
    result = retrieve(c, HashEmbedder(), "roses", RetrievalSettings(top_k=2))
    assert len(result.results) == 2


def test_the_vector_cache_reloads_after_a_write(library):
    c, docs = library
    ids_before, _ = matrix_for(c)
    assert matrix_for(c)[0] is ids_before  # cached: the same array, not a reload
    (docs / "more.txt").write_text("Tomatoes want sun.", encoding="utf-8")
    index_paths(c, [docs], HashEmbedder())
    ids_after, matrix = matrix_for(c)
    assert len(ids_after) == len(ids_before) + 1 and matrix.shape == (len(ids_after), 256)
    hits = vector_search(c, HashEmbedder().embed(["tomatoes want sun"])[0], 1)
    assert c.chunks([hits[0][0]])[hits[0][0]].text == "Tomatoes want sun."
    assert hits[0][1] == pytest.approx(1.0)


def count_words(text: str) -> int:
    return len(text.split())


def test_context_takes_sources_in_rank_order_within_the_budget(library):
    c, _ = library
    results = retrieve(c, HashEmbedder(), "catamaran hulls deck outboard roses").results
    costs = [count_words(f"[1] {r.chunk.place()}\n{r.chunk.text}\n\n") for r in results]
    budget = count_words(INSTRUCTIONS + "\n\n") + costs[0] + costs[1] + 1  # room for two
    block = build_context(results, count_words, budget)
    assert [s.item.chunk.id for s in block.included] == [r.chunk.id for r in results[:2]]
    assert [s.marker for s in block.included] == [1, 2]
    assert [s.item.chunk.id for s in block.left_out] == [r.chunk.id for r in results[2:]]
    assert block.text.startswith(INSTRUCTIONS)
    assert f"[1] {results[0].chunk.place()}\n{results[0].chunk.text}" in block.text
    assert f"[2] {results[1].chunk.place()}\n{results[1].chunk.text}" in block.text
    assert block.used_tokens <= budget


def test_a_source_too_big_for_what_is_left_is_skipped_for_a_smaller_one(library):
    c, _ = library
    results = retrieve(c, HashEmbedder(), "catamaran hulls deck sourdough starter").results
    big_first = sorted(results, key=lambda r: -len(r.chunk.text))
    smallest = min(results, key=lambda r: len(r.chunk.text))
    room = count_words(INSTRUCTIONS + "\n\n") + count_words(
        f"[1] {smallest.chunk.place()}\n{smallest.chunk.text}\n\n"
    )
    block = build_context(big_first, count_words, room)
    assert [s.item.chunk.id for s in block.included] == [smallest.chunk.id]
    assert smallest.chunk.id not in [s.item.chunk.id for s in block.left_out]


def test_no_room_means_no_block_and_everything_left_out(library):
    c, _ = library
    results = retrieve(c, HashEmbedder(), "roses").results
    block = build_context(results, count_words, 3)
    assert block.text == "" and block.included == [] and len(block.left_out) == len(results)
    assert prompt_messages("q?", block) == [{"role": "user", "content": "q?"}]


def test_the_record_detects_a_changed_document(library):
    c, docs = library
    retrieval = retrieve(c, HashEmbedder(), "roses prune winter")
    block = build_context(retrieval.results, count_words, 10_000)
    record = sources_record(c, retrieval, block)
    assert record["sources"][0]["file"].endswith("garden.md")
    assert record["settings"] == {"top_k": 8, "rrf_k": 60, "candidates": 32}
    assert changed_since(c, record) == []
    (docs / "garden.md").write_text("# Roses\nPrune roses in autumn.\n", encoding="utf-8")
    index_paths(c, [docs], HashEmbedder())
    changed = changed_since(c, record)
    assert [(ch.marker, ch.why) for ch in changed] == [(1, "removed")]
    assert changed[0].file.endswith("garden.md")


def test_question_words_do_not_outrank_the_word_asked_about(tmp_path):
    docs = tmp_path / "d"
    docs.mkdir()
    (docs / "a.txt").write_text("How is the pump on the boat? The pump is on the deck.", "utf-8")
    (docs / "b.txt").write_text("Warranty lasts two years.", "utf-8")
    with Collection.open("s", root=tmp_path / "c") as c:
        index_paths(c, [docs], HashEmbedder())
        ids = c.keyword_search("how long is the warranty?", 5)
        assert [c.chunks([i])[i].file.rsplit("/", 1)[1] for i in ids] == ["b.txt"]
        # a query of nothing but such words still searches them
        only = c.keyword_search("how is the", 5)
        assert [c.chunks([i])[i].file.rsplit("/", 1)[1] for i in only] == ["a.txt"]
