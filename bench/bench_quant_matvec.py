"""Decode mat-vec time per tensor type, side by side in one run (issue 10's speed bar: every
new type within 1.3x of Q4_K on the same shape).

    nice .venv/bin/python bench/bench_quant_matvec.py [--shapes 2048x2048,4096x4096]
        [--threads 1] [--rounds 15] [--calls 50] [--types Q4_K,IQ4_XS,...] [--json]
        [--against REV]

For each shape (rows x cols, numpy order) one random weight per type (random blocks with
finite fp16 scales, as the kernel tests make them), one token of activations. A round times
`calls` back-to-back `linear` calls of every type in turn, so load on the shared machine hits
every type alike; the table gives the median over rounds of microseconds per call and the
ratio to Q4_K's median on that shape. With one thread the calling thread runs every kernel
itself (engine/kernels/threads.py), so its CPU time (`time.thread_time`) is the kernel's cost
without the time other processes hold the core; that is the figure compared. Wall time is in
the JSON.

`--against REV` also times the codebook/grid types (engine/kernels/quant_iq.py's) as git
revision REV's quant_iq*.py unpackers build them (quant_iq.py with that revision's
quant_iq_vnni.py and quant_iq_avx2.py), as rows `TYPE@REV` in the same rounds on the
same weights: a change to those kernels measured side by side in one run, which the shared
machine's load makes far more telling than two runs minutes apart.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
import types as pytypes
from pathlib import Path

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from engine.kernels import quant_iq, quant_matmul
from engine.kernels.jit_backend import JitBackend
from engine.qtensor import QTensor
from tests.quant_blocks import random_blocks, scale_down

Q = GGMLQuantizationType
DEFAULT_TYPES = [
    "Q4_K", "Q4_0", "Q8_0", "IQ4_XS", "IQ4_NL", "MXFP4", "TQ2_0", "TQ1_0", "IQ3_S", "IQ3_XXS",
    "IQ2_XS", "IQ2_XXS", "IQ2_S", "IQ1_S", "IQ1_M",
]  # fmt: skip


def make_weight(name: str, rows: int, cols: int, rng: np.random.Generator) -> QTensor:
    qtype = Q[name]
    block = GGML_QUANT_SIZES[qtype][0]
    blocks = random_blocks(rng, qtype, rows * (cols // block))
    scale_down(qtype, blocks)
    return QTensor(name, qtype, (rows, cols), blocks.reshape(rows, -1))


ROOT = Path(__file__).resolve().parent.parent


def _source_at(rev: str, path: str) -> str | None:
    done = subprocess.run(
        ["git", "-C", str(ROOT), "show", f"{rev}:{path}"], capture_output=True, text=True
    )
    return done.stdout if done.returncode == 0 else None


# quant_iq.py and the modules it imports its per-ISA unpackers from, in the order they must run
# (quant_iq_avx2 imports quant_iq_vnni's helpers by name, and quant_iq only as a module object)
_UNPACKER_MODULES = ("quant_iq_vnni", "quant_iq_avx2", "quant_iq")


def revision_unpackers(rev: str) -> pytypes.ModuleType:
    """engine/kernels/quant_iq.py as of `rev`, with the quant_iq_vnni.py / quant_iq_avx2.py it
    had, as a module object that replaces none of the imported ones: while REV's modules run,
    each sibling import resolves to REV's copy (registered in sys.modules, then restored)."""
    sources: dict[str, str] = {}
    for name in _UNPACKER_MODULES:
        src = _source_at(rev, f"engine/kernels/{name}.py")
        if src is not None:
            sources[name] = src
    if "quant_iq" not in sources:
        raise SystemExit(f"--against {rev}: no engine/kernels/quant_iq.py at that revision")
    package = sys.modules["engine.kernels"]
    current = {n: sys.modules.get(f"engine.kernels.{n}") for n in _UNPACKER_MODULES}
    old = {n: pytypes.ModuleType(f"engine.kernels.{n}") for n in sources}
    try:
        for name, mod in old.items():  # all registered first: they import each other
            sys.modules[mod.__name__] = mod
            setattr(package, name, mod)
        for name, mod in old.items():
            exec(compile(sources[name], f"{rev}:{name}.py", "exec"), mod.__dict__)
    finally:
        for name, was in current.items():
            if was is not None:
                sys.modules[was.__name__] = was
                setattr(package, name, was)
            elif name in old:  # not imported here before: leave no trace of REV's copy
                sys.modules.pop(f"engine.kernels.{name}", None)
                delattr(package, name)
    return old["quant_iq"]


