"""Streaming detokenizer: token-by-token text concatenates to exactly Tokenizer.decode(all ids),
never shows half a character, and handles SentencePiece spaces and <0xXX> byte pieces.

Property tests run over random id sequences drawn from the real vocabularies (every token kind:
control, byte, user-defined, normal) and over random Unicode text.
"""

from __future__ import annotations

import functools

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine.detokenizer import StreamingDetokenizer
from engine.gguf import open_gguf
from engine.model_files import ModelNotInstalledError, default_model_path, gemma3_270m_path
from engine.tokenizer import Tokenizer
from tests.requirements import MODELS_HOW, missing

REPLACEMENT = "\ufffd"


@functools.cache
def _tokenizer(name: str) -> Tokenizer:
    try:
        path = default_model_path() if name.startswith("smollm2") else gemma3_270m_path()
    except ModelNotInstalledError as exc:
        missing(f"a packaged model ({exc})", MODELS_HOW)
    gguf = open_gguf(path)
    if name == "gemma3_space_prefix":
        return Tokenizer.from_metadata({**gguf.metadata, "tokenizer.ggml.add_space_prefix": True})
    if name == "smollm2_pre_gpt2":  # a vocabulary llama.cpp detokenizes with clean_spaces
        return Tokenizer.from_metadata({**gguf.metadata, "tokenizer.ggml.pre": "gpt-2"})
    return Tokenizer.from_gguf(gguf)


@pytest.fixture(scope="module", autouse=True)
def _release_tokenizers():
    """Gemma-sized tokenizers are ~145 MB each: hold them for this module only."""
    yield
    _tokenizer.cache_clear()


def stream(tok: Tokenizer, ids, **kwargs) -> list[str]:
    detok = StreamingDetokenizer(tok, **kwargs)
    chunks = []
    for token_id in ids:
        chunks.append(detok.add(token_id))
        if not tok.clean_spaces:
            assert len(detok.pending_bytes) <= 3  # only an unfinished character is ever held back
    chunks.append(detok.flush())
    return chunks


MODELS = ["smollm2", "gemma3", "smollm2_pre_gpt2"]
PROPERTY = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@pytest.mark.parametrize("name", MODELS)
def test_random_id_sequences_stream_to_exactly_decode(name):
    tok = _tokenizer(name)
    byte_ids = [i for i, t in enumerate(tok.tokens) if t.startswith("<0x") and len(t) == 6]
    special_ids = sorted(tok.eog_ids) + ([tok.bos_id] if tok.bos_id is not None else [])
    # Mix ordinary ids with byte pieces and specials so partial characters and empty pieces are common.
    token = st.one_of(
        st.integers(0, tok.vocab_size - 1),
        st.sampled_from(byte_ids or [0]),
        st.sampled_from(special_ids),
    )

    @PROPERTY
    @given(st.lists(token, max_size=40), st.booleans())
    def check(ids, special):
        chunks = stream(tok, ids, special=special)
        assert "".join(chunks) == tok.decode(ids, special=special)

    check()


@pytest.mark.parametrize("name", MODELS)
def test_unicode_text_streams_without_replacement_characters(name):
    tok = _tokenizer(name)
    # Emoji with skin tones and ZWJ, CJK, accents, whitespace runs; no '<' so no special-token text.
    # SmolLM2's vocabulary lacks a few bytes (some C0 controls, the lead bytes of planes 4-11), which
    # llama.cpp then drops, so the round trip is only checked on text its vocabulary can spell.
    # U+2581 is SentencePiece's space marker: Gemma's vocabulary (and llama.cpp) decode it to " ".
    alphabet = st.one_of(
        st.characters(
            max_codepoint=0x3FFFF,
            blacklist_categories=("Cs", "Cc"),
            blacklist_characters="<\ufffd\u2581",
        ),
        st.sampled_from(["👍🏽", "👨‍👩‍👧", "🏳️‍🌈", "日本語", "é", "e\u0301", "  ", "\t", "\n", " "]),
    )

    @PROPERTY
    @given(st.lists(alphabet, max_size=25).map("".join))
    def check(text):
        ids = tok.encode(text, add_special=False)
        chunks = stream(tok, ids)
        assert all(REPLACEMENT not in c for c in chunks)
        assert "".join(chunks) == tok.decode(ids)
        # Round trip, except where llama.cpp's decode changes text on purpose: the prefix space
        # of add_space_prefix ("  " decodes to " ") and clean_spaces (" ." decodes to ".").
        if not tok.add_space_prefix and not tok.clean_spaces:
            assert tok.decode(ids) == text

    check()


def test_emoji_split_over_byte_pieces_is_held_until_complete():
    tok = _tokenizer("gemma3")
    pieces = [tok.token_id(f"<0x{b:02X}>") for b in "🦘".encode()]  # F0 9F A6 98
    detok = StreamingDetokenizer(tok)
    assert [detok.add(i) for i in pieces] == ["", "", "", "🦘"]
    assert detok.flush() == ""


def test_byte_level_bpe_emoji_split_across_tokens():
    tok = _tokenizer("smollm2")
    ids = tok.encode("🦘 hop", add_special=False)
    assert len(ids) > 2  # SmolLM2 has no token for this emoji: it spans several byte-level tokens
    chunks = stream(tok, ids)
    assert chunks[0] == "" and "".join(chunks) == "🦘 hop"
    assert all(REPLACEMENT not in c for c in chunks)


