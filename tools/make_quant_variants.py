"""Requantize an installed model into each new tensor type with llama.cpp's own quantizer, and
record llama.cpp's greedy continuation of each file as the golden reply for the smoke tests.

    .venv/bin/python -m tools.make_quant_variants OUT_DIR [--model smollm2] [--types IQ4_XS,...]

Needs llama-cpp-python (its bundled libggml-base is the quantizer, its Llama the reference
decoder). Writes `<model>-<TYPE>.gguf` and `<model>-<TYPE>.json` into OUT_DIR, skipping files
that exist. Generated files never go in git; tests/conftest.py runs this once per cache dir.

How: every 2-D `blk.*` weight whose row length is a multiple of the type's block size is
dequantized (gguf-py) to float32 and quantized with `ggml_quantize_chunk` (ggml-quants.c, the
code `llama-quantize` runs), everything else is copied unchanged, metadata included. Every
type is given a uniform importance matrix (every column weighted 1): IQ2_XXS, IQ2_XS and IQ1_S
refuse to quantize without one (`ggml_quantize_requires_imatrix`), and one rule for all keeps
the files comparable. The quantizer's search runs as with a real imatrix, without the quality
a real one (activation statistics from text) would buy. The models here are small and
already quantized, so low-bit variants talk nonsense; the smoke test compares against
llama.cpp on the same file, which is what matters for the engine.

The JSON: prompt token ids (llama.cpp's tokenizer), llama.cpp's greedy tokens and the margin
(top-1 minus top-2 logit) at each step.
"""

from __future__ import annotations

import argparse
import ctypes
import importlib.util
import json
import sys
from pathlib import Path

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFReader, GGUFValueType, GGUFWriter
from gguf.quants import dequantize

Q = GGMLQuantizationType
TYPES = [
    "IQ4_XS", "IQ4_NL", "MXFP4", "TQ2_0", "TQ1_0", "IQ3_S", "IQ3_XXS",
    "IQ2_XS", "IQ2_XXS", "IQ2_S", "IQ1_S", "IQ1_M",
]  # fmt: skip
PROMPT = "The capital of France is"
N_GREEDY = 32  # steps; this small model's margins are mostly small, so take enough of them


def llama_cpp_dir() -> Path | None:
    """llama-cpp-python's package directory, found without importing it (its import leaves a
    /dev/null handle open until exit)."""
    spec = importlib.util.find_spec("llama_cpp")
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations)))


def _ggml() -> ctypes.CDLL:
    package = llama_cpp_dir()
    if package is None:
        raise RuntimeError("llama-cpp-python is not installed (pip install llama-cpp-python)")
    lib = ctypes.CDLL(str(package / "lib" / "libggml-base.so"))
    lib.ggml_quantize_chunk.restype = ctypes.c_size_t
    lib.ggml_quantize_chunk.argtypes = [
        ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64,
        ctypes.c_int64, ctypes.c_void_p,
    ]  # fmt: skip
    lib.ggml_quantize_init.argtypes = [ctypes.c_int]
    return lib


