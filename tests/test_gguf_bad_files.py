"""Corrupt, truncated, hostile and unsupported files give typed errors that name the problem.

Files are built byte by byte here (not with our parser or gguf-py's writer) so each test states
exactly which field is wrong.
"""

from __future__ import annotations

import os
import struct
import time

import pytest
from gguf import GGMLQuantizationType, GGUFValueType

from engine.config import ModelConfig
from engine.errors import EngineError, ModelFileError, UnsupportedModelError
from engine.gguf import open_gguf

Q = GGMLQuantizationType
V = GGUFValueType


# --- a minimal hand-written GGUF -----------------------------------------------------------------
def gstr(s: str | bytes) -> bytes:
    raw = s.encode() if isinstance(s, str) else s
    return struct.pack("<Q", len(raw)) + raw


def kv_string(key: str, value: str) -> bytes:
    return gstr(key) + struct.pack("<I", V.STRING) + gstr(value)


def kv_u32(key: str, value: int) -> bytes:
    return gstr(key) + struct.pack("<II", V.UINT32, value)


def tensor_info(name: str, ne: tuple[int, ...], qtype: int, offset: int) -> bytes:
    return gstr(name) + struct.pack(f"<I{len(ne)}QIQ", len(ne), *ne, qtype, offset)


def gguf_bytes(
    kvs: list[bytes] | None = None,
    infos: list[bytes] | None = None,
    data: bytes = b"",
    *,
    version: int = 3,
    tensor_count: int | None = None,
    kv_count: int | None = None,
    alignment: int = 32,
) -> bytes:
    kvs = [kv_string("general.architecture", "llama")] if kvs is None else kvs
    infos = [] if infos is None else infos
    header = b"GGUF" + struct.pack(
        "<IQQ",
        version,
        len(infos) if tensor_count is None else tensor_count,
        len(kvs) if kv_count is None else kv_count,
    )
    body = header + b"".join(kvs) + b"".join(infos)
    body += b"\0" * (-len(body) % alignment)
    return body + data


ONE_F32_TENSOR = tensor_info("w", (32, 2), Q.F32, 0)  # 64 floats = 256 bytes
ONE_F32_DATA = b"\0" * 256


def write(tmp_path, content: bytes, name: str = "bad.gguf"):
    path = tmp_path / name
    path.write_bytes(content)
    return path


def refused(tmp_path, content: bytes, error=ModelFileError, match: str | None = None) -> str:
    """Assert the file is refused with `error` quickly; return the message."""
    path = write(tmp_path, content)
    started = time.perf_counter()
    with pytest.raises(error, match=match) as info:
        open_gguf(path)
    assert time.perf_counter() - started < 1.0
    assert str(path) in str(info.value)  # the user sees which file
    return str(info.value)


# --- sanity: the builder makes valid files ---------------------------------------------------------
def test_hand_built_file_loads(tmp_path):
    g = open_gguf(write(tmp_path, gguf_bytes(infos=[ONE_F32_TENSOR], data=ONE_F32_DATA)))
    assert g.arch == "llama" and g.tensors["w"].shape == (2, 32)


# --- not a model file at all ---------------------------------------------------------------------
def test_missing_file(tmp_path):
    with pytest.raises(ModelFileError, match="not found"):
        open_gguf(tmp_path / "nope.gguf")


def test_directory(tmp_path):
    with pytest.raises(ModelFileError, match="directory"):
        open_gguf(tmp_path)


def test_fifo_is_refused_without_blocking(tmp_path):
    # Opening a FIFO for reading blocks until a writer appears: the load thread would hang.
    fifo = tmp_path / "model.gguf"
    os.mkfifo(fifo)
    with pytest.raises(ModelFileError, match="not a regular file"):
        open_gguf(fifo)


def test_empty_file(tmp_path):
    refused(tmp_path, b"", match="empty")


@pytest.mark.parametrize(
    "content",
    [
        b"hello world, this is text\n" * 4,
        b"\x89PNG\r\n\x1a\n" + b"\0" * 40,
        b"PK\x03\x04" + b"\0" * 60,
    ],
    ids=["text", "png", "zip"],
)
def test_not_a_gguf(tmp_path, content):
    refused(tmp_path, content, match="not a GGUF file")


def test_shorter_than_a_header(tmp_path):
    refused(tmp_path, b"GGUF\x03\x00\x00\x00", match="too short")


# --- versions ------------------------------------------------------------------------------------
@pytest.mark.parametrize("version", [1, 4, 99])
def test_unsupported_versions(tmp_path, version):
    message = refused(
        tmp_path, gguf_bytes(version=version), match=f"version {version} is not supported"
    )
    assert "2, 3" in message


