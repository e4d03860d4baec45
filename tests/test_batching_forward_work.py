"""A request's forward call as the batch scheduler serves it, and how one step is cut (no model).

A ForwardWork must return exactly what `TransformerModel.forward` returns for the same call, over
however many steps it is served in; cut_step decides who waits. Expected values are written out
by hand (logits stand-ins: row i of a call is filled with i).
"""

from __future__ import annotations

import numpy as np
import pytest

from engine.batching.forward_work import (
    DECODE_MAX_TOKENS,
    MIN_PREFILL_SLICE,
    PREFILL_SLICE,
    ForwardWork,
    cut_step,
)
from engine.errors import ContextOverflowError
from engine.kv_cache import KVCache

V = 3  # vocabulary of the stand-in logits


def _cache(size: int = 64, cached: int = 0) -> KVCache:
    cache = KVCache(1, size, 1, 2)
    cache.commit([7] * cached)
    return cache


def _call(n: int, *, all_logits=False, logits_at=None, cache=None) -> ForwardWork:
    return ForwardWork.of_call(
        list(range(100, 100 + n)), cache or _cache(), all_logits, logits_at, None
    )


def _rows(lo: int, hi: int) -> np.ndarray:
    """Stand-in logits for tokens lo..hi-1 of a call: row i is all i."""
    return np.repeat(np.arange(lo, hi, dtype=np.float32)[:, None], V, axis=1)


def _serve(work: ForwardWork, sizes: list[int]) -> list[bool]:
    """Serve the call in slices of these sizes as the scheduler does; -> took()'s answers."""
    answers = []
    for n in sizes:
        seg = work.segment(n)
        lo = work.done
        work.cache.commit(seg.ids)
        answers.append(work.took(n, _rows(lo, lo + n)[np.asarray(seg.logit_rows, dtype=int)]))
    return answers


# --- what a call returns -------------------------------------------------------------------------
def test_a_plain_call_returns_the_last_rows_logits_whole_or_sliced():
    whole, sliced = _call(10), _call(10)
    assert _serve(whole, [10]) == [True]
    assert _serve(sliced, [3, 3, 4]) == [False, False, True]
    for work in (whole, sliced):
        assert work.shape == "last" and work.result.shape == (V,)
        assert work.result.tolist() == [9.0] * V
        assert work.finished.is_set() and work.error is None and work.rows == []


def test_all_logits_returns_every_row_in_order():
    work = _call(5, all_logits=True)
    assert _serve(work, [2, 3]) == [False, True]
    assert work.result[:, 0].tolist() == [0, 1, 2, 3, 4]


def test_all_logits_wins_over_logits_at():
    work = _call(4, all_logits=True, logits_at=[1])
    _serve(work, [4])
    assert work.result[:, 0].tolist() == [0, 1, 2, 3]


def test_logits_at_gives_the_asked_rows_in_the_callers_order_duplicates_kept():
    work = _call(10, logits_at=[9, 2, 2, 0])
    assert work.wanted.tolist() == [0, 2, 9]
    _serve(work, [1, 4, 5])  # row 0 in the first slice, 2 in the second, 9 in the last
    assert work.result[:, 0].tolist() == [9, 2, 2, 0]


def test_a_slice_with_no_wanted_row_adds_nothing():
    work = _call(6, logits_at=[5])
    seg = work.segment(3)
    assert list(seg.ids) == [100, 101, 102] and list(seg.logit_rows) == []
    work.cache.commit(seg.ids)
    assert work.took(3, np.zeros((0, V), np.float32)) is False
    seg = work.segment(3)
    assert list(seg.ids) == [103, 104, 105] and list(seg.logit_rows) == [2]
    work.cache.commit(seg.ids)
    assert work.took(3, _rows(5, 6)) is True
    assert work.result.tolist() == [[5.0] * V]


def test_logits_at_as_a_small_integer_array_works_past_its_range():
    # indices given as uint8 (any integer array is fine for forward()): slices starting past
    # 255 must not do uint8 arithmetic with their start
    work = _call(300, logits_at=np.array([200, 10], dtype=np.uint8), cache=_cache(512))
    _serve(work, [256, 44])
    assert work.result[:, 0].tolist() == [200, 10]


def test_logits_at_may_ask_for_no_row_whole_or_sliced():
    # forward() returns an empty (0, n_vocab) array for logits_at=[]; this once raised
    # IndexError in took() (no row was kept), on the scheduler's thread
    whole, sliced = _call(3, logits_at=[]), _call(6, logits_at=[])
    assert _serve(whole, [3]) == [True] and _serve(sliced, [2, 4]) == [False, True]
    assert whole.result.shape == sliced.result.shape == (0, V)


@pytest.mark.parametrize("bad", [[10], [-1], [0, 10], [3, -2]])
def test_logits_at_outside_the_call_is_refused_with_the_range(bad):
    with pytest.raises(ValueError, match=r"logits_at indices must be in \[0, 10\)"):
        _call(10, logits_at=bad)


def test_logits_at_the_last_and_first_row_are_fine():
    work = _call(10, logits_at=[9, 0])
    assert work.wanted.tolist() == [0, 9]


def test_an_empty_call_is_refused():
    with pytest.raises(ValueError, match=r"^forward\(\) needs at least one token$"):
        ForwardWork.of_call([], _cache(), False, None, None)


def test_token_ids_and_logits_at_of_any_shape_are_read_flat_as_forward_reads_them():
    work = ForwardWork.of_call(
        np.array([[100, 101], [102, 103]]), _cache(), False, np.array([[3], [1]]), None
    )
    assert work.tokens.tolist() == [100, 101, 102, 103] and work.remaining == 4
    seg = work.segment(2)
    assert list(seg.ids) == [100, 101] and list(seg.logit_rows) == [1]
    _serve(work, [2, 2])
    assert work.result[:, 0].tolist() == [3, 1]  # (2, n_vocab), as forward() gives


