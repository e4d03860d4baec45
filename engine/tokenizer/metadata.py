"""The `tokenizer.ggml.*` metadata of a GGUF file, read and checked: every value the tokenizer
uses is validated here, and a malformed one is a TokenizerError naming its key."""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from engine.errors import TokenizerError
from engine.gguf import NumericArray, StringArray
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
    HIDDEN,
    PRE_TOKENIZERS,
    SUPPORTED_MODELS,
    TYPE_BYTE,
    TYPE_TO_ATTR,
    PreTokenizer,
)

log = logging.getLogger(__name__)


@dataclass
class Vocabulary:
    """What the tokenizer is built from, with llama.cpp's defaults filled in."""

    model: str  # "llama" (SentencePiece) or "gpt2" (byte-level BPE)
    tokens: list[str]  # the texts, for building the tokenizer (then dropped)
    token_array: StringArray  # the same texts as the tokenizer keeps them
    attrs: list[int]  # llama.cpp's attribute bits per token (llama_tables.ATTR_*)
    # One score per token: the file's float32 array as a read-only view of the model file's map
    # (engine.gguf), or float64 for metadata given as Python lists. Never a list of float objects
    # (262k of them were 10 MiB for Gemma 3; issue 32).
    scores: np.ndarray
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

    def text_to_id(self) -> dict[str, int]:
        """Token text -> id, later ids winning as in llama.cpp. Built on demand, not kept: for
        Gemma 3 it is 262k entries (~14 MiB), needed only while a BPE model is built."""
        return {t: i for i, t in enumerate(self.tokens)}


def _token_id(metadata: Mapping[str, Any], key: str, n: int) -> int | None:
    """A token id, or None if absent or outside the vocabulary (llama.cpp ignores those with a
    warning); a value that is not an integer (a float, NaN, a string, an array) is an error."""
    value = metadata.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise TokenizerError(f"{key} must be an integer token id, got {_show(value)}")
    if not 0 <= value < n:
        log.warning("%s = %d is outside the vocabulary (0..%d); ignoring it", key, value, n - 1)
        return None
    return value


def _flag(metadata: Mapping[str, Any], key: str, default: bool) -> bool:
    value = metadata.get(key, default)
    if not isinstance(value, bool):
        raise TokenizerError(f"{key} must be a boolean, got {_show(value)}")
    return value


def _string(metadata: Mapping[str, Any], key: str) -> str | None:
    value = metadata.get(key)
    if value is not None and not isinstance(value, str):
        raise TokenizerError(f"{key} must be a string, got {_show(value)}")
    return value


def _array(
    metadata: Mapping[str, Any], key: str, n: int | None, kind: str, types: frozenset[type]
) -> list | np.ndarray | None:
    """The array at `key` (None if absent), every element of one of `types`, and (with `n`) at
    least n elements: llama.cpp reads one per token and ignores any beyond. Long numeric arrays
    come from engine.gguf as numpy views and are returned as such (checked by dtype)."""
    value = metadata.get(key)
    if value is None:
        return None
    if isinstance(value, NumericArray):
        value = value.array
    if isinstance(value, StringArray):
        value = value.tolist()  # then checked like any list
    if isinstance(value, np.ndarray):
        kinds = "".join(_DTYPE_KINDS[t] for t in types if t in _DTYPE_KINDS)
        if value.ndim != 1 or value.dtype.kind not in kinds or not kinds:
            raise TokenizerError(f"{key} must be an array of {kind}, got an array of {value.dtype}")
        if n is not None and len(value) < n:
            raise TokenizerError(f"{key} has {len(value)} entries, fewer than the {n} tokens")
        return value
    if not isinstance(value, (list, tuple)):
        raise TokenizerError(f"{key} must be an array of {kind}, got {_show(value)}")
    if n is not None and len(value) < n:
        raise TokenizerError(f"{key} has {len(value)} entries, fewer than the {n} tokens")
    if not set(map(type, value)) <= types:  # exact types: bool is not an integer here
        i, element = next((i, e) for i, e in enumerate(value) if type(e) not in types)
        raise TokenizerError(f"{key} must be an array of {kind}: {key}[{i}] is {_show(element)}")
    return list(value)


