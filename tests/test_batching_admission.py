"""The batch scheduler's bookkeeping without a model: KV admission and how a step is cut."""

from __future__ import annotations

import numpy as np
import pytest

from engine.batching.admission import KVLedger
from engine.batching.forward_work import DECODE_MAX_TOKENS, PREFILL_SLICE, ForwardWork, cut_step
from engine.errors import ConfigValidationError, KVAdmissionError, MemoryBudgetError, QueueFullError
from engine.kv_cache import KVCache


class _Item:
    def __init__(self, name):
        self.name = name


def test_admission_reserves_queues_fifo_and_refuses_with_bytes():
    ledger: KVLedger[_Item] = KVLedger(budget_bytes=100, max_concurrency=2, max_queue=2)
    a, b, c, d, e = (_Item(n) for n in "abcde")
    assert ledger.admit(a, 60) == 0
    assert ledger.admit(b, 50) == 1  # 60 + 50 > 100: waits for memory
    assert ledger.admit(c, 10) == 2  # would fit, but never overtakes the head of the queue
    with pytest.raises(QueueFullError) as full:
        ledger.admit(d, 10)
    assert (full.value.bytes_needed, full.value.bytes_available, full.value.max_queue) == (
        10,
        40,
        2,
    )
    with pytest.raises(KVAdmissionError) as never:
        ledger.admit(e, 101)
    err = never.value
    assert err.never_fits and (err.bytes_needed, err.bytes_available, err.budget_bytes) == (
        101,
        40,
        100,
    )
    assert "101 bytes" in str(err) and isinstance(err, MemoryBudgetError)
    assert ledger.release(a) == [b, c]  # FIFO, both fit now (50 + 10)
    assert ledger.reserved == 60 and not ledger.queue
    assert ledger.release(b) == [] and ledger.release(c) == []
    assert ledger.reserved == 0 and not ledger.running


def test_concurrency_slots_queue_even_when_memory_is_free():
    ledger: KVLedger[_Item] = KVLedger(budget_bytes=1000, max_concurrency=1, max_queue=4)
    a, b = _Item("a"), _Item("b")
    assert ledger.admit(a, 1) == 0 and ledger.admit(b, 1) == 1
    assert ledger.drop_queued(lambda item: item is b) == [b]
    assert ledger.release(a) == [] and ledger.reserved == 0


@pytest.mark.parametrize(
    ("kwargs", "name", "allowed"),
    [
        ({"budget_bytes": 0}, "kv_budget_bytes", "an integer >= 1"),
        ({"budget_bytes": True}, "kv_budget_bytes", "an integer >= 1"),
        ({"budget_bytes": 10.0}, "kv_budget_bytes", "an integer >= 1"),
        ({"max_concurrency": 0}, "max_concurrency", "an integer >= 1"),
        ({"max_concurrency": True}, "max_concurrency", "an integer >= 1"),
        ({"max_concurrency": "2"}, "max_concurrency", "an integer >= 1"),
        ({"max_queue": -1}, "max_queue", "an integer >= 0"),
        ({"max_queue": True}, "max_queue", "an integer >= 0"),
        ({"max_queue": False}, "max_queue", "an integer >= 0"),
    ],
)
def test_bad_limits_are_named(kwargs, name, allowed):
    values = {"budget_bytes": 10, "max_concurrency": 1, "max_queue": 0, **kwargs}
    with pytest.raises(ConfigValidationError) as info:
        KVLedger(**values)
    (value,) = kwargs.values()
    assert (info.value.field, info.value.value, info.value.allowed) == (name, value, allowed)
    assert f"{name}={value!r} is invalid" in str(info.value)


def test_the_smallest_limits_are_accepted():
    ledger: KVLedger[_Item] = KVLedger(budget_bytes=1, max_concurrency=1, max_queue=0)
    assert (ledger.budget_bytes, ledger.max_concurrency, ledger.max_queue) == (1, 1, 0)
    assert (ledger.reserved, ledger.available, ledger.running, list(ledger.queue)) == (0, 1, {}, [])


def test_a_request_of_exactly_the_free_bytes_runs_and_one_byte_more_waits():
    ledger: KVLedger[_Item] = KVLedger(budget_bytes=100, max_concurrency=4, max_queue=4)
    a, b, c = _Item("a"), _Item("b"), _Item("c")
    assert ledger.admit(a, 100) == 0  # the whole budget: fits
    assert (ledger.reserved, ledger.available) == (100, 0)
    assert ledger.release(a) == [] and ledger.available == 100
    assert ledger.admit(b, 70) == 0
    assert ledger.admit(c, 31) == 1  # 70 + 31 > 100
    assert ledger.running == {id(b): 70}


def test_the_concurrency_limit_is_exact():
    ledger: KVLedger[_Item] = KVLedger(budget_bytes=1000, max_concurrency=2, max_queue=4)
    a, b, c = _Item("a"), _Item("b"), _Item("c")
    assert ledger.admit(a, 1) == 0 and ledger.admit(b, 1) == 0
    assert ledger.admit(c, 1) == 1  # a third would run with memory to spare: it waits
    assert ledger.release(a) == [c] and set(ledger.running) == {id(b), id(c)}


