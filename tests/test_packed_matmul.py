"""Q4_K / Q6_K weights repacked into 16-row records (engine/kernels/repack.py) and the mat-mul over
them (engine/kernels/packed_matmul.py), against independent oracles.

Oracle: gguf-py's dequantizer of the original GGUF rows (not ours), times x rounded through a
hand-written numpy int8 block quantizer (tests/test_kernels_linear.q8_round_trip), in float64.
Shapes have row counts that are not a multiple of the 16-row record and token counts that are not
a multiple of the 8-token tile; every instruction-set path runs here (LOCALCHAT_CPU).
"""

import mmap

import numpy as np
import pytest
from gguf import GGMLQuantizationType as Q
from gguf import quants

from engine.kernels import act_quant, repack, repack_jit
from engine.kernels.act_quant import QuantizeSlots
from engine.kernels.compiler import KernelLibrary
from engine.kernels.jit_backend import REPACK_ENV, JitBackend, packed_module
from engine.kernels.quant_matmul import QuantMatmulSlots
from engine.kernels.repack_jit import RepackSlots
from engine.kernels.threads import ThreadPool, pool_module
from engine.qtensor import QTensor
from tests.cpu_targets import target_or_skip
from tests.quant_blocks import random_blocks
from tests.test_kernels_linear import make_weight, oracle_weight, q8_round_trip

PACKED = [Q.Q4_K, Q.Q6_K]
LEGACY = [Q.Q4_0, Q.Q4_1, Q.Q5_0, Q.Q5_1, Q.Q8_0]  # tests/test_packed_legacy.py


