"""Native worker pool: threads created once, work split inside JIT code, a spin-then-block barrier.

A Python `threading.Barrier` round trip costs ~38 us, which is more than a whole small mat-vec,
so the hand-off between threads lives in machine code (the IR below):

  * the caller posts (kernel, args) into a shared state block and bumps a generation counter;
  * each worker (a Python thread parked inside `pool_worker`, i.e. in native code without the
    GIL, because ctypes releases it) notices the new generation, runs `kernel(args, tid, n)`
    and increments a done counter; the caller runs share 0 itself and waits for the others.

Waiting is staged so the engine degrades gracefully when other processes hold the cores:
spin with `pause` for ~0.1 ms (the common case between two kernels of one token), then
`sched_yield` for up to ~10 ms (between tokens), then sleep on a futex (an idle app costs
nothing). A pure spin barrier collapses when the cores are oversubscribed.

Why Python threads and not pthreads created from JIT code: both leave the hot path entirely in
native code; Python threads need no libpthread symbol resolution in MCJIT and shut down cleanly
with the interpreter, and the measured hand-off cost is the same (it is the atomic counter).

Every kernel run on the pool has the C signature `void kernel(void *args, i32 tid, i32 n)` and
splits its own work by (tid, n).
"""

from __future__ import annotations

import ctypes
import os
import sys
import threading
from pathlib import Path

import numpy as np

# Offsets (bytes) into the 512-byte state block; hot fields sit on separate cache lines.
_GEN, _DONE, _STOP, _FN, _ARGS, _NTHREADS, _SLEEPERS = 0, 64, 128, 192, 200, 208, 256
_STATE_BYTES = 512

# Cycle budgets (TSC ticks, ~3 GHz): spin ~70 us, then yield until ~10 ms, then block.
_SPIN_TICKS = 200_000
_YIELD_TICKS = 30_000_000

KERNEL_FN = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_int32, ctypes.c_int32)


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


def pool_ir(linux: bool = sys.platform.startswith("linux") and os.uname().machine == "x86_64") -> str:
    return f"""
declare i32 @sched_yield()
declare i64 @llvm.readcyclecounter()
declare void @llvm.x86.sse2.pause()
{_sleep_ir(linux)}

define void @pool_worker(ptr %st, i32 %tid) {{
entry:
  %gen = getelementptr i8, ptr %st, i64 {_GEN}
  %done = getelementptr i8, ptr %st, i64 {_DONE}
  %stop = getelementptr i8, ptr %st, i64 {_STOP}
  %fnp = getelementptr i8, ptr %st, i64 {_FN}
  %argp = getelementptr i8, ptr %st, i64 {_ARGS}
  %np = getelementptr i8, ptr %st, i64 {_NTHREADS}
  %sleepers = getelementptr i8, ptr %st, i64 {_SLEEPERS}
  br label %wait_start
wait_start:
  %seen = phi i32 [0, %entry], [%g_now, %run]
  %t0 = call i64 @llvm.readcyclecounter()
  br label %wait
wait:
  %g = load atomic i32, ptr %gen acquire, align 4
  %changed = icmp ne i32 %g, %seen
  br i1 %changed, label %got, label %idle
idle:
  %t = call i64 @llvm.readcyclecounter()
  %el = sub i64 %t, %t0
  %spin = icmp ult i64 %el, {_SPIN_TICKS}
  br i1 %spin, label %do_pause, label %not_spin
do_pause:
  call void @llvm.x86.sse2.pause()
  br label %wait
not_spin:
  %yield = icmp ult i64 %el, {_YIELD_TICKS}
  br i1 %yield, label %do_yield, label %do_sleep
do_yield:
  %y = call i32 @sched_yield()
  br label %wait
do_sleep:
  %s1 = atomicrmw add ptr %sleepers, i32 1 seq_cst
  %g2 = load atomic i32, ptr %gen seq_cst, align 4
  %still = icmp eq i32 %g2, %seen
  br i1 %still, label %sleep, label %woke
sleep:
  call void @wait_sleep(ptr %gen, i32 %seen)
  br label %woke
woke:
  %s2 = atomicrmw sub ptr %sleepers, i32 1 seq_cst
  br label %wait
got:
  %stopv = load atomic i32, ptr %stop acquire, align 4
  %is_stop = icmp ne i32 %stopv, 0
  br i1 %is_stop, label %exit, label %run
run:
  %g_now = phi i32 [%g, %got]
  %fn = load ptr, ptr %fnp, align 8
  %args = load ptr, ptr %argp, align 8
  %n = load i32, ptr %np, align 4
  call void %fn(ptr %args, i32 %tid, i32 %n)
  %d = atomicrmw add ptr %done, i32 1 release
  br label %wait_start
exit:
  ret void
}}

; Post a job, run share 0 here, wait for the other n-1 shares.
define void @pool_run(ptr %st, ptr %fn, ptr %args) {{
entry:
  %gen = getelementptr i8, ptr %st, i64 {_GEN}
  %done = getelementptr i8, ptr %st, i64 {_DONE}
  %fnp = getelementptr i8, ptr %st, i64 {_FN}
  %argp = getelementptr i8, ptr %st, i64 {_ARGS}
  %np = getelementptr i8, ptr %st, i64 {_NTHREADS}
  %sleepers = getelementptr i8, ptr %st, i64 {_SLEEPERS}
  %n = load i32, ptr %np, align 4
  store ptr %fn, ptr %fnp, align 8
  store ptr %args, ptr %argp, align 8
  store atomic i32 0, ptr %done release, align 4
  %old = atomicrmw add ptr %gen, i32 1 seq_cst
  %sl = load atomic i32, ptr %sleepers seq_cst, align 4
  %any = icmp ne i32 %sl, 0
  br i1 %any, label %wake, label %work
wake:
  call void @wake_all(ptr %gen)
  br label %work
work:
  call void %fn(ptr %args, i32 0, i32 %n)
  %others = sub i32 %n, 1
  %t0 = call i64 @llvm.readcyclecounter()
  br label %wait
wait:
  %dv = load atomic i32, ptr %done acquire, align 4
  %all = icmp eq i32 %dv, %others
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

; Stop the workers: set the flag, then post an empty generation so they see it.
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
        if not 1 <= n <= 256:
            raise ConfigValidationError("n_threads", n_threads, "an integer from 1 to 256")
        self.n_threads = n
        self._state = np.zeros(_STATE_BYTES // 4, dtype=np.int32)
        self._state[_NTHREADS // 4] = n
        self._state_ptr = self._state.ctypes.data
        self._run = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p)(
            library.address("pool_run"))
        self._stop = ctypes.CFUNCTYPE(None, ctypes.c_void_p)(library.address("pool_stop"))
        worker = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_int32)(library.address("pool_worker"))
        self._threads = [
            threading.Thread(target=worker, args=(self._state_ptr, tid), daemon=True,
                             name=f"localchat-kernel-{tid}")
            for tid in range(1, n)
        ]
        for t in self._threads:
            t.start()
        self._closed = False

    def run(self, kernel_addr: int, args_addr: int) -> None:
        """Run `kernel(args, tid, n)` on every thread; returns when all shares are done."""
        self._run(self._state_ptr, kernel_addr, args_addr)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._threads:
            self._stop(self._state_ptr)
            for t in self._threads:
                t.join()

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass
