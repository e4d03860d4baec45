"""Token ids -> text as they are generated, never showing half a character.

A token is a byte string (a SentencePiece `<0xF0>` byte piece, or a byte-level BPE piece holding
the first two bytes of an emoji), so one token can end in the middle of a UTF-8 character. We
feed each token's bytes to Python's incremental UTF-8 decoder, which returns every complete
character and keeps the (at most three) bytes of an unfinished one until the next token brings
the rest. Bytes that can never become a character (a stray continuation byte, a sequence cut off
by the end of the stream) become U+FFFD exactly where a one-shot `bytes.decode(errors="replace")`
puts them, so the concatenated output equals `tokenizer.decode(all_ids)` exactly.

For vocabularies where llama.cpp's detokenizer cleans up spaces (" ," -> ",", " 's" -> "'s";
gpt-2/llama3-style pre-tokenizers, see engine.tokenizer.decoding.clean_spaces) the raw bytes
after the last point where no clean-up rule can reach across are held back too, so the streamed
text still equals decode() exactly; that is a few bytes (a space, an apostrophe) except in runs
of spaces.

Cost per token is O(bytes of that token): nothing is re-decoded.
"""

from __future__ import annotations

import codecs

from engine.tokenizer.decoding import clean_spaces, clean_spaces_cut


class StreamingDetokenizer:
    """`add(id)` returns the text that became complete; `flush()` returns what was held back."""

    def __init__(self, tokenizer, *, special: bool = False):
        self._tokenizer = tokenizer
        self._special = special  # True renders control tokens (e.g. "<|im_end|>") as their text
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._first = True
        self._clean = tokenizer.clean_spaces
        self._raw = b""  # bytes not yet cleaned (only when the vocabulary cleans spaces)

    def add(self, token_id: int) -> str:
        data = self._tokenizer.piece_bytes(token_id, special=self._special)
        if self._first:
            self._first = False
            # Same rule as Tokenizer.decode: SentencePiece's added prefix space is not text.
            if self._tokenizer.add_space_prefix and data.startswith(b" "):
                data = data[1:]
        if self._clean:
            data = self._clean_ready(data)
        return self._decoder.decode(data, final=False)

    def flush(self) -> str:
        """End of the stream: bytes still held back (an unfinished character) become U+FFFD."""
        tail, self._raw = clean_spaces(self._raw) if self._clean else b"", b""
        return self._decoder.decode(tail, final=True)

    @property
    def pending_bytes(self) -> bytes:
        """Bytes held back: an unfinished character (and, when cleaning spaces, the uncleaned tail)."""
        return self._raw + self._decoder.getstate()[0]

    def _clean_ready(self, data: bytes) -> bytes:
        """Append data to the uncleaned tail; return the cleaned bytes up to the last safe cut."""
        old = len(self._raw)
        raw = self._raw + data
        # Cuts at or before `old` were already refused (they depend only on bytes before them).
        cut = clean_spaces_cut(raw[max(0, old - 1) :])
        if cut == 0:
            self._raw = raw
            return b""
        cut += max(0, old - 1)
        self._raw = raw[cut:]
        return clean_spaces(raw[:cut])
