"""The untruncated draw (no top-k, top-p or min-p: engine.sampling._draw_untruncated), found in
two levels (a block of ids, then an id inside it) instead of one cumulative sum over the whole
vocabulary (issue 32: that sum was serial work per stream in every batched decode step)."""

from __future__ import annotations

import numpy as np
import pytest

from engine.errors import ModelOutputError
from engine.generation_config import GenerationConfig
from engine.sampling import _DRAW_BLOCK, _draw_untruncated, make_sampler

NEG = -np.inf


def _three_tokens(vocab: int = 3000) -> np.ndarray:
    # probabilities 1/4, 1/4, 1/2 on ids 5, 1500 and the last id, in three different blocks
    logits = np.full(vocab, NEG, np.float32)
    logits[5] = 0.0
    logits[1500] = 0.0
    logits[vocab - 1] = np.float32(np.log(2.0))
    return logits


@pytest.mark.parametrize(
    ("u", "token"),
    [(0.0, 5), (0.1, 5), (0.2499, 5), (0.2501, 1500), (0.4999, 1500), (0.5001, 2999)]
    + [(0.9999999999999999, 2999)],
)
def test_the_draw_is_the_inverse_cdf_at_u(u, token):
    assert _DRAW_BLOCK < 1500  # the three ids are in three blocks
    assert _draw_untruncated(_three_tokens(), 1.0, u) == token


def test_temperature_divides_the_logits_before_the_softmax():
    # logits 0 and 2 ln 3 at temperature 2: weights 1 and 3, so the boundary is at u = 1/4
    logits = np.full(2048 + 7, NEG, np.float32)
    logits[10] = 0.0
    logits[2050] = np.float32(2 * np.log(3.0))
    assert _draw_untruncated(logits, 2.0, 0.24) == 10
    assert _draw_untruncated(logits, 2.0, 0.26) == 2050
    # at temperature 1 the weights are 1 and 9: the boundary moves to u = 1/10
    assert _draw_untruncated(logits, 1.0, 0.11) == 2050


def test_masked_tokens_are_never_drawn_even_at_the_top_of_the_range():
    # the finite ids all sit in the first two blocks; the last blocks have mass 0
    rng = np.random.default_rng(1)
    logits = np.full(5000, NEG, np.float32)
    logits[:1500] = rng.standard_normal(1500).astype(np.float32)
    logits[700:900] = NEG  # a masked run inside a block too
    # u = 1.0 stands for u * total rounding up to the total itself
    for u in (0.0, 0.5, 0.9999999999999999, 1.0 - 1e-12, 1.0):
        token = _draw_untruncated(logits, 1.0, u)
        assert np.isfinite(logits[token]), (u, token)


def test_it_matches_a_float64_cumulative_sum_over_the_vocabulary():
    # a peaked 262k-token distribution, as real logits are; the reference is an independent
    # float64 softmax and one cumulative sum, the textbook inverse CDF
    rng = np.random.default_rng(7)
    vocab = 262_144
    logits = (rng.standard_normal(vocab) * 2.0).astype(np.float32)
    logits[rng.integers(0, vocab, 40)] += 12.0
    logits[rng.integers(0, vocab, 5000)] = NEG
    for temperature in (0.7, 1.0, 1.5):
        z = logits.astype(np.float64) / temperature
        p = np.exp(z - z.max())
        cdf = np.cumsum(p / p.sum())
        for u in np.linspace(0.0, 1.0, 1500, endpoint=False) + 1.0 / 3001:
            want = int(np.searchsorted(cdf, u, side="right"))
            if np.min(np.abs(cdf[max(want - 1, 0) : want + 1] - u)) < 1e-6:
                continue  # float32 weights vs float64: a u this close may go either way
            assert _draw_untruncated(logits, temperature, float(u)) == want, (temperature, u)


def test_the_sampler_uses_it_with_one_random_number_a_token():
    logits = _three_tokens(4096)
    config = GenerationConfig(
        do_sample=True, temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, seed=77
    )
    sampler = make_sampler(config)
    rng = np.random.default_rng(77)
    expected = [_draw_untruncated(logits, 1.0, rng.random()) for _ in range(200)]
    assert [sampler(logits) for _ in range(200)] == expected
    # and the draws follow 1/4, 1/4, 1/2
    counts = {t: expected.count(t) for t in (5, 1500, 4095)}
    assert sum(counts.values()) == 200
    assert 25 <= counts[5] <= 75 and 25 <= counts[1500] <= 75 and 70 <= counts[4095] <= 130


def test_non_finite_logits_are_refused():
    with pytest.raises(ModelOutputError, match="corrupt"):
        _draw_untruncated(np.full(3000, NEG, np.float32), 1.0, 0.5)
    with pytest.raises(ModelOutputError, match="corrupt"):
        _draw_untruncated(np.full(3000, np.nan, np.float32), 1.0, 0.5)
