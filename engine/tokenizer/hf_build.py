"""The HF `tokenizers` objects that encode the text between special tokens.

- `llama` (SentencePiece) vocabularies: HF's BPE with the merges derived from the scores (see
  spm_merges), byte fallback (`<0xXX>` pieces for characters not in the vocabulary), spaces
  escaped as "▁", and no pre-tokenizer (llama.cpp does not pre-split SPM text).
- `gpt2` (byte-level BPE) vocabularies: the file's merges, and the pre-tokenizer regexes
  llama.cpp uses for the `tokenizer.ggml.pre` name.

Each is a complete standalone HF tokenizer (added tokens, normalizer, BOS post-processor,
decoder) for components that need one (llguidance in JSON mode); it gives the same ids as
engine.tokenizer.Tokenizer except where two special texts overlap (HF takes the leftmost,
llama.cpp the longest).
"""

from __future__ import annotations

from tokenizers import AddedToken, Regex, decoders, models, normalizers, pre_tokenizers, processors
from tokenizers import Tokenizer as HFTokenizer

from engine.errors import TokenizerError
from engine.tokenizer.llama_tables import HIDDEN, PARTITIONED, SPACE_ESCAPE, PreTokenizer


def spm_model(vocab: dict[str, int], merges: list[tuple[str, str]], unk: str | None) -> models.BPE:
    """Raises TokenizerError if a merge names a piece the vocabulary does not have."""
    try:
        return models.BPE(
            vocab=vocab, merges=merges, unk_token=unk, byte_fallback=True, fuse_unk=False
        )
    except (
        Exception
    ) as exc:  # the Rust side reports pieces missing from the vocab as a plain Exception
        raise TokenizerError(f"cannot build the SentencePiece tokenizer: {exc}") from exc


def spm_tokenizer(
    bpe: models.BPE, tokens, attrs, add_space_prefix, bos_id, eos_id, add_bos, add_eos
) -> HFTokenizer:
    hf = HFTokenizer(bpe)
    steps = [normalizers.Prepend(SPACE_ESCAPE)] if add_space_prefix else []
    hf.normalizer = normalizers.Sequence(steps + [normalizers.Replace(" ", SPACE_ESCAPE)])
    dec = [decoders.Replace(SPACE_ESCAPE, " "), decoders.ByteFallback(), decoders.Fuse()]
    if add_space_prefix:
        dec.append(decoders.Strip(" ", 1, 0))
    hf.decoder = decoders.Sequence(dec)
    _finish(hf, tokens, attrs, bos_id, eos_id, add_bos, add_eos)
    return hf


def bpe_tokenizer(
    tokens, vocab, attrs, merges, pre: PreTokenizer, bos_id, eos_id, add_bos, add_eos
) -> HFTokenizer:
    # One comprehension, not a loop with three vocabulary lookups per merge: a 151k-merge Qwen
    # vocabulary spends ~0.3 s of its load there, holding the GIL the weight loader wants.
    pairs = [_split_merge(m) if m[:1] == " " else tuple(m.split(" ", 1)) for m in merges]
    if any(len(pair) != 2 for pair in pairs):
        bad = next(m for m, pair in zip(merges, pairs, strict=True) if len(pair) != 2)
        raise TokenizerError(
            f"tokenizer.ggml.merges entry {bad!r} is not two pieces separated by a space"
        )
    try:
        bpe = _bpe_model(vocab, pairs, pre)
    except TokenizerError:
        # Some files list merges whose pieces (or their join) are not in the vocabulary;
        # llama.cpp skips those, and HF refuses the whole list, so drop them and try again.
        # (HF checks all three pieces, so the first try succeeds exactly when none is dropped.)
        pairs = [(a, b) for a, b in pairs if a in vocab and b in vocab and a + b in vocab]
        bpe = _bpe_model(vocab, pairs, pre)
    hf = HFTokenizer(bpe)
    splits = [
        pre_tokenizers.Split(Regex(r), behavior="isolated", invert=False) for r in pre.regexes
    ]
    byte_level = pre_tokenizers.ByteLevel(
        add_prefix_space=False, trim_offsets=False, use_regex=False
    )
    hf.pre_tokenizer = pre_tokenizers.Sequence(splits + [byte_level])
    hf.decoder = decoders.ByteLevel()
    _finish(hf, tokens, attrs, bos_id, eos_id, add_bos, add_eos)
    return hf


def _split_merge(merge: str) -> tuple[str, ...]:
    """llama.cpp splits "a b" at the first space after the first character (a merge can start
    with a space piece); () when there is none, which the caller reports."""
    cut = merge.find(" ", 1)
    return (merge[:cut], merge[cut + 1 :]) if cut > 0 else ()


def _bpe_model(vocab: dict[str, int], pairs: list, pre: PreTokenizer) -> models.BPE:
    try:
        return models.BPE(
            vocab=vocab, merges=pairs, ignore_merges=pre.ignore_merges, fuse_unk=False
        )
    except Exception as exc:  # the Rust side reports inconsistent vocab/merges as a plain Exception
        raise TokenizerError(f"cannot build the BPE tokenizer: {exc}") from exc


def _finish(hf: HFTokenizer, tokens, attrs, bos_id, eos_id, add_bos, add_eos) -> None:
    hf.add_special_tokens(_added_tokens(tokens, attrs))
    post = _post_processor(tokens, bos_id, eos_id, add_bos, add_eos)
    if post is not None:
        hf.post_processor = post


def _added_tokens(tokens: list[str], attrs: list[int]) -> list[AddedToken]:
    """Special tokens for the HF tokenizer, matched on raw text like llama.cpp's partition."""
    return [
        AddedToken(
            tokens[i],
            special=bool(attrs[i] & HIDDEN),
            normalized=False,
            single_word=False,
            lstrip=False,
            rstrip=False,
        )  # fmt: skip
        for i in range(len(tokens))
        if attrs[i] & PARTITIONED
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
