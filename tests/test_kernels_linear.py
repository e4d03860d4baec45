"""JIT mat-vec / mat-mul against independent oracles, for every tensor type the engine loads.

Oracle: gguf-py's dequantizer (not ours) times x in float64. Quantized weights run with int8
activations, exactly like llama.cpp, so they are checked two ways: tightly against x rounded
through a hand-written numpy int8 block quantizer, and loosely against the float input.
Shapes include row counts that are not a multiple of the 4-row tile, token counts that are not
a multiple of the 8-token tile, and (float types) row lengths that are not a multiple of 16.
"""

import numpy as np
import pytest
from gguf import GGML_QUANT_SIZES, quants
from gguf import GGMLQuantizationType as Q

from engine.kernels import quant_iq_vnni, quant_matmul
from engine.kernels.compiler import CPU_ENV, CpuSelectionError, KernelLibrary, target_cpu
from engine.kernels.jit_backend import LAZY_QUANT_TYPES, JitBackend, kernel_modules, quant_module
from engine.kernels.quant_iq import GRID_TYPES
from engine.kernels.threads import ThreadPool
from engine.qtensor import QTensor
from tests.quant_blocks import random_blocks, scale_down

SIMPLE = [Q.Q4_0, Q.Q4_1, Q.Q5_0, Q.Q5_1, Q.Q8_0]
KQUANTS = [Q.Q2_K, Q.Q3_K, Q.Q4_K, Q.Q5_K, Q.Q6_K]
FLOATS = [Q.F32, Q.F16, Q.BF16]
# Codebook, ternary and MXFP4 types (engine/kernels/quant_iq.py); their random blocks come from
# tests/test_quants.py's generator (finite scales, including MXFP4's e8m0 and IQ1_M's split fp16).
IQ = [
    Q.IQ4_NL, Q.IQ4_XS, Q.MXFP4, Q.TQ2_0, Q.TQ1_0, Q.IQ3_S, Q.IQ3_XXS,
    Q.IQ2_XS, Q.IQ2_XXS, Q.IQ2_S, Q.IQ1_S, Q.IQ1_M,
]  # fmt: skip
# Offset of the fp16 super-block scale(s) that random bytes must not turn into inf/nan.
_K_SCALE_AT = {Q.Q2_K: (80, 2), Q.Q3_K: (108, 1), Q.Q4_K: (0, 2), Q.Q5_K: (0, 2), Q.Q6_K: (208, 1)}


