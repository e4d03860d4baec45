"""app/compare.py without a model: when a divergence between two columns is certain, and the
confidence of a token (hand-made token streams)."""

import math

from app.compare import ColumnSpec, ColumnState, confidence, divergence_index
from engine.events import TokenSampled


def _column(ids: list[int], *, running: bool) -> ColumnState:
    column = ColumnState(ColumnSpec("c"), request_id=1)
    column.tokens = [TokenSampled(i, t, f"<{t}>", -0.5) for i, t in enumerate(ids)]
    if not running:
        column.error = "ended"  # any terminal state: not running
    return column


def test_a_difference_inside_both_streams_is_final_while_they_run():
    assert divergence_index(_column([1, 2, 3], running=True), _column([1, 2, 4], running=True)) == 2
    assert divergence_index(_column([5], running=True), _column([6, 7], running=False)) == 0


def test_a_shorter_stream_counts_only_once_both_have_ended():
    short, long = [1, 2], [1, 2, 3]
    assert divergence_index(_column(short, running=True), _column(long, running=False)) is None
    assert divergence_index(_column(short, running=False), _column(long, running=True)) is None
    assert divergence_index(_column(short, running=False), _column(long, running=False)) == 2


def test_identical_streams_have_no_divergence():
    assert divergence_index(_column([1, 2], running=False), _column([1, 2], running=False)) is None


def test_confidence_is_the_probability_of_the_chosen_token():
    token = TokenSampled(0, 7, "x", math.log(0.25))
    assert confidence(token) == 0.25