def test_big_endian_file(tmp_path):
    content = b"GGUF" + struct.pack(">IQQ", 3, 0, 1) + b"\0" * 64
    refused(tmp_path, content, UnsupportedModelError, match="big-endian")


def test_version_2_loads(tmp_path):
    assert open_gguf(write(tmp_path, gguf_bytes(version=2))).version == 2


# --- absurd counts and lengths (must fail fast, before any loop or allocation) --------------------
@pytest.mark.parametrize(
    "tensor_count,kv_count", [(2**63, 1), (1, 2**63), (2**64 - 1, 2**64 - 1), (10**6, 1)]
)
def test_absurd_counts(tmp_path, tensor_count, kv_count):
    refused(tmp_path, gguf_bytes(tensor_count=tensor_count, kv_count=kv_count), match="cannot fit")


def test_absurd_key_length(tmp_path):
    kv = struct.pack("<Q", 2**62) + b"general.architecture"
    refused(tmp_path, gguf_bytes([kv]), match="metadata key #0 claims 4611686018427387904 bytes")


def test_absurd_string_value_length(tmp_path):
    kv = gstr("general.architecture") + struct.pack("<IQ", V.STRING, 2**60) + b"llama"
    refused(tmp_path, gguf_bytes([kv]), match="general.architecture")


@pytest.mark.parametrize("element_type", [V.UINT8, V.UINT64, V.STRING, V.ARRAY])
def test_absurd_array_length(tmp_path, element_type):
    kv = gstr("tokenizer.ggml.tokens") + struct.pack("<IIQ", V.ARRAY, element_type, 2**61)
    message = refused(tmp_path, gguf_bytes([kv_string("general.architecture", "llama"), kv]))
    assert "tokenizer.ggml.tokens" in message and str(2**61) in message


def test_unknown_value_type(tmp_path):
    kv = gstr("general.thing") + struct.pack("<I", 99) + b"\0" * 8
    refused(
        tmp_path,
        gguf_bytes([kv_string("general.architecture", "llama"), kv]),
        match="general.thing.*unknown value type 99",
    )


def test_deeply_nested_arrays(tmp_path):
    nested = struct.pack("<IQ", V.UINT8, 1) + b"\x07"
    for _ in range(6):
        nested = struct.pack("<IQ", V.ARRAY, 1) + nested
    kv = gstr("general.nest") + struct.pack("<I", V.ARRAY) + nested
    refused(
        tmp_path,
        gguf_bytes([kv_string("general.architecture", "llama"), kv]),
        match="nests arrays deeper",
    )


def test_nested_array_within_limit_loads(tmp_path):
    inner = struct.pack("<IQ", V.UINT16, 2) + struct.pack("<HH", 5, 6)
    kv = gstr("general.pairs") + struct.pack("<IIQ", V.ARRAY, V.ARRAY, 2) + inner + inner
    g = open_gguf(write(tmp_path, gguf_bytes([kv_string("general.architecture", "llama"), kv])))
    assert g.metadata["general.pairs"] == [[5, 6], [5, 6]]


def test_invalid_utf8_key(tmp_path):
    kv = gstr(b"general.\xff\xfe") + struct.pack("<II", V.UINT32, 1)
    refused(
        tmp_path,
        gguf_bytes([kv_string("general.architecture", "llama"), kv]),
        match="not valid UTF-8",
    )


def test_duplicate_key(tmp_path):
    kvs = [
        kv_string("general.architecture", "llama"),
        kv_u32("llama.block_count", 1),
        kv_u32("llama.block_count", 2),
    ]
    refused(tmp_path, gguf_bytes(kvs), match="'llama.block_count' appears twice")


def test_missing_architecture(tmp_path):
    refused(
        tmp_path,
        gguf_bytes([kv_u32("llama.block_count", 1)]),
        match="general.architecture is missing",
    )


@pytest.mark.parametrize(
    "kv",
    [kv_u32("general.architecture", 7), kv_string("general.architecture", "")],
    ids=["uint32", "empty-string"],
)
def test_architecture_of_the_wrong_type(tmp_path, kv):
    refused(tmp_path, gguf_bytes([kv]), match="general.architecture must be a non-empty string")


@pytest.mark.parametrize("alignment", [0, 3, 48, 2**30])
def test_bad_alignment(tmp_path, alignment):
    kvs = [kv_string("general.architecture", "llama"), kv_u32("general.alignment", alignment)]
    refused(tmp_path, gguf_bytes(kvs), match=f"general.alignment={alignment} is invalid")


