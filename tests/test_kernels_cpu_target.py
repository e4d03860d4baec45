"""LOCALCHAT_CPU: compile the kernels as if on another CPU, so this machine runs (and tests) every
instruction-set path: AVX-512 VNNI, AVX2 and generic x86-64.

The logits of each path are checked against the numpy reference backend on tiny models; a path
is skipped only where this host cannot execute it (AVX-512 code on an AVX2-only machine)."""

import platform
from pathlib import Path

import numpy as np
import pytest
from gguf import GGMLQuantizationType as Q

from engine.errors import ConfigValidationError
from engine.gguf import open_gguf
from engine.kernels import backend as backend_module
from engine.kernels.compiler import (
    CPU_ENV,
    CpuSelectionError,
    KernelLibrary,
    host_cpu,
    named_cpu,
    target_cpu,
)
from engine.kernels.jit_backend import JitBackend, select_isa
from engine.kernels.reference import ReferenceBackend
from engine.load_summary import kernel_path, planned_kernel_path
from engine.models import build_model

pytestmark = pytest.mark.skipif(
    platform.machine().lower() not in ("x86_64", "amd64"), reason="x86-64 CPU names"
)

FIXTURES = Path(__file__).parent / "fixtures"
# (LLVM CPU, the path it must select): one CPU per path, each a real product family.
PATHS = [("znver4", "vnni"), ("haswell", "avx2"), ("x86-64-v2", "generic")]
_RANK = {"generic": 0, "avx2": 1, "vnni": 2}


def _host_runs(isa: str) -> bool:
    return _RANK[select_isa(host_cpu())] >= _RANK[isa]


@pytest.mark.parametrize(("cpu", "isa"), PATHS)
def test_named_cpu_selects_its_instruction_set(cpu, isa):
    chosen = named_cpu(cpu)
    assert select_isa(chosen) == isa
    assert chosen.label() == f"{cpu} ({CPU_ENV})"


def test_named_cpu_features_come_from_llvm_not_the_host():
    # Haswell has AVX2/FMA/F16C and no AVX-512 whatever this machine has.
    haswell = named_cpu("haswell")
    assert haswell.has("avx2") and haswell.has("fma") and haswell.has("f16c")
    assert not haswell.has("avx512f") and not haswell.has("avx512vnni")
    assert not named_cpu("x86-64-v2").has("avx")
    v4 = named_cpu("x86-64-v4")  # AVX-512 F/BW/VL, but no VNNI: the AVX2 dot product
    assert v4.has("avx512vl") and not v4.has("avx512vnni") and select_isa(v4) == "avx2"


@pytest.mark.parametrize("value", ["bogus-cpu", "haswell;rm", "pentium9000"])
def test_an_unknown_cpu_is_a_typed_error_naming_the_variable(monkeypatch, value):
    monkeypatch.setenv(CPU_ENV, value)
    with pytest.raises(CpuSelectionError) as caught:
        target_cpu()
    assert caught.value.field == CPU_ENV and caught.value.value == value
    assert CPU_ENV in str(caught.value) and value in str(caught.value)
    # A bad setting stops the load; it is not a reason to run the numpy kernels silently.
    with pytest.raises(ConfigValidationError, match=CPU_ENV):
        backend_module.get_backend(n_threads=1)
    with pytest.raises(CpuSelectionError):
        planned_kernel_path()


def test_unset_or_empty_means_the_host(monkeypatch):
    monkeypatch.setenv(CPU_ENV, "  ")
    assert target_cpu() == host_cpu() and target_cpu().source == "host"
    monkeypatch.delenv(CPU_ENV)
    assert target_cpu().label() == host_cpu().name


def test_the_cpu_keys_the_signed_cache(tmp_path, monkeypatch):
    # "host" is the unnamed library: with LOCALCHAT_CPU=haswell in the environment (how the AVX2
    # path is run here) it would be haswell too and the two keys would rightly be equal.
    monkeypatch.delenv(CPU_ENV, raising=False)
    ir = "define i32 @seven() {\n  ret i32 7\n}\n"
    host = KernelLibrary(cache_dir=tmp_path / "jit")
    haswell = KernelLibrary(cpu=named_cpu("haswell"), cache_dir=tmp_path / "jit")
    assert host.cache_key(ir) != haswell.cache_key(ir)
    haswell.add_modules([("seven", ir)])
    entries = list((tmp_path / "jit").glob("*seven-*.jit"))
    assert [e.name for e in entries] == [f"haswell.seven-{haswell.cache_key(ir)}.jit"]
    assert entries[0].read_bytes().startswith(b"LCJIT1\0")  # signed, like every entry
    again = KernelLibrary(cpu=named_cpu("haswell"), cache_dir=tmp_path / "jit")
    again.add_modules([("seven", ir)])
    assert (again.stats.loaded, again.stats.compiled) == (1, 0)


@pytest.fixture(scope="module")
def q4k_llama(tiny_model_factory):
    # Q4_K (a K-quant: 256-wide blocks) and the Q8_0 of the packaged fixture cover both families.
    return tiny_model_factory(
        "llama", Q.Q4_K, seed=5, d_model=256, d_ff=512, n_heads=4, head_dim=64
    )


