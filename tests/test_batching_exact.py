"""Why batched decoding can be exact: every row of a batched forward equals the row computed alone.

The oracle is the model's own single-sequence path (forward() one request at a time, decode as
T=1 mat-vecs), which tests/test_forward_oracle.py checks against an independent reference; here
the claim is bit equality between the two ways of computing the same rows.
"""

from __future__ import annotations

import numpy as np
import pytest

from engine.models.transformer import Segment


def _distinct_weights(model):
    """One weight per (quant type, shape) in the model, plus the output projection."""
    seen, weights = set(), [model.output]
    for layer in model.layers:
        for name in ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down"):
            w = getattr(layer, name)
            key = (w.qtype.name, tuple(w.shape))
            if key not in seen:
                seen.add(key)
                weights.append(w)
    return weights


# One test function per model (not a fixture looked up by name at run time): the real-model
# fixture must be a visible dependency, so tests/conftest.py marks the test `slow`.
def test_a_mat_mul_row_equals_the_mat_vec_of_that_row_for_every_row_count_smollm2(smollm2):
    _check_mat_mul_rows_equal_mat_vecs(smollm2)


def test_a_mat_mul_row_equals_the_mat_vec_of_that_row_for_every_row_count_gemma3(gemma3):
    _check_mat_mul_rows_equal_mat_vecs(gemma3)


def _check_mat_mul_rows_equal_mat_vecs(lm):
    # T rows go through 8-token tiles, then one 4-, one 2-token tile, then single tokens: every
    # split from 1 to 17 rows (and a prefill-sized 40) must give each row exactly its T=1 result
    ops, rng = lm.model.backend, np.random.default_rng(5)
    for w in _distinct_weights(lm.model):
        x = (rng.standard_normal((40, w.cols)) * rng.uniform(0.1, 4.0, (40, 1))).astype(np.float32)
        single = np.stack([ops.linear(w, x[i : i + 1]).copy()[0] for i in range(40)])
        for t in [*range(2, 18), 40]:
            rows = ops.linear(w, x[:t])
            bad = np.flatnonzero((rows != single[:t]).any(axis=1))
            assert bad.size == 0, f"{w.name} ({w.qtype.name}) with {t} rows: rows {bad} differ"


def test_forward_segments_equals_each_sequence_alone_smollm2(smollm2):
    _check_forward_segments_equal_alone(smollm2)


def test_forward_segments_equals_each_sequence_alone_gemma3(gemma3):
    _check_forward_segments_equal_alone(gemma3)


def _check_forward_segments_equal_alone(lm):
    model = lm.model
    rng = np.random.default_rng(2)
    prompts = [rng.integers(3, 2000, size=n).tolist() for n in (6, 41, 77)]
    alone = []
    for p in prompts:  # prefill in one piece, one decode token, then a 3-token draft verify
        cache = model.new_cache(128)
        alone.append(
            (
                model.forward(p, cache),
                model.forward([7], cache),
                model.forward([9, 11, 13], cache, all_logits=True),
                cache,
            )
        )
    caches = [model.new_cache(128) for _ in prompts]
    p0, p1, p2 = prompts
    c0, c1, c2 = caches
    # the same work in mixed steps: prefill slices beside decodes, in various orders
    s1 = model.forward_segments(
        [Segment(p0, c0, [5]), Segment(p1[:17], c1, []), Segment(p2[:32], c2, [])]
    )
    s2 = model.forward_segments(
        [Segment(p1[17:], c1, [23]), Segment(p2[32:64], c2, []), Segment([7], c0, [0])]
    )
    s3 = model.forward_segments(
        [Segment(p2[64:], c2, [12]), Segment([7], c1, [0]), Segment([9, 11, 13], c0, [0, 1, 2])]
    )
    s4 = model.forward_segments([Segment([7], c2, [0]), Segment([9, 11, 13], c1, [0, 1, 2])])
    s5 = model.forward_segments([Segment([9, 11, 13], c2, [0, 1, 2])])
    assert s1[1].shape == (0, lm.config.n_vocab)
    got = [
        (s1[0][0], s2[2][0], s3[2], c0),
        (s2[0][0], s3[1][0], s4[1], c1),
        (s3[0][0], s4[0][0], s5[0], c2),
    ]
    for i, (mine, theirs) in enumerate(zip(got, alone, strict=True)):
        for a, b in zip(mine[:3], theirs[:3], strict=True):
            assert np.array_equal(a, b), f"sequence {i}: logits differ from running it alone"
        assert mine[3].tokens == theirs[3].tokens
        n = mine[3].n_tokens
        assert np.array_equal(mine[3].k[:, :n], theirs[3].k[:, :n])
        assert np.array_equal(mine[3].v[:, :n], theirs[3].v[:, :n])


def test_decode_only_steps_equal_each_sequence_alone_smollm2(smollm2):
    _check_decode_steps_equal_alone(smollm2)


def test_decode_only_steps_equal_each_sequence_alone_gemma3(gemma3):
    _check_decode_steps_equal_alone(gemma3)


def _check_decode_steps_equal_alone(lm):
    # steps of one token per sequence run as the batched step lists (engine/models/
    # batch_decode.py) on the real weights' quant types; each row must be its alone row
    from engine.models import batch_decode

    model = lm.model
    rng = np.random.default_rng(9)
    prompts = [rng.integers(3, 2000, size=n).tolist() for n in (5, 23, 11)]
    nexts = [rng.integers(3, 2000, size=6).tolist() for _ in prompts]
    alone = []
    for p, more in zip(prompts, nexts, strict=True):
        cache = model.new_cache(64)
        model.forward(p, cache)
        alone.append(([model.forward([t], cache) for t in more], cache))
    caches = [model.new_cache(64) for _ in prompts]
    for p, cache in zip(prompts, caches, strict=True):
        model.forward(p, cache)
    got: list[list[np.ndarray]] = [[] for _ in prompts]
    for step in range(6):
        order = [step % 3, (step + 1) % 3, (step + 2) % 3]  # each cache visits every slot
        out = model.forward_segments([Segment([nexts[s][step]], caches[s], [0]) for s in order])
        for s, rows in zip(order, out, strict=True):
            got[s].append(rows[0])
    assert isinstance(batch_decode._plans[model][3], batch_decode.BatchDecodePlan)
    for s, ((want, want_cache), mine) in enumerate(zip(alone, got, strict=True)):
        for i, (a, b) in enumerate(zip(mine, want, strict=True)):
            assert np.array_equal(a, b), f"sequence {s}, decode {i}: logits differ from alone"
        n = want_cache.n_tokens
        assert np.array_equal(caches[s].k[:, :n], want_cache.k[:, :n])
        assert np.array_equal(caches[s].v[:, :n], want_cache.v[:, :n])


def test_forward_segments_refuses_bad_input_before_touching_any_cache(smollm2):
    model = smollm2.model
    a, b = model.new_cache(8), model.new_cache(8)
    with pytest.raises(ValueError, match="same KV cache"):
        model.forward_segments([Segment([1], a, [0]), Segment([2], a, [0])])
    with pytest.raises(ValueError, match="out of range"):
        model.forward_segments([Segment([1], a, [0]), Segment([10**7], b, [0])])
    with pytest.raises(ValueError, match="logit_rows"):
        model.forward_segments([Segment([1, 2], a, [2])])
    with pytest.raises(ValueError, match="max_batch"):
        big = [model.new_cache(model.max_batch) for _ in range(2)]
        model.forward_segments(
            [Segment([1] * model.max_batch, big[0], []), Segment([1], big[1], [0])]
        )
    assert a.n_tokens == b.n_tokens == 0
