"""Samplers and logits processors on hand-made distributions with hand-computed expectations."""

import math

import numpy as np
import pytest

from engine.errors import ModelOutputError
from engine.generation_config import GenerationConfig
from engine.sampling import (
    apply_processors,
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


# --- issue 16: min-p at the temperature it is used with, and a reference for every combination ---
def test_min_p_applies_to_the_temperature_scaled_distribution():
    # T = 2: p ~ sqrt(P) = .707 .5 .387 .316 (sum 1.911); min-p .5 of .370 = .185 keeps three
    # (at T = 1 the same min-p would keep two: .25 >= .5 * .5, .15 < .25)
    root = np.sqrt(P)
    assert_dist(
        dist(cfg(temperature=2.0, min_p=0.5)), dict(enumerate((root[:3] / root[:3].sum()).tolist()))
    )
    # T = 0.5: p ~ P**2 = .25 .0625 .0225 .01; min-p .2 of the top keeps two (all four at T = 1)
    square = P**2
    assert_dist(
        dist(cfg(temperature=0.5, min_p=0.2)),
        dict(enumerate((square[:2] / square[:2].sum()).tolist())),
    )


def _reference_distribution(logits, temperature, top_k, top_p, min_p):
    """transformers' order written the slow, obvious way: softmax of logits / T over the whole
    vocabulary, sorted by probability (ties by id); keep the top k (and ties with the k-th), then
    the smallest prefix whose mass reaches top_p, then tokens with p >= min_p * p_max."""
    x = logits.astype(np.float64) / temperature
    p = np.exp(x - x.max())
    order = np.lexsort((np.arange(len(p)), -p))
    order = order[logits[order] > -np.inf]  # a masked token has probability 0: never a candidate
    ids, probs = order, p[order]
    if 0 < top_k < len(ids):
        keep = probs >= probs[top_k - 1]
        ids, probs = ids[keep], probs[keep]
        probs = probs / probs.sum()
    else:
        probs = probs / probs.sum()
    if top_p < 1.0:
        mass_before = np.cumsum(probs) - probs
        keep = max(int(np.count_nonzero(mass_before < top_p)), 1)
        ids, probs = ids[:keep], probs[:keep]
    if min_p > 0.0:
        keep = probs >= min_p * probs[0]
        ids, probs = ids[keep], probs[keep]
    return ids, probs / probs.sum()


@pytest.mark.parametrize("case", range(300))
def test_every_truncation_combination_matches_a_reference(case):
    rng = np.random.default_rng(case)
    # small vocabularies for every branch; 3000 flat logits make top-p's first guess (1024 ids)
    # too small so the candidate set has to grow
    vocab = int(rng.choice([2, 5, 17, 64, 3000]))
    logits = (rng.standard_normal(vocab) * rng.choice([0.3, 1.0, 4.0])).astype(np.float32)
    if case % 3 == 0:  # integer logits: ties everywhere
        logits = np.round(logits * 2).astype(np.float32)
    logits += np.float32(rng.choice([0.0, -50.0, 400.0]))  # shift invariance, no overflow
    if case % 4 == 1:  # a grammar's mask (JSON mode, tool calls): often fewer left than top_k
        allowed = rng.choice(vocab, int(rng.integers(1, vocab + 1)), replace=False)
        masked = np.full(vocab, -np.inf, np.float32)
        masked[allowed] = logits[allowed]
        logits = masked
    temperature = float(rng.choice([0.3, 0.7, 1.0, 1.5, 2.5]))
    top_k = int(rng.choice([0, 1, 2, 3, vocab - 1, vocab, vocab + 5]))
    top_p = float(rng.choice([1.0, 0.35, 0.62, 0.9, 0.995]))
    min_p = float(rng.choice([0.0, 0.0, 0.04, 0.3, 0.77]))
    config = cfg(temperature=temperature, top_k=max(top_k, 0), top_p=top_p, min_p=min_p)
    ids, probs = sampling_distribution(config, logits)
    want_ids, want_probs = _reference_distribution(logits, temperature, top_k, top_p, min_p)
    truncated = (0 < top_k < vocab) or top_p < 1.0 or min_p > 0.0
    if truncated:
        assert ids.tolist() == want_ids.tolist(), (temperature, top_k, top_p, min_p)
        np.testing.assert_allclose(probs, want_probs, rtol=1e-4, atol=1e-7)
    else:  # no truncation: the whole vocabulary in id order, masked tokens at probability 0
        assert ids.tolist() == list(range(vocab))
        want = np.zeros(vocab)
        want[want_ids] = want_probs
        np.testing.assert_allclose(probs, want, rtol=1e-4, atol=1e-7)


@pytest.mark.parametrize("top_k, top_p", [(20, 1.0), (0, 0.9), (20, 0.9)])
def test_a_mask_leaving_fewer_tokens_than_top_k_keeps_exactly_the_allowed_ones(top_k, top_p):
    """JSON mode at gemma3's 262k vocabulary: the grammar allows 3 tokens and top-k asks for 20.
    The candidates are the 3 (by probability), never a masked one (probability 0); the top
    alternatives shown for the token are the 3, then -inf ties by ascending id, as a full sort
    gives them."""
    from engine.sampling import top_ids

    logits = np.full(262_144, -np.inf, np.float32)
    allowed = [70_000, 12, 262_143]
    logits[allowed] = [1.5, 3.0, 2.0]
    ids, probs = sampling_distribution(cfg(top_k=top_k, top_p=top_p, temperature=0.5), logits)
    x = np.array([3.0, 2.0, 1.5]) / 0.5
    want = np.exp(x - x.max()) / np.exp(x - x.max()).sum()
    if top_p < 1.0:  # the nucleus: the first two hold 0.96 >= 0.9 of the mass
        want = want[:2] / want[:2].sum()
    assert ids.tolist() == [12, 262_143, 70_000][: len(want)]
    np.testing.assert_allclose(probs, want, rtol=1e-6)
    assert top_ids(logits, 5).tolist() == [12, 262_143, 70_000, 0, 1]
    sampler = make_sampler(cfg(top_k=top_k, top_p=top_p, temperature=0.5, seed=3))
    assert {sampler(logits) for _ in range(200)} == set(ids.tolist())


def test_a_single_candidate_is_drawn_and_the_rng_stays_aligned():
    assert [make_sampler(cfg(top_k=1, seed=5))(LOGITS) for _ in range(3)] == [0, 0, 0]
    # min-p .45 keeps one token of `peaked` and two of LOGITS (.25 >= .45 * .5): the draw on
    # LOGITS after a one-candidate step uses the RNG's second number, as documented
    peaked = np.array([10.0, 0.0, 0.0, 0.0], np.float32)
    sampler = make_sampler(cfg(min_p=0.45, seed=11))
    rng = np.random.default_rng(11)
    draws = []
    for _ in range(40):
        assert sampler(peaked) == 0
        rng.random()
        draws.append(sampler(LOGITS))
        want = 0 if rng.random() * 0.75 < 0.5 else 1
        assert draws[-1] == want
    assert set(draws) == {0, 1}


def test_errors_name_the_problem():
    from engine.sampling import log_normalizer

    dead = np.full(4, -np.inf, np.float32)
    with pytest.raises(
        ModelOutputError, match="^every logit is -inf or not finite .* no token can be chosen"
    ):
        log_normalizer(dead)
    with pytest.raises(
        ModelOutputError, match="^every logit is -inf or not finite .* no token can be chosen"
    ):
        sampling_distribution(cfg(), dead)


def _reference_penalties(tokens, logits, n_prompt, repetition, last_n, presence, frequency):
    out = logits.astype(np.float64).copy()
    window = tokens if last_n < 0 else tokens[len(tokens) - last_n :] if last_n else []
    for t in set(window):
        if 0 <= t < len(out):
            out[t] = out[t] / repetition if out[t] > 0 else out[t] * repetition
    generated = tokens[n_prompt:]
    for t in set(generated):
        if 0 <= t < len(out):
            out[t] -= generated.count(t) * frequency + presence
    return out


@pytest.mark.parametrize("case", range(60))
def test_penalties_match_a_reference(case):
    rng = np.random.default_rng(1000 + case)
    vocab = 8
    logits = rng.choice([-2.0, -0.5, 0.0, 0.5, 0.75, 3.0], vocab).astype(np.float32)
    tokens = rng.integers(-2, vocab + 2, int(rng.integers(0, 7))).tolist()  # some out of range
    n_prompt = int(rng.integers(0, len(tokens) + 1))
    values = {
        "repetition_penalty": float(rng.choice([1.0, 1.3, 2.0])),
        "repeat_last_n": int(rng.choice([-1, 0, 1, 3, 64])),
        "presence_penalty": float(rng.choice([0.0, 0.4])),
        "frequency_penalty": float(rng.choice([0.0, 0.25])),
    }
    config = GenerationConfig.from_values(values)
    out = apply_processors(make_logits_processors(config, n_prompt), tokens, logits.copy())
    want = _reference_penalties(
        tokens,
        logits,
        n_prompt,
        values["repetition_penalty"],
        values["repeat_last_n"],
        values["presence_penalty"],
        values["frequency_penalty"],
    )
    np.testing.assert_allclose(out, want, rtol=1e-6, atol=1e-6)


def test_penalties_count_every_token_as_generated_by_default():
    config = GenerationConfig.from_values({"frequency_penalty": 1.0})
    (process,) = make_logits_processors(config)
    np.testing.assert_array_equal(process([1], np.zeros(3, np.float32)), [0.0, -1.0, 0.0])


def test_min_p_of_one_keeps_exactly_the_tokens_tied_with_the_most_likely():
    logits = np.array([2.0, 2.0, 0.0, 2.0], np.float32)
    assert_dist(dist(cfg(min_p=1.0), logits), {0: 1 / 3, 1: 1 / 3, 3: 1 / 3})


def test_a_long_tail_of_unlikely_tokens_keeps_its_share_of_the_draws():
    # A 262k vocabulary (gemma) at temperature 1 without truncation: token 0 holds 99.24%, each
    # other token 2.9e-8 (0.76% together). 2.9e-8 is under half a float32 step of a running sum
    # near 1 (2.98e-8), so a float32 cumulative sum would never step past token 0 and the tail
    # could never be drawn. The draw is numpy's first number for the seed (not the sampler's).
    vocab = 262_144
    per_tail = 2.9e-8
    tail_logit = math.log(per_tail / (1 - per_tail * (vocab - 1)))
    logits = np.full(vocab, tail_logit, np.float32)
    logits[0] = 0.0
    each = math.exp(float(logits[1]))
    p0 = 1 / (1 + (vocab - 1) * each)  # hand softmax of the float32 logits
    seed = 82
    r = np.random.default_rng(seed).random()
    assert 0.995 < r < 0.999  # this seed's first draw lands in the tail
    # tail token i covers (p0 + (i-1) * p, p0 + i * p]: the draw falls in token floor(...) + 1
    want = math.floor((r - p0) / (each * p0)) + 1
    token = make_sampler(cfg(seed=seed))(logits)
    assert abs(token - want) <= 1, (token, want)


def test_kth_largest_is_exact_when_few_values_are_near_the_peak():
    from engine.sampling import kth_largest, top_ids

    # Nothing within 16 of the peak but the peak itself: the k-th comes from the whole vector;
    # a -inf (a token masked by a grammar) counts only when k reaches past the finite values.
    values = np.array([0.0, -20.0, -np.inf, -30.0], np.float32)
    assert [kth_largest(values, k) for k in (1, 2, 3, 4)] == [0.0, -20.0, -30.0, -np.inf]
    assert top_ids(values, 4).tolist() == [0, 1, 3, 2]
    assert kth_largest(np.array([np.inf, 1.0, 2.0], np.float32), 3) == 1.0


def test_log_softmax_is_float32_whatever_the_input():
    out = log_softmax(np.log(np.array([0.5, 0.25, 0.25])))  # float64 in
    assert out.dtype == np.float32
    np.testing.assert_allclose(out, np.log([0.5, 0.25, 0.25]), rtol=1e-6)


def test_a_262k_vocabulary_is_never_partitioned_whole_when_the_answer_is_near_the_peak(
    monkeypatch,
):
    # Partitioning gemma3's 262k logits costs ~36 ms a token; the k-th largest of peaked logits
    # lies among the few hundred near the peak, and under a grammar mask leaving fewer than k
    # tokens it is -inf without looking. Every partition must stay well under the vocabulary.
    sizes = []
    partition = np.partition

    def counting_partition(a, kth, *args, **kwargs):
        sizes.append(len(a))
        return partition(a, kth, *args, **kwargs)

    monkeypatch.setattr(np, "partition", counting_partition)
    vocab = 262_144
    masked = np.full(vocab, -np.inf, np.float32)
    masked[[70_000, 12, 262_143]] = [1.5, 3.0, -40.0]  # spread wider than any margin
    for logits in (_peaked_logits(), masked):
        sampling_distribution(cfg(top_k=40, temperature=0.7), logits)
    assert sizes and max(sizes) < vocab // 100, sizes


def test_top_p_over_peaked_logits_stops_at_the_first_guess():
    # top-p without top-k: the 1024 most likely tokens of real-looking logits already hold 0.9 of
    # the mass, so only they are exponentiated and sorted, not the whole 262k vocabulary.
    from engine.sampling import _nucleus_superset

    logits = _peaked_logits()
    peak = logits.max()
    scaled = np.exp(logits - peak)
    total = float(np.sum(scaled, dtype=np.float64))
    order = np.argsort(-logits, kind="stable")
    assert scaled[order[:1024]].sum() >= 0.9 * total  # the premise, by a full sort
    superset = _nucleus_superset(logits, scaled, total, 0.9)
    assert sorted(superset.tolist()) == sorted(order[:1024].tolist())


def test_top_p_reached_exactly_keeps_the_smaller_set():
    # Four tied tokens hold exactly 0.25 each (dyadic, no rounding): the first two reach top-p
    # 0.5 exactly, so the nucleus is those two (as transformers removes cumulative <= 1 - top_p).
    tied = np.zeros(4, np.float32)
    assert_dist(dist(cfg(top_p=0.5), tied), {0: 0.5, 1: 0.5})
    assert_dist(dist(cfg(top_p=0.75), tied), {0: 1 / 3, 1: 1 / 3, 2: 1 / 3})
