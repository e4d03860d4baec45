"""The CPU a kernel test compiles for: the host, or an LLVM CPU named like LOCALCHAT_CPU
(haswell for the AVX2 path, x86-64-v2 for the generic one), or a skip where this machine cannot
run that code."""

from __future__ import annotations

import pytest

from engine.kernels.compiler import CPU_ENV, CpuSelectionError, target_cpu


def target_or_skip(cpu: str | None, monkeypatch, *, vnni_host: bool = False):
    """The target for `cpu` (None: the host). vnni_host: skip when the host (cpu None) has no
    AVX512-VNNI, for tests of the VNNI path itself."""
    if cpu is not None:
        monkeypatch.setenv(CPU_ENV, cpu)
    try:
        target = target_cpu()
    except CpuSelectionError as exc:
        pytest.skip(f"this CPU cannot run {cpu} code: {exc}")
    if vnni_host and cpu is None and not (target.has("avx512vnni") and target.has("avx512vl")):
        pytest.skip("the host has no AVX512-VNNI")
    return target