def revision_module_ir(old: pytypes.ModuleType, qname: str, isa: str, symbol: str) -> str:
    """The mat-mul module of `qname` built by the template with `old`'s unpackers, its entry
    point renamed to `symbol`."""
    saved = quant_matmul.UNPACK_IQ, quant_matmul.globals_ir, quant_matmul.tile_rows_iq
    rows = getattr(old, "tile_rows_iq", None)
    if rows is None:  # before rows per tile depended on the ISA
        table = getattr(old, "TILE_ROWS_IQ", {})
        rows = lambda q, _isa: table.get(q)  # noqa: E731
    try:
        quant_matmul.UNPACK_IQ, quant_matmul.globals_ir = old.UNPACK_IQ, old.globals_ir
        quant_matmul.tile_rows_iq = rows
        ir = quant_matmul.module_ir(qname, isa)
    finally:
        quant_matmul.UNPACK_IQ, quant_matmul.globals_ir, quant_matmul.tile_rows_iq = saved
    return ir.replace(f"@mm_{qname}(", f"@{symbol}(")


def add_revision_weights(backend, weights: dict, against: str, isa: str) -> None:
    """Beside each codebook/grid type's weight, the same blocks under `TYPE@REV`, bound to the
    kernel REV's unpackers build (compiled into the backend's library under its own name)."""
    old = revision_unpackers(against)
    for t in [t for t in weights if t in quant_iq.UNPACK_IQ]:
        w = weights[t]
        symbol = f"mm_{t}_at_{against.replace('-', '_').replace('~', '_')}"
        ir = revision_module_ir(old, t, isa, symbol)
        backend.library.add_modules([(f"{symbol}_{isa}", ir)])
        # linear() binds a weight to the type's kernel on its first call: bind the copy to REV's
        saved = backend._kernels.get(t)
        backend._kernels[t] = backend.library.address(symbol)
        twin = QTensor(f"{w.name}@{against}", w.qtype, w.shape, w.data)
        backend.linear(twin, np.zeros((1, w.cols), np.float32))
        if saved is None:
            del backend._kernels[t]
        else:
            backend._kernels[t] = saved
        weights[f"{t}@{against}"] = twin
    order = [
        k for t in list(weights) if "@" not in t for k in (t, f"{t}@{against}") if k in weights
    ]
    reordered = {k: weights[k] for k in order}
    weights.clear()
    weights.update(reordered)


def run(shapes, types, threads: int, rounds: int, calls: int, against: str | None = None) -> dict:
    backend = JitBackend(n_threads=threads)
    rng = np.random.default_rng(0)
    result: dict = {"isa": backend.isa, "threads": backend.n_threads, "shapes": {}}
    try:
        for rows, cols in shapes:
            weights = {t: make_weight(t, rows, cols, rng) for t in types}
            if against is not None:
                add_revision_weights(backend, weights, against, backend.isa)
            x = rng.standard_normal((1, cols)).astype(np.float32)
            out = np.empty((1, rows), np.float32)
            for w in weights.values():  # warm up: argument blocks, caches
                for _ in range(3):
                    backend.linear(w, x, out=out)
            cpu: dict[str, list[float]] = {t: [] for t in weights}
            wall: dict[str, list[float]] = {t: [] for t in weights}
            for _ in range(rounds):
                for t, w in weights.items():
                    start, start_cpu = time.perf_counter(), time.thread_time()
                    for _ in range(calls):
                        backend.linear(w, x, out=out)
                    cpu[t].append((time.thread_time() - start_cpu) / calls * 1e6)
                    wall[t].append((time.perf_counter() - start) / calls * 1e6)
            med = {t: statistics.median(v) for t, v in cpu.items()}
            base = med.get("Q4_K")
            result["shapes"][f"{rows}x{cols}"] = {
                t: {
                    "us": med[t],
                    "wall_us": statistics.median(wall[t]),
                    "ratio_q4_k": med[t] / base if base else None,
                    "bytes": weights[t].nbytes,
                }
                for t in weights
            }
    finally:
        backend.close()
    return result


def format_table(result: dict, types) -> str:
    shapes = list(result["shapes"])
    head = "| type | " + " | ".join(f"{s} CPU us | vs Q4_K" for s in shapes) + " |"
    sep = "|---|" + "---:|---:|" * len(shapes)
    lines = [f"ISA {result['isa']}, {result['threads']} thread(s)", "", head, sep]
    for t in result["shapes"][shapes[0]]:
        cells = []
        for s in shapes:
            r = result["shapes"][s][t]
            cells.append(f"{r['us']:.1f} | {r['ratio_q4_k']:.2f}x")
        lines.append(f"| {t} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--shapes", default="2048x2048,4096x4096")
    ap.add_argument("--types", default=",".join(DEFAULT_TYPES))
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--calls", type=int, default=50)
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--against", metavar="REV", help="also time REV's codebook/grid kernels")
    args = ap.parse_args(argv)
    shapes = [tuple(int(n) for n in s.split("x")) for s in args.shapes.split(",")]
    types = args.types.split(",")
    result = run(shapes, types, args.threads, args.rounds, args.calls, args.against)
    print(json.dumps(result, indent=1) if args.json else format_table(result, types))
    return 0


if __name__ == "__main__":
    sys.exit(main())
