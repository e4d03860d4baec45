"""Projections that share an input run as one pool job (threads.pool_job_list, the backend's
`linear_many`): every kernel of the list runs each of its chunks once with its own chunk count,
and every output holds exactly the bits `linear` gives it alone (q/k/v, gate/up in the model)."""

import numpy as np
import pytest
from gguf import GGMLQuantizationType as Q

from engine.kernels.compiler import KernelLibrary
from engine.kernels.jit_backend import JitBackend
from engine.kernels.reference import ReferenceBackend
from engine.kernels.threads import ThreadPool, job_list_table, pool_ir
from tests.test_kernels_linear import make_weight, oracle_weight, q8_round_trip
from tests.test_threads import MARK_IR


@pytest.fixture(scope="module")
def library(tmp_path_factory):
    lib = KernelLibrary(cache_dir=tmp_path_factory.mktemp("jit"))
    lib.add_modules([("pool", pool_ir()), ("mark", MARK_IR)])
    return lib


@pytest.mark.parametrize("n_threads", [1, 2, 3])
def test_a_job_list_runs_every_kernel_chunk_once_with_its_own_count(library, n_threads):
    pool = ThreadPool(library, n_threads)
    mark = library.address("mark")
    sizes = (3, 1, 5)  # chunks per kernel: mark adds (i + 1) to counts[i] and 1 to counts[n]
    counts = [np.zeros(n + 1, np.int64) for n in sizes]
    table = job_list_table([(mark, c.ctypes.data, n) for c, n in zip(counts, sizes, strict=True)])
    jobs = 300
    for _ in range(jobs):
        pool.run(library.address("pool_job_list"), table.ctypes.data, sum(sizes))
    pool.close()
    for c, n in zip(counts, sizes, strict=True):
        assert c[:n].tolist() == [jobs * (i + 1) for i in range(n)]  # i is the kernel's own
        assert c[n] == jobs * n  # ... and n its own chunk count


def test_a_job_list_entry_needs_a_chunk():
    with pytest.raises(ValueError, match="at least one"):
        job_list_table([(1, 2, 3), (4, 5, 0)])


@pytest.fixture(scope="module", params=[1, 2], ids=lambda n: f"{n}threads")
def backend(request):
    b = JitBackend(n_threads=request.param)
    yield b
    b.close()


# q/k/v-like: a repacked Q4_K, a repacked Q6_K whose rows end in a partial 16-row group, a
# row-major Q8_0 and another Q4_K; one input width.
QKV = [(Q.Q4_K, 48), (Q.Q6_K, 37), (Q.Q8_0, 9), (Q.Q4_K, 16)]


@pytest.mark.parametrize("tokens", [1, 3, 13])
def test_linear_many_gives_each_output_the_bits_of_linear(backend, tokens):
    rng = np.random.default_rng(tokens)
    cols = 512
    weights = [make_weight(q, rows, cols, rng) for q, rows in QKV]
    x = rng.standard_normal((tokens, cols)).astype(np.float32)
    alone = [backend.linear(w, x) for w in weights]
    outs = [np.full((tokens, w.rows), np.nan, np.float32) for w in weights]
    for _ in range(3):  # the cached job list too, and outputs written in place each time
        got = backend.linear_many(weights, x, outs)
        assert all(g is o for g, o in zip(got, outs, strict=True))
        for o, a in zip(outs, alone, strict=True):
            assert np.array_equal(o, a)
        for o in outs:
            o[...] = np.nan
    # independent of the kernels: gguf-py's weights times the int8-rounded input
    backend.linear_many(weights, x, outs)
    for o, w in zip(outs, weights, strict=True):
        want = q8_round_trip(x) @ oracle_weight(w).T
        np.testing.assert_allclose(o, want, rtol=1e-4, atol=1e-4 * np.abs(want).max())


def test_weights_that_cannot_share_a_job_still_get_their_linear(backend):
    rng = np.random.default_rng(5)
    x = rng.standard_normal((2, 256)).astype(np.float32)
    # a float weight has no int8 input to share; a different width cannot share x at all
    mixed = [make_weight(Q.Q4_K, 16, 256, rng), make_weight(Q.F16, 8, 256, rng)]
    outs = [np.empty((2, w.rows), np.float32) for w in mixed]
    backend.linear_many(mixed, x, outs)
    for o, w in zip(outs, mixed, strict=True):
        assert np.array_equal(o, backend.linear(w, x))
    reference = ReferenceBackend()
    ref = reference.linear_many(mixed, x, [np.empty_like(o) for o in outs])
    for o, r in zip(outs, ref, strict=True):
        np.testing.assert_allclose(o, r, rtol=2e-2, atol=2e-2 * np.abs(r).max())
