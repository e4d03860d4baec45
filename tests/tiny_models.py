"""Tiny random-weight GGUF files for every architecture and tensor type the engine runs.

`write_tiny_model(path, "llama")` writes a valid GGUF with llama.cpp's metadata keys and tensor
names, a real tokenizer (SmolLM2's GPT-2 BPE, 49152 tokens, copied from the packaged model's
metadata; Gemma 3's SentencePiece vocabulary with tokenizer="gemma3"; or none) and random weights
small enough that activations stay sane through a few layers. Tests of the loader, the forward
pass and the kernels use these instead of real checkpoints so they run in milliseconds.

Block types gguf-py can quantize (F16 BF16 Q8_0 Q4_0 Q4_1 Q5_0 Q5_1) are quantized from the
random float weights. gguf-py has no K-quant quantizer, so K-quant tensors are random blocks whose
fp16 scale fields are then set so the dequantized tensor has the requested spread: every bit
pattern of the other fields is a valid block. K-quants need rows that are multiples of 256
(choose d_model, d_ff and n_heads * head_dim accordingly).
"""

from __future__ import annotations

import atexit
import functools
import shutil
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFValueType, GGUFWriter, LlamaFileType
from gguf import quants as gguf_quants

from engine.gguf import open_gguf
from engine.model_files import default_model_path, gemma3_270m_path

Q = GGMLQuantizationType
ARCHS = (
    "llama",
    "qwen2",
    "qwen3",
    "gemma3",
    "gemma2",
    "phi3",
    "granite",
    "olmo2",
    "smollm3",
    "mistral3",
    "qwen3moe",
    "gpt-oss",
)
QUANTIZABLE = (Q.F16, Q.BF16, Q.Q8_0, Q.Q4_0, Q.Q4_1, Q.Q5_0, Q.Q5_1)
K_QUANTS = (Q.Q2_K, Q.Q3_K, Q.Q4_K, Q.Q5_K, Q.Q6_K)
ALL_QTYPES = (Q.F32, *QUANTIZABLE, *K_QUANTS)

# Per-architecture defaults that match the real models of that family.
_ARCH_DEFAULTS: dict[str, dict[str, Any]] = {
    "llama": dict(rope_freq_base=10000.0, rms_eps=1e-5, tie_embeddings=False),
    "qwen2": dict(rope_freq_base=1000000.0, rms_eps=1e-6, tie_embeddings=False),
    "qwen3": dict(rope_freq_base=1000000.0, rms_eps=1e-6, tie_embeddings=False),
    # Gemma 3 always ties the output to the embeddings; every 6th layer (5, 11, ..) is global.
    "gemma3": dict(
        rope_freq_base=1000000.0, rms_eps=1e-6, tie_embeddings=True, n_layers=6, sliding_window=8
    ),
    # Gemma 2: layers alternate local / global; soft-capped attention and logits.
    "gemma2": dict(
        rope_freq_base=10000.0, rms_eps=1e-6, tie_embeddings=True, n_layers=2, sliding_window=8
    ),
    "phi3": dict(rope_freq_base=10000.0, rms_eps=1e-5, tie_embeddings=False),
    "granite": dict(rope_freq_base=10000000.0, rms_eps=1e-5, tie_embeddings=True),
    "olmo2": dict(rope_freq_base=500000.0, rms_eps=1e-6, tie_embeddings=False),
    "smollm3": dict(rope_freq_base=5000000.0, rms_eps=1e-6, tie_embeddings=True, n_layers=4),
    "mistral3": dict(rope_freq_base=1000000.0, rms_eps=1e-5, tie_embeddings=False),
    "qwen3moe": dict(rope_freq_base=1000000.0, rms_eps=1e-6, tie_embeddings=False),
    # gpt-oss: even layers windowed (128 positions in the real models), YaRN x32 over 4096
    "gpt-oss": dict(
        rope_freq_base=150000.0, rms_eps=1e-5, tie_embeddings=False, sliding_window=128
    ),
}
# What the file layout of each architecture is (llama.cpp's converters), for the writer below;
# tools/tiny_hf_models.py writes the same layouts from transformers' models for the oracle.
_FUSED = ("phi3",)  # attn_qkv and a gate+up ffn_up of 2 * d_ff rows
_HEAD_QK_NORMS = ("qwen3", "qwen3moe", "gemma3")  # per-head q/k norms (head_dim)
_SANDWICH = ("gemma2", "gemma3", "olmo2")  # post_attention_norm / post_ffw_norm
_SWA_KEY = ("gemma2", "gemma3", "gpt-oss")
_MOE = ("qwen3moe", "gpt-oss")

