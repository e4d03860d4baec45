"""GGUF file -> metadata (plain Python values) + weight tensors as views into a memory map.

A model file is untrusted input. Every count, length, dimension and offset in the header is
checked against the file size *before* it is used, so a corrupt or hostile file gives a typed
`ModelFileError` naming the problem instead of a crash, a hang or a multi-gigabyte allocation.

Why our own header parser instead of `gguf.GGUFReader`: GGUFReader builds several numpy arrays
per metadata string, which costs 3.6 s for SmolLM2's 49k-token vocabulary and 24 s for Gemma 3's
262k one on the development machine, and it trusts the counts it reads (a uint8 array claiming
2^61 elements makes it spin practically forever: it reads empty slices past the end of the file). The format is small (spec: ggml/docs/gguf.md), so we walk it once with
`struct` over an `mmap`, validating as we go; the tests check the result against GGUFReader on
real and tiny files. Tensors are numpy views of the same memory map: nothing is copied.

Layout (little-endian): magic "GGUF", u32 version, u64 tensor_count, u64 kv_count,
kv_count x (string key, u32 value type, value), tensor_count x (string name, u32 n_dims,
n_dims x u64 ne (fastest-varying first), u32 ggml type, u64 offset), padding to
`general.alignment` (default 32), tensor data. Strings are u64 length + UTF-8 bytes.
"""

from __future__ import annotations

import math
import mmap
import os
import struct
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFValueType

from engine.errors import ModelFileError, UnsupportedModelError
from engine.qtensor import QTensor

GGUF_MAGIC = b"GGUF"
SUPPORTED_VERSIONS = (2, 3)
DEFAULT_ALIGNMENT = 32
MAX_DIMS = 4  # GGML_MAX_DIMS
MAX_ARRAY_NESTING = 4  # arrays of arrays are legal; real files use at most one level
# A tensor with more elements than this is not a model we could run on a desktop (2^40 ~ 1.1e12).
MAX_TENSOR_ELEMENTS = 1 << 40
# Metadata becomes Python objects (~5-40 bytes each per byte of file), so its size is capped well
# above anything real and far below what a large file could otherwise make us allocate: the
# biggest arrays are vocabularies (Gemma 3: 262,144 tokens), the longest strings chat templates
# (~10 KB).
MAX_STRING_BYTES = 1 << 24  # 16 MiB per string
MAX_ARRAY_ELEMENTS = 1 << 22  # 4,194,304 per array, 16x the largest vocabulary
MAX_METADATA_ELEMENTS = 1 << 23  # all arrays together
MAX_NESTED_ARRAYS = 1 << 16  # arrays of arrays: unused by real models; each costs a Python list

Q = GGMLQuantizationType
SUPPORTED_QTYPES: tuple[GGMLQuantizationType, ...] = (
    Q.F32, Q.F16, Q.BF16, Q.Q4_0, Q.Q4_1, Q.Q5_0, Q.Q5_1, Q.Q8_0,
    Q.Q2_K, Q.Q3_K, Q.Q4_K, Q.Q5_K, Q.Q6_K,
    Q.IQ4_NL, Q.IQ4_XS, Q.MXFP4, Q.TQ1_0, Q.TQ2_0, Q.IQ3_S, Q.IQ3_XXS,
    Q.IQ2_XS, Q.IQ2_XXS, Q.IQ2_S, Q.IQ1_S, Q.IQ1_M,
)  # fmt: skip
SUPPORTED_QTYPE_NAMES = ", ".join(t.name for t in SUPPORTED_QTYPES)