@pytest.mark.parametrize("qtype", PACKED, ids=lambda q: q.name)
@pytest.mark.parametrize("rows", [1, 15, 16, 37])
def test_records_dequantize_to_gguf_pys_values(qtype, rows):
    rng = np.random.default_rng(rows)
    cols = 768
    blocks = random_blocks(rng, qtype, rows * cols // 256).reshape(rows, -1)
    w = QTensor("w", qtype, (rows, cols), blocks)
    packed = repack.repack(w)
    assert packed.data.shape == (-(-rows // 16), cols // 256, repack.RECORD_BYTES[qtype.name])
    expected = quants.dequantize(blocks, qtype).reshape(rows, cols)
    np.testing.assert_array_equal(repack.dequantize_records(packed), expected)


def test_repacking_in_passes_equals_one_pass(monkeypatch):
    rng = np.random.default_rng(5)
    w = make_weight(Q.Q6_K, 100, 512, rng)
    whole = repack.repack(w).data
    monkeypatch.setattr(repack, "_PASS_BYTES", 16 * 2 * 210 * 3)  # 48 rows a pass, 3 threads
    np.testing.assert_array_equal(repack.repack(w).data, whole)


def _quantize(pool, lib, x):
    t, n = x.shape
    bufs = {
        "aq": np.zeros((t, n), np.int8),
        "ad": np.zeros((t, n // 32), np.float32),
        "sums": np.zeros((t, n // 16), np.float32),
        "sums32": np.zeros((t, n // 32), np.float32),
        "isums": np.zeros((t, n // 16), np.int32),
    }
    s = QuantizeSlots
    args = np.zeros(s.SIZE, np.int64)
    args[s.X], args[s.N_TOKENS], args[s.N] = x.ctypes.data, t, n
    for slot, key in (
        (s.AQ, "aq"),
        (s.AD, "ad"),
        (s.SUMS, "sums"),
        (s.SUMS32, "sums32"),
        (s.ISUMS, "isums"),
    ):
        args[slot] = bufs[key].ctypes.data
    pool.run(lib.address("quantize_q8"), args.ctypes.data)
    return bufs


def _packed_matmul(pool, lib, packed, bufs, tokens, out):
    s = QuantMatmulSlots
    args = np.zeros(s.SIZE, np.int64)
    args[s.W], args[s.ROW_BYTES] = packed.data.ctypes.data, packed.group_bytes
    args[s.N_ROWS], args[s.N_TOKENS] = packed.rows, tokens
    args[s.N_BLOCKS] = packed.cols // repack.block_values(packed.qname)
    for slot, key in (
        (s.AQ, "aq"),
        (s.AD, "ad"),
        (s.SUMS, "sums"),
        (s.SUMS32, "sums32"),
        (s.ISUMS, "isums"),
    ):
        args[slot] = bufs[key].ctypes.data
    args[s.OUT], args[s.N], args[s.OUT_STRIDE] = out.ctypes.data, packed.cols, out.shape[1]
    pool.run(lib.address(f"pmm_{packed.qname}"), args.ctypes.data)


# (isa, LLVM CPU to compile for): the host's VNNI path, then the AVX2 and generic paths as if on
# those CPUs (LOCALCHAT_CPU).
PATHS = [("vnni", None), ("avx2", "haswell"), ("generic", "x86-64-v2")]


def _target_or_skip(cpu, monkeypatch):
    """The CPU to compile for (`cpu`, or the host when None, which must have AVX512-VNNI)."""
    return target_or_skip(cpu, monkeypatch, vnni_host=True)


@pytest.mark.parametrize(("isa", "cpu"), PATHS)
def test_every_path_matches_the_oracle_on_odd_shapes(isa, cpu, monkeypatch):
    lib = KernelLibrary(cpu=_target_or_skip(cpu, monkeypatch))
    lib.add_modules(
        [pool_module(), ("quantize_q8", act_quant.module_ir())]
        + [packed_module(q.name, isa) for q in PACKED]
    )
    pool = ThreadPool(lib, 2)
    rng = np.random.default_rng(17)
    try:
        for qtype in PACKED:
            for rows, tokens in [(1, 1), (37, 3), (16, 8), (70, 17), (5, 13)]:
                w = make_weight(qtype, rows, 512, rng)
                x = rng.standard_normal((tokens, 512)).astype(np.float32)
                bufs = _quantize(pool, lib, x)
                # a wider output: the kernel must not write past its rows (masked last group)
                out = np.full((tokens, rows + 3), 7.0, np.float32)
                _packed_matmul(pool, lib, repack.repack(w), bufs, tokens, out)
                exact = q8_round_trip(x) @ oracle_weight(w).T
                np.testing.assert_allclose(
                    out[:, :rows],
                    exact,
                    rtol=1e-4,
                    atol=1e-4 * np.abs(exact).max(),
                    err_msg=f"{isa} {qtype.name} {rows}x{tokens}",
                )
                assert (out[:, rows:] == 7.0).all()
    finally:
        pool.close()


def _run_packed(isa, cpu, monkeypatch, cases):
    """[(w, x)] -> the packed kernels' outputs on one instruction-set path."""
    lib = KernelLibrary(cpu=_target_or_skip(cpu, monkeypatch))
    names = sorted({w.qtype.name for w, _ in cases})
    lib.add_modules(
        [pool_module(), ("quantize_q8", act_quant.module_ir())]
        + [packed_module(q, isa) for q in names]
    )
    pool = ThreadPool(lib, 2)
    outs = []
    try:
        for w, x in cases:
            out = np.zeros((x.shape[0], w.rows), np.float32)
            _packed_matmul(pool, lib, repack.repack(w), _quantize(pool, lib, x), x.shape[0], out)
            outs.append(out)
    finally:
        pool.close()
    return outs


# Where each format's unsigned dot values and its scales sit in a GGUF block: (block bytes,
# the f16 d's offset, the f16 offsets to zero (mins), the scale bytes and their value). The rest
# of the block is 0xFF: every value at its format's largest u (15, 31 or 63).
_EXTREME_BLOCKS = {
    Q.Q4_0: (18, 0, (), None),
    Q.Q4_1: (20, 0, (2,), None),
    Q.Q5_0: (22, 0, (), None),
    Q.Q5_1: (24, 0, (2,), None),
    # sc = 1, m = 0 for all 8 sub-blocks (bytes 0-3 and 8-11 set sc, 4-7 m)
    Q.Q4_K: (144, 0, (2,), (4, [1, 1, 1, 1, 0, 0, 0, 0, 1, 1, 1, 1])),
    Q.Q6_K: (210, 208, (), (192, [1] * 16)),
}


def _extreme_weight(qtype, rows, cols):
    size, d_at, zero_at, scales = _EXTREME_BLOCKS[qtype]
    per = 256 if qtype in PACKED else 32
    blocks = np.full((rows, cols // per, size), 0xFF, np.uint8)
    one, zero = (np.array([v], np.float16).view(np.uint8) for v in (1.0, 0.0))
    blocks[..., d_at : d_at + 2] = one
    for at in zero_at:
        blocks[..., at : at + 2] = zero
    if scales is not None:
        at, values = scales
        blocks[..., at : at + len(values)] = values
    return QTensor("w", qtype, (rows, cols), blocks.reshape(rows, -1))


@pytest.mark.parametrize(("isa", "cpu"), PATHS)
def test_the_largest_values_stay_exact(isa, cpu, monkeypatch):
    """Every weight at its format's largest unsigned value, every activation at +127 (token 0)
    or -127 (token 1): the integer sums the AVX2 path adds in i16 before widening (8 Q4 units,
    4 Q5 units, 2 Q6_K units: packed_matmul.i16_group) are at their largest, so one unit too
    many in a group wraps i16 and shows here."""
    qtypes = [*PACKED, *(q for q in LEGACY if q != Q.Q8_0)]  # Q8_0: test_packed_legacy.py
    x = np.ones((2, 512), np.float32)
    x[1] = -1.0
    cases = [(_extreme_weight(q, 20, 512), x) for q in qtypes]
    for q, (w, _), out in zip(
        qtypes, cases, _run_packed(isa, cpu, monkeypatch, cases), strict=True
    ):
        exact = q8_round_trip(x) @ oracle_weight(w).T
        np.testing.assert_allclose(out, exact, rtol=1e-6, err_msg=f"{isa} {q.name}")


def test_the_avx2_path_gives_the_vnni_paths_bits(monkeypatch):
    """Both paths sum the same integers exactly (in another grouping on AVX2) and then run the
    same float instructions, so every output is bit-identical: a lane landing in the wrong row,
    or a sum in the wrong i32 lane, shows here even where the oracle's tolerance would hide it."""
    rng = np.random.default_rng(29)
    cases = []
    for qtype in [*PACKED, *LEGACY]:
        cols = 512 if qtype in PACKED else 640
        cases.append(
            (make_weight(qtype, 37, cols, rng), rng.standard_normal((13, cols)).astype(np.float32))
        )
    vnni = _run_packed("vnni", None, monkeypatch, cases)
    avx2 = _run_packed("avx2", "haswell", monkeypatch, cases)
    for (w, _), a, b in zip(cases, vnni, avx2, strict=True):
        np.testing.assert_array_equal(b, a, err_msg=w.qtype.name)


def test_act_quant_integer_and_block_sums():
    lib = KernelLibrary()
    lib.add_modules([pool_module(), ("quantize_q8", act_quant.module_ir())])
    pool = ThreadPool(lib, 1)
    x = np.random.default_rng(2).standard_normal((3, 96)).astype(np.float32)
    bufs = _quantize(pool, lib, x)
    pool.close()
    q = bufs["aq"].astype(np.int64)
    np.testing.assert_array_equal(bufs["isums"], q.reshape(3, -1, 16).sum(-1))
    np.testing.assert_allclose(bufs["sums32"], q.reshape(3, -1, 32).sum(-1) * bufs["ad"], rtol=1e-6)


@pytest.fixture(scope="module")
def backends():
    mp = pytest.MonkeyPatch()
    mp.setenv(REPACK_ENV, "0")
    rowwise = JitBackend(n_threads=2)
    mp.setenv(REPACK_ENV, "1")
    packed = JitBackend(n_threads=2)
    mp.undo()
    yield rowwise, packed
    rowwise.close()
    packed.close()


# (type, columns): the K-quants at whole 256-value super-blocks, the legacy quants at the small
# models' widths (576, 640: whole 32-value blocks only)
BACKEND_CASES = [(q, 1024) for q in PACKED] + [(q, 576) for q in LEGACY]
TILE_CASES = [(q, 512) for q in PACKED] + [(q, 640) for q in LEGACY]


@pytest.mark.parametrize(("qtype", "cols"), BACKEND_CASES, ids=lambda c: getattr(c, "name", c))
def test_the_backend_runs_packable_weights_on_records(backends, qtype, cols):
    rowwise, packed = backends
    rng = np.random.default_rng(3)
    w = make_weight(qtype, 45, cols, rng)
    x = rng.standard_normal((11, cols)).astype(np.float32)
    got = packed.linear(w, x)
    assert packed._weights[id(w)].data is repack.packed_for(w).data
    np.testing.assert_allclose(got, rowwise.linear(w, x), rtol=1e-5, atol=1e-5 * np.abs(got).max())
    assert rowwise._weights[id(w)].data is not repack.packed_for(w).data
    exact = q8_round_trip(x) @ oracle_weight(w).T
    np.testing.assert_allclose(got, exact, rtol=1e-4, atol=1e-4 * np.abs(exact).max())


def test_a_token_gets_the_same_bits_in_every_tile(backends):
    _, packed = backends
    rng = np.random.default_rng(4)
    for qtype, cols in TILE_CASES:
        w = make_weight(qtype, 40, cols, rng)
        x = rng.standard_normal((15, cols)).astype(np.float32)
        whole = packed.linear(w, x)  # tiles of 8, 4, 2, 1 tokens
        for t in range(15):
            np.testing.assert_array_equal(
                packed.linear(w, x[t : t + 1])[0], whole[t], err_msg=qtype.name
            )


def test_file_pages_are_released_only_for_a_file_mapping(tmp_path):
    rng = np.random.default_rng(6)
    w = make_weight(Q.Q4_K, 64, 4096, rng)
    anonymous = w.data.copy()
    assert not repack.release_file_pages(anonymous)
    np.testing.assert_array_equal(anonymous, w.data)  # untouched
    path = tmp_path / "w.bin"
    path.write_bytes(b"\0" * mmap.PAGESIZE + w.data.tobytes())
    with open(path, "rb") as f:
        mapped = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    view = np.frombuffer(mapped, np.uint8, offset=mmap.PAGESIZE).reshape(w.data.shape)
    mapped_w = QTensor("w", Q.Q4_K, w.shape, view)
    expected = repack.repack(mapped_w).data
    assert repack.release_file_pages(view) == hasattr(mmap, "MADV_DONTNEED")
    # the pages come back from the file on the next read
    np.testing.assert_array_equal(view, w.data)
    np.testing.assert_array_equal(repack.packed_for(mapped_w).data, expected)
    del view, mapped_w
    mapped.close()


def _jit_fill(pool, lib):
    """repack.RecordFiller running repack_jit's kernels on `pool` (what JitBackend passes)."""

    def fill(qname, src, rows, n_blocks, out):
        s = RepackSlots
        args = np.zeros(s.SIZE, np.int64)
        args[s.SRC], args[s.DST] = src.ctypes.data, out.ctypes.data
        args[s.ROWS], args[s.N_BLOCKS] = rows, n_blocks
        pool.run(lib.address(f"repack_{qname.lower()}"), args.ctypes.data)

    return fill


@pytest.mark.parametrize(("isa", "cpu"), PATHS)
def test_the_jit_repack_writes_the_numpy_repacks_bytes(isa, cpu, monkeypatch):
    lib = KernelLibrary(cpu=_target_or_skip(cpu, monkeypatch))
    lib.add_modules([pool_module(), ("repack", repack_jit.module_ir())])
    pool = ThreadPool(lib, 2)
    rng = np.random.default_rng(23)
    # 48 rows a pass: the last pass of 100 or 37 rows is short and not a multiple of 16
    monkeypatch.setattr(repack, "_FILL_PASS_BYTES", 16 * 3 * 210 * 3)
    try:
        for qtype in PACKED:
            for rows, cols in [(1, 256), (15, 768), (16, 512), (37, 768), (100, 256)]:
                blocks = random_blocks(rng, qtype, rows * cols // 256).reshape(rows, -1)
                w = QTensor("w", qtype, (rows, cols), blocks)
                jit = repack.repack(w, fill=_jit_fill(pool, lib))
                np.testing.assert_array_equal(
                    jit.data, repack.repack(w).data, err_msg=f"{isa} {qtype.name} {rows}x{cols}"
                )
    finally:
        pool.close()