_FILE_TYPES = {
    Q.F32: LlamaFileType.ALL_F32,
    Q.F16: LlamaFileType.MOSTLY_F16,
    Q.BF16: LlamaFileType.MOSTLY_BF16,
    Q.Q4_0: LlamaFileType.MOSTLY_Q4_0,
    Q.Q4_1: LlamaFileType.MOSTLY_Q4_1,
    Q.Q5_0: LlamaFileType.MOSTLY_Q5_0,
    Q.Q5_1: LlamaFileType.MOSTLY_Q5_1,
    Q.Q8_0: LlamaFileType.MOSTLY_Q8_0,
    Q.Q2_K: LlamaFileType.MOSTLY_Q2_K,
    Q.Q3_K: LlamaFileType.MOSTLY_Q3_K_M,
    Q.Q4_K: LlamaFileType.MOSTLY_Q4_K_M,
    Q.Q5_K: LlamaFileType.MOSTLY_Q5_K_M,
    Q.Q6_K: LlamaFileType.MOSTLY_Q6_K,
}

# Byte offsets of the fp16 scale fields in one K-quant block: (d, dmin or None), and the dmin/d
# ratio that centres the dequantized values near zero (mean of sc*q equals the mean of m).
_K_SCALE_FIELDS: dict[GGMLQuantizationType, tuple[int, int | None, float]] = {
    Q.Q2_K: (80, 82, 1.5),  # scales[16] qs[64] d dmin: w = d*sc*q - dmin*m, q in 0..3
    Q.Q3_K: (108, None, 0.0),  # hmask[32] qs[64] scales[12] d: symmetric
    Q.Q4_K: (0, 2, 7.5),  # d dmin scales[12] qs[128]: q in 0..15
    Q.Q5_K: (0, 2, 15.5),  # d dmin scales[12] qh[32] qs[128]: q in 0..31
    Q.Q6_K: (208, None, 0.0),  # ql[128] qh[64] scales[16] d: symmetric
}


@functools.lru_cache(maxsize=2)
def tokenizer_metadata(
    source: str = "smollm2",
) -> tuple[tuple[str, Any, GGUFValueType, GGUFValueType | None], ...]:
    """(key, value, type, element type) of every tokenizer.* entry of a packaged real model."""
    path = {"smollm2": default_model_path, "gemma3": gemma3_270m_path}[source]()
    g = open_gguf(path)
    return tuple(
        (key, value, g.metadata_types[key].type, g.metadata_types[key].element_type)
        for key, value in g.metadata.items()
        if key.startswith("tokenizer.")
    )


def write_tiny_model(path: str | Path, arch: str, *args: Any, **kwargs: Any) -> Path:
    """Write a tiny random-weight model of `arch` to `path` and return the path (see
    _write_tiny_model for the arguments).

    The bytes are a function of the arguments (the weights come from a seeded generator), so a
    file made once per process is copied for the next call with the same arguments: a 49152-token
    model takes ~1 s to write (mostly its random embedding), a copy milliseconds, and most tests
    ask for one of a few models. Calls with arguments that have no exact key (arrays, objects)
    are written afresh."""
    key = _exact_key((arch, args, sorted(kwargs.items())))
    written = _WRITTEN.get(key) if key is not None else None
    if written is not None and written.exists():
        shutil.copyfile(written, path)
        return Path(path)
    _write_tiny_model(path, arch, *args, **kwargs)
    if key is not None:
        copy = _written_dir() / f"{len(_WRITTEN)}.gguf"
        shutil.copyfile(path, copy)
        _WRITTEN[key] = copy
    return Path(path)


_WRITTEN: dict[str, Path] = {}


