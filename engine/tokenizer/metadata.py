"""The `tokenizer.ggml.*` metadata of a GGUF file, read and checked: every value the tokenizer
uses is validated here, and a malformed one is a TokenizerError naming its key."""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from engine.errors import TokenizerError
from engine.tokenizer.llama_tables import (
    ALWAYS_RENDERED,
    ATTR_CONTROL,
    ATTR_NORMAL,
    ATTR_UNDEFINED,
    ATTR_UNUSED,
    ATTR_USER_DEFINED,
    EOG_TEXTS,
    EOM_TEXTS,
    EOT_TEXTS,
    FIM_OTHER_TEXTS,
    FIM_PAD_TEXTS,
    FIM_REP_TEXTS,
    FIM_SEP_TEXTS,
    PRE_TOKENIZERS,
    SUPPORTED_MODELS,
    TYPE_TO_ATTR,
    PreTokenizer,
)

log = logging.getLogger(__name__)


@dataclass
class Vocabulary:
    """What the tokenizer is built from, with llama.cpp's defaults filled in."""

    model: str  # "llama" (SentencePiece) or "gpt2" (byte-level BPE)
    tokens: list[str]
    attrs: list[int]  # llama.cpp's attribute bits per token (llama_tables.ATTR_*)
    scores: list[float]
    text_to_id: dict[str, int]  # later ids win, as in llama.cpp
    pre_name: str | None  # gpt2 only
    pre: PreTokenizer | None  # gpt2 only
    merges: list[str] | None  # gpt2 only: "left right" strings
    add_bos: bool
    add_eos: bool
    add_space_prefix: bool
    bos_id: int | None
    eos_id: int | None
    eot_id: int | None
    unk_id: int | None
    eog_ids: frozenset[int]


def meta_list(metadata: Mapping[str, Any], key: str, n: int, kind: str) -> list | None:
    value = metadata.get(key)
    if value is None:
        return None
    if not isinstance(value, (list, tuple)):
        raise TokenizerError(f"{key} must be an array of {kind}, got {type(value).__name__}")
    if len(value) < n:
        raise TokenizerError(f"{key} has {len(value)} entries, fewer than the {n} tokens")
    return list(value)


def meta_id(metadata: Mapping[str, Any], key: str, n: int) -> int | None:
    value = metadata.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise TokenizerError(f"{key} must be an integer token id, got {value!r}")
    if not 0 <= value < n:
        log.warning("%s = %d is outside the vocabulary (0..%d); ignoring it", key, value, n - 1)
        return None
    return value


def read_vocabulary(metadata: Mapping[str, Any]) -> Vocabulary:
    """Raises TokenizerError naming the key when the metadata cannot make a tokenizer."""
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
    types = meta_list(metadata, "tokenizer.ggml.token_type", n, "integers")
    attrs = [TYPE_TO_ATTR.get(t, ATTR_UNDEFINED) for t in types[:n]] if types else [ATTR_NORMAL] * n
    scores = meta_list(metadata, "tokenizer.ggml.scores", n, "numbers")
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
    bos_id = meta_id(metadata, "tokenizer.ggml.bos_token_id", n)
    eos_id = meta_id(metadata, "tokenizer.ggml.eos_token_id", n)
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

    text_to_id = {t: i for i, t in enumerate(tokens)}  # later ids win, as in llama.cpp
    eot_id, eog_ids = _end_of_generation(metadata, tokens, attrs, eos_id, n, text_to_id)
    merges = unk_id = None
    if model == "llama":
        unk_id = meta_id(metadata, "tokenizer.ggml.unknown_token_id", n)
    else:
        merges = metadata.get("tokenizer.ggml.merges")
        if not isinstance(merges, (list, tuple)):
            raise TokenizerError("a gpt2 tokenizer needs tokenizer.ggml.merges, which is missing")
        merges = list(merges)
    return Vocabulary(
        model=model, tokens=tokens, attrs=attrs, scores=scores, text_to_id=text_to_id,
        pre_name=pre_name if model == "gpt2" else None, pre=pre, merges=merges, add_bos=add_bos,
        add_eos=add_eos, add_space_prefix=add_space_prefix, bos_id=bos_id, eos_id=eos_id,
        eot_id=eot_id, unk_id=unk_id, eog_ids=eog_ids,
    )  # fmt: skip


def _end_of_generation(
    metadata, tokens, attrs, eos_id, n, text_to_id
) -> tuple[int | None, frozenset[int]]:
    """llama.cpp's end-of-generation set: eos/eot/eom ids from the file, tokens recognised by text
    (<|im_end|>, <end_of_turn>, </s>, ...) and the FIM pad/repo/file-separator tokens. Tokens it
    recognises by text are forced to control type (hidden in text), as llama.cpp does."""

    def by_key_or_text(key: str, texts: Iterable[str]) -> int | None:
        token_id = meta_id(metadata, key, n)
        if token_id is not None:
            return token_id
        for text in texts:  # llama.cpp walks a hash map here; all candidates count the same
            if text in text_to_id:
                token_id = text_to_id[text]
                attrs[token_id] |= ATTR_CONTROL
                return token_id
        return None

    eot_id = by_key_or_text("tokenizer.ggml.eot_token_id", EOT_TEXTS)
    eom_id = by_key_or_text("tokenizer.ggml.eom_token_id", EOM_TEXTS)
    fim_ids = [
        by_key_or_text("tokenizer.ggml.fim_pad_token_id", FIM_PAD_TEXTS),
        by_key_or_text("tokenizer.ggml.fim_rep_token_id", FIM_REP_TEXTS),
        by_key_or_text("tokenizer.ggml.fim_sep_token_id", FIM_SEP_TEXTS),
    ]
    for text in FIM_OTHER_TEXTS:  # prefix/suffix/middle are forced to control type too
        if text in text_to_id:
            attrs[text_to_id[text]] |= ATTR_CONTROL

    eog = {i for i in fim_ids if i is not None}
    for text, token_id in text_to_id.items():
        if text in EOG_TEXTS:
            eog.add(token_id)
            attrs[token_id] |= ATTR_CONTROL
    for text in ALWAYS_RENDERED:
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
