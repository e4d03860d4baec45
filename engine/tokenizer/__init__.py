"""Tokenizer built from a GGUF file's `tokenizer.ggml.*` metadata, matching llama.cpp's ids.

llama.cpp is the reference: a GGUF file is made for it, so its tokenizer (src/llama-vocab.cpp) is
what the model was converted and tested against. We reproduce it in three parts:

1. Special-token partition (ours, in Python, exactly llama.cpp's `tokenizer_st_partition`):
   every control, user-defined and unknown token, longest text first, is cut out of the input
   wherever it occurs. Special-token text in the input therefore always becomes one id. We do
   this ourselves instead of leaving it to HF `tokenizers` because HF matches leftmost-longest
   while llama.cpp matches longest-first; they differ when two special texts overlap.
2. The pieces between special tokens go through an HF `tokenizers.Tokenizer` (Rust, fast):
   - `llama` (SentencePiece) vocabularies: llama.cpp merges adjacent symbols by the *score of the
     merged piece* (highest first, leftmost on ties), starting from UTF-8 characters, with
     spaces escaped as "▁" and `<0xXX>` byte pieces for characters that are not in the vocab.
     That is a BPE whose merge ranks are the scores: we derive the merge list from the
     vocabulary (every split of a piece into two pieces, ranked by the piece's score; equal
     scores, which real SentencePiece vocabularies do not have, rank by id) and use HF's BPE
     with byte fallback and no pre-tokenizer (llama.cpp does not pre-split SPM text). Deriving
     Gemma 3's ~514k merges costs ~1.2 s of CPU, so they are cached on disk
     (MERGES_CACHE_DIR, ~9 MB for Gemma) and `from_gguf` shares a live tokenizer per file.
   - `gpt2` (byte-level BPE) vocabularies: the file's merges, and the pre-tokenizer regexes
     llama.cpp uses for the `tokenizer.ggml.pre` name (see `PRE_TOKENIZERS`).
3. BOS/EOS per `tokenizer.ggml.add_bos_token` / `add_eos_token` (llama.cpp's defaults when
   absent: SPM adds BOS, BPE adds it only for the llama3 family).

End-of-generation ids are llama.cpp's set: eos, eot, eom, tokens it recognises by text
(<|im_end|>, <|eot_id|>, <end_of_turn>, <|endoftext|>, </s>, ...) and the FIM pad / repo /
file-separator tokens. SmolLM2: {0 <|endoftext|>, 2 <|im_end|>, 4 <reponame>}; Gemma 3:
{1 <eos>, 106 <end_of_turn>, 212 </s>}.

`.hf` is a complete standalone HF tokenizer (added tokens, normalizer, BOS post-processor,
decoder) for components that need one (llguidance in JSON mode); it gives the same ids except
where two special texts overlap (HF takes the leftmost, llama.cpp the longest).

Unknown `tokenizer.ggml.pre` names are refused with a TokenizerError listing the supported ones,
as llama.cpp itself does: a silently wrong pre-tokenizer gives plausible-looking but different
ids, which degrades every answer without any visible error. A missing `pre` (very old files)
uses llama.cpp's "default" rules, with a warning, again as llama.cpp does. ("gpt2" is accepted
as a spelling of llama.cpp's "gpt-2".)

Decoding follows llama.cpp's `llama_detokenize(remove_special=False, unparse_special=False)`:
control and unknown tokens render as nothing, user-defined tokens as their text, byte pieces as
their byte, "▁" as a space, (SPM with add_space_prefix) the first token loses one leading space,
and, for the pre-tokenizers where llama.cpp sets `clean_spaces` (gpt-2, llama3, default, ...;
not smollm, qwen2 or SPM), its HF-style clean-up (" ," -> ",", " 's" -> "'s", ...).
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
import threading
import weakref
from array import array
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import platformdirs
from tokenizers import AddedToken, Regex, decoders, models, normalizers, pre_tokenizers, processors
from tokenizers import Tokenizer as HFTokenizer

from engine.errors import TokenizerError

log = logging.getLogger(__name__)

SUPPORTED_MODELS = ("gpt2", "llama")

# GGUF token types (gguf.TokenType) and llama.cpp's token attribute bits derived from them.
(
    TYPE_UNDEFINED,
    TYPE_NORMAL,
    TYPE_UNKNOWN,
    TYPE_CONTROL,
    TYPE_USER_DEFINED,
    TYPE_UNUSED,
    TYPE_BYTE,
) = range(7)
ATTR_UNDEFINED = 0
ATTR_UNKNOWN = 1 << 0
ATTR_UNUSED = 1 << 1
ATTR_NORMAL = 1 << 2
ATTR_CONTROL = 1 << 3
ATTR_USER_DEFINED = 1 << 4
ATTR_BYTE = 1 << 5
_TYPE_TO_ATTR = {
    TYPE_UNDEFINED: ATTR_UNDEFINED,
    TYPE_NORMAL: ATTR_NORMAL,
    TYPE_UNKNOWN: ATTR_UNKNOWN,
    TYPE_CONTROL: ATTR_CONTROL,
    TYPE_USER_DEFINED: ATTR_USER_DEFINED,
    TYPE_UNUSED: ATTR_UNUSED,
    TYPE_BYTE: ATTR_BYTE,
}
# Tokens cut out of the text before the model sees it (llama.cpp's cache_special_tokens).
_PARTITIONED = ATTR_CONTROL | ATTR_USER_DEFINED | ATTR_UNKNOWN
# Tokens that decode to nothing in user-visible text.
_HIDDEN = ATTR_CONTROL | ATTR_UNKNOWN

# --- pre-tokenizer regexes, verbatim from llama.cpp's llm_tokenizer_bpe ----------------------------
_GPT2 = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)"
# llama.cpp's hand-written GPT-2 splitter also ends with the original pattern's final `|\s+`.
_GPT2_FULL = _GPT2 + r"|\s+"
_LLAMA3 = (
    r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_QWEN2 = (
    r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)


@dataclass(frozen=True)
class PreTokenizer:
    """How llama.cpp splits text into words for one family of `tokenizer.ggml.pre` names."""

    regexes: tuple[str, ...]  # applied in sequence; matches and the text between both kept
    ignore_merges: bool = False  # a word that is itself in the vocab is one token (llama3)
    add_bos_default: bool = False  # BOS when the file has no add_bos_token key
    clean_spaces: bool = (
        False  # detokenize with llama.cpp's " ," -> "," clean-up (see clean_spaces())
    )


_DEFAULT_RULES = (r"[\p{P}\$\+<=>\^~\|]+", _GPT2_FULL, r"\p{N}+", r"[0-9][0-9][0-9]")
_PRE_FAMILIES: dict[tuple[str, ...], PreTokenizer] = {
    ("default",): PreTokenizer(_DEFAULT_RULES, clean_spaces=True),
    ("gpt2", "gpt-2", "phi-2", "mpt", "olmo", "jais", "exaone4", "jina-es", "jina-de", "jina-v2-es",
     "jina-v2-de", "gigachat", "a.x-4.0", "mellum", "modern-bert"): PreTokenizer((_GPT2_FULL,), clean_spaces=True),
    ("trillion", "granite-docling"): PreTokenizer((_GPT2_FULL,)),
    ("smollm", "command-r"): PreTokenizer((r"\p{N}", _GPT2_FULL)),
    ("starcoder", "refact", "codeshell", "exaone", "minerva-7b", "mellum2"):
        PreTokenizer((r"\p{N}", _GPT2_FULL), clean_spaces=True),
    ("llama3", "llama-v3", "llama-bpe", "falcon3", "falcon-h1", "pixtral", "midm-2.0", "lfm2"):
        PreTokenizer((_LLAMA3,), ignore_merges=True, add_bos_default=True, clean_spaces=True),
    ("dbrx", "smaug-bpe"): PreTokenizer((_LLAMA3,), clean_spaces=True),
    ("qwen2", "deepseek-r1-qwen", "kormo", "f2llmv2", "hunyuan", "solar-open"): PreTokenizer((_QWEN2,)),
    ("megrez", "stablelm2"): PreTokenizer((_QWEN2,), clean_spaces=True),
}  # fmt: skip
PRE_TOKENIZERS: dict[str, PreTokenizer] = {
    name: pre for names, pre in _PRE_FAMILIES.items() for name in names
}

# Token texts llama.cpp treats as end-of-generation (llama-vocab.cpp, "special_eog_ids").
_EOG_TEXTS = frozenset({
    "<|eot_id|>", "<|im_end|>", "<|end|>", "<|return|>", "<|call|>", "<|flush|>", "<|calls|>",
    "<end_of_turn>", "<|endoftext|>", "</s>", "<|eom_id|>", "<EOT>", "_<EOT>", "[EOT]", "[EOS]",
    "<|end_of_text|>", "<end_of_utterance>", "<eos>", "<turn|>", "<|tool_response>",
    "<｜end▁of▁sentence｜>", "[e~[",
})  # fmt: skip
# Texts llama.cpp recognises as EOT / EOM / fill-in-the-middle tokens when the file names none.
_EOT_TEXTS = ("<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>", "<|end_of_text|>",
              "<EOT>", "_<EOT>", "[EOT]", "<｜end▁of▁sentence｜>", "<end_of_utterance>")  # fmt: skip
_EOM_TEXTS = ("<|eom_id|>",)
_FIM_PAD_TEXTS = ("<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]")
_FIM_REP_TEXTS = ("<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>", "<reponame>")
_FIM_SEP_TEXTS = ("<|file_sep|>",)
_FIM_OTHER_TEXTS = (
    "<|fim_prefix|>", "<fim-prefix>", "<fim_prefix>", "<｜fim▁begin｜>", "<PRE>", "▁<PRE>",
    "<|code_prefix|>", "<|prefix|>", "<|fim_suffix|>", "<fim-suffix>", "<fim_suffix>",
    "<｜fim▁hole｜>", "<SUF>", "▁<SUF>", "<|code_suffix|>", "<|suffix|>", "<|fim_middle|>",
    "<fim-middle>", "<fim_middle>", "<｜fim▁end｜>", "<MID>", "▁<MID>", "<|code_middle|>", "<|middle|>",
)  # fmt: skip
# gpt-oss: llama.cpp always renders these (forces them to user-defined).
_ALWAYS_RENDERED = ("<|channel|>", "<|message|>", "<|start|>", "<|constrain|>")

SPACE_ESCAPE = "\u2581"  # "▁", SentencePiece's visible space


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


class Tokenizer:
    """Text <-> token ids for one GGUF model, with llama.cpp's ids and detokenization."""

    def __init__(
        self,
        *,
        model: str,
        tokens: list[str],
        attrs: list[int],
        hf: HFTokenizer,
        bos_id: int | None,
        eos_id: int | None,
        eot_id: int | None,
        eog_ids: frozenset[int],
        add_bos: bool,
        add_eos: bool,
        add_space_prefix: bool,
        pre: str | None,
        clean_spaces: bool = False,
    ):
        self.model = model  # "llama" (SentencePiece) or "gpt2" (byte-level BPE)
        self.pre = pre
        self.tokens = tokens
        self.attrs = attrs
        self.hf = hf
        self.bos_id = bos_id
        self.eos_id = eos_id
        self.eot_id = eot_id
        self.eog_ids = eog_ids
        self.add_bos = add_bos
        self.add_eos = add_eos
        self.add_space_prefix = add_space_prefix
        self.clean_spaces = clean_spaces
        self.vocab_size = len(tokens)
        self._special_pieces = self._render_all()
        # User-visible text hides control and unknown tokens (token_to_piece with special=False).
        self._pieces = [
            b"" if a & _HIDDEN else p for a, p in zip(attrs, self._special_pieces, strict=True)
        ]
        # (text, id), longest UTF-8 text first; ties keep id order (llama.cpp leaves them unspecified).
        partitioned = [i for i, a in enumerate(attrs) if a & _PARTITIONED]
        self._specials = sorted(
            ((tokens[i], i) for i in partitioned), key=lambda t: -len(t[0].encode())
        )
        self._special_first_chars = frozenset(text[0] for text, _ in self._specials)
        # Ids of recently encoded fragments (text between special tokens: in a chat, one message
        # each). A chat re-sends the whole conversation every turn and it is tokenized more than
        # once per turn (context fitting, then the request), so without this every message is
        # re-tokenized every time, holding the GIL. Exact: fragments are tokenized independently.
        self._fragment_ids: dict[str, tuple[int, ...]] = {}
        self._fragment_lock = threading.Lock()

    # --- construction ------------------------------------------------------------------------
    @classmethod
    def from_gguf(cls, gguf_file) -> Tokenizer:
        """Build from an engine.gguf.GGUFFile (anything with a `.metadata` dict). While a
        tokenizer for the same file is alive (e.g. the app reloading a model with new settings)
        it is reused: building a 262k-token SentencePiece vocabulary takes seconds (deriving
        ~500k merges) and ~145 MB, so it is shared, but never kept alive by the cache itself."""
        key = _file_identity(gguf_file)
        if key is not None:
            with _CACHE_LOCK:
                cached = _CACHE.get(key)
            if cached is not None:
                return cached
        tokenizer = cls.from_metadata(gguf_file.metadata)
        if key is not None:
            with _CACHE_LOCK:
                _CACHE[key] = tokenizer
        return tokenizer

    @classmethod
    def from_metadata(cls, metadata: Mapping[str, Any]) -> Tokenizer:
        """Build from GGUF metadata values (`tokenizer.ggml.*` keys)."""
        return _build(metadata)

    # --- encoding ----------------------------------------------------------------------------
    def encode(self, text: str, add_special: bool = True) -> list[int]:
        """Token ids for `text`. Special-token text (e.g. "<|im_start|>") always becomes its single
        id; `add_special` adds BOS/EOS as the file says (False adds none)."""
        if not isinstance(text, str):
            raise TypeError(f"encode() takes a str, not {type(text).__name__}")
        ids: list[int] = []
        if add_special and self.add_bos:
            ids.append(self.bos_id)
        # One encode call per piece, not encode_batch: batch mode starts HF's thread pool, which
        # competes with the engine's own threads and warns/deadlocks if the process forks later.
        for fragment in self._partition(text):
            if isinstance(fragment, str):
                ids.extend(self._encode_fragment(fragment))
            else:
                ids.append(fragment)
        if add_special and self.add_eos:
            ids.append(self.eos_id)
        return ids

    _FRAGMENT_CACHE_ENTRIES = 2048
    _FRAGMENT_CACHE_MIN_CHARS = 32  # shorter ones are cheaper to encode than to remember

    def _encode_fragment(self, fragment: str) -> tuple[int, ...] | list[int]:
        if len(fragment) < self._FRAGMENT_CACHE_MIN_CHARS:
            return self.hf.encode(fragment, add_special_tokens=False).ids
        with self._fragment_lock:
            cached = self._fragment_ids.pop(fragment, None)
            if cached is not None:
                self._fragment_ids[fragment] = cached  # re-insert: most recently used last
                return cached
        ids = tuple(self.hf.encode(fragment, add_special_tokens=False).ids)
        with self._fragment_lock:
            self._fragment_ids[fragment] = ids
            while len(self._fragment_ids) > self._FRAGMENT_CACHE_ENTRIES:
                del self._fragment_ids[next(iter(self._fragment_ids))]  # least recently used
        return ids

    def _partition(self, text: str) -> list[str | int]:
        """Split text into raw pieces and special-token ids exactly as llama.cpp's
        tokenizer_st_partition does: specials in order of decreasing length, each one's
        occurrences left to right, and an occurrence only counts if no earlier (longer) special
        already took any of its characters.

        llama.cpp re-scans every fragment for every special; with Gemma's 6.4k specials and text
        cut into thousands of fragments by its whitespace-run tokens that is slow in Python. We
        find every occurrence of every special in one pass with a trie, then replay llama.cpp's
        order over those occurrences, which gives the same cuts."""
        if not text or not self._special_first_chars.intersection(text):
            return [text] if text else []
        trie, end_key = self._special_trie()
        occurrences: dict[int, list[int]] = {}
        n = len(text)
        for match in self._special_start_re.finditer(text):
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
        if not occurrences:
            return [text]
        taken = bytearray(n)
        cuts: list[tuple[int, int, int]] = []  # (start, end, token id)
        for rank in sorted(occurrences):
            special, special_id = self._specials[rank]
            length = len(special)
            mark = b"\x01" * length
            for p in occurrences[rank]:  # ascending
                if taken.find(1, p, p + length) == -1:
                    taken[p : p + length] = mark
                    cuts.append((p, p + length, special_id))
        cuts.sort()
        fragments: list[str | int] = []
        pos = 0
        for start, stop, special_id in cuts:
            if start > pos:
                fragments.append(text[pos:start])
            fragments.append(special_id)
            pos = stop
        if pos < n:
            fragments.append(text[pos:])
        return fragments

    def _special_trie(self) -> tuple[dict, object]:
        """Character trie of the special texts (built on first use); terminal nodes hold the
        special's rank in llama.cpp's processing order under a private key."""
        trie = self.__dict__.get("_trie")
        if trie is None:
            end_key = object()
            trie = {}
            for rank, (special, _) in enumerate(self._specials):
                node = trie
                for ch in special:
                    node = node.setdefault(ch, {})
                node.setdefault(end_key, rank)  # identical texts: the first (lowest id) wins
            starts = "".join(sorted(self._special_first_chars))
            # Publish the regex before the trie: another thread may see the trie and use both.
            self.__dict__["_special_start_re"] = re.compile("[" + re.escape(starts) + "]")
            self.__dict__["_trie"] = trie = (trie, end_key)
        return trie

    # --- decoding ----------------------------------------------------------------------------

    def piece_bytes(self, token_id: int, *, special: bool = False) -> bytes:
        """The bytes one token contributes to text (llama.cpp token_to_piece): with special=False
        control tokens give b"", byte pieces one byte, "▁" a space. `decode` additionally drops
        the first token's leading space for add_space_prefix vocabularies."""
        self._check_id(token_id)
        return (self._special_pieces if special else self._pieces)[token_id]

    def piece(self, token_id: int) -> str:
        """A token as a person should see it in a token list: special tokens as their text, normal
        pieces as their text; a piece that is only part of a UTF-8 character shows as <0xXX>."""
        self._check_id(token_id)
        raw = self._special_pieces[token_id]
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError:
            return "".join(chr(b) if b < 0x80 else f"<0x{b:02X}>" for b in raw)

    def decode(self, ids: Iterable[int], *, special: bool = False) -> str:
        """Text of `ids` as llama.cpp's llama_detokenize(remove_special=False, unparse_special=
        special) gives it (without its clean_spaces pass, see the module docstring). Bytes that
        are not valid UTF-8 become U+FFFD."""
        return self.decode_bytes(ids, special=special).decode("utf-8", errors="replace")

    def decode_bytes(self, ids: Iterable[int], *, special: bool = False) -> bytes:
        table = self._special_pieces if special else self._pieces
        out = []
        n = self.vocab_size
        for k, token_id in enumerate(ids):
            if not 0 <= token_id < n:
                self._check_id(token_id)
            piece = table[token_id]
            if k == 0 and self.add_space_prefix and piece.startswith(b" "):
                piece = piece[1:]
            out.append(piece)
        text = b"".join(out)
        return clean_spaces(text) if self.clean_spaces else text

    def is_eog(self, token_id: int) -> bool:
        return token_id in self.eog_ids

    def is_special(self, token_id: int) -> bool:
        """Control/unknown token: hidden from user-visible text."""
        self._check_id(token_id)
        return bool(self.attrs[token_id] & _HIDDEN)

    def token_id(self, text: str) -> int | None:
        """The id whose token text is exactly `text` (e.g. "<end_of_turn>"), or None."""
        return self._text_to_id.get(text)

    @property
    def _text_to_id(self) -> dict[str, int]:
        table = self.__dict__.get("_text_to_id_table")
        if table is None:
            table = {t: i for i, t in enumerate(self.tokens)}  # later ids win, as in llama.cpp
            self.__dict__["_text_to_id_table"] = table
        return table

    def _check_id(self, token_id: int) -> None:
        if (
            not (isinstance(token_id, int) or hasattr(token_id, "__index__"))
            or not 0 <= token_id < self.vocab_size
        ):
            raise TokenizerError(
                f"token id {token_id!r} is out of range: the vocabulary has ids 0..{self.vocab_size - 1}"
            )

    def _render_all(self) -> list[bytes]:
        """_render for every id; the common case (normal pieces) in one comprehension."""
        if self.model == "llama":
            fast = [t.replace(SPACE_ESCAPE, " ").encode("utf-8") for t in self.tokens]
        else:
            fast = [_byte_level_decode(t) for t in self.tokens]
        return [
            p if a == ATTR_NORMAL else self._render(i)
            for i, (a, p) in enumerate(zip(self.attrs, fast, strict=True))
        ]

    def _render(self, token_id: int) -> bytes:
        """llama.cpp's token_to_piece(special=True) for one id (before the first-token space strip)."""
        attr = self.attrs[token_id]
        text = self.tokens[token_id]
        if attr & (_HIDDEN | ATTR_USER_DEFINED):
            return text.encode("utf-8")
        if attr & ATTR_NORMAL:
            if self.model == "llama":
                return text.replace(SPACE_ESCAPE, " ").encode("utf-8")
            return _byte_level_decode(text)
        if attr & ATTR_BYTE:
            if self.model == "llama" or text.startswith("<0x"):
                return bytes([int(text[3:5], 16)])
            return _byte_level_decode(text)  # a BPE byte token is its byte-level character
        return b""  # unused / undefined tokens render as nothing

    def __repr__(self) -> str:
        return (f"Tokenizer(model={self.model!r}, pre={self.pre!r}, vocab_size={self.vocab_size}, "
                f"bos={self.bos_id}, eos={self.eos_id}, eog={sorted(self.eog_ids)})")  # fmt: skip


