"""Chunking: token budget, overlap, whole words, and where each chunk came from."""

from __future__ import annotations

import re

import pytest

from engine.documents.chunk import chunk_blocks
from engine.documents.extract import Block
from engine.errors import ConfigValidationError


def count_words(text: str) -> int:
    """A tokenizer where each whitespace-separated word is one token, plus 2 for [CLS]/[SEP]."""
    return len(text.split()) + 2


def words(n: int, prefix: str = "w") -> str:
    return " ".join(f"{prefix}{i}" for i in range(n))


def test_chunks_fill_the_budget_and_overlap_by_whole_words():
    block = Block(words(25), page=4, heading=("Intro",), start=0)
    chunks = chunk_blocks([block], count_words, max_tokens=12, overlap_tokens=3)
    # budget 12 - 2 special = 10 words; each next chunk repeats the last 3 words
    assert [c.text for c in chunks] == [
        words(10),
        " ".join(f"w{i}" for i in range(7, 17)),
        " ".join(f"w{i}" for i in range(14, 24)),
        " ".join(f"w{i}" for i in range(21, 25)),
    ]
    assert [c.n_tokens for c in chunks] == [12, 12, 12, 6]
    assert [c.ordinal for c in chunks] == [0, 1, 2, 3]
    assert all(c.page == 4 and c.heading == ("Intro",) for c in chunks)


def test_offsets_point_at_the_chunk_text_in_the_document():
    text_a, text_b = "alpha beta gamma delta", "epsilon   zeta\neta theta iota"
    blocks = [Block(text_a, 1, (), 0), Block(text_b, 2, ("H",), len(text_a) + 2)]
    document = text_a + "\n\n" + text_b
    chunks = chunk_blocks(blocks, count_words, max_tokens=10, overlap_tokens=1)
    assert len(chunks) == 2  # one per block: a chunk never crosses a page or heading
    for c in chunks:
        assert document[c.char_start : c.char_end] == c.text
    assert chunks[1].text == "epsilon   zeta\neta theta iota"  # the text as written


def test_no_word_is_ever_split():
    text = "Supercalifragilistic expialidocious " * 40
    chunks = chunk_blocks([Block(text, None, ())], count_words, max_tokens=9, overlap_tokens=2)
    vocabulary = {"Supercalifragilistic", "expialidocious"}
    for c in chunks:
        assert set(c.text.split()) <= vocabulary
        assert c.text == c.text.strip()


def test_a_word_longer_than_the_budget_goes_in_alone():
    def by_chars(text: str) -> int:  # a tokenizer charging one token per 4 characters
        return sum(-(-len(w) // 4) for w in text.split()) + 2

    long_word = "x" * 100
    chunks = chunk_blocks(
        [Block(f"short {long_word} tail", None, ())], by_chars, max_tokens=10, overlap_tokens=0
    )
    assert [c.text for c in chunks] == ["short", long_word, "tail"]


def test_the_whole_chunk_is_recounted_when_words_do_not_add_up():
    def merging(text: str) -> int:  # "a b" costs more together than apart
        return len(text.split()) + 2 * len(re.findall(r"a b", text)) + 2

    text = "a b " * 10
    chunks = chunk_blocks([Block(text, None, ())], merging, max_tokens=10, overlap_tokens=0)
    # by the word sums 8 words fit; together they cost 8 + 2 * 4 "a b" pairs + 2 = 18
    assert all(merging(c.text) <= 10 for c in chunks)
    assert " ".join(c.text for c in chunks).split() == text.split()


def test_bad_sizes_are_refused_by_name():
    with pytest.raises(ConfigValidationError, match="chunk_tokens"):
        chunk_blocks([], count_words, max_tokens=4)
    with pytest.raises(ConfigValidationError, match="overlap_tokens"):
        chunk_blocks([], count_words, max_tokens=20, overlap_tokens=10)