def test_a_call_the_cache_has_no_room_for_is_refused_before_anything_runs():
    cache = _cache(size=8, cached=5)
    with pytest.raises(ContextOverflowError, match="5 cached \\+ 4 new tokens"):
        _call(4, cache=cache)
    assert cache.n_tokens == 5
    assert _call(3, cache=cache).start_tokens == 5  # exactly full is fine


def test_remaining_counts_what_is_not_fed_yet():
    work = _call(9)
    assert work.remaining == 9
    _serve(work, [4])
    assert (work.done, work.remaining) == (4, 5)


def test_a_failed_call_leaves_the_cache_as_it_was_before_the_call():
    cache = _cache(cached=2)
    work = _call(20, cache=cache)
    assert work.start_tokens == 2
    _serve(work, [8])
    work.rows.append(np.zeros((1, V), np.float32))
    error = RuntimeError("boom")
    work.fail(error)
    assert cache.tokens == [7, 7] and cache.n_tokens == 2
    assert work.error is error and work.result is None
    assert work.rows == [] and work.finished.is_set()


def test_a_call_that_fails_before_its_first_slice_touches_nothing():
    cache = _cache(cached=3)
    work = _call(5, cache=cache)
    work.fail(ValueError("cancelled"))
    assert cache.tokens == [7, 7, 7] and work.finished.is_set()


# --- cutting a step ------------------------------------------------------------------------------
def _sizes(step, works) -> list:
    given = {id(w): n for w, n in step}
    return [given.get(id(w)) for w in works]


def test_nothing_pending_makes_an_empty_step():
    assert cut_step([], max_batch=64) == []


def test_decodes_go_whole_and_the_oldest_prefill_gets_a_slice_beside_them():
    prefill, younger = _call(300, cache=_cache(512)), _call(100, cache=_cache(512))
    decodes = [_call(1), _call(DECODE_MAX_TOKENS), _call(1)]
    step = cut_step([prefill, *decodes, younger], max_batch=256)
    assert _sizes(step, [prefill, *decodes, younger]) == [
        PREFILL_SLICE,
        1,
        DECODE_MAX_TOKENS,
        1,
        None,
    ]
    # decodes first, in the order given, then the slice
    assert [n for _w, n in step] == [1, DECODE_MAX_TOKENS, 1, PREFILL_SLICE]
    assert PREFILL_SLICE == 64 and MIN_PREFILL_SLICE == 8 and DECODE_MAX_TOKENS == 17


def test_a_call_of_eighteen_tokens_is_a_prefill():
    long, decode = _call(DECODE_MAX_TOKENS + 1), _call(1)
    step = cut_step([long, decode], max_batch=64, prefill_slice=10)
    assert _sizes(step, [long, decode]) == [10, 1]


def test_a_lone_prefill_runs_at_full_chunk_size_whatever_the_slice():
    work = _call(300, cache=_cache(512))
    assert cut_step([work], max_batch=256, prefill_slice=8) == [(work, 256)]
    short = _call(40)
    assert cut_step([short], max_batch=256) == [(short, 40)]


def test_the_slice_beside_decodes_is_what_the_scheduler_asks_for():
    work, decode = _call(300, cache=_cache(512)), _call(1)
    assert _sizes(cut_step([work, decode], max_batch=256, prefill_slice=12), [work, decode]) == [
        12,
        1,
    ]
    assert _sizes(cut_step([work, decode], max_batch=256), [work, decode]) == [64, 1]


def test_the_slice_never_overflows_max_batch():
    work, decode = _call(300, cache=_cache(512)), _call(DECODE_MAX_TOKENS)
    assert _sizes(cut_step([work, decode], max_batch=20), [work, decode]) == [3, 17]
    # decodes filling the batch exactly: no prefill in this step
    full = [_call(10), _call(10)]
    assert _sizes(cut_step([work, *full], max_batch=20), [work, *full]) == [None, 10, 10]


def test_a_decode_of_seventeen_tokens_goes_in_once_before_an_older_prefill():
    decode, prefill = _call(DECODE_MAX_TOKENS), _call(100, cache=_cache(512))
    step = cut_step([decode, prefill], max_batch=256, prefill_slice=64)
    assert [(w is decode, n) for w, n in step] == [(True, 17), (False, 64)]


def test_one_free_row_beside_the_decodes_still_takes_a_one_token_slice():
    decode, prefill = _call(DECODE_MAX_TOKENS), _call(100, cache=_cache(512))
    step = cut_step([prefill, decode], max_batch=DECODE_MAX_TOKENS + 1)
    assert _sizes(step, [prefill, decode]) == [1, DECODE_MAX_TOKENS]


def test_decodes_that_do_not_fit_wait_in_order():
    first, second, third = _call(10), _call(10), _call(1)
    # the third would fit in the last row, but it must not overtake the second
    assert _sizes(cut_step([first, second, third], max_batch=15), [first, second, third]) == [
        10,
        None,
        None,
    ]
    assert _sizes(cut_step([first, second], max_batch=20), [first, second]) == [10, 10]


def test_a_short_prefill_takes_what_it_needs_and_the_next_one_gets_the_rest():
    a, b, c = _call(30), _call(50), _call(40)
    decode = _call(1)
    step = cut_step([a, b, c, decode], max_batch=256, prefill_slice=64)
    assert _sizes(step, [a, b, c, decode]) == [30, 34, None, 1]
    # with no decode, the chunk is max_batch
    assert _sizes(cut_step([a, b, c], max_batch=64), [a, b, c]) == [30, 34, None]
