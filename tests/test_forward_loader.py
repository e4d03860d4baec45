"""load_model: defaults, validation, progress reporting."""

from pathlib import Path

import pytest

from engine.errors import ConfigValidationError, UnsupportedModelError
from engine.loader import DEFAULT_MAX_CONTEXT, load_model

FIXTURES = Path(__file__).parent / "fixtures"


@pytest.fixture(scope="module")
def tiny_with_vocab(tmp_path_factory):
    """A tiny llama with SmolLM2's full vocabulary (the committed fixtures omit it)."""
    from tiny_models import write_tiny_model

    return write_tiny_model(
        tmp_path_factory.mktemp("loader") / "tiny.gguf",
        "llama",
        d_model=32,
        n_heads=4,
        n_kv_heads=2,
        head_dim=8,
        d_ff=64,
        tie_embeddings=True,
    )


def test_load_tiny_model_reports_progress_and_defaults(monkeypatch, tiny_with_vocab):
    monkeypatch.setenv("LOCALCHAT_KERNELS", "numpy")
    seen = []
    lm = load_model(tiny_with_vocab, progress=lambda stage, f: seen.append((stage, f)))
    assert lm.n_ctx == min(lm.config.context_length, DEFAULT_MAX_CONTEXT)
    assert lm.backend.name == "numpy" and lm.model.config is lm.config
    fractions = [f for _, f in seen]
    assert fractions == sorted(fractions) and fractions[0] == 0.0 and seen[-1] == ("ready", 1.0)
    assert lm.tokenizer.vocab_size == lm.config.n_vocab
    ids = lm.tokenizer.encode("Hello world", add_special=False)
    assert lm.model.forward(ids, lm.model.new_cache(8)).shape == (lm.config.n_vocab,)


@pytest.mark.parametrize("n_ctx", [0, -5, 10**9, 1.5, True])
def test_n_ctx_out_of_range_is_refused_naming_the_limit(n_ctx, monkeypatch):
    monkeypatch.setenv("LOCALCHAT_KERNELS", "numpy")
    with pytest.raises(ConfigValidationError, match="n_ctx"):
        load_model(FIXTURES / "tiny_llama.gguf", n_ctx=n_ctx)


def test_n_threads_validated(monkeypatch):
    with pytest.raises(ConfigValidationError, match="n_threads"):
        load_model(FIXTURES / "tiny_llama.gguf", n_threads=0)


def test_unsupported_architecture_refused(tmp_path):
    from gguf import GGUFWriter

    path = tmp_path / "mamba.gguf"
    writer = GGUFWriter(path, "mamba")
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with pytest.raises(UnsupportedModelError, match="mamba"):
        load_model(path)


def test_close_stops_the_backend(monkeypatch, tiny_with_vocab):
    monkeypatch.setenv("LOCALCHAT_KERNELS", "numpy")
    closed = []
    with load_model(tiny_with_vocab) as lm:
        lm.backend.close = lambda: closed.append(True)
    assert closed == [True]
