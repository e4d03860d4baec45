"""Tokenizer built from GGUF metadata vs llama.cpp's tokenizer (the oracle).

Golden data: tests/fixtures/tokenizer_*.json, written by tools/make_tokenizer_fixtures.py from
llama.cpp itself (llama-cpp-python's llama_tokenize / llama_detokenize / llama_vocab_is_eog) on
SmolLM2 (gpt2 BPE, pre "smollm"), Gemma 3 (SentencePiece) and variants of those vocabularies
with other pre-tokenizers (gpt-2, llama-bpe, qwen2, default) and SPM options (add_space_prefix,
add_eos). Ids are compared exactly.
"""

from __future__ import annotations

import functools
import hashlib
import json
from pathlib import Path

import pytest

from engine.errors import TokenizerError
from engine.gguf import open_gguf
from engine.model_files import ModelNotInstalledError, default_model_path, gemma3_270m_path
from engine.tokenizer import PRE_TOKENIZERS, Tokenizer
from tests.requirements import MODELS_HOW, missing

FIXTURES = Path(__file__).parent / "fixtures"
FIXTURE_NAMES = sorted(p.stem.removeprefix("tokenizer_") for p in FIXTURES.glob("tokenizer_*.json"))


@functools.cache
def fixture(name: str) -> dict:
    return json.loads((FIXTURES / f"tokenizer_{name}.json").read_text(encoding="utf-8"))


@functools.lru_cache(maxsize=2)
def base_gguf(model: str):
    try:
        path = {"smollm2": default_model_path, "gemma3": gemma3_270m_path}[model]()
    except ModelNotInstalledError as exc:
        missing(f"a packaged model ({exc})", MODELS_HOW)
    return open_gguf(path)


def base_metadata(model: str) -> dict:
    return base_gguf(model).metadata


@functools.cache
def tokenizer_for(name: str) -> Tokenizer:
    data = fixture(name)
    metadata = {**base_metadata(data["model"]), **data["overrides"]}
    if (
        "token_type_patch" in data
    ):  # some tokens made special (see tools/make_tokenizer_fixtures.py)
        types = list(metadata["tokenizer.ggml.token_type"])
        for text, token_type in data["token_type_patch"].items():
            types[metadata["tokenizer.ggml.tokens"].index(text)] = token_type
        return Tokenizer.from_metadata({**metadata, "tokenizer.ggml.token_type": types})
    if not data["overrides"]:  # the file as it is: shares the per-file cache with other tests
        return Tokenizer.from_gguf(base_gguf(data["model"]))
    return Tokenizer.from_metadata(metadata)


@pytest.fixture(scope="module", autouse=True)
def _release_tokenizers():
    """Gemma-sized tokenizers are ~145 MB each: hold them for this module only."""
    yield
    tokenizer_for.cache_clear()
    base_gguf.cache_clear()


def smollm2() -> Tokenizer:
    return tokenizer_for("smollm2")


def gemma3() -> Tokenizer:
    return tokenizer_for("gemma3")


def test_fixtures_cover_both_models_and_the_variants():
    assert {"smollm2", "gemma3", "smollm2_pre_gpt2", "smollm2_pre_llama_bpe", "smollm2_pre_qwen2",
            "smollm2_pre_default", "gemma3_space_prefix_eos", "smollm2_overlapping_specials"} <= set(FIXTURE_NAMES)  # fmt: skip


# --- ids ----------------------------------------------------------------------------------------
def _mismatches(tok: Tokenizer, cases: list[dict], add_special: bool) -> list[str]:
    key = "ids" if add_special else "ids_no_special"
    out = []
    for case in cases:
        ours = tok.encode(case["text"], add_special=add_special)
        if ours != case[key]:
            out.append(f"{case['text']!r}: ours {ours} llama.cpp {case[key]}")
    return out


@pytest.mark.parametrize("name", FIXTURE_NAMES)
def test_ids_equal_llama_cpp(name):
    tok, cases = tokenizer_for(name), fixture(name)["cases"]
    bad = _mismatches(tok, cases, add_special=True) + _mismatches(tok, cases, add_special=False)
    assert not bad, f"{len(bad)} of {2 * len(cases)} differ, e.g.:\n" + "\n".join(bad[:5])


