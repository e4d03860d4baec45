"""tools/make_embedding_model.py without converting anything (conversion is set-up work, never
test work): when a cached GGUF counts as current, and the phantom-space vocabulary it writes."""

from __future__ import annotations

from pathlib import Path

import pytest
from gguf import GGUFWriter, TokenType

from tools import make_embedding_model as mk


def _header_only(path: Path, source: str | None) -> Path:
    writer = GGUFWriter(str(path), "bert")
    if source is not None:
        writer.add_string(mk.SOURCE_KEY, source)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def test_a_cached_file_is_current_only_when_made_from_this_source(tmp_path, monkeypatch):
    monkeypatch.setattr(mk, "source_id", lambda: "pkg==1 converter=2")
    assert not mk.is_current(tmp_path / "absent.gguf")
    assert mk.is_current(_header_only(tmp_path / "same.gguf", "pkg==1 converter=2"))
    assert not mk.is_current(_header_only(tmp_path / "older.gguf", "pkg==1 converter=1"))
    assert not mk.is_current(_header_only(tmp_path / "foreign.gguf", None))
    (tmp_path / "torn.gguf").write_bytes(b"GGUF\x03\x00")  # an interrupted copy
    assert not mk.is_current(tmp_path / "torn.gguf")


def test_ensure_converts_only_when_the_file_is_not_current(tmp_path, monkeypatch):
    calls: list[Path] = []
    monkeypatch.setattr(mk, "model_zip", lambda: tmp_path / "model.zip")
    monkeypatch.setattr(mk, "convert", lambda source, out: calls.append(out))
    monkeypatch.setattr(mk, "source_id", lambda: "pkg==1 converter=2")
    target = _header_only(tmp_path / "m.gguf", "pkg==1 converter=2")
    assert mk.ensure(target) == target and calls == []
    monkeypatch.setattr(mk, "source_id", lambda: "pkg==2 converter=2")
    mk.ensure(target)
    assert calls == [target]


def test_vocabulary_in_llama_cpp_phantom_space_form():
    vocab = {"[PAD]": 0, "[UNK]": 1, "[CLS]": 2, "[SEP]": 3, "[MASK]": 4}
    vocab.update({"play": 5, "##ing": 6, "#": 7, "###": 8})
    tokenizer = {
        "model": {"vocab": vocab},
        "added_tokens": [{"content": t, "special": True} for t in SPECIAL],
    }
    tokens, types, specials = mk._vocabulary(tokenizer)
    assert tokens == SPECIAL + ["\u2581play", "ing", "\u2581#", "#"]
    assert types == [TokenType.CONTROL] * 5 + [TokenType.NORMAL] * 4
    assert specials == {"[CLS]": 2, "[SEP]": 3, "[UNK]": 1, "[PAD]": 0, "[MASK]": 4}


def test_a_vocabulary_with_gaps_is_refused():
    tokenizer = {"model": {"vocab": {"[PAD]": 0, "a": 2}}, "added_tokens": []}
    with pytest.raises(SystemExit, match="not 0..n-1"):
        mk._vocabulary(tokenizer)


SPECIAL = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]


def test_a_bundle_finds_its_own_embedding_model_before_the_cache(tmp_path, monkeypatch):
    # A bundle's user has no set-up step: the all-in-one bundle's copy must be the one used.
    import sys

    from engine import embedding

    bundled = tmp_path / "bundle" / "models" / embedding.DEFAULT_EMBEDDING_FILE
    bundled.parent.mkdir(parents=True)
    bundled.write_bytes(b"GGUF")
    monkeypatch.setattr(sys, "_MEIPASS", str(tmp_path / "bundle"), raising=False)
    monkeypatch.setattr(embedding, "embedding_models_dir", lambda: tmp_path / "cache")
    assert embedding.default_embedding_model_path() == bundled
    bundled.unlink()  # a bundle built without it: the cache, and a clear error naming the command
    with pytest.raises(embedding.ModelNotInstalledError, match="make_embedding_model"):
        embedding.default_embedding_model_path()
