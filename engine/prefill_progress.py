"""How long the rest of a prompt will take to read: the time-left estimate behind the
PrefillProgress events (engine/events.py) that the generation loop yields per prefill chunk.

Why not remaining / rate: a token at position p attends to the p positions before it, so reading
it costs a fixed part (the weight matmuls, the same for every token) plus a part that grows with
p (q.k and p.v over the cache). Measured on gemma-3-270m (2 cores): 0.71 ms per token in the
first chunk, 1.28 ms at position 2,900. A plain rate taken from the first chunk under-estimates a
3,000-token prompt's time left by about a third. So the cost of the token at position p is
modelled as

    seconds(p) = a * (1 + r * p)

where r, extra cost per earlier position relative to the fixed cost, comes from the layer shape
(`attention_ratio`: multiply-adds per token, the projections and FFN against 2 * q_dim per earlier
position in the layers that attend to the whole prompt, the attention ones weighted by
ATTENTION_MAC_COST), blended with the slope the chunks read so far show, which counts for more the more of
the prompt they cover; and `a`, the machine's speed, is the median of what each chunk implies,
leaving out the first chunk once there is a second (right after a load it runs up to 4x slower:
weights paged in, the batched kernels' first use).

Why a median and a shrunk slope: on a shared machine one chunk can take 50% longer than its
neighbours because another program ran (measured on the 2-core development VM under load: chunk
times of 0.87 to 1.59 s in one 3,000-token prefill). A mean of the newest chunks, or a slope fitted
freely from a few of them, turned such a spike into a 40-60% wrong time left (bench/
bench_prefill_eta.py on recorded chunk times); the median and the shrunk slope kept it near 20%.

Pure arithmetic, tested with hand-computed numbers. The one-line wording of a PrefillProgress
lives here too, so the CLI (engine/__main__.py) and the window (app/features/prefill_progress.py)
say it the same way.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

from engine.events import PrefillProgress

# Tokens per prefill forward (engine/generate.py reads the prompt in chunks of this size; the model
# also polls the cancel token per layer). Here, in a module without numpy, so the window can know
# it before the engine is loaded.
PREFILL_CHUNK = 256

# What one attention multiply-add (q.k, p.v over the f16 KV cache) costs against one of the weight
# matmuls (quantized, VNNI), in this engine: per chunk CPU time on the 2-core development VM put
# r at ~3.0e-4 for gemma-3-270m (3 of its 18 layers attend to the whole prompt, the others to a
# 512-token window) and for qwen2.5-1.5B (all 28 layers), where the multiply-add counts alone
# say 6.1e-5 and 6.6e-5 (bench/RESULTS.md, "Prefill time left").
ATTENTION_MAC_COST = 4.5
# The prior ratio counts as this many chunks when blended with the ratio fitted from the chunks;
# a fitted chunk counts as (share of the prompt the fitted chunks span)^2 of one.
PRIOR_WEIGHT_CHUNKS = 4
# A fitted ratio is clamped to [MIN, MAX] x the prior: a handful of noisy chunk times on a shared
# machine can give any slope (negative too), and the layer shape bounds what attention can cost.
MIN_RATIO_OVER_PRIOR = 0.25
MAX_RATIO_OVER_PRIOR = 4.0


def attention_ratio(
    d_model: int,
    q_dim: int,
    kv_dim: int,
    n_ff: int,
    *,
    global_share: float = 1.0,
    gated_ffn: bool = True,
) -> float:
    """r: the attention work per earlier position relative to one token's fixed work, from the
    layer shape: per layer, q, k, v and output projections plus the FFN (multiply-adds) against
    q.k and p.v, q_dim each per position attended, times ATTENTION_MAC_COST, in the share of
    layers that attend to the whole prompt (`global_share`; sliding-window layers stop growing at
    their window). Raises ValueError on a shape that is not positive."""
    for name, value in (("d_model", d_model), ("q_dim", q_dim), ("kv_dim", kv_dim), ("n_ff", n_ff)):
        if value <= 0:
            raise ValueError(f"{name} must be positive, got {value}")
    if not 0.0 <= global_share <= 1.0:
        raise ValueError(f"global_share must be within 0..1, got {global_share}")
    ffn_matrices = 3 if gated_ffn else 2
    fixed = d_model * (q_dim + 2 * kv_dim) + q_dim * d_model + ffn_matrices * d_model * n_ff
    return ATTENTION_MAC_COST * 2.0 * q_dim * global_share / fixed


def ratio_for_config(config) -> float:
    """attention_ratio for an engine ModelConfig (a mixture of experts counts its used experts).
    A config that names no layer shape (a test double, a stand-in model) gets 0.0: a plain rate
    until the chunks read fit the slope themselves."""
    if not hasattr(config, "d_model"):
        return 0.0
    n_ff = config.n_ff_exp * config.n_expert_used if config.n_expert else config.n_ff
    windowed = config.layer_uses_window if config.sliding_window else ()
    global_share = 1.0 - sum(bool(w) for w in windowed) / config.n_layers
    return attention_ratio(
        config.d_model, config.q_dim, config.kv_dim, n_ff, global_share=global_share
    )


def span_cost(start: int, end: int, ratio: float) -> float:
    """Cost, in units of `a`, of reading positions start..end-1: sum of (1 + ratio * p)."""
    n = end - start
    return n + ratio * (start + end - 1) * n / 2.0


@dataclass(frozen=True)
class ChunkTime:
    start: int  # first position the chunk wrote
    end: int  # one past its last position
    seconds: float


class PrefillEstimate:
    """The time-left estimate of one prefill: positions `start`..`total` (start: the tokens a
    prefix cache already held), fed chunk by chunk with `record`."""

    def __init__(self, start: int, total: int, prior_ratio: float):
        if not 0 <= start <= total:
            raise ValueError(f"start must be within 0..total ({total}), got {start}")
        if prior_ratio < 0:
            raise ValueError(f"prior_ratio must be >= 0, got {prior_ratio}")
        self.start = start
        self.total = total
        self.prior_ratio = prior_ratio
        self.chunks: list[ChunkTime] = []

    @property
    def done(self) -> int:
        return self.chunks[-1].end if self.chunks else self.start

    @property
    def elapsed(self) -> float:
        return sum(c.seconds for c in self.chunks)

    def record(self, start: int, end: int, seconds: float) -> None:
        if start != self.done or not start < end <= self.total:
            raise ValueError(
                f"chunk {start}..{end} does not continue the prefill at {self.done} of {self.total}"
            )
        self.chunks.append(ChunkTime(start, end, max(float(seconds), 0.0)))

    def tokens_per_second(self) -> float | None:
        """Tokens read per second so far (what the user sees as speed)."""
        elapsed = self.elapsed
        return (self.done - self.start) / elapsed if elapsed > 0 else None

    def ratio(self) -> float:
        """r: the prior from the layer shape, blended with the slope the chunks show once two
        have been read after the first (which may have run cold and is left out)."""
        warm = self.chunks[1:]
        if len(warm) < 2:
            return self.prior_ratio
        fitted = _fit_ratio(warm)
        if fitted is None:
            return self.prior_ratio
        if self.prior_ratio > 0:
            lo, hi = (
                MIN_RATIO_OVER_PRIOR * self.prior_ratio,
                MAX_RATIO_OVER_PRIOR * self.prior_ratio,
            )
            fitted = min(max(fitted, lo), hi)
        else:  # no layer shape known: the fit alone, never negative
            fitted = max(fitted, 0.0)
        share = (warm[-1].end - warm[0].start) / (self.total - self.start)
        weight = len(warm) * share**2
        prior = PRIOR_WEIGHT_CHUNKS if self.prior_ratio > 0 else 0.0
        return (self.prior_ratio * prior + fitted * weight) / (prior + weight)

    def seconds_left(self) -> float | None:
        """Seconds until the last prompt token is read; None before the first chunk (nothing is
        known about this machine's speed yet), 0.0 once done."""
        if not self.chunks:
            return None
        if self.done >= self.total:
            return 0.0
        r = self.ratio()
        warm = self.chunks[1:] or self.chunks
        speed = statistics.median(c.seconds / span_cost(c.start, c.end, r) for c in warm)
        return speed * span_cost(self.done, self.total, r)


def _fit_ratio(chunks: list[ChunkTime]) -> float | None:
    """Least-squares line through (mid position, seconds per token) of the chunks -> slope /
    intercept, or None when the points cannot define a line with a positive intercept."""
    xs = [(c.start + c.end - 1) / 2.0 for c in chunks]
    ys = [c.seconds / (c.end - c.start) for c in chunks]
    n = len(xs)
    mx, my = sum(xs) / n, sum(ys) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    if sxx <= 0:
        return None
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sxx
    intercept = my - slope * mx
    if intercept <= 0:
        return None
    return slope / intercept


def format_time_left(seconds: float) -> str:
    """~33 s, ~2 min 5 s, ~1 h 3 min: rounded to what a person plans by."""
    s = max(0, round(seconds))
    if s < 60:
        return f"~{s} s"
    if s < 3600:
        minutes, rest = divmod(s, 60)
        return f"~{minutes} min {rest} s" if rest else f"~{minutes} min"
    hours, rest = divmod(s, 3600)
    minutes = rest // 60
    return f"~{hours} h {minutes} min" if minutes else f"~{hours} h"


def describe_progress(progress: PrefillProgress) -> str:
    """ "Reading prompt 1,024 / 3,800 tokens · 85 tok/s · ~33 s left": speed and time left once
    the first chunk has measured them."""
    parts = [f"Reading prompt {progress.done:,} / {progress.total:,} tokens"]
    if progress.tok_s is not None and progress.tok_s > 0:
        parts.append(f"{progress.tok_s:,.0f} tok/s")
    if progress.eta_s is not None and progress.done < progress.total:
        parts.append(f"{format_time_left(progress.eta_s)} left")
    return " · ".join(parts)