@pytest.mark.parametrize("name", FIXTURE_NAMES)
def test_special_ids_and_flags_equal_llama_cpp(name):
    tok, data = tokenizer_for(name), fixture(name)
    assert (tok.bos_id, tok.eos_id, tok.add_bos, tok.add_eos) == (
        data["bos_id"],
        data["eos_id"],
        data["add_bos"],
        data["add_eos"],
    )
    assert tok.eog_ids == frozenset(data["eog_ids"])
    assert tok.vocab_size == data["n_vocab"]


def test_end_of_generation_ids_of_the_packaged_models():
    # Gemma 3: <eos>, <end_of_turn>, and </s> which llama.cpp also treats as an end (GUIDE.md).
    assert gemma3().eog_ids == frozenset({1, 106, 212})
    assert [gemma3().tokens[i] for i in (1, 106, 212)] == ["<eos>", "<end_of_turn>", "</s>"]
    # SmolLM2: <|endoftext|>, <|im_end|> (eos), and <reponame>, which llama.cpp takes for the
    # fill-in-the-middle "repository" token and ends generation on.
    tok = smollm2()
    assert tok.eog_ids == frozenset({0, 2, 4})
    assert [tok.tokens[i] for i in (0, 2, 4)] == ["<|endoftext|>", "<|im_end|>", "<reponame>"]


def test_special_token_text_is_one_id_even_without_bos():
    tok = smollm2()
    assert tok.encode("<|im_start|>", add_special=False) == [1]
    assert tok.encode("<|im_start|>user\nHi<|im_end|>", add_special=False)[0] == 1
    g = gemma3()
    assert g.encode("<start_of_turn>user\n", add_special=True)[:2] == [2, 105]
    assert g.encode("<end_of_turn>", add_special=False) == [106]


def test_add_special_adds_bos_only_when_the_file_says_so():
    g = gemma3()  # add_bos_token = true
    assert g.encode("hi", add_special=True) == [2] + g.encode("hi", add_special=False)
    assert g.encode("", add_special=True) == [2] and g.encode("", add_special=False) == []
    s = smollm2()  # add_bos_token = false
    assert s.encode("hi", add_special=True) == s.encode("hi", add_special=False)


def test_overlapping_special_texts_longest_first_like_llama_cpp():
    # "he" (user-defined) and "ello" (control) overlap in "hello": llama.cpp cuts the longer one
    # first, so "hello" is h + <ello>, where a leftmost-longest matcher would give <he> + llo.
    tok = tokenizer_for("smollm2_overlapping_specials")
    ids = tok.encode("hello", add_special=False)
    assert [tok.tokens[i] for i in ids] == ["h", "ello"]
    assert ids == fixture("smollm2_overlapping_specials")["cases"][0]["ids"]


def test_longest_special_text_wins_like_llama_cpp():
    # Gemma's user-defined whitespace runs are cut out longest first: 33 spaces = 31 + 2.
    g = gemma3()
    ids = g.encode(" " * 33, add_special=False)
    assert [g.tokens[i] for i in ids] == [" " * 31, " " * 2]


# --- decoding -----------------------------------------------------------------------------------
@pytest.mark.parametrize("name", FIXTURE_NAMES)
def test_decode_equals_llama_detokenize(name):
    tok, data = tokenizer_for(name), fixture(name)
    for case in data["cases"]:
        assert tok.decode_bytes(case["ids"]) == bytes.fromhex(case["decoded_hex"]), case["text"]
    for seq in data["decode_sequences"]:
        assert tok.decode_bytes(seq["ids"]) == bytes.fromhex(seq["decoded_hex"]), seq["ids"]
        assert tok.decode_bytes(seq["ids"], special=True) == bytes.fromhex(
            seq["decoded_special_hex"]
        ), seq["ids"]
        assert tok.decode(seq["ids"]) == bytes.fromhex(seq["decoded_hex"]).decode(
            "utf-8", errors="replace"
        )


@pytest.mark.parametrize("name", ["smollm2", "gemma3"])
def test_every_token_piece_equals_llama_token_to_piece(name):
    tok, data = tokenizer_for(name), fixture(name)
    for token_id, (plain, special) in data["pieces"].items():
        assert tok.piece_bytes(int(token_id)) == bytes.fromhex(plain)
        assert tok.piece_bytes(int(token_id), special=True) == bytes.fromhex(special)
    for special, key in ((False, "piece_digest"), (True, "piece_digest_special")):
        h = hashlib.sha256()
        for i in range(tok.vocab_size):
            p = tok.piece_bytes(i, special=special)
            h.update(len(p).to_bytes(4, "little") + p)
        assert h.hexdigest() == data[key], f"piece table (special={special}) differs from llama.cpp"


