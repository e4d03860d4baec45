"""The llvmlite JIT implementation of the Backend protocol (engine/kernels/backend.py).

All kernel modules are compiled once per process (object code cached on disk, see compiler.py)
and shared; every backend owns a native thread pool (engine/threads.py) that runs them.
The quantized mat-mul path picks the dot-product instruction set from the host CPU at load:
AVX512-VNNI `vpdpbusd`, else AVX2 `pmaddubsw`, else generic widening multiplies.

Per-call Python work is kept to a few slot writes into cached int64 argument blocks: array
addresses are cached per array object (reading `arr.ctypes.data` costs ~3 us), weight argument
blocks per weight, activation-quantization buffers per input width.
"""

from __future__ import annotations

import threading
from typing import Callable

import numpy as np

from engine.kernels import act_quant, float_matmul, quant_matmul
from engine.kernels.compiler import HostCPU, KernelLibrary, host_cpu
from engine.kernels.reference import ReferenceBackend
from engine.qtensor import QTensor
from engine.threads import ThreadPool, pool_ir

ProgressFn = Callable[[str, float], None]

# The model's activation views repeat every layer; a small cache covers them.
_PTR_CACHE_ENTRIES = 64
_PTR_CACHE_MAX_BYTES = 1 << 22

_library_lock = threading.Lock()
_library: KernelLibrary | None = None


def select_isa(cpu: HostCPU) -> str:
    """The integer dot-product path for this CPU."""
    if cpu.has("avx512vnni") and cpu.has("avx512vl"):
        return "vnni"
    if cpu.has("avx2"):
        return "avx2"
    return "generic"


def kernel_modules(isa: str) -> list[tuple[str, str]]:
    """Every (name, IR) module the backend needs; the name also keys the disk cache."""
    modules = [("pool", pool_ir()), ("quantize_q8", act_quant.module_ir())]
    modules += [(f"mm_{q}_{isa}", quant_matmul.module_ir(q, isa)) for q in quant_matmul.LAYOUTS]
    modules += [(f"mmf_{k}", float_matmul.module_ir(k)) for k in float_matmul.ELEM]
    return modules


def shared_library(progress: ProgressFn | None = None) -> KernelLibrary:
    """The process-wide compiled kernels (compiled or loaded from the disk cache on first use)."""
    global _library
    with _library_lock:
        if _library is None:
            lib = KernelLibrary()
            lib.add_modules(kernel_modules(select_isa(lib.cpu)), progress)
            _library = lib
        elif progress is not None:
            progress("kernels: ready", 1.0)
        return _library


class _ActivationBuffers:
    """int8 activations, per-32 scales and per-16 scaled sums for up to `capacity` tokens."""

    def __init__(self, n: int, capacity: int):
        self.capacity = capacity
        self.aq = np.zeros((capacity, n), np.int8)
        self.ad = np.zeros((capacity, n // 32), np.float32)
        self.sums = np.zeros((capacity, n // 16), np.float32)
        self.args = np.zeros(6, np.int64)  # quantize_q8 slots: x, T, n, aq, ad, as
        self.args[2] = n
        self.args[3:6] = [self.aq.ctypes.data, self.ad.ctypes.data, self.sums.ctypes.data]
        self.args_ptr = self.args.ctypes.data


class JitBackend(ReferenceBackend):
    name = "jit"

    def __init__(self, n_threads: int | None = None, progress: ProgressFn | None = None):
        self.library = shared_library(progress)
        self.isa = select_isa(self.library.cpu)
        self.pool = ThreadPool(self.library, n_threads)
        self.n_threads = self.pool.n_threads
        self._quantize = self.library.address("quantize_q8")
        self._kernels = {q: self.library.address(f"mm_{q}") for q in quant_matmul.LAYOUTS}
        self._float_kernels = {k: self.library.address(f"mmf_{k}") for k in float_matmul.ELEM}
        self._acts: dict[int, _ActivationBuffers] = {}
        self._weights: dict[int, tuple[QTensor, np.ndarray, int, int]] = {}
        self._ptrs: dict[int, tuple[np.ndarray, int]] = {}

    def close(self) -> None:
        self.pool.close()

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass

    # --- helpers -------------------------------------------------------------------------------
    def _ptr(self, arr: np.ndarray) -> int:
        """Address of arr's data, cached per array object (the entry keeps it alive, so its id
        cannot be reused while cached)."""
        hit = self._ptrs.get(id(arr))
        if hit is not None and hit[0] is arr:
            return hit[1]
        p = arr.ctypes.data
        if arr.nbytes <= _PTR_CACHE_MAX_BYTES:  # never pin big temporaries in memory
            if len(self._ptrs) >= _PTR_CACHE_ENTRIES:
                self._ptrs.pop(next(iter(self._ptrs)))
            self._ptrs[id(arr)] = (arr, p)
        return p

    def _weight_args(self, w: QTensor):
        hit = self._weights.get(id(w))
        if hit is not None and hit[0] is w:
            return hit
        data = w.data
        if data.ndim != 2 or data.shape[0] != w.rows or not data.flags.c_contiguous:
            data = np.ascontiguousarray(data).reshape(w.rows, -1)
        kind = w.qtype.name
        if kind in quant_matmul.LAYOUTS:
            lay = quant_matmul.LAYOUTS[kind]
            args = np.zeros(11, np.int64)
            args[:4] = [data.ctypes.data, data.strides[0], w.rows, w.cols // lay.block]
            args[9:11] = [w.cols, w.rows]
            kernel = self._kernels[kind]
        else:
            args = np.zeros(8, np.int64)
            args[:4] = [data.ctypes.data, data.strides[0], w.rows, w.cols]
            args[7] = w.rows
            kernel = self._float_kernels[kind]
        entry = (w, args, args.ctypes.data, kernel, data)
        self._weights[id(w)] = entry
        return entry

    def _activations(self, n: int, tokens: int) -> _ActivationBuffers:
        bufs = self._acts.get(n)
        if bufs is None or bufs.capacity < tokens:
            bufs = _ActivationBuffers(n, max(tokens, 1 if bufs is None else 2 * bufs.capacity))
            self._acts[n] = bufs
        return bufs

    # --- ops -----------------------------------------------------------------------------------
    def linear(self, w: QTensor, x: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
        kind = w.qtype.name
        if kind not in self._kernels and kind not in self._float_kernels:
            return super().linear(w, x, out)
        if x.ndim != 2 or x.shape[1] != w.cols:
            raise ValueError(f"linear {w.name}: x has shape {x.shape}, expected (T, {w.cols})")
        if x.dtype != np.float32 or not x.flags.c_contiguous:
            x = np.ascontiguousarray(x, dtype=np.float32)
        tokens = x.shape[0]
        target = out
        if out is None or not out.flags.c_contiguous or out.dtype != np.float32:
            out = np.empty((tokens, w.rows), np.float32)
        _, args, args_ptr, kernel, _ = self._weight_args(w)
        if kind in self._kernels:
            bufs = self._activations(w.cols, tokens)
            bufs.args[0] = self._ptr(x)
            bufs.args[1] = tokens
            self.pool.run(self._quantize, bufs.args_ptr)
            args[4] = tokens
            args[5] = bufs.args[3]
            args[6] = bufs.args[4]
            args[7] = bufs.args[5]
            args[8] = self._ptr(out)
        else:
            args[4] = tokens
            args[5] = self._ptr(x)
            args[6] = self._ptr(out)
        self.pool.run(kernel, args_ptr)
        if target is not None and target is not out:
            target[...] = out
            return target
        return out