_STRINGS = frozenset({str})
_INTEGERS = frozenset({int})
_NUMBERS = frozenset({int, float})
# numpy dtype kinds standing for each element type (bool, kind "b", is not an integer here).
_DTYPE_KINDS = {int: "iu", float: "f"}


def _show(value: Any) -> str:
    """A value for an error message, cut short (a hostile file can hold megabytes)."""
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


_BYTE_TOKEN = re.compile(r"<0x[0-9A-Fa-f]{2}>")


def _indices_of(types: list[int] | np.ndarray, value: int) -> Iterable[int]:
    """Ids whose type is `value`, scanned at C speed (262k types, 256 byte tokens)."""
    if isinstance(types, np.ndarray):
        return np.flatnonzero(types == value).tolist()
    return [i for i, t in enumerate(types) if t == value]


def _attrs(types: list[int] | np.ndarray, n: int) -> list[int]:
    """llama.cpp's attribute bits for the first n token types (unknown types: undefined)."""
    if isinstance(types, np.ndarray):
        table = np.array([TYPE_TO_ATTR[t] for t in range(len(TYPE_TO_ATTR))], dtype=np.int64)
        head = types[:n].astype(np.int64)
        known = (head >= 0) & (head < len(table))
        # A list of small ints (cached objects): 8 bytes per token.
        return np.where(known, table[np.where(known, head, 0)], ATTR_UNDEFINED).tolist()
    return [TYPE_TO_ATTR.get(t, ATTR_UNDEFINED) for t in types[:n]]


def _check_byte_tokens(
    model: str, tokens: list[str], types: list[int] | np.ndarray, attrs: list[int]
) -> None:
    """BYTE tokens render as their byte, read from the text "<0xNN>" (SentencePiece always; a
    byte-level BPE vocabulary only when the text has that form, else it is a byte-level char)."""
    rendered_otherwise = HIDDEN | ATTR_USER_DEFINED | ATTR_NORMAL
    for i in _indices_of(types, TYPE_BYTE):
        text = tokens[i]
        if attrs[i] & rendered_otherwise or not (model == "llama" or text.startswith("<0x")):
            continue
        if not _BYTE_TOKEN.fullmatch(text):
            raise TokenizerError(
                f"tokenizer.ggml.tokens[{i}] is a BYTE token (tokenizer.ggml.token_type 6) "
                f"but its text {_show(text)} is not <0xNN>"
            )


