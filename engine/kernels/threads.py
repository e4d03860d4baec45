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

Per platform (`PoolTarget`, one `wait_sleep`/`wake_all` interface): the block is a futex on Linux
(x86-64 and AArch64 syscall numbers), `WaitOnAddress`/`WakeByAddressAll` on Windows and
`__ulock_wait`/`__ulock_wake` on macOS; the spin hint is `pause` on x86 and `yield` on AArch64.
The stages are timed by the TSC on x86-64 and by counting idle checks elsewhere (AArch64's cycle
counter traps in user mode). The portable pool (`LOCALCHAT_POOL=portable`, or
`pool_ir(PoolTarget(..., portable=True))`) needs no blocking primitive at all: spin, yield,
then nap 0.5 ms per check; every platform can run it. Verified by running here: Linux x86-64
(futex and portable); the AArch64, macOS and Windows variants are compiled to objects in the
tests, not run.

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
import platform
import sys
import threading
from dataclasses import dataclass
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


@dataclass(frozen=True)
class PoolTarget:
    """What the pool's IR is generated for: the OS (its wait/wake primitive), the architecture
    (its spin hint and clock) and whether to use the portable spin-then-yield waiting instead."""

    os: str  # "linux", "windows", "darwin" or another (portable waiting only)
    arch: str  # "x86_64" or "aarch64" (others: no spin hint)
    portable: bool = False

    @property
    def wait_wake(self) -> str:
        """The blocking primitive: futex, WaitOnAddress, __ulock, or "spin-yield" (none)."""
        if self.portable:
            return "spin-yield"
        return {"linux": "futex", "windows": "WaitOnAddress", "darwin": "ulock"}.get(
            self.os, "spin-yield"
        )


PORTABLE_ENV = "LOCALCHAT_POOL"  # "portable" forces the spin-then-yield pool (tests, triage)


def _os_name(system: str) -> str:
    if system.startswith("linux"):
        return "linux"
    if system in ("win32", "cygwin"):
        return "windows"
    return "darwin" if system == "darwin" else system


def _arch_name(machine: str) -> str:
    machine = machine.lower()
    if machine in ("x86_64", "amd64", "x64"):
        return "x86_64"
    return "aarch64" if machine in ("aarch64", "arm64") else machine


def host_pool_target(portable: bool | None = None) -> PoolTarget:
    """This machine's pool target; portable defaults to LOCALCHAT_POOL=portable."""
    if portable is None:
        portable = os.environ.get(PORTABLE_ENV, "").strip().lower() == "portable"
    return PoolTarget(_os_name(sys.platform), _arch_name(platform.machine()), portable)


def triple_pool_target(triple: str, portable: bool = False) -> PoolTarget:
    """The pool target of an LLVM triple, e.g. "aarch64-unknown-linux-gnu", "arm64-apple-darwin",
    "x86_64-pc-windows-msvc" (cross-compilation checks)."""
    arch = _arch_name(triple.split("-")[0])
    low = triple.lower()
    if "linux" in low:
        system = "linux"
    elif "windows" in low or "win32" in low:
        system = "windows"
    elif "darwin" in low or "macos" in low or "apple" in low:
        system = "darwin"
    else:
        system = low.split("-")[2] if low.count("-") >= 2 else low
    return PoolTarget(system, arch, portable)


# SYS_futex per architecture; FUTEX_WAIT_PRIVATE = 128, FUTEX_WAKE_PRIVATE = 129.
_FUTEX_SYSCALL = {"x86_64": 202, "aarch64": 98}
# __ulock_wait / __ulock_wake (libSystem, macOS 10.12+; what libc++'s atomic wait uses):
# UL_COMPARE_AND_WAIT = 1, ULF_NO_ERRNO = 0x01000000, ULF_WAKE_ALL = 0x100.
_ULOCK_WAIT, _ULOCK_WAKE_ALL = 0x01000001, 0x01000101


