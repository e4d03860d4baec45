"""The llvmlite JIT implementation of the Backend protocol (engine/kernels/backend.py).

All kernel modules are compiled once per process (object code cached on disk, see compiler.py)
and shared; every backend owns a native thread pool (engine/kernels/threads.py) that runs them.
The quantized mat-mul path picks the dot-product instruction set from the host CPU at load:
AVX512-VNNI `vpdpbusd`, else AVX2 `pmaddubsw`, else generic widening multiplies.
Q4_K and Q6_K weights whose rows are whole super-blocks, and Q4_0 / Q4_1 / Q5_0 / Q5_1 / Q8_0
weights, are repacked on their first use into 16-row records (repack.py, shared by every backend of the process; written by repack_jit.py's
kernels on the pool) and run on packed_matmul.py's / packed_legacy.py's kernels, for every token count, so a token's
result never depends on the batch; LOCALCHAT_REPACK=0 keeps them on the row-major kernels (for
side-by-side comparison).

Per-call Python work is kept to a few slot writes into cached int64 argument blocks: array
addresses are cached per array object (reading `arr.ctypes.data` costs ~1.5-3 us), weight
argument blocks per weight, activation-quantization buffers per input width.

One backend runs one op at a time (its argument blocks and pool are shared by its ops): call it
from one thread at a time, as the generation worker does. Separate backends are independent.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import logging
import math
import os
import threading
import weakref
from collections.abc import Callable, Sequence
from typing import NamedTuple

import numpy as np

from engine.kernels import (
    act_quant,
    attention,
    elementwise,
    float_matmul,
    packed_legacy,
    packed_matmul,
    quant_matmul,
    repack,
    repack_jit,
    step_ir,
)
from engine.kernels.act_quant import QuantizeSlots
from engine.kernels.attention import AttentionSlots
from engine.kernels.compiler import HostCPU, KernelLibrary, target_cpu
from engine.kernels.elementwise import AddSlots, GluSlots, KvStoreSlots, RmsnormSlots, RopeSlots
from engine.kernels.float_matmul import FloatMatmulSlots
from engine.kernels.quant_matmul import QuantMatmulSlots
from engine.kernels.reference import ReferenceBackend
from engine.kernels.step_ir import MulSlots
from engine.kernels.threads import ThreadPool, job_list_table, pool_module, step_table
from engine.kv_quant import element_layout as kv_element_layout
from engine.qtensor import QTensor

ProgressFn = Callable[[str, float], None]
log = logging.getLogger(__name__)

# Arrays whose address a decode step asks for: ~30 activation views, two norm weights and the
# K/V arrays of every layer (28-32 layers: ~150 arrays, more with several sequences batched).
# At 64 entries the cache cycled and missed ~225 times a token (~2 us each); entries hold weak
# references, so a bigger cache pins nothing.
_PTR_CACHE_ENTRIES = 1024

_library_lock = threading.Lock()
# One compiled set per target CPU (the host, or LOCALCHAT_CPU's while it is set).
_libraries: dict[HostCPU, KernelLibrary] = {}


def select_isa(cpu: HostCPU) -> str:
    """The integer dot-product path for this CPU."""
    if cpu.has("avx512vnni") and cpu.has("avx512vl"):
        return "vnni"
    if cpu.has("avx2"):
        return "avx2"
    return "generic"


# Tensor types whose mat-mul module is compiled on first use, not at start-up: the codebook,
# ternary and MXFP4 types (~0.5 s each, 6.5 s together on a cold cache, which would have made a
# first launch 70% slower for types most files do not hold).
LAZY_QUANT_TYPES = frozenset(quant_matmul.UNPACK_IQ)


# LOCALCHAT_REPACK=0 keeps the repackable weights in the file's layout (the row-major kernels), to
# compare the two paths side by side; unset or 1, they are repacked on first use (repack.py).
REPACK_ENV = "LOCALCHAT_REPACK"


def repack_enabled() -> bool:
    return os.environ.get(REPACK_ENV, "1").strip() != "0"


def packed_module(qname: str, isa: str) -> tuple[str, str]:
    """The (name, IR) module of the repacked-record mat-mul of one type (packed_matmul.py, or
    packed_legacy.py for the 32-value block types)."""
    if qname in packed_legacy.PACKED_TYPES:
        return f"pmm_{qname}_{isa}", packed_legacy.module_ir(qname, isa)
    return f"pmm_{qname}_{isa}", packed_matmul.module_ir(qname, isa)


PACKED_TYPES = packed_matmul.PACKED_TYPES + packed_legacy.PACKED_TYPES


def quant_module(qname: str, isa: str) -> tuple[str, str]:
    """The (name, IR) mat-mul module of one tensor type; the name also keys the disk cache."""
    return f"mm_{qname}_{isa}", quant_matmul.module_ir(qname, isa)


def kernel_modules(isa: str) -> list[tuple[str, str]]:
    """Every (name, IR) module the backend compiles at start-up (LAZY_QUANT_TYPES' modules come
    later, from `lazy_quant_kernel`)."""
    modules = [pool_module(), ("quantize_q8", act_quant.module_ir())]
    modules += [quant_module(q, isa) for q in quant_matmul.LAYOUTS if q not in LAZY_QUANT_TYPES]
    modules += [packed_module(q, isa) for q in PACKED_TYPES]
    modules += [("repack", repack_jit.module_ir())]
    modules += [(f"mmf_{k}", float_matmul.module_ir(k)) for k in float_matmul.ELEM]
    modules += [("elementwise", elementwise.module_ir()), ("attention", attention.module_ir(isa))]
    modules += [("step_extra", step_ir.module_ir())]
    return modules


def shared_library(progress: ProgressFn | None = None) -> KernelLibrary:
    """The process-wide compiled kernels for the target CPU (engine.kernels.compiler.target_cpu:
    the host, or LOCALCHAT_CPU's), compiled or loaded from the disk cache on first use."""
    cpu = target_cpu()
    with _library_lock:
        lib = _libraries.get(cpu)
        if lib is None:
            lib = KernelLibrary(cpu)
            lib.add_modules(kernel_modules(select_isa(lib.cpu)), progress)
            _libraries[cpu] = lib
        elif progress is not None:
            progress("kernels: ready", 1.0)
        return lib


def jit_weight_types() -> frozenset[str]:
    """Tensor types `linear` runs in a kernel; any other type's mat-muls run on numpy."""
    return frozenset(quant_matmul.LAYOUTS) | frozenset(float_matmul.ELEM)


def _rotary_width(x: np.ndarray, n_rot: int) -> int:
    """How many leading dims of each head rotate: n_rot when it is a proper part of the head
    (partial RoPE), else the whole head."""
    return n_rot if 0 < n_rot < x.shape[-1] else x.shape[-1]


def _layout_why(*arrays: np.ndarray, ndim: int = 0) -> str:
    """Why float32 arrays cannot go to a kernel: rank, dtype, layout, else their shapes."""
    if ndim and arrays[0].ndim != ndim:
        return f"{arrays[0].ndim}-D input, not {ndim}-D"
    for a in arrays:
        if a.dtype != np.float32:
            return f"{a.dtype} array, not float32"
        if not a.flags.c_contiguous:
            return "non-contiguous array"
    return "mismatched shapes"


def lazy_quant_kernel(lib: KernelLibrary, qname: str, isa: str) -> int:
    """Address of `mm_<qname>` in the shared library, compiling its module the first time."""
    with _library_lock:
        # each target CPU (LOCALCHAT_CPU) has its own library, which knows what it holds
        if f"mm_{qname}_{isa}" not in lib.module_names:
            lib.add_modules([quant_module(qname, isa)])
        return lib.address(f"mm_{qname}")


_KERNEL_FN = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_int32, ctypes.c_int32)
# Below this many floats an elementwise op runs on the calling thread (a pool hand-off costs more).
_DIRECT_MAX = 1 << 16
_QUANTIZE_DIRECT_TOKENS = 8


