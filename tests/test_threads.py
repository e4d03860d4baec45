"""The native worker pool: every chunk runs exactly once per job, jobs never overlap, and it
shuts down cleanly (also after the workers went to sleep on the futex)."""

import time

import numpy as np
import pytest

from engine.errors import ConfigValidationError
from engine.kernels.compiler import KernelLibrary
from engine.kernels.threads import ThreadPool, physical_cores, pool_ir

# Adds (tid + 1) to counts[tid] and counts[n] += 1 atomically: shows who ran, and how often.
MARK_IR = """
define void @mark(ptr %args, i32 %tid, i32 %n) {
  %t = sext i32 %tid to i64
  %p = getelementptr i64, ptr %args, i64 %t
  %v = load i64, ptr %p
  %t1 = add i64 %t, 1
  %v2 = add i64 %v, %t1
  store i64 %v2, ptr %p
  %nn = sext i32 %n to i64
  %q = getelementptr i64, ptr %args, i64 %nn
  %o = atomicrmw add ptr %q, i64 1 seq_cst
  ret void
}
"""


@pytest.fixture(scope="module")
def library(tmp_path_factory):
    lib = KernelLibrary(cache_dir=tmp_path_factory.mktemp("jit"))
    lib.add_modules([("pool", pool_ir()), ("mark", MARK_IR)])
    return lib


@pytest.mark.parametrize("n_threads,n_chunks", [(1, 1), (2, 1), (2, 8), (3, 5)])
def test_every_chunk_runs_once_per_job(library, n_threads, n_chunks):
    pool = ThreadPool(library, n_threads)
    counts = np.zeros(n_chunks + 1, dtype=np.int64)
    for _ in range(500):
        pool.run(library.address("mark"), counts.ctypes.data, n_chunks)
    pool.close()
    # chunk i adds i + 1 once per job (non-atomically: a double run or a race would show)
    assert counts[:n_chunks].tolist() == [500 * (i + 1) for i in range(n_chunks)]
    assert counts[n_chunks] == 500 * n_chunks


def test_jobs_after_workers_fell_asleep(library):
    pool = ThreadPool(library, 2)
    counts = np.zeros(3, dtype=np.int64)
    pool.run(library.address("mark"), counts.ctypes.data, 2)
    time.sleep(0.05)  # past the spin and yield budgets: the worker now waits on the futex
    pool.run(library.address("mark"), counts.ctypes.data, 2)
    pool.close()
    assert counts.tolist() == [2, 4, 4]


def test_thread_count_is_validated(library):
    with pytest.raises(ConfigValidationError, match="n_threads"):
        ThreadPool(library, 0)
    assert physical_cores() >= 1