# struct format and size of each scalar metadata type.
_SCALAR_FORMATS: dict[int, tuple[str, int]] = {
    GGUFValueType.UINT8: ("<B", 1),
    GGUFValueType.INT8: ("<b", 1),
    GGUFValueType.UINT16: ("<H", 2),
    GGUFValueType.INT16: ("<h", 2),
    GGUFValueType.UINT32: ("<I", 4),
    GGUFValueType.INT32: ("<i", 4),
    GGUFValueType.FLOAT32: ("<f", 4),
    GGUFValueType.UINT64: ("<Q", 8),
    GGUFValueType.INT64: ("<q", 8),
    GGUFValueType.FLOAT64: ("<d", 8),
    GGUFValueType.BOOL: ("<?", 1),
}
_SCALAR_DTYPES: dict[int, str] = {
    GGUFValueType.UINT8: "<u1",
    GGUFValueType.INT8: "<i1",
    GGUFValueType.UINT16: "<u2",
    GGUFValueType.INT16: "<i2",
    GGUFValueType.UINT32: "<u4",
    GGUFValueType.INT32: "<i4",
    GGUFValueType.FLOAT32: "<f4",
    GGUFValueType.UINT64: "<u8",
    GGUFValueType.INT64: "<i8",
    GGUFValueType.FLOAT64: "<f8",
    GGUFValueType.BOOL: "u1",
}
# Smallest encodings, used to bound counts before looping over them:
_MIN_KV_BYTES = 8 + 4 + 1  # empty key, type, one-byte value
_MIN_TENSOR_INFO_BYTES = 8 + 4 + 4 + 8  # empty name, n_dims=0, type, offset
_MIN_ARRAY_BYTES = 4 + 8  # element type + length of an empty nested array
_HEADER_BYTES = 4 + 4 + 8 + 8


@dataclass(frozen=True)
class ValueType:
    """The stored type of a metadata value (arrays also name their element type)."""

    type: GGUFValueType
    element_type: GGUFValueType | None = None


@dataclass(eq=False)
class GGUFFile:
    path: Path
    version: int
    metadata: dict[str, Any]
    metadata_types: dict[str, ValueType]
    tensors: dict[str, QTensor]
    file_size: int
    alignment: int
    data_offset: int  # where tensor data starts (tensor offsets are relative to it)
    tensor_offsets: dict[str, int] = field(default_factory=dict)  # absolute file offsets
    # open_gguf(..., skip_unsupported_types=True) only: tensors left out because the engine
    # cannot run their type (name -> the refusal), so `info` can still describe the file.
    unsupported_tensors: dict[str, str] = field(default_factory=dict)

    def __repr__(self) -> str:  # the default would print the whole vocabulary
        return (
            f"GGUFFile({str(self.path)!r}, v{self.version}, arch={self.arch!r}, "
            f"{len(self.metadata)} keys, {len(self.tensors)} tensors, {self.file_size} bytes)"
        )

    @property
    def arch(self) -> str:
        return self.metadata["general.architecture"]

    def arch_value(self, suffix: str, default: Any = None) -> Any:
        """`{arch}.{suffix}` from the metadata, e.g. arch_value("block_count")."""
        return self.metadata.get(f"{self.arch}.{suffix}", default)

    def parameter_count(self) -> int:
        # math.prod, not np.prod: ~20x cheaper per call, and the model library sums ~300 per file.
        return sum(math.prod(t.shape) for t in self.tensors.values())

    def quant_mix(self) -> dict[str, tuple[int, int]]:
        """Tensor type name -> (tensor count, bytes), largest share first."""
        mix: dict[str, list[int]] = {}
        for t in self.tensors.values():
            entry = mix.setdefault(t.qtype.name, [0, 0])
            entry[0] += 1
            entry[1] += t.nbytes
        ordered = sorted(mix.items(), key=lambda kv: -kv[1][1])
        return {name: (count, nbytes) for name, (count, nbytes) in ordered}

    def tensor_bytes(self) -> int:
        return sum(t.nbytes for t in self.tensors.values())


class UnreadStrings:
    """A string array that open_gguf(..., skip_string_arrays=True) walked (bounds-checked) but did
    not decode: its length is known (ModelConfig compares the vocabulary size with the embedding),
    its contents are not. Decoding SmolLM2's 98k vocabulary and merge strings is ~50 ms per file,
    which is what a model library listing dozens of files cannot afford."""

    __slots__ = ("length",)

    def __init__(self, length: int):
        self.length = length

    def __len__(self) -> int:
        return self.length

    def __repr__(self) -> str:
        return f"UnreadStrings({self.length})"