@functools.lru_cache(maxsize=64)  # a model uses a handful of eps / scale values, every layer
def _heads_per_item(tokens: int, n_head: int, n_kv: int, chunks: int) -> int:
    """Query heads per attention work item: a whole GQA group (its K/V rows are loaded once
    for all of them) unless that leaves chunks idle (decode with few KV heads), then the
    largest divisor of the group that gives every chunk an item."""
    group = n_head // n_kv
    for heads in range(group, 0, -1):
        if group % heads == 0 and tokens * (n_head // heads) >= chunks:
            return heads
    return 1


# Split-K decode: each split of a (token, head run)'s keys costs a partial row and a merge, so
# keys are split only when every split has at least this many.
_MIN_KEYS_PER_SPLIT = 4 * attention.TILE


@functools.lru_cache(maxsize=256)
def _attention_plan(
    tokens: int, n_head: int, n_kv: int, n_keys: int, chunks: int, split_keys: bool = False
) -> tuple[int, int]:
    """(query heads per work item, key splits per item) for one attention call.

    A whole GQA group per item loads each K/V row once for all its heads. Decode has only
    n_kv such items (SmolLM2 3, Qwen2.5-1.5B 2), which 2 chunks share unevenly or not at all,
    so a long context splits each item's keys (flash-decoding: each split's partial max, sum
    and row, merged after) until every chunk (the pool makes several per thread) has the same
    number of items; a short one splits the group's heads instead (_heads_per_item).

    Key splits are off unless `split_keys` (JitBackend.split_keys): a split sums a query's
    softmax in another order than the unsplit pass, and whether a query is split depends on how
    many tokens share its forward pass and on the thread count, so with them on a token's logits
    differ between a decode step and a prefill (prefix reuse stops being exact, which
    test_prefix_cache's gemma3 case caught). Splitting heads keeps every (query, head) whole."""
    group = n_head // n_kv
    items = tokens * n_kv
    if split_keys and (1 < items < chunks or (items == 1 and chunks > 1)):
        # Enough splits that every chunk gets the same number of items, halved while a split
        # would have fewer than _MIN_KEYS_PER_SPLIT keys.
        splits = chunks // math.gcd(items, chunks)
        while splits > 1 and n_keys < splits * _MIN_KEYS_PER_SPLIT:
            splits //= 2
        if splits > 1:
            return group, splits
    return _heads_per_item(tokens, n_head, n_kv, chunks), 1


def _f32_bits(x: float) -> int:
    return int(np.float32(x).view(np.int32))


_F32 = np.dtype(np.float32)


class _WeightCall:
    """Everything a linear on one weight needs, prepared once: its argument block and kernel."""

    __slots__ = (
        "weight",
        "data",
        "args",
        "args_ptr",
        "kernel",
        "quantized",
        "rows",
        "cols",
        "bufs",
    )

    def __init__(
        self, weight: QTensor, data: np.ndarray, args: np.ndarray, kernel: int, quantized: bool
    ):
        self.weight, self.data, self.args, self.kernel = weight, data, args, kernel
        self.args_ptr = args.ctypes.data
        self.quantized = quantized
        self.rows, self.cols = weight.rows, weight.cols
        self.bufs: _ActivationBuffers | None = (
            None  # the activation buffers the AQ..SUMS slots currently point at
        )


class _ActivationBuffers:
    """int8 activations, per-32 scales, per-16 scaled sums, per-32 scaled sums and per-16
    integer sums for up to `capacity` tokens (act_quant.py)."""

    def __init__(self, n: int, capacity: int):
        self.capacity = capacity
        self.aq = np.zeros((capacity, n), np.int8)
        self.ad = np.zeros((capacity, n // 32), np.float32)
        self.sums = np.zeros((capacity, n // 16), np.float32)
        self.sums32 = np.zeros((capacity, n // 32), np.float32)
        self.isums = np.zeros((capacity, n // 16), np.int32)
        s = QuantizeSlots
        self.args = np.zeros(s.SIZE, np.int64)
        self.args[s.N] = n
        self.args[s.AQ], self.args[s.AD], self.args[s.SUMS] = (
            self.aq.ctypes.data,
            self.ad.ctypes.data,
            self.sums.ctypes.data,
        )
        self.args[s.SUMS32], self.args[s.ISUMS] = self.sums32.ctypes.data, self.isums.ctypes.data
        self.args_ptr = self.args.ctypes.data


class Step(NamedTuple):
    """One kernel call of a native step list (`JitBackend.run_steps`): the kernel, its own
    argument block (the step keeps it alive; the caller may rewrite per-token slots in it) and
    its chunks, 0 for a call on the running thread; `keep` holds whatever else the block points
    at (a job list's per-weight blocks, attention scratch)."""

    fn: int
    args: np.ndarray
    chunks: int
    keep: object = None


class _JobList:
    """Weights whose mat-muls run as one pool job: their calls and the pool_job_list table."""

    __slots__ = ("weights", "calls", "table", "table_ptr", "n_chunks")

    def __init__(
        self,
        weights: tuple[QTensor, ...],
        calls: tuple[_WeightCall, ...],
        table: np.ndarray,
        n_chunks: int,
    ):
        self.weights, self.calls, self.table, self.n_chunks = weights, calls, table, n_chunks
        self.table_ptr = table.ctypes.data


class JitBackend(ReferenceBackend):
    name = "jit"

    def __init__(self, n_threads: int | None = None, progress: ProgressFn | None = None):
        self.library = shared_library(progress)
        self.isa = select_isa(self.library.cpu)
        self.pool = ThreadPool(self.library, n_threads)
        self.n_threads = self.pool.n_threads
        self._quantize = self.library.address("quantize_q8")
        self._quantize_direct = _KERNEL_FN(self._quantize)
        self._kernels = {
            q: self.library.address(f"mm_{q}")
            for q in quant_matmul.LAYOUTS
            if q not in LAZY_QUANT_TYPES
        }
        self._packed_kernels = (
            {q: self.library.address(f"pmm_{q}") for q in PACKED_TYPES} if repack_enabled() else {}
        )
        self._repack_kernels = {
            q: self.library.address(f"repack_{q.lower()}") for q in repack_jit.REPACK_TYPES
        }
        self._repack_args = np.zeros(repack_jit.RepackSlots.SIZE, np.int64)
        self._float_kernels = {k: self.library.address(f"mmf_{k}") for k in float_matmul.ELEM}
        self._direct = {
            name: _KERNEL_FN(self.library.address(name))
            for name in ("rmsnorm", "rope", "swiglu", "geglu", "swiglu_oai")
        }
        self._add = self.library.address("add_f32")
        self._kv_store = self.library.address("kv_store_f16")
        self._kv_store_q8 = self.library.address("kv_store_q8_0")
        self._mul = self.library.address("mul_f32")
        self._attention = {
            cache_type: self.library.address(name) for cache_type, name in attention.KERNELS.items()
        }
        self._attention_merge = self.library.address(attention.MERGE_KERNEL)
        self._op_args = {
            name: np.zeros(slots.SIZE, np.int64)
            for name, slots in (
                ("rmsnorm", RmsnormSlots),
                ("rope", RopeSlots),
                ("swiglu", GluSlots),
                ("geglu", GluSlots),
                ("swiglu_oai", GluSlots),
                ("attention", AttentionSlots),
            )
        }
        self._op_args_ptr = {name: a.ctypes.data for name, a in self._op_args.items()}
        self._positions = np.zeros(256, np.int64)
        self._inv_freq: dict[tuple[float, int, float, int], tuple[object, np.ndarray]] = {}
        self._scratch = np.zeros(0, np.float32)
        self._attention_partial = np.zeros(0, np.float32)  # split-K partial rows, max, sum
        self._acts: dict[int, _ActivationBuffers] = {}
        self._weights: dict[int, _WeightCall] = {}  # by id(weight); the entry keeps it alive
        self._job_lists: dict[tuple[int, ...], _JobList] = {}  # by the weights' ids, likewise
        self._job_list_kernel = self.library.address("pool_job_list")
        self._ptrs: dict[int, tuple[weakref.ref[np.ndarray], int]] = {}
        # "op: reason" -> calls the numpy reference ran instead of a kernel (see _fell_back).
        self.fallbacks: dict[str, int] = {}
        # Flash-decoding key splits at long contexts: faster at 2 threads, not bit-exact
        # across batch shapes (see _attention_plan), so off by default.
        self.split_keys = False

    def _fell_back(self, op: str, why: str) -> None:
        """Count a call that the numpy reference runs instead of a kernel; say so once per
        (op, reason): a silent numpy path is tens of times slower (bench reports the counts)."""
        key = f"{op}: {why}"
        seen = self.fallbacks.get(key, 0)
        if not seen:
            log.warning("JIT kernels: %s runs on numpy (%s), much slower", op, why)
        self.fallbacks[key] = seen + 1

    def close(self) -> None:
        self.pool.close()

    def __del__(self):
        with contextlib.suppress(Exception):
            self.close()

    # --- helpers -------------------------------------------------------------------------------
    def _ptr(self, arr: np.ndarray) -> int:
        """Address of arr's data, cached per array object: an entry holds a weak reference, so
        it keeps nothing alive, and a hit needs that reference to still be arr (a dead array's
        id may be reused by a new one)."""
        hit = self._ptrs.get(id(arr))
        if hit is not None and hit[0]() is arr:
            return hit[1]
        p = arr.ctypes.data
        if len(self._ptrs) >= _PTR_CACHE_ENTRIES:
            self._ptrs.pop(next(iter(self._ptrs)))
        self._ptrs[id(arr)] = (weakref.ref(arr), p)
        return p

    def _fill_records(
        self, qname: str, src: np.ndarray, rows: int, n_blocks: int, out: np.ndarray
    ) -> None:
        """repack.RecordFiller on the pool: the records of `rows` rows of GGUF blocks."""
        if not (src.flags.c_contiguous and out.flags.c_contiguous):
            raise ValueError("repack kernels need C-contiguous blocks and records")
        s = repack_jit.RepackSlots
        args = self._repack_args
        args[s.SRC], args[s.DST] = src.ctypes.data, out.ctypes.data
        args[s.ROWS], args[s.N_BLOCKS] = rows, n_blocks
        self.pool.run(self._repack_kernels[qname], args.ctypes.data)

    def copies_weight(self, w: QTensor) -> bool:
        """A weight with a packed kernel is repacked into 16-row records at first use."""
        return w.qtype.name in self._packed_kernels and repack.packable(w)

    def _weight_args(self, w: QTensor) -> _WeightCall:
        data = w.data
        if data.ndim != 2 or data.shape[0] != w.rows or not data.flags.c_contiguous:
            data = np.ascontiguousarray(data).reshape(w.rows, -1)
        kind = w.qtype.name
        if self.copies_weight(w):
            packed = repack.packed_for(w, self._fill_records)
            s = QuantMatmulSlots
            args = np.zeros(s.SIZE, np.int64)
            args[s.W], args[s.ROW_BYTES] = packed.data.ctypes.data, packed.group_bytes
            args[s.N_ROWS], args[s.N_BLOCKS] = w.rows, w.cols // repack.block_values(kind)
            args[s.N], args[s.OUT_STRIDE] = w.cols, w.rows
            entry = _WeightCall(w, packed.data, args, self._packed_kernels[kind], True)
        elif kind in quant_matmul.LAYOUTS:
            s = QuantMatmulSlots
            args = np.zeros(s.SIZE, np.int64)
            args[s.W], args[s.ROW_BYTES] = data.ctypes.data, data.strides[0]
            args[s.N_ROWS] = w.rows
            args[s.N_BLOCKS] = w.cols // quant_matmul.LAYOUTS[kind].block
            args[s.N], args[s.OUT_STRIDE] = w.cols, w.rows
            kernel = self._kernels.get(kind)
            if kernel is None:
                kernel = self._kernels[kind] = lazy_quant_kernel(self.library, kind, self.isa)
            entry = _WeightCall(w, data, args, kernel, True)
        else:
            f = FloatMatmulSlots
            args = np.zeros(f.SIZE, np.int64)
            args[f.W], args[f.ROW_BYTES] = data.ctypes.data, data.strides[0]
            args[f.N_ROWS], args[f.COLS], args[f.OUT_STRIDE] = w.rows, w.cols, w.rows
            entry = _WeightCall(w, data, args, self._float_kernels[kind], False)
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
        # The decode path runs ~130-220 of these per token: keep the Python here minimal.
        call = self._weights.get(id(w))
        if call is None or call.weight is not w:
            kind = w.qtype.name
            if kind not in quant_matmul.LAYOUTS and kind not in self._float_kernels:
                self._fell_back("linear", f"{kind} weights")
                return super().linear(w, x, out)
            call = self._weight_args(w)
        rows, cols = call.rows, call.cols
        if x.ndim != 2 or x.shape[1] != cols:
            raise ValueError(f"linear {w.name}: x has shape {x.shape}, expected (T, {cols})")
        if x.dtype is not _F32 or not x.flags.c_contiguous:
            x = np.ascontiguousarray(x, dtype=np.float32)
        tokens = x.shape[0]
        target = out
        if out is not None:
            if out.shape != (tokens, rows):
                raise ValueError(
                    f"linear {w.name}: out has shape {out.shape}, expected {(tokens, rows)}"
                )
            if out.dtype is not _F32 or not out.flags.c_contiguous:
                out = None
        if out is None:
            out = np.empty((tokens, rows), np.float32)
        args = call.args
        if call.quantized:
            self._point(call, self._quantized(x, cols, tokens), tokens, out)
        else:
            args[FloatMatmulSlots.N_TOKENS] = tokens
            args[FloatMatmulSlots.X] = self._ptr(x)
            args[FloatMatmulSlots.OUT] = self._ptr(out)
        self.pool.run(call.kernel, call.args_ptr)
        if target is not None and target is not out:
            target[...] = out
            return target
        return out

    def _quantized(self, x: np.ndarray, cols: int, tokens: int) -> _ActivationBuffers:
        """x (tokens, cols) quantized to int8 blocks (act_quant.py) in the width's buffers."""
        bufs = self._acts.get(cols)
        if bufs is None or bufs.capacity < tokens:
            bufs = self._activations(cols, tokens)
        qargs = bufs.args
        qargs[QuantizeSlots.X] = self._ptr(x)
        qargs[QuantizeSlots.N_TOKENS] = tokens
        if tokens <= _QUANTIZE_DIRECT_TOKENS:
            self._quantize_direct(bufs.args_ptr, 0, 1)  # a pool hand-off costs more
        else:
            self.pool.run(self._quantize, bufs.args_ptr)
        return bufs

    def _point(
        self, call: _WeightCall, bufs: _ActivationBuffers, tokens: int, out: np.ndarray
    ) -> None:
        """Point a quantized weight's argument block at the activations and the output."""
        args = call.args
        if call.bufs is not bufs:
            qargs = bufs.args
            args[QuantMatmulSlots.AQ] = qargs[QuantizeSlots.AQ]
            args[QuantMatmulSlots.AD] = qargs[QuantizeSlots.AD]
            args[QuantMatmulSlots.SUMS] = qargs[QuantizeSlots.SUMS]
            args[QuantMatmulSlots.SUMS32] = qargs[QuantizeSlots.SUMS32]
            args[QuantMatmulSlots.ISUMS] = qargs[QuantizeSlots.ISUMS]
            call.bufs = bufs
        args[QuantMatmulSlots.N_TOKENS] = tokens
        args[QuantMatmulSlots.OUT] = self._ptr(out)

    def _job_list(self, weights: tuple[QTensor, ...]) -> _JobList | None:
        """The one-job form of these weights' mat-muls, or None where they cannot share one
        (not all quantized, different input widths, a type with no kernel)."""
        key = tuple(id(w) for w in weights)
        hit = self._job_lists.get(key)
        if hit is not None and all(a is b for a, b in zip(hit.weights, weights, strict=True)):
            return hit
        calls = []
        for w in weights:
            call = self._weights.get(id(w))
            if call is None or call.weight is not w:
                if w.qtype.name not in quant_matmul.LAYOUTS:
                    return None
                call = self._weight_args(w)
            calls.append(call)
        if not all(c.quantized and c.cols == calls[0].cols for c in calls):
            return None
        # each kernel gets the chunk count `linear` gives it alone: the same split, same bits
        chunks = self.pool.default_chunks
        table = job_list_table([(c.kernel, c.args_ptr, chunks) for c in calls])
        entry = _JobList(weights, tuple(calls), table, chunks * len(calls))
        self._job_lists[key] = entry
        return entry

    def linear_many(
        self, weights: Sequence[QTensor], x: np.ndarray, outs: Sequence[np.ndarray]
    ) -> list[np.ndarray]:
        # Projections that read the same input (q/k/v, gate/up): x is quantized once and their
        # kernels run as one pool job (pool_job_list), one hand-off and one wait instead of one
        # per weight; each output gets exactly the bits `linear` gives it.
        weights = tuple(weights)
        jobs = self._job_list(weights) if len(weights) > 1 else None
        tokens = x.shape[0] if x.ndim == 2 else -1
        if (
            jobs is None
            or len(outs) != len(weights)
            or x.shape[1:] != (jobs.calls[0].cols,)
            or not all(
                o.shape == (tokens, c.rows) and o.dtype is _F32 and o.flags.c_contiguous
                for o, c in zip(outs, jobs.calls, strict=True)
            )
        ):
            return super().linear_many(weights, x, outs)
        if x.dtype is not _F32 or not x.flags.c_contiguous:
            x = np.ascontiguousarray(x, dtype=np.float32)
        bufs = self._quantized(x, jobs.calls[0].cols, tokens)
        for call, out in zip(jobs.calls, outs, strict=True):
            self._point(call, bufs, tokens, out)
        self.pool.run(self._job_list_kernel, jobs.table_ptr, jobs.n_chunks)
        return list(outs)

    def _run_small(self, name: str, work: int) -> None:
        if work <= _DIRECT_MAX:
            self._direct[name](self._op_args_ptr[name], 0, 1)
        else:
            self.pool.run(self.library.address(name), self._op_args_ptr[name])

    @staticmethod
    def _usable(*arrays: np.ndarray) -> bool:
        return all(a.dtype == np.float32 and a.flags.c_contiguous for a in arrays)

    def rmsnorm(
        self, x: np.ndarray, weight: np.ndarray, eps: float, out: np.ndarray | None = None
    ) -> np.ndarray:
        if out is None:
            out = np.empty_like(x)
        if x.ndim != 2 or not self._usable(x, weight, out) or out.shape != x.shape:
            self._fell_back("rmsnorm", _layout_why(x, weight, out, ndim=2))
            return super().rmsnorm(x, weight, eps, out)
        self._rmsnorm_args(self._op_args["rmsnorm"], x, weight, eps, out)
        self._run_small("rmsnorm", x.size)
        return out

    def _rmsnorm_args(self, a, x, weight, eps: float, out) -> None:
        """The rmsnorm kernel's argument block (the op's shared one, or a step's own)."""
        s = RmsnormSlots
        a[s.X], a[s.OUT], a[s.WEIGHT] = self._ptr(x), self._ptr(out), self._ptr(weight)
        a[s.ROWS], a[s.D] = x.shape
        a[s.EPS] = _f32_bits(eps)

    def _glu(
        self, name: str, gate: np.ndarray, up: np.ndarray, out: np.ndarray | None
    ) -> np.ndarray:
        if out is None:
            out = np.empty_like(gate)
        if not self._usable(gate, up, out) or gate.shape != up.shape or out.shape != gate.shape:
            self._fell_back(name, _layout_why(gate, up, out))
            return getattr(super(), name)(gate, up, out)
        self._glu_args(self._op_args[name], gate, up, out)
        self._run_small(name, gate.size)
        return out

    def _glu_args(self, a, gate, up, out) -> None:
        s = GluSlots
        a[s.GATE], a[s.UP], a[s.OUT] = self._ptr(gate), self._ptr(up), self._ptr(out)
        a[s.COUNT] = gate.size

    def swiglu(self, gate, up, out=None):
        return self._glu("swiglu", gate, up, out)

    def geglu(self, gate, up, out=None):
        return self._glu("geglu", gate, up, out)

    def swiglu_oai(self, gate, up, *, alpha, limit, out=None):
        if out is None:
            out = np.empty_like(gate)
        if not self._usable(gate, up, out) or gate.shape != up.shape or out.shape != gate.shape:
            self._fell_back("swiglu_oai", _layout_why(gate, up, out))
            return super().swiglu_oai(gate, up, alpha=alpha, limit=limit, out=out)
        a = self._op_args["swiglu_oai"]
        a[GluSlots.ALPHA] = _f32_bits(alpha)
        a[GluSlots.LIMIT] = _f32_bits(limit)
        return self._glu("swiglu_oai", gate, up, out)

    def rope(
        self,
        x: np.ndarray,
        positions: np.ndarray,
        *,
        theta: float,
        neox: bool,
        freq_scale: float = 1.0,
        freq_factors: np.ndarray | None = None,
        n_rot: int = 0,
    ) -> np.ndarray:
        rot = _rotary_width(x, n_rot)
        if x.ndim != 3 or not self._usable(x) or rot % 2:
            self._fell_back(
                "rope", f"odd rotary width {rot}" if rot % 2 else _layout_why(x, ndim=3)
            )
            return super().rope(
                x,
                positions,
                theta=theta,
                neox=neox,
                freq_scale=freq_scale,
                freq_factors=freq_factors,
                n_rot=n_rot,
            )
        tokens = x.shape[0]
        inv_freq = self._rope_table(theta, rot, freq_scale, freq_factors)
        if self._positions.size < tokens:
            self._positions = np.zeros(2 * tokens, np.int64)
        self._positions[:tokens] = positions
        self._rope_args(self._op_args["rope"], x, self._positions, inv_freq, neox, rot)
        self._run_small("rope", x.size)
        return x

    def _rope_args(self, a, x, positions, inv_freq, neox: bool, rot: int) -> None:
        """positions: int64, read by the kernel when it runs (at least one per token)."""
        s = RopeSlots
        a[s.X], a[s.POSITIONS], a[s.INV_FREQ] = (
            self._ptr(x), self._ptr(positions), self._ptr(inv_freq)
        )  # fmt: skip
        a[s.N_TOKENS], a[s.HEADS], a[s.HEAD_DIM] = x.shape
        a[s.NEOX] = 1 if neox else 0
        a[s.N_ROT] = rot

    def _rope_table(
        self, theta: float, rot: int, freq_scale: float, freq_factors: np.ndarray | None
    ) -> np.ndarray:
        """The rope kernel's per-pair inverse frequencies (f64 [rot / 2]). The kernel reads one
        frequency per pair, so per-pair divisors (Llama 3.1+ rope_freqs, YaRN, LongRoPE) are
        folded into the table: same kernel, same IR. A model passes the same factors array
        every call, so it is cached by identity (the entry keeps it alive)."""
        key = (float(theta), rot, float(freq_scale), id(freq_factors))
        hit = self._inv_freq.get(key)
        if hit is not None and hit[0] is freq_factors:
            return hit[1]
        half = rot // 2
        inv_freq = freq_scale * theta ** (-np.arange(half, dtype=np.float64) * 2.0 / rot)
        if freq_factors is not None:
            factors = np.asarray(freq_factors, dtype=np.float64).reshape(-1)
            if factors.shape != (half,):
                raise ValueError(f"freq_factors has {factors.size} values, expected {half}")
            inv_freq = inv_freq / factors
        inv_freq = np.ascontiguousarray(inv_freq)
        self._inv_freq[key] = (freq_factors, inv_freq)
        return inv_freq

    def attention(
        self,
        q: np.ndarray,
        k_cache: np.ndarray,
        v_cache: np.ndarray,
        *,
        p0: int,
        scale: float,
        window: int = 0,
        softcap: float = 0.0,
        sinks: np.ndarray | None = None,
        out: np.ndarray | None = None,
    ) -> np.ndarray:
        tokens, n_head, head_dim = q.shape
        capacity, n_kv, _ = k_cache.shape
        if sinks is not None and (
            sinks.shape != (n_head,) or sinks.dtype != np.float32 or not sinks.flags.c_contiguous
        ):
            raise ValueError(
                f"attention: sinks must be a contiguous float32 array of shape {(n_head,)}; "
                f"got {sinks.dtype} {sinks.shape}"
            )
        if out is not None and out.shape != (tokens, n_head * head_dim):
            raise ValueError(
                f"attention: out has shape {out.shape}, expected {(tokens, n_head * head_dim)}"
            )
        if p0 + tokens > capacity or k_cache.shape != v_cache.shape:
            raise ValueError(
                f"attention: {p0 + tokens} positions do not fit caches of shape "
                f"{k_cache.shape} / {v_cache.shape}"
            )
        target = out
        if out is None or not self._usable(out):
            out = np.empty((tokens, n_head * head_dim), np.float32)
        cache_type = kv_element_layout(k_cache, head_dim)
        why = None
        if head_dim % 16:
            why = f"head_dim {head_dim} is not a multiple of 16"
        elif n_head % n_kv:
            why = f"{n_head} query heads do not divide into {n_kv} KV heads"
        elif cache_type is None or kv_element_layout(v_cache, head_dim) != cache_type:
            why = f"{k_cache.dtype}/{v_cache.dtype} KV cache, neither float16 nor q8_0 rows"
        elif not self._usable(q):
            why = _layout_why(q)
        elif not k_cache.flags.c_contiguous or not v_cache.flags.c_contiguous:
            why = "non-contiguous KV cache"
        if why is not None or cache_type is None:
            self._fell_back("attention", why or "unknown KV cache layout")
            return super().attention(
                q,
                k_cache,
                v_cache,
                p0=p0,
                scale=scale,
                window=window,
                softcap=softcap,
                sinks=sinks,
                out=target,
            )
        chunks = self.pool.default_chunks
        heads_per_item, splits = _attention_plan(
            tokens, n_head, n_kv, p0 + tokens, chunks, self.split_keys
        )
        stride = attention.scratch_floats_per_thread(heads_per_item)
        need = stride * chunks  # one scratch block per chunk
        if self._scratch.size < need:
            self._scratch = np.zeros(max(need, 2 * self._scratch.size), np.float32)
        a, s = self._op_args["attention"], AttentionSlots
        a[s.Q] = self._ptr(q)
        a[s.K_CACHE] = self._ptr(k_cache)
        a[s.V_CACHE] = self._ptr(v_cache)
        a[s.OUT] = self._ptr(out)
        a[s.N_TOKENS], a[s.N_HEAD], a[s.N_KV], a[s.HEAD_DIM] = tokens, n_head, n_kv, head_dim
        a[s.P0] = p0
        a[s.WINDOW] = window
        a[s.SCALE] = _f32_bits(scale)
        a[s.SOFTCAP] = _f32_bits(softcap)
        a[s.SCRATCH] = self._ptr(self._scratch)
        a[s.SCRATCH_STRIDE] = stride
        a[s.SINKS] = 0 if sinks is None else self._ptr(sinks)
        a[s.HEADS_PER_ITEM] = heads_per_item
        a[s.N_SPLITS] = splits
        a[s.PARTIAL] = 0
        if splits > 1:
            need = attention.partial_floats(splits, tokens, n_head, head_dim)
            if self._attention_partial.size < need:
                self._attention_partial = np.zeros(need, np.float32)
            a[s.PARTIAL] = self._ptr(self._attention_partial)
        self.pool.run(self._attention[cache_type], self._op_args_ptr["attention"])
        if splits > 1:
            self.pool.run(self._attention_merge, self._op_args_ptr["attention"])
        if target is not None and target is not out:
            target[...] = out
            return target
        return out

    # --- native step lists (a decode step's per-layer kernels, one call from Python) ----------
    # Each step gets its own argument block, filled once, so the shared blocks the ops above
    # use are never touched and the list can be rerun every token. Every step runs its kernel
    # with exactly the arguments and chunking the op above would use for the same arrays, so
    # its results are bit-identical to the op-by-op path's. The arrays must stay alive and in
    # place while the steps are used (the caller owns them).
    def run_steps(self, table: np.ndarray, count: int) -> None:
        """Run `count` steps of a table made by `step_list`, in order."""
        self.pool.run_steps(table.ctypes.data, count)

    @staticmethod
    def step_list(steps: Sequence[Step]) -> np.ndarray:
        return step_table([(st.fn, st.args.ctypes.data, st.chunks) for st in steps])

    def _small_chunks(self, work: int) -> int:
        """Chunks of an elementwise step: on the caller below _DIRECT_MAX, as _run_small."""
        return 0 if work <= _DIRECT_MAX else self.pool.default_chunks

    def step_rmsnorm(self, x: np.ndarray, weight: np.ndarray, eps: float, out: np.ndarray) -> Step:
        if x.ndim != 2 or not self._usable(x, weight, out) or out.shape != x.shape:
            raise ValueError(f"step_rmsnorm: {_layout_why(x, weight, out, ndim=2)}")
        a = np.zeros(RmsnormSlots.SIZE, np.int64)
        self._rmsnorm_args(a, x, weight, eps, out)
        return Step(self.library.address("rmsnorm"), a, self._small_chunks(x.size))

    def step_add(self, a: np.ndarray, b: np.ndarray, out: np.ndarray) -> Step:
        """out = a + b (float32, as many values each, a and out the same shape; out may be a:
        a residual add, or a bias added to one token's row)."""
        if not self._usable(a, b, out) or a.shape != out.shape or a.size != b.size:
            raise ValueError(f"step_add: {_layout_why(a, b, out)}")
        s = AddSlots
        args = np.zeros(s.SIZE, np.int64)
        args[s.A], args[s.B], args[s.OUT] = a.ctypes.data, b.ctypes.data, out.ctypes.data
        args[s.COUNT] = a.size
        return Step(self._add, args, 0)

    def step_glu(
        self,
        kind: str,
        gate: np.ndarray,
        up: np.ndarray,
        out: np.ndarray,
        *,
        alpha: float = 0.0,
        limit: float = 0.0,
    ) -> Step:
        """swiglu, geglu or swiglu_oai (gpt-oss's clamped form, with its alpha and limit) of
        (gate, up) into out."""
        if kind not in ("swiglu", "geglu", "swiglu_oai"):
            raise ValueError(f"step_glu: {kind!r} has no step form")
        if not self._usable(gate, up, out) or not gate.shape == up.shape == out.shape:
            raise ValueError(f"step_glu: {_layout_why(gate, up, out)}")
        a = np.zeros(GluSlots.SIZE, np.int64)
        self._glu_args(a, gate, up, out)
        if kind == "swiglu_oai":
            a[GluSlots.ALPHA], a[GluSlots.LIMIT] = _f32_bits(alpha), _f32_bits(limit)
        return Step(self.library.address(kind), a, self._small_chunks(gate.size))

    def step_rope(
        self,
        x: np.ndarray,
        positions: np.ndarray,
        *,
        theta: float,
        neox: bool,
        freq_scale: float = 1.0,
        freq_factors: np.ndarray | None = None,
        n_rot: int = 0,
    ) -> Step:
        """RoPE of x (T, H, hd) in place at the int64 `positions` (read when the step runs)."""
        rot = _rotary_width(x, n_rot)
        if x.ndim != 3 or not self._usable(x) or rot % 2:
            raise ValueError("step_rope: needs a contiguous float32 (T, H, hd), an even rotary")
        if positions.dtype != np.int64 or positions.shape != (x.shape[0],):
            raise ValueError("step_rope: positions must be int64, one per token")
        inv_freq = self._rope_table(theta, rot, freq_scale, freq_factors)
        a = np.zeros(RopeSlots.SIZE, np.int64)
        self._rope_args(a, x, positions, inv_freq, neox, rot)
        return Step(self.library.address("rope"), a, self._small_chunks(x.size))

    def step_kv_store(self, src: np.ndarray, position: np.ndarray, cache_type: str = "f16") -> Step:
        """src (one position's rows, float32, a multiple of 16 values; of 32 for q8_0) rounded
        to float16, or quantized to q8_0 blocks as KVCache.write does, into a cache at row
        *position; the cache's address goes in args[KvStoreSlots.DST] (the same slot of
        KvStoreQ8Slots)."""
        multiple = {"f16": 16, "q8_0": 32}.get(cache_type)
        if multiple is None:
            raise ValueError(f"step_kv_store: no row store for a {cache_type!r} cache")
        if not self._usable(src) or src.size % multiple or position.dtype != np.int64:
            raise ValueError(
                f"step_kv_store: needs float32 rows of a multiple of {multiple} values"
            )
        s = KvStoreSlots
        a = np.zeros(s.SIZE, np.int64)
        a[s.SRC], a[s.POS], a[s.COUNT] = src.ctypes.data, position.ctypes.data, src.size
        return Step(self._kv_store if cache_type == "f16" else self._kv_store_q8, a, 0)

    def step_mul(self, a: np.ndarray, b: np.ndarray, out: np.ndarray) -> Step:
        """out = a * b (float32, as many values each; out may be a): a multiplier given as a
        row of factors, the same IEEE products numpy's `*=` gives."""
        if not self._usable(a, b, out) or a.shape != out.shape or a.size != b.size:
            raise ValueError(f"step_mul: {_layout_why(a, b, out)}")
        s = MulSlots
        args = np.zeros(s.SIZE, np.int64)
        args[s.A], args[s.B], args[s.OUT] = a.ctypes.data, b.ctypes.data, out.ctypes.data
        args[s.COUNT] = a.size
        return Step(self._mul, args, 0)

    def step_quantize(self, x: np.ndarray) -> tuple[Step, _ActivationBuffers]:
        """x (T, n) quantized into buffers of the step's own (act_quant.py), as `_quantized`."""
        tokens, n = x.shape
        if not self._usable(x) or n % 32:
            raise ValueError("step_quantize: needs contiguous float32 rows of 32k values")
        bufs = _ActivationBuffers(n, tokens)
        bufs.args[QuantizeSlots.X] = x.ctypes.data
        bufs.args[QuantizeSlots.N_TOKENS] = tokens
        chunks = 0 if tokens <= _QUANTIZE_DIRECT_TOKENS else self.pool.default_chunks
        return Step(self._quantize, bufs.args, chunks, bufs), bufs  # keep: the buffers

    def step_linear(
        self, weights: Sequence[QTensor], bufs: _ActivationBuffers, outs: Sequence[np.ndarray]
    ) -> Step | None:
        """The mat-muls of quantized `weights` over the activations in `bufs` (a step_quantize's)
        into `outs`: one pool job, as `linear` (one weight) or `linear_many` (several) runs
        them. None where a weight has no quantized kernel (the caller keeps the op path)."""
        calls = []
        for w, out in zip(weights, outs, strict=True):
            if w.qtype.name not in quant_matmul.LAYOUTS:
                return None
            call = self._weights.get(id(w))
            if call is None or call.weight is not w:
                call = self._weight_args(w)
            tokens = bufs.aq.shape[0]
            if (
                not call.quantized
                or call.cols != bufs.aq.shape[1]
                or out.shape != (tokens, call.rows)
                or not self._usable(out)
            ):
                return None
            q, m = QuantizeSlots, QuantMatmulSlots
            args = call.args.copy()  # the weight's block, pointed at this step's arrays
            args[m.AQ], args[m.AD], args[m.SUMS] = (
                bufs.args[q.AQ],
                bufs.args[q.AD],
                bufs.args[q.SUMS],
            )
            args[m.SUMS32], args[m.ISUMS] = bufs.args[q.SUMS32], bufs.args[q.ISUMS]
            args[m.N_TOKENS], args[m.OUT] = tokens, out.ctypes.data
            calls.append((call.kernel, args))
        chunks = self.pool.default_chunks
        if len(calls) == 1:
            return Step(calls[0][0], calls[0][1], chunks)
        table = job_list_table([(k, a.ctypes.data, chunks) for k, a in calls])
        # the table holds the blocks' addresses: the step keeps the blocks alive
        return Step(self._job_list_kernel, table, chunks * len(calls), [a for _, a in calls])

    def step_linear_float(self, w: QTensor, x: np.ndarray, out: np.ndarray) -> Step | None:
        """The mat-mul of a float weight (F32 / F16 / BF16: a float kernel, no activation
        quantization) over x into out, as `linear` runs it. None for any other weight."""
        if w.qtype.name not in self._float_kernels:
            return None
        call = self._weights.get(id(w))
        if call is None or call.weight is not w:
            call = self._weight_args(w)
        tokens = x.shape[0] if x.ndim == 2 else -1
        if (
            call.quantized
            or x.shape != (tokens, call.cols)
            or out.shape != (tokens, call.rows)
            or not self._usable(x, out)
        ):
            return None
        f = FloatMatmulSlots
        args = call.args.copy()  # the weight's block, pointed at this step's arrays
        args[f.N_TOKENS], args[f.X], args[f.OUT] = tokens, x.ctypes.data, out.ctypes.data
        return Step(call.kernel, args, self.pool.default_chunks)

    def step_attention(
        self,
        q: np.ndarray,
        out: np.ndarray,
        n_kv: int,
        *,
        scale: float,
        window: int = 0,
        softcap: float = 0.0,
        sinks: np.ndarray | None = None,
        cache_type: str = "f16",
    ) -> Step:
        """Attention of q (T, H, hd) against a float16 or q8_0 cache (`cache_type`, the
        attention kernel of that row layout) into out (T, H*hd), as `attention` runs it without
        key splits. The caller sets K_CACHE / V_CACHE (the layer's cache arrays) and P0 (the
        first query's position) in the step's args before it runs."""
        tokens, n_head, head_dim = q.shape
        if self.split_keys:
            raise ValueError("step_attention: key splits are on (no step form)")
        if head_dim % 16 or n_head % n_kv or not self._usable(q, out):
            raise ValueError("step_attention: the shapes need the op path")
        if out.shape != (tokens, n_head * head_dim):
            raise ValueError(f"step_attention: out has shape {out.shape}")
        if sinks is not None and (sinks.shape != (n_head,) or not self._usable(sinks)):
            raise ValueError("step_attention: sinks must be float32 (n_head,)")
        chunks = self.pool.default_chunks
        heads_per_item, splits = _attention_plan(tokens, n_head, n_kv, 1, chunks, False)
        stride = attention.scratch_floats_per_thread(heads_per_item)
        scratch = np.zeros(stride * chunks, np.float32)
        s = AttentionSlots
        a = np.zeros(s.SIZE, np.int64)
        a[s.Q], a[s.OUT] = q.ctypes.data, out.ctypes.data
        a[s.N_TOKENS], a[s.N_HEAD], a[s.N_KV], a[s.HEAD_DIM] = tokens, n_head, n_kv, head_dim
        a[s.WINDOW] = window
        a[s.SCALE] = _f32_bits(scale)
        a[s.SOFTCAP] = _f32_bits(softcap)
        a[s.SCRATCH], a[s.SCRATCH_STRIDE] = scratch.ctypes.data, stride
        a[s.SINKS] = 0 if sinks is None else sinks.ctypes.data
        a[s.HEADS_PER_ITEM], a[s.N_SPLITS], a[s.PARTIAL] = heads_per_item, splits, 0
        if cache_type not in self._attention:
            raise ValueError(f"step_attention: no kernel for a {cache_type!r} cache")
        return Step(self._attention[cache_type], a, chunks, scratch)
