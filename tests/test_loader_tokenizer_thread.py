"""load_model builds the tokenizer on a thread beside the kernel library (engine/loader.py): the
result is the tokenizer the file describes, and a broken vocabulary still fails the load."""

from __future__ import annotations

import pytest
from gguf import GGUFValueType

from engine.errors import TokenizerError
from engine.gguf import open_gguf
from engine.loader import load_model
from engine.tokenizer import Tokenizer
from tests.tiny_models import write_tiny_model


def test_the_threaded_tokenizer_encodes_as_one_built_from_the_metadata(tmp_path):
    path = write_tiny_model(tmp_path / "m.gguf", "llama")
    text = "Hello <|im_start|>user\nwörld 12345"
    reference = Tokenizer.from_metadata(open_gguf(path).metadata)
    with load_model(path, n_ctx=32, n_threads=1) as lm:
        assert "tokenizer" in vars(lm)  # built during the load, not on first use
        assert lm.tokenizer.encode(text) == reference.encode(text)
        assert lm.tokenizer.eog_ids == reference.eog_ids


def test_a_broken_vocabulary_fails_the_load(tmp_path):
    path = write_tiny_model(
        tmp_path / "bad.gguf",
        "llama",
        extra_metadata={"tokenizer.ggml.model": ("wordpiece", GGUFValueType.STRING)},
    )
    with pytest.raises(TokenizerError, match="wordpiece"):
        load_model(path, n_ctx=32, n_threads=1)