# Byte-level character -> the Latin-1 character of its byte, so one str.translate + encode decodes.
_BYTE_LEVEL_TO_LATIN1 = str.maketrans({c: chr(b) for c, b in UNICODE_TO_BYTE.items()})


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


# Live tokenizers by file (path, size, mtime); a tokenizer is immutable, so sharing is safe.
_CACHE: weakref.WeakValueDictionary[tuple, Tokenizer] = weakref.WeakValueDictionary()
_CACHE_LOCK = threading.Lock()


def _file_identity(gguf_file) -> tuple | None:
    path = getattr(gguf_file, "path", None)
    if path is None:
        return None
    try:
        stat = os.stat(path)
    except OSError:
        return None
    return (os.path.realpath(path), stat.st_size, stat.st_mtime_ns)


def _byte_level_decode(text: str) -> bytes:
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


# --- building --------------------------------------------------------------------------------------
def _meta_list(metadata: Mapping[str, Any], key: str, n: int, kind: str) -> list | None:
    value = metadata.get(key)
    if value is None:
        return None
    if not isinstance(value, (list, tuple)):
        raise TokenizerError(f"{key} must be an array of {kind}, got {type(value).__name__}")
    if len(value) < n:
        raise TokenizerError(f"{key} has {len(value)} entries, fewer than the {n} tokens")
    return list(value)


