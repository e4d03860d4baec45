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
    assert len(list(tmp_path.glob("add-*"))) == 1

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
    names = sorted(p.name for p in tmp_path.glob("*-*"))
    assert len(names) == 2 and names[0].startswith("add-") and names[1].startswith("keep-")
    assert names[0] == f"add-{lib.cache_key(changed)}.jit"


# --- the object cache is authenticated: a damaged or planted entry is never run ----------------
_LOAD_IN_CHILD = """
import ctypes, json, sys
from pathlib import Path
from engine.kernels.compiler import KernelLibrary
lib = KernelLibrary(cache_dir=Path(sys.argv[1]))
lib.add_modules([("add", sys.argv[2])])
fn = ctypes.CFUNCTYPE(ctypes.c_int64, ctypes.c_int64)(lib.address("add_one"))
print(json.dumps({"compiled": lib.stats.compiled, "loaded": lib.stats.loaded, "result": fn(41)}))
"""


def _load_in_child(cache_dir, ir_text=ADD_ONE) -> dict:
    """Build the library in a fresh process, where running a bad object shows as a signal (a
    negative return code) instead of killing pytest."""
    import json
    import os
    import subprocess
    import sys

    done = subprocess.run(
        [sys.executable, "-c", _LOAD_IN_CHILD, str(cache_dir), ir_text],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
    )
    assert done.returncode == 0, f"child exited with {done.returncode}: {done.stderr[-2000:]}"
    return json.loads(done.stdout.strip().splitlines()[-1])


def _damage_truncate(entry: bytes) -> bytes:
    return entry[: len(entry) // 2]


def _damage_zero(entry: bytes) -> bytes:
    return bytes(len(entry))


def _damage_flip_bit(entry: bytes) -> bytes:
    damaged = bytearray(entry)
    damaged[len(damaged) * 3 // 4] ^= 0x10  # inside the object's code/sections, past every header
    return bytes(damaged)


@pytest.mark.parametrize("damage", [_damage_truncate, _damage_zero, _damage_flip_bit])
def test_a_damaged_cache_entry_is_rejected_and_recompiled(tmp_path, damage):
    cache = tmp_path / "jit"
    assert _load_in_child(cache) == {"compiled": 1, "loaded": 0, "result": 42}
    (entry,) = cache.glob("add-*")
    entry.write_bytes(damage(entry.read_bytes()))
    assert _load_in_child(cache) == {"compiled": 1, "loaded": 0, "result": 42}
    assert _load_in_child(cache) == {"compiled": 0, "loaded": 1, "result": 42}  # healed


def test_a_planted_object_under_the_right_name_is_not_run(tmp_path):
    cache = tmp_path / "jit"
    other = tmp_path / "other"
    evil_ir = ADD_ONE.replace("add i64 %x, 1", "add i64 %x, 1000")
    assert _load_in_child(other, evil_ir)["result"] == 1041
    assert _load_in_child(cache)["result"] == 42
    (entry,) = cache.glob("add-*")
    (planted,) = other.glob("add-*")  # signed with the same install key, for another IR
    entry.write_bytes(planted.read_bytes())
    assert _load_in_child(cache) == {"compiled": 1, "loaded": 0, "result": 42}


def test_a_raw_object_file_is_not_run(tmp_path):
    """An attacker without the key can only plant a bare object (or the old unsigned format)."""
    import llvmlite.binding as llvm

    lib = KernelLibrary(cache_dir=tmp_path / "scratch")
    module = llvm.parse_assembly(ADD_ONE.replace("add i64 %x, 1", "add i64 %x, 1000"))
    cache = tmp_path / "jit"
    assert _load_in_child(cache)["result"] == 42
    (entry,) = cache.glob("add-*")
    entry.write_bytes(lib._tm_for_emit.emit_object(module))
    assert _load_in_child(cache) == {"compiled": 1, "loaded": 0, "result": 42}


def test_cache_files_are_private(tmp_path):
    import stat

    cache = tmp_path / "cache" / "jit"
    KernelLibrary(cache_dir=cache).add_modules([("add", ADD_ONE)])
    (entry,) = cache.glob("add-*")
    key = tmp_path / "cache" / "jit.key"
    assert stat.S_IMODE(entry.stat().st_mode) == 0o600
    assert stat.S_IMODE(key.stat().st_mode) == 0o600
    assert stat.S_IMODE(cache.stat().st_mode) == 0o700
    assert stat.S_IMODE((tmp_path / "cache").stat().st_mode) == 0o700


def test_an_unwritable_cache_or_unreadable_key_compiles_in_memory(tmp_path):
    # A regular file where a directory should be fails for root too (permission bits do not).
    blocker = tmp_path / "blocker"
    blocker.write_bytes(b"")
    lib = KernelLibrary(cache_dir=blocker / "jit")
    lib.add_modules([("add", ADD_ONE)])
    assert _call_add_one(lib, 1) == 2 and lib.stats.compiled == 1

    cache = tmp_path / "rw" / "jit"
    KernelLibrary(cache_dir=cache).add_modules([("add", ADD_ONE)])
    key = tmp_path / "rw" / "jit.key"
    key.unlink()
    key.mkdir()  # unreadable as a file
    lib = KernelLibrary(cache_dir=cache)
    lib.add_modules([("add", ADD_ONE)])
    assert _call_add_one(lib, 1) == 2 and (lib.stats.compiled, lib.stats.loaded) == (1, 0)


def test_a_cache_dir_left_world_readable_by_an_older_build_is_made_private(tmp_path):
    import stat

    cache = tmp_path / "jit"
    cache.mkdir(mode=0o755)
    cache.chmod(0o755)
    KernelLibrary(cache_dir=cache).add_modules([("add", ADD_ONE)])
    assert stat.S_IMODE(cache.stat().st_mode) == 0o700
