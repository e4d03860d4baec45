"""Samplers and logits processors on hand-made distributions with hand-computed expectations."""

import math

import numpy as np
import pytest

from engine.generation_config import GenerationConfig
from engine.sampling import (
    greedy,
    log_softmax,
    make_logits_processors,
    make_sampler,
    sampling_distribution,
)

P = np.array([0.5, 0.25, 0.15, 0.1])
LOGITS = np.log(P).astype(np.float32) + 3.0  # a constant shift must not matter


def cfg(**values):
    return GenerationConfig.from_values({"do_sample": True, "top_k": 0, **values})


def dist(config, logits=LOGITS):
    ids, probs = sampling_distribution(config, logits)
    return dict(zip(ids.tolist(), probs.tolist(), strict=True))


def assert_dist(actual: dict, expected: dict):
    assert set(actual) == set(expected)
    for k, v in expected.items():
        assert actual[k] == pytest.approx(v, rel=1e-5), (k, actual, expected)


def test_no_truncation_keeps_the_model_distribution():
    assert_dist(dist(cfg()), {0: 0.5, 1: 0.25, 2: 0.15, 3: 0.1})


def test_top_k_renormalises_over_the_k_best():
    assert_dist(dist(cfg(top_k=2)), {0: 2 / 3, 1: 1 / 3})


def test_top_k_keeps_ties_with_the_kth_logit():
    ids, _ = sampling_distribution(cfg(top_k=2), np.array([1.0, 1.0, 1.0, 0.0], np.float32))
    assert sorted(ids.tolist()) == [0, 1, 2]


def test_top_p_keeps_the_smallest_set_reaching_p():
    # masses before each token (descending): 0, 0.5, 0.75, 0.9
    assert_dist(dist(cfg(top_p=0.7)), {0: 2 / 3, 1: 1 / 3})
    assert_dist(dist(cfg(top_p=0.76)), {0: 0.5 / 0.9, 1: 0.25 / 0.9, 2: 0.15 / 0.9})
    assert_dist(dist(cfg(top_p=0.0)), {0: 1.0})  # always at least one token


def test_min_p_is_relative_to_the_most_likely_token():
    assert_dist(dist(cfg(min_p=0.35)), {0: 2 / 3, 1: 1 / 3})  # threshold 0.175
    assert_dist(dist(cfg(min_p=0.25)), {0: 0.5 / 0.9, 1: 0.25 / 0.9, 2: 0.15 / 0.9})  # 0.125


def test_temperature_flattens_before_truncation():
    # T = 2: p_i ** (1/2) renormalised
    root = np.sqrt(P) / np.sqrt(P).sum()
    assert_dist(dist(cfg(temperature=2.0)), dict(enumerate(root.tolist())))
    # top-p after temperature: masses before = 0, .370, .632, .835 -> three tokens (two at T=1)
    kept = root[:3] / root[:3].sum()
    assert_dist(dist(cfg(temperature=2.0, top_p=0.7)), dict(enumerate(kept.tolist())))


def test_order_is_top_k_then_top_p_then_min_p():
    # top-k 3 renormalises to .556 .278 .167; top-p .8 then keeps two (masses before 0, .556, .833)
    assert_dist(dist(cfg(top_k=3, top_p=0.8)), {0: 2 / 3, 1: 1 / 3})
    # min-p after top-p: p=0.76 keeps three, then min-p .35 of .556 drops the .167 one
    assert_dist(dist(cfg(top_p=0.76, min_p=0.35)), {0: 2 / 3, 1: 1 / 3})


def _brute_force(logits, temperature, top_p, min_p):
    x = logits.astype(np.float64) / temperature
    p = np.exp(x - x.max())
    p /= p.sum()
    order = np.lexsort((np.arange(len(p)), -p))
    p_sorted = p[order]
    keep = max(int(np.count_nonzero(np.cumsum(p_sorted) - p_sorted < top_p)), 1)
    ids, probs = order[:keep], p_sorted[:keep]
    mask = probs >= min_p * probs[0]
    ids, probs = ids[mask], probs[mask]
    return ids, probs / probs.sum()


@pytest.mark.parametrize("top_p,min_p", [(0.9, 0.0), (0.999, 0.0), (1.0, 0.02), (0.5, 0.1)])
def test_large_vocabulary_without_top_k_matches_a_full_sort(top_p, min_p):
    rng = np.random.default_rng(7)
    logits = (rng.standard_normal(262_144) * 3).astype(np.float32)
    ids, probs = sampling_distribution(cfg(top_p=top_p, min_p=min_p, temperature=0.8), logits)
    want_ids, want_probs = _brute_force(logits, 0.8, top_p, min_p)
    # the engine sums the vocabulary's mass from float32 exponentials: a token whose mass-before
    # is within float32 rounding of top_p may land on either side of the boundary
    n = min(len(ids), len(want_ids))
    assert abs(len(ids) - len(want_ids)) <= 1
    assert ids[:n].tolist() == want_ids[:n].tolist()
    if len(ids) != len(want_ids):
        x = logits.astype(np.float64) / 0.8
        p_all = np.exp(x - x.max()) / np.exp(x - x.max()).sum()
        boundary = (ids if len(ids) > n else want_ids)[n]
        mass_before = p_all[(ids if len(ids) > n else want_ids)[:n]].sum()
        assert abs(mass_before - top_p) < 1e-6, (boundary, mass_before)
    else:
        np.testing.assert_allclose(probs, want_probs, rtol=1e-5)


