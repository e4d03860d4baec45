"""tests/tiny_models.py's per-process copies: a second call with the same arguments gets the
bytes a fresh write gives, and any changed argument gets its own file (a stale copy would make
a bad-file test read a valid model, or two seeds the same weights)."""

from __future__ import annotations

import numpy as np
from gguf import GGMLQuantizationType as Q
from gguf import GGUFValueType

from engine.gguf import open_gguf
from tests import tiny_models
from tests.tiny_models import write_tiny_model


def test_a_copy_has_the_bytes_of_a_fresh_write_and_other_arguments_get_their_own(
    tmp_path, monkeypatch
):
    first = write_tiny_model(tmp_path / "a.gguf", "llama", Q.Q8_0, 3, tokenizer=None)
    copied = write_tiny_model(tmp_path / "b.gguf", "llama", Q.Q8_0, 3, tokenizer=None)
    monkeypatch.setattr(tiny_models, "_WRITTEN", {})  # nothing to copy: written afresh
    fresh = write_tiny_model(tmp_path / "c.gguf", "llama", Q.Q8_0, 3, tokenizer=None)
    assert copied.read_bytes() == fresh.read_bytes() == first.read_bytes()

    other_seed = write_tiny_model(tmp_path / "d.gguf", "llama", Q.Q8_0, 4, tokenizer=None)
    other_key = write_tiny_model(
        tmp_path / "e.gguf", "llama", Q.Q8_0, 3, tokenizer=None,
        extra_metadata={"llama.rope.scaling.type": (3, GGUFValueType.UINT32)},
    )  # fmt: skip
    assert other_seed.read_bytes() != first.read_bytes()
    assert open_gguf(other_key).metadata["llama.rope.scaling.type"] == 3
    assert "llama.rope.scaling.type" not in open_gguf(first).metadata


def test_a_list_argument_changed_in_the_middle_gets_its_own_file(tmp_path):
    tokens = [f"t{i}" for i in range(2000)]
    changed = [*tokens[:1000], "changed", *tokens[1001:]]
    for name, values in (("a.gguf", tokens), ("b.gguf", changed)):
        write_tiny_model(
            tmp_path / name, "llama", tokenizer=None, vocab_size=2000,
            extra_metadata={"test.array": (values, GGUFValueType.ARRAY)},
        )  # fmt: skip
    assert open_gguf(tmp_path / "a.gguf").metadata["test.array"][1000] == "t1000"
    assert open_gguf(tmp_path / "b.gguf").metadata["test.array"][1000] == "changed"


def test_an_array_argument_has_no_key():
    """numpy elides the middle of a long array's repr: two arrays differing there would share a
    key, so an argument holding an array is written afresh every time."""
    a = np.arange(5000)
    b = a.copy()
    b[2500] = -1
    assert repr(a) == repr(b)
    assert tiny_models._exact_key(("llama", (), [("extra", a)])) is None
    assert tiny_models._exact_key(("llama", (Q.Q8_0, 3), [("n_layers", 2)])) is not None
