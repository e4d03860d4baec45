"""Prefill progress: the time-left model (engine/prefill_progress.py, hand-computed cases) and the
PrefillProgress events the generation loop yields per chunk (fake model, no real load)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from fake_model import BOS, fake_lm, ids, script_tokens, use_fake_detokenizer

from engine.cancel import CancelToken
from engine.events import Finished, PrefillProgress, TokenSampled
from engine.generate import GenerationRequest, generate
from engine.prefill_progress import PrefillEstimate, attention_ratio, ratio_for_config, span_cost


# --- the cost model ------------------------------------------------------------------------------
def test_attention_ratio_from_the_layer_shape():
    # fixed: 4*(2 + 2*1) + 2*4 + 3*4*3 = 16 + 8 + 36 = 60 multiply-adds; per position: 2*2 = 4,
    # each costing 4.5 matmul multiply-adds -> 18 / 60
    assert attention_ratio(4, 2, 1, 3) == pytest.approx(0.3)
    # a third of the layers attend to the whole prompt (the rest to a window): 0.1
    assert attention_ratio(4, 2, 1, 3, global_share=1 / 3) == pytest.approx(0.1)


def test_the_ratio_of_real_layer_shapes():
    # gemma-3-270m: d 640, q 4*256, kv 1*256, ffn 2048; fixed 640*1536 + 1024*640 + 3*640*2048
    # = 5,570,560; 3 of 18 layers global: 4.5 * 2048 / 6 / 5,570,560 = 2.76e-4
    gemma = SimpleNamespace(
        d_model=640,
        q_dim=1024,
        kv_dim=256,
        n_ff=2048,
        n_expert=0,
        n_layers=18,
        sliding_window=512,
        layer_uses_window=(True,) * 5 + (False,) + (True,) * 5 + (False,) + (True,) * 5 + (False,),
    )
    assert ratio_for_config(gemma) == pytest.approx(2.7576e-4, rel=1e-3)
    # qwen2.5-1.5B: d 1536, q 1536, kv 256, ffn 8960, no window: fixed 1536*2048 + 1536^2
    # + 3*1536*8960 = 46,792,704; 4.5 * 3072 / 46,792,704 = 2.954e-4
    qwen = SimpleNamespace(
        d_model=1536,
        q_dim=1536,
        kv_dim=256,
        n_ff=8960,
        n_expert=0,
        n_layers=28,
        sliding_window=0,
        layer_uses_window=(False,) * 28,
    )
    assert ratio_for_config(qwen) == pytest.approx(2.954e-4, rel=1e-3)


def test_attention_ratio_refuses_a_shape_that_is_not_positive():
    with pytest.raises(ValueError, match="n_ff must be positive, got 0"):
        attention_ratio(4, 2, 1, 0)


def test_span_cost_sums_the_per_position_cost():
    # positions 0..3 at 1 + 0.5 p: 1 + 1.5 + 2 + 2.5 = 7
    assert span_cost(0, 4, 0.5) == pytest.approx(7.0)
    # positions 4..7: 3 + 3.5 + 4 + 4.5 = 15
    assert span_cost(4, 8, 0.5) == pytest.approx(15.0)


def test_no_estimate_before_the_first_chunk():
    estimate = PrefillEstimate(0, 8, 0.5)
    assert estimate.seconds_left() is None
    assert estimate.tokens_per_second() is None


def test_time_left_after_one_chunk_grows_with_position():
    # 4 tokens at positions 0..3 cost 7 units and took 7 s: a = 1 s per unit; positions 4..7
    # cost 15 units -> 15 s. A plain rate (4 tokens in 7 s) would say 7 s.
    estimate = PrefillEstimate(0, 8, 0.5)
    estimate.record(0, 4, 7.0)
    assert estimate.seconds_left() == pytest.approx(15.0)
    assert estimate.tokens_per_second() == pytest.approx(4 / 7)


def test_time_left_starts_after_the_cached_tokens():
    # a prefix cache held positions 0..3: the chunk 4..7 costs 15 units in 30 s (a = 2);
    # positions 8..9 cost 2 + 0.5 * 17 = 10.5 units -> 21 s
    estimate = PrefillEstimate(4, 10, 0.5)
    estimate.record(4, 8, 30.0)
    assert estimate.seconds_left() == pytest.approx(21.0)
    assert estimate.tokens_per_second() == pytest.approx(4 / 30)


def test_a_cold_first_chunk_is_left_out_once_a_second_is_read():
    # chunk 0..1 (cost 2.5) ran cold in 10 s (a = 4), chunk 2..3 (cost 4.5) in 4.5 s (a = 1):
    # a = 1; positions 4..11 cost 8 + 0.5 * 60 = 38 -> 38 s (with the cold chunk averaged in: 95 s)
    estimate = PrefillEstimate(0, 12, 0.5)
    estimate.record(0, 2, 10.0)
    # one chunk: its own speed; positions 2..11 cost 10 + 0.5 * 65 = 42.5 -> 4 * 42.5 = 170 s
    assert estimate.seconds_left() == pytest.approx(170.0)
    estimate.record(2, 4, 4.5)
    assert estimate.seconds_left() == pytest.approx(38.0)


def test_one_slow_chunk_does_not_swing_the_speed():
    # true cost 1 + 0.5 p; the middle warm chunk 4..5 ran 3x slow (19.5 s instead of 6.5).
    # Per-token 2.25, 9.75, 4.25 at 2.5, 4.5, 6.5: slope 0.5, intercept 19/6 -> fitted 3/19,
    # blended (0.5 * 4 + 3/19 * 0.75) / 4.75 = 161/361. Implied a per warm chunk (cost 2 + 5r,
    # 2 + 9r, 2 + 13r): 1.064, 3.242, 1.090 -> median 1.090 (chunk 6..7); positions 8..11 cost
    # 4 + 38r -> 8.5 / (2 + 13r) * (4 + 38r) = 22.8 s. A mean of the three would say 37.7 s, and
    # the truth without the slow chunk is 23 s.
    r = 161 / 361
    estimate = PrefillEstimate(0, 12, 0.5)
    for start, seconds in ((0, 2.5), (2, 4.5), (4, 19.5), (6, 8.5)):
        estimate.record(start, start + 2, seconds)
    assert estimate.ratio() == pytest.approx(r)
    assert estimate.seconds_left() == pytest.approx(8.5 / (2 + 13 * r) * (4 + 38 * r))
    assert estimate.seconds_left() == pytest.approx(22.83, abs=0.01)


def test_the_slope_is_fitted_from_the_warm_chunks_and_blended_with_the_prior():
    # true cost 1 + 0.5 p (a = 1): chunks of 2 at 0..1 (cold: 10 s), 2..3 (4.5), 4..5 (6.5),
    # 6..7 (8.5). Warm per-token times 2.25, 3.25, 4.25 at mid positions 2.5, 4.5, 6.5: slope 0.5,
    # intercept 1 -> fitted 0.5 (within 0.25x..4x the prior 0.2). The warm chunks span positions
    # 2..7, half of the prompt: weight 3 chunks * 0.5^2 = 0.75 against the prior's 4:
    # (0.2 * 4 + 0.5 * 0.75) / 4.75 = 1.175 / 4.75
    estimate = PrefillEstimate(0, 12, 0.2)
    for start, seconds in ((0, 10.0), (2, 4.5), (4, 6.5), (6, 8.5)):
        estimate.record(start, start + 2, seconds)
    assert estimate.ratio() == pytest.approx(1.175 / 4.75)


def test_a_fit_with_the_prior_right_predicts_exactly():
    # prior = true ratio 0.5: every warm chunk implies a = 1; positions 8..11 cost
    # 4 + 0.5 * 38 = 23 -> 23 s (the cold first chunk has left the speed window)
    estimate = PrefillEstimate(0, 12, 0.5)
    for start, seconds in ((0, 10.0), (2, 4.5), (4, 6.5), (6, 8.5)):
        estimate.record(start, start + 2, seconds)
    assert estimate.ratio() == pytest.approx(0.5)
    assert estimate.seconds_left() == pytest.approx(23.0)


def test_a_falling_slope_is_clamped_to_a_quarter_of_the_prior():
    # later chunks faster than earlier ones (another program finished): per-token 4.5, 3, 1.5 at
    # positions 2.5, 4.5, 6.5 fit a negative slope; clamped to 0.25 * 0.2 = 0.05, weight 0.75:
    # (0.2 * 4 + 0.05 * 0.75) / 4.75 = 0.8375 / 4.75
    estimate = PrefillEstimate(0, 12, 0.2)
    for start, seconds in ((0, 5.0), (2, 9.0), (4, 6.0), (6, 3.0)):
        estimate.record(start, start + 2, seconds)
    assert estimate.ratio() == pytest.approx(0.8375 / 4.75)


def test_a_steep_slope_is_clamped_to_four_times_the_prior():
    # the chunks of the fit test (fitted 0.5) against a prior of 0.05: clamped to 4 * 0.05 = 0.2,
    # (0.05 * 4 + 0.2 * 0.75) / 4.75 = 0.35 / 4.75
    estimate = PrefillEstimate(0, 12, 0.05)
    for start, seconds in ((0, 10.0), (2, 4.5), (4, 6.5), (6, 8.5)):
        estimate.record(start, start + 2, seconds)
    assert estimate.ratio() == pytest.approx(0.35 / 4.75)


def test_a_line_without_a_positive_fixed_cost_keeps_the_prior():
    # per-token 1, 5, 9 at 2.5, 4.5, 6.5: slope 2, intercept -4: not a cost model -> the prior
    estimate = PrefillEstimate(0, 12, 0.2)
    for start, seconds in ((0, 2.0), (2, 2.0), (4, 10.0), (6, 18.0)):
        estimate.record(start, start + 2, seconds)
    assert estimate.ratio() == pytest.approx(0.2)


def test_done_means_no_time_left():
    estimate = PrefillEstimate(0, 4, 0.5)
    estimate.record(0, 4, 3.0)
    assert estimate.seconds_left() == 0.0


def test_a_chunk_that_does_not_continue_the_prefill_is_refused():
    estimate = PrefillEstimate(0, 8, 0.5)
    estimate.record(0, 4, 1.0)
    with pytest.raises(ValueError, match="chunk 5..8 does not continue the prefill at 4 of 8"):
        estimate.record(5, 8, 1.0)


# --- the events the loop yields ------------------------------------------------------------------
@pytest.fixture
def _fake_detokenizer(monkeypatch):
    use_fake_detokenizer(monkeypatch)


@pytest.mark.usefixtures("_fake_detokenizer")
def test_a_long_prompt_reports_progress_per_chunk_before_the_first_token():
    prompt = [BOS] + ids("a") * 600  # 601 tokens: chunks of 256, 256, 89
    lm = fake_lm(script_tokens(len(prompt), ids("b")), n_ctx=1024)
    events = list(generate(lm, GenerationRequest(prompt_ids=prompt)))
    progress = [e for e in events if isinstance(e, PrefillProgress)]
    assert [(p.done, p.total, p.cached) for p in progress] == [
        (0, 601, 0),
        (256, 601, 0),
        (512, 601, 0),
        (601, 601, 0),
    ]
    assert progress[0].eta_s is None and progress[0].tok_s is None
    assert all(p.eta_s is not None and p.eta_s >= 0 for p in progress[1:])
    assert progress[-1].eta_s == 0.0
    first_token = next(i for i, e in enumerate(events) if isinstance(e, TokenSampled))
    assert all(events.index(p) < first_token for p in progress)
    assert isinstance(events[-1], Finished) and events[-1].finish_reason == "stop"


@pytest.mark.usefixtures("_fake_detokenizer")
def test_a_prompt_of_one_chunk_reports_no_progress():
    prompt = [BOS] + ids("a") * 255  # exactly one chunk
    lm = fake_lm(script_tokens(len(prompt), ids("b")), n_ctx=1024)
    events = list(generate(lm, GenerationRequest(prompt_ids=prompt)))
    assert not [e for e in events if isinstance(e, PrefillProgress)]


@pytest.mark.usefixtures("_fake_detokenizer")
def test_cancel_mid_prefill_reports_only_the_chunks_read():
    prompt = [BOS] + ids("a") * 600
    lm = fake_lm(script_tokens(len(prompt), ids("b")), n_ctx=1024)
    cancel = CancelToken()
    lm.model.on_forward = lambda call: cancel.cancel() if call.start == 256 else None
    events = list(generate(lm, GenerationRequest(prompt_ids=prompt), cancel))
    assert [e.done for e in events if isinstance(e, PrefillProgress)] == [0, 256, 512]
    assert events[-1].finish_reason == "cancelled"
