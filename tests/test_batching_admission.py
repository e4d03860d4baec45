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
    "kwargs", [{"budget_bytes": 0}, {"max_concurrency": 0}, {"max_queue": -1}, {"max_queue": True}]
)
def test_bad_limits_are_named(kwargs):
    values = {"budget_bytes": 10, "max_concurrency": 1, "max_queue": 0, **kwargs}
    with pytest.raises(ConfigValidationError):
        KVLedger(**values)


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
