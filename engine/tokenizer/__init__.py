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

The package, one concern per file: `llama_tables` (token types, pre-tokenizer regexes, the texts
llama.cpp recognises), `metadata` (reading and checking `tokenizer.ggml.*`), `partition` (the
special-token cut), `spm_merges` (SentencePiece merges and their disk cache), `hf_build` (the HF
tokenizers), `decoding` (token -> bytes, space clean-up), and here the public `Tokenizer`.
"""

from __future__ import annotations

import logging
import os
import threading
import weakref
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import platformdirs
from tokenizers import Tokenizer as HFTokenizer

from engine.errors import TokenizerError
from engine.gguf import StringArray
from engine.tokenizer import hf_build, spm_merges
from engine.tokenizer.decoding import PieceTable, clean_spaces, clean_spaces_cut, render_pieces
from engine.tokenizer.llama_tables import (
    HIDDEN,
    PARTITIONED,
    PRE_TOKENIZERS,
    SUPPORTED_MODELS,
    PreTokenizer,
)
from engine.tokenizer.metadata import Vocabulary, read_vocabulary
from engine.tokenizer.partition import LiteralText, SpecialPartition

log = logging.getLogger(__name__)

# Derived SentencePiece merges are kept on disk (see spm_merges). Set to None to disable (tests
# point it at a temporary directory).
MERGES_CACHE_DIR: Path | None = Path(platformdirs.user_cache_dir("LocalChat")) / "tokenizers"


def _spm_merges(tokens: list[str], attrs: list[int], scores, vocab: dict[str, int]):
    return spm_merges.derive_merges(tokens, attrs, scores, vocab, skip_attrs=PARTITIONED)


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
        token_array: StringArray | None = None,
    ):
        """tokens: the texts while building (a list); the tokenizer keeps them as a StringArray
        (`token_array` when the caller has one) and the pieces as a PieceTable, not as 262k str
        and bytes objects (issue 32)."""
        self.model = model  # "llama" (SentencePiece) or "gpt2" (byte-level BPE)
        self.pre = pre
        self.tokens = token_array if token_array is not None else StringArray.from_list(tokens)
        # llama.cpp's attribute bits (< 64) one byte per token: indexing gives ints as the list did
        self.attrs = bytes(attrs)
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
        self._special_pieces = PieceTable.from_pieces(render_pieces(model, tokens, attrs))
        # User-visible text hides control and unknown tokens (token_to_piece with special=False).
        hidden = np.frombuffer(self.attrs, dtype=np.uint8) & HIDDEN != 0
        self._pieces = self._special_pieces.hiding(hidden)
        self._specials = SpecialPartition(tokens, attrs, PARTITIONED, not_in_literal_attrs=HIDDEN)
        self._text_only_hf: HFTokenizer | None = None  # built on first use, see _encode_literal
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
    def encode(
        self, text: str, add_special: bool = True, *, literal_spans: Iterable[tuple[int, int]] = ()
    ) -> list[int]:
        """Token ids for `text`. Special-token text (e.g. "<|im_start|>") becomes its single id,
        except inside `literal_spans` ((start, end) character ranges, e.g. the messages of a
        rendered chat), where control-token text is ordinary text, as llama.cpp's
        parse_special=false gives it. `add_special` adds BOS/EOS as the file says (False adds
        none)."""
        if not isinstance(text, str):
            raise TypeError(f"encode() takes a str, not {type(text).__name__}")
        ids: list[int] = []
        # read_vocabulary refuses add_bos/add_eos without the token id; the None checks narrow it
        if add_special and self.add_bos and self.bos_id is not None:
            ids.append(self.bos_id)
        # One encode call per piece, not encode_batch: batch mode starts HF's thread pool, which
        # competes with the engine's own threads and warns/deadlocks if the process forks later.
        for fragment in self._specials.split(text, literal_spans):
            if isinstance(fragment, LiteralText):
                ids.extend(self._encode_literal(fragment))
            elif isinstance(fragment, str):
                ids.extend(self._encode_fragment(fragment))
            else:
                ids.append(fragment)
        if add_special and self.add_eos and self.eos_id is not None:
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

    def _encode_literal(self, fragment: str) -> list[int]:
        """Ids of text that holds special-token text, all of it as text. `.hf` would match the
        special texts (its added tokens), so this uses a second HF tokenizer on the same BPE
        model (shared, not copied) with the same normalizer and pre-tokenizer and no added
        tokens: on text without special text the two give the same ids."""
        hf = self._text_only_hf
        if hf is None:
            hf = HFTokenizer(self.hf.model)
            hf.normalizer = self.hf.normalizer
            hf.pre_tokenizer = self.hf.pre_tokenizer
            self._text_only_hf = hf
        return hf.encode(fragment, add_special_tokens=False).ids

    def _partition(self, text: str) -> list[str | int]:
        """Text between special tokens and the special tokens' ids, as llama.cpp cuts it."""
        return self._specials.split(text)

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
        return bool(self.attrs[token_id] & HIDDEN)

    def token_id(self, text: str) -> int | None:
        """The id whose token text is exactly `text` (e.g. "<end_of_turn>"), or None.
        Looked up in the HF model's vocabulary (built from the same texts, later ids winning as
        in llama.cpp) instead of a Python table of every token (Gemma 3: ~14 MiB; issue 32)."""
        if not isinstance(text, str):
            return None
        return self.hf.token_to_id(text)

    def _check_id(self, token_id: int) -> None:
        if (
            not (isinstance(token_id, int) or hasattr(token_id, "__index__"))
            or not 0 <= token_id < self.vocab_size
        ):
            raise TokenizerError(
                f"token id {token_id!r} is out of range: the vocabulary has ids 0..{self.vocab_size - 1}"
            )

    def __repr__(self) -> str:
        return (f"Tokenizer(model={self.model!r}, pre={self.pre!r}, vocab_size={self.vocab_size}, "
                f"bos={self.bos_id}, eos={self.eos_id}, eog={sorted(self.eog_ids)})")  # fmt: skip


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