def _meta_id(metadata: Mapping[str, Any], key: str, n: int) -> int | None:
    value = metadata.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise TokenizerError(f"{key} must be an integer token id, got {value!r}")
    if not 0 <= value < n:
        log.warning("%s = %d is outside the vocabulary (0..%d); ignoring it", key, value, n - 1)
        return None
    return value


def _build(metadata: Mapping[str, Any]) -> Tokenizer:
    model = metadata.get("tokenizer.ggml.model")
    if model is None:
        raise TokenizerError("the model file has no tokenizer (tokenizer.ggml.model is missing)")
    if model not in SUPPORTED_MODELS:
        raise TokenizerError(
            f"tokenizer model {model!r} is not supported: supported are {', '.join(SUPPORTED_MODELS)} "
            "(llama = SentencePiece, gpt2 = byte-level BPE)"
        )
    tokens = metadata.get("tokenizer.ggml.tokens")
    if not isinstance(tokens, (list, tuple)) or not tokens:
        raise TokenizerError(
            "the model file has no vocabulary (tokenizer.ggml.tokens is missing or empty)"
        )
    n = len(tokens)
    tokens = [t if t else f"[EMPTY_{i}]" for i, t in enumerate(tokens)]  # as llama.cpp does
    if not all(isinstance(t, str) for t in tokens):
        raise TokenizerError("tokenizer.ggml.tokens must be an array of strings")
    types = _meta_list(metadata, "tokenizer.ggml.token_type", n, "integers")
    attrs = (
        [_TYPE_TO_ATTR.get(t, ATTR_UNDEFINED) for t in types[:n]] if types else [ATTR_NORMAL] * n
    )
    scores = _meta_list(metadata, "tokenizer.ggml.scores", n, "numbers")
    scores = [float(s) for s in scores[:n]] if scores else [0.0] * n

    pre_name = metadata.get("tokenizer.ggml.pre")
    pre = None
    if model == "gpt2":
        if pre_name is None:
            log.warning("the model file names no pre-tokenizer (tokenizer.ggml.pre); using llama.cpp's "
                        "'default' rules, generation quality may be degraded")  # fmt: skip
            pre_name = "default"
        pre = PRE_TOKENIZERS.get(pre_name)
        if pre is None:
            raise TokenizerError(
                f"pre-tokenizer {pre_name!r} (tokenizer.ggml.pre) is not supported: supported are "
                f"{', '.join(sorted(PRE_TOKENIZERS))}"
            )
        add_bos_default, add_space_prefix_default = pre.add_bos_default, False
    else:
        add_bos_default, add_space_prefix_default = True, True

    add_bos = bool(metadata.get("tokenizer.ggml.add_bos_token", add_bos_default))
    add_eos = bool(metadata.get("tokenizer.ggml.add_eos_token", False))
    add_space_prefix = bool(
        metadata.get("tokenizer.ggml.add_space_prefix", add_space_prefix_default)
    )
    bos_id = _meta_id(metadata, "tokenizer.ggml.bos_token_id", n)
    eos_id = _meta_id(metadata, "tokenizer.ggml.eos_token_id", n)
    if model == "llama":  # llama.cpp's SPM defaults when the file names none
        bos_id = (
            1
            if bos_id is None and "tokenizer.ggml.bos_token_id" not in metadata and n > 1
            else bos_id
        )
        eos_id = (
            2
            if eos_id is None and "tokenizer.ggml.eos_token_id" not in metadata and n > 2
            else eos_id
        )
    if add_bos and bos_id is None:
        raise TokenizerError(
            "tokenizer.ggml.add_bos_token is set but the file has no valid bos_token_id"
        )
    if add_eos and eos_id is None:
        raise TokenizerError(
            "tokenizer.ggml.add_eos_token is set but the file has no valid eos_token_id"
        )

    vocab = _vocab_dict(tokens)
    eot_id, eog_ids = _end_of_generation(metadata, tokens, attrs, eos_id, n, vocab)

    if model == "llama":
        hf = _build_spm(
            tokens,
            vocab,
            attrs,
            scores,
            add_space_prefix,
            metadata,
            bos_id,
            eos_id,
            add_bos,
            add_eos,
        )
    else:
        merges = metadata.get("tokenizer.ggml.merges")
        if not isinstance(merges, (list, tuple)):
            raise TokenizerError("a gpt2 tokenizer needs tokenizer.ggml.merges, which is missing")
        hf = _build_bpe(tokens, vocab, attrs, list(merges), pre, bos_id, eos_id, add_bos, add_eos)

    return Tokenizer(
        model=model, tokens=tokens, attrs=attrs, hf=hf, bos_id=bos_id, eos_id=eos_id, eot_id=eot_id,
        eog_ids=eog_ids, add_bos=add_bos, add_eos=add_eos, add_space_prefix=add_space_prefix,
        pre=pre_name if model == "gpt2" else None, clean_spaces=bool(pre and pre.clean_spaces),
    )  # fmt: skip