def _sleep_ir(target: PoolTarget) -> str:
    """`wait_sleep(ptr gen, i32 seen)`: block until *gen != seen (or return early: callers
    re-check); `wake_all(ptr gen)`: wake every blocked waiter. One interface, per platform."""
    kind = target.wait_wake
    if kind == "futex" and target.arch in _FUTEX_SYSCALL:
        nr = _FUTEX_SYSCALL[target.arch]
        # SYS_futex = 202 on x86-64, FUTEX_WAIT_PRIVATE = 128; returns at once if *gen != seen.
        return f"""
define internal void @wait_sleep(ptr %gen, i32 %seen) {{
  %r = call i64 (i64, ...) @syscall(i64 {nr}, ptr %gen, i32 128, i32 %seen, ptr null)
  ret void
}}
define internal void @wake_all(ptr %gen) {{
  %r = call i64 (i64, ...) @syscall(i64 {nr}, ptr %gen, i32 129, i32 2147483647)
  ret void
}}
declare i64 @syscall(i64, ...)
"""
    if kind == "WaitOnAddress":
        # kernel32/KernelBase (Windows 8+): sleeps while *gen == *compare; INFINITE = -1.
        return """
define internal void @wait_sleep(ptr %gen, i32 %seen) {
  %cmp = alloca i32, align 4
  store i32 %seen, ptr %cmp, align 4
  %r = call i32 @WaitOnAddress(ptr %gen, ptr %cmp, i64 4, i32 -1)
  ret void
}
define internal void @wake_all(ptr %gen) {
  call void @WakeByAddressAll(ptr %gen)
  ret void
}
declare i32 @WaitOnAddress(ptr, ptr, i64, i32)
declare void @WakeByAddressAll(ptr)
"""
    if kind == "ulock":
        return f"""
define internal void @wait_sleep(ptr %gen, i32 %seen) {{
  %v = zext i32 %seen to i64
  %r = call i32 @__ulock_wait(i32 {_ULOCK_WAIT}, ptr %gen, i64 %v, i32 0)
  ret void
}}
define internal void @wake_all(ptr %gen) {{
  %r = call i32 @__ulock_wake(i32 {_ULOCK_WAKE_ALL}, ptr %gen, i64 0)
  ret void
}}
declare i32 @__ulock_wait(i32, ptr, i64, i32)
declare i32 @__ulock_wake(i32, ptr, i64)
"""
    # Portable: nothing to block on, so a waiter naps ~0.5 ms per check (the sleepers poll;
    # wake is a no-op). Idle costs a wake-up every half millisecond, never a spinning core.
    nap = "call void @Sleep(i32 1)" if target.os == "windows" else "%n = call i32 @usleep(i32 500)"
    decl = "declare void @Sleep(i32)" if target.os == "windows" else "declare i32 @usleep(i32)"
    return f"""
define internal void @wait_sleep(ptr %gen, i32 %seen) {{
  {nap}
  ret void
}}
define internal void @wake_all(ptr %gen) {{
  ret void
}}
{decl}
"""


@dataclass(frozen=True)
class _Idle:
    """The per-target pieces of a wait loop: a clock, the spin hint, the yield, the budgets."""

    clock: str  # an instruction producing an i64 that grows while waiting
    hint: str  # the spin-wait hint instruction ("" where there is none)
    yield_: str  # give the core to another runnable thread
    spin: int  # clock units of spinning, then of yielding, before blocking
    yield_until: int
    entry: str = ""  # set-up in the entry block of a function that waits (the portable clock)
    decls: str = ""


# Linux/Windows/macOS on x86-64: the time-stamp counter (~3 GHz) times the stages.
_TSC_IDLE = _Idle(
    clock="call i64 @llvm.readcyclecounter()",
    hint="call void @llvm.x86.sse2.pause()",
    yield_="call i32 @sched_yield()",
    spin=_SPIN_TICKS,
    yield_until=_YIELD_TICKS,
)
# Elsewhere (AArch64's cycle counter traps in user mode; its steady counter's rate varies by
# vendor) and in the portable pool: count idle checks. One check with a pause/yield hint is
# ~30-50 ns, one sched_yield ~1 us: ~2,000 spins (~70 us), ~10,000 yields (~10 ms).
_PORTABLE_SPINS = 2_000
_PORTABLE_YIELDS = 12_000


def _idle(target: PoolTarget) -> _Idle:
    yield_ = "call i32 @SwitchToThread()" if target.os == "windows" else "call i32 @sched_yield()"
    if target == PoolTarget("linux", "x86_64"):
        return _TSC_IDLE  # the pool's original IR text, byte for byte (its JIT cache key)
    hint = {
        "x86_64": "call void @llvm.x86.sse2.pause()",
        "aarch64": "call void @llvm.aarch64.hint(i32 1)",  # YIELD: the SMT/spin-wait hint
    }.get(target.arch, "")
    decls = {
        "x86_64": "declare void @llvm.x86.sse2.pause()",
        "aarch64": "declare void @llvm.aarch64.hint(i32)",
    }.get(target.arch, "")
    decls += (
        "\ndeclare i32 @SwitchToThread()"
        if target.os == "windows"
        else "\ndeclare i32 @sched_yield()"
    )
    if target.arch == "x86_64" and not target.portable:
        return _Idle(
            _TSC_IDLE.clock,
            hint,
            yield_,
            _SPIN_TICKS,
            _YIELD_TICKS,
            decls=decls + "\ndeclare i64 @llvm.readcyclecounter()",
        )
    return _Idle(
        clock="call i64 @tick(ptr %clock)",
        hint=hint,
        yield_=yield_,
        spin=_PORTABLE_SPINS,
        yield_until=_PORTABLE_SPINS + _PORTABLE_YIELDS,
        entry="\n  %clock = alloca i64, align 8\n  store i64 0, ptr %clock, align 8",
        decls=decls
        + """
define internal i64 @tick(ptr %clock) {
  %v = load i64, ptr %clock, align 8
  %v1 = add i64 %v, 1
  store i64 %v1, ptr %clock, align 8
  ret i64 %v1
}""",
    )


