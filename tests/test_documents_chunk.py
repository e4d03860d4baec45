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


MUSEUM_MD = """# Visiting

## Hours

The museum opens at nine.

## Parking

Behind the station.

# Appendix
"""


def test_a_heading_starts_the_next_chunk_instead_of_being_a_chunk_alone(tmp_path):
    """'# Visiting' followed by the '## Hours' section: the heading goes at the start of the
    Hours chunk (not a chunk of its own that matches every question about visiting); a heading
    that ends the document stays, alone, rather than being lost."""
    from engine.documents.extract import extract

    path = tmp_path / "museum.md"
    path.write_text(MUSEUM_MD, encoding="utf-8")
    document = extract(str(path))
    chunks = chunk_blocks(document.blocks, count_words, max_tokens=50, overlap_tokens=0)
    assert [c.text for c in chunks] == [
        "# Visiting\n\n## Hours\n\nThe museum opens at nine.",
        "## Parking\n\nBehind the station.",
        "# Appendix",
    ]
    assert [c.heading for c in chunks] == [
        ("Visiting", "Hours"),
        ("Visiting", "Parking"),
        ("Appendix",),
    ]
    assert [c.ordinal for c in chunks] == [0, 1, 2]
    for c in chunks:  # the joined chunk is still one span of the document's text
        assert document.text[c.char_start : c.char_end] == c.text
    assert chunks[0].n_tokens == 9 + 2  # its words, recounted whole, + [CLS]/[SEP]


@pytest.mark.parametrize(
    ("text", "heading"),
    [
        # ATX, a chain of three levels
        ("# Guide\n\n## Safety\n\n### Power\n\nUnplug it first.\n", ("Guide", "Safety", "Power")),
        # setext has two levels: "Power" (---) replaces "Safety" (---) under "Guide" (===)
        (
            "Guide\n=====\n\nSafety\n------\n\nPower\n-----\n\nUnplug it first.\n",
            ("Guide", "Power"),
        ),
    ],
)
def test_a_chain_of_headings_joins_the_first_text_after_it(tmp_path, text, heading):
    from engine.documents.extract import extract

    path = tmp_path / "guide.md"
    path.write_text(text, encoding="utf-8")
    document = extract(str(path))
    chunks = chunk_blocks(document.blocks, count_words, max_tokens=50, overlap_tokens=0)
    assert len(chunks) == 1
    assert chunks[0].text == document.text and chunks[0].text.endswith("Unplug it first.")
    assert chunks[0].heading == heading


def test_a_heading_is_not_joined_across_pages():
    """A PDF page ending with a heading: each page's chunk keeps its own page number."""
    blocks = [Block("Warranty", 3, ("Warranty",), 0), Block("Two years.", 4, ("Warranty",), 10)]
    chunks = chunk_blocks(blocks, count_words, max_tokens=20, overlap_tokens=0)
    assert [(c.text, c.page) for c in chunks] == [("Warranty", 3), ("Two years.", 4)]
