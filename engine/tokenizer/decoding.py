"""Token -> bytes, as llama.cpp's token_to_piece and detokenize give them: GPT-2's byte-level
alphabet, each token's rendered piece, and the HF-style space clean-up some vocabularies use."""

from __future__ import annotations

import numpy as np

from engine.tokenizer.llama_tables import (
    ATTR_BYTE,
    ATTR_NORMAL,
    ATTR_USER_DEFINED,
    HIDDEN,
    SPACE_ESCAPE,
)


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's reversible byte -> printable character map used by byte-level BPE vocabularies."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1))
    printable += list(range(ord("®"), ord("ÿ") + 1))
    mapping = {b: chr(b) for b in printable}
    extra = 0
    for b in range(256):
        if b not in mapping:
            mapping[b] = chr(256 + extra)
            extra += 1
    return mapping


BYTE_TO_UNICODE = _bytes_to_unicode()
UNICODE_TO_BYTE = {c: b for b, c in BYTE_TO_UNICODE.items()}
# Byte-level character -> the Latin-1 character of its byte, so one str.translate + encode decodes.
_BYTE_LEVEL_TO_LATIN1 = str.maketrans({c: chr(b) for c, b in UNICODE_TO_BYTE.items()})


def byte_level_decode(text: str) -> bytes:
    """GPT-2 byte-level characters -> bytes; an unmappable character becomes llama.cpp's marker."""
    try:
        return text.translate(_BYTE_LEVEL_TO_LATIN1).encode("latin-1")
    except UnicodeEncodeError:
        pass
    out = bytearray()
    for ch in text:
        b = UNICODE_TO_BYTE.get(ch)
        if b is not None:
            out.append(b)
        else:
            marker = "[UNK_BYTE_0x" + ch.encode("utf-8").hex() + text + "]"
            out += marker.encode("utf-8")
    return bytes(out)


class PieceTable:
    """Every token's piece (bytes) in one blob with uint32 start/end offsets, instead of a list
    of 262k bytes objects (Gemma 3: 10 MiB as a list, 4.3 MiB here; issue 32). `hiding(mask)`
    gives a table over the same blob where the masked tokens are b""."""

    __slots__ = ("_blob", "_starts", "_ends", "_s", "_e")

    def __init__(self, blob: bytes, starts: np.ndarray, ends: np.ndarray):
        self._blob, self._starts, self._ends = blob, starts, ends
        # memoryviews index to Python ints several times faster than numpy arrays (decode's loop)
        self._s, self._e = memoryview(starts.data), memoryview(ends.data)

    @classmethod
    def from_pieces(cls, pieces: list[bytes]) -> PieceTable:
        ends = np.cumsum([len(p) for p in pieces], dtype=np.int64)
        if len(ends) and ends[-1] >= 2**32:
            raise ValueError("token pieces hold more than 4 GiB")  # a vocabulary never does
        ends = ends.astype(np.uint32)
        starts = np.zeros_like(ends)
        starts[1:] = ends[:-1]
        return cls(b"".join(pieces), starts, ends)

    def hiding(self, mask: np.ndarray) -> PieceTable:
        """The same pieces, with b"" for every token where mask is true."""
        return PieceTable(self._blob, self._starts, np.where(mask, self._starts, self._ends))

    @property
    def nbytes(self) -> int:
        return len(self._blob) + self._starts.nbytes + self._ends.nbytes

    def __len__(self) -> int:
        return len(self._starts)

    def __getitem__(self, token_id: int) -> bytes:
        return self._blob[self._s[token_id] : self._e[token_id]]


def render_pieces(model: str, tokens: list[str], attrs: list[int]) -> list[bytes]:
    """llama.cpp's token_to_piece(special=True) for every id (before the first-token space
    strip); the common case (normal pieces) in one comprehension."""
    if model == "llama":
        fast = [t.replace(SPACE_ESCAPE, " ").encode("utf-8") for t in tokens]
    else:
        fast = [byte_level_decode(t) for t in tokens]
    return [
        p if a == ATTR_NORMAL else _render(model, tokens[i], a)
        for i, (a, p) in enumerate(zip(attrs, fast, strict=True))
    ]


def _render(model: str, text: str, attr: int) -> bytes:
    if attr & (HIDDEN | ATTR_USER_DEFINED):
        return text.encode("utf-8")
    if attr & ATTR_NORMAL:
        if model == "llama":
            return text.replace(SPACE_ESCAPE, " ").encode("utf-8")
        return byte_level_decode(text)
    if attr & ATTR_BYTE:
        if model == "llama" or text.startswith("<0x"):
            return bytes([int(text[3:5], 16)])
        return byte_level_decode(text)  # a BPE byte token is its byte-level character
    return b""  # unused / undefined tokens render as nothing


def clean_spaces(text: bytes) -> bytes:
    """llama.cpp's detokenize clean-up (llama_vocab::impl::detokenize, clean_spaces), byte for byte:
    1. drop a space before ? ! . ,   2. " ' " -> "'"   3. drop the space in " 's", " 'm", " 're", " 've"."""
    if not text:
        return text
    # pass 1
    out = bytearray(text[:1])
    for i in range(1, len(text)):
        x = text[i]
        if text[i - 1] == 0x20 and x in b"?!.,":
            out.pop()
        out.append(x)
    # pass 2 (reads the bytes as they stand in the buffer, including the NUL it writes)
    buf = out
    out = bytearray(buf[:1])
    i = 1
    while i < len(buf):
        x = buf[i]
        if x == 0x27 and i + 1 < len(buf) and buf[i - 1] == 0x20 and buf[i + 1] == 0x20:
            out.pop()
            i += 1
            buf[i] = 0
        out.append(x)
        i += 1
    # pass 3
    buf = out
    out = bytearray(buf[:1])
    n = len(buf)
    for i in range(1, n):
        x = buf[i]
        if buf[i - 1] == 0x20 and x == 0x27 and i + 1 < n:
            x1 = buf[i + 1]
            if x1 in b"sm":
                out.pop()
            elif (
                x1 not in b"td" and i + 2 < n and (x1, buf[i + 2]) in ((0x72, 0x65), (0x76, 0x65))
            ):  # 're 've
                out.pop()
        out.append(x)
    return bytes(out)


def clean_spaces_cut(text: bytes) -> int:
    """The largest c such that clean_spaces(text) == clean_spaces(text[:c]) + clean_spaces(text[c:])
    for any continuation of text (0 if none): the two bytes before c are neither space nor
    apostrophe, so no clean-up rule can reach across c (each starts at a space and looks at
    most at the apostrophe and two bytes after it)."""
    for c in range(len(text), 1, -1):
        if text[c - 1] not in b" '" and text[c - 2] not in b" '":
            return c
    return 0
