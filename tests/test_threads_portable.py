"""The thread pool on every platform: the portable spin-then-yield waiting (forced here, where
the futex would otherwise be used) runs every chunk exactly once, also oversubscribed; and the
pool plus every kernel module compile for AArch64 Linux, Apple Silicon macOS and Windows x86-64
with that platform's wait/wake primitive and spin hint (object emission only: nothing runs)."""

import hashlib
import threading
import time

import llvmlite.binding as llvm
import numpy as np
import pytest

from engine.kernels.compiler import KernelLibrary
from engine.kernels.jit_backend import kernel_modules
from engine.kernels.threads import (
    PORTABLE_ENV,
    PoolTarget,
    ThreadPool,
    host_pool_target,
    pool_ir,
    triple_pool_target,
)
from tests.test_threads import MARK_IR

HOST = host_pool_target(portable=False)
PORTABLE = PoolTarget(HOST.os, HOST.arch, portable=True)


@pytest.fixture(scope="module")
def portable_library(tmp_path_factory):
    if HOST.arch not in ("x86_64", "aarch64"):
        pytest.skip("no pool IR for this architecture")
    lib = KernelLibrary(cache_dir=tmp_path_factory.mktemp("jit"))
    lib.add_modules([("pool_portable", pool_ir(PORTABLE)), ("mark", MARK_IR)])
    return lib


def _run_jobs(lib, n_threads, n_chunks, jobs):
    pool = ThreadPool(lib, n_threads)
    counts = np.zeros(n_chunks + 1, dtype=np.int64)
    try:
        for _ in range(jobs):
            pool.run(lib.address("mark"), counts.ctypes.data, n_chunks)
    finally:
        pool.close()
    return counts


def test_the_forced_portable_pool_is_not_the_futex_one():
    ir = pool_ir(PORTABLE)
    assert PORTABLE.wait_wake == "spin-yield" and "futex" not in ir and "@syscall" not in ir
    assert "@usleep" in ir and "@tick" in ir  # naps instead of blocking; counts idle checks


def test_the_variable_forces_the_portable_pool(monkeypatch):
    monkeypatch.setenv(PORTABLE_ENV, "portable")
    assert host_pool_target().portable and pool_ir() == pool_ir(PORTABLE)
    monkeypatch.delenv(PORTABLE_ENV)
    assert not host_pool_target().portable


@pytest.mark.parametrize("n_threads,n_chunks", [(1, 1), (2, 1), (2, 8), (3, 5)])
def test_portable_pool_runs_every_chunk_once(portable_library, n_threads, n_chunks):
    counts = _run_jobs(portable_library, n_threads, n_chunks, 500)
    assert counts[:n_chunks].tolist() == [500 * (i + 1) for i in range(n_chunks)]
    assert counts[n_chunks] == 500 * n_chunks


def test_portable_pool_under_contention(portable_library):
    """Two pools of 4 threads each on this 2-core machine at once, plus a Python thread
    spinning: every thread is descheduled often, mid-chunk and mid-wait."""
    stop = threading.Event()

    def burn():
        while not stop.is_set():
            sum(range(1000))

    results = {}

    def one(key):
        results[key] = _run_jobs(portable_library, 4, 16, 300)

    threads = [threading.Thread(target=burn)] + [
        threading.Thread(target=one, args=(k,)) for k in range(2)
    ]
    for t in threads:
        t.start()
    for t in threads[1:]:
        t.join()
    stop.set()
    threads[0].join()
    for counts in results.values():
        assert counts[:16].tolist() == [300 * (i + 1) for i in range(16)] and counts[16] == 4800


def test_portable_pool_wakes_napping_workers(portable_library):
    pool = ThreadPool(portable_library, 3)
    counts = np.zeros(4, dtype=np.int64)
    pool.run(portable_library.address("mark"), counts.ctypes.data, 3)
    time.sleep(0.05)  # past the spin and yield budgets: the workers now nap in wait_sleep
    pool.run(portable_library.address("mark"), counts.ctypes.data, 3)
    pool.close()  # joins: a worker that never saw the stop flag would hang here
    assert counts.tolist() == [2, 4, 6, 6]