def make_weight(qtype, rows, cols, rng) -> QTensor:
    if qtype in FLOATS:
        w = rng.standard_normal((rows, cols)).astype(np.float32)
        data = quants.quantize(w, qtype) if qtype != Q.F32 else w
        return QTensor("w", qtype, (rows, cols), np.ascontiguousarray(data))
    if qtype in SIMPLE:
        data = quants.quantize(rng.standard_normal((rows, cols)).astype(np.float32), qtype)
        return QTensor("w", qtype, (rows, cols), data)
    block, size = GGML_QUANT_SIZES[qtype]
    if qtype in IQ:
        blocks = random_blocks(rng, qtype, rows * (cols // block))
        scale_down(qtype, blocks)
        return QTensor("w", qtype, (rows, cols), blocks.reshape(rows, -1))
    raw = rng.integers(0, 256, size=(rows, cols // block, size), dtype=np.uint8)
    at, count = _K_SCALE_AT[qtype]
    scales = (rng.standard_normal((rows, cols // block, count)) * 0.01).astype(np.float16)
    raw[:, :, at : at + 2 * count] = scales.view(np.uint8)
    return QTensor("w", qtype, (rows, cols), raw.reshape(rows, -1))


def oracle_weight(w: QTensor) -> np.ndarray:
    if w.qtype == Q.F32:
        return w.data.astype(np.float64)
    return quants.dequantize(w.data, w.qtype).reshape(w.rows, w.cols).astype(np.float64)


def q8_round_trip(x: np.ndarray) -> np.ndarray:
    """x through int8 blocks of 32 with a float32 scale max|x|/127 (gguf's Q8_0 rounds the scale
    to float16, which the activations do not need)."""
    b = x.astype(np.float32).reshape(x.shape[0], -1, 32)
    amax = np.abs(b).max(axis=-1, keepdims=True)
    d = amax / np.float32(127)
    inv = np.where(amax > 0, np.float32(127) / np.where(amax > 0, amax, 1), 0).astype(np.float32)
    q = np.round(b * inv)
    return (q.astype(np.float64) * d).reshape(x.shape)


@pytest.fixture(scope="module")
def backend():
    b = JitBackend(n_threads=2)
    yield b
    b.close()


SHAPES = [(1, 1), (7, 1), (37, 3), (64, 4), (9, 9), (130, 17)]  # (rows, tokens)


@pytest.mark.parametrize("qtype", SIMPLE + KQUANTS + IQ, ids=lambda q: q.name)
@pytest.mark.parametrize("rows,tokens", SHAPES)
def test_quantized_linear_matches_gguf_oracle(backend, qtype, rows, tokens):
    rng = np.random.default_rng(rows * 100 + tokens)
    block = GGML_QUANT_SIZES[qtype][0]
    cols = block * (3 if block == 256 else 7)
    w = make_weight(qtype, rows, cols, rng)
    x = rng.standard_normal((tokens, cols)).astype(np.float32)
    out = backend.linear(w, x)
    W = oracle_weight(w)
    exact = q8_round_trip(x) @ W.T
    np.testing.assert_allclose(out, exact, rtol=1e-4, atol=1e-4 * np.abs(exact).max())
    # Against the float input: rounding moves each x_i by at most (block max|x|)/254, so the
    # output can move by at most sum_i |w_i| * that (plus float noise).
    loose = x.astype(np.float64) @ W.T
    step = np.repeat(np.abs(x).reshape(tokens, -1, 32).max(axis=-1), 32, axis=1) / 254.0
    bound = step @ np.abs(W).T
    assert (np.abs(out - loose) <= bound * 1.001 + 1e-4).all()


@pytest.mark.parametrize("qtype", FLOATS, ids=lambda q: q.name)
@pytest.mark.parametrize("rows,tokens,cols", [(1, 1, 5), (13, 3, 16), (33, 5, 47), (8, 2, 640)])
def test_float_linear_matches_numpy(backend, qtype, rows, tokens, cols):
    rng = np.random.default_rng(cols + rows)
    w = make_weight(qtype, rows, cols, rng)
    x = rng.standard_normal((tokens, cols)).astype(np.float32)
    out = np.full((tokens, rows), np.nan, np.float32)
    backend.linear(w, x, out=out)
    expected = x.astype(np.float64) @ oracle_weight(w).T
    np.testing.assert_allclose(out, expected, rtol=1e-4, atol=1e-4 * np.abs(expected).max())


def test_writes_into_non_contiguous_out(backend):
    rng = np.random.default_rng(3)
    w = make_weight(Q.Q8_0, 12, 64, rng)
    x = rng.standard_normal((2, 64)).astype(np.float32)
    big = np.zeros((12, 4), np.float32)
    view = big.T[:2]  # (2, 12), not C-contiguous
    backend.linear(w, x, out=view)
    np.testing.assert_allclose(view, backend.linear(w, x), rtol=1e-6)


@pytest.mark.parametrize(
    ("isa", "cpu"), [("avx2", None), ("generic", None), ("vnni", "cascadelake")]
)
def test_other_instruction_set_paths(isa, cpu, monkeypatch):
    """The non-VNNI dot products give the same numbers (they run here too: AVX2 and plain IR),
    and so does the VNNI path of a CPU without AVX512-VBMI (Cascade Lake: the grid types'
    code tables are looked up with vpermi2w instead of vpermi2b, quant_iq_vnni.has_vbmi)."""
    if cpu is None:
        lib = KernelLibrary()
    else:
        monkeypatch.setenv(CPU_ENV, cpu)
        try:
            target = target_cpu()
        except CpuSelectionError as exc:
            pytest.skip(f"this CPU cannot run {cpu} code: {exc}")
        assert not target.has("avx512vbmi") and not quant_iq_vnni.has_vbmi()
        lib = KernelLibrary(cpu=target)
    # that VNNI path differs from the host's only in the grid types
    types = SIMPLE + KQUANTS + IQ if cpu is None else [q for q in IQ if q.name in GRID_TYPES]
    start = {"pool", "quantize_q8", *(f"mm_{q.name}_{isa}" for q in types)}
    lib.add_modules([m for m in kernel_modules(isa) if m[0] in start])
    lib.add_modules([quant_module(q.name, isa) for q in IQ if q in types])  # lazily in the app
    pool = ThreadPool(lib, 1)
    rng = np.random.default_rng(11)
    for qtype in types:
        block = GGML_QUANT_SIZES[qtype][0]
        w = make_weight(qtype, 6, block * 2, rng)
        x = rng.standard_normal((5, block * 2)).astype(np.float32)
        n = x.shape[1]
        aq = np.zeros((5, n), np.int8)
        ad = np.zeros((5, n // 32), np.float32)
        sums = np.zeros((5, n // 16), np.float32)
        sums32 = np.zeros((5, n // 32), np.float32)
        isums = np.zeros((5, n // 16), np.int32)
        qargs = np.array(
            [x.ctypes.data, 5, n, aq.ctypes.data, ad.ctypes.data, sums.ctypes.data]
            + [sums32.ctypes.data, isums.ctypes.data],
            np.int64,
        )
        pool.run(lib.address("quantize_q8"), qargs.ctypes.data)
        out = np.zeros((5, 6), np.float32)
        margs = np.array(
            [
                w.data.ctypes.data,
                w.data.strides[0],
                6,
                n // block,
                5,
                aq.ctypes.data,
                ad.ctypes.data,
                sums.ctypes.data,
                out.ctypes.data,
                n,
                6,
            ],
            np.int64,
        )
        pool.run(lib.address(f"mm_{qtype.name}"), margs.ctypes.data)
        exact = q8_round_trip(x) @ oracle_weight(w).T
        np.testing.assert_allclose(
            out, exact, rtol=1e-4, atol=1e-4 * np.abs(exact).max(), err_msg=f"{isa} {qtype.name}"
        )
    pool.close()
    assert set(quant_matmul.LAYOUTS) == {q.name for q in SIMPLE + KQUANTS + IQ}


def test_new_types_compile_on_first_use_not_at_start_up():
    # start-up compiles the classic types only; the 12 newer ones wait until a weight needs one
    names = {name for name, _ in kernel_modules("vnni")}
    assert {f"mm_{q.name}_vnni" for q in SIMPLE + KQUANTS} <= names
    assert not any(f"mm_{q.name}_vnni" in names for q in IQ)
    assert {q.name for q in IQ} == LAZY_QUANT_TYPES