def test_decode_round_trips_ordinary_text():
    text = "Hello, 世界! 👍🏽 naïve\tcode:\n    return 42"
    for tok in (smollm2(), gemma3()):
        assert tok.decode(tok.encode(text, add_special=True)) == text


def test_piece_shows_tokens_readably():
    g = gemma3()
    assert g.piece(106) == "<end_of_turn>"
    assert g.piece(g.token_id("<0xF0>")) == "<0xF0>"  # half a character stays visible as a byte
    s = smollm2()
    assert s.piece(s.encode(" world", add_special=False)[0]) == " world"


def test_out_of_range_ids_are_typed_errors():
    tok = smollm2()
    with pytest.raises(
        TokenizerError, match=r"token id 49152 is out of range: the vocabulary has ids 0..49151"
    ):
        tok.decode([5, 49152])
    with pytest.raises(TokenizerError, match="out of range"):
        tok.piece(-1)


# --- the HF tokenizer handed to other components (JSON mode) ------------------------------------
@pytest.mark.parametrize("name", ["smollm2", "gemma3"])
def test_hf_tokenizer_alone_also_gives_llama_cpp_ids(name):
    # `.hf` is what llguidance (JSON mode) tokenizes with, so it must stand on its own: its added
    # tokens match leftmost-longest instead of longest-first, which only matters when two special
    # texts overlap (see test_overlapping_special_texts_longest_first_like_llama_cpp).
    tok, data = tokenizer_for(name), fixture(name)
    bad = [c["text"] for c in data["cases"] if tok.hf.encode(c["text"]).ids != c["ids"]]
    assert not bad, bad[:5]
    assert tok.hf.get_vocab_size(with_added_tokens=True) == tok.vocab_size


# --- refusals -----------------------------------------------------------------------------------
def _metadata(**overrides):
    return {**base_metadata("smollm2"), **overrides}


def test_unknown_tokenizer_model_is_named():
    with pytest.raises(
        TokenizerError, match=r"tokenizer model 'rwkv' is not supported: supported are gpt2, llama"
    ):
        Tokenizer.from_metadata(_metadata(**{"tokenizer.ggml.model": "rwkv"}))


def test_unknown_pre_tokenizer_is_named_with_the_supported_list():
    with pytest.raises(
        TokenizerError,
        match=r"pre-tokenizer 'made-up' \(tokenizer.ggml.pre\) is not supported: supported are .*qwen2.*smollm",
    ):
        Tokenizer.from_metadata(_metadata(**{"tokenizer.ggml.pre": "made-up"}))
    for name in ("llama3", "llama-bpe", "qwen2", "smollm", "gpt2", "gpt-2", "default"):
        assert name in PRE_TOKENIZERS


# tokenizer.json's o200k pattern (gpt-4o, gpt-oss), as quoted in llama.cpp's llama-vocab.cpp
O200K_ORIGINAL = (
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+"
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
    r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*"
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
    r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)


@pytest.mark.parametrize(
    "text",
    [
        "Hello World, I'm HTTPServer's CamelCase DON'T you're",
        "numbers 1234567 and 3.14159, dates 2024-06-01",
        "  spaces\n\n\tand\r\nnewlines  ",
        "path/to/file.py //comment\n/*x*/",
        "Éric a mangé 北京烤鸭 und Straße ÄÖÜ ǅemal",
        "<|start|>assistant<|channel|>final<|message|>ok<|end|>",
    ],
)
def test_gpt_4o_pre_tokenizer_splits_like_the_original_o200k_pattern(text):
    """gpt-oss files say tokenizer.ggml.pre = "gpt-4o": llama.cpp's rewrite of the o200k pattern
    (our table's) splits text where tokenizer.json's original pattern does."""
    from tokenizers import Regex, pre_tokenizers

    def split(pattern: str) -> list[str]:
        splitter = pre_tokenizers.Split(Regex(pattern), behavior="isolated", invert=False)
        return [piece for piece, _ in splitter.pre_tokenize_str(text)]

    (ours,) = PRE_TOKENIZERS["gpt-4o"].regexes
    assert split(ours) == split(O200K_ORIGINAL)
    assert PRE_TOKENIZERS["llama4"] == PRE_TOKENIZERS["gpt-4o"]
    assert not PRE_TOKENIZERS["gpt-4o"].clean_spaces  # llama.cpp: clean_spaces = false


