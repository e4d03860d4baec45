"""Native worker pool: threads created once, work split inside JIT code, a spin-then-block barrier.

A Python `threading.Barrier` round trip costs ~38 us, which is more than a whole small mat-vec,
so the hand-off between threads lives in machine code (the IR below):

  * the caller posts (kernel, args, n chunks) into a shared state block and bumps a
    generation counter;
  * every thread, the caller included, claims chunks i < n with an atomic compare-and-swap and
    runs `kernel(args, i, n)`; each worker is a Python thread parked inside `pool_worker`,
    i.e. in native code without the GIL (ctypes releases it);
  * the caller returns when n chunks are done. It never waits for a worker to *check in*: when
    another process holds a core, the running thread simply claims the remaining chunks, so a
    descheduled worker costs at most the one chunk it holds (a static split per thread made
    every job wait for the slowest thread's wake-up: 4x slower than one thread under load).

Waiting is staged so the engine degrades gracefully when other processes hold the cores:
spin with `pause` for ~0.1 ms (the common case between two kernels of one token), then
`sched_yield` for up to ~10 ms (between tokens), then sleep on a futex (an idle app costs
nothing). A pure spin barrier collapses when the cores are oversubscribed.

Why Python threads and not pthreads created from JIT code: once started, both sit in the same
JIT loop, so the hand-off cost is the atomic counter either way (measured here: ~0.7-1 us per
job from Python with 1-2 threads, a `threading.Barrier` round trip is ~38 us). Python threads
need no pthread symbol resolution in MCJIT and are joined by `close()`; pthreads from JIT code
were not built, so there is no measurement of them.

Every kernel run on the pool has the C signature `void kernel(void *args, i32 i, i32 n)` and
does share i of n of its work (the kernels call it tid / n_threads; it is a chunk index).
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import sys
import threading
from pathlib import Path

import numpy as np

# Offsets (bytes) into the 512-byte state block; hot fields sit on separate cache lines.
_GEN, _CTR, _DONE, _STOP, _FN, _ARGS, _NCHUNKS, _SLEEPERS = 0, 64, 128, 192, 256, 264, 272, 320
_STATE_BYTES = 512
CHUNKS_PER_THREAD = 4
# Nothing in the state block is per thread; this bounds the OS threads a typo can start.
MAX_THREADS = 256

# Cycle budgets (TSC ticks, ~3 GHz): spin ~70 us, then yield until ~10 ms, then block.
_SPIN_TICKS = 200_000
_YIELD_TICKS = 30_000_000


def _sleep_ir(linux: bool) -> str:
    """`wait_sleep(ptr gen, i32 seen)`: block until *gen != seen (futex on Linux)."""
    if linux:
        # SYS_futex = 202 on x86-64, FUTEX_WAIT_PRIVATE = 128; returns at once if *gen != seen.
        return """
define internal void @wait_sleep(ptr %gen, i32 %seen) {
  %r = call i64 (i64, ...) @syscall(i64 202, ptr %gen, i32 128, i32 %seen, ptr null)
  ret void
}
define internal void @wake_all(ptr %gen) {
  %r = call i64 (i64, ...) @syscall(i64 202, ptr %gen, i32 129, i32 2147483647)
  ret void
}
declare i64 @syscall(i64, ...)
"""
    return """
define internal void @wait_sleep(ptr %gen, i32 %seen) {
  %r = call i32 @sched_yield()
  ret void
}
define internal void @wake_all(ptr %gen) {
  ret void
}
"""


def _wait_ir(word: str, seen: str, tag: str, sleep: bool) -> str:
    """Wait until the i32 at `word` differs from `seen`: spin, then yield, then (optionally)
    futex sleep. Falls through to label %{tag}_go with the new value in %{tag}_g."""
    sleep_part = (
        f"""
{tag}_sleep0:
  %{tag}_s1 = atomicrmw add ptr %sleepers, i32 1 seq_cst
  %{tag}_g2 = load atomic i32, ptr {word} seq_cst, align 4
  %{tag}_still = icmp eq i32 %{tag}_g2, {seen}
  br i1 %{tag}_still, label %{tag}_sleep, label %{tag}_woke
{tag}_sleep:
  call void @wait_sleep(ptr {word}, i32 {seen})
  br label %{tag}_woke
{tag}_woke:
  %{tag}_s2 = atomicrmw sub ptr %sleepers, i32 1 seq_cst
  br label %{tag}_wait