def read_vocabulary(metadata: Mapping[str, Any]) -> Vocabulary:
    """Raises TokenizerError naming the key when the metadata cannot make a tokenizer."""
    model = _string(metadata, "tokenizer.ggml.model")
    if model is None:
        raise TokenizerError("the model file has no tokenizer (tokenizer.ggml.model is missing)")
    if model not in SUPPORTED_MODELS:
        raise TokenizerError(
            f"tokenizer model {model!r} is not supported: supported are "
            f"{', '.join(SUPPORTED_MODELS)} (tokenizer.ggml.model; llama = SentencePiece, "
            "gpt2 = byte-level BPE)"
        )
    token_values = _array(metadata, "tokenizer.ggml.tokens", None, "strings", _STRINGS)
    if token_values is None or not len(token_values):
        raise TokenizerError(
            "the model file has no vocabulary (tokenizer.ggml.tokens is missing or empty)"
        )
    tokens: list[str] = list(token_values)  # a list already (numpy never holds strings)
    n = len(tokens)
    stored = metadata.get("tokenizer.ggml.tokens")
    if not all(tokens):
        tokens = [t if t else f"[EMPTY_{i}]" for i, t in enumerate(tokens)]  # as llama.cpp does
        stored = None
    token_array = stored if isinstance(stored, StringArray) else StringArray.from_list(tokens)
    types = _array(metadata, "tokenizer.ggml.token_type", n, "integers", _INTEGERS)
    if types is not None and len(types) > n:
        # One type per token: extra types describe tokens the file does not have (a fuzzed file
        # made the byte-token check index past the token list).
        raise TokenizerError(
            f"tokenizer.ggml.token_type has {len(types)} entries but tokenizer.ggml.tokens has "
            f"{n}: there must be one type per token"
        )
    attrs = _attrs(types, n) if types is not None and len(types) else [ATTR_NORMAL] * n
    raw_scores = _array(metadata, "tokenizer.ggml.scores", n, "numbers", _NUMBERS)
    if isinstance(raw_scores, np.ndarray):
        scores = raw_scores[:n]  # the file's float32 view: nothing copied
    elif raw_scores:
        scores = np.array([float(s) for s in raw_scores[:n]], dtype=np.float64)
    else:
        scores = np.zeros(n, dtype=np.float64)

    pre_name = _string(metadata, "tokenizer.ggml.pre")
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

    add_bos = _flag(metadata, "tokenizer.ggml.add_bos_token", add_bos_default)
    add_eos = _flag(metadata, "tokenizer.ggml.add_eos_token", False)
    add_space_prefix = _flag(metadata, "tokenizer.ggml.add_space_prefix", add_space_prefix_default)
    bos_id = _token_id(metadata, "tokenizer.ggml.bos_token_id", n)
    eos_id = _token_id(metadata, "tokenizer.ggml.eos_token_id", n)
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

    # Only the texts llama.cpp looks up by name, not a table of the whole vocabulary (Gemma 3:
    # 262k entries, ~14 MiB kept for the model's lifetime before issue 32); later ids win.
    named = {t: i for i, t in enumerate(tokens) if t in _NAMED_TEXTS}
    eot_id, eog_ids = _end_of_generation(metadata, tokens, attrs, eos_id, n, named)
    if types is not None and len(types):
        _check_byte_tokens(model, tokens, types, attrs)
    merges = unk_id = None
    if model == "llama":
        unk_id = _token_id(metadata, "tokenizer.ggml.unknown_token_id", n)
    else:
        merge_array = _array(metadata, "tokenizer.ggml.merges", None, "strings", _STRINGS)
        if merge_array is None:
            raise TokenizerError("a gpt2 tokenizer needs tokenizer.ggml.merges, which is missing")
        merges = list(merge_array)  # strings are always a list (numpy arrays only hold numbers)
    return Vocabulary(
        model=model, tokens=tokens, token_array=token_array, attrs=attrs, scores=scores,
        pre_name=pre_name if model == "gpt2" else None, pre=pre, merges=merges, add_bos=add_bos,
        add_eos=add_eos, add_space_prefix=add_space_prefix, bos_id=bos_id, eos_id=eos_id,
        eot_id=eot_id, unk_id=unk_id, eog_ids=eog_ids,
    )  # fmt: skip


_NAMED_TEXTS = frozenset(
    EOG_TEXTS.union(EOT_TEXTS, EOM_TEXTS, FIM_PAD_TEXTS, FIM_REP_TEXTS, FIM_SEP_TEXTS).union(
        FIM_OTHER_TEXTS, ALWAYS_RENDERED
    )
)


def _end_of_generation(
    metadata, tokens, attrs, eos_id, n, text_to_id
) -> tuple[int | None, frozenset[int]]:
    """llama.cpp's end-of-generation set: eos/eot/eom ids from the file, tokens recognised by text
    (<|im_end|>, <end_of_turn>, </s>, ...) and the FIM pad/repo/file-separator tokens. Tokens it
    recognises by text are forced to control type (hidden in text), as llama.cpp does."""

    def by_key_or_text(key: str, texts: Iterable[str]) -> int | None:
        token_id = _token_id(metadata, key, n)
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