def test_missing_pre_tokenizer_falls_back_to_llama_cpp_default(caplog):
    metadata = {k: v for k, v in base_metadata("smollm2").items() if k != "tokenizer.ggml.pre"}
    tok = Tokenizer.from_metadata(metadata)
    assert tok.pre == "default" and "pre-tokenizer" in caplog.text
    expected = fixture("smollm2_pre_default")["cases"][2]
    assert tok.encode(expected["text"], add_special=False) == expected["ids_no_special"]


def test_missing_or_broken_vocabulary_is_a_typed_error():
    with pytest.raises(TokenizerError, match="has no tokenizer"):
        Tokenizer.from_metadata({"general.architecture": "llama"})
    with pytest.raises(TokenizerError, match="no vocabulary"):
        Tokenizer.from_metadata(_metadata(**{"tokenizer.ggml.tokens": []}))
    with pytest.raises(TokenizerError, match="fewer than the 49152 tokens"):
        Tokenizer.from_metadata(_metadata(**{"tokenizer.ggml.token_type": [1, 1, 1]}))
    with pytest.raises(TokenizerError, match="needs tokenizer.ggml.merges"):
        Tokenizer.from_metadata(
            {k: v for k, v in base_metadata("smollm2").items() if k != "tokenizer.ggml.merges"}
        )
    with pytest.raises(
        TokenizerError, match="add_bos_token is set but the file has no valid bos_token_id"
    ):
        md = {
            k: v
            for k, v in _metadata(**{"tokenizer.ggml.add_bos_token": True}).items()
            if k != "tokenizer.ggml.bos_token_id"
        }
        Tokenizer.from_metadata(md)


def test_encode_needs_str():
    with pytest.raises(TypeError, match="takes a str"):
        smollm2().encode(b"bytes")


def test_same_file_shares_one_tokenizer_while_it_is_alive(tiny_model_factory):
    import gc
    import weakref

    path = tiny_model_factory("llama", tokenizer="smollm2")  # real vocabulary, tiny weights
    first = Tokenizer.from_gguf(open_gguf(path))
    assert Tokenizer.from_gguf(open_gguf(path)) is first
    assert first.encode("Hello world", add_special=False) == [19556, 905]
    alive = weakref.ref(first)
    del first
    gc.collect()
    assert alive() is None  # the cache never keeps a tokenizer (and its ~100 MB) alive by itself


def test_out_of_range_special_id_in_the_file_is_ignored_with_a_warning(caplog):
    # llama.cpp warns and disables such an id; the vocabulary stays usable.
    tok = Tokenizer.from_metadata(_metadata(**{"tokenizer.ggml.eos_token_id": 10**6}))
    assert tok.eos_id is None and "outside the vocabulary" in caplog.text
    assert tok.eog_ids == frozenset({0, 2, 4})  # still found by their text
    assert tok.encode("Hello world", add_special=True) == [19556, 905]


# --- SentencePiece merge order and the on-disk merges cache, on a small hand-made vocabulary ----
def _tiny_spm(pieces: dict[str, float]) -> dict:
    """SPM metadata: <unk> <s> </s>, the 256 byte pieces, then `pieces` (text -> score)."""
    tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)] + list(pieces)
    return {
        "tokenizer.ggml.model": "llama",
        "tokenizer.ggml.tokens": tokens,
        "tokenizer.ggml.scores": [0.0, 0.0, 0.0] + [0.0] * 256 + list(pieces.values()),
        "tokenizer.ggml.token_type": [2, 3, 3] + [6] * 256 + [1] * len(pieces),
        "tokenizer.ggml.bos_token_id": 1,
        "tokenizer.ggml.eos_token_id": 2,
        "tokenizer.ggml.unknown_token_id": 0,
        "tokenizer.ggml.add_space_prefix": False,
    }


def _pieces(tok, text):
    return [tok.tokens[i] for i in tok.encode(text, add_special=False)]


