"""Turns LLVM IR text into callable machine code for this CPU, with an on-disk object cache.

Each kernel family is one IR module. The first launch optimises it (new pass manager, O3, host
CPU name + features) and emits an object file; the object is stored under
`platformdirs.user_cache_dir("LocalChat")/jit`, keyed by llvmlite/LLVM version, CPU name,
CPU features and a hash of the IR text. Later launches hand the cached object straight to MCJIT
(no parsing, no optimisation), which takes milliseconds instead of seconds.

MCJIT takes ownership of the target machine it is given, so every engine gets its own.
`llvm.initialize()` must not be called on llvmlite >= 0.45 (it raises); only the native target
and asm printer are initialised.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import llvmlite
import llvmlite.binding as llvm
import platformdirs

from engine.errors import EngineError

ProgressFn = Callable[[str, float], None]

_init_lock = threading.Lock()
_initialised = False


class KernelCompileError(EngineError):
    """LLVM rejected a generated kernel module or could not emit code for this CPU."""


def _ensure_llvm() -> None:
    global _initialised
    with _init_lock:
        if not _initialised:
            llvm.initialize_native_target()
            llvm.initialize_native_asmprinter()
            _initialised = True


@dataclass(frozen=True)
class HostCPU:
    name: str
    features: str  # "+avx2,+fma,-amx-tile,..." as LLVM reports it

    def has(self, feature: str) -> bool:
        return f"+{feature}" in self.features.split(",")


def host_cpu() -> HostCPU:
    _ensure_llvm()
    return HostCPU(llvm.get_host_cpu_name(), llvm.get_host_cpu_features().flatten())


def default_cache_dir() -> Path:
    return Path(platformdirs.user_cache_dir("LocalChat")) / "jit"


def _new_target_machine(cpu: HostCPU):
    target = llvm.Target.from_default_triple()
    return target.create_target_machine(
        cpu=cpu.name, features=cpu.features, opt=3, codemodel="jitdefault", jit=True
    )


@dataclass
class CompileStats:
    compiled: int = 0  # modules optimised + emitted in this process
    loaded: int = 0  # modules taken from the disk cache
    seconds: float = 0.0
    names: list[str] = field(default_factory=list)


class KernelLibrary:
    """Compiled modules living in one MCJIT engine; hands out function addresses."""

    def __init__(self, cpu: HostCPU | None = None, cache_dir: Path | None = None):
        _ensure_llvm()
        self.cpu = cpu or host_cpu()
        self.cache_dir = Path(cache_dir) if cache_dir is not None else default_cache_dir()
        self.stats = CompileStats()
        self._tm_for_emit = _new_target_machine(self.cpu)
        # MCJIT owns the machine given to it; the emitting machine above stays ours.
        self._engine = llvm.create_mcjit_compiler(
            llvm.parse_assembly(""), _new_target_machine(self.cpu)
        )
        self._addresses: dict[str, int] = {}

    def cache_key(self, ir_text: str) -> str:
        h = hashlib.sha256()
        for part in (
            llvmlite.__version__,
            ".".join(map(str, llvm.llvm_version_info)),
            self.cpu.name,
            self.cpu.features,
            ir_text,
        ):
            h.update(part.encode())
            h.update(b"\0")
        return h.hexdigest()[:32]

    def add_modules(
        self, modules: list[tuple[str, str]], progress: ProgressFn | None = None
    ) -> None:
        """Compile (or load from cache) each (name, ir_text) module; progress reports per module."""
        start = time.perf_counter()
        total = len(modules)
        for i, (name, ir_text) in enumerate(modules):
            compiled_before = self.stats.compiled
            obj = self._object_code(name, ir_text)
            self._engine.add_object_file(llvm.ObjectFileRef.from_data(obj))
            if progress is not None:
                # Say which: a first launch compiles (seconds), later launches load the cache.
                verb = "compiling" if self.stats.compiled > compiled_before else "loading cached"
                progress(f"kernels: {verb} {name}", (i + 1) / total)
        self._engine.finalize_object()
        self.stats.seconds += time.perf_counter() - start

    def _object_code(self, name: str, ir_text: str) -> bytes:
        path = self.cache_dir / f"{name}-{self.cache_key(ir_text)}.o"
        try:
            data = path.read_bytes()
            if data:
                self.stats.loaded += 1
                return data
        except OSError:
            pass
        try:
            module = llvm.parse_assembly(ir_text)
            module.verify()
        except RuntimeError as exc:
            raise KernelCompileError(f"kernel module {name!r} is invalid LLVM IR: {exc}") from exc
        module.triple = self._tm_for_emit.triple
        module.data_layout = str(self._tm_for_emit.target_data)
        pto = llvm.create_pipeline_tuning_options(speed_level=3)
        pto.loop_vectorization = True
        pto.slp_vectorization = True
        pb = llvm.create_pass_builder(self._tm_for_emit, pto)
        pb.getModulePassManager().run(module, pb)
        data = self._tm_for_emit.emit_object(module)
        self.stats.compiled += 1
        self.stats.names.append(name)
        self._store(name, path, data)
        return data

    @staticmethod
    def _store(name: str, path: Path, data: bytes) -> None:
        # Write-then-rename so a concurrent launch never reads half an object file.
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_suffix(f".{os.getpid()}.tmp")
            tmp.write_bytes(data)
            os.replace(tmp, path)
        except OSError:
            return  # a read-only cache only costs the next launch a recompile
        # Older builds of the same module (previous kernel or LLVM versions) are dead weight.
        for stale in path.parent.glob(f"{name}-*.o"):
            if stale != path:
                with contextlib.suppress(OSError):
                    stale.unlink()

    def address(self, symbol: str) -> int:
        addr = self._addresses.get(symbol)
        if addr is None:
            addr = self._engine.get_function_address(symbol)
            if not addr:
                raise KernelCompileError(f"kernel symbol {symbol!r} is not in the compiled modules")
            self._addresses[symbol] = addr
        return addr