# --- tensor table --------------------------------------------------------------------------------
@pytest.mark.parametrize("n_dims", [0, 5, 2**31])
def test_bad_dimension_count(tmp_path, n_dims):
    info = gstr("w") + struct.pack("<I", n_dims) + struct.pack("<QIQ", 32, Q.F32, 0)
    refused(
        tmp_path, gguf_bytes(infos=[info], data=ONE_F32_DATA), match=f"'w' has {n_dims} dimensions"
    )


def test_zero_dimension(tmp_path):
    info = tensor_info("w", (32, 0), Q.F32, 0)
    refused(tmp_path, gguf_bytes(infos=[info], data=ONE_F32_DATA), match="zero dimension")


@pytest.mark.parametrize("ne", [(2**32, 2**32), (2**63, 2**63, 2**63, 2**63), (32, 2**41)])
def test_absurd_dimensions(tmp_path, ne):
    info = tensor_info("w", ne, Q.F32, 0)
    refused(
        tmp_path,
        gguf_bytes(infos=[info], data=ONE_F32_DATA),
        match="more than the .* a model tensor",
    )


def test_tensor_data_past_end_of_file(tmp_path):
    info = tensor_info("w", (32, 2), Q.F32, 0)
    message = refused(
        tmp_path, gguf_bytes(infos=[info], data=ONE_F32_DATA[:100]), match="past the end"
    )
    assert "'w'" in message


def test_tensor_offset_past_end_of_file(tmp_path):
    info = tensor_info("w", (32, 2), Q.F32, 2**50)
    refused(tmp_path, gguf_bytes(infos=[info], data=ONE_F32_DATA), match="'w'.*past the end")


def test_misaligned_tensor_offset(tmp_path):
    info = tensor_info("w", (32, 1), Q.F32, 4)
    refused(
        tmp_path,
        gguf_bytes(infos=[info], data=ONE_F32_DATA),
        match="not a multiple of the alignment 32",
    )


def test_unknown_tensor_type_id(tmp_path):
    info = tensor_info("blk.0.attn_q.weight", (32, 2), 250, 0)
    message = refused(
        tmp_path,
        gguf_bytes(infos=[info], data=ONE_F32_DATA),
        UnsupportedModelError,
        match="'blk.0.attn_q.weight' has unknown tensor type id 250",
    )
    assert "Q4_K" in message and "BF16" in message  # lists what is supported


@pytest.mark.parametrize("qtype", [Q.Q8_1, Q.I32, Q.Q8_K, Q.NVFP4])
def test_known_but_unsupported_tensor_type(tmp_path, qtype):
    info = tensor_info("blk.0.ffn_up.weight", (256, 1), qtype, 0)
    message = refused(
        tmp_path,
        gguf_bytes(infos=[info], data=b"\0" * 2048),
        UnsupportedModelError,
        match=f"'blk.0.ffn_up.weight' uses type {qtype.name}",
    )
    assert "supported types: F32, F16, BF16, Q4_0" in message


def test_row_not_a_multiple_of_block_size(tmp_path):
    info = tensor_info("w", (40, 1), Q.Q8_0, 0)
    refused(
        tmp_path,
        gguf_bytes(infos=[info], data=b"\0" * 64),
        match="not a multiple of the 32-value block",
    )


def test_duplicate_tensor_name(tmp_path):
    infos = [tensor_info("w", (32, 1), Q.F32, 0), tensor_info("w", (32, 1), Q.F32, 128)]
    refused(tmp_path, gguf_bytes(infos=infos, data=ONE_F32_DATA), match="'w' appears twice")


@pytest.mark.parametrize("second_offset", [0, 96], ids=["same-offset", "partly-overlapping"])
def test_overlapping_tensor_data(tmp_path, second_offset):
    infos = [tensor_info("a", (32, 1), Q.F32, 0), tensor_info("b", (32, 2), Q.F32, second_offset)]
    message = refused(tmp_path, gguf_bytes(infos=infos, data=b"\0" * 512), match="overlaps tensor")
    assert "'a'" in message and "'b'" in message


def test_adjacent_tensor_data_loads(tmp_path):
    infos = [tensor_info("a", (32, 1), Q.F32, 128), tensor_info("b", (32, 1), Q.F32, 0)]
    g = open_gguf(write(tmp_path, gguf_bytes(infos=infos, data=ONE_F32_DATA)))
    assert set(g.tensors) == {"a", "b"}


def test_tensor_name_length_past_end(tmp_path):
    info = struct.pack("<Q", 2**40) + b"w"
    refused(tmp_path, gguf_bytes(infos=[info]), match="name of tensor #0")