class NumericArray(Sequence):
    """A long numeric metadata array (token types, scores: 256 elements or more) as a read-only
    numpy view of the file's map (`.array`), so a 262k-token vocabulary's scores cost no memory
    instead of 262k Python floats. It reads like the list it replaces: elements, slices and
    iteration give Python ints and floats, and it compares equal to a list of the same values
    (code that copies metadata into a GGUFWriter or a test's dict keeps working)."""

    __slots__ = ("array",)

    def __init__(self, array: np.ndarray):
        self.array = array

    def __len__(self) -> int:
        return len(self.array)

    def __getitem__(self, index):
        if isinstance(index, slice):
            return self.array[index].tolist()
        return self.array[index].item()

    def __iter__(self):
        return iter(self.array.tolist())

    def __eq__(self, other: object) -> bool:
        if isinstance(other, NumericArray):
            return bool(np.array_equal(self.array, other.array))
        if isinstance(other, (list, tuple)):
            return len(other) == len(self) and list(self) == list(other)
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"NumericArray({self.array.dtype}, {len(self.array)})"


class StringArray(Sequence):
    """A long string metadata array (a vocabulary, merges) held as one UTF-8 blob and int64
    offsets instead of a list of str: Gemma 3's 262k tokens were 21.6 MiB of str objects and are
    3.5 MiB here (issue 32). It reads like the list it replaces (elements, slices and iteration
    give str, it compares equal to a list of the same strings); `tolist()` makes the list at once
    for code that needs every string (building a tokenizer), to be dropped after. Every element
    is valid UTF-8 (checked when it is made)."""

    __slots__ = ("_blob", "_offsets", "_starts")

    def __init__(self, blob: bytes, offsets: np.ndarray):
        self._blob = blob
        self._offsets = offsets  # int64, len + 1 entries: element i is blob[o[i]:o[i + 1]]
        self._starts = memoryview(offsets.data)  # Python ints per index, ~5x faster than numpy's

    @classmethod
    def from_list(cls, strings: Sequence[str]) -> StringArray:
        encoded = [text.encode("utf-8", "surrogatepass") for text in strings]
        offsets = np.zeros(len(encoded) + 1, dtype=np.int64)
        np.cumsum([len(b) for b in encoded], out=offsets[1:])
        return cls(b"".join(encoded), offsets)

    @property
    def nbytes(self) -> int:
        """Memory held: the blob and the offsets."""
        return len(self._blob) + self._offsets.nbytes

    def raw(self, index: int) -> bytes:
        """Element `index` as its UTF-8 bytes."""
        o = self._starts
        return self._blob[o[index] : o[index + 1]]

    def __len__(self) -> int:
        return len(self._offsets) - 1

    def __getitem__(self, index):
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(len(self)))]
        n = len(self)
        if index < 0:
            index += n
        if not 0 <= index < n:
            raise IndexError(f"index {index} out of range for {n} strings")
        o = self._starts
        return self._blob[o[index] : o[index + 1]].decode("utf-8", "surrogatepass")

    def tolist(self) -> list[str]:
        blob, o = self._blob, self._offsets.tolist()
        return [
            blob[a:b].decode("utf-8", "surrogatepass") for a, b in zip(o[:-1], o[1:], strict=True)
        ]

    def __iter__(self):
        return iter(self.tolist())

    def __eq__(self, other: object) -> bool:
        if isinstance(other, StringArray):
            return self._blob == other._blob and bool(np.array_equal(self._offsets, other._offsets))
        if isinstance(other, (list, tuple)):
            return len(other) == len(self) and self.tolist() == list(other)
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"StringArray({len(self)} strings, {len(self._blob)} bytes)"


# Arrays shorter than this are decoded even when skipping (tags, languages, small stop lists).
_UNREAD_MIN_LENGTH = 256