@pytest.mark.parametrize(("cpu", "isa"), PATHS)
def test_each_path_matches_the_numpy_reference_on_tiny_models(monkeypatch, cpu, isa, q4k_llama):
    if not _host_runs(isa):
        pytest.skip(f"this CPU cannot execute the {isa} path")
    monkeypatch.setenv(CPU_ENV, cpu)
    jit = JitBackend(n_threads=2)
    try:
        assert jit.isa == isa and jit.library.cpu.name == cpu
        assert kernel_path(jit).endswith(f"CPU {cpu} ({CPU_ENV})")
        tokens = [1, 17, 200, 5, 42, 9, 77, 100, 3]
        for path in (FIXTURES / "tiny_llama.gguf", q4k_llama):
            gguf_file = open_gguf(path)
            fast = build_model(gguf_file, backend=jit)
            slow = build_model(gguf_file, backend=ReferenceBackend())
            fc, sc = fast.new_cache(16), slow.new_cache(16)
            got = [fast.forward(tokens[:6], fc)] + [fast.forward([t], fc) for t in tokens[6:]]
            want = [slow.forward(tokens[:6], sc)] + [slow.forward([t], sc) for t in tokens[6:]]
            for g, w in zip(got, want, strict=True):
                # int8 activations move logits by ~1.5% of their range (test_kernels_model.py)
                np.testing.assert_allclose(g, w, atol=0.04 * np.abs(w).max(), rtol=0)
    finally:
        jit.close()


CONVERT_IR = """
define void @widen(ptr %src, ptr %dst, i64 %n) {
entry:
  br label %loop
loop:
  %i = phi i64 [0, %entry], [%i1, %loop]
  %ps = getelementptr half, ptr %src, i64 %i
  %h = load half, ptr %ps
  %f = fpext half %h to float
  %pd = getelementptr float, ptr %dst, i64 %i
  store float %f, ptr %pd
  %i1 = add i64 %i, 1
  %more = icmp ult i64 %i1, %n
  br i1 %more, label %loop, label %done
done:
  ret void
}
"""


def test_without_f16c_every_half_widens_exactly(tmp_path):
    """x86-64-v2 has no F16C: LLVM calls __extendhfsf2, which the process lacks (before the
    soft_half module the pool's own relocations were left at 0 and it jumped there)."""
    import ctypes

    cpu = named_cpu("x86-64-v2")
    assert not cpu.has("f16c")
    lib = KernelLibrary(cpu=cpu, cache_dir=tmp_path / "jit")
    lib.add_modules([("widen", CONVERT_IR)])
    halves = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16)
    out = np.zeros(halves.size, np.float32)
    fn = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64)
    fn(lib.address("widen"))(halves.ctypes.data, out.ctypes.data, halves.size)
    want = halves.view(np.float16).astype(np.float32)
    nan = np.isnan(want)
    assert np.array_equal(np.isnan(out), nan)
    assert np.array_equal(out[~nan].view(np.uint32), want[~nan].view(np.uint32))  # -0.0 too


def test_a_named_cpu_never_evicts_the_hosts_cache_entries(tmp_path, monkeypatch):
    monkeypatch.delenv(CPU_ENV, raising=False)  # the host's own entries, whatever the caller set
    ir = "define i32 @eight() {\n  ret i32 8\n}\n"
    cache = tmp_path / "jit"
    KernelLibrary(cache_dir=cache).add_modules([("eight", ir)])
    KernelLibrary(cpu=named_cpu("haswell"), cache_dir=cache).add_modules([("eight", ir)])
    KernelLibrary(cpu=named_cpu("x86-64-v2"), cache_dir=cache).add_modules([("eight", ir)])
    assert len(list(cache.glob("*eight-*.jit"))) == 3
    host = KernelLibrary(cache_dir=cache)
    host.add_modules([("eight", ir)])
    assert (host.stats.loaded, host.stats.compiled) == (1, 0)


def test_a_cpu_with_features_this_machine_lacks_is_refused(monkeypatch):
    """Code for AVX-512 on an AVX2 machine would die of SIGILL in the first kernel."""
    from engine.kernels import compiler

    avx2_only = compiler.HostCPU("haswell", named_cpu("haswell").features)
    monkeypatch.setattr(compiler, "host_cpu", lambda: avx2_only)
    monkeypatch.setenv(CPU_ENV, "znver4")
    with pytest.raises(CpuSelectionError, match="avx512") as caught:
        target_cpu()
    assert caught.value.field == CPU_ENV and caught.value.value == "znver4"
    monkeypatch.setenv(CPU_ENV, "x86-64-v2")  # older CPUs are fine
    assert target_cpu().name == "x86-64-v2"


FMA_IR = """
define float @mad(float %a, float %b, float %c) {
  %r = call float @llvm.fma.f32(float %a, float %b, float %c)
  ret float %r
}
declare float @llvm.fma.f32(float, float, float)
"""


def test_without_an_fma_unit_no_libm_fmaf_call_per_element(tmp_path):
    """llvm.fma must be exact, so a CPU without FMA gets a libm fmaf call for every element
    (the generic F32 mat-vec was 28x slower for it); the kernels' llvm.fma becomes fmuladd."""
    import ctypes

    lib = KernelLibrary(cpu=named_cpu("x86-64-v2"), cache_dir=tmp_path / "jit")
    lib.add_modules([("mad", FMA_IR)])
    (entry,) = (tmp_path / "jit").glob("*mad-*.jit")
    assert b"fmaf" not in entry.read_bytes()
    mad = ctypes.CFUNCTYPE(ctypes.c_float, ctypes.c_float, ctypes.c_float, ctypes.c_float)
    assert mad(lib.address("mad"))(1.5, 2.0, 0.25) == 3.25
    host = KernelLibrary(cache_dir=tmp_path / "host")
    host.add_modules([("mad", FMA_IR)])
    assert host.cpu.has("fma") == (not host._soft_fma)  # the host keeps its exact fma