def quantize_rows(lib: ctypes.CDLL, qtype: GGMLQuantizationType, w: np.ndarray) -> np.ndarray:
    """float32 (rows, cols) -> uint8 (rows, row_bytes) by ggml_quantize_chunk."""
    rows, cols = w.shape
    block, size = GGML_QUANT_SIZES[qtype]
    src = np.ascontiguousarray(w, dtype=np.float32)
    dst = np.zeros((rows, cols // block * size), np.uint8)
    importance = np.ones(cols, np.float32)
    lib.ggml_quantize_init(int(qtype))
    written = lib.ggml_quantize_chunk(
        int(qtype), src.ctypes.data, dst.ctypes.data, 0, rows, cols, importance.ctypes.data
    )
    if written != dst.nbytes:
        raise RuntimeError(f"ggml_quantize_chunk wrote {written} bytes, expected {dst.nbytes}")
    return dst


class _TypeTraits(ctypes.Structure):
    # struct ggml_type_traits (ggml.h), up to the fields read here
    _fields_ = [
        ("type_name", ctypes.c_char_p),
        ("blck_size", ctypes.c_int64),
        ("blck_size_interleave", ctypes.c_int64),
        ("type_size", ctypes.c_size_t),
        ("is_quantized", ctypes.c_bool),
        ("to_float", ctypes.c_void_p),
        ("from_float_ref", ctypes.c_void_p),
    ]


_TO_FLOAT = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64)


def ggml_dequantize(qtype: GGMLQuantizationType, data: np.ndarray) -> np.ndarray:
    """llama.cpp's own dequantizer (the type's `to_float`) over raw blocks -> float32 values."""
    lib = _ggml()
    lib.ggml_get_type_traits.restype = ctypes.POINTER(_TypeTraits)
    lib.ggml_get_type_traits.argtypes = [ctypes.c_int]
    traits = lib.ggml_get_type_traits(int(qtype)).contents
    raw = np.ascontiguousarray(data, dtype=np.uint8)
    block, size = GGML_QUANT_SIZES[qtype]
    out = np.empty(raw.size // size * block, np.float32)
    _TO_FLOAT(traits.to_float)(raw.ctypes.data, out.ctypes.data, out.size)
    return out


def _copy_metadata(reader: GGUFReader, writer: GGUFWriter) -> None:
    for name, field in reader.fields.items():
        # the header, and what GGUFWriter writes itself
        if name.startswith("GGUF.") or name in ("general.alignment", "general.architecture"):
            continue
        vtype = field.types[0]
        sub = field.types[-1] if vtype == GGUFValueType.ARRAY else None
        writer.add_key_value(name, field.contents(), vtype, sub)


def requantize(src: Path, dst: Path, qtype: GGMLQuantizationType, lib: ctypes.CDLL) -> int:
    """Write `dst`; returns how many tensors got `qtype`."""
    reader = GGUFReader(src)
    arch = str(reader.fields["general.architecture"].contents())
    writer = GGUFWriter(dst, arch)
    _copy_metadata(reader, writer)
    block = GGML_QUANT_SIZES[qtype][0]
    converted = 0
    for t in reader.tensors:
        cols = int(t.shape[0])  # gguf order: ne0 = row length
        shape = tuple(int(n) for n in reversed(t.shape.tolist()))  # numpy order
        raw = np.asarray(t.data)
        if t.name.startswith("blk.") and len(shape) == 2 and cols % block == 0:
            dense = dequantize(raw.view(np.uint8), t.tensor_type).reshape(shape)
            # (rows, row_bytes) uint8: gguf-py derives the value shape from the byte shape
            writer.add_tensor(t.name, quantize_rows(lib, qtype, dense), raw_dtype=qtype)
            converted += 1
        else:
            writer.add_tensor(t.name, raw, raw_dtype=t.tensor_type)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return converted


def llama_cpp_greedy(path: Path, n: int = N_GREEDY) -> dict:
    """llama.cpp's greedy continuation of PROMPT on `path`, with each step's logit margin."""
    from llama_cpp import Llama

    llm = Llama(str(path), n_ctx=128, n_threads=2, logits_all=True, verbose=False)
    try:
        prompt = llm.tokenize(PROMPT.encode(), add_bos=True, special=False)
        llm.eval(prompt)
        tokens, margins = [], []
        for _ in range(n):
            logits = np.array(llm.scores[llm.n_tokens - 1], dtype=np.float64)
            top2 = np.argsort(logits)[-2:]
            tokens.append(int(top2[1]))
            margins.append(float(logits[top2[1]] - logits[top2[0]]))
            llm.eval([tokens[-1]])
    finally:
        llm.close()
    return {"prompt_ids": [int(i) for i in prompt], "tokens": tokens, "margins": margins}


def model_path(name: str) -> Path:
    from engine.model_files import default_model_path, gemma3_270m_path

    return {"smollm2": default_model_path, "gemma3": gemma3_270m_path}[name]()


def build(out_dir: Path, model: str = "smollm2", types=TYPES, log=print) -> dict[str, Path]:
    """Make every missing variant; returns type name -> file."""
    out_dir.mkdir(parents=True, exist_ok=True)
    src = model_path(model)
    lib = _ggml()
    made = {}
    for name in types:
        dst = out_dir / f"{model}-{name}.gguf"
        ref = dst.with_suffix(".json")
        if not dst.is_file():
            tmp = dst.with_suffix(".partial")
            n = requantize(src, tmp, Q[name], lib)
            tmp.replace(dst)
            log(f"{dst.name}: {n} tensors in {name}")
        if not _reference_is_current(ref):
            ref.write_text(json.dumps(llama_cpp_greedy(dst)))
        made[name] = dst
    return made


def _reference_is_current(path: Path) -> bool:
    try:
        return len(json.loads(path.read_text())["tokens"]) == N_GREEDY
    except (OSError, ValueError, KeyError):
        return False


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description="requantize a model into the IQ/TQ/MXFP4 types")
    ap.add_argument("out_dir", type=Path)
    ap.add_argument("--model", default="smollm2", choices=["smollm2", "gemma3"])
    ap.add_argument("--types", default=",".join(TYPES))
    args = ap.parse_args(argv)
    build(args.out_dir, args.model, args.types.split(","))
    return 0


if __name__ == "__main__":
    sys.exit(main())