"""
        if sleep
        else ""
    )
    after_yield = f"%{tag}_sleep0" if sleep else f"%{tag}_do_yield"
    return f"""
  %{tag}_t0 = call i64 @llvm.readcyclecounter()
  br label %{tag}_wait
{tag}_wait:
  %{tag}_g = load atomic i32, ptr {word} acquire, align 4
  %{tag}_changed = icmp ne i32 %{tag}_g, {seen}
  br i1 %{tag}_changed, label %{tag}_go, label %{tag}_idle
{tag}_idle:
  %{tag}_t = call i64 @llvm.readcyclecounter()
  %{tag}_el = sub i64 %{tag}_t, %{tag}_t0
  %{tag}_spin = icmp ult i64 %{tag}_el, {_SPIN_TICKS}
  br i1 %{tag}_spin, label %{tag}_pause, label %{tag}_not_spin
{tag}_pause:
  call void @llvm.x86.sse2.pause()
  br label %{tag}_wait
{tag}_not_spin:
  %{tag}_yield = icmp ult i64 %{tag}_el, {_YIELD_TICKS}
  br i1 %{tag}_yield, label %{tag}_do_yield, label {after_yield}
{tag}_do_yield:
  %{tag}_y = call i32 @sched_yield()
  br label %{tag}_wait
{sleep_part}"""


# Claim chunks of the current job until none is left. The claim counter holds
# (epoch << 32 | next chunk); a successful compare-and-swap on (epoch, i) proves job `epoch` was
# still incomplete, so the fn/args/n read after loading the counter belong to it (the caller
# rewrites them only after a job completes, and first moves the counter to (epoch+1, LOCKED)).
_CLAIM_IR = """
define internal void @claim_chunks(ptr %st) {
entry:
  %ctr = getelementptr i8, ptr %st, i64 {CTR}
  %done = getelementptr i8, ptr %st, i64 {DONE}
  %fnp = getelementptr i8, ptr %st, i64 {FN}
  %argp = getelementptr i8, ptr %st, i64 {ARGS}
  %np = getelementptr i8, ptr %st, i64 {NCHUNKS}
  br label %claim
claim:
  %v = load atomic i64, ptr %ctr acquire, align 8
  %idx = trunc i64 %v to i32
  %n = load atomic i32, ptr %np monotonic, align 4
  %fn = load atomic ptr, ptr %fnp monotonic, align 8
  %args = load atomic ptr, ptr %argp monotonic, align 8
  %left = icmp ult i32 %idx, %n
  br i1 %left, label %try, label %out
try:
  %v1 = add i64 %v, 1
  %cx = cmpxchg ptr %ctr, i64 %v, i64 %v1 acq_rel acquire
  %ok = extractvalue { i64, i1 } %cx, 1
  br i1 %ok, label %run, label %claim
run:
  call void %fn(ptr %args, i32 %idx, i32 %n)
  %d = atomicrmw add ptr %done, i32 1 release
  br label %claim
out:
  ret void
}
"""


def pool_ir(
    linux: bool = sys.platform.startswith("linux") and os.uname().machine == "x86_64",
) -> str:
    claim = (
        _CLAIM_IR.replace("{CTR}", str(_CTR))
        .replace("{DONE}", str(_DONE))
        .replace("{FN}", str(_FN))
        .replace("{ARGS}", str(_ARGS))
        .replace("{NCHUNKS}", str(_NCHUNKS))
    )
    return f"""
declare i32 @sched_yield()
declare i64 @llvm.readcyclecounter()
declare void @llvm.x86.sse2.pause()
{_sleep_ir(linux)}
{claim}

define void @pool_worker(ptr %st, i32 %tid) {{
entry:
  %gen = getelementptr i8, ptr %st, i64 {_GEN}
  %stop = getelementptr i8, ptr %st, i64 {_STOP}
  %sleepers = getelementptr i8, ptr %st, i64 {_SLEEPERS}
  br label %top
top:
  %seen = phi i32 [0, %entry], [%w_g, %w_go_run]
{_wait_ir("%gen", "%seen", "w", True)}
w_go:
  %stopv = load atomic i32, ptr %stop acquire, align 4
  %is_stop = icmp ne i32 %stopv, 0
  br i1 %is_stop, label %exit, label %w_go_run
w_go_run:
  call void @claim_chunks(ptr %st)
  br label %top
exit:
  ret void
}}

