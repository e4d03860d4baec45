"""ModelConfig: the hyperparameters a forward pass needs, read from GGUF metadata per architecture.

Everything architecture-specific that is not a tensor lives here as a plain field, so the model
code reads `cfg.rope_neox` instead of asking "is this qwen?". Values that the GGUF does not store
but the architecture fixes (Gemma 3's local RoPE base, its attention scale) are set here, with
the reason next to them.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

from engine.errors import ModelFileError, UnsupportedModelError
from engine.gguf import StringArray
from engine.tensor_checks import check_tensors

SUPPORTED_ARCHS = (
    "llama",
    "mistral3",
    "qwen2",
    "qwen3",
    "gemma2",
    "gemma3",
    "phi3",
    "granite",
    "olmo2",
    "smollm3",
    "qwen3moe",
    "gpt-oss",
)
# Encoders of embedding models (engine/models/bert.py, engine/embedding.py), not chat models.
ENCODER_ARCHS = ("bert", "nomic-bert")
# Mixture-of-experts architectures (every layer's FFN is a routed set of experts).
_MOE_ARCHS = ("qwen3moe", "gpt-oss")
# Released MoE models have up to 512 experts; the bound keeps a hostile count from building
# millions of per-expert views before the tensors are checked.
MAX_EXPERTS = 4096
# Architectures whose converters permute q/k into GPT-J (interleaved) RoPE pairs; the others use
# NeoX pairing (first half / second half). llama.cpp's llama_model_rope_type: LLAMA_ROPE_TYPE_NORM.
_INTERLEAVED_ROPE_ARCHS = ("llama", "mistral3", "granite", "smollm3")
# Gemma's norm weights are stored as 1 + w (the converter adds the offset), GeGLU, sqrt(d) embeds.
_GEMMA_ARCHS = ("gemma2", "gemma3")

# Gemma 3: local (sliding-window) layers use RoPE base 10000; the GGUF stores only the global
# base (1e6). Matches transformers' `rope_local_base_freq` and llama.cpp's hard-coded value.
GEMMA3_LOCAL_ROPE_BASE = 10000.0
# Gemma 3: five local layers, then one global layer (layers 5, 11, 17, ... are global), when the
# file carries no explicit pattern.
GEMMA3_SWA_PERIOD = 6
GEMMA3_27B_LAYERS = 62
# Gemma 2: even layers are local (sliding window), odd layers global (transformers' layer_types,
# llama.cpp's set_swa_pattern(2)); both use the file's single RoPE base.
GEMMA2_SWA_PERIOD = 2
GEMMA2_27B_LAYERS = 46
# SmolLM3 drops RoPE on every fourth layer (3, 7, 11, ...): transformers' no_rope_layer_interval
# default and llama.cpp's n_no_rope_layer_step, neither stored in the GGUF.
SMOLLM3_NO_ROPE_PERIOD = 4
# gpt-oss: even layers use the sliding window, odd layers full attention (transformers'
# layer_types, llama.cpp's set_swa_pattern(2)); its experts' clamped SwiGLU constants, fixed by
# the architecture and stored in no GGUF key (transformers' swiglu_alpha / swiglu_limit
# defaults, the constants of llama.cpp's LLM_FFN_SWIGLU_OAI_MOE).
GPT_OSS_SWA_PERIOD = 2
GPT_OSS_SWIGLU_ALPHA = 1.702
GPT_OSS_SWIGLU_LIMIT = 7.0
# Multipliers and RoPE scaling factors read from the file: released models use 0.01..~64, so
# these bounds only keep a hostile value from overflowing float32 activations into inf/NaN.
MAX_MULTIPLIER = 1e4
MAX_ROPE_SCALING_FACTOR = 1e6
# YaRN correction range defaults (transformers' beta_fast / beta_slow, llama.cpp's yarn_beta_*).
YARN_BETA_FAST = 32.0
YARN_BETA_SLOW = 1.0
# Token positions are int32 in the kernels; a longer training context is not a real model.
MAX_CONTEXT_LENGTH = (1 << 31) - 1
# Per-layer settings are built from block_count before the tensors are checked against it; the
# deepest released models have ~130 layers, so this bound only keeps a hostile count cheap.
MAX_BLOCK_COUNT = 1 << 16


@dataclass(frozen=True)
class ModelConfig:
    arch: str
    n_layers: int
    d_model: int
    n_ff: int
    n_head: int
    n_kv_head: int
    head_dim: int
    n_vocab: int
    context_length: int
    norm_eps: float
    rope_theta: float  # base of the global (full attention) layers
    rope_theta_local: float  # base of sliding-window layers (== rope_theta where there are none)
    rope_neox: bool  # pairing style, see Backend.rope
    rope_freq_scale: float  # linear RoPE scaling (1 / factor) on global layers; 1.0 = none
    sliding_window: int  # 0 = no sliding window anywhere
    layer_uses_window: tuple[bool, ...]  # per layer: sliding-window (local) attention?
    attn_scale: float  # multiplies q.k
    embed_scale: float  # multiplies the token embedding (Gemma: sqrt(d_model))
    activation: str  # "silu" (SwiGLU), "gelu_tanh" (GeGLU) or "swiglu_oai" (gpt-oss experts)
    qk_norm: bool  # per-head RMSNorm on q and k before RoPE (qwen3, gemma3)
    qkv_bias: bool  # biases on q/k/v projections (qwen2, gpt-oss)
    sandwich_norms: bool  # extra RMSNorm after attention and after FFN (gemma3)
    final_logit_softcap: float = 0.0
    attn_logit_softcap: float = 0.0
    # pre_norms: RMSNorm before attention and FFN (attn_norm, ffn_norm); False for OLMo 2, which
    # only normalises the sub-block outputs (post_attention_norm, post_ffw_norm = sandwich_norms).
    pre_norms: bool = True
    qk_norm_full: bool = False  # q/k RMSNorm over the whole projection, not per head (OLMo 2)
    fused_gate_up: bool = False  # one ffn_up of 2*n_ff rows: gate then up (Phi-3)
    residual_scale: float = 1.0  # multiplies each sub-block output before the residual add
    logit_scale: float = 1.0  # logits are divided by it (Granite's logits_scaling)
    layer_uses_rope: tuple[bool, ...] = ()  # per layer; () = every layer (SmolLM3: not every 4th)
    # Long-context RoPE on the global layers: "none", "linear", "yarn", "longrope" or "llama3"
    # (llama3 and longrope carry their per-frequency factors as tensors in the file).
    rope_scaling: str = "none"
    rope_scaling_factor: float = 1.0
    rope_orig_context: int = 0  # the context the RoPE was trained at before scaling
    yarn_beta_fast: float = YARN_BETA_FAST
    yarn_beta_slow: float = YARN_BETA_SLOW
    # Multiplies cos and sin of the scaled RoPE (YaRN's mscale, LongRoPE's attention factor), so
    # q.k by its square: applied as part of the attention scale of the global layers.
    rope_attn_factor: float = 1.0
    # Llama 4 style attention temperature (Ministral 3): q *= 1 + scale * ln(1 + floor(pos /
    # length)) after RoPE; scale 0 = off.
    attn_temp_scale: float = 0.0
    attn_temp_length: int = 1
    rope_dims: int = 0  # leading dims of each head that RoPE rotates; 0 = all (head_dim)
    # Mixture of experts (qwen3moe): n_expert experts of n_ff_exp rows per layer, the top
    # n_expert_used by softmax router probability run per token, weights renormalised to sum 1.
    n_expert: int = 0
    n_expert_used: int = 0
    n_ff_exp: int = 0
    # gpt-oss: biases on the attention output, on the router and on every expert projection; a
    # learned per-head logit in each softmax denominator (attention sinks); the RMSNorm before
    # the FFN stored under llama.cpp's name for this arch (post_attention_norm, not ffn_norm).
    attn_output_bias: bool = False
    attn_sinks: bool = False
    moe_bias: bool = False
    ffn_norm_tensor: str = "ffn_norm"
    # YaRN on every layer, sliding-window ones included (gpt-oss has one rotary embedding for
    # all layers; Gemma's local layers run plain RoPE at their own base instead).
    rope_scaling_all_layers: bool = False
    # YaRN's correction range rounded to whole dims (transformers' truncate=True, llama.cpp's
    # only behaviour); gpt-oss was trained without the rounding (its config's truncate: false).
    yarn_truncate: bool = True

    @property
    def rope_rot(self) -> int:
        """How many dims of each head rotate (Phi-4-mini: 96 of 128)."""
        return self.rope_dims or self.head_dim

    @property
    def q_dim(self) -> int:
        return self.n_head * self.head_dim

    @property
    def kv_dim(self) -> int:
        return self.n_kv_head * self.head_dim

    def layer_rope_theta(self, layer: int) -> float:
        return self.rope_theta_local if self.layer_uses_window[layer] else self.rope_theta

    def layer_rope_scaled(self, layer: int) -> bool:
        """Whether the long-context RoPE scaling (factor, factor tables, attention factor) applies
        on `layer`: the global layers, or every layer where the architecture says so."""
        return self.rope_scaling_all_layers or not self.layer_uses_window[layer]

    def layer_rope_freq_scale(self, layer: int) -> float:
        return self.rope_freq_scale if self.layer_rope_scaled(layer) else 1.0

    def layer_window(self, layer: int) -> int:
        return self.sliding_window if self.layer_uses_window[layer] else 0

    def layer_rope(self, layer: int) -> bool:
        return not self.layer_uses_rope or self.layer_uses_rope[layer]

    def layer_attn_scale(self, layer: int) -> float:
        """The q.k multiplier of `layer`: the architecture's scale, times the square of the RoPE
        attention factor on layers whose whole-head RoPE is scaled (cos and sin both carry it)."""
        return self.attn_scale * (1.0 if self.rope_dims else self.layer_rope_gain(layer))

    def layer_rope_gain(self, layer: int) -> float:
        """The square of the RoPE attention factor where it applies (1.0 elsewhere). It scales
        only the rotated dims' share of q.k: a whole-head RoPE folds it into the attention scale,
        a partial one multiplies the rotated dims of q by it."""
        if not self.layer_rope_scaled(layer) or not self.layer_rope(layer):
            return 1.0
        return self.rope_attn_factor * self.rope_attn_factor

    @classmethod
    def from_gguf(cls, gguf_file) -> ModelConfig:
        """Build from an opened GGUF (`.arch`, `.metadata`, `.tensors`) and check every tensor
        the forward pass reads against it (engine.tensor_checks). Raises UnsupportedModelError
        for other architectures, ModelFileError for missing/invalid keys and tensors."""
        config = cls.from_metadata(gguf_file)
        check_tensors(config, gguf_file.tensors)
        return config

    @classmethod
    def from_metadata(cls, gguf_file) -> ModelConfig:
        """The config from the metadata and the embedding's row count alone, tensors unchecked
        (for tests that describe a model without its tensors); from_gguf is the one to load with."""
        arch = str(gguf_file.arch)
        if arch in ENCODER_ARCHS:
            raise UnsupportedModelError(
                f"'{arch}' is an embedding model: it turns text into vectors for document search "
                "and cannot chat (choose it as the documents' embedding model)"
            )
        if arch not in SUPPORTED_ARCHS:
            raise UnsupportedModelError(
                f"architecture '{arch}' is not supported; supported: {', '.join(SUPPORTED_ARCHS)}"
            )
        md = _Metadata(gguf_file.metadata, arch)
        experts = md.nonneg_int("expert_count", default=0)
        if arch in _MOE_ARCHS:
            experts = md.positive_int("expert_count", maximum=MAX_EXPERTS)
            experts_used = md.positive_int("expert_used_count", maximum=experts)
            n_ff_exp = md.positive_int("expert_feed_forward_length")
        elif experts > 0:
            raise UnsupportedModelError(
                f"{arch}.expert_count={experts}: mixture-of-experts models are not supported; "
                f"supported: dense {', '.join(SUPPORTED_ARCHS)} and {', '.join(_MOE_ARCHS)}"
            )
        else:
            experts = experts_used = n_ff_exp = 0

        d_model = md.positive_int("embedding_length")
        n_head = md.positive_int("attention.head_count")
        n_kv_head = md.positive_int("attention.head_count_kv", default=n_head)
        if n_head % n_kv_head:
            raise ModelFileError(
                f"{arch}.attention.head_count={n_head} is not a multiple of head_count_kv={n_kv_head}"
            )
        if f"{arch}.attention.key_length" not in gguf_file.metadata and d_model % n_head:
            raise ModelFileError(
                f"{arch}.embedding_length={d_model} is not a multiple of "
                f"{arch}.attention.head_count={n_head}, and no attention.key_length is given"
            )
        head_dim = md.positive_int("attention.key_length", default=d_model // n_head)
        value_dim = md.positive_int("attention.value_length", default=head_dim)
        if value_dim != head_dim:
            raise UnsupportedModelError(
                f"{arch}.attention.value_length={value_dim} differs from key_length={head_dim}; "
                "only equal key/value head sizes are supported"
            )
        if head_dim % 2:
            raise ModelFileError(f"attention head size {head_dim} must be even for RoPE")
        rope_dims = md.positive_int("rope.dimension_count", default=head_dim)
        if rope_dims > head_dim or rope_dims % 2:
            raise ModelFileError(
                f"metadata {arch}.rope.dimension_count={rope_dims} must be even and at most the "
                f"attention head size {head_dim}"
            )
        n_layers = md.positive_int("block_count", maximum=MAX_BLOCK_COUNT)

        embd = gguf_file.tensors.get("token_embd.weight")
        if embd is None:
            raise ModelFileError("tensor 'token_embd.weight' is missing")
        n_vocab = int(embd.shape[0])
        tokens = gguf_file.metadata.get("tokenizer.ggml.tokens")
        # A long vocabulary is a StringArray (issue 32), a short one a list.
        if isinstance(tokens, (list, StringArray)) and len(tokens) > n_vocab:
            # Token ids index the embedding: every id the tokenizer can produce needs a row.
            raise ModelFileError(
                f"tokenizer.ggml.tokens has {len(tokens)} tokens, but token_embd.weight has "
                f"only {n_vocab} rows"
            )

        rope_theta = md.positive_float("rope.freq_base", default=10000.0)
        scaling = _rope_scaling(md, arch)
        context_length = md.positive_int("context_length", maximum=MAX_CONTEXT_LENGTH)
        if scaling.kind == "longrope" and not scaling.orig_context:
            # llama.cpp's n_ctx_orig_yarn defaults to the training context: short factors
            # throughout unless the file says where the original context ended.
            scaling = dataclasses.replace(scaling, orig_context=context_length)
        gemma = arch in _GEMMA_ARCHS
        gpt_oss = arch == "gpt-oss"
        layer_uses_rope: tuple[bool, ...] = ()
        attn_scale = 1.0 / math.sqrt(head_dim)
        sliding_window = 0
        layer_uses_window = (False,) * n_layers
        rope_theta_local = rope_theta
        if arch == "gemma3":
            sliding_window = md.positive_int("attention.sliding_window", default=512)
            layer_uses_window = _window_layers(md, n_layers, GEMMA3_SWA_PERIOD)
            rope_theta_local = GEMMA3_LOCAL_ROPE_BASE
            # transformers' query_pre_attn_scalar: head_dim for 270m..12B, d_model / n_head for
            # 27B (the only 62-layer Gemma 3); llama.cpp keys the same choice on the layer count.
            attn_scale = 1.0 / math.sqrt(
                d_model / n_head if n_layers == GEMMA3_27B_LAYERS else head_dim
            )
        elif arch == "gemma2":
            sliding_window = md.positive_int("attention.sliding_window", default=4096)
            layer_uses_window = _window_layers(md, n_layers, GEMMA2_SWA_PERIOD)
            # query_pre_attn_scalar: 144 = d_model / n_head for the 46-layer 27B, else head_dim
            # (llama.cpp's LLM_TYPE_27B switch).
            attn_scale = 1.0 / math.sqrt(
                d_model / n_head if n_layers == GEMMA2_27B_LAYERS else head_dim
            )
        elif arch == "granite":
            attn_scale = md.positive_float(
                "attention.scale", default=attn_scale, maximum=MAX_MULTIPLIER
            )
        elif arch == "gpt-oss":
            # llama.cpp requires the key (its converter writes the config's sliding_window).
            sliding_window = md.positive_int("attention.sliding_window")
            layer_uses_window = _window_layers(md, n_layers, GPT_OSS_SWA_PERIOD)
        elif arch == "smollm3":
            layer_uses_rope = tuple(
                (layer + 1) % SMOLLM3_NO_ROPE_PERIOD != 0 for layer in range(n_layers)
            )
        attn_temp_scale, attn_temp_length = 0.0, 1
        if arch == "mistral3":
            attn_temp_scale = md.nonneg_float("attention.temperature_scale", default=0.0)
            if attn_temp_scale > MAX_MULTIPLIER:
                raise ModelFileError(
                    f"metadata {arch}.attention.temperature_scale={attn_temp_scale} must be at "
                    f"most {MAX_MULTIPLIER:g}"
                )
            if attn_temp_scale > 0.0:
                # llama.cpp takes the floor length from the YaRN original context (transformers:
                # original_max_position_embeddings); an explicit temperature_length wins.
                attn_temp_length = md.positive_int(
                    "attention.temperature_length",
                    default=scaling.orig_context or None,
                    maximum=MAX_CONTEXT_LENGTH,
                )
            if scaling.kind == "yarn":
                # Ministral 3 has mscale == mscale_all_dim, so transformers' attention factor is
                # 1; llama.cpp computes mscale(f, 1) / mscale(f, yarn_log_multiplier) when the
                # file gives the multiplier, else cancels YaRN's mscale outright.
                log_mul = md.positive_float(
                    "rope.scaling.yarn_log_multiplier", default=1.0, maximum=MAX_MULTIPLIER
                )
                f = scaling.factor
                mscale = (lambda m: 0.1 * m * math.log(f) + 1.0) if f > 1.0 else (lambda m: 1.0)
                scaling = dataclasses.replace(scaling, attn_factor=mscale(1.0) / mscale(log_mul))
        # Phi-3 files may carry attention.sliding_window, but llama.cpp runs them without one
        # (its converters wrote a window the models were not trained with), and so do we.

        return cls(
            arch=arch,
            n_layers=n_layers,
            d_model=d_model,
            n_ff=md.positive_int("feed_forward_length", default=n_ff_exp or None),
            n_head=n_head,
            n_kv_head=n_kv_head,
            head_dim=head_dim,
            n_vocab=n_vocab,
            context_length=context_length,
            norm_eps=md.positive_float("attention.layer_norm_rms_epsilon", default=1e-6),
            rope_theta=rope_theta,
            rope_theta_local=rope_theta_local,
            rope_neox=arch not in _INTERLEAVED_ROPE_ARCHS,
            rope_freq_scale=scaling.freq_scale,
            sliding_window=sliding_window,
            layer_uses_window=layer_uses_window,
            attn_scale=attn_scale,
            embed_scale=(
                math.sqrt(d_model)
                if gemma
                else md.positive_float("embedding_scale", default=1.0, maximum=MAX_MULTIPLIER)
                if arch == "granite"
                else 1.0
            ),
            activation="gelu_tanh" if gemma else "swiglu_oai" if gpt_oss else "silu",
            qk_norm=arch in ("qwen3", "qwen3moe", "gemma3", "olmo2"),
            qkv_bias=arch in ("qwen2", "gpt-oss"),
            sandwich_norms=arch in ("gemma2", "gemma3", "olmo2"),
            final_logit_softcap=md.nonneg_float("final_logit_softcapping", default=0.0),
            attn_logit_softcap=md.nonneg_float("attn_logit_softcapping", default=0.0),
            pre_norms=arch != "olmo2",
            qk_norm_full=arch == "olmo2",
            fused_gate_up=arch == "phi3",
            residual_scale=(
                md.positive_float("residual_scale", default=1.0, maximum=MAX_MULTIPLIER)
                if arch == "granite"
                else 1.0
            ),
            logit_scale=md.positive_float("logit_scale", default=1.0, maximum=MAX_MULTIPLIER)
            if arch == "granite"
            else 1.0,
            layer_uses_rope=layer_uses_rope,
            rope_scaling=scaling.kind,
            rope_scaling_factor=scaling.factor,
            rope_orig_context=scaling.orig_context,
            yarn_beta_fast=scaling.beta_fast,
            yarn_beta_slow=scaling.beta_slow,
            rope_attn_factor=scaling.attn_factor,
            attn_temp_scale=attn_temp_scale,
            attn_temp_length=attn_temp_length,
            rope_dims=0 if rope_dims == head_dim else rope_dims,
            n_expert=experts,
            n_expert_used=experts_used,
            n_ff_exp=n_ff_exp,
            attn_output_bias=gpt_oss,
            attn_sinks=gpt_oss,
            moe_bias=gpt_oss,
            ffn_norm_tensor="post_attention_norm" if gpt_oss else "ffn_norm",
            rope_scaling_all_layers=gpt_oss,
            yarn_truncate=not gpt_oss,
        )


class _Metadata:
    """Typed access to `<arch>.<key>` metadata with errors that name the key and value."""

    def __init__(self, metadata: dict[str, Any], arch: str):
        self.metadata, self.arch = metadata, arch

    def raw(self, key: str, default: Any = None) -> Any:
        full = f"{self.arch}.{key}"
        if full in self.metadata:
            return self.metadata[full]
        if default is None:
            raise ModelFileError(f"required metadata key '{full}' is missing")
        return default

    def positive_int(self, key: str, default: int | None = None, maximum: int | None = None) -> int:
        value = self.integer(key, default)
        if value <= 0 or (maximum is not None and value > maximum):
            allowed = "a positive integer" + (f" up to {maximum}" if maximum is not None else "")
            raise ModelFileError(f"metadata {self.arch}.{key}={value!r} must be {allowed}")
        return value

    def nonneg_int(self, key: str, default: int) -> int:
        value = self.integer(key, default)
        if value < 0:
            raise ModelFileError(f"metadata {self.arch}.{key}={value!r} must be an integer >= 0")
        return value

    def integer(self, key: str, default: int | None = None) -> int:
        """Strictly an integer: a float (even 2.0, NaN or inf), bool, string or array stored
        under an integer key means the file was written wrong, so it is refused by name."""
        value = self.raw(key, default)
        if isinstance(value, bool) or not isinstance(value, int):
            raise ModelFileError(
                f"metadata {self.arch}.{key}={_shown(value)} must be an integer "
                f"(stored as {type(value).__name__})"
            )
        return value

    def positive_float(
        self, key: str, default: float | None = None, maximum: float | None = None
    ) -> float:
        value = self.raw(key, default)
        if (
            isinstance(value, bool)
            or not isinstance(value, (int, float))
            or not value > 0
            or not math.isfinite(value)
            or (maximum is not None and value > maximum)
        ):
            bound = f" up to {maximum:g}" if maximum is not None else ""
            raise ModelFileError(
                f"metadata {self.arch}.{key}={_shown(value)} must be a positive finite number"
                + bound
            )
        return float(value)

    def nonneg_float(self, key: str, default: float) -> float:
        value = self.raw(key, default)
        if (
            isinstance(value, bool)
            or not isinstance(value, (int, float))
            or not value >= 0
            or not math.isfinite(value)
        ):
            raise ModelFileError(
                f"metadata {self.arch}.{key}={_shown(value)} must be a finite number >= 0"
            )
        return float(value)


def _shown(value: Any) -> str:
    """A metadata value for an error message, cut short (it may be a 262k-entry array)."""
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


@dataclass(frozen=True)
class _RopeScaling:
    kind: str = "none"
    freq_scale: float = 1.0
    factor: float = 1.0
    orig_context: int = 0
    beta_fast: float = YARN_BETA_FAST
    beta_slow: float = YARN_BETA_SLOW
    attn_factor: float = 1.0


_ROPE_SCALING_TYPES = ("none", "linear", "yarn", "longrope", "llama3")


def _rope_scaling(md: _Metadata, arch: str) -> _RopeScaling:
    """The file's rope.scaling.* keys (llama.cpp names). Llama 3.1+ files say nothing here: their
    scaling is baked into rope_freqs.weight. Phi-3 LongRoPE files carry rope_factors_long/short
    and may leave the type out, like llama.cpp's converter."""
    kind = md.metadata.get(f"{arch}.rope.scaling.type", "none")
    if not isinstance(kind, str):
        raise ModelFileError(f"metadata {arch}.rope.scaling.type={_shown(kind)} must be a string")
    if kind not in _ROPE_SCALING_TYPES:
        raise UnsupportedModelError(
            f"{arch}.rope.scaling.type={_shown(kind)} is not supported; supported: "
            + ", ".join(_ROPE_SCALING_TYPES)
        )
    if arch == "phi3":
        # LongRoPE: the factor tensors decide; attn_factor is what the converter computed as
        # sqrt(1 + ln(scale) / ln(original context)) (1 for the 4k models).
        return _RopeScaling(
            kind="longrope",
            orig_context=md.nonneg_int("rope.scaling.original_context_length", default=0),
            attn_factor=md.positive_float(
                "rope.scaling.attn_factor", default=1.0, maximum=MAX_MULTIPLIER
            ),
        )
    if kind == "linear":
        factor = md.positive_float(
            "rope.scaling.factor", default=1.0, maximum=MAX_ROPE_SCALING_FACTOR
        )
        return _RopeScaling(kind=kind, freq_scale=1.0 / factor, factor=factor)
    if kind == "yarn":
        factor = md.positive_float(
            "rope.scaling.factor", default=1.0, maximum=MAX_ROPE_SCALING_FACTOR
        )
        orig = md.positive_int("rope.scaling.original_context_length", maximum=MAX_CONTEXT_LENGTH)
        beta_fast = md.positive_float("rope.scaling.yarn_beta_fast", default=YARN_BETA_FAST)
        beta_slow = md.positive_float("rope.scaling.yarn_beta_slow", default=YARN_BETA_SLOW)
        if not md.positive_float("rope.freq_base", default=10000.0) > 1.0:
            raise ModelFileError(
                f"metadata {arch}.rope.freq_base must be above 1 for YaRN (its correction range "
                "divides by log(base))"
            )
        # transformers' get_mscale(factor) when no attention_factor is given; a file may store
        # its own (rope.scaling.attn_factor, as llama.cpp's converters do for some models).
        default_af = 0.1 * math.log(factor) + 1.0 if factor > 1.0 else 1.0
        return _RopeScaling(
            kind=kind,
            factor=factor,
            orig_context=orig,
            beta_fast=beta_fast,
            beta_slow=beta_slow,
            attn_factor=md.positive_float(
                "rope.scaling.attn_factor", default=default_af, maximum=MAX_MULTIPLIER
            ),
        )
    return _RopeScaling(kind=kind)


def _window_layers(md: _Metadata, n_layers: int, default_period: int) -> tuple[bool, ...]:
    """Which layers use the sliding window. Newer converters store a per-layer bool array or a
    period under attention.sliding_window_pattern; otherwise the architecture's period (the
    last layer of each period is global)."""
    key = f"{md.arch}.attention.sliding_window_pattern"
    pattern = md.metadata.get(key)
    if isinstance(pattern, list):
        if len(pattern) != n_layers:
            raise ModelFileError(f"{key} has {len(pattern)} entries, expected {n_layers}")
        if not all(isinstance(v, bool) or v in (0, 1) for v in pattern):
            raise ModelFileError(f"{key}={_shown(pattern)} must hold one bool per layer")
        return tuple(bool(v) for v in pattern)
    period = md.positive_int("attention.sliding_window_pattern", default=default_period)
    return tuple((layer % period) < period - 1 for layer in range(n_layers))
