"""Cache semantics of Model.forward on the tiny fixtures: prefill == token-by-token decode,
chunked prefill == one batch, truncate/clone give the same logits as recomputing, bad input
refused. These hold exactly up to float rounding for any correct implementation."""

from pathlib import Path

import numpy as np
import pytest

from engine.errors import ContextOverflowError
from engine.gguf import open_gguf
from engine.kernels.reference import ReferenceBackend
from engine.models import build_model

FIXTURES = Path(__file__).parent / "fixtures"
IDS = [17, 4023, 99, 12000, 5, 31337, 777, 42, 2024, 8, 640, 1500, 3, 49000, 256, 11]
ATOL = 1e-3  # same arithmetic, different batch shapes: float32 summation order (seen 2.6e-4 on logits ~6)


def _model(arch: str, max_batch: int = 256):
    return build_model(
        open_gguf(FIXTURES / f"tiny_{arch}.gguf"), backend=ReferenceBackend(), max_batch=max_batch
    )


@pytest.mark.parametrize(
    "arch",
    [
        "llama",
        "qwen2",
        "qwen3",
        "gemma3",
        "qwen3moe",
        "phi3",
        "gemma2",
        "olmo2",
        "mistral3",
        "gpt_oss",
    ],
)
def test_prefill_equals_token_by_token_decode(arch):
    """qwen3moe's and gpt-oss's decode route through their own one-token path (gpt-oss's with
    its router and expert biases); phi3's LongRoPE, gemma2's and gpt-oss's windows and
    mistral3's position temperature also differ between a batch and single steps."""
    model = _model(arch)
    ids = [i % model.config.n_vocab for i in IDS]  # the issue-10 fixtures have 256 tokens
    batched = model.forward(ids, model.new_cache(32), all_logits=True)
    cache = model.new_cache(32)
    stepwise = np.stack([model.forward([t], cache) for t in ids])
    # gemma3 tiny has window 8, so 16 tokens cross the window in decode too.
    np.testing.assert_allclose(stepwise, batched, atol=ATOL, rtol=0)
    assert cache.n_tokens == len(ids) and cache.tokens == ids


def test_chunked_prefill_equals_one_batch():
    whole = _model("gemma3").forward(IDS, _model("gemma3").new_cache(32), all_logits=True)
    small = _model("gemma3", max_batch=5)
    np.testing.assert_allclose(
        small.forward(IDS, small.new_cache(32), all_logits=True), whole, atol=ATOL, rtol=0
    )


def test_logits_at_returns_requested_rows_in_order():
    model = _model("llama")
    every = model.forward(IDS, model.new_cache(32), all_logits=True)
    picked = model.forward(IDS, model.new_cache(32), logits_at=[9, 2, 9, 15])
    np.testing.assert_allclose(picked, every[[9, 2, 9, 15]], atol=ATOL, rtol=0)
    last = model.forward(IDS, model.new_cache(32))
    assert last.shape == (model.config.n_vocab,)
    np.testing.assert_allclose(last, every[-1], atol=ATOL, rtol=0)


def test_truncate_then_continue_equals_fresh_run():
    model = _model("qwen3")
    cache = model.new_cache(32)
    model.forward(IDS[:10], cache)
    saved = cache.clone()
    cache.truncate(6)  # e.g. rejected speculative tokens
    resumed = model.forward(IDS[6:12], cache, all_logits=True)
    fresh = model.forward(IDS[:12], model.new_cache(32), all_logits=True)[6:]
    np.testing.assert_allclose(resumed, fresh, atol=ATOL, rtol=0)
    # The clone taken before truncation still continues its own sequence.
    np.testing.assert_allclose(
        model.forward(IDS[10:12], saved, all_logits=True), fresh[4:6], atol=ATOL, rtol=0
    )


def test_overflow_and_bad_ids_are_refused_without_touching_the_cache():
    model = _model("llama")
    cache = model.new_cache(4)
    model.forward(IDS[:3], cache)
    with pytest.raises(ContextOverflowError):
        model.forward(IDS[3:5], cache)
    with pytest.raises(ValueError, match="out of range"):
        model.forward([model.config.n_vocab], cache)
    with pytest.raises(ValueError):
        model.forward([], cache)
    assert cache.n_tokens == 3


def test_tied_output_uses_the_embedding():
    model = _model("llama")
    assert model.output is model.token_embd


def test_rope_freq_factors_tensor_is_applied():
    """Uniform factors of 2 halve every rotation frequency: same as linear RoPE scaling by 2."""
    import dataclasses

    from gguf import GGMLQuantizationType

    from engine.qtensor import QTensor

    gguf_file = open_gguf(FIXTURES / "tiny_llama.gguf")
    base = build_model(gguf_file, backend=ReferenceBackend())
    half = base.config.head_dim // 2
    factors = QTensor(
        "rope_freqs.weight", GGMLQuantizationType.F32, (half,), np.full(half, 2.0, np.float32)
    )
    with_factors = build_model(
        type(
            "G",
            (),
            dict(
                arch=gguf_file.arch,
                metadata=gguf_file.metadata,
                tensors={**gguf_file.tensors, "rope_freqs.weight": factors},
            ),
        ),
        backend=ReferenceBackend(),
    )
    scaled_cfg = dataclasses.replace(base.config, rope_freq_scale=0.5)
    scaled = build_model(gguf_file, scaled_cfg, backend=ReferenceBackend())
    got = with_factors.forward(IDS, with_factors.new_cache(32), all_logits=True)
    np.testing.assert_allclose(
        got, scaled.forward(IDS, scaled.new_cache(32), all_logits=True), atol=ATOL, rtol=0
    )
    assert np.abs(got - base.forward(IDS, base.new_cache(32), all_logits=True)).max() > 10 * ATOL


def test_wrongly_shaped_or_missing_tensor_is_named():
    from engine.errors import ModelFileError

    gguf_file = open_gguf(FIXTURES / "tiny_llama.gguf")
    tensors = dict(gguf_file.tensors)
    import dataclasses

    # ffn_down's (d_model, n_ff) storage under ffn_up's name: a transposed weight.
    tensors["blk.1.ffn_up.weight"] = dataclasses.replace(
        tensors["blk.1.ffn_down.weight"], name="blk.1.ffn_up.weight"
    )
    fake = type("G", (), dict(arch=gguf_file.arch, metadata=gguf_file.metadata, tensors=tensors))
    with pytest.raises(ModelFileError, match=r"blk\.1\.ffn_up\.weight.*shape"):
        build_model(fake, backend=ReferenceBackend())
    del tensors["blk.1.ffn_up.weight"]
    with pytest.raises(ModelFileError, match=r"'blk\.1\.ffn_up\.weight' is missing"):
        build_model(fake, backend=ReferenceBackend())
