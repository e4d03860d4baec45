"""Fuzz the whole model pipeline with mutated GGUF files: info -> load -> tokenize -> template ->
generate (a few tokens), each file in a worker process under a memory cap and a 10 s deadline.

    PYTHONPATH=. .venv/bin/python tools/fuzz_gguf.py --files 2000 --seed 1 --out /tmp/fuzz

Bases: tiny random-weight models of every architecture (tests/tiny_models.py, SmolLM2's real
vocabulary) and the headers of the real SmolLM2 and Gemma 3 files (their tensor data replaced by
zeros in a sparse file of the real size, so writing a mutant costs no disk). Mutations are
structure-aware (the base is split into header fields, metadata entries and tensor infos, then
re-serialised) plus raw byte-level ones: bit flips, interesting integers, metadata type swaps,
NaN/inf/huge/negative values for the architecture keys, count inflation, string and array length
lies, nested arrays, tensor shape/type/offset changes (overlapping and misaligned data), dropped
and duplicated entries, truncation, NaN/inf tensor data. The same seed gives the same files.

Outcome of each file, decided by the worker:
  ok-typed      an EngineError (the engine refused it with a message)        fine
  ok-success    every stage ran                                               fine
  traceback     any other exception (a bug: the user would see a traceback)
  memory        peak RSS grew more than 500 MB beyond the file's size, or an allocation hit the
                worker's address-space cap (file size + 1.5 GB above its baseline)
  hang          a stage used 10 s of CPU or 60 s of wall time (retried once in a fresh worker)
  crash         the worker died from a signal
The summary (JSON, with every bug's mutation list and message) goes to <out>/summary.json.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import select
import signal
import struct
import subprocess
import sys
import time
import traceback
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import numpy as np

V_UINT8, V_INT8, V_UINT16, V_INT16, V_UINT32, V_INT32, V_FLOAT32, V_BOOL = range(8)
V_STRING, V_ARRAY, V_UINT64, V_INT64, V_FLOAT64 = 8, 9, 10, 11, 12
SCALAR_FORMATS = {
    V_UINT8: "<B",
    V_INT8: "<b",
    V_UINT16: "<H",
    V_INT16: "<h",
    V_UINT32: "<I",
    V_INT32: "<i",
    V_FLOAT32: "<f",
    V_BOOL: "<?",
    V_UINT64: "<Q",
    V_INT64: "<q",
    V_FLOAT64: "<d",
}
# A stage "hangs" when it has used 10 s of CPU (the machine may be shared, so wall time alone
# would count waiting for a core) or 60 s of wall time (blocked without using the CPU).
TIMEOUT_CPU_S = 10.0
TIMEOUT_WALL_S = 60.0
SPIKE_BYTES = 500 << 20
ADDRESS_SLACK_BYTES = 1536 << 20
BUG_OUTCOMES = ("traceback", "memory", "hang", "crash")
UNTYPED_ERROR = re.compile(r"^[A-Z][A-Za-z]*(Error|Exception|Iteration|Interrupt): ")

# --- GGUF as editable parts ------------------------------------------------------------------------


@dataclass
class Parts:
    """A GGUF split into re-serialisable pieces. kvs hold raw encoded values (type + bytes)."""

    version: int
    kvs: list[tuple[bytes, int, bytes]]  # (key bytes, value type, encoded value)
    infos: list[list]  # [name bytes, ne list, qtype, offset]
    alignment: int
    data: bytes | None  # tensor data (tiny bases) or None (sparse real bases)
    data_size: int
    tensor_count: int | None = None  # overrides len(infos) when set (count lies)
    kv_count: int | None = None

    def copy(self) -> Parts:
        return Parts(
            self.version,
            list(self.kvs),
            [[name, list(ne), qtype, offset] for name, ne, qtype, offset in self.infos],
            self.alignment,
            self.data,
            self.data_size,
            self.tensor_count,
            self.kv_count,
        )

    def header(self) -> bytes:
        out = [
            b"GGUF",
            struct.pack(
                "<IQQ",
                self.version,
                len(self.infos) if self.tensor_count is None else self.tensor_count,
                len(self.kvs) if self.kv_count is None else self.kv_count,
            ),
        ]
        for key, vtype, value in self.kvs:
            out += [struct.pack("<Q", len(key)), key, struct.pack("<I", vtype), value]
        for name, ne, qtype, offset in self.infos:
            out += [struct.pack("<Q", len(name)), name, struct.pack("<I", len(ne))]
            out += [struct.pack(f"<{len(ne)}Q", *ne), struct.pack("<IQ", qtype, offset)]
        body = b"".join(out)
        return body + b"\0" * (-len(body) % self.alignment)


def _skip_value(buf: bytes, pos: int, vtype: int) -> int:
    if vtype == V_STRING:
        (n,) = struct.unpack_from("<Q", buf, pos)
        return pos + 8 + n
    if vtype == V_ARRAY:
        etype, n = struct.unpack_from("<IQ", buf, pos)
        pos += 12
        if etype in SCALAR_FORMATS:
            return pos + n * struct.calcsize(SCALAR_FORMATS[etype])
        for _ in range(n):
            pos = _skip_value(buf, pos, etype)
        return pos
    return pos + struct.calcsize(SCALAR_FORMATS[vtype])


def split_gguf(raw: bytes, file_size: int, keep_data: bool) -> Parts:
    version, n_tensors, n_kv = struct.unpack_from("<IQQ", raw, 4)
    pos = 24
    kvs = []
    alignment = 32
    for _ in range(n_kv):
        (n,) = struct.unpack_from("<Q", raw, pos)
        key = raw[pos + 8 : pos + 8 + n]
        pos += 8 + n
        (vtype,) = struct.unpack_from("<I", raw, pos)
        pos += 4
        end = _skip_value(raw, pos, vtype)
        kvs.append((key, vtype, raw[pos:end]))
        if key == b"general.alignment":
            (alignment,) = struct.unpack_from("<I", raw, pos)
        pos = end
    infos = []
    for _ in range(n_tensors):
        (n,) = struct.unpack_from("<Q", raw, pos)
        name = raw[pos + 8 : pos + 8 + n]
        pos += 8 + n
        (n_dims,) = struct.unpack_from("<I", raw, pos)
        ne = list(struct.unpack_from(f"<{n_dims}Q", raw, pos + 4))
        pos += 4 + 8 * n_dims
        qtype, offset = struct.unpack_from("<IQ", raw, pos)
        pos += 12
        infos.append([name, ne, qtype, offset])
    data_start = -(-pos // alignment) * alignment
    data = raw[data_start:] if keep_data else None
    return Parts(version, kvs, infos, alignment, data, file_size - data_start)


# --- value encoders --------------------------------------------------------------------------------
def enc_scalar(vtype: int, value) -> bytes:
    return struct.pack(SCALAR_FORMATS[vtype], value)


def enc_string(s: bytes) -> bytes:
    return struct.pack("<Q", len(s)) + s


def enc_array(etype: int, values: list) -> bytes:
    if etype == V_STRING:
        body = b"".join(enc_string(v) for v in values)
    else:
        body = b"".join(enc_scalar(etype, v) for v in values)
    return struct.pack("<IQ", etype, len(values)) + body


INT_TYPES = (V_UINT8, V_INT8, V_UINT16, V_INT16, V_UINT32, V_INT32, V_UINT64, V_INT64)
INT_RANGES = {
    V_UINT8: (0, 255),
    V_INT8: (-128, 127),
    V_UINT16: (0, 65535),
    V_INT16: (-32768, 32767),
    V_UINT32: (0, 2**32 - 1),
    V_INT32: (-(2**31), 2**31 - 1),
    V_UINT64: (0, 2**64 - 1),
    V_INT64: (-(2**63), 2**63 - 1),
}
INTERESTING_INTS = [0, 1, 2, 3, 4, 6, 7, 8, 16, 31, 64, 255, 4096, 65535, 2**31 - 1, 2**32 - 1,
                    10**9, 2**40, 2**63 - 1, 2**64 - 1, -1, -(2**31), -(2**63)]  # fmt: skip
INTERESTING_FLOATS = [math.nan, math.inf, -math.inf, 0.0, -0.0, 1e-45, 1e-6, 1e9, 1e38, -1.0,
                      0.5, 2.5, 30.0, 1e4, 4294967295.0]  # fmt: skip
INTERESTING_U64 = [0, 1, 2, 31, 32, 255, 2**16, 2**31 - 1, 2**31, 2**32 - 1, 2**32, 2**40,
                   2**62, 2**63, 2**64 - 1]  # fmt: skip
INTERESTING_U32 = [0, 1, 2, 3, 4, 5, 8, 9, 12, 13, 14, 15, 16, 30, 31, 99, 2**16, 2**31,
                   2**32 - 1]  # fmt: skip
INTERESTING_BYTES = [0x00, 0x01, 0x7F, 0x80, 0xFF, 0x0A, 0xC3]
# Keys the engine reads (suffixes after "<arch>."): the targets of value/type mutations.
ARCH_KEYS = ["block_count", "embedding_length", "feed_forward_length", "context_length",
             "attention.head_count", "attention.head_count_kv", "attention.key_length",
             "attention.value_length", "attention.layer_norm_rms_epsilon", "rope.freq_base",
             "rope.dimension_count", "attention.sliding_window", "attention.sliding_window_pattern",
             "rope.scaling.type", "rope.scaling.factor", "final_logit_softcapping",
             "attn_logit_softcapping", "expert_count", "vocab_size"]  # fmt: skip
GENERAL_KEYS = ["general.architecture", "general.alignment", "general.name", "general.file_type",
                "tokenizer.chat_template", "tokenizer.ggml.eos_token_id",
                "tokenizer.ggml.bos_token_id", "tokenizer.ggml.model"]  # fmt: skip


def random_value(rng: np.random.Generator) -> tuple[int, bytes, str]:
    """A hostile value of a random type: (type, encoding, description)."""
    kind = int(rng.integers(0, 10))
    if kind <= 3:
        vtype = INT_TYPES[int(rng.integers(len(INT_TYPES)))]
        lo, hi = INT_RANGES[vtype]
        value = INTERESTING_INTS[int(rng.integers(len(INTERESTING_INTS)))]
        value = min(max(value, lo), hi)
        return vtype, enc_scalar(vtype, value), f"{value} as type {vtype}"
    if kind <= 5:
        vtype = V_FLOAT32 if rng.random() < 0.5 else V_FLOAT64
        value = INTERESTING_FLOATS[int(rng.integers(len(INTERESTING_FLOATS)))]
        return vtype, enc_scalar(vtype, value), f"{value} as type {vtype}"
    if kind == 6:
        choices = [b"", b"7", b"nan", b"llama", b"linear", b"\xff\xfe", b"x" * 300]
        s = choices[int(rng.integers(len(choices)))]
        return V_STRING, enc_string(s), f"string {s[:20]!r}"
    if kind == 7:
        return V_BOOL, enc_scalar(V_BOOL, bool(rng.integers(2))), "bool"
    if kind == 8:
        etype = [V_UINT32, V_FLOAT32, V_STRING, V_BOOL, V_INT32][int(rng.integers(5))]
        n = int(rng.integers(0, 40))
        if etype == V_STRING:
            values = [b"a"] * n
        elif etype == V_FLOAT32:
            values = [math.nan] * n
        elif etype == V_BOOL:
            values = [bool(i % 2) for i in range(n)]
        elif etype == V_INT32:
            values = [-1] * n
        else:
            values = [2**32 - 1] * n
        return V_ARRAY, enc_array(etype, values), f"array of {n} x type {etype}"
    depth = int(rng.integers(2, 8))
    inner = struct.pack("<IQ", V_UINT8, 1) + b"\x07"
    for _ in range(depth - 1):
        inner = struct.pack("<IQ", V_ARRAY, 1) + inner
    return V_ARRAY, inner, f"array nested {depth} deep"


# --- mutations -------------------------------------------------------------------------------------
def _pick(rng, seq):
    return seq[int(rng.integers(len(seq)))]


def _arch(parts: Parts) -> bytes:
    for key, vtype, value in parts.kvs:
        if key == b"general.architecture" and vtype == V_STRING:
            return value[8:]
    return b"llama"


def mutate_structured(rng: np.random.Generator, parts: Parts) -> str:
    """Change `parts` in place; return a description."""
    for _ in range(20):
        description = _mutate_once(rng, parts)
        if description != "no-op":
            return description
    return description


# Weights of the mutation kinds of _mutate_once (index = kind): engine-read values and tensor
# infos dominate, since they decide what the later stages see.
KIND_WEIGHTS = np.array([4, 3, 2, 2, 1, 1, 1, 2, 1, 1, 2, 1, 1, 1, 1, 3], dtype=float)


def _mutate_once(rng: np.random.Generator, parts: Parts) -> str:
    kind = int(rng.choice(len(KIND_WEIGHTS), p=KIND_WEIGHTS / KIND_WEIGHTS.sum()))
    arch = _arch(parts)
    if kind <= 2:  # a hostile value for a key the engine reads
        if rng.random() < 0.8:
            key = arch + b"." + _pick(rng, ARCH_KEYS).encode()
        else:
            key = _pick(rng, GENERAL_KEYS).encode()
        vtype, value, what = random_value(rng)
        parts.kvs = [kv for kv in parts.kvs if kv[0] != key]
        parts.kvs.insert(int(rng.integers(len(parts.kvs) + 1)), (key, vtype, value))
        return f"set {key.decode(errors='replace')} = {what}"
    if kind == 3 and parts.kvs:  # retype an existing entry, keeping its bytes
        i = int(rng.integers(len(parts.kvs)))
        key, vtype, value = parts.kvs[i]
        new_type = int(rng.integers(0, 14))
        if vtype == V_ARRAY and len(value) >= 12 and rng.random() < 0.5:  # the element type
            parts.kvs[i] = (key, vtype, struct.pack("<I", new_type) + value[4:])
            return f"retype elements of {key[:60].decode(errors='replace')} -> {new_type}"
        parts.kvs[i] = (key, new_type, value)
        return f"retype {key[:60].decode(errors='replace')} {vtype}->{new_type}"
    if kind == 4 and parts.kvs:  # drop an entry
        i = int(rng.integers(len(parts.kvs)))
        key = parts.kvs.pop(i)[0]
        return f"drop key {key[:60].decode(errors='replace')}"
    if kind == 5:  # count lies
        extra = _pick(rng, [1, 2, 100, 2**31, 2**63, 2**64 - 1])
        if rng.random() < 0.5:
            parts.tensor_count = min(len(parts.infos) + extra, 2**64 - 1)
            return f"tensor_count += {extra}"
        parts.kv_count = min(len(parts.kvs) + extra, 2**64 - 1)
        return f"kv_count += {extra}"
    if kind == 6 and parts.kvs:  # string / array length lies
        candidates = [
            i for i, (_, vtype, value) in enumerate(parts.kvs)
            if (vtype == V_STRING and len(value) >= 8) or (vtype == V_ARRAY and len(value) >= 12)
        ]  # fmt: skip
        if candidates:
            i = _pick(rng, candidates)
            key, vtype, value = parts.kvs[i]
            lie = _pick(rng, [1, 7, 4096, 2**32, 2**62])
            sign = 1 if rng.random() < 0.7 else -1
            if vtype == V_STRING:
                (n,) = struct.unpack_from("<Q", value)
                new = max(0, n + sign * lie) % 2**64
                parts.kvs[i] = (key, vtype, struct.pack("<Q", new) + value[8:])
            else:
                etype, n = struct.unpack_from("<IQ", value)
                new = max(0, n + sign * lie) % 2**64
                parts.kvs[i] = (key, vtype, struct.pack("<IQ", etype, new) + value[12:])
            return f"length lie {key[:60].decode(errors='replace')}: -> {new}"
    if parts.infos and kind in (7, 8, 9, 10, 11, 12):
        i = int(rng.integers(len(parts.infos)))
        name = parts.infos[i][0].decode(errors="replace")
        if kind == 7:  # a dimension changed
            ne = parts.infos[i][1]
            d = int(rng.integers(len(ne)))
            new = _pick(rng, [1, 2, 32, 256, ne[d] * 2, ne[d] // 2 or 1, ne[d] + 32, 2**31, 2**40])
            ne[d] = new
            return f"tensor {name} ne[{d}] = {new}"
        if kind == 8:  # dimensions added, dropped or swapped
            ne = parts.infos[i][1]
            op = int(rng.integers(3))
            if op == 0 and len(ne) > 1:
                ne.reverse()
                return f"tensor {name} dims reversed"
            if op == 1 and len(ne) > 1:
                ne.pop()
                return f"tensor {name} last dim dropped"
            ne.append(1)
            return f"tensor {name} dim 1 appended"
        if kind == 9:  # another type
            new = _pick(rng, [0, 1, 2, 3, 6, 7, 8, 10, 11, 12, 13, 14, 30, 24, 99])
            parts.infos[i][2] = new
            return f"tensor {name} type -> {new}"
        if kind == 10:  # overlapping or misaligned data
            j = int(rng.integers(len(parts.infos)))
            op = int(rng.integers(3))
            if op == 0:
                parts.infos[i][3] = parts.infos[j][3]
                return f"tensor {name} offset = that of #{j} (overlap)"
            if op == 1:
                parts.infos[i][3] += _pick(rng, [1, 4, 16])
                return f"tensor {name} offset misaligned"
            parts.infos[i][3] = _pick(rng, [0, parts.alignment, 2**40, 2**63])
            return f"tensor {name} offset -> {parts.infos[i][3]}"
        if kind == 11:  # renamed (missing tensor, unknown layer, bias where none belongs)
            new = _pick(
                rng,
                [b"blk.999.attn_q.weight", b"blk.0.attn_q.bias", b"output.weight", b"", b"\xff",
                 b"rope_freqs.weight", b"blk.1.attn_norm.weight", parts.infos[0][0]],
            )  # fmt: skip
            parts.infos[i][0] = new
            return f"tensor {name} renamed {new!r}"
        parts.infos.pop(i)
        return f"tensor {name} dropped"
    if kind == 13:  # version
        parts.version = _pick(rng, [0, 1, 2, 4, 2**16, 2**32 - 1])
        return f"version {parts.version}"
    if kind == 14:  # alignment
        vtype, value, what = (
            (V_UINT32, enc_scalar(V_UINT32, _pick(rng, [1, 8, 64, 4096])), "power of two")
            if rng.random() < 0.5
            else random_value(rng)
        )
        parts.kvs = [kv for kv in parts.kvs if kv[0] != b"general.alignment"]
        parts.kvs.append((b"general.alignment", vtype, value))
        return f"general.alignment = {what}"
    # NaN / inf / huge in tensor data (norms, biases and weights): tiny bases only
    if parts.data is not None and parts.infos:
        i = int(rng.integers(len(parts.infos)))
        name, ne, qtype, offset = parts.infos[i]
        data = bytearray(parts.data)
        poison = _pick(rng, [math.nan, math.inf, -math.inf, 3e38])
        if qtype == 0:  # F32: poison a few values
            n = int(np.prod(ne))
            for _ in range(int(rng.integers(1, 4))):
                at = offset + 4 * int(rng.integers(n))
                data[at : at + 4] = struct.pack("<f", poison)
        else:  # block types: poison the leading fp16 scale of the first block
            with np.errstate(over="ignore"):  # 3e38 becomes fp16 inf, as intended
                data[offset : offset + 2] = np.array([poison], np.float16).tobytes()
        parts.data = bytes(data)
        return f"tensor {name.decode(errors='replace')} data poisoned with {poison}"
    return "no-op"


def mutate_raw(rng: np.random.Generator, data: bytes, lo: int, hi: int) -> tuple[bytes, str]:
    at = int(rng.integers(lo, max(lo + 1, hi)))
    buf = bytearray(data)
    kind = int(rng.integers(0, 6))
    if kind == 0:
        bit = int(rng.integers(0, 8))
        buf[at] ^= 1 << bit
        return bytes(buf), f"flip bit {bit} at {at}"
    if kind == 1:
        value = _pick(rng, INTERESTING_BYTES) if rng.random() < 0.5 else int(rng.integers(256))
        buf[at] = value
        return bytes(buf), f"byte {value:#x} at {at}"
    if kind == 2:
        value = _pick(rng, INTERESTING_U64)
        buf[at : at + 8] = struct.pack("<Q", value)
        return bytes(buf[: len(data)]), f"u64 {value} at {at}"
    if kind == 3:
        value = _pick(rng, INTERESTING_U32)
        buf[at : at + 4] = struct.pack("<I", value)
        return bytes(buf[: len(data)]), f"u32 {value} at {at}"
    if kind == 4:
        n = int(rng.integers(1, 64))
        del buf[at : at + n]
        return bytes(buf), f"delete {n} bytes at {at}"
    n = int(rng.integers(1, 64))
    buf[at:at] = rng.integers(0, 256, size=n, dtype=np.uint8).tobytes()
    return bytes(buf), f"insert {n} random bytes at {at}"


MINI_VOCAB = 1024


def mini_vocab_metadata() -> dict:
    """SmolLM2's tokenizer cut to its first MINI_VOCAB tokens (specials, bytes, the first merges)
    and the merges among them: a real BPE vocabulary that builds in milliseconds."""
    from gguf import GGUFValueType

    from tests.tiny_models import tokenizer_metadata

    meta = {key: (value, vtype) for key, value, vtype, _ in tokenizer_metadata("smollm2")}
    tokens = meta["tokenizer.ggml.tokens"][0][:MINI_VOCAB]
    vocab = set(tokens)
    merges = [
        m for m in meta["tokenizer.ggml.merges"][0]
        if len(parts := m.split(" ")) == 2 and parts[0] + parts[1] in vocab
        and parts[0] in vocab and parts[1] in vocab
    ]  # fmt: skip
    meta["tokenizer.ggml.tokens"] = (tokens, GGUFValueType.ARRAY)
    meta["tokenizer.ggml.token_type"] = (
        meta["tokenizer.ggml.token_type"][0][:MINI_VOCAB],
        GGUFValueType.ARRAY,
    )
    meta["tokenizer.ggml.merges"] = (merges, GGUFValueType.ARRAY)
    return meta


@dataclass
class Base:
    name: str
    parts: Parts


def write_mutant(rng: np.random.Generator, base: Base, path: Path) -> list[str]:
    """Write one mutant of `base` to `path`; return the mutations applied."""
    parts = base.parts.copy()
    steps = []
    for _ in range(1 if rng.random() < 0.6 else int(rng.integers(2, 4))):
        steps.append(mutate_structured(rng, parts))
    header = parts.header()
    data_size = parts.data_size
    truncate_to = None
    r = rng.random()
    if r < 0.15:  # a raw mutation of the serialised header on top
        header, what = mutate_raw(rng, header, 0, len(header))
        steps.append(what)
    elif r < 0.2:
        total = len(header) + data_size
        truncate_to = int(rng.integers(0, total))
        steps.append(f"truncate to {truncate_to} of {total}")
    with open(path, "wb") as f:
        f.write(header)
        if parts.data is not None:
            f.write(parts.data)
        else:
            f.truncate(len(header) + data_size)  # sparse zeros: no disk cost
        if truncate_to is not None:
            f.truncate(truncate_to)
    return steps


def mini_vocab_bases(directory: Path) -> list[Base]:
    """Tiny models of the architectures with the mini vocabulary: the whole pipeline runs on them
    in a fraction of a second (phi3's fused tensors, olmo2's post-norm layout, gemma2's soft-caps
    and granite's multipliers among them)."""
    from tests.tiny_models import write_tiny_model

    bases = []
    archs = (("qwen3", 8), ("llama", 2), ("gemma3", 0), ("qwen2", 12), ("phi3", 8), ("olmo2", 2))
    for arch, qtype in archs + (("gemma2", 0), ("granite", 8)):
        path = directory / f"tiny-{arch}-{qtype}-mini-vocab.gguf"
        if not path.exists():
            wide = qtype == 12  # K-quants need rows that are multiples of 256
            write_tiny_model(path, arch, qtype, tokenizer=None, vocab_size=MINI_VOCAB,
                             d_model=256 if wide else 64, d_ff=256 if wide else 128,
                             head_dim=64 if wide else 16,
                             extra_metadata=mini_vocab_metadata())  # fmt: skip
        raw = path.read_bytes()
        bases.append(Base(path.stem, split_gguf(raw, len(raw), keep_data=True)))
    return bases


def make_bases(out: Path, include_real: bool) -> list[Base]:
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from engine.model_files import default_model_path, gemma3_270m_path
    from tests.tiny_models import write_tiny_model

    seeds = out / "bases"
    seeds.mkdir(parents=True, exist_ok=True)
    bases = []
    tiny = [("qwen2", 8, "smollm2"), ("gemma3", 2, "smollm2"), ("llama", 14, None)]
    for arch, qtype, tokenizer in tiny:
        path = seeds / f"tiny-{arch}-{qtype}-{tokenizer}.gguf"
        if not path.exists():
            write_tiny_model(path, arch, qtype, tokenizer=tokenizer, d_model=256 if qtype == 14 else 64,
                             d_ff=256 if qtype == 14 else 128,
                             head_dim=64 if qtype == 14 else 16)  # fmt: skip
        raw = path.read_bytes()
        bases.append(Base(path.stem, split_gguf(raw, len(raw), keep_data=True)))
    bases += mini_vocab_bases(seeds)
    if include_real:
        for name, find in (("smollm2", default_model_path), ("gemma3-270m", gemma3_270m_path)):
            try:
                real = find()
            except Exception as exc:  # a real model that is not installed is skipped, said so
                print(f"skipping real base {name}: {exc}", file=sys.stderr)
                continue
            size = real.stat().st_size
            with open(real, "rb") as f:
                head = f.read(min(size, 16 << 20))
            bases.append(Base(name, split_gguf(head, size, keep_data=False)))
    return bases


# --- the worker: runs the pipeline on one file at a time --------------------------------------------
def _status_kib(field_name: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field_name + ":"):
                return int(line.split()[1])
    return 0


def _reset_peak_rss() -> bool:
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # resets VmHWM (Linux >= 4.0)
        return True
    except OSError:
        return False


def run_pipeline(path: Path, stage=lambda name: None) -> None:
    """info -> load -> tokenize -> template -> generate; `stage(name)` is called as each starts."""
    from engine.__main__ import model_info
    from engine.events import Finished
    from engine.generate import GenerationRequest, generate
    from engine.loader import load_model

    stage("info")
    model_info(path)
    stage("load")
    with load_model(path, n_threads=1) as lm:
        stage("tokenize")
        lm.tokenizer.encode("Hello, world! 123 <|im_start|> héllo")
        stage("template")
        messages = [{"role": "user", "content": "Hi there"}]
        lm.chat_template.render(messages)
        stage("generate")
        request = GenerationRequest(
            messages=messages, overrides={"max_new_tokens": 3, "temperature": 0.0}
        )
        for event in generate(lm, request):
            # generate() reports an untyped exception as "TypeName: message" in Finished.error
            if isinstance(event, Finished) and UNTYPED_ERROR.match(event.error or ""):
                raise RuntimeError(f"generate finished with an untyped error: {event.error}")


def worker_main() -> None:
    import resource

    from engine.errors import EngineError
    from engine.kernels.backend import get_backend

    get_backend()  # compile or load the kernels before the first deadline starts
    out = sys.stdout
    out.write("READY\n")
    out.flush()
    for line in sys.stdin:
        path = Path(line.strip())
        size = path.stat().st_size if path.exists() else 0
        base_vm = _status_kib("VmSize") * 1024
        cap = base_vm + size + ADDRESS_SLACK_BYTES
        resource.setrlimit(resource.RLIMIT_AS, (cap, resource.RLIM_INFINITY))
        can_reset = _reset_peak_rss()
        base_rss = _status_kib("VmRSS") * 1024
        out.write(f"START {path}\n")
        out.flush()
        result: dict = {"file": str(path), "size": size}

        def stage(name: str, result: dict = result) -> None:
            result["stage"] = name
            out.write(f"STAGE {name}\n")
            out.flush()

        try:
            run_pipeline(path, stage)
            result["outcome"] = "ok-success"
        except EngineError as exc:
            cause = exc.__cause__ or exc.__context__
            if isinstance(cause, MemoryError):
                result["outcome"] = "memory"
            else:
                result["outcome"] = "ok-typed"
            result["error"] = f"{type(exc).__name__}: {str(exc)[:300]}"
        except MemoryError as exc:
            result["outcome"] = "memory"
            result["error"] = f"MemoryError: {exc}"
        except Exception as exc:
            result["outcome"] = "traceback"
            result["error"] = f"{type(exc).__name__}: {str(exc)[:300]}"
            result["traceback"] = traceback.format_exc()[-3000:]
        finally:
            resource.setrlimit(resource.RLIMIT_AS, (resource.RLIM_INFINITY,) * 2)
        if can_reset:
            growth = _status_kib("VmHWM") * 1024 - base_rss
            result["rss_growth"] = growth
            if growth > size + SPIKE_BYTES and result["outcome"].startswith("ok"):
                result["outcome"] = "memory"
                result["error"] = f"peak RSS grew by {growth >> 20} MB for a {size >> 20} MB file"
        out.write("RESULT " + json.dumps(result) + "\n")
        out.flush()


# --- the parent: feeds workers, enforces the deadline ---------------------------------------------
class Worker:
    def __init__(self, env: dict[str, str]):
        self.proc = subprocess.Popen(
            [sys.executable, __file__, "--worker"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            env=env,
            text=True,
        )
        self.pending = b""
        line = self._readline(120.0)
        if line != "READY":
            raise RuntimeError(f"worker failed to start: {line!r}")

    def _readline(self, timeout: float) -> str | None:
        """The next line from the worker, "" if it exited, None after `timeout` seconds."""
        deadline = time.monotonic() + timeout
        fd = self.proc.stdout.fileno()
        while b"\n" not in self.pending:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([fd], [], [], left)[0]:
                return None
            chunk = os.read(fd, 1 << 16)
            if not chunk:
                return ""
            self.pending += chunk
        line, _, self.pending = self.pending.partition(b"\n")
        return line.decode("utf-8", "replace")

    def run(self, path: Path) -> dict:
        self.proc.stdin.write(f"{path}\n")
        self.proc.stdin.flush()
        line = self._readline(60.0)  # START (after the memory setup)
        if not line or not line.startswith("START"):
            return self._died(path)
        started = time.monotonic()
        stage, stage_wall, stage_cpu = "start", started, self.cpu_seconds()
        while True:  # the deadline applies to each stage: no single step may take 10 s
            line = self._readline(1.0)
            if line is None:
                cpu = self.cpu_seconds() - stage_cpu
                wall = time.monotonic() - stage_wall
                if cpu < TIMEOUT_CPU_S and wall < TIMEOUT_WALL_S:
                    continue
                self.kill()
                return {"file": str(path), "outcome": "hang",
                        "error": f"stage {stage}: {cpu:.1f} s CPU, {wall:.1f} s wall",
                        "seconds": round(time.monotonic() - started, 1)}  # fmt: skip
            if line.startswith("STAGE "):
                stage, stage_wall, stage_cpu = line[6:], time.monotonic(), self.cpu_seconds()
                continue
            if not line.startswith("RESULT "):
                return self._died(path)
            break
        result = json.loads(line[len("RESULT ") :])
        result["seconds"] = round(time.monotonic() - started, 3)
        return result

    def cpu_seconds(self) -> float:
        """User + system CPU time the worker has used (Linux /proc)."""
        try:
            with open(f"/proc/{self.proc.pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            return 0.0
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def _died(self, path: Path) -> dict:
        code = self.proc.wait(timeout=30)
        sig = -code if code < 0 else None
        name = signal.Signals(sig).name if sig else f"exit {code}"
        return {"file": str(path), "outcome": "crash", "error": name}

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(timeout=30)

    @property
    def alive(self) -> bool:
        return self.proc.poll() is None


def run_fuzz(args) -> dict:
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    bases = make_bases(out, include_real=not args.tiny_only)
    rng = np.random.default_rng(args.seed)
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parent.parent)}
    worker = Worker(env)
    counts: Counter[str] = Counter()
    seconds: Counter[str] = Counter()
    stages: Counter[str] = Counter()  # the stage each file reached (failed in, or finished)
    errors: Counter[str] = Counter()  # typed errors, numbers masked
    max_beyond: list = [0, None]  # largest peak-RSS growth beyond the file's size, and its file
    per_base: dict[str, Counter] = {}
    bugs = []
    mutant = out / "mutant.gguf"
    started = time.monotonic()
    for index in range(args.files):
        # Full vocabularies (real bases, SmolLM2's 49k tokens) take ~1-6 s to build per file:
        # one case in five uses one, the others a mini-vocabulary base.
        big = [b for b in bases if "mini-vocab" not in b.name]
        small = [b for b in bases if "mini-vocab" in b.name]
        pool = big if index % 5 == 4 else small
        base = pool[int(rng.integers(len(pool)))]
        steps = write_mutant(rng, base, mutant)
        if not worker.alive:
            worker = Worker(env)
        result = worker.run(mutant)
        if result["outcome"] in ("hang", "crash"):
            worker.kill()
            worker = Worker(env)
            if result["outcome"] == "hang":  # a busy machine can stall a worker: retry once
                result = worker.run(mutant)
                if result["outcome"] in ("hang", "crash"):
                    worker.kill()
                    worker = Worker(env)
        counts[result["outcome"]] += 1
        stages[result.get("stage", "-")] += 1
        beyond = result.get("rss_growth", 0) - result.get("size", 0)
        if beyond > max_beyond[0]:
            max_beyond[:] = [beyond, steps]
        if result["outcome"] == "ok-typed":
            message = result["error"].replace(str(mutant), "<file>")
            errors[re.sub(r"\d+", "N", message)[:90]] += 1
        seconds[base.name] += result.get("seconds", 0.0)
        per_base.setdefault(base.name, Counter())[result["outcome"]] += 1
        if result["outcome"] in BUG_OUTCOMES:
            keep = out / f"bug-{index:05d}.gguf"
            os.replace(mutant, keep)
            bugs.append({"index": index, "base": base.name, "mutations": steps, **result,
                         "file": str(keep)})  # fmt: skip
            print(f"[{index}] {result['outcome']}: {base.name} {steps}: {result.get('error')}",
                  flush=True)  # fmt: skip
        if (index + 1) % 100 == 0:
            rate = (index + 1) / (time.monotonic() - started)
            print(f"{index + 1} files, {dict(counts)}, {rate:.1f} files/s", flush=True)
    worker.kill()
    summary = {
        "command": " ".join(sys.argv),
        "seed": args.seed,
        "files": args.files,
        "seconds": round(time.monotonic() - started, 1),
        "outcomes": dict(counts),
        "per_base": {k: dict(v) for k, v in per_base.items()},
        "seconds_per_base": {k: round(v, 1) for k, v in seconds.items()},
        "stage_reached": dict(stages),
        "max_rss_growth_beyond_file_mb": round(max_beyond[0] / 2**20, 1),
        "max_rss_growth_mutations": max_beyond[1],
        "typed_errors": dict(errors.most_common()),
        "bugs": bugs,
    }
    (out / "summary.json").write_text(json.dumps(summary, indent=2))
    return summary


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--files", type=int, default=2000, help="number of mutants")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--out", default="fuzz-out", help="directory for bases, bugs, summary")
    parser.add_argument("--tiny-only", action="store_true", help="skip the real-model bases")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        worker_main()
        return 0
    summary = run_fuzz(args)
    print(json.dumps({k: summary[k] for k in ("files", "seconds", "outcomes")}))
    return 1 if any(summary["outcomes"].get(k) for k in BUG_OUTCOMES) else 0


if __name__ == "__main__":
    sys.exit(main())
