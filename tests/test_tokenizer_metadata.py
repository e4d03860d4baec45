"""Malformed `tokenizer.ggml.*` metadata in a GGUF file: a TokenizerError naming the key, never a
traceback, a hang or a huge allocation.

Each file is a tiny GGUF written with gguf-py's GGUFWriter (no tensors: the tokenizer reads only
metadata) holding a small hand-made vocabulary, with one value made wrong.
"""

from __future__ import annotations

import logging
import math
import struct

import pytest
from gguf import GGUFValueType, GGUFWriter

from engine.errors import EngineError, TokenizerError
from engine.gguf import open_gguf
from engine.tokenizer import Tokenizer

V = GGUFValueType

SPM_TOKENS = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)] + ["▁", "a", "b", "ab"]
SPM_TYPES = [2, 3, 3] + [6] * 256 + [1, 1, 1, 1]
BPE_TOKENS = ["<|endoftext|>", "a", "b", "ab", "Ġ", "Ġa"]
BPE_TYPES = [3, 1, 1, 1, 1, 1]


def spm_kv() -> dict[str, tuple]:
    return {
        "tokenizer.ggml.model": ("llama", V.STRING),
        "tokenizer.ggml.tokens": (list(SPM_TOKENS), V.ARRAY, V.STRING),
        "tokenizer.ggml.scores": ([0.0] * 259 + [-1.0, -2.0, -2.0, -0.5], V.ARRAY, V.FLOAT32),
        "tokenizer.ggml.token_type": (list(SPM_TYPES), V.ARRAY, V.INT32),
        "tokenizer.ggml.bos_token_id": (1, V.UINT32),
        "tokenizer.ggml.eos_token_id": (2, V.UINT32),
        "tokenizer.ggml.unknown_token_id": (0, V.UINT32),
    }


def bpe_kv() -> dict[str, tuple]:
    return {
        "tokenizer.ggml.model": ("gpt2", V.STRING),
        "tokenizer.ggml.pre": ("smollm", V.STRING),
        "tokenizer.ggml.tokens": (list(BPE_TOKENS), V.ARRAY, V.STRING),
        "tokenizer.ggml.token_type": (list(BPE_TYPES), V.ARRAY, V.INT32),
        "tokenizer.ggml.merges": (["a b", "Ġ a"], V.ARRAY, V.STRING),
        "tokenizer.ggml.bos_token_id": (0, V.UINT32),
        "tokenizer.ggml.eos_token_id": (0, V.UINT32),
    }


def write(tmp_path, kv: dict[str, tuple], name: str = "tok.gguf"):
    path = tmp_path / name
    writer = GGUFWriter(path, "llama")
    for key, entry in kv.items():
        value, vtype, *sub = entry
        writer.add_key_value(key, value, vtype, sub[0] if sub else None)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def load(tmp_path, kv: dict[str, tuple], name: str = "tok.gguf") -> Tokenizer:
    return Tokenizer.from_gguf(open_gguf(write(tmp_path, kv, name)))


@pytest.fixture(autouse=True)
def no_merges_cache(monkeypatch):
    import engine.tokenizer

    monkeypatch.setattr(engine.tokenizer, "MERGES_CACHE_DIR", None)


def test_the_well_formed_files_load(tmp_path):
    spm = load(tmp_path, spm_kv(), "spm.gguf")
    assert [spm.tokens[i] for i in spm.encode("ab a", add_special=False)] == ["▁", "ab", "▁", "a"]
    bpe = load(tmp_path, bpe_kv(), "bpe.gguf")
    assert [bpe.tokens[i] for i in bpe.encode("ab a", add_special=False)] == ["ab", "Ġa"]


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("tokenizer.ggml.bos_token_id", (math.nan, V.FLOAT32)),
        ("tokenizer.ggml.eos_token_id", (math.inf, V.FLOAT32)),
        ("tokenizer.ggml.unknown_token_id", ("0", V.STRING)),
        ("tokenizer.ggml.eos_token_id", ([2], V.ARRAY, V.UINT32)),
        ("tokenizer.ggml.add_bos_token", ("false", V.STRING)),
        ("tokenizer.ggml.add_space_prefix", (1.0, V.FLOAT32)),
        ("tokenizer.ggml.model", ([1, 2], V.ARRAY, V.INT32)),
        ("tokenizer.ggml.tokens", ([0] * len(SPM_TOKENS), V.ARRAY, V.INT32)),
        ("tokenizer.ggml.token_type", ([1.0] * len(SPM_TOKENS), V.ARRAY, V.FLOAT32)),
        ("tokenizer.ggml.token_type", ([[1]] * len(SPM_TOKENS), V.ARRAY, V.ARRAY)),
        ("tokenizer.ggml.token_type", ([1] * 5, V.ARRAY, V.INT32)),
        ("tokenizer.ggml.scores", (["0.5"] * len(SPM_TOKENS), V.ARRAY, V.STRING)),
        ("tokenizer.ggml.scores", ([[0.5]] * len(SPM_TOKENS), V.ARRAY, V.ARRAY)),
        ("tokenizer.ggml.scores", ([True] * len(SPM_TOKENS), V.ARRAY, V.BOOL)),
    ],
)
def test_wrongly_typed_spm_values_name_the_key(tmp_path, key, value):
    with pytest.raises(TokenizerError, match=key.replace(".", r"\.")):
        load(tmp_path, {**spm_kv(), key: value})


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("tokenizer.ggml.merges", ([1, 2], V.ARRAY, V.INT32)),
        ("tokenizer.ggml.merges", ([["a", "b"]], V.ARRAY, V.ARRAY)),
        ("tokenizer.ggml.merges", ("a b", V.STRING)),
        ("tokenizer.ggml.pre", (["smollm"], V.ARRAY, V.STRING)),
        ("tokenizer.ggml.pre", (7, V.UINT32)),
    ],
)
def test_wrongly_typed_bpe_values_name_the_key(tmp_path, key, value):
    with pytest.raises(TokenizerError, match=key.replace(".", r"\.")):
        load(tmp_path, {**bpe_kv(), key: value})