; Post a job of n_chunks chunks, claim chunks here too, return when every chunk is done.
; Chunks, not threads: a descheduled worker costs at most the chunk it holds.
define void @pool_run(ptr %st, ptr %fn, ptr %args, i32 %nchunks) {{
entry:
  %gen = getelementptr i8, ptr %st, i64 {_GEN}
  %ctr = getelementptr i8, ptr %st, i64 {_CTR}
  %done = getelementptr i8, ptr %st, i64 {_DONE}
  %fnp = getelementptr i8, ptr %st, i64 {_FN}
  %argp = getelementptr i8, ptr %st, i64 {_ARGS}
  %np = getelementptr i8, ptr %st, i64 {_NCHUNKS}
  %sleepers = getelementptr i8, ptr %st, i64 {_SLEEPERS}
  %old = load atomic i64, ptr %ctr monotonic, align 8
  %epoch = lshr i64 %old, 32
  %next_epoch = add i64 %epoch, 1
  %hi = shl i64 %next_epoch, 32
  %locked = or i64 %hi, 4294967295
  store atomic i64 %locked, ptr %ctr seq_cst, align 8
  store atomic ptr %fn, ptr %fnp monotonic, align 8
  store atomic ptr %args, ptr %argp monotonic, align 8
  store atomic i32 %nchunks, ptr %np monotonic, align 4
  store atomic i32 0, ptr %done monotonic, align 4
  store atomic i64 %hi, ptr %ctr release, align 8
  %g = atomicrmw add ptr %gen, i32 1 seq_cst
  %sl = load atomic i32, ptr %sleepers seq_cst, align 4
  %any = icmp ne i32 %sl, 0
  br i1 %any, label %wake, label %work
wake:
  call void @wake_all(ptr %gen)
  br label %work
work:
  call void @claim_chunks(ptr %st)
  %t0 = call i64 @llvm.readcyclecounter()
  br label %wait
wait:
  %dv = load atomic i32, ptr %done acquire, align 4
  %all = icmp eq i32 %dv, %nchunks
  br i1 %all, label %exit, label %idle
idle:
  %t = call i64 @llvm.readcyclecounter()
  %el = sub i64 %t, %t0
  %spin = icmp ult i64 %el, {_SPIN_TICKS}
  br i1 %spin, label %do_pause, label %do_yield
do_pause:
  call void @llvm.x86.sse2.pause()
  br label %wait
do_yield:
  %y = call i32 @sched_yield()
  br label %wait
exit:
  ret void
}}

; Stop the workers: set the flag, then bump the generation so they see it.
define void @pool_stop(ptr %st) {{
  %gen = getelementptr i8, ptr %st, i64 {_GEN}
  %stop = getelementptr i8, ptr %st, i64 {_STOP}
  store atomic i32 1, ptr %stop release, align 4
  %old = atomicrmw add ptr %gen, i32 1 seq_cst
  call void @wake_all(ptr %gen)
  ret void
}}
"""


def physical_cores() -> int:
    """Cores this process may run on, counting SMT siblings once (the default thread count)."""
    try:
        cpus = sorted(os.sched_getaffinity(0))
    except AttributeError:
        return max(1, (os.cpu_count() or 2) // 2)
    cores = set()
    for cpu in cpus:
        try:
            siblings = Path(f"/sys/devices/system/cpu/cpu{cpu}/topology/thread_siblings_list")
            cores.add(siblings.read_text().strip())
        except OSError:
            cores.add(str(cpu))
    return max(1, len(cores))


class ThreadPool:
    """`n_threads` native threads (the caller counts as one) running JIT kernels together."""

    def __init__(self, library, n_threads: int | None = None):
        from engine.errors import ConfigValidationError

        n = physical_cores() if n_threads is None else int(n_threads)
        if not 1 <= n <= MAX_THREADS:
            raise ConfigValidationError(
                "n_threads", n_threads, f"an integer from 1 to {MAX_THREADS}"
            )
        self.n_threads = n
        self._state = np.zeros(_STATE_BYTES // 4, dtype=np.int32)
        # Chunks per job: several per thread so whoever is running picks up the slack.
        self.default_chunks = 1 if n == 1 else CHUNKS_PER_THREAD * n
        self._state_ptr = self._state.ctypes.data
        self._run = ctypes.CFUNCTYPE(
            None, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int32
        )(library.address("pool_run"))
        self._stop = ctypes.CFUNCTYPE(None, ctypes.c_void_p)(library.address("pool_stop"))
        worker = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_int32)(
            library.address("pool_worker")
        )
        self._threads = [
            threading.Thread(
                target=worker,
                args=(self._state_ptr, tid),
                daemon=True,
                name=f"localchat-kernel-{tid}",
            )
            for tid in range(1, n)
        ]
        for t in self._threads:
            t.start()
        self._closed = False

    def run(self, kernel_addr: int, args_addr: int, n_chunks: int | None = None) -> None:
        """Run `kernel(args, i, n)` for every chunk i < n (default `default_chunks`) on
        whichever threads are running; returns when all chunks are done."""
        self._run(self._state_ptr, kernel_addr, args_addr, n_chunks or self.default_chunks)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._threads:
            self._stop(self._state_ptr)
            for t in self._threads:
                t.join()

    def __del__(self):
        with contextlib.suppress(Exception):
            self.close()
