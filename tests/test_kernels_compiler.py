"""The JIT compiler: IR -> callable code, and the object cache that makes later launches fast."""

import ctypes

import pytest

from engine.kernels.compiler import KernelCompileError, KernelLibrary

ADD_ONE = """
define i64 @add_one(i64 %x) {
  %y = add i64 %x, 1
  ret i64 %y
}
"""


def _call_add_one(lib: KernelLibrary, x: int) -> int:
    return ctypes.CFUNCTYPE(ctypes.c_int64, ctypes.c_int64)(lib.address("add_one"))(x)


def test_compiles_then_loads_from_cache(tmp_path):
    progress = []
    first = KernelLibrary(cache_dir=tmp_path)
    first.add_modules([("add", ADD_ONE)], progress=lambda s, f: progress.append((s, f)))
    assert _call_add_one(first, 41) == 42
    assert (first.stats.compiled, first.stats.loaded) == (1, 0)
    assert progress == [("kernels: compiling add", 1.0)]
    assert len(list(tmp_path.glob("add-*.o"))) == 1

    progress.clear()
    second = KernelLibrary(cache_dir=tmp_path)
    second.add_modules([("add", ADD_ONE)], progress=lambda s, f: progress.append((s, f)))
    assert (second.stats.compiled, second.stats.loaded) == (0, 1)
    assert progress == [("kernels: loading cached add", 1.0)]
    assert _call_add_one(second, -1) == 0


def test_changed_ir_gets_a_new_cache_entry(tmp_path):
    lib = KernelLibrary(cache_dir=tmp_path)
    assert lib.cache_key(ADD_ONE) != lib.cache_key(ADD_ONE.replace("1", "2"))


def test_invalid_ir_is_a_typed_error(tmp_path):
    lib = KernelLibrary(cache_dir=tmp_path)
    with pytest.raises(KernelCompileError, match="broken"):
        lib.add_modules([("broken", "define i64 @f( {")])


def test_unknown_symbol_is_a_typed_error(tmp_path):
    lib = KernelLibrary(cache_dir=tmp_path)
    lib.add_modules([("add", ADD_ONE)])
    with pytest.raises(KernelCompileError, match="nope"):
        lib.address("nope")


def test_backend_falls_back_to_numpy_with_a_warning(monkeypatch):
    from engine.kernels import backend, jit_backend

    def broken(progress=None):
        raise KernelCompileError("kernel module 'mm_Q4_0_vnni' is invalid LLVM IR: test")

    monkeypatch.setattr(jit_backend, "shared_library", broken)
    with pytest.warns(RuntimeWarning, match="invalid LLVM IR"):
        chosen = backend.get_backend(n_threads=1)
    assert chosen.name == "numpy"


def test_environment_switch_forces_numpy(monkeypatch):
    from engine.kernels import backend

    monkeypatch.setenv("LOCALCHAT_KERNELS", "numpy")
    assert backend.get_backend().name == "numpy"
    monkeypatch.delenv("LOCALCHAT_KERNELS")
    jit = backend.get_backend(n_threads=1)
    assert jit.name == "jit"
    jit.close()


def test_a_rebuilt_module_replaces_its_stale_cache_entry(tmp_path):
    KernelLibrary(cache_dir=tmp_path).add_modules([("add", ADD_ONE)])
    changed = ADD_ONE.replace("add i64 %x, 1", "add i64 %x, 2")
    lib = KernelLibrary(cache_dir=tmp_path)
    lib.add_modules([("add", changed), ("keep", ADD_ONE.replace("@add_one", "@other"))])
    assert _call_add_one(lib, 40) == 42
    names = sorted(p.name for p in tmp_path.glob("*.o"))
    assert len(names) == 2 and names[0].startswith("add-") and names[1].startswith("keep-")
    assert names[0] == f"add-{lib.cache_key(changed)}.o"
