"""Issue 32: the fixed memory cost of a vocabulary, before any weight.

Gemma 3's 262k-token vocabulary cost ~245 MB as Python objects (a str per token in the metadata,
a float per score, a bytes per piece, a dict of every text). The vocabulary is now stored flat
(engine.gguf.StringArray / NumericArray, engine.tokenizer.decoding.PieceTable); these tests bound
the Python heap each stage keeps by a size computed from the vocabulary itself (its UTF-8 bytes
and its token count), so a regression to per-token objects (~50-150 bytes per token) fails.

tracemalloc sees the Python heap (objects, numpy buffers), not the HF tokenizer's Rust tables:
those are bounded by the RSS numbers in bench/RESULTS.md, not here. Real vocabularies (SmolLM2's
GPT-2 BPE, Gemma 3's SentencePiece) on tiny random weights: no model is loaded.
"""

from __future__ import annotations

import functools
import gc
import tracemalloc

import pytest
from gguf import GGUFReader, GGUFValueType, GGUFWriter

from engine.errors import ModelFileError
from engine.gguf import NumericArray, StringArray, open_gguf
from engine.tokenizer import Tokenizer

MiB = 2**20


# (arch, vocabulary): tuples, so conftest does not take the vocabulary names for real-model
# fixtures (no model is loaded). Gemma 3's 262k tokens take ~40 s here (gguf-py's reader,
# tracemalloc over 514k merges): slow tier.
@pytest.fixture(
    params=[
        pytest.param(("llama", "smollm2"), id="smollm2"),
        pytest.param(("gemma3", "gemma3"), id="gemma3", marks=pytest.mark.slow),
    ]
)
def vocab_file(request, tiny_model_factory):
    arch, vocabulary = request.param
    return tiny_model_factory(arch, tokenizer=vocabulary)


def _held(fn):
    """fn()'s result and the Python heap it still holds after a collection (bytes)."""
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        result = fn()
        gc.collect()
        held = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    return result, held


@functools.lru_cache(maxsize=4)
def _reference_strings(path, key: str) -> list[str]:
    """The strings of a metadata array as gguf-py's own reader decodes them (independent; ~20 s
    for Gemma's 262k tokens, so read once per file and key)."""
    field = GGUFReader(path).fields[key]
    return [bytes(field.parts[i]).decode("utf-8") for i in field.data]


def test_vocabulary_metadata_is_flat_and_equal_to_gguf_py(vocab_file):
    g, held = _held(lambda: open_gguf(vocab_file))
    tokens = g.metadata["tokenizer.ggml.tokens"]
    assert isinstance(tokens, StringArray)
    assert isinstance(g.metadata["tokenizer.ggml.token_type"], NumericArray)
    reference = _reference_strings(vocab_file, "tokenizer.ggml.tokens")
    assert tokens == reference and tokens[-1] == reference[-1] and tokens[7:9] == reference[7:9]
    # Flat strings: their UTF-8 bytes plus an 8-byte offset each (the tokens, and a BPE
    # vocabulary's merges), numbers as views of the map (0 bytes); 1 MiB for everything else.
    strings = [reference]
    if "tokenizer.ggml.merges" in g.metadata:
        merges = _reference_strings(vocab_file, "tokenizer.ggml.merges")
        assert g.metadata["tokenizer.ggml.merges"] == merges
        strings.append(merges)
    bound = sum(len(s.encode()) + 8 for array in strings for s in array) + 1 * MiB
    assert held <= bound, f"metadata holds {held / MiB:.1f} MiB, bound {bound / MiB:.1f} MiB"


def test_tokenizer_keeps_no_object_per_token(vocab_file):
    g = open_gguf(vocab_file)
    n = len(g.metadata["tokenizer.ggml.tokens"])
    text_bytes = sum(
        len(t.encode()) for t in _reference_strings(vocab_file, "tokenizer.ggml.tokens")
    )
    tok, held = _held(lambda: Tokenizer.from_metadata(g.metadata))
    # Special tokens (control, user-defined, unknown: types 2-4 in the file) are cut out of the
    # text by a Python partition table, ~200 bytes each (SmolLM2: 17, Gemma 3: 6.4k).
    n_special = sum(1 for t in g.metadata["tokenizer.ggml.token_type"] if t in (2, 3, 4))
    # Every other token costs at most its text's bytes (its piece), 12 bytes of piece offsets
    # and 1 of attributes; a list of bytes pieces alone would add ~50 bytes per token.
    bound = text_bytes + 13 * n + 256 * n_special + MiB // 2
    assert held <= bound, (
        f"the tokenizer holds {held / MiB:.1f} MiB of Python heap for {n} tokens, "
        f"bound {bound / MiB:.1f} MiB ({held / n:.0f} bytes per token)"
    )
    assert tok.vocab_size == n


