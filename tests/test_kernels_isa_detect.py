"""Choosing the dot-product path from the host CPU: LLVM's feature map, reconciled with the
flags the OS reports (a fake feature map and a fake /proc/cpuinfo stand in for other machines)."""

import llvmlite.binding as llvm

from engine.kernels.compiler import (
    HostCPU,
    host_cpu,
    os_cpu_flags,
    reconcile_features,
)
from engine.kernels.jit_backend import select_isa

# The flags line of this machine's /proc/cpuinfo (AMD Zen 5 VM, 2026-12-01), abridged.
CPUINFO = """processor\t: 0
vendor_id\t: AuthenticAMD
model name\t: AMD EPYC
flags\t\t: fpu sse sse2 ssse3 fma sse4_1 sse4_2 avx f16c avx2 avx512f avx512dq avx512cd \
avx512bw avx512vl avx_vnni avx512_bf16 avx512vbmi avx512_vbmi2 gfni avx512_vnni avx512_bitalg
bugs\t\t: sysret_ss_attrs

processor\t: 1
flags\t\t: fpu
"""

# What LLVM reports for such a CPU (the names it uses; "-" = absent).
LLVM_FULL = {
    "sse4.2": True,
    "avx": True,
    "avx2": True,
    "fma": True,
    "f16c": True,
    "avx512f": True,
    "avx512bw": True,
    "avx512vl": True,
    "avx512vnni": True,
    "avxvnni": True,
    "amx-tile": False,
}


def _isa(features: dict, os_flags) -> str:
    return select_isa(HostCPU("fake", reconcile_features(features, os_flags)[0]))


def test_cpuinfo_flags_are_read_from_the_first_processor():
    flags = os_cpu_flags(CPUINFO)
    assert {"avx512_vnni", "avx512vl", "avx2"} <= flags and "fpu" in flags
    assert os_cpu_flags("processor : 0\n") is None


def test_full_feature_map_gives_vnni_and_is_left_exactly_as_llvm_flattens_it():
    features, added = reconcile_features(LLVM_FULL, os_cpu_flags(CPUINFO))
    assert added == [] and features == llvm.FeatureMap(LLVM_FULL).flatten()
    assert _isa(LLVM_FULL, os_cpu_flags(CPUINFO)) == "vnni"


def test_avx512_vnni_missing_from_llvm_but_reported_by_the_os_still_selects_vnni():
    """The reported bug: `JIT avx2` on an AVX-512 VNNI machine. If LLVM's map lacks
    avx512vnni/avx512vl, the kernel's flags (which Linux clears when it does not save the ZMM
    state) put them back, and the target machine is told so (the string carries them)."""
    llvm_missed = dict(LLVM_FULL, avx512vnni=False, avx512vl=False)
    assert _isa(llvm_missed, None) == "avx2"  # what happened before
    features, added = reconcile_features(llvm_missed, os_cpu_flags(CPUINFO))
    assert sorted(added) == ["avx512vl", "avx512vnni"]
    assert "+avx512vnni" in features.split(",") and "+avx512vl" in features.split(",")
    assert _isa(llvm_missed, os_cpu_flags(CPUINFO)) == "vnni"


def test_the_os_never_takes_a_feature_away():
    # A kernel booted with clearcpuid=... hides a flag; LLVM's own detection still counts.
    assert _isa(LLVM_FULL, frozenset({"fpu", "sse2"})) == "vnni"
    no_avx512 = {k: v and not k.startswith("avx512") for k, v in LLVM_FULL.items()}
    assert _isa(no_avx512, frozenset({"avx2"})) == "avx2"
    assert _isa(dict.fromkeys(LLVM_FULL, False), None) == "generic"


def test_this_host_uses_llvms_string_unless_the_os_reports_more():
    features, added = reconcile_features(llvm.get_host_cpu_features(), os_cpu_flags())
    assert host_cpu().features == features
    if not added:
        assert features == llvm.get_host_cpu_features().flatten()
