"""A compiled walk over a GGUF string array: where it ends, without building the strings.

Why a kernel for header parsing: the model library describes dozens of files from their headers,
and the header's bulk is the vocabulary (SmolLM2: 49k tokens + 49k merges; Gemma 3: 262k tokens),
each string a u64 length and its bytes. Python needs ~40-150 ns per string to step over them
(40-80 ms per Gemma 3 file on the development machine); this loop needs about a nanosecond. It is
used only to *skip* arrays when describing a file (open_gguf(skip_string_arrays=True)); loading
decodes every string in Python as before. Any failure to compile falls back to the Python loop,
and a file the kernel finds malformed is re-walked in Python, which names the bad element.

    i64 gguf_skip_strings(i8* buf, i64 size, i64 pos, i64 count, i64 max_len)
      -> the offset just past the last string, or -1 if a length exceeds max_len or a string
         runs past `size`.
"""

from __future__ import annotations

import ctypes
import threading
from collections.abc import Callable

import numpy as np

IR = r"""
define i64 @gguf_skip_strings(i8* %buf, i64 %size, i64 %pos, i64 %count, i64 %max_len) {
entry:
  br label %loop
loop:
  %p = phi i64 [ %pos, %entry ], [ %next, %body ]
  %k = phi i64 [ 0, %entry ], [ %k1, %body ]
  %done = icmp eq i64 %k, %count
  br i1 %done, label %exit, label %check
check:
  %p8 = add i64 %p, 8
  %oob = icmp ugt i64 %p8, %size
  br i1 %oob, label %fail, label %body
body:
  %ptr = getelementptr i8, i8* %buf, i64 %p
  %lp = bitcast i8* %ptr to i64*
  %len = load i64, i64* %lp, align 1
  %next = add i64 %p8, %len
  %k1 = add i64 %k, 1
  %big = icmp ugt i64 %len, %max_len
  br i1 %big, label %fail, label %loop
exit:
  %past = icmp ugt i64 %p, %size
  br i1 %past, label %fail, label %ok
ok:
  ret i64 %p
fail:
  ret i64 -1
}
"""

_SkipFn = Callable[[int, int, int, int, int], int]
_lock = threading.Lock()
_skip: _SkipFn | None = None
_unavailable = False
_library = None  # keeps the MCJIT engine (and so the code) alive


def compiled_skip() -> _SkipFn | None:
    """The compiled function, built on first use (None when LLVM is unusable here)."""
    global _skip, _unavailable, _library
    if _skip is not None or _unavailable:
        return _skip
    with _lock:
        if _skip is None and not _unavailable:
            try:
                from engine.kernels.compiler import KernelLibrary

                library = KernelLibrary()
                library.add_modules([("gguf_scan", IR)])
                fn = ctypes.CFUNCTYPE(
                    ctypes.c_int64,
                    ctypes.c_void_p,
                    ctypes.c_int64,
                    ctypes.c_int64,
                    ctypes.c_int64,
                    ctypes.c_int64,
                )(library.address("gguf_skip_strings"))
                _library, _skip = library, fn
            except Exception:  # no usable LLVM: the Python walk does the same job, slower
                _unavailable = True
    return _skip


def skip_strings(buf, pos: int, count: int, max_len: int) -> int | None:
    """End offset of `count` strings starting at `pos` in `buf` (a bytes-like object), -1 when
    malformed, None when the kernel is unavailable (the caller walks in Python)."""
    fn = compiled_skip()
    if fn is None:
        return None
    view = np.frombuffer(buf, dtype=np.uint8)
    return int(fn(view.ctypes.data, len(view), pos, count, max_len))