def _end_of_generation(
    metadata, tokens, attrs, eos_id, n, text_to_id
) -> tuple[int | None, frozenset[int]]:
    """llama.cpp's end-of-generation set: eos/eot/eom ids from the file, tokens recognised by text
    (<|im_end|>, <end_of_turn>, </s>, ...) and the FIM pad/repo/file-separator tokens. Tokens it
    recognises by text are forced to control type (hidden in text), as llama.cpp does."""

    def by_key_or_text(key: str, texts: Iterable[str]) -> int | None:
        token_id = _meta_id(metadata, key, n)
        if token_id is not None:
            return token_id
        for text in texts:  # llama.cpp walks a hash map here; all candidates count the same
            if text in text_to_id:
                token_id = text_to_id[text]
                attrs[token_id] |= ATTR_CONTROL
                return token_id
        return None

    eot_id = by_key_or_text("tokenizer.ggml.eot_token_id", _EOT_TEXTS)
    eom_id = by_key_or_text("tokenizer.ggml.eom_token_id", _EOM_TEXTS)
    fim_ids = [
        by_key_or_text("tokenizer.ggml.fim_pad_token_id", _FIM_PAD_TEXTS),
        by_key_or_text("tokenizer.ggml.fim_rep_token_id", _FIM_REP_TEXTS),
        by_key_or_text("tokenizer.ggml.fim_sep_token_id", _FIM_SEP_TEXTS),
    ]
    for text in _FIM_OTHER_TEXTS:  # prefix/suffix/middle are forced to control type too
        if text in text_to_id:
            attrs[text_to_id[text]] |= ATTR_CONTROL

    eog = {i for i in fim_ids if i is not None}
    for text, token_id in text_to_id.items():
        if text in _EOG_TEXTS:
            eog.add(token_id)
            attrs[token_id] |= ATTR_CONTROL
    for text in _ALWAYS_RENDERED:
        if text in text_to_id:
            attrs[text_to_id[text]] = ATTR_USER_DEFINED
    for token_id in (eos_id, eot_id, eom_id):
        if token_id is not None:
            eog.add(token_id)
    # o200k_harmony / solar-open: "<|end|>" ends a message, not the generation.
    texts = {tokens[i] for i in eog}
    if "<|end|>" in texts and (
        ({"<|return|>", "<|call|>"} <= texts) or ({"<|calls|>", "<|flush|>"} <= texts)
    ):
        end_id = next(i for i in eog if tokens[i] == "<|end|>")
        eog.discard(end_id)
        attrs[end_id] = ATTR_USER_DEFINED
    # gemma4 / plamo have a normal "</s>".
    if texts & {"<|tool_response>", "<|plamo:eos|>"} and "</s>" in texts:
        s_id = next(i for i in eog if tokens[i] == "</s>")
        eog.discard(s_id)
        attrs[s_id] = ATTR_NORMAL
    for i, text in enumerate(tokens):  # control tokens named "unused" are also unused
        if attrs[i] & ATTR_CONTROL and "unused" in text:
            attrs[i] |= ATTR_UNUSED
    return eot_id, frozenset(eog)


