"""Logits processors and samplers, built as closures from a GenerationConfig (mlx-lm style).

Processors have the signature `(tokens, logits) -> logits`, where `tokens` is every token of the
sequence so far (prompt then generated) and `logits` a float32 vector of vocabulary size. They
work in place on the array they are given (the loop hands them its own copy) and return it.

The sampler is `(logits) -> token_id`. Order, as in transformers: temperature, then top-k, then
top-p, then min-p, then a draw from the seeded np.random.Generator the sampler owns; without
do_sample it is argmax (numpy's argmax returns the lowest id among ties).

Everything is vectorised for a 262k vocabulary: the candidate set is found with argpartition and
only the candidates are sorted; nothing loops over the vocabulary in Python.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from engine.errors import ModelOutputError
from engine.generation_config import GenerationConfig

# NaN logits come from the weights (a corrupt or hostile file), not from the request.
NO_FINITE_LOGIT = (
    "every logit is -inf or not finite (NaN/inf), so no token can be chosen; "
    "NaN or inf logits mean the model's weights are corrupt"
)

LogitsProcessor = Callable[[Sequence[int], np.ndarray], np.ndarray]
Sampler = Callable[[np.ndarray], int]

# top-p without top-k first tries this many most likely tokens, doubling until the nucleus fits
_NUCLEUS_FIRST_GUESS = 1024
# ids per block of an untruncated draw (_draw_untruncated): ~256 blocks at a 262k vocabulary
_DRAW_BLOCK = 1024


# --- processors ----------------------------------------------------------------------------------
def make_logits_processors(cfg: GenerationConfig, n_prompt: int = 0) -> list[LogitsProcessor]:
    """Penalty processors for `cfg`; `n_prompt` tokens at the start of `tokens` are the prompt
    (repetition penalty sees them, presence/frequency penalties do not)."""
    processors: list[LogitsProcessor] = []
    if cfg.repetition_penalty != 1.0 and cfg.repeat_last_n != 0:
        processors.append(repetition_penalty_processor(cfg.repetition_penalty, cfg.repeat_last_n))
    if cfg.presence_penalty != 0.0 or cfg.frequency_penalty != 0.0:
        processors.append(
            presence_frequency_processor(cfg.presence_penalty, cfg.frequency_penalty, n_prompt)
        )
    return processors


def repetition_penalty_processor(penalty: float, last_n: int) -> LogitsProcessor:
    def apply(tokens: Sequence[int], logits: np.ndarray) -> np.ndarray:
        window = tokens if last_n < 0 else tokens[-last_n:]
        if len(window) == 0:
            return logits
        ids = np.unique(np.asarray(window, dtype=np.int64))
        ids = ids[(ids >= 0) & (ids < logits.shape[-1])]
        picked = logits[ids]
        logits[ids] = np.where(picked > 0, picked / penalty, picked * penalty)
        return logits

    return apply


def presence_frequency_processor(
    presence: float, frequency: float, n_prompt: int
) -> LogitsProcessor:
    def apply(tokens: Sequence[int], logits: np.ndarray) -> np.ndarray:
        generated = tokens[n_prompt:]
        if len(generated) == 0:
            return logits
        ids, counts = np.unique(np.asarray(generated, dtype=np.int64), return_counts=True)
        keep = (ids >= 0) & (ids < logits.shape[-1])
        ids, counts = ids[keep], counts[keep]
        logits[ids] -= (counts * frequency + presence).astype(logits.dtype)
        return logits

    return apply


def apply_processors(
    processors: Sequence[LogitsProcessor], tokens: Sequence[int], logits: np.ndarray
) -> np.ndarray:
    for process in processors:
        logits = process(tokens, logits)
    return logits


# --- distributions -------------------------------------------------------------------------------
def log_normalizer(logits: np.ndarray) -> float:
    """log(sum(exp(logits))), computed stably; logprob(t) = logits[t] - log_normalizer(logits).

    One float32 exp pass over the vocabulary (~0.2 ms at 262k) with a float64 sum."""
    x = np.asarray(logits, dtype=np.float32)
    peak = float(np.max(x))
    if not np.isfinite(peak):
        raise ModelOutputError(NO_FINITE_LOGIT)
    # numpy sums float32 pairwise (error ~ log2(n) ulp), plenty for a log-probability
    return peak + float(np.log(np.sum(np.exp(x - np.float32(peak)))))


def log_softmax(logits: np.ndarray) -> np.ndarray:
    """Natural-log probabilities over the whole vocabulary (float32)."""
    x = np.asarray(logits, dtype=np.float32)
    return x - np.float32(log_normalizer(x))


def top_ids(values: np.ndarray, k: int) -> np.ndarray:
    """The ids of the k largest values, largest first, ties by ascending id."""
    k = min(k, values.shape[-1])
    ids = at_least(values, kth_largest(values, k))
    ids = ids[np.lexsort((ids, -values[ids]))][:k]
    if len(ids) < k:  # fewer than k finite values: the rest are -inf ties, by ascending id
        ids = np.concatenate([ids, np.flatnonzero(values == -np.inf)[: k - len(ids)]])
    return ids


def kth_largest(values: np.ndarray, k: int, peak: float | None = None) -> float:
    """The k-th largest value. Language-model logits put few tokens near the maximum, so the
    partition runs over the values within a margin of the peak (one vectorised compare over the
    vocabulary) and falls back to the whole vocabulary only for flat distributions; exact either
    way, because a candidate set holding at least k values contains the k largest."""
    vocab = values.shape[-1]
    peak = float(np.max(values)) if peak is None else peak
    for margin in (8.0, 16.0):  # real models: ~1e2-1e3 tokens within 8 of the peak, ~2e4 within 16
        near = values[values >= peak - margin]
        if len(near) >= k:
            return float(np.partition(near, len(near) - k)[len(near) - k])
    if k > vocab - int(np.count_nonzero(values == -np.inf)):
        # a mask (JSON mode, a tool call's grammar) left fewer than k tokens: the k-th is -inf,
        # and partitioning the whole vocabulary to say so cost 36 ms a token at 262k
        return -np.inf
    return float(np.partition(values, vocab - k)[vocab - k])


def at_least(values: np.ndarray, threshold: float) -> np.ndarray:
    """The ids whose value is >= threshold, in ascending order; a threshold of -inf gives the
    finite ones only: a masked token (-inf) has probability 0, and keeping the masked part of a
    262k vocabulary as candidates cost a sort of all of it per token (~30 ms) for nothing."""
    if threshold == -np.inf:
        return np.flatnonzero(values > threshold)
    return np.flatnonzero(values >= threshold)


def sampling_distribution(
    cfg: GenerationConfig, logits: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """The candidate ids and their renormalised probabilities after temperature, top-k, top-p and
    min-p. When any truncation applies, ids come in descending probability with ties by ascending
    id; with none, in id order. Either way the order is a fixed function of the logits, so a draw
    with a seeded RNG is reproducible. At least one candidate always remains.

    Cost at a 262k vocabulary: the candidate set is found from the logits with one partition
    (top-k) or a threshold compare (min-p), and only candidates are exponentiated and sorted; the
    full-vocabulary softmax is needed only when top-p runs without top-k (its masses are relative
    to the whole vocabulary)."""
    x = np.asarray(logits, dtype=np.float32)
    vocab = x.shape[-1]
    temperature = cfg.temperature
    peak = float(np.max(x))
    if not np.isfinite(peak):
        raise ModelOutputError(NO_FINITE_LOGIT)
    if 0 < cfg.top_k < vocab:
        # top-k is the first truncation: renormalise over the kept tokens (ties with the k-th kept)
        candidates = at_least(x, kth_largest(x, cfg.top_k, peak))
        probs = np.exp((x[candidates].astype(np.float64) - peak) / temperature)
        probs /= probs.sum()
    elif cfg.top_p < 1.0:
        scaled = np.exp(
            (x - np.float32(peak)) / np.float32(temperature)
        )  # float32, whole vocabulary
        total = float(np.sum(scaled, dtype=np.float64))
        candidates = _nucleus_superset(x, scaled, total, cfg.top_p)
        # probabilities relative to the whole vocabulary, so top-p below sees true masses
        probs = np.exp((x[candidates].astype(np.float64) - peak) / temperature) / total
    elif cfg.min_p > 0.0:
        # p_i >= min_p * p_max  <=>  x_i >= peak + T * log(min_p); a hair looser here, exact below
        candidates = np.flatnonzero(x >= peak + temperature * np.log(cfg.min_p) - 1e-3)
        probs = np.exp((x[candidates].astype(np.float64) - peak) / temperature)
        probs /= probs.sum()
    else:
        probs = np.exp(
            (x - np.float32(peak)) / np.float32(temperature)
        )  # float32 is plenty to draw from
        return np.arange(vocab), probs / np.sum(probs, dtype=np.float64)
    # candidates are in ascending id order (flatnonzero), so a stable sort on -probs gives
    # descending probability with ties by ascending id, ~2x faster than lexsort on both keys
    order = np.argsort(-probs, kind="stable")
    candidates, probs = candidates[order], probs[order]
    if cfg.top_p < 1.0:
        mass_before = np.cumsum(probs) - probs
        keep = max(int(np.count_nonzero(mass_before < cfg.top_p)), 1)
        candidates, probs = candidates[:keep], probs[:keep]
    if cfg.min_p > 0.0:
        keep = probs >= cfg.min_p * probs[0]
        candidates, probs = candidates[keep], probs[keep]
    return candidates, probs / probs.sum()


def _nucleus_superset(x: np.ndarray, scaled: np.ndarray, total: float, top_p: float) -> np.ndarray:
    """A set of the most likely ids that contains the top-p nucleus, found without sorting the
    whole vocabulary (~15 ms at 262k): take the `guess` largest logits (and everything tied with
    the smallest of them) and quadruple the guess until their mass reaches top_p. Peaked real
    distributions stop at the first guess."""
    vocab = x.shape[-1]
    guess = _NUCLEUS_FIRST_GUESS
    peak = float(np.max(x))
    while guess < vocab:
        threshold = kth_largest(x, guess, peak)
        ids = at_least(x, threshold)
        if threshold == -np.inf or float(np.sum(scaled[ids], dtype=np.float64)) >= top_p * total:
            return ids  # with -inf: every token of nonzero probability, the whole nucleus
        guess *= 4
    return at_least(x, -np.inf)


# --- samplers ------------------------------------------------------------------------------------
def make_sampler(cfg: GenerationConfig, seed: int | None = None) -> Sampler:
    """Greedy argmax, or a draw from sampling_distribution with an RNG seeded by `seed`
    (cfg.seed when not given). Same seed + same settings + same logits = same tokens."""
    if not cfg.do_sample:
        return greedy
    rng = np.random.default_rng(cfg.seed if seed is None else seed)
    whole_vocabulary = cfg.top_k <= 0 and cfg.top_p >= 1.0 and cfg.min_p <= 0.0

    def sample(logits: np.ndarray) -> int:
        if whole_vocabulary and np.shape(logits)[-1] > _DRAW_BLOCK:
            return _draw_untruncated(logits, cfg.temperature, rng.random())
        ids, probs = sampling_distribution(cfg, logits)
        if len(ids) == 1:
            rng.random()  # keep the RNG stream aligned whatever the candidate count
            return int(ids[0])
        cumulative = np.cumsum(probs)
        index = int(np.searchsorted(cumulative, rng.random() * cumulative[-1], side="right"))
        return int(ids[min(index, len(ids) - 1)])

    return sample


def _draw_untruncated(logits: np.ndarray, temperature: float, u: float) -> int:
    """The token at u (in [0, 1)) of the inverse CDF of softmax(logits / temperature) over the
    whole vocabulary, found in two levels: the block of _DRAW_BLOCK ids whose cumulative mass
    passes u, then the id inside it. The same draw as a cumulative sum over the vocabulary up to
    rounding (a u within ~1e-16 of a boundary may land on the neighbour), at a fraction of the
    cost: a float64 cumulative sum of 262k values cost ~0.6 ms a token, serial work per stream
    in every batched decode step (bench/RESULTS.md, issue 32). Ids of probability 0 (masked,
    -inf) are never drawn."""
    x = np.asarray(logits, dtype=np.float32)
    peak = float(np.max(x))
    if not np.isfinite(peak):
        raise ModelOutputError(NO_FINITE_LOGIT)
    weights = np.exp((x - np.float32(peak)) / np.float32(temperature))  # float32, as above
    vocab, block = weights.shape[-1], _DRAW_BLOCK
    whole = vocab - vocab % block
    block_mass = weights[:whole].reshape(-1, block).sum(axis=1, dtype=np.float64)
    if whole < vocab:
        block_mass = np.append(block_mass, weights[whole:].sum(dtype=np.float64))
    cumulative = np.cumsum(block_mass)
    target = u * cumulative[-1]
    # never a block of mass 0 (u * total can round up to the total itself)
    b = min(
        int(np.searchsorted(cumulative, target, side="right")), int(np.flatnonzero(block_mass)[-1])
    )
    inside = weights[b * block : (b + 1) * block]
    before = cumulative[b - 1] if b else 0.0
    running = np.cumsum(inside, dtype=np.float64)
    i = int(np.searchsorted(running, target - before, side="right"))
    # the block's own sum can round below its mass: never past its last id of nonzero weight
    return b * block + min(i, int(np.flatnonzero(inside)[-1]))


def greedy(logits: np.ndarray) -> int:
    return int(np.argmax(logits))