def test_greedy_takes_the_lowest_id_among_ties():
    assert greedy(np.array([0.0, 3.0, 1.0, 3.0], np.float32)) == 1
    assert make_sampler(GenerationConfig())(np.array([5.0, 5.0], np.float32)) == 0


def test_same_seed_same_tokens_different_seed_different_tokens():
    config = cfg(seed=1234)
    draws = lambda sampler: [sampler(LOGITS) for _ in range(200)]  # noqa: E731
    first = draws(make_sampler(config))
    assert first == draws(make_sampler(config))
    assert first != draws(make_sampler(cfg(seed=4321)))


def test_seed_argument_overrides_the_config_seed():
    sampler_a, sampler_b = make_sampler(cfg(seed=1), seed=99), make_sampler(cfg(seed=2), seed=99)
    assert [sampler_a(LOGITS) for _ in range(100)] == [sampler_b(LOGITS) for _ in range(100)]


def test_draw_frequencies_follow_the_distribution():
    sampler = make_sampler(cfg(seed=2024))
    n = 20_000
    counts = np.bincount([sampler(LOGITS) for _ in range(n)], minlength=4)
    expected = P * n
    chi_square = float(((counts - expected) ** 2 / expected).sum())
    assert chi_square < 16.27  # 3 degrees of freedom, p = 0.001


def test_truncated_tokens_are_never_drawn():
    sampler = make_sampler(cfg(seed=5, top_k=2))
    assert set(sampler(LOGITS) for _ in range(2000)) == {0, 1}


def test_repetition_penalty_divides_positive_and_multiplies_negative_logits():
    (process,) = make_logits_processors(GenerationConfig.from_values({"repetition_penalty": 2.0}))
    logits = np.array([2.0, -2.0, 1.0, 0.5], np.float32)
    out = process([0, 1, 0], logits.copy())
    np.testing.assert_array_equal(out, [1.0, -4.0, 1.0, 0.5])  # token 0 penalised once, not twice


def test_repetition_penalty_window_counts_prompt_tokens():
    config = GenerationConfig.from_values({"repetition_penalty": 2.0, "repeat_last_n": 1})
    (process,) = make_logits_processors(config, n_prompt=2)
    out = process([0, 1], np.array([2.0, 2.0, 2.0, 2.0], np.float32))
    np.testing.assert_array_equal(out, [2.0, 1.0, 2.0, 2.0])  # only the last token (a prompt token)
    whole = GenerationConfig.from_values({"repetition_penalty": 2.0, "repeat_last_n": -1})
    (process,) = make_logits_processors(whole, n_prompt=2)
    out = process([0, 1, 3], np.array([2.0, 2.0, 2.0, 2.0], np.float32))
    np.testing.assert_array_equal(out, [1.0, 1.0, 2.0, 1.0])
    assert (
        make_logits_processors(
            GenerationConfig.from_values({"repetition_penalty": 2.0, "repeat_last_n": 0})
        )
        == []
    )


def test_presence_and_frequency_penalties_count_generated_tokens_only():
    config = GenerationConfig.from_values({"presence_penalty": 1.0, "frequency_penalty": 0.5})
    (process,) = make_logits_processors(config, n_prompt=2)
    out = process([2, 2, 0, 0, 1], np.zeros(4, np.float32))
    np.testing.assert_allclose(out, [-(2 * 0.5 + 1.0), -(0.5 + 1.0), 0.0, 0.0])


def test_no_processors_when_everything_is_neutral():
    assert make_logits_processors(GenerationConfig()) == []


def test_log_softmax_is_normalised_and_shift_invariant():
    lp = log_softmax(LOGITS)
    np.testing.assert_allclose(lp, np.log(P), atol=1e-6)
    assert math.isclose(float(np.exp(lp.astype(np.float64)).sum()), 1.0, rel_tol=1e-6)
    with pytest.raises(ValueError):
        log_softmax(np.full(4, -np.inf, np.float32))


def _peaked_logits(vocab=262_144, seed=3):
    # shaped like real next-token logits: a few hundred tokens near the peak over a broad bulk
    rng = np.random.default_rng(seed)
    logits = rng.normal(0.0, 4.5, vocab).astype(np.float32)
    logits[rng.choice(vocab, 200, replace=False)] = rng.normal(12.0, 3.0, 200)
    logits[[10, 20, 30]] = logits.max()  # ties at the top
    return logits


@pytest.mark.parametrize("k", [1, 3, 40, 5000, 100_000])
def test_large_vocabulary_top_k_matches_a_full_sort(k):
    from engine.sampling import top_ids

    logits = _peaked_logits()
    order = np.lexsort((np.arange(len(logits)), -logits))  # descending, ties by ascending id
    assert top_ids(logits, k).tolist() == order[:k].tolist()
    ids, probs = sampling_distribution(cfg(top_k=k, temperature=0.7), logits)
    kept = order[: max(k, int(np.count_nonzero(logits >= logits[order[k - 1]])))]
    x = logits[kept].astype(np.float64) / 0.7
    want = np.exp(x - x.max()) / np.exp(x - x.max()).sum()
    assert ids.tolist() == kept.tolist()
    np.testing.assert_allclose(probs, want, rtol=1e-6)