def test_truncated_character_becomes_one_replacement_at_flush():
    tok = _tokenizer("gemma3")
    ids = [tok.token_id("Hi"), tok.token_id("<0xF0>"), tok.token_id("<0x9F>")]
    detok = StreamingDetokenizer(tok)
    assert [detok.add(i) for i in ids] == ["Hi", "", ""]
    assert detok.flush() == REPLACEMENT == tok.decode(ids)[-1]


def test_invalid_byte_is_replaced_where_decode_replaces_it():
    tok = _tokenizer("gemma3")
    ids = [tok.token_id("<0x9F>"), tok.token_id("a")]  # a continuation byte with no lead byte
    assert "".join(stream(tok, ids)) == tok.decode(ids) == REPLACEMENT + "a"


def test_sentencepiece_spaces_and_first_token_prefix_space():
    tok = _tokenizer("gemma3_space_prefix")
    ids = tok.encode("Hello world", add_special=False)
    assert tok.piece_bytes(ids[0]) == b" Hello"  # the prefix space add_space_prefix put there
    chunks = stream(tok, ids)
    assert chunks[:2] == ["Hello", " world"]
    # With BOS first, llama.cpp strips nothing (the strip applies to the first token only).
    with_bos = tok.encode("Hello world", add_special=True)
    assert "".join(stream(tok, with_bos)) == tok.decode(with_bos) == " Hello world"


def test_control_tokens_render_only_when_asked():
    tok = _tokenizer("smollm2")
    ids = tok.encode("<|im_start|>assistant\nHi<|im_end|>", add_special=False)
    assert "".join(stream(tok, ids)) == "assistant\nHi"
    assert "".join(stream(tok, ids, special=True)) == "<|im_start|>assistant\nHi<|im_end|>"


def test_clean_spaces_vocabulary_streams_exactly_what_decode_cleans():
    tok = _tokenizer("smollm2_pre_gpt2")
    assert tok.clean_spaces
    text = "Hello , world . it 's he 'm we 're I 'll ' quoted ' end '"
    ids = tok.encode(text, add_special=False)
    chunks = stream(tok, ids)
    # llama.cpp's clean-up: no space before , . and in " 's" " 'm" " 're"; " ' " -> "'"
    assert "".join(chunks) == tok.decode(ids) == "Hello, world. it's he'm we're I 'll'quoted'end '"
    assert all(not c.endswith(" ") for c in chunks[:-1])  # a space is shown only once it is safe


@pytest.mark.parametrize(
    "text", ["a ' b", "x '", "  ,", "it 're", "' '", " 's", "end ' ' ' ,", "a  ,b 's  'm"]
)
def test_clean_spaces_streaming_one_character_per_token(text):
    # The same text spelled one token per character stresses where the stream may cut.
    tok = _tokenizer("smollm2_pre_gpt2")
    ids = [i for ch in text for i in tok.encode(ch, add_special=False)]
    assert (
        "".join(stream(tok, ids))
        == tok.decode(ids)
        == tok.decode(tok.encode(text, add_special=False))
    )


# --- a scripted vocabulary: every way of cutting a clean-up rule across tokens -------------------
class PieceTokenizer:
    """Just what StreamingDetokenizer reads: piece bytes per id, and the two vocabulary flags
    (left out entirely when `clean` is None, as for a tokenizer that predates clean-up)."""

    def __init__(self, pieces, clean=None, add_space_prefix=False):
        self.pieces, self.add_space_prefix = pieces, add_space_prefix
        if clean is not None:
            self.clean_spaces = clean

    def piece_bytes(self, token_id, special=False):
        return self.pieces[token_id]


CLEANUP_PIECES = [
    b" ",
    b"'",
    b"s",
    b",",
    b"a",
    b" '",
    b"  ",
    b"'s",
    b" ,",
    b"\xc3",
    b"\xa9",
    b".",
    b"a ",
    b"s  ",
    b"x'",
]


def test_token_sequences_stream_exactly_what_a_one_shot_clean_up_gives():
    import itertools
    import random

    from engine.tokenizer import clean_spaces

    tok = PieceTokenizer(CLEANUP_PIECES, clean=True)
    everything_short = itertools.chain.from_iterable(
        itertools.product(range(len(CLEANUP_PIECES)), repeat=n) for n in (1, 2, 3)
    )
    draw = random.Random(16)
    longer = (
        [draw.randrange(len(CLEANUP_PIECES)) for _ in range(draw.randint(4, 12))]
        for _ in range(3000)
    )
    for ids in itertools.chain(everything_short, longer):
        detok = StreamingDetokenizer(tok)
        streamed = "".join(detok.add(i) for i in ids) + detok.flush()
        raw = b"".join(CLEANUP_PIECES[i] for i in ids)
        assert streamed == clean_spaces(raw).decode("utf-8", errors="replace"), ids
        assert detok.pending_bytes == b""


def test_clean_spaces_releases_a_first_token_that_no_rule_can_reach_at_once():
    # Only bytes a clean-up rule could still change are held back (a space, an apostrophe):
    # a reply's first word shows whole as soon as it arrives, not one letter short.
    tok = PieceTokenizer([b"Hello", b" world", b"a"], clean=True)
    detok = StreamingDetokenizer(tok)
    assert (detok.add(0), detok.pending_bytes) == ("Hello", b"")
    assert (detok.add(1), detok.pending_bytes) == (" world", b"")
    single = StreamingDetokenizer(tok)
    assert (single.add(2), single.pending_bytes) == ("", b"a")  # one byte: no cut is possible
    assert (single.add(2), single.pending_bytes) == ("aa", b"")
