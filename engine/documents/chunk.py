"""Chunks of about `max_tokens` tokens with `overlap_tokens` of overlap, cut at word boundaries.

A chunk never crosses a block (so it has one page and one heading path) and never splits a word:
it is a run of whole words of one block, and its char offsets point into the document's text.
One exception: a block holding only a heading ("# Visiting" followed by "## Hours" and its text)
is joined to the block after it, so the heading starts that chunk instead of being a chunk of one
line that matches every question about the section and answers none.
Token counts come from the embedder's own tokenizer (`count_tokens`), per word and cached, then
each chunk is re-counted whole and shortened if the sum underestimated it (subword tokenizers
are additive over whitespace-separated words, but not every tokenizer is).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache

from engine.documents.extract import BLOCK_SEPARATOR, Block
from engine.errors import ConfigValidationError

DEFAULT_CHUNK_TOKENS = 200
DEFAULT_OVERLAP_TOKENS = 40

_WORD = re.compile(r"\S+")
_HEADING_MARKUP = re.compile(r"#+|=+|-+")  # ATX marks and setext underlines, not words


@dataclass(frozen=True)
class Chunk:
    ordinal: int  # position in the file, from 0
    text: str
    page: int | None
    heading: tuple[str, ...]
    char_start: int  # offsets into the document's text (ExtractedDocument.text)
    char_end: int
    n_tokens: int


def chunk_blocks(
    blocks: list[Block],
    count_tokens: Callable[[str], int],
    max_tokens: int = DEFAULT_CHUNK_TOKENS,
    overlap_tokens: int = DEFAULT_OVERLAP_TOKENS,
) -> list[Chunk]:
    if max_tokens < 8:
        raise ConfigValidationError("chunk_tokens", max_tokens, "at least 8")
    if not 0 <= overlap_tokens < max_tokens // 2:
        raise ConfigValidationError(
            "overlap_tokens", overlap_tokens, f"0 to {max_tokens // 2 - 1} (under half a chunk)"
        )
    # The tokenizer's fixed cost (e.g. [CLS] and [SEP]) is paid once per chunk, not per word.
    overhead = count_tokens("")
    budget = max_tokens - overhead

    @lru_cache(maxsize=65536)
    def word_tokens(word: str) -> int:
        return max(1, count_tokens(word) - overhead)

    chunks: list[Chunk] = []
    for block in _headings_joined(blocks):
        words = [(m.start(), m.end(), m.group()) for m in _WORD.finditer(block.text)]
        costs = [word_tokens(w) for _, _, w in words]
        i = 0
        while i < len(words):
            j, used = i, 0
            while j < len(words) and (used + costs[j] <= budget or j == i):
                used += costs[j]
                j += 1
            # A word longer than the whole budget (a hash, a URL) still goes in, alone: the
            # embedder truncates it; splitting it would make a "word" nobody wrote.
            text = block.text[words[i][0] : words[j - 1][1]]
            real = count_tokens(text)
            while real > max_tokens and j - 1 > i:
                j -= 1
                text = block.text[words[i][0] : words[j - 1][1]]
                real = count_tokens(text)
            chunks.append(
                Chunk(
                    ordinal=len(chunks),
                    text=text,
                    page=block.page,
                    heading=block.heading,
                    char_start=block.start + words[i][0],
                    char_end=block.start + words[j - 1][1],
                    n_tokens=real,
                )
            )
            if j >= len(words):
                break
            # step back over the last words worth up to overlap_tokens, always moving forward
            back, k = 0, j
            while k - 1 > i and back + costs[k - 1] <= overlap_tokens:
                k -= 1
                back += costs[k]
            i = k
    return chunks


def heading_only(block: Block) -> bool:
    """Whether the block's text is its heading line and nothing else (the heading markup aside):
    a section whose text starts in the next block (a subsection, or an empty section)."""
    if not block.heading:
        return False
    words = [w for w in block.text.split() if not _HEADING_MARKUP.fullmatch(w)]
    return words == block.heading[-1].split()


def _headings_joined(blocks: list[Block]) -> list[Block]:
    """The blocks with each heading-only block joined to the block after it (its text first, the
    next block's heading path, which is the more precise one). Joined only where the two are
    adjacent in the document's text on one page, so the chunk's offsets stay one span; a heading
    ending the document stays alone rather than being lost."""
    out: list[Block] = []
    pending: Block | None = None
    for block in blocks:
        only = heading_only(block)  # asked before joining: "# A" + "## B" still waits for text
        if pending is not None:
            if block.page == pending.page and block.start == pending.start + len(
                pending.text
            ) + len(BLOCK_SEPARATOR):
                block = Block(
                    pending.text + BLOCK_SEPARATOR + block.text,
                    block.page,
                    block.heading,
                    pending.start,
                )
            else:
                out.append(pending)
            pending = None
        if only:
            pending = block
        else:
            out.append(block)
    if pending is not None:
        out.append(pending)
    return out
