"""Token ids -> text as they are generated, never showing half a character.

A token is a byte string (a SentencePiece `<0xF0>` byte piece, or a byte-level BPE piece holding
the first two bytes of an emoji), so one token can end in the middle of a UTF-8 character. We
feed each token's bytes to Python's incremental UTF-8 decoder, which returns every complete
character and keeps the (at most three) bytes of an unfinished one until the next token brings
the rest. Bytes that can never become a character (a stray continuation byte, a sequence cut off
by the end of the stream) become U+FFFD exactly where a one-shot `bytes.decode(errors="replace")`
puts them, so the concatenated output equals `tokenizer.decode(all_ids)` exactly.

Cost per token is O(bytes of that token): nothing is re-decoded.
"""

from __future__ import annotations

import codecs
from typing import Iterable


class StreamingDetokenizer:
    """`add(id)` returns the text that became complete; `flush()` returns what was held back."""

    def __init__(self, tokenizer, *, special: bool = False):
        self._tokenizer = tokenizer
        self._special = special  # True renders control tokens (e.g. "<|im_end|>") as their text
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._first = True

    def add(self, token_id: int) -> str:
        data = self._tokenizer.piece_bytes(token_id, special=self._special)
        if self._first:
            self._first = False
            # Same rule as Tokenizer.decode: SentencePiece's added prefix space is not text.
            if self._tokenizer.add_space_prefix and data.startswith(b" "):
                data = data[1:]
        return self._decoder.decode(data, final=False)

    def add_many(self, token_ids: Iterable[int]) -> str:
        return "".join(self.add(t) for t in token_ids)

    def flush(self) -> str:
        """End of the stream: bytes still held back (an unfinished character) become U+FFFD."""
        return self._decoder.decode(b"", final=True)

    @property
    def pending_bytes(self) -> bytes:
        """Bytes of an unfinished character waiting for the next token."""
        return self._decoder.getstate()[0]
