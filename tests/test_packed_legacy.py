"""Q4_0 / Q4_1 / Q5_0 / Q5_1 / Q8_0 weights repacked into 16-row records of one 32-value block
(engine/kernels/repack.py) and the mat-mul over them (engine/kernels/packed_legacy.py), against
independent oracles.

Oracle: gguf-py's dequantizer of the original GGUF rows (not ours), times x rounded through a
hand-written numpy int8 block quantizer (tests/test_kernels_linear.q8_round_trip), in float64.
Row counts are not multiples of the 16-row record, token counts not multiples of the 8-token
tile, and the column counts are the small models' (576, 640: whole 32-value blocks, not whole
256-value super-blocks); every instruction-set path runs here (LOCALCHAT_CPU). The backend-level checks (records used,
same bits in every tile) run for both families in tests/test_packed_matmul.py.
"""

import numpy as np
import pytest
from gguf import GGMLQuantizationType as Q
from gguf import quants

from engine.kernels import act_quant, repack, repack_jit
from engine.kernels.compiler import KernelLibrary
from engine.kernels.jit_backend import packed_module
from engine.kernels.threads import ThreadPool, pool_module
from engine.qtensor import QTensor
from tests.quant_blocks import random_blocks
from tests.test_kernels_linear import make_weight, oracle_weight, q8_round_trip
from tests.test_packed_matmul import (
    LEGACY,
    PATHS,
    _jit_fill,
    _packed_matmul,
    _quantize,
    _target_or_skip,
)


@pytest.mark.parametrize("qtype", LEGACY, ids=lambda q: q.name)
@pytest.mark.parametrize("rows", [1, 15, 16, 37])
def test_records_dequantize_to_gguf_pys_values(qtype, rows):
    rng = np.random.default_rng(rows)
    cols = 576
    blocks = random_blocks(rng, qtype, rows * cols // 32).reshape(rows, -1)
    w = QTensor("w", qtype, (rows, cols), blocks)
    assert repack.packable(w)
    packed = repack.repack(w)
    assert packed.data.shape == (-(-rows // 16), cols // 32, repack.record_bytes(qtype.name))
    # the records take the file's bytes per row (f16 scales kept as f16)
    assert packed.group_bytes == 16 * blocks.shape[1]
    expected = quants.dequantize(blocks, qtype).reshape(rows, cols)
    np.testing.assert_array_equal(repack.dequantize_records(packed), expected)


@pytest.mark.parametrize(("isa", "cpu"), PATHS)
def test_every_path_matches_the_oracle_on_odd_shapes(isa, cpu, monkeypatch):
    lib = KernelLibrary(cpu=_target_or_skip(cpu, monkeypatch))
    lib.add_modules(
        [pool_module(), ("quantize_q8", act_quant.module_ir())]
        + [packed_module(q.name, isa) for q in LEGACY]
    )
    pool = ThreadPool(lib, 2)
    rng = np.random.default_rng(17)
    try:
        for qtype in LEGACY:
            for rows, tokens, cols in [(1, 1, 32), (37, 3, 640), (16, 8, 96), (70, 17, 576)]:
                w = make_weight(qtype, rows, cols, rng)
                x = rng.standard_normal((tokens, cols)).astype(np.float32)
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
                    err_msg=f"{isa} {qtype.name} {rows}x{tokens}x{cols}",
                )
                assert (out[:, rows:] == 7.0).all()
    finally:
        pool.close()


@pytest.mark.parametrize(("isa", "cpu"), PATHS)
def test_q8_0_extremes_stay_exact(isa, cpu, monkeypatch):
    """-128 weights and +-127 activations everywhere: the sums the AVX2 pair products would
    saturate at (u = q + 128 there) and the largest |q| the VNNI offset must undo."""
    lib = KernelLibrary(cpu=_target_or_skip(cpu, monkeypatch))
    lib.add_modules(
        [pool_module(), ("quantize_q8", act_quant.module_ir()), packed_module("Q8_0", isa)]
    )
    pool = ThreadPool(lib, 1)
    rows, cols = 20, 32  # one block: one rounding per output, so the oracle's bits
    blocks = np.zeros((rows, cols // 32, 34), np.uint8)
    blocks[..., :2] = np.array([1.0], np.float16).view(np.uint8)
    q = np.where(np.arange(32) % 3 == 0, -128, 127).astype(np.int8)
    blocks[..., 2:] = (
        np.where(np.arange(rows)[:, None, None] % 2, q, -q.astype(np.int16) - 1)
        .astype(np.int8)
        .view(np.uint8)
    )
    w = QTensor("w", Q.Q8_0, (rows, cols), blocks.reshape(rows, -1))
    x = np.where(np.arange(cols) % 2, 1.0, -1.0).astype(np.float32)[None]
    try:
        bufs = _quantize(pool, lib, x)
        out = np.zeros((1, rows), np.float32)
        _packed_matmul(pool, lib, repack.repack(w), bufs, 1, out)
    finally:
        pool.close()
    np.testing.assert_array_equal(out, (q8_round_trip(x) @ oracle_weight(w).T).astype(np.float32))


@pytest.mark.parametrize(("isa", "cpu"), PATHS)
def test_the_jit_repack_writes_the_numpy_repacks_bytes(isa, cpu, monkeypatch):
    lib = KernelLibrary(cpu=_target_or_skip(cpu, monkeypatch))
    lib.add_modules([pool_module(), ("repack", repack_jit.module_ir())])
    pool = ThreadPool(lib, 2)
    rng = np.random.default_rng(23)
    # 48 rows a pass of 640 columns: the last pass of 100 or 37 rows is short and not a
    # multiple of 16
    monkeypatch.setattr(repack, "_FILL_PASS_BYTES", 16 * 3 * 20 * 34)
    try:
        for qtype in LEGACY:
            for rows, cols in [(1, 32), (15, 576), (16, 96), (37, 640), (100, 640)]:
                blocks = random_blocks(rng, qtype, rows * cols // 32).reshape(rows, -1)
                w = QTensor("w", qtype, (rows, cols), blocks)
                jit = repack.repack(w, fill=_jit_fill(pool, lib))
                np.testing.assert_array_equal(
                    jit.data, repack.repack(w).data, err_msg=f"{isa} {qtype.name} {rows}x{cols}"
                )
    finally:
        pool.close()