def open_gguf(
    path: str | os.PathLike[str],
    *,
    skip_unsupported_types: bool = False,
    skip_string_arrays: bool = False,
) -> GGUFFile:
    """Open and validate a GGUF file; tensors are read-only views of a memory map.

    A tensor type the engine cannot run raises UnsupportedModelError naming the tensor and the
    type, unless skip_unsupported_types: then such tensors are left out and listed in
    `unsupported_tensors` (for describing a file, never for loading it). skip_string_arrays: long
    string arrays (vocabulary, merges) become UnreadStrings and long numeric arrays (scores, token
    types) numpy views instead of lists (describing, never loading). When loading, long numeric
    arrays are NumericArrays (a list-like over the same view) instead of lists."""
    path = Path(path).expanduser()
    buf = _map_file(path)
    try:
        return _HeaderParser(path, buf, skip_unsupported_types, skip_string_arrays).parse()
    except ModelFileError:
        raise
    except (struct.error, ValueError, OverflowError, IndexError, KeyError, MemoryError) as exc:
        # Every bound is checked explicitly; this is the net for anything we did not foresee.
        raise ModelFileError(
            f"{path}: not a readable GGUF file ({type(exc).__name__}: {exc})"
        ) from exc


def _map_file(path: Path) -> mmap.mmap:
    if not path.exists():
        raise ModelFileError(f"{path}: file not found")
    if path.is_dir():
        raise ModelFileError(f"{path}: is a directory, not a GGUF model file")
    if not path.is_file():
        # A FIFO or device would block the open (or never end): the app's File > Open and the
        # last-used model reach here without the CLI's input-file check.
        raise ModelFileError(f"{path}: not a regular file (a pipe, socket or device), not a model")
    try:
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            if size == 0:
                raise ModelFileError(f"{path}: the file is empty (0 bytes), not a GGUF model")
            if size < _HEADER_BYTES:
                raise ModelFileError(
                    f"{path}: only {size} bytes, too short for a GGUF header ({_HEADER_BYTES} bytes)"
                )
            # The map stays valid after the file object is closed.
            return mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    except OSError as exc:
        raise ModelFileError(f"{path}: cannot read the file ({exc.strerror or exc})") from exc


