"""WordPiece (BERT) tokenizers from a GGUF vocabulary (`tokenizer.ggml.model = "bert"`).

llama.cpp's converter (convert_hf_to_gguf.py, BertModel.set_vocab) stores a WordPiece vocabulary
in "phantom space" form: a word-initial piece `foo` is written `▁foo`, a continuation piece
`##foo` is written `foo`, and control tokens ([CLS], [SEP], ...) unchanged. We undo that mapping
and build HF `tokenizers`' own WordPiece pipeline (BERT normalizer: clean-up, CJK characters
split, lower-casing with accents stripped; BERT pre-tokenizer: whitespace and punctuation),
which is what the original model's tokenizer.json runs, so ids match the model's training.

The file does not say whether the model is cased. An uncased vocabulary has (almost) no
upper-case pieces, a cased one has thousands (`The`, `Paris`, ...): we lower-case when fewer
than 1% of the normal pieces contain an upper-case letter.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from tokenizers import Tokenizer as HFTokenizer
from tokenizers import decoders, models, normalizers, pre_tokenizers, processors

from engine.errors import TokenizerError
from engine.gguf import StringArray

PHANTOM_SPACE = "\u2581"
CONTINUATION = "##"
_CONTROL = 3  # llama.cpp token type of [CLS], [SEP], [PAD], [UNK], [MASK]
_CASED_SHARE = 0.01
# HF BertTokenizer's default: a longer "word" (a hash, a URL without spaces) becomes [UNK].
MAX_CHARS_PER_WORD = 100


@dataclass(frozen=True)
class WordPieceVocab:
    pieces: dict[str, int]  # HF form ("foo", "##foo", "[CLS]") -> id
    cls_id: int
    sep_id: int
    unk_id: int
    pad_id: int
    lowercase: bool

    @property
    def size(self) -> int:
        return len(self.pieces)


def read_wordpiece_vocab(metadata: Mapping[str, Any]) -> WordPieceVocab:
    """The WordPiece vocabulary of a GGUF file's metadata. Raises TokenizerError naming the key
    when it is missing, not a bert vocabulary, or lacks [CLS]/[SEP]/[UNK]."""
    model = metadata.get("tokenizer.ggml.model")
    if model != "bert":
        raise TokenizerError(
            f"tokenizer.ggml.model is {model!r}; an embedding model needs a WordPiece "
            "vocabulary ('bert')"
        )
    tokens = metadata.get("tokenizer.ggml.tokens")
    if isinstance(tokens, StringArray):  # a long vocabulary as engine.gguf stores it
        tokens = tokens.tolist()
    if not isinstance(tokens, list) or not tokens or not all(isinstance(t, str) for t in tokens):
        raise TokenizerError("tokenizer.ggml.tokens is missing or not a list of strings")
    types = metadata.get("tokenizer.ggml.token_type")
    if types is None:
        types = [_CONTROL if _looks_control(t) else 1 for t in tokens]
    if len(types) != len(tokens):
        raise TokenizerError(
            f"tokenizer.ggml.token_type has {len(types)} entries for {len(tokens)} tokens"
        )
    pieces: dict[str, int] = {}
    upper = normal = 0
    for i, (text, kind) in enumerate(zip(tokens, types, strict=True)):
        if int(kind) == _CONTROL:
            piece = text
        else:
            normal += 1
            upper += any(c.isupper() for c in text)
            piece = text[1:] if text.startswith(PHANTOM_SPACE) else CONTINUATION + text
        pieces.setdefault(piece, i)  # the first id wins, as in a vocab.txt read top-down
    by_text = {t: i for i, t in enumerate(tokens)}

    def special(key: str, text: str) -> int:
        value = metadata.get(key)
        if isinstance(value, int) and not isinstance(value, bool) and 0 <= value < len(tokens):
            return value
        if text in by_text:
            return by_text[text]
        raise TokenizerError(f"the vocabulary has no {text} token and the file sets no {key}")

    return WordPieceVocab(
        pieces=pieces,
        # llama.cpp keeps BERT's [CLS] in the BOS slot (it starts every sequence)
        cls_id=special("tokenizer.ggml.bos_token_id", "[CLS]"),
        sep_id=special("tokenizer.ggml.seperator_token_id", "[SEP]"),  # gguf's own spelling
        unk_id=special("tokenizer.ggml.unknown_token_id", "[UNK]"),
        pad_id=special("tokenizer.ggml.padding_token_id", "[PAD]"),
        lowercase=upper < _CASED_SHARE * max(normal, 1),
    )


def _looks_control(text: str) -> bool:
    return len(text) > 2 and text[0] == "[" and text[-1] == "]" and text[1:-1].isupper()


def wordpiece_tokenizer(vocab: WordPieceVocab, max_tokens: int) -> HFTokenizer:
    """An HF tokenizer giving `[CLS] pieces [SEP]`, truncated to `max_tokens` ids in all (the
    pieces are cut, [CLS] and [SEP] kept, as sentence-transformers truncates)."""
    id_to_piece = {i: p for p, i in vocab.pieces.items()}
    unk = id_to_piece[vocab.unk_id]
    try:
        hf = HFTokenizer(
            models.WordPiece(
                vocab.pieces,
                unk_token=unk,
                continuing_subword_prefix=CONTINUATION,
                max_input_chars_per_word=MAX_CHARS_PER_WORD,
            )
        )
    except Exception as exc:  # the Rust side reports a bad vocabulary as a plain Exception
        raise TokenizerError(f"cannot build the WordPiece tokenizer: {exc}") from exc
    hf.normalizer = normalizers.BertNormalizer(
        clean_text=True,
        handle_chinese_chars=True,
        strip_accents=None,  # None = follow lowercase, as BertTokenizer does
        lowercase=vocab.lowercase,
    )
    hf.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    cls, sep = id_to_piece[vocab.cls_id], id_to_piece[vocab.sep_id]
    hf.post_processor = processors.TemplateProcessing(
        single=f"{cls}:0 $A:0 {sep}:0",
        pair=f"{cls}:0 $A:0 {sep}:0 $B:1 {sep}:1",
        special_tokens=[(cls, vocab.cls_id), (sep, vocab.sep_id)],
    )
    hf.decoder = decoders.WordPiece(prefix=CONTINUATION)
    if max_tokens < 2:
        raise TokenizerError(f"max_tokens {max_tokens} leaves no room for [CLS] and [SEP]")
    hf.enable_truncation(max_length=max_tokens)
    return hf