def test_flat_tokenizer_reads_every_token_like_the_file(vocab_file):
    """Texts, pieces and ids through the flat tables equal gguf-py's strings of the file."""
    reference = _reference_strings(vocab_file, "tokenizer.ggml.tokens")
    tok = Tokenizer.from_gguf(open_gguf(vocab_file))
    for token_id in (0, 1, 2, 255, 256, len(reference) // 2, len(reference) - 1):
        text = reference[token_id]
        assert tok.tokens[token_id] == text
        assert tok.piece_bytes(token_id, special=True) != b"" or text == ""
    end_of_turn = "<end_of_turn>" if "<end_of_turn>" in reference else "<|im_end|>"
    assert tok.token_id(end_of_turn) == len(reference) - 1 - reference[::-1].index(end_of_turn)
    assert tok.token_id("no such token text \u2603") is None


def _write_strings(path, strings: list) -> None:
    writer = GGUFWriter(str(path), "llama")
    writer.add_array("test.strings", strings)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def test_long_string_array_round_trips_empty_and_multibyte_strings(tmp_path):
    strings = [f"w{i}" for i in range(300)]
    strings[0] = ""
    strings[150] = ""
    strings[151] = "é\u2581\U0001f600"
    strings[299] = ""
    path = tmp_path / "ok.gguf"
    _write_strings(path, strings)
    value = open_gguf(path).metadata["test.strings"]
    assert isinstance(value, StringArray)
    assert value.tolist() == strings and value[151] == "é\u2581\U0001f600" and value[-1] == ""


@pytest.mark.parametrize(
    "bad",
    [
        b"\xff\xfe",  # never UTF-8
        None,  # "\xc3" then "\xa9": the blob is a valid "é", each string alone is not
    ],
)
def test_long_string_array_with_a_bad_string_names_it(tmp_path, bad):
    strings: list = [f"w{i}".encode() for i in range(300)]
    if bad is None:
        strings[200], strings[201] = b"\xc3", b"\xa9"
    else:
        strings[200] = bad
    path = tmp_path / "bad.gguf"
    _write_strings(path, strings)
    with pytest.raises(ModelFileError, match=r"test\.strings\[200\] is not valid UTF-8"):
        open_gguf(path)


def test_long_numeric_arrays_read_like_lists(tmp_path):
    path = tmp_path / "numbers.gguf"
    writer = GGUFWriter(str(path), "llama")
    writer.add_array("test.scores", [i / 4 for i in range(300)])
    writer.add_array("test.short", [1.5, 2.5])
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    g = open_gguf(path)
    scores = g.metadata["test.scores"]
    assert isinstance(scores, NumericArray) and g.metadata["test.short"] == [1.5, 2.5]
    assert (
        scores == [i / 4 for i in range(300)] and scores[-1] == 74.75 and scores[2:4] == [0.5, 0.75]
    )
    assert g.metadata_types["test.scores"].element_type == GGUFValueType.FLOAT32


def test_merges_cache_with_ids_outside_the_vocabulary_is_rebuilt(tmp_path, monkeypatch, caplog):
    """The v3 cache stores token-id pairs: a well-formed file (right header and checksum) whose
    ids do not fit this vocabulary is derived again and replaced, never indexed."""
    import numpy as np

    import engine.tokenizer as module
    from engine.tokenizer import spm_merges

    pieces = {"▁": -1.0, "a": -2.0, "b": -2.0, "ab": -0.5, "▁ab": -0.2}
    tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)] + list(pieces)
    metadata = {
        "tokenizer.ggml.model": "llama",
        "tokenizer.ggml.tokens": tokens,
        "tokenizer.ggml.scores": [0.0] * 259 + list(pieces.values()),
        "tokenizer.ggml.token_type": [2, 3, 3] + [6] * 256 + [1] * len(pieces),
        "tokenizer.ggml.add_space_prefix": False,
    }
    monkeypatch.setattr(module, "MERGES_CACHE_DIR", tmp_path)
    expected = Tokenizer.from_metadata(metadata).encode("ab ab", add_special=False)
    (cache_file,) = tmp_path.iterdir()
    good = cache_file.read_bytes()
    spm_merges.write_cached(cache_file, np.array([[259, 10**6]]))  # well-formed, id out of range
    assert Tokenizer.from_metadata(metadata).encode("ab ab", add_special=False) == expected
    assert "ids outside the vocabulary" in caplog.text
    assert cache_file.read_bytes() == good
    # by hand: "ab" (262), then " ab" escaped to "▁ab" (263); no prefix space is added
    assert expected == [262, 263]