def test_spm_merges_follow_piece_scores_not_ids(tmp_path, monkeypatch):
    import engine.tokenizer as module

    monkeypatch.setattr(module, "MERGES_CACHE_DIR", tmp_path)
    # llama.cpp merges the adjacent pair whose result scores highest: "bc" (-0.5) beats "ab" (-1).
    tok = Tokenizer.from_metadata(
        _tiny_spm({"a": -3.0, "b": -3.0, "c": -3.0, "ab": -1.0, "bc": -0.5})
    )
    assert _pieces(tok, "abc") == ["a", "bc"]
    tok = Tokenizer.from_metadata(
        _tiny_spm({"a": -3.0, "b": -3.0, "c": -3.0, "ab": -0.5, "bc": -1.0})
    )
    assert _pieces(tok, "abc") == ["ab", "c"]
    # characters outside the vocabulary fall back to their UTF-8 bytes
    assert _pieces(tok, "aé") == ["a", "<0xC3>", "<0xA9>"]
    assert tok.encode("ab", add_special=True) == [1, tok.token_id("ab")]


def test_spm_merges_disk_cache_is_used_and_survives_damage(tmp_path, monkeypatch):
    import engine.tokenizer as module

    metadata = _tiny_spm({"▁": -1.0, "a": -2.0, "b": -2.0, "ab": -0.5, "▁ab": -0.2, "ba": -0.7})
    monkeypatch.setattr(module, "MERGES_CACHE_DIR", None)
    expected = Tokenizer.from_metadata(metadata).encode("ab ab ba bab", add_special=False)

    monkeypatch.setattr(module, "MERGES_CACHE_DIR", tmp_path / "cache")
    assert Tokenizer.from_metadata(metadata).encode("ab ab ba bab", add_special=False) == expected
    (cache_file,) = (tmp_path / "cache").iterdir()

    # Warm: the merges come from the file (deriving them would fail here).
    derive = module._spm_merges
    monkeypatch.setattr(
        module, "_spm_merges", lambda *a: pytest.fail("merges derived despite the cache")
    )
    assert Tokenizer.from_metadata(metadata).encode("ab ab ba bab", add_special=False) == expected
    monkeypatch.setattr(module, "_spm_merges", derive)

    # Damaged files (truncated, pieces not in the vocabulary, not UTF-8) are derived again and replaced.
    good = cache_file.read_bytes()
    import hashlib

    unknown_pieces = "zz\0qq"  # a well-formed file whose pieces are not in this vocabulary
    well_formed = (
        f"1 {hashlib.sha256(unknown_pieces.encode()).hexdigest()}\n{unknown_pieces}".encode()
    )
    for damage in (good[: len(good) // 2 - 1], b"x\0y", b"\xff\xfe", well_formed):
        cache_file.write_bytes(damage)
        assert (
            Tokenizer.from_metadata(metadata).encode("ab ab ba bab", add_special=False) == expected
        )
        assert cache_file.read_bytes() == good

    # A cache directory that cannot be written is not an error.
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    monkeypatch.setattr(module, "MERGES_CACHE_DIR", blocker / "cache")
    assert Tokenizer.from_metadata(metadata).encode("ab ab ba bab", add_special=False) == expected


def test_fragment_cache_gives_the_same_ids_and_stays_bounded(monkeypatch):
    """Re-encoding a growing chat reuses per-message ids; the result must equal a fresh encode
    of the whole text by the HF tokenizer piece by piece (the uncached path), and the cache must
    respect its bound."""
    name = FIXTURE_NAMES[0]
    tok = tokenizer_for(name)
    monkeypatch.setattr(Tokenizer, "_FRAGMENT_CACHE_ENTRIES", 8)
    texts = [case["text"] for case in fixture(name)["cases"] if len(case["text"]) >= 32]
    assert len(texts) >= 3
    for n in range(1, 3 * len(texts)):
        chunk = texts[: 1 + n % len(texts)]
        text = "".join(chunk)
        uncached = [tok.bos_id] if tok.add_bos else []
        for fragment in tok._partition(text):
            uncached += (
                tok.hf.encode(fragment, add_special_tokens=False).ids
                if isinstance(fragment, str)
                else [fragment]
            )
        if tok.add_eos:
            uncached.append(tok.eos_id)
        assert tok.encode(text) == uncached
        assert len(tok._fragment_ids) <= 8