@functools.cache
def _written_dir() -> Path:
    directory = Path(tempfile.mkdtemp(prefix="tiny-models-"))
    atexit.register(shutil.rmtree, directory, ignore_errors=True)
    return directory


def _exact_key(value: Any) -> str | None:
    """repr(value) when it names the value exactly (None, bools, numbers, strings, enums and
    tuples, lists and dicts of them), else None: a numpy array's repr elides its middle."""

    def exact(v: Any) -> bool:
        if v is None or isinstance(v, (bool, int, float, str, bytes)):
            return True  # IntEnum members (quant types, value types) are ints with a full repr
        if isinstance(v, (tuple, list)):
            return all(exact(x) for x in v)
        if isinstance(v, dict):
            return all(exact(k) and exact(x) for k, x in v.items())
        return False

    return repr(value) if exact(value) else None


def _write_tiny_model(
    path: str | Path,
    arch: str,
    qtype: GGMLQuantizationType = Q.F32,
    seed: int = 0,
    *,
    n_layers: int | None = None,
    d_model: int = 64,
    n_heads: int = 4,
    n_kv_heads: int = 2,
    head_dim: int = 16,
    d_ff: int = 128,
    n_ctx_train: int = 2048,
    tokenizer: str | None = "smollm2",
    vocab_size: int = 256,
    embedding_qtype: GGMLQuantizationType | None = None,
    rope_freq_base: float | None = None,
    rms_eps: float | None = None,
    sliding_window: int | None = None,
    tie_embeddings: bool | None = None,
    weight_scale: float = 0.05,
    extra_metadata: dict[str, tuple[Any, GGUFValueType]] | None = None,
    omit_keys: tuple[str, ...] = (),
    omit_tensors: tuple[str, ...] = (),
    n_expert: int = 8,
    n_expert_used: int = 2,
    d_ff_exp: int | None = None,
    expert_qtype: GGMLQuantizationType | None = None,
) -> Path:
    """Write a tiny random-weight model of `arch` to `path` and return the path.

    `qtype` is the type of every 2-D weight (norms and biases stay F32); `embedding_qtype`
    overrides it for token_embd. `omit_keys` / `omit_tensors` drop entries by exact name, and
    `extra_metadata` adds or replaces keys ({key: (value, GGUFValueType)}), for bad-file tests.
    tokenizer=None writes no tokenizer metadata and a `vocab_size`-row embedding: the fastest
    file to write and parse, for tests that only need weights. qwen3moe and gpt-oss layers hold
    `n_expert` experts of `d_ff_exp` rows (default d_ff), `n_expert_used` routed per token, of
    `expert_qtype` (default qtype; gpt-oss files ship MXFP4). gpt-oss layers also get q/k/v/o,
    router and expert biases, attention sinks and its YaRN keys.
    """
    if arch not in ARCHS:
        raise ValueError(f"arch={arch!r} is not one of {ARCHS}")
    qtype = GGMLQuantizationType(qtype)
    if qtype not in ALL_QTYPES:
        raise ValueError(f"qtype={qtype.name} is not one of {[t.name for t in ALL_QTYPES]}")
    defaults = _ARCH_DEFAULTS[arch]
    n_layers = n_layers if n_layers is not None else defaults.get("n_layers", 2)
    rope_freq_base = rope_freq_base if rope_freq_base is not None else defaults["rope_freq_base"]
    rms_eps = rms_eps if rms_eps is not None else defaults["rms_eps"]
    tie_embeddings = tie_embeddings if tie_embeddings is not None else defaults["tie_embeddings"]
    sliding_window = (
        sliding_window if sliding_window is not None else defaults.get("sliding_window")
    )
    embedding_qtype = GGMLQuantizationType(
        embedding_qtype if embedding_qtype is not None else qtype
    )

    tok = tokenizer_metadata(tokenizer) if tokenizer is not None else ()
    if tok:
        vocab_size = len(next(v for k, v, _, _ in tok if k == "tokenizer.ggml.tokens"))
    rng = np.random.default_rng(seed)
    q_dim, kv_dim = n_heads * head_dim, n_kv_heads * head_dim

    # --- metadata (llama.cpp key names) ---------------------------------------------------------
    kv: dict[str, tuple[Any, GGUFValueType, GGUFValueType | None]] = {}

    def put(key: str, value: Any, vtype: GGUFValueType, sub: GGUFValueType | None = None) -> None:
        kv[key] = (value, vtype, sub)

    U32, F32, STR = GGUFValueType.UINT32, GGUFValueType.FLOAT32, GGUFValueType.STRING
    put("general.type", "model", STR)
    put("general.name", f"tiny-{arch}-{qtype.name}", STR)
    put("general.file_type", int(_FILE_TYPES[qtype]), U32)
    put("general.quantization_version", 2, U32)
    put(f"{arch}.context_length", n_ctx_train, U32)
    put(f"{arch}.embedding_length", d_model, U32)
    put(f"{arch}.block_count", n_layers, U32)
    put(f"{arch}.feed_forward_length", d_ff, U32)
    put(f"{arch}.attention.head_count", n_heads, U32)
    put(f"{arch}.attention.head_count_kv", n_kv_heads, U32)
    put(f"{arch}.attention.key_length", head_dim, U32)
    put(f"{arch}.attention.value_length", head_dim, U32)
    put(f"{arch}.attention.layer_norm_rms_epsilon", float(rms_eps), F32)
    put(f"{arch}.rope.freq_base", float(rope_freq_base), F32)
    if arch == "llama":
        put("llama.rope.dimension_count", head_dim, U32)
        put("llama.vocab_size", vocab_size, U32)
    if arch in _SWA_KEY:
        put(f"{arch}.attention.sliding_window", sliding_window, U32)
    if arch == "gemma2":
        put("gemma2.attn_logit_softcapping", 50.0, F32)
        put("gemma2.final_logit_softcapping", 30.0, F32)
    if arch in _MOE:
        put(f"{arch}.expert_count", n_expert, U32)
        put(f"{arch}.expert_used_count", n_expert_used, U32)
        put(f"{arch}.expert_feed_forward_length", d_ff_exp or d_ff, U32)
    if arch == "gpt-oss":  # what convert_hf_to_gguf writes for gpt-oss-20b's rope_scaling
        put("gpt-oss.rope.scaling.type", "yarn", STR)
        put("gpt-oss.rope.scaling.factor", 32.0, F32)
        put("gpt-oss.rope.scaling.original_context_length", 4096, U32)
    if arch == "granite":  # granite-3.x-2b's multipliers
        put("granite.embedding_scale", 12.0, F32)
        put("granite.residual_scale", 0.22, F32)
        put("granite.attention.scale", 0.015625, F32)
        put("granite.logit_scale", 8.0, F32)
    for key, value, vtype, sub in tok:
        put(key, value, vtype, sub)
    for key, (value, vtype) in (extra_metadata or {}).items():
        put(key, value, vtype, _element_type(value) if vtype == GGUFValueType.ARRAY else None)

    # --- tensors (llama.cpp names, numpy shapes (out_features, in_features)) -------------------
    def norm(n: int) -> np.ndarray:
        return (1.0 + 0.1 * rng.standard_normal(n)).astype(np.float32)

    def bias(n: int) -> np.ndarray:
        return (0.02 * rng.standard_normal(n)).astype(np.float32)

    tensors: list[tuple[str, np.ndarray, GGMLQuantizationType]] = []

    def weight(name: str, rows: int, cols: int, wtype: GGMLQuantizationType = qtype) -> None:
        tensors.append((name, _random_weight(rng, rows, cols, wtype, weight_scale, name), wtype))

    exp_qtype = GGMLQuantizationType(expert_qtype if expert_qtype is not None else qtype)

    def experts(name: str, rows: int, cols: int) -> None:
        """A stacked (n_expert, rows, cols) weight, as llama.cpp's *_exps tensors."""
        flat = _random_weight(rng, n_expert * rows, cols, exp_qtype, weight_scale, name)
        tensors.append((name, flat.reshape(n_expert, rows, -1), exp_qtype))

    def vector(name: str, values: np.ndarray) -> None:
        tensors.append((name, values, Q.F32))

    weight("token_embd.weight", vocab_size, d_model, embedding_qtype)
    for i in range(n_layers):
        p = f"blk.{i}."
        if arch != "olmo2":  # OLMo 2 normalises only the sub-block outputs
            vector(p + "attn_norm.weight", norm(d_model))
        if arch in _FUSED:
            weight(p + "attn_qkv.weight", q_dim + 2 * kv_dim, d_model)
        else:
            weight(p + "attn_q.weight", q_dim, d_model)
            weight(p + "attn_k.weight", kv_dim, d_model)
            weight(p + "attn_v.weight", kv_dim, d_model)
        weight(p + "attn_output.weight", d_model, q_dim)
        if arch in ("qwen2", "gpt-oss"):
            vector(p + "attn_q.bias", bias(q_dim))
            vector(p + "attn_k.bias", bias(kv_dim))
            vector(p + "attn_v.bias", bias(kv_dim))
        if arch == "gpt-oss":
            vector(p + "attn_output.bias", bias(d_model))
            vector(p + "attn_sinks.weight", rng.standard_normal(n_heads).astype(np.float32))
        if arch in _HEAD_QK_NORMS:
            vector(p + "attn_q_norm.weight", norm(head_dim))
            vector(p + "attn_k_norm.weight", norm(head_dim))
        if arch == "olmo2":  # over the whole projection
            vector(p + "attn_q_norm.weight", norm(q_dim))
            vector(p + "attn_k_norm.weight", norm(kv_dim))
        if arch in _SANDWICH:
            vector(p + "post_attention_norm.weight", norm(d_model))
        if arch == "gpt-oss":  # llama.cpp's name for this arch's pre-FFN norm
            vector(p + "post_attention_norm.weight", norm(d_model))
        elif arch != "olmo2":
            vector(p + "ffn_norm.weight", norm(d_model))
        if arch in _MOE:
            ff = d_ff_exp or d_ff
            weight(p + "ffn_gate_inp.weight", n_expert, d_model, Q.F32)
            experts(p + "ffn_gate_exps.weight", ff, d_model)
            experts(p + "ffn_up_exps.weight", ff, d_model)
            experts(p + "ffn_down_exps.weight", d_model, ff)
        if arch == "gpt-oss":
            vector(p + "ffn_gate_inp.bias", bias(n_expert))
            for part, rows in (
                ("ffn_gate_exps", ff),
                ("ffn_up_exps", ff),
                ("ffn_down_exps", d_model),
            ):
                tensors.append(
                    (p + part + ".bias", bias(n_expert * rows).reshape(n_expert, rows), Q.F32)
                )
        elif arch in _FUSED:
            weight(p + "ffn_up.weight", 2 * d_ff, d_model)
            weight(p + "ffn_down.weight", d_model, d_ff)
        else:
            weight(p + "ffn_gate.weight", d_ff, d_model)
            weight(p + "ffn_up.weight", d_ff, d_model)
            weight(p + "ffn_down.weight", d_model, d_ff)
        if arch in _SANDWICH:
            vector(p + "post_ffw_norm.weight", norm(d_model))
    vector("output_norm.weight", norm(d_model))
    if not tie_embeddings:
        weight("output.weight", vocab_size, d_model)

    # --- write ----------------------------------------------------------------------------------
    path = Path(path)
    writer = _MemoizingWriter(path, arch)
    if "general.architecture" in omit_keys:
        del writer.kv_data[0]["general.architecture"]
    for key, (value, vtype, sub) in kv.items():
        if key not in omit_keys:
            writer.add_key_value(key, value, vtype, sub)
    for name, data, wtype in tensors:
        if name not in omit_tensors:
            writer.add_tensor(name, data, raw_dtype=None if wtype in (Q.F32, Q.F16) else wtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def _element_type(values: list) -> GGUFValueType:
    return GGUFValueType.get_type(values[0])


def _random_weight(
    rng: np.random.Generator,
    rows: int,
    cols: int,
    qtype: GGMLQuantizationType,
    scale: float,
    name: str,
) -> np.ndarray:
    """Storage for a (rows, cols) weight of `qtype`: float array or uint8 (rows, row_bytes)."""
    if qtype in K_QUANTS:
        return _random_kquant(rng, rows, cols, qtype, scale, name)
    values = (scale * rng.standard_normal((rows, cols))).astype(np.float32)
    if qtype == Q.F32:
        return values
    if qtype == Q.F16:
        return values.astype(np.float16)
    block_size = GGML_QUANT_SIZES[qtype][0]
    if cols % block_size:
        raise ValueError(
            f"{name}: {cols} columns is not a multiple of the {qtype.name} block size {block_size}"
        )
    return _quantize_rows(values, qtype)


def _random_kquant(
    rng: np.random.Generator,
    rows: int,
    cols: int,
    qtype: GGMLQuantizationType,
    scale: float,
    name: str,
) -> np.ndarray:
    block_size, type_size = GGML_QUANT_SIZES[qtype]
    if cols % block_size:
        raise ValueError(
            f"{name}: {cols} columns is not a multiple of 256, which {qtype.name} needs; "
            f"pick d_model, d_ff and n_heads * head_dim as multiples of 256"
        )
    blocks = rng.integers(0, 256, size=(rows * cols // block_size, type_size), dtype=np.uint8)
    d_at, dmin_at, dmin_ratio = _K_SCALE_FIELDS[qtype]

    def set_scales(d: float) -> None:
        blocks[:, d_at : d_at + 2] = np.full((len(blocks), 1), d, np.float16).view(np.uint8)
        if dmin_at is not None:
            dmin = np.full((len(blocks), 1), d * dmin_ratio, np.float16)
            blocks[:, dmin_at : dmin_at + 2] = dmin.view(np.uint8)

    # Dequantized values are linear in (d, dmin): measure the spread at d=1, then rescale.
    set_scales(1.0)
    spread = float(_dequantize_rows(blocks, qtype).std())
    set_scales(scale / spread)
    return blocks.reshape(rows, cols // block_size * type_size)


# gguf-py's quantize/dequantize call its row functions on groups of 16 rows, ~0.1 ms of Python
# each: 0.7 s of a 49152-token model's 1.6 s write. The same row functions (the same math, so the
# same bytes) over chunks of _ROWS_PER_CALL rows take ~0.05 s.
_ROWS_PER_CALL = 4096


def _quant_class(qtype: GGMLQuantizationType):
    return getattr(gguf_quants, GGMLQuantizationType(qtype).name)


def _quantize_rows(values: np.ndarray, qtype: GGMLQuantizationType) -> np.ndarray:
    rows = _quant_class(qtype).quantize_rows
    return np.concatenate(
        [rows(values[i : i + _ROWS_PER_CALL]) for i in range(0, len(values), _ROWS_PER_CALL)]
    )


def _dequantize_rows(blocks: np.ndarray, qtype: GGMLQuantizationType) -> np.ndarray:
    rows = _quant_class(qtype).dequantize_rows
    return np.concatenate(
        [rows(blocks[i : i + _ROWS_PER_CALL]) for i in range(0, len(blocks), _ROWS_PER_CALL)]
    )


class _MemoizingWriter(GGUFWriter):
    """GGUFWriter that packs each long metadata array (a tokenizer's 49k-262k tokens, scores and
    types) once per process: gguf-py packs element by element, ~0.9 s per file for SmolLM2's
    vocabulary, and most tiny models carry the same one. Keyed by content (a tuple of the
    values), so an array changed in place between two writes is packed again."""

    _MIN_LENGTH = 4096
    _packed: dict[tuple, bytes] = {}

    def _pack_val(self, val: Any, vtype: GGUFValueType, add_vtype: bool, sub_type=None) -> bytes:
        if vtype != GGUFValueType.ARRAY or isinstance(val, bytes) or len(val) < self._MIN_LENGTH:
            return super()._pack_val(val, vtype, add_vtype, sub_type)
        key = (add_vtype, sub_type, self.endianess, tuple(val))
        packed = self._packed.get(key)
        if packed is None:
            if len(self._packed) >= 8:  # a few vocabularies per process; bounded all the same
                self._packed.clear()
            packed = self._packed[key] = super()._pack_val(val, vtype, add_vtype, sub_type)
        return packed