def _added_tokens(tokens: list[str], attrs: list[int]) -> list[AddedToken]:
    """Special tokens for the HF tokenizer, matched on raw text like llama.cpp's partition."""
    return [
        AddedToken(
            tokens[i],
            special=bool(attrs[i] & _HIDDEN),
            normalized=False,
            single_word=False,
            lstrip=False,
            rstrip=False,
        )  # fmt: skip
        for i in range(len(tokens))
        if attrs[i] & _PARTITIONED
    ]


def _post_processor(tokens, bos_id, eos_id, add_bos, add_eos):
    single, special = "$A", []
    if add_bos:
        single = f"{tokens[bos_id]}:0 {single}"
        special.append((tokens[bos_id], bos_id))
    if add_eos:
        single = f"{single} {tokens[eos_id]}:0"
        if eos_id != bos_id:
            special.append((tokens[eos_id], eos_id))
    if not special:
        return None
    pair = f"{single} {single.replace('$A', '$B').replace(':0', ':1')}"
    return processors.TemplateProcessing(single=single, pair=pair, special_tokens=special)


def _vocab_dict(tokens: list[str]) -> dict[str, int]:
    return {t: i for i, t in enumerate(tokens)}  # later ids win, as in llama.cpp


def _spm_merges(tokens: list[str], attrs: list[int], scores: list[float], vocab: dict[str, int]):
    """Every way to build a piece from two pieces, best piece score first. llama.cpp merges the
    adjacent pair whose concatenation is the highest-scoring vocabulary entry, which is exactly
    BPE with these ranks. (The hot loop of loading a SentencePiece model: ~1.5M lookups for
    Gemma's 262k pieces, ~1.2 s; a sort of flat tuples measured faster than per-token lists.)"""
    ranked = []
    for token_id, text in enumerate(tokens):
        if len(text) < 2 or attrs[token_id] & _PARTITIONED:
            continue  # special text never reaches the merger: the partition removed it
        if vocab[text] != token_id:
            continue  # a duplicated text: llama.cpp looks it up to the last id, and so do we
        score = scores[token_id]
        for k in range(1, len(text)):
            left, right = text[:k], text[k:]
            if left in vocab and right in vocab:
                ranked.append((-score, token_id, k, left, right))
    ranked.sort()
    return [(left, right) for _, _, _, left, right in ranked]