class _HeaderParser:
    def __init__(
        self,
        path: Path,
        buf: mmap.mmap,
        skip_unsupported_types: bool = False,
        skip_string_arrays: bool = False,
    ):
        self.path = path
        self.buf = buf
        self.skip_unsupported_types = skip_unsupported_types
        self.skip_string_arrays = skip_string_arrays
        self.unsupported: dict[str, str] = {}
        self.size = len(buf)
        self.pos = 0
        self.metadata_elements = 0  # array elements read so far, against MAX_METADATA_ELEMENTS

    # --- primitive reads, each bounds-checked ---------------------------------------------------
    def _fail(self, reason: str) -> ModelFileError:
        return ModelFileError(f"{self.path}: {reason}")

    def _need(self, n: int, what: str) -> None:
        if n < 0 or self.pos + n > self.size:
            raise self._fail(
                f"truncated or corrupt: {what} needs {n} bytes at offset {self.pos}, "
                f"but the file is {self.size} bytes"
            )

    def _scalar(self, fmt: str, n: int, what: str):
        self._need(n, what)
        (value,) = struct.unpack_from(fmt, self.buf, self.pos)
        self.pos += n
        return value

    def _u32(self, what: str) -> int:
        return self._scalar("<I", 4, what)

    def _u64(self, what: str) -> int:
        return self._scalar("<Q", 8, what)

    def _string(self, what: str) -> str:
        length = self._u64(f"length of {what}")
        if length > MAX_STRING_BYTES:
            raise self._fail(
                f"{what} claims {length} bytes (at most {MAX_STRING_BYTES} allowed; corrupt file?)"
            )
        self._need(length, f"{what} ({length} bytes)")
        raw = self.buf[self.pos : self.pos + length]
        self.pos += length
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise self._fail(
                f"{what} is not valid UTF-8 ({exc.reason} at byte {exc.start})"
            ) from None

    # --- sections -------------------------------------------------------------------------------
    def parse(self) -> GGUFFile:
        magic = self.buf[0:4]
        if magic != GGUF_MAGIC:
            raise self._fail(f"not a GGUF file (starts with {magic!r}, expected {GGUF_MAGIC!r})")
        self.pos = 4
        version = self._u32("version")
        if version & 0xFFFF == 0 and version != 0:
            raise UnsupportedModelError(
                f"{self.path}: big-endian GGUF files are not supported (only little-endian)"
            )
        if version not in SUPPORTED_VERSIONS:
            raise self._fail(
                f"GGUF version {version} is not supported (supported versions: "
                f"{', '.join(map(str, SUPPORTED_VERSIONS))})"
            )
        tensor_count = self._u64("tensor count")
        kv_count = self._u64("metadata count")
        remaining = self.size - self.pos
        if kv_count * _MIN_KV_BYTES + tensor_count * _MIN_TENSOR_INFO_BYTES > remaining:
            raise self._fail(
                f"header claims {tensor_count} tensors and {kv_count} metadata entries, "
                f"which cannot fit in a {self.size}-byte file (corrupt or truncated)"
            )

        metadata, metadata_types = self._read_metadata(kv_count)
        alignment = self._alignment(metadata, metadata_types)
        infos = self._read_tensor_infos(tensor_count)
        data_offset = -(-self.pos // alignment) * alignment
        tensors, offsets = self._make_tensors(infos, data_offset, alignment)

        arch = metadata.get("general.architecture")
        if arch is None:
            raise self._fail("metadata key general.architecture is missing (required by GGUF)")
        if not isinstance(arch, str) or not arch:
            raise self._fail(
                f"metadata general.architecture must be a non-empty string, but it is stored as "
                f"{metadata_types['general.architecture'].type.name} ({str(arch)[:40]!r})"
            )
        return GGUFFile(
            path=self.path,
            version=version,
            metadata=metadata,
            metadata_types=metadata_types,
            tensors=tensors,
            file_size=self.size,
            alignment=alignment,
            data_offset=data_offset,
            tensor_offsets=offsets,
            unsupported_tensors=self.unsupported,
        )

    def _read_metadata(self, count: int) -> tuple[dict[str, Any], dict[str, ValueType]]:
        values: dict[str, Any] = {}
        types: dict[str, ValueType] = {}
        for index in range(count):
            key = self._string(f"metadata key #{index}")
            if key in values:
                raise self._fail(f"metadata key {key!r} appears twice")
            raw_type = self._u32(f"type of metadata {key!r}")
            vtype = self._value_type(raw_type, key)
            element_type = None
            if vtype == GGUFValueType.ARRAY:
                values[key], element_type = self._array(key, depth=1)
            else:
                values[key] = self._value(vtype, key)
            types[key] = ValueType(vtype, element_type)
        return values, types

    def _value_type(self, raw: int, key: str) -> GGUFValueType:
        try:
            return GGUFValueType(raw)
        except ValueError:
            allowed = ", ".join(f"{t.value} ({t.name})" for t in GGUFValueType)
            raise self._fail(
                f"metadata {key!r} has unknown value type {raw} (known: {allowed})"
            ) from None

    def _value(self, vtype: GGUFValueType, key: str):
        if vtype == GGUFValueType.STRING:
            return self._string(f"metadata {key!r}")
        fmt, n = _SCALAR_FORMATS[vtype]
        return self._scalar(fmt, n, f"metadata {key!r}")

    def _array(self, key: str, depth: int) -> tuple[list, GGUFValueType]:
        element_type = self._value_type(self._u32(f"element type of array {key!r}"), key)
        length = self._u64(f"length of array {key!r}")
        remaining = self.size - self.pos
        if element_type == GGUFValueType.STRING:
            min_element = 8
        elif element_type == GGUFValueType.ARRAY:
            min_element = _MIN_ARRAY_BYTES
        else:
            min_element = _SCALAR_FORMATS[element_type][1]
        if length * min_element > remaining:
            raise self._fail(
                f"array {key!r} claims {length} elements of {element_type.name}, more than the "
                f"{remaining} bytes left in the file (corrupt or truncated)"
            )
        self.metadata_elements += length
        if length > MAX_ARRAY_ELEMENTS or self.metadata_elements > MAX_METADATA_ELEMENTS:
            raise self._fail(
                f"array {key!r} claims {length} elements (at most {MAX_ARRAY_ELEMENTS} per array and "
                f"{MAX_METADATA_ELEMENTS} in all arrays are allowed; corrupt file?)"
            )
        if element_type in _SCALAR_DTYPES:
            # One numpy read for the whole array (token types, scores): fast and bounded above.
            values = np.frombuffer(
                self.buf, dtype=_SCALAR_DTYPES[element_type], count=length, offset=self.pos
            )
            self.pos += length * min_element
            if self.skip_string_arrays and length >= _UNREAD_MIN_LENGTH:
                # Describing only: token types and scores stay a read-only numpy view (a list of
                # 262k floats costs ~16 ms to build).
                return values, element_type  # type: ignore[return-value]
            if length >= _UNREAD_MIN_LENGTH and element_type != GGUFValueType.BOOL:
                # Loading: a NumericArray over the same view. As a list, Gemma 3's 262k scores
                # were 262k float objects (10 MiB, 14 ms); the view costs nothing (issue 32).
                return NumericArray(values), element_type  # type: ignore[return-value]
            if element_type == GGUFValueType.BOOL:
                return [bool(v) for v in values], element_type
            return values.tolist(), element_type
        if element_type == GGUFValueType.STRING:
            if length >= _UNREAD_MIN_LENGTH:
                if self.skip_string_arrays:
                    return self._skip_string_array(key, length), element_type  # type: ignore[return-value]
                return self._flat_string_array(key, length), element_type  # type: ignore[return-value]
            return self._string_array(key, length), element_type
        if depth >= MAX_ARRAY_NESTING:
            raise self._fail(f"array {key!r} nests arrays deeper than {MAX_ARRAY_NESTING} levels")
        if length > MAX_NESTED_ARRAYS:
            raise self._fail(
                f"array {key!r} holds {length} arrays (at most {MAX_NESTED_ARRAYS} allowed; corrupt file?)"
            )
        return [self._array(f"{key}[{i}]", depth + 1)[0] for i in range(length)], element_type

    def _string_lengths(self, key: str, length: int) -> tuple[np.ndarray, int]:
        """The byte lengths of the `length` strings at self.pos and the position after them,
        every length field and string bounds-checked (errors name the element)."""
        buf, size, pos = self.buf, self.size, self.pos
        unpack_len = struct.Struct("<Q").unpack_from
        lengths = np.empty(length, dtype=np.int64)
        for i in range(length):
            if pos + 8 > size:
                self.pos = pos
                self._need(8, f"length of {key}[{i}]")
            (n,) = unpack_len(buf, pos)
            pos += 8
            if n > MAX_STRING_BYTES:
                self.pos = pos
                raise self._fail(
                    f"{key}[{i}] claims {n} bytes (at most {MAX_STRING_BYTES} allowed; corrupt file?)"
                )
            if pos + n > size:
                self.pos = pos
                self._need(n, f"{key}[{i}] ({n} bytes)")
            lengths[i] = n
            pos += n
        return lengths, pos

    def _string_array(self, key: str, length: int) -> list[str]:
        """The strings at self.pos as Python strings (short arrays; long ones are flat)."""
        lengths, end = self._string_lengths(key, length)
        buf, pos = self.buf, self.pos
        out: list[str] = []
        for i, n in enumerate(lengths.tolist()):
            pos += 8
            try:
                out.append(buf[pos : pos + n].decode("utf-8"))
            except UnicodeDecodeError as exc:
                raise self._fail(f"{key}[{i}] is not valid UTF-8 ({exc.reason})") from None
            pos += n
        self.pos = end
        return out

    def _flat_string_array(self, key: str, length: int) -> StringArray:
        """A StringArray of the strings at self.pos, with the same bounds checks and messages as
        _string_array (which it calls again for the message when a string is not UTF-8)."""
        start = self.pos
        buf = self.buf
        lengths, pos = self._string_lengths(key, length)
        # The strings without their 8-byte length fields, gathered by numpy in one pass.
        # A length field opens at each field start and closes 8 bytes later (which can be the
        # next field's start, for an empty string: hence add.at, not assignment).
        region = np.frombuffer(buf, dtype=np.uint8, count=pos - start, offset=start)
        field_starts = np.arange(length, dtype=np.int64) * 8
        field_starts[1:] += np.cumsum(lengths[:-1])
        marks = np.zeros(len(region) + 1, dtype=np.int8)
        np.add.at(marks, field_starts, 1)
        np.add.at(marks, field_starts + 8, -1)
        blob_array = region[np.cumsum(marks[:-1], dtype=np.int8) == 0]
        offsets = np.zeros(length + 1, dtype=np.int64)
        np.cumsum(lengths, out=offsets[1:])
        # UTF-8: the blob decodes as a whole and no string starts inside a character (a
        # continuation byte 10xxxxxx), so every string is a run of whole characters.
        starts_inside = (blob_array[offsets[:-1][lengths > 0]] & 0xC0) == 0x80
        blob = blob_array.tobytes()
        try:
            blob.decode("utf-8")
            valid = not starts_inside.any()
        except UnicodeDecodeError:
            valid = False
        if not valid:
            self.pos = start
            self._string_array(key, length)  # raises naming the first bad element
            raise self._fail(f"{key} is not valid UTF-8")  # (not reached: the line above raises)
        self.pos = pos
        return StringArray(blob, offsets)

    def _skip_string_array(self, key: str, length: int) -> UnreadStrings:
        # The same bounds as _string_array, without building the strings: compiled when LLVM is
        # usable (about 1 ns per string), else in Python (3-5x faster than decoding). A file the
        # kernel finds malformed is walked again here, for the message naming the bad element.
        from engine.kernels.gguf_scan import skip_strings

        end = skip_strings(self.buf, self.pos, length, MAX_STRING_BYTES)
        if end is not None and end >= 0:
            self.pos = end
            return UnreadStrings(length)
        buf, size, pos = self.buf, self.size, self.pos
        unpack_len = struct.Struct("<Q").unpack_from
        for i in range(length):
            if pos + 8 > size:
                self.pos = pos
                self._need(8, f"length of {key}[{i}]")
            (n,) = unpack_len(buf, pos)
            if n > MAX_STRING_BYTES:
                self.pos = pos + 8
                raise self._fail(
                    f"{key}[{i}] claims {n} bytes (at most {MAX_STRING_BYTES} allowed; corrupt file?)"
                )
            pos += 8 + n
        if pos > size:
            raise self._fail(
                f"truncated or corrupt: the strings of {key} end at offset {pos}, "
                f"but the file is {size} bytes"
            )
        self.pos = pos
        return UnreadStrings(length)

    def _alignment(self, metadata: dict[str, Any], types: dict[str, ValueType]) -> int:
        if "general.alignment" not in metadata:
            return DEFAULT_ALIGNMENT
        value = metadata["general.alignment"]
        if types["general.alignment"].type != GGUFValueType.UINT32:
            raise self._fail(
                f"general.alignment has type {types['general.alignment'].type.name}, expected UINT32"
            )
        if value <= 0 or value & (value - 1) or value > 1 << 20:
            raise self._fail(
                f"general.alignment={value} is invalid: must be a power of two up to 1 MiB"
            )
        return value

    def _read_tensor_infos(self, count: int) -> list[tuple[str, tuple[int, ...], int, int]]:
        infos = []
        for index in range(count):
            name = self._string(f"name of tensor #{index}")
            n_dims = self._u32(f"dimension count of tensor {name!r}")
            if not 1 <= n_dims <= MAX_DIMS:
                raise self._fail(
                    f"tensor {name!r} has {n_dims} dimensions (allowed: 1 to {MAX_DIMS})"
                )
            self._need(8 * n_dims, f"dimensions of tensor {name!r}")
            ne = struct.unpack_from(f"<{n_dims}Q", self.buf, self.pos)
            self.pos += 8 * n_dims
            raw_type = self._u32(f"type of tensor {name!r}")
            offset = self._u64(f"data offset of tensor {name!r}")
            infos.append((name, ne, raw_type, offset))
        return infos

    def _make_tensors(self, infos, data_offset: int, alignment: int):
        if data_offset > self.size and infos:
            raise self._fail(
                f"tensor data would start at offset {data_offset}, past the end of the file"
            )
        whole = np.frombuffer(self.buf, dtype=np.uint8)
        tensors: dict[str, QTensor] = {}
        offsets: dict[str, int] = {}
        for name, ne, raw_type, rel_offset in infos:
            if name in tensors:
                raise self._fail(f"tensor {name!r} appears twice")
            try:
                qtype = self._tensor_type(name, raw_type)
            except UnsupportedModelError as exc:
                if not self.skip_unsupported_types:
                    raise
                self.unsupported[name] = str(exc).removeprefix(f"{self.path}: ")
                continue
            if any(d == 0 for d in ne):
                raise self._fail(
                    f"tensor {name!r} has a zero dimension {list(ne)} (dimensions must be positive)"
                )
            n_elements = 1
            for d in ne:
                n_elements *= d
            if n_elements > MAX_TENSOR_ELEMENTS:
                raise self._fail(
                    f"tensor {name!r} has dimensions {list(ne)} = {n_elements} elements "
                    f"(more than the {MAX_TENSOR_ELEMENTS} a model tensor can plausibly have)"
                )
            block_size, type_size = GGML_QUANT_SIZES[qtype]
            if ne[0] % block_size:
                raise self._fail(
                    f"tensor {name!r} ({qtype.name}) has rows of {ne[0]} values, "
                    f"not a multiple of the {block_size}-value block size"
                )
            if rel_offset % alignment:
                raise self._fail(
                    f"tensor {name!r} data offset {rel_offset} is not a multiple of the alignment {alignment}"
                )
            nbytes = n_elements // block_size * type_size
            start = data_offset + rel_offset
            if start + nbytes > self.size:
                raise self._fail(
                    f"tensor {name!r} data ({nbytes} bytes at offset {start}) extends past the end "
                    f"of the {self.size}-byte file (truncated download?)"
                )
            shape = tuple(reversed(ne))  # numpy order: slowest-varying first
            raw = whole[start : start + nbytes]
            tensors[name] = QTensor(name, qtype, shape, _typed_view(raw, qtype, shape))
            offsets[name] = start
        self._check_no_overlap(tensors, offsets)
        return tensors, offsets

    def _check_no_overlap(self, tensors: dict[str, QTensor], offsets: dict[str, int]) -> None:
        """Two tensors sharing bytes is never produced by a writer: it means a corrupt offset
        table (and a weight silently read as another tensor's bytes)."""
        previous_name, previous_end = None, 0
        for name in sorted(offsets, key=offsets.__getitem__):
            start = offsets[name]
            if previous_name is not None and start < previous_end:
                raise self._fail(
                    f"tensor {name!r} data (offset {start}) overlaps tensor {previous_name!r} "
                    f"(which ends at offset {previous_end}): corrupt tensor table"
                )
            end = start + tensors[name].nbytes
            if end > previous_end:
                previous_name, previous_end = name, end

    def _tensor_type(self, name: str, raw: int) -> GGMLQuantizationType:
        try:
            qtype = GGMLQuantizationType(raw)
        except ValueError:
            raise UnsupportedModelError(
                f"{self.path}: tensor {name!r} has unknown tensor type id {raw}; "
                f"supported types: {SUPPORTED_QTYPE_NAMES}"
            ) from None
        if qtype not in SUPPORTED_QTYPES:
            raise UnsupportedModelError(
                f"{self.path}: tensor {name!r} uses type {qtype.name}, which this engine does not "
                f"run; supported types: {SUPPORTED_QTYPE_NAMES}"
            )
        return qtype


def _typed_view(raw: np.ndarray, qtype: GGMLQuantizationType, shape: tuple[int, ...]) -> np.ndarray:
    """F32/F16 as float arrays, BF16 as uint16 bit patterns, block types as uint8 (..., row_bytes)."""
    if qtype == Q.F32:
        return raw.view("<f4").reshape(shape)
    if qtype == Q.F16:
        return raw.view("<f2").reshape(shape)
    if qtype == Q.BF16:
        return raw.view("<u2").reshape(shape)  # numpy has no bfloat16; quants.py widens it
    block_size, type_size = GGML_QUANT_SIZES[qtype]
    return raw.reshape((*shape[:-1], shape[-1] // block_size * type_size))