def _wait_ir(word: str, seen: str, tag: str, sleep: bool, idle: _Idle = _TSC_IDLE) -> str:
    """Wait until the i32 at `word` differs from `seen`: spin, then yield, then (optionally)
    block in wait_sleep. Falls through to label %{tag}_go with the new value in %{tag}_g."""
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
    hint = f"\n  {idle.hint}" if idle.hint else ""
    return f"""
  %{tag}_t0 = {idle.clock}
  br label %{tag}_wait
{tag}_wait:
  %{tag}_g = load atomic i32, ptr {word} acquire, align 4
  %{tag}_changed = icmp ne i32 %{tag}_g, {seen}
  br i1 %{tag}_changed, label %{tag}_go, label %{tag}_idle
{tag}_idle:
  %{tag}_t = {idle.clock}
  %{tag}_el = sub i64 %{tag}_t, %{tag}_t0
  %{tag}_spin = icmp ult i64 %{tag}_el, {idle.spin}
  br i1 %{tag}_spin, label %{tag}_pause, label %{tag}_not_spin
{tag}_pause:{hint}
  br label %{tag}_wait
{tag}_not_spin:
  %{tag}_yield = icmp ult i64 %{tag}_el, {idle.yield_until}
  br i1 %{tag}_yield, label %{tag}_do_yield, label {after_yield}
{tag}_do_yield:
  %{tag}_y = {idle.yield_}
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


# A job list: several kernels run as ONE pool job (one hand-off, one wait for the slowest
# thread instead of one per kernel), e.g. the q/k/v projections that read the same input. The
# table is i64 [count, then per kernel: fn, args, first chunk, chunks]; chunk c of the job runs
# chunk c - first of the kernel whose range holds it, with that kernel's own chunk count, so
# every kernel sees exactly the (i, n) calls it gets when run alone (same work split, same bits).
_JOB_LIST_IR = """
define void @pool_job_list(ptr %table, i32 %c, i32 %total) {
entry:
  %count = load i64, ptr %table, align 8
  %c64 = sext i32 %c to i64
  br label %scan
scan:
  %j = phi i64 [0, %entry], [%j_next, %next]
  %more = icmp ult i64 %j, %count
  br i1 %more, label %look, label %out
look:
  %base = mul i64 %j, 4
  %slot = add i64 %base, 1
  %fnp = getelementptr i64, ptr %table, i64 %slot
  %argp = getelementptr i64, ptr %fnp, i64 1
  %firstp = getelementptr i64, ptr %fnp, i64 2
  %np = getelementptr i64, ptr %fnp, i64 3
  %first = load i64, ptr %firstp, align 8
  %n = load i64, ptr %np, align 8
  %end = add i64 %first, %n
  %mine = icmp ult i64 %c64, %end
  br i1 %mine, label %run, label %next
next:
  %j_next = add i64 %j, 1
  br label %scan
run:
  %fni = load i64, ptr %fnp, align 8
  %fn = inttoptr i64 %fni to ptr
  %argi = load i64, ptr %argp, align 8
  %args = inttoptr i64 %argi to ptr
  %sub = sub i64 %c64, %first
  %sub32 = trunc i64 %sub to i32
  %n32 = trunc i64 %n to i32
  call void %fn(ptr %args, i32 %sub32, i32 %n32)
  br label %out
out:
  ret void
}
"""
JOB_LIST_FIELDS = 4  # i64 slots per kernel in a job-list table (after the leading count)
STEP_FIELDS = 3  # i64 slots per step in a `pool_run_steps` table: kernel, args, chunks


def job_list_table(jobs: list[tuple[int, int, int]]) -> np.ndarray:
    """The `pool_job_list` table of (kernel address, args address, chunks) triples; run it with
    `ThreadPool.run(job_list_address, table.ctypes.data, sum of the chunks)`."""
    table = np.zeros(1 + JOB_LIST_FIELDS * len(jobs), np.int64)
    table[0] = len(jobs)
    first = 0
    for j, (fn, args, chunks) in enumerate(jobs):
        if chunks < 1:
            raise ValueError(f"job {j} has {chunks} chunks; every kernel needs at least one")
        table[1 + JOB_LIST_FIELDS * j : 1 + JOB_LIST_FIELDS * (j + 1)] = (fn, args, first, chunks)
        first += chunks
    return table


def step_table(steps: list[tuple[int, int, int]]) -> np.ndarray:
    """The `pool_run_steps` table of (kernel address, args address, chunks) steps, chunks 0
    for a call on the running thread; run it with `ThreadPool.run_steps(table address, len)`."""
    table = np.zeros(STEP_FIELDS * max(len(steps), 1), np.int64)
    for j, (fn, args, chunks) in enumerate(steps):
        if chunks < 0:
            raise ValueError(f"step {j} has {chunks} chunks")
        table[STEP_FIELDS * j : STEP_FIELDS * (j + 1)] = (fn, args, chunks)
    return table


def pool_module() -> tuple[str, str]:
    """(cache name, IR) of this machine's pool: the portable one has its own name so that
    switching LOCALCHAT_POOL does not evict the other's cache entry."""
    target = host_pool_target()
    return ("pool_portable" if target.portable else "pool"), pool_ir(target)