def _build(metadata: Mapping[str, Any]) -> Tokenizer:
    v = read_vocabulary(metadata)
    if v.model == "llama":
        hf = hf_build.spm_tokenizer(
            _spm_bpe(v), v.tokens, v.attrs, v.add_space_prefix, v.bos_id, v.eos_id, v.add_bos,
            v.add_eos,
        )  # fmt: skip
    else:
        assert v.pre is not None  # read_vocabulary resolves (or refuses) every gpt2 pre-tokenizer
        hf = hf_build.bpe_tokenizer(
            v.tokens, v.text_to_id(), v.attrs, v.merges, v.pre, v.bos_id, v.eos_id, v.add_bos,
            v.add_eos,
        )  # fmt: skip
    return Tokenizer(
        model=v.model, tokens=v.tokens, attrs=v.attrs, hf=hf, bos_id=v.bos_id, eos_id=v.eos_id,
        eot_id=v.eot_id, eog_ids=v.eog_ids, add_bos=v.add_bos, add_eos=v.add_eos,
        add_space_prefix=v.add_space_prefix, pre=v.pre_name,
        clean_spaces=bool(v.pre and v.pre.clean_spaces), token_array=v.token_array,
    )  # fmt: skip


def _spm_bpe(v: Vocabulary):
    """The SentencePiece BPE model, its merges read from the disk cache when it has them. The
    vocabulary table and the merge list are temporaries (Gemma 3: ~60 MiB), dropped as soon as
    the Rust side has built its own tables from them."""
    unk = v.tokens[v.unk_id] if v.unk_id is not None else None
    special = bytes(1 if a & PARTITIONED else 0 for a in v.attrs)
    cache_path = spm_merges.cache_path(MERGES_CACHE_DIR, v.tokens, v.scores, special)
    vocab = v.text_to_id()
    cached = spm_merges.read_cached(cache_path)
    if cached is not None and (cached.size == 0 or int(cached.max()) < len(v.tokens)):
        try:
            return hf_build.spm_model(vocab, spm_merges.merges_from_ids(cached, v.tokens), unk)
        except TokenizerError:
            log.warning("ignoring inconsistent tokenizer cache file %s", cache_path)
    elif cached is not None:
        log.warning("ignoring tokenizer cache file %s: ids outside the vocabulary", cache_path)
    merges = _spm_merges(v.tokens, v.attrs, v.scores.tolist(), vocab)
    bpe = hf_build.spm_model(vocab, merges, unk)
    spm_merges.write_cached(cache_path, spm_merges.merge_ids(merges, vocab))
    return bpe


__all__ = [
    "PRE_TOKENIZERS",
    "SUPPORTED_MODELS",
    "PreTokenizer",
    "Tokenizer",
    "clean_spaces",
    "clean_spaces_cut",
]