@pytest.mark.parametrize("text", ["<0xZZ>", "hello", "<0x4>", "<0x41", "<0x41>x"])
def test_a_byte_token_whose_text_is_not_a_byte_names_the_token(tmp_path, text):
    kv = spm_kv()
    tokens = list(SPM_TOKENS)
    tokens[3 + 0x41] = text  # a BYTE-type token
    kv["tokenizer.ggml.tokens"] = (tokens, V.ARRAY, V.STRING)
    with pytest.raises(TokenizerError, match=r"tokenizer\.ggml\.tokens\[68\]"):
        load(tmp_path, kv)


@pytest.mark.parametrize("extra_type", [6, 1])  # BYTE (the fuzzed file's), NORMAL
def test_more_token_types_than_tokens_is_a_typed_error_naming_both_lengths(tmp_path, extra_type):
    """Issue 31 fuzz: a type list one longer than the 263-token list (a BYTE type past the end)
    made the byte-token check index past the tokens: IndexError instead of a TokenizerError."""
    kv = spm_kv()
    kv["tokenizer.ggml.token_type"] = ([*SPM_TYPES, extra_type], V.ARRAY, V.INT32)
    with pytest.raises(TokenizerError) as caught:
        load(tmp_path, kv)
    assert str(caught.value) == (
        "tokenizer.ggml.token_type has 264 entries but tokenizer.ggml.tokens has 263: there "
        "must be one type per token"
    )


def test_out_of_range_special_ids_are_ignored_and_never_indexed(tmp_path, caplog):
    """llama.cpp ignores an out-of-range special id with a warning; so do we, for every one."""
    kv = spm_kv()
    for key in ("bos", "eos", "eot", "eom", "unknown", "fim_pad", "fim_rep", "fim_sep"):
        kv[f"tokenizer.ggml.{key}_token_id"] = (2**32 - 1, V.UINT32)
    kv["tokenizer.ggml.add_bos_token"] = (False, V.BOOL)
    with caplog.at_level(logging.WARNING, logger="engine.tokenizer"):
        tok = load(tmp_path, kv)
    assert "tokenizer.ggml.eot_token_id = 4294967295 is outside the vocabulary" in caplog.text
    assert tok.bos_id is None and tok.eos_id is None and tok.eot_id is None
    assert all(0 <= i < tok.vocab_size for i in tok.eog_ids)
    ids = tok.encode("ab", add_special=True)
    assert tok.decode(ids) == "ab"


def test_a_huge_spm_piece_does_not_stall_building(tmp_path):
    """Deriving SentencePiece merges splits every piece at every position: quadratic in the
    piece's length. A 4-million-character piece must not take hours (real pieces are < 100)."""
    kv = spm_kv()
    tokens = [*SPM_TOKENS, "a" * 4_000_000]
    kv["tokenizer.ggml.tokens"] = (tokens, V.ARRAY, V.STRING)
    kv["tokenizer.ggml.scores"] = ([*kv["tokenizer.ggml.scores"][0], -9.0], V.ARRAY, V.FLOAT32)
    kv["tokenizer.ggml.token_type"] = ([*SPM_TYPES, 1], V.ARRAY, V.INT32)
    tok = load(tmp_path, kv)
    assert [tok.tokens[i] for i in tok.encode("aab", add_special=False)] == ["▁", "a", "ab"]


def test_a_vocabulary_claiming_two_billion_tokens_is_refused_before_reading_them(tmp_path):
    path = write(tmp_path, spm_kv())
    data = bytearray(path.read_bytes())
    key = b"tokenizer.ggml.tokens"
    at = data.index(key) + len(key) + 4 + 4  # the key, its type (ARRAY), the element type
    assert struct.unpack_from("<Q", data, at)[0] == len(SPM_TOKENS)
    struct.pack_into("<Q", data, at, 2**31)
    path.write_bytes(bytes(data))
    with pytest.raises(EngineError, match="tokenizer.ggml.tokens"):
        Tokenizer.from_gguf(open_gguf(path))


def test_merges_naming_pieces_outside_the_vocabulary_are_skipped_and_the_rest_kept(tmp_path):
    # "a zz": zz is not a token; "b a": both are, but "ba" is not. llama.cpp skips such merges;
    # the valid ones after them must still apply ("ab" and "Ġa" stay single tokens).
    kv = bpe_kv()
    kv["tokenizer.ggml.merges"] = (["a zz", "b a", "a b", "Ġ a"], V.ARRAY, V.STRING)
    tok = load(tmp_path, kv)
    assert [tok.tokens[i] for i in tok.encode("ab a", add_special=False)] == ["ab", "Ġa"]
    assert [tok.tokens[i] for i in tok.encode("ba", add_special=False)] == ["b", "a"]


def test_a_merge_without_a_separating_space_is_a_typed_error_naming_it(tmp_path):
    kv = bpe_kv()
    kv["tokenizer.ggml.merges"] = (["a b", "ab"], V.ARRAY, V.STRING)
    with pytest.raises(TokenizerError, match="merges entry 'ab' is not two pieces"):
        load(tmp_path, kv)