# Derived SentencePiece merges are kept on disk, keyed by a hash of everything they depend on:
# deriving Gemma 3's takes ~1.2 s of CPU, reading them back ~0.15 s, and that was most of the
# model's load time. Set to None to disable (tests point it at a temporary directory).
MERGES_CACHE_DIR: Path | None = Path(platformdirs.user_cache_dir("LocalChat")) / "tokenizers"
_MERGES_FORMAT = b"spm-merges-v2"
_SEP = "\0"  # between pieces in the cache file; a vocabulary with NUL in a piece is not cached


def _spm_merges_cache_path(tokens: list[str], attrs: list[int], scores: list[float]) -> Path | None:
    if MERGES_CACHE_DIR is None:
        return None
    h = hashlib.sha256(_MERGES_FORMAT)
    h.update(_SEP.join(tokens).encode("utf-8", "surrogatepass"))
    h.update(array("d", scores).tobytes())
    h.update(bytes(1 if a & _PARTITIONED else 0 for a in attrs))
    return MERGES_CACHE_DIR / f"{h.hexdigest()[:40]}.merges"


def _read_cached_merges(path: Path | None) -> list[tuple[str, str]] | None:
    """Merges from the cache file, or None if it is missing or damaged (its header holds the
    merge count and a sha256 of the rest; the BPE constructor then checks every piece is in the
    vocabulary). Whatever fails is derived again and the file replaced."""
    if path is None:
        return None
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        log.warning("ignoring unreadable tokenizer cache file %s: %s", path, exc)
        return None
    header, _, payload = text.partition("\n")
    count, _, digest = header.partition(" ")
    pieces = payload.split(_SEP) if payload else []
    if digest != hashlib.sha256(payload.encode("utf-8")).hexdigest() or count != str(
        len(pieces) // 2
    ):
        log.warning("ignoring damaged tokenizer cache file %s", path)
        return None
    it = iter(pieces)
    return list(zip(it, it, strict=True))


