"""A compare column that waits for another column's prompt says so (issue 35). The scheduler
gives a step's whole prefill budget to the earliest-started sequence still reading its prompt
(engine/batching/forward_work.py cut_step), so a later column gets no share until the earlier
ones are read; its first chunk's time then holds that wait, and the time left from it said
"~4 min 38 s" for a prompt read in seconds once its turn came."""

from __future__ import annotations

from app.compare import ColumnSpec, ColumnState
from app.worker import EventBatch
from engine.events import PrefillProgress
from tests.app_fakes import FakeEngine, close_window, make_window


def _progress(done, eta_s=None, tok_s=None, cached=0):
    return PrefillProgress(done, 3800, cached, 1.0, tok_s, eta_s)


def _feed(run, request_id, progress):
    batch = EventBatch(request_id)
    batch.progress = progress
    run._on_batch(request_id, batch)


def test_a_column_behind_another_prompt_says_waiting_not_a_stalled_estimate(qtbot, tmp_path):
    window = make_window(qtbot, tmp_path, FakeEngine(), load=False)
    try:
        dialog = window.open_compare()
        run = dialog.run
        run.columns = [ColumnState(ColumnSpec(n), request_id=i) for i, n in enumerate("AB")]
        run._by_request = {0: 0, 1: 1}
        _feed(run, 0, _progress(256, eta_s=30.0, tok_s=120.0))
        _feed(run, 1, _progress(0))
        assert run.prefill_waiting(1) == 0 and run.prefill_waiting(0) is None
        assert dialog._usage_text(1, run.columns[1]) == (
            "Waiting for column 1's prompt · 0 / 3,800 tokens"
        )
        # column 1's prompt is read; column 2's first chunk took the whole wait: no speed and
        # no time left from it
        _feed(run, 0, _progress(3800, eta_s=0.0, tok_s=120.0))
        _feed(run, 1, _progress(256, eta_s=278.0, tok_s=9.0))
        assert run.prefill_waiting(1) is None
        assert dialog._usage_text(1, run.columns[1]) == "Reading prompt 256 / 3,800 tokens"
        # a second chunk: the estimate leaves the first one out, so it is shown again
        _feed(run, 1, _progress(512, eta_s=41.0, tok_s=17.0))
        assert dialog._usage_text(1, run.columns[1]) == (
            "Reading prompt 512 / 3,800 tokens · 17 tok/s · ~41 s left"
        )
        dialog.close()
    finally:
        close_window(window)


def test_a_column_that_never_waited_shows_its_first_estimate(qtbot, tmp_path):
    window = make_window(qtbot, tmp_path, FakeEngine(), load=False)
    try:
        dialog = window.open_compare()
        run = dialog.run
        run.columns = [ColumnState(ColumnSpec(n), request_id=i) for i, n in enumerate("AB")]
        run._by_request = {0: 0, 1: 1}
        _feed(run, 0, _progress(3800, eta_s=0.0))  # already read (a prefix cache hit)
        _feed(run, 1, _progress(256, eta_s=30.0, tok_s=120.0))
        assert dialog._usage_text(1, run.columns[1]) == (
            "Reading prompt 256 / 3,800 tokens · 120 tok/s · ~30 s left"
        )
        dialog.close()
    finally:
        close_window(window)