def test_a_queue_of_zero_refuses_every_request_that_would_wait():
    ledger: KVLedger[_Item] = KVLedger(budget_bytes=100, max_concurrency=1, max_queue=0)
    a, b = _Item("a"), _Item("b")
    assert ledger.admit(a, 10) == 0
    with pytest.raises(QueueFullError) as full:
        ledger.admit(b, 10)
    err = full.value
    assert (err.bytes_needed, err.bytes_available, err.max_queue, err.running) == (10, 90, 0, 1)
    assert "1 requests are running and the queue of 0 waiting requests is full" in str(err)
    assert "needs 10 bytes, 90 bytes are free" in str(err)


def test_the_queue_refuses_only_when_full():
    ledger: KVLedger[_Item] = KVLedger(budget_bytes=10, max_concurrency=1, max_queue=2)
    a, b, c = _Item("a"), _Item("b"), _Item("c")
    ledger.admit(a, 10)
    assert ledger.admit(b, 1) == 1 and ledger.admit(c, 1) == 2
    with pytest.raises(QueueFullError):
        ledger.admit(_Item("d"), 1)
    assert [item for item, _ in ledger.queue] == [b, c]


def test_a_request_larger_than_the_budget_is_refused_even_when_idle():
    ledger: KVLedger[_Item] = KVLedger(budget_bytes=100, max_concurrency=1, max_queue=4)
    with pytest.raises(KVAdmissionError) as never:
        ledger.admit(_Item("a"), 101)
    err = never.value
    assert err.never_fits and (err.bytes_needed, err.bytes_available, err.budget_bytes) == (
        101,
        100,
        100,
    )
    assert "more than the whole KV budget of 100 bytes" in str(err)
    assert ledger.reserved == 0 and not ledger.queue and not ledger.running


def test_a_released_head_that_still_does_not_fit_holds_the_line():
    ledger: KVLedger[_Item] = KVLedger(budget_bytes=100, max_concurrency=4, max_queue=4)
    a, b, big, small = (_Item(n) for n in ("a", "b", "big", "small"))
    ledger.admit(a, 50)
    ledger.admit(b, 40)
    assert ledger.admit(big, 60) == 1 and ledger.admit(small, 5) == 2
    assert ledger.release(b) == []  # 50 free: big (60) still waits, small must not overtake it
    assert ledger.release(a) == [big, small]
    assert ledger.reserved == 65


def test_releasing_an_item_twice_or_one_never_admitted_frees_nothing():
    ledger: KVLedger[_Item] = KVLedger(budget_bytes=100, max_concurrency=4, max_queue=4)
    a, b = _Item("a"), _Item("b")
    ledger.admit(a, 30)
    ledger.admit(b, 20)
    assert ledger.release(a) == [] and ledger.reserved == 20
    assert ledger.release(a) == [] and ledger.reserved == 20
    assert ledger.release(_Item("stranger")) == [] and ledger.reserved == 20


def test_dropping_queued_items_keeps_the_others_in_order():
    ledger: KVLedger[_Item] = KVLedger(budget_bytes=10, max_concurrency=1, max_queue=5)
    a, b, c, d, e = (_Item(n) for n in "abcde")
    ledger.admit(a, 10)
    for item, n in ((b, 1), (c, 2), (d, 3), (e, 4)):
        ledger.admit(item, n)
    assert ledger.drop_queued(lambda item: item.name in "bd") == [b, d]
    assert list(ledger.queue) == [(c, 2), (e, 4)]
    assert ledger.drop_queued(lambda item: False) == []
    assert list(ledger.queue) == [(c, 2), (e, 4)]
    assert ledger.release(a) == [c]  # one slot: the oldest of those left


def _work(n_tokens: int, cache_size: int = 512) -> ForwardWork:
    cache = KVCache(1, cache_size, 1, 16)
    return ForwardWork.of_call(list(range(n_tokens)), cache, False, None, None)


def test_a_step_takes_every_decode_whole_and_slices_prefill_beside_them():
    prefill, other = _work(300), _work(100)
    decodes = [_work(1), _work(DECODE_MAX_TOKENS), _work(1)]
    step = cut_step([prefill, *decodes, other], max_batch=256)
    sizes = {id(w): n for w, n in step}
    assert [sizes[id(w)] for w in decodes] == [1, DECODE_MAX_TOKENS, 1]
    assert sizes[id(prefill)] == PREFILL_SLICE and id(other) not in sizes  # oldest prefill first
    # nothing decoding: a prompt goes at full chunk size
    assert cut_step([_work(300)], max_batch=256)[0][1] == 256


def test_a_sliced_call_returns_what_forward_would():
    work = ForwardWork.of_call(list(range(10)), KVCache(1, 16, 1, 16), False, [9, 2, 2], None)
    rows = np.arange(10 * 3, dtype=np.float32).reshape(10, 3)  # stand-in logits per token
    for lo, hi in ((0, 4), (4, 10)):
        seg = work.segment(hi - lo)
        assert list(seg.ids) == list(range(lo, hi))
        work.cache.commit(seg.ids)
        done = work.took(hi - lo, rows[lo:hi][seg.logit_rows])
    assert done and np.array_equal(work.result, rows[[9, 2, 2]])  # caller's order, duplicates kept


def test_a_failed_call_takes_its_committed_slices_back_out():
    cache = KVCache(1, 32, 1, 16)
    cache.commit([5, 6])
    work = ForwardWork.of_call(list(range(20)), cache, False, None, None)
    cache.commit(work.segment(8).ids)
    work.took(8, np.zeros((0, 3), np.float32))
    work.fail(RuntimeError("boom"))
    assert cache.tokens == [5, 6] and work.finished.is_set() and work.result is None