def _write_cached_merges(path: Path | None, merges: list[tuple[str, str]]) -> None:
    if path is None or any(_SEP in left or _SEP in right for left, right in merges):
        return
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.{threading.get_ident()}.tmp")
        payload = _SEP.join(piece for pair in merges for piece in pair)
        header = f"{len(merges)} {hashlib.sha256(payload.encode('utf-8')).hexdigest()}"
        tmp.write_text(header + "\n" + payload, encoding="utf-8")
        os.replace(tmp, path)  # atomic: a concurrent reader sees no file or the whole file
    except OSError as exc:
        log.info(
            "cannot write the tokenizer cache (%s); merges will be derived again next time", exc
        )


def _build_spm(
    tokens, vocab, attrs, scores, add_space_prefix, metadata, bos_id, eos_id, add_bos, add_eos
) -> HFTokenizer:
    unk_id = _meta_id(metadata, "tokenizer.ggml.unknown_token_id", len(tokens))
    unk = tokens[unk_id] if unk_id is not None else None
    cache_path = _spm_merges_cache_path(tokens, attrs, scores)
    bpe = None
    cached = _read_cached_merges(cache_path)
    if cached is not None:
        try:
            bpe = models.BPE(
                vocab=vocab, merges=cached, unk_token=unk, byte_fallback=True, fuse_unk=False
            )
        except (
            Exception
        ):  # the Rust side reports pieces missing from the vocab as a plain Exception
            log.warning("ignoring inconsistent tokenizer cache file %s", cache_path)
    if bpe is None:
        merges = _spm_merges(tokens, attrs, scores, vocab)
        try:
            bpe = models.BPE(
                vocab=vocab, merges=merges, unk_token=unk, byte_fallback=True, fuse_unk=False
            )
        except Exception as exc:
            raise TokenizerError(f"cannot build the SentencePiece tokenizer: {exc}") from exc
        _write_cached_merges(cache_path, merges)
    hf = HFTokenizer(bpe)
    steps = [normalizers.Prepend(SPACE_ESCAPE)] if add_space_prefix else []
    hf.normalizer = normalizers.Sequence(steps + [normalizers.Replace(" ", SPACE_ESCAPE)])
    dec = [decoders.Replace(SPACE_ESCAPE, " "), decoders.ByteFallback(), decoders.Fuse()]
    if add_space_prefix:
        dec.append(decoders.Strip(" ", 1, 0))
    hf.decoder = decoders.Sequence(dec)
    hf.add_special_tokens(_added_tokens(tokens, attrs))
    post = _post_processor(tokens, bos_id, eos_id, add_bos, add_eos)
    if post is not None:
        hf.post_processor = post
    return hf