# (triple, wait/wake, what the pool's assembly must call or contain)
CROSS = [
    ("aarch64-unknown-linux-gnu", "futex", ["yield", "#98", "syscall"]),
    ("arm64-apple-darwin", "ulock", ["yield", "___ulock_wait", "___ulock_wake", "_sched_yield"]),
    ("x86_64-pc-windows-msvc", "WaitOnAddress", ["pause", "WaitOnAddress", "SwitchToThread"]),
]

# Intel Macs: the TSC-timed x86 pool with macOS's wait/wake (the pool only; the x86 kernels are
# the Windows/Linux ones).
POOL_CROSS = [*CROSS, ("x86_64-apple-darwin", "ulock", ["pause", "rdtsc", "___ulock_wait"])]


@pytest.fixture(scope="module")
def all_targets():
    llvm.initialize_all_targets()
    llvm.initialize_all_asmprinters()


def _machine(triple, cpu=""):
    return llvm.Target.from_triple(triple).create_target_machine(cpu=cpu, opt=0)


def _emit(tm, ir):
    module = llvm.parse_assembly(ir)
    module.verify()
    module.triple = tm.triple
    module.data_layout = str(tm.target_data)
    pb = llvm.create_pass_builder(tm, llvm.create_pipeline_tuning_options(speed_level=0))
    pb.getModulePassManager().run(module, pb)
    return module


@pytest.mark.parametrize(("triple", "wait_wake", "needles"), POOL_CROSS)
def test_pool_compiles_for_other_platforms_with_their_wait_wake(
    all_targets, triple, wait_wake, needles
):
    target = triple_pool_target(triple)
    assert target.wait_wake == wait_wake
    tm = _machine(triple)
    asm = tm.emit_assembly(_emit(tm, pool_ir(target)))
    for needle in needles:
        assert needle in asm, f"{triple}: {needle!r} not in the pool's code"
    assert ("pause" in asm) == (target.arch == "x86_64")
    assert ("rdtsc" in asm) == (target.arch == "x86_64")  # AArch64 counts idle checks instead
    portable = tm.emit_object(_emit(tm, pool_ir(PoolTarget(target.os, target.arch, True))))
    assert portable


# Every kernel module, compiled to an object file once per other architecture and object format:
# Apple silicon (AArch64, Mach-O: the generic dot products) and Windows on x86-64 (COFF, the AVX2
# path most laptops take). The other x86 paths (VNNI, generic) differ from AVX2 only in their IR,
# which this suite compiles and runs on Linux (test_kernels_cpu_target.py); AArch64 Linux differs
# from Apple silicon only in the pool, compiled above for every platform. One (ISA, CPU) per
# platform keeps this to a few seconds, where every path on every platform took ~45 s of CPU.
KERNEL_CROSS = [
    ("arm64-apple-darwin", "generic", "apple-m1"),
    ("x86_64-pc-windows-msvc", "avx2", "haswell"),
]


@pytest.mark.parametrize(("triple", "isa", "cpu"), KERNEL_CROSS)
def test_every_kernel_module_compiles_for_other_platforms(request, all_targets, triple, isa, cpu):
    """Object emission is a function of the IR, the target and LLVM: a module this machine has
    already compiled for the target, unchanged since, is not compiled again (pytest's cache,
    keyed by a hash of all three). The AArch64 emission is ~16 s of CPU for IR that changes only
    when a kernel does."""
    target = triple_pool_target(triple)
    tm = _machine(triple, cpu)
    llvm_version = ".".join(map(str, llvm.llvm_version_info))
    for name, ir in kernel_modules(isa):
        if name == "pool":
            ir = pool_ir(target)
        digest = hashlib.sha256(f"{triple} {cpu} {llvm_version}\n{ir}".encode()).hexdigest()
        key = f"localchat/cross-compiled/{digest[:32]}"
        if request.config.cache.get(key, False):
            continue
        assert tm.emit_object(_emit(tm, ir)), f"{triple} {isa}: {name}"
        request.config.cache.set(key, True)
