"""Turns LLVM IR text into callable machine code for this CPU, with an on-disk object cache.

Each kernel family is one IR module. The first launch optimises it (new pass manager, O3, host
CPU name + features) and emits an object file; the object is stored under
`platformdirs.user_cache_dir("LocalChat")/jit`, keyed by llvmlite/LLVM version, CPU name,
CPU features and a hash of the IR text. Later launches hand the cached object straight to MCJIT
(no parsing, no optimisation), which takes milliseconds instead of seconds.

`LOCALCHAT_CPU=<LLVM CPU name>` (haswell, x86-64-v2, x86-64-v3, znver4, ...) compiles for that CPU
instead of the host: its name and LLVM's features for it (probed, see `named_cpu`) go to the
target machine and into the cache key, so the AVX2 and generic paths run, and can be tested and
benchmarked, on a bigger machine. An unknown name is a CpuSelectionError naming the variable.

MCJIT runs whatever object it is given, so the cache is authenticated, not just checksummed: each
entry carries an HMAC-SHA256 over (cache key, object bytes) under a per-install secret kept in a
0600 file next to the cache directory (`jit.key`); signed entries are `<module>-<key>.jit`, so
unsigned `.o` files of older builds are never read. A truncated, zeroed or bit-flipped entry, or a
valid object planted under another module's name, fails the check and is recompiled (one warning
per process); an unreadable key or an unwritable cache only costs a compile in memory. A damaged
key (wrong length, a FIFO or device in its place) is replaced by a new one, and a FIFO is never
opened for reading (it would block the launch). Entries are written 0600 in 0700 directories.

MCJIT takes ownership of the target machine it is given, so every engine gets its own.
`llvm.initialize()` must not be called on llvmlite >= 0.45 (it raises); only the native target
and asm printer are initialised.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import hmac
import logging
import os
import secrets
import stat
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import llvmlite
import llvmlite.binding as llvm
import platformdirs

from engine.errors import ConfigValidationError, EngineError
from engine.kernels import soft_half

ProgressFn = Callable[[str, float], None]

log = logging.getLogger(__name__)

_ENTRY_MAGIC = b"LCJIT1\0"  # entry = magic + HMAC-SHA256(key, cache_key \0 object) + object
_TAG_BYTES = hashlib.sha256().digest_size
_KEY_BYTES = 32
# The largest cache entry read back: the biggest module's object is a few MB; a larger file is
# not an entry this code wrote.
MAX_ENTRY_BYTES = 256 * 2**20
_rejected_warned = False

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


CPU_ENV = "LOCALCHAT_CPU"  # an LLVM CPU name (haswell, x86-64-v2, znver4): compile as if on it


class CpuSelectionError(ConfigValidationError):
    """LOCALCHAT_CPU names a CPU that LLVM does not know for this target."""


@dataclass(frozen=True)
class HostCPU:
    name: str
    features: str  # "+avx2,+fma,-amx-tile,..." as LLVM reports it
    # Where the name came from: "host" (LLVM's detection) or CPU_ENV; not part of the cache key.
    source: str = field(default="host", compare=False)

    def has(self, feature: str) -> bool:
        return f"+{feature}" in self.features.split(",")

    def label(self) -> str:
        """e.g. "znver5" or "haswell (LOCALCHAT_CPU)" for the info / bench / load lines."""
        return self.name if self.source == "host" else f"{self.name} ({self.source})"


# /proc/cpuinfo flag -> LLVM feature, for the features the instruction-set choice depends on.
_OS_FLAG_TO_LLVM = {
    "avx2": "avx2",
    "fma": "fma",
    "f16c": "f16c",
    "avx512f": "avx512f",
    "avx512bw": "avx512bw",
    "avx512vl": "avx512vl",
    "avx512_vnni": "avx512vnni",
    "avx_vnni": "avxvnni",
}
_CPUINFO = Path("/proc/cpuinfo")
_reconcile_warned = False


def os_cpu_flags(cpuinfo: str | None = None) -> frozenset[str] | None:
    """The CPU flags the kernel reports (the first processor's `flags` line of /proc/cpuinfo);
    None where there is no such file (not Linux) or it has no flags line. Linux clears a flag
    whose register state it does not save, so a flag here is safe to execute."""
    if cpuinfo is None:
        try:
            cpuinfo = _CPUINFO.read_text(errors="replace")
        except OSError:
            return None
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "flags":
            return frozenset(value.split())
    return None


def reconcile_features(
    llvm_features: dict[str, bool], os_flags: frozenset[str] | None
) -> tuple[str, list[str]]:
    """LLVM's host feature map with the ISA-relevant features the OS reports turned on, as a
    feature string; and the features so added. LLVM's host detection can miss what the CPU has
    (it re-derives AVX-512 from CPUID and XCR0 itself, and a hypervisor's CPUID can disagree
    with what the kernel enabled); the kernel's flags are the authority for what runs. With no
    disagreement the string is exactly LLVM's flatten() (the cache keys do not move)."""
    merged = llvm.FeatureMap(llvm_features)
    added = []
    for flag, feature in _OS_FLAG_TO_LLVM.items():
        if os_flags is not None and flag in os_flags and not merged.get(feature, False):
            merged[feature] = True
            added.append(feature)
    return merged.flatten(), added


def host_cpu() -> HostCPU:
    global _reconcile_warned
    _ensure_llvm()
    features, added = reconcile_features(llvm.get_host_cpu_features(), os_cpu_flags())
    if added and not _reconcile_warned:
        _reconcile_warned = True
        log.warning(
            "LLVM's host detection misses %s, which the OS reports; compiling with them",
            ", ".join(added),
        )
    return HostCPU(llvm.get_host_cpu_name(), features)


# The features the kernels choose between (engine/kernels/jit_backend.py select_isa), probed for a
# named CPU. Per target: asking an x86 machine about an AArch64 feature only prints a warning.
_PROBED_FEATURES = {
    "x86_64": (
        "sse4.2",
        "avx",
        "avx2",
        "fma",
        "f16c",
        "avx512f",
        "avx512bw",
        "avx512vl",
        "avx512vnni",
        "avxvnni",
    ),
    "aarch64": ("neon", "dotprod", "i8mm", "fullfp16"),
}


def _captured_stderr(fn: Callable[[], object]) -> tuple[object, str]:
    """Run fn with file descriptor 2 redirected to a temporary file: LLVM reports an unknown
    CPU name only as a line on stderr (and later aborts the process on it)."""
    import tempfile

    try:
        saved = os.dup(2)
    except OSError:  # no stderr at all (a windowed app): nothing to read, nothing to hide
        return fn(), ""
    with tempfile.TemporaryFile() as tmp:
        os.dup2(tmp.fileno(), 2)
        try:
            result = fn()
        finally:
            os.dup2(saved, 2)
            os.close(saved)
        tmp.seek(0)
        return result, tmp.read().decode(errors="replace")


def _probe_features(tm, arch: str) -> str:
    """LLVM's own answer to "does this CPU have feature F", for each probed F, as a feature
    string. The inliner only inlines a callee whose target features are a subset of the
    caller's (the caller here takes the target machine's CPU), so after the O2 pipeline the
    calls left in @probe name the features the CPU lacks. No instruction of F is emitted, so
    a CPU without F cannot abort LLVM the way an unsupported intrinsic does."""
    features = _PROBED_FEATURES.get(arch, ())
    if not features:
        return ""
    lines = ["@g = global i32 0"]
    calls = []
    for i, feature in enumerate(features):
        lines.append(
            f"define internal i32 @has_{i}() #{i} {{\n  %v = load volatile i32, ptr @g\n"
            f'  ret i32 %v\n}}\nattributes #{i} = {{ "target-features"="+{feature}" }}'
        )
        calls.append(f"  %c{i} = call i32 @has_{i}()")
    lines.append("define void @probe() {\n" + "\n".join(calls) + "\n  ret void\n}")
    module = llvm.parse_assembly("\n".join(lines))
    module.triple = tm.triple
    module.data_layout = str(tm.target_data)
    pb = llvm.create_pass_builder(tm, llvm.create_pipeline_tuning_options(speed_level=2))
    pb.getModulePassManager().run(module, pb)
    text = str(module)
    body = text[text.index("@probe()") :]
    return ",".join(
        ("-" if f"@has_{i}()" in body else "+") + feature for i, feature in enumerate(features)
    )


@functools.lru_cache(maxsize=16)
def named_cpu(name: str, source: str = CPU_ENV) -> HostCPU:
    """The CPU `name` as LLVM defines it for this machine's target (e.g. "haswell" on x86-64),
    with the probed features that pick the kernels' instruction set. Raises CpuSelectionError
    naming `source` when LLVM does not know the name (it would silently compile for a generic
    CPU, then abort)."""
    _ensure_llvm()
    allowed = "an LLVM CPU name for this machine, e.g. haswell, x86-64-v2, x86-64-v3, znver4"
    if not name or not all(ch.isalnum() or ch in "-_." for ch in name):
        raise CpuSelectionError(source, name, allowed)
    target = llvm.Target.from_default_triple()
    tm, err = _captured_stderr(
        lambda: target.create_target_machine(cpu=name, features="", opt=2, jit=True)
    )
    if "not a recognized processor" in err:
        raise CpuSelectionError(source, name, allowed)
    arch = llvm.get_process_triple().split("-")[0]
    features, err = _captured_stderr(lambda: _probe_features(tm, arch))
    return HostCPU(name, str(features), source)


def target_cpu() -> HostCPU:
    """The CPU the kernels are compiled for: LOCALCHAT_CPU if set (testing and benchmarking the
    AVX2 / generic paths on a bigger machine), else the host as LLVM detects it."""
    name = os.environ.get(CPU_ENV, "").strip()
    if not name:
        return host_cpu()
    cpu = named_cpu(name)
    # Code for a CPU with features this one lacks dies of SIGILL in the first kernel: refuse.
    host = host_cpu()
    missing = [
        f.lstrip("+") for f in cpu.features.split(",") if f.startswith("+") and not host.has(f[1:])
    ]
    if missing:
        raise CpuSelectionError(
            CPU_ENV,
            name,
            f"a CPU this machine can run code for ({host.name} lacks {', '.join(missing)})",
        )
    return cpu


def default_cache_dir() -> Path:
    return Path(platformdirs.user_cache_dir("LocalChat")) / "jit"


def _make_private_dirs(path: Path) -> None:
    """mkdir -p with 0700 for every directory it creates; `path` itself is made 0700 even when an
    older build created it group/world-readable (its parents, e.g. ~/.cache, are not ours)."""
    missing = []
    while not path.exists():
        missing.append(path)
        path = path.parent
    for directory in reversed(missing):
        with contextlib.suppress(FileExistsError):
            directory.mkdir(mode=0o700)
    if not missing and path.stat().st_mode & 0o077:
        path.chmod(0o700)


def _write_private(path: Path, data: bytes) -> Path:
    """Write `data` to a new 0600 temporary file beside `path`; returns the temporary's path."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        with os.fdopen(fd, "wb") as out:
            out.write(data)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise
    return tmp


def _read_regular(path: Path, max_bytes: int) -> bytes | None:
    """The bytes of the regular file at `path` (FileNotFoundError if absent), or None when it is
    not a regular file or is longer than `max_bytes`. A FIFO is never opened for a blocking read
    (it hung start-up until a writer came), and a device is never read to its (absent) end."""
    if not stat.S_ISREG(os.stat(path).st_mode):
        return None
    # O_NONBLOCK: a FIFO swapped in after the stat does not block the open; fstat refuses it.
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    with os.fdopen(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
            return None
        data = f.read(max_bytes + 1)
    return data if len(data) <= max_bytes else None


def _create_key(key_path: Path, replace: bool) -> bytes:
    """Write a new random key at `key_path` and return the key the file then holds. Without
    `replace`, link() fails if another process created the key first, and theirs is used; with
    it (repairing a damaged key), the new key replaces whatever is there."""
    _make_private_dirs(key_path.parent)
    tmp = _write_private(key_path, secrets.token_bytes(_KEY_BYTES))
    try:
        if replace:
            os.replace(tmp, key_path)
        else:
            with contextlib.suppress(FileExistsError):
                os.link(tmp, key_path)
    finally:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
    key = _read_regular(key_path, _KEY_BYTES)
    if key is None or len(key) != _KEY_BYTES:
        raise OSError(f"{key_path} does not hold a {_KEY_BYTES}-byte key after writing it")
    return key


def load_or_create_cache_key(key_path: Path) -> bytes | None:
    """The per-install secret that signs cache entries, created on first use; None when it cannot
    be read or created (the caller then compiles in memory and caches nothing).

    A damaged key (wrong length, empty, a FIFO or device in its place) is replaced by a new one:
    keeping it disabled the cache for good, a full compile (31 s) on every launch. Entries signed
    with the old key then fail their check once and are recompiled and signed anew."""
    try:
        key = _read_regular(key_path, _KEY_BYTES)
    except FileNotFoundError:
        missing = True
    except OSError as exc:
        log.warning("JIT cache disabled: cannot read its key %s (%s)", key_path, exc)
        return None
    else:
        if key is not None and len(key) == _KEY_BYTES:
            return key
        missing = False
        log.warning(
            "JIT cache key %s is damaged (not a %d-byte regular file); writing a new one, so "
            "cached kernels are compiled once more",
            key_path,
            _KEY_BYTES,
        )
    try:
        return _create_key(key_path, replace=not missing)
    except OSError as exc:
        log.warning("JIT cache disabled: cannot create its key %s (%s)", key_path, exc)
        return None


def _warn_rejected_once(path: Path, reason: str) -> None:
    global _rejected_warned
    if not _rejected_warned:
        _rejected_warned = True
        log.warning("JIT cache entry %s rejected (%s); recompiling", path, reason)


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

    def __init__(
        self,
        cpu: HostCPU | None = None,
        cache_dir: Path | None = None,
        key_path: Path | None = None,
    ):
        _ensure_llvm()
        self.cpu = cpu or target_cpu()
        self.cache_dir = Path(cache_dir) if cache_dir is not None else default_cache_dir()
        self.key_path = (
            Path(key_path) if key_path is not None else self.cache_dir.parent / "jit.key"
        )
        self._key = load_or_create_cache_key(self.key_path)
        self.stats = CompileStats()
        self._tm_for_emit = _new_target_machine(self.cpu)
        # MCJIT owns the machine given to it; the emitting machine above stays ours.
        self._engine = llvm.create_mcjit_compiler(
            llvm.parse_assembly(""), _new_target_machine(self.cpu)
        )
        self._addresses: dict[str, int] = {}
        self.module_names: set[str] = set()  # modules added so far (a later kernel is added once)
        # Runtime helpers the target's code calls but the process may lack; added once, first.
        self._runtime: list[tuple[str, str]] = []
        self._soft_fma = self._tm_for_emit.triple.startswith("x86_64") and not self.cpu.has("fma")
        if soft_half.needed(self.cpu, self._tm_for_emit.triple):
            self._runtime.append((soft_half.MODULE_NAME, soft_half.MODULE_IR))

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
        """Compile (or load from cache) each (name, ir_text) module not added before; progress
        reports per module."""
        start = time.perf_counter()
        modules = [m for m in modules if m[0] not in self.module_names]
        modules, self._runtime = self._runtime + modules, []
        total = len(modules)
        for i, (name, ir_text) in enumerate(modules):
            compiled_before = self.stats.compiled
            obj = self._object_code(name, ir_text)
            self._engine.add_object_file(llvm.ObjectFileRef.from_data(obj))
            self.module_names.add(name)
            if progress is not None:
                # Say which: a first launch compiles (seconds), later launches load the cache.
                verb = "compiling" if self.stats.compiled > compiled_before else "loading cached"
                progress(f"kernels: {verb} {name}", (i + 1) / total)
        self._engine.finalize_object()
        self.stats.seconds += time.perf_counter() - start

    def _object_code(self, name: str, ir_text: str) -> bytes:
        if self._soft_fma:
            # No FMA unit: llvm.fma must be exact, so LLVM calls libm's fmaf per element
            # (measured ~20x slower); fmuladd lets it multiply then add, which the kernels'
            # tolerances (int8 activations) never notice. Same signatures, so plain renaming.
            ir_text = ir_text.replace("@llvm.fma.", "@llvm.fmuladd.")
        key = self.cache_key(ir_text)
        # A named CPU's entries carry its name, so its stale-entry sweep (in _store) never
        # deletes the host's entries of the same module, nor the other way round.
        stem = name if self.cpu.source == "host" else f"{self.cpu.name}.{name}"
        path = self.cache_dir / f"{stem}-{key}.jit"
        data = self._load_verified(path, key)
        if data is not None:
            self.stats.loaded += 1
            return data
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
        self._store(stem, path, key, data)
        return data

    def _tag(self, cache_key: str, data: bytes) -> bytes:
        assert self._key is not None
        return hmac.new(self._key, cache_key.encode() + b"\0" + data, hashlib.sha256).digest()

    def _load_verified(self, path: Path, cache_key: str) -> bytes | None:
        """The cached object if its tag verifies, else None (missing, damaged, planted, no key)."""
        if self._key is None:
            return None
        try:
            entry = _read_regular(path, MAX_ENTRY_BYTES)
        except FileNotFoundError:
            return None
        except OSError as exc:
            _warn_rejected_once(path, f"unreadable: {exc}")
            return None
        if entry is None:  # a FIFO or device (never read) or an absurd size: _store replaces it
            _warn_rejected_once(path, f"not a regular file of at most {MAX_ENTRY_BYTES} bytes")
            return None
        header = len(_ENTRY_MAGIC) + _TAG_BYTES
        if len(entry) <= header or not entry.startswith(_ENTRY_MAGIC):
            _warn_rejected_once(path, "not a signed cache entry")
            return None
        tag, data = entry[len(_ENTRY_MAGIC) : header], entry[header:]
        if not hmac.compare_digest(tag, self._tag(cache_key, data)):
            _warn_rejected_once(path, "signature mismatch")
            return None
        return data

    def _store(self, name: str, path: Path, cache_key: str, data: bytes) -> None:
        if self._key is None:
            return
        entry = _ENTRY_MAGIC + self._tag(cache_key, data) + data
        # Write-then-rename so a concurrent launch never reads half an entry.
        try:
            _make_private_dirs(path.parent)
            tmp = _write_private(path, entry)
            try:
                os.replace(tmp, path)
            except OSError:
                tmp.unlink()
                raise
        except OSError:
            return  # a read-only cache only costs the next launch a recompile
        # Older builds of the same module (previous kernel or LLVM versions) are dead weight.
        for stale in path.parent.glob(f"{name}-*.jit"):
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
