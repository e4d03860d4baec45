"""Special-token partition: text -> raw fragments and special-token ids, exactly as llama.cpp's
`tokenizer_st_partition` cuts it.

Every control, user-defined and unknown token, longest text first, is cut out of the input
wherever it occurs, so special-token text in the input always becomes one id. We do this
ourselves instead of leaving it to HF `tokenizers` because HF matches leftmost-longest while
llama.cpp matches longest-first; they differ when two special texts overlap.

Literal spans (the messages of a rendered chat) are cut the way llama.cpp cuts text tokenized
with parse_special=false: control and unknown tokens are not recognised there (their text stays
text, so a user cannot type a role marker), user-defined tokens still are (Gemma's whitespace
runs are user-defined, and a message must tokenize as it did before).
"""

from __future__ import annotations

import re
import threading
from collections.abc import Iterable


class LiteralText(str):
    """A fragment holding special-token text that must be tokenized as ordinary text."""


class SpecialPartition:
    """The partitioned (special) tokens of one vocabulary and the cut of a text at them."""

    def __init__(
        self, tokens: list[str], attrs: list[int], partitioned_attrs: int, not_in_literal_attrs: int
    ):
        # (text, id), longest UTF-8 text first; ties keep id order (llama.cpp leaves them unspecified).
        partitioned = [i for i, a in enumerate(attrs) if a & partitioned_attrs]
        self._specials = sorted(
            ((tokens[i], i) for i in partitioned), key=lambda t: -len(t[0].encode())
        )
        self._not_in_literal = frozenset(i for i in partitioned if attrs[i] & not_in_literal_attrs)
        self._first_chars = frozenset(text[0] for text, _ in self._specials)
        self._trie: tuple[dict, object, re.Pattern[str]] | None = None
        self._trie_lock = threading.Lock()

    def split(self, text: str, literal_spans: Iterable[tuple[int, int]] = ()) -> list[str | int]:
        """Raw pieces and special-token ids in text order: specials in order of decreasing length,
        each one's occurrences left to right, and an occurrence only counts if no earlier
        (longer) special already took any of its characters. In `literal_spans` ((start, end)
        character ranges) control and unknown tokens are not cut; a fragment that keeps the
        whole text of one is a LiteralText.

        llama.cpp re-scans every fragment for every special; with Gemma's 6.4k specials and text
        cut into thousands of fragments by its whitespace-run tokens that is slow in Python. We
        find every occurrence of every special in one pass with a trie, then replay llama.cpp's
        order over those occurrences, which gives the same cuts."""
        if not text or not self._first_chars.intersection(text):
            return [text] if text else []
        occurrences = self._occurrences(text)
        if not occurrences:
            return [text]
        n = len(text)
        literal = bytearray(n)
        for start, stop in literal_spans:
            start, stop = max(0, start), min(n, stop)
            if stop > start:
                literal[start:stop] = b"\x01" * (stop - start)
        taken = bytearray(n)
        cuts: list[tuple[int, int, int]] = []  # (start, end, token id)
        kept_as_text: list[tuple[int, int]] = []
        any_literal = 1 in literal
        for rank in sorted(occurrences):
            special, special_id = self._specials[rank]
            length = len(special)
            mark = b"\x01" * length
            protected = any_literal and special_id in self._not_in_literal
            for p in occurrences[rank]:  # ascending
                if protected and literal.find(1, p, p + length) != -1:
                    kept_as_text.append((p, p + length))
                elif taken.find(1, p, p + length) == -1:
                    taken[p : p + length] = mark
                    cuts.append((p, p + length, special_id))
        cuts.sort()
        fragments: list[str | int] = []
        pos = 0
        for start, stop, special_id in cuts + [(n, n, -1)]:
            if start > pos:
                fragment = text[pos:start]
                if any(pos <= a and b <= start for a, b in kept_as_text):
                    fragment = LiteralText(fragment)
                fragments.append(fragment)
            if special_id >= 0:
                fragments.append(special_id)
            pos = stop
        return fragments

    def _occurrences(self, text: str) -> dict[int, list[int]]:
        """Start positions of every special in text, by the special's rank (ascending)."""
        trie, end_key, start_re = self._index()
        occurrences: dict[int, list[int]] = {}
        n = len(text)
        for match in start_re.finditer(text):
            p = match.start()
            node = trie[text[p]]
            q = p + 1
            while True:
                rank = node.get(end_key)
                if rank is not None:
                    occurrences.setdefault(rank, []).append(p)
                if q >= n:
                    break
                node = node.get(text[q])
                if node is None:
                    break
                q += 1
        return occurrences

    def _index(self) -> tuple[dict, object, re.Pattern[str]]:
        """Character trie of the special texts (built on first use: most tokenizers built for
        `info` never encode); terminal nodes hold the special's rank in llama.cpp's processing
        order under a private key."""
        with self._trie_lock:
            if self._trie is None:
                end_key = object()
                trie: dict = {}
                for rank, (special, _) in enumerate(self._specials):
                    node = trie
                    for ch in special:
                        node = node.setdefault(ch, {})
                    node.setdefault(end_key, rank)  # identical texts: the first (lowest id) wins
                starts = "".join(sorted(self._first_chars))
                self._trie = (trie, end_key, re.compile("[" + re.escape(starts) + "]"))
            return self._trie