def pool_ir(target: PoolTarget | None = None) -> str:
    """The pool module for `target` (default: this machine, LOCALCHAT_POOL honoured)."""
    target = target or host_pool_target()
    idle = _idle(target)
    claim = (
        _CLAIM_IR.replace("{CTR}", str(_CTR))
        .replace("{DONE}", str(_DONE))
        .replace("{FN}", str(_FN))
        .replace("{ARGS}", str(_ARGS))
        .replace("{NCHUNKS}", str(_NCHUNKS))
    )
    header = (
        "declare i32 @sched_yield()\ndeclare i64 @llvm.readcyclecounter()\n"
        "declare void @llvm.x86.sse2.pause()"
        if idle is _TSC_IDLE
        else idle.decls
    )
    return f"""
{header}
{_sleep_ir(target)}
{claim}
{_JOB_LIST_IR}

define void @pool_worker(ptr %st, i32 %tid) {{
entry:
  %gen = getelementptr i8, ptr %st, i64 {_GEN}
  %stop = getelementptr i8, ptr %st, i64 {_STOP}
  %sleepers = getelementptr i8, ptr %st, i64 {_SLEEPERS}{idle.entry}
  br label %top
top:
  %seen = phi i32 [0, %entry], [%w_g, %w_go_run]
{_wait_ir("%gen", "%seen", "w", True, idle)}
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
  %sleepers = getelementptr i8, ptr %st, i64 {_SLEEPERS}{idle.entry}
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
  %t0 = {idle.clock}
  br label %wait
wait:
  %dv = load atomic i32, ptr %done acquire, align 4
  %all = icmp eq i32 %dv, %nchunks
  br i1 %all, label %exit, label %idle
idle:
  %t = {idle.clock}
  %el = sub i64 %t, %t0
  %spin = icmp ult i64 %el, {idle.spin}
  br i1 %spin, label %do_pause, label %do_yield
do_pause:{f"{chr(10)}  {idle.hint}" if idle.hint else ""}
  br label %wait
do_yield:
  %y = {idle.yield_}
  br label %wait
exit:
  ret void
}}

; Run a list of steps in order: an i64 table of (kernel, args, chunks) per step; chunks 0 calls
; kernel(args, 0, 1) on this thread, else the step is a pool job of that many chunks. A decode
; step's per-layer sequence of kernels then costs one call from Python, not one per kernel.
define void @pool_run_steps(ptr %st, ptr %table, i64 %count) {{
entry:
  br label %head
head:
  %i = phi i64 [0, %entry], [%i_next, %next]
  %more = icmp ult i64 %i, %count
  br i1 %more, label %body, label %exit
body:
  %base = mul i64 %i, {STEP_FIELDS}
  %fnp = getelementptr i64, ptr %table, i64 %base
  %argp = getelementptr i64, ptr %fnp, i64 1
  %chp = getelementptr i64, ptr %fnp, i64 2
  %fni = load i64, ptr %fnp, align 8
  %fn = inttoptr i64 %fni to ptr
  %argi = load i64, ptr %argp, align 8
  %args = inttoptr i64 %argi to ptr
  %chunks = load i64, ptr %chp, align 8
  %direct = icmp eq i64 %chunks, 0
  br i1 %direct, label %here, label %pooled
here:
  call void %fn(ptr %args, i32 0, i32 1)
  br label %next
pooled:
  %c32 = trunc i64 %chunks to i32
  call void @pool_run(ptr %st, ptr %fn, ptr %args, i32 %c32)
  br label %next
next:
  %i_next = add i64 %i, 1
  br label %head
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
        self._run_steps = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64)(
            library.address("pool_run_steps")
        )
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

    def run_steps(self, table_addr: int, count: int) -> None:
        """Run the `count` steps of a `pool_run_steps` table (STEP_FIELDS i64 per step) in
        order; returns when the last one is done."""
        self._run_steps(self._state_ptr, table_addr, count)

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