# --- truncation of a real (tiny) model at many points -------------------------------------------
def test_truncated_at_many_points(tmp_path, tiny_model_factory):
    whole = tiny_model_factory("llama", Q.Q8_0, tokenizer=None).read_bytes()
    g = open_gguf(tiny_model_factory("llama", Q.Q8_0, tokenizer=None))
    cut_points = sorted(
        set(range(0, 600, 7))  # header, metadata, tensor infos
        | set(range(g.data_offset - 40, g.data_offset + 40, 3))  # around the start of the data
        | {len(whole) - k for k in (1, 2, 31, 32, 33, 1000)}  # inside the last tensor
        | set(range(g.data_offset, len(whole), max(1, len(whole) // 50)))
    )
    for cut in cut_points:
        path = write(tmp_path, whole[:cut], "cut.gguf")
        with pytest.raises(ModelFileError):
            open_gguf(path)
    assert open_gguf(write(tmp_path, whole, "whole.gguf")).tensors


# --- required keys and tensors (checked by ModelConfig on top of open_gguf) -----------------------
@pytest.mark.parametrize(
    "key",
    [
        "llama.block_count",
        "llama.embedding_length",
        "llama.feed_forward_length",
        "llama.attention.head_count",
        "llama.context_length",
    ],
)
def test_missing_required_key(tmp_path, key):
    from tests.tiny_models import write_tiny_model

    path = write_tiny_model(tmp_path / "m.gguf", "llama", tokenizer=None, omit_keys=(key,))
    g = open_gguf(path)  # a structurally valid file ...
    with pytest.raises(ModelFileError, match=key.replace(".", r"\.")):
        ModelConfig.from_gguf(g)  # ... that is not a usable model


def test_missing_embedding_tensor(tmp_path):
    from tests.tiny_models import write_tiny_model

    path = write_tiny_model(
        tmp_path / "m.gguf", "llama", tokenizer=None, omit_tensors=("token_embd.weight",)
    )
    with pytest.raises(ModelFileError, match="token_embd.weight"):
        ModelConfig.from_gguf(open_gguf(path))


def test_unsupported_architecture(tmp_path):
    kvs = [kv_string("general.architecture", "mamba"), kv_u32("mamba.block_count", 1)]
    g = open_gguf(write(tmp_path, gguf_bytes(kvs)))
    with pytest.raises(UnsupportedModelError, match="mamba") as info:
        ModelConfig.from_gguf(g)
    assert "llama" in str(info.value) and "gemma3" in str(info.value)


def test_every_error_is_an_engine_error():
    assert issubclass(ModelFileError, EngineError) and issubclass(
        UnsupportedModelError, ModelFileError
    )


# --- metadata that would become huge Python objects (bounded even when the file is large) --------
def sparse(tmp_path, content: bytes, size: int = 256 << 20):
    path = tmp_path / "sparse.gguf"
    with open(path, "wb") as f:
        f.write(content)
        f.truncate(size)  # zero-filled, no disk cost: the lengths below all "fit" in the file
    return path


def test_huge_string_in_large_file(tmp_path):
    kv = gstr("tokenizer.chat_template") + struct.pack("<IQ", V.STRING, 100 << 20)
    path = sparse(tmp_path, gguf_bytes([kv_string("general.architecture", "llama"), kv]))
    with pytest.raises(ModelFileError, match="tokenizer.chat_template.*at most 16777216"):
        open_gguf(path)


@pytest.mark.parametrize("element_type", [V.UINT64, V.STRING, V.UINT8])
def test_huge_array_in_large_file(tmp_path, element_type):
    kv = gstr("tokenizer.ggml.tokens") + struct.pack("<IIQ", V.ARRAY, element_type, 20_000_000)
    path = sparse(tmp_path, gguf_bytes([kv_string("general.architecture", "llama"), kv]))
    with pytest.raises(ModelFileError, match="tokenizer.ggml.tokens.*at most 4194304 per array"):
        open_gguf(path)


def test_many_large_arrays_in_large_file(tmp_path):
    kvs = [kv_string("general.architecture", "llama")]
    for i in range(3):
        kvs.append(
            gstr(f"general.a{i}")
            + struct.pack("<IIQ", V.ARRAY, V.UINT8, 4_000_000)
            + b"\0" * 4_000_000
        )
    path = sparse(tmp_path, gguf_bytes(kvs))
    with pytest.raises(ModelFileError, match="general.a2.*in all arrays"):
        open_gguf(path)


def test_huge_array_of_arrays_in_large_file(tmp_path):
    kv = gstr("general.nest") + struct.pack("<IIQ", V.ARRAY, V.ARRAY, 4_000_000)
    path = sparse(tmp_path, gguf_bytes([kv_string("general.architecture", "llama"), kv]))
    with pytest.raises(ModelFileError, match="general.nest.*holds 4000000 arrays"):
        open_gguf(path)