def _build_bpe(
    tokens, vocab, attrs, merges, pre: PreTokenizer, bos_id, eos_id, add_bos, add_eos
) -> HFTokenizer:
    pairs = []
    for merge in merges:
        # llama.cpp splits "a b" at the first space after the first character.
        cut = merge.find(" ", 1)
        if cut < 0:
            raise TokenizerError(
                f"tokenizer.ggml.merges entry {merge!r} is not two pieces separated by a space"
            )
        left, right = merge[:cut], merge[cut + 1 :]
        if left in vocab and right in vocab and left + right in vocab:
            pairs.append((left, right))
    try:
        bpe = models.BPE(vocab=vocab, merges=pairs, ignore_merges=pre.ignore_merges, fuse_unk=False)
    except Exception as exc:  # the Rust side reports inconsistent vocab/merges as a plain Exception
        raise TokenizerError(f"cannot build the BPE tokenizer: {exc}") from exc
    hf = HFTokenizer(bpe)
    splits = [
        pre_tokenizers.Split(Regex(r), behavior="isolated", invert=False) for r in pre.regexes
    ]
    byte_level = pre_tokenizers.ByteLevel(
        add_prefix_space=False, trim_offsets=False, use_regex=False
    )
    hf.pre_tokenizer = pre_tokenizers.Sequence(splits + [byte_level])
    hf.decoder = decoders.ByteLevel()
    hf.add_special_tokens(_added_tokens(tokens, attrs))
    post = _post_processor(tokens, bos_id, eos_id, add_bos, add_eos)
    if post is not None:
        hf.post_processor = post
    return hf


__all__ = ["Tokenizer", "PRE_TOKENIZERS", "SUPPORTED_MODELS", "clean_spaces"]
