"""Tiny random checkpoints made with transformers' own config class per architecture, written to
GGUF the way llama.cpp's convert_hf_to_gguf.py writes them (its tensor names, q/k permutation for
the interleaved-RoPE architectures, Gemma's 1 + w norms, its metadata keys), and the float32
logits transformers computes on exactly the weights the GGUF holds.

The direction is the reverse of `make_oracle_fixtures.make_tiny` (GGUF first, then transformers'
GGUF loader), because transformers cannot load most of these architectures from GGUF: here the
HF model is the source, each 2-D weight is quantized with gguf-py, and the dequantized values are
put back into the HF model before it computes the reference. So the oracle also checks the name
mapping and the permutation, not only the forward pass. Expert stacks go the same way: qwen3moe's
in the spec's type, gpt-oss's in its native MXFP4 (gguf-py quantizes it), split out of
transformers' interleaved gate_up_proj as llama.cpp's converter does, so transformers then runs
on the dequantized MXFP4 experts.

Needs torch and transformers (tools only, never the tests): see make_oracle_fixtures.py.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
from gguf import GGMLQuantizationType, GGUFValueType, GGUFWriter
from gguf import quants as gguf_quants

Q = GGMLQuantizationType
VOCAB = 256
D_MODEL, N_HEAD, N_KV, HEAD_DIM, N_FF = 32, 4, 2, 8, 64
WEIGHT_STD = 0.2  # large enough that RoPE, windows and scalings move the logits visibly

# name -> (transformers model type, block type of the 2-D weights, config overrides, GGUF arch)
# Each fixture also lists what it exercises, so a reader can see why it exists.
SPECS: dict[str, dict[str, Any]] = {
    # fused qkv / gate-up, LongRoPE (the 24-token case runs past original_max 16: long factors)
    "phi3": dict(
        hf="phi3",
        arch="phi3",
        qtype=Q.Q8_0,
        config=dict(
            max_position_embeddings=64,
            original_max_position_embeddings=16,
            rope_parameters=dict(
                rope_type="longrope",
                rope_theta=10000.0,
                short_factor=[1.0, 1.3, 2.1, 3.7],
                long_factor=[1.1, 2.5, 6.0, 11.0],
            ),
        ),
    ),
    # Phi-4-mini: partial RoPE (half of each head rotates), LongRoPE on the rotated pairs
    "phi4_mini": dict(
        hf="phi3",
        arch="phi3",
        qtype=Q.Q8_0,
        config=dict(
            max_position_embeddings=64,
            original_max_position_embeddings=16,
            tie_word_embeddings=True,
            rope_parameters=dict(
                rope_type="longrope",
                rope_theta=10000.0,
                partial_rotary_factor=0.5,
                short_factor=[1.0, 1.7],
                long_factor=[1.4, 9.0],
            ),
        ),
    ),
    # soft-caps, alternating sliding window (8), post-norms, GeGLU, 1 + w norms
    "gemma2": dict(
        hf="gemma2",
        arch="gemma2",
        qtype=Q.Q5_0,
        config=dict(
            head_dim=HEAD_DIM,
            query_pre_attn_scalar=HEAD_DIM,
            sliding_window=8,
            final_logit_softcapping=3.0,  # small caps so tanh is far from linear here
            attn_logit_softcapping=2.0,
            rope_parameters=dict(rope_type="default", rope_theta=10000.0),
        ),
        n_layers=4,
    ),
    # embedding / residual / attention / logit multipliers
    "granite": dict(
        hf="granite",
        arch="granite",
        qtype=Q.Q4_0,
        config=dict(
            embedding_multiplier=3.0,
            residual_multiplier=0.5,
            attention_multiplier=0.25,
            logits_scaling=2.5,
            tie_word_embeddings=True,
            rope_parameters=dict(rope_type="default", rope_theta=100000.0),
        ),
    ),
    # post-norm only, q/k norm over the whole projection, untied output
    "olmo2": dict(
        hf="olmo2",
        arch="olmo2",
        qtype=Q.F16,
        config=dict(rope_parameters=dict(rope_type="default", rope_theta=500000.0)),
    ),
    # no RoPE on layer 3 (every fourth)
    "smollm3": dict(
        hf="smollm3",
        arch="smollm3",
        qtype=Q.Q5_1,
        config=dict(rope_parameters=dict(rope_type="default", rope_theta=5000.0)),
        n_layers=4,
    ),
    # Ministral 3: YaRN (mscale cancelled) + Llama 4 attention temperature past 16 positions
    "mistral3": dict(
        hf="ministral3",
        arch="mistral3",
        qtype=Q.Q8_0,
        config=dict(
            head_dim=HEAD_DIM,
            max_position_embeddings=64,
            rope_parameters=dict(
                rope_type="yarn",
                rope_theta=10000.0,
                factor=4.0,
                original_max_position_embeddings=16,
                beta_fast=32.0,
                beta_slow=1.0,
                mscale=1.0,
                mscale_all_dim=1.0,
                llama_4_scaling_beta=0.3,
            ),
        ),
    ),
    # Mixture of experts: 8 experts, top 2 per token, weights renormalised (norm_topk_prob)
    "qwen3moe": dict(
        hf="qwen3_moe",
        arch="qwen3moe",
        qtype=Q.Q8_0,
        config=dict(
            head_dim=HEAD_DIM,
            num_experts=8,
            num_experts_per_tok=2,
            moe_intermediate_size=32,
            norm_topk_prob=True,
            decoder_sparse_step=1,
            tie_word_embeddings=False,
            rope_parameters=dict(rope_type="default", rope_theta=1000000.0),
        ),
    ),
    # gpt-oss: MXFP4 experts with biases and the clamped SwiGLU, biased router (softmax over the
    # top 2 of 8), q/k/v/o biases, attention sinks, even layers windowed (4 positions, so the
    # 24-token prompt runs far past it), YaRN on every layer with the unrounded correction range
    "gpt_oss": dict(
        hf="gpt_oss",
        arch="gpt-oss",
        qtype=Q.Q8_0,
        expert_qtype=Q.MXFP4,
        config=dict(
            head_dim=HEAD_DIM,
            intermediate_size=32,
            num_local_experts=8,
            num_experts_per_tok=2,
            sliding_window=4,
            max_position_embeddings=256,
            tie_word_embeddings=False,
            rope_parameters=dict(
                rope_type="yarn",
                rope_theta=10000.0,
                factor=4.0,
                beta_fast=32.0,
                beta_slow=1.0,
                truncate=False,
                original_max_position_embeddings=64,
            ),
        ),
        n_layers=4,
        experts_implementation="eager",
        gate_up_std=1.5,
    ),
    # Llama 3.1 rope scaling: the converter's rope_freqs.weight vs transformers' llama3 RoPE
    "llama3_rope": dict(
        hf="llama",
        arch="llama",
        qtype=Q.Q8_0,
        config=dict(
            max_position_embeddings=4096,
            rope_parameters=dict(
                rope_type="llama3",
                rope_theta=10000.0,
                factor=8.0,
                low_freq_factor=1.0,
                high_freq_factor=4.0,
                original_max_position_embeddings=1024,
            ),
        ),
    ),
    # Qwen long context: YaRN with transformers' default attention factor (0.1 ln 4 + 1)
    "qwen3_yarn": dict(
        hf="qwen3",
        arch="qwen3",
        qtype=Q.Q8_0,
        config=dict(
            head_dim=HEAD_DIM,
            max_position_embeddings=16384,
            rope_parameters=dict(
                rope_type="yarn",
                rope_theta=10000.0,
                factor=4.0,
                original_max_position_embeddings=4096,
            ),
        ),
    ),
}

# Architectures whose converter permutes q/k rows into interleaved RoPE pairs (LlamaModel).
_PERMUTED = ("llama", "granite", "smollm3", "mistral3")


def build_hf_model(name: str, seed: int = 7):
    """(HF model in float32 eager attention, spec) with random weights of WEIGHT_STD."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    spec = SPECS[name]
    dims: dict[str, Any] = dict(
        vocab_size=VOCAB,
        hidden_size=D_MODEL,
        intermediate_size=N_FF,
        num_hidden_layers=spec.get("n_layers", 2),
        num_attention_heads=N_HEAD,
        num_key_value_heads=N_KV,
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=2,
    )
    config = AutoConfig.for_model(spec["hf"], **{**dims, **spec["config"]})
    torch.manual_seed(seed)
    extra = {}
    if "experts_implementation" in spec:
        extra["experts_implementation"] = spec["experts_implementation"]
    model = AutoModelForCausalLM.from_config(
        config, dtype=torch.float32, attn_implementation="eager", **extra
    )
    gemma = spec["arch"] == "gemma2"
    with torch.no_grad():
        for pname, param in model.named_parameters():
            if pname.endswith(("self_attn.sinks", "mlp.router.bias")):
                # gpt-oss: sinks of the size of the attention scores, so each one takes a
                # visible share of its head's softmax; a router bias that moves the choice.
                param.copy_(torch.randn_like(param))
            elif pname.endswith("_proj.bias") or pname.endswith("_proj_bias"):
                param.copy_(WEIGHT_STD * torch.randn_like(param))
            elif param.ndim == 1:  # norms: around 1 (Gemma stores the offset from 1)
                base = 0.0 if gemma else 1.0
                param.copy_(base + 0.1 * torch.randn_like(param))
            elif pname.endswith(("mlp.gate.weight", "mlp.router.weight")):
                # A decisive router: near-ties between the k-th and k+1-th expert would let
                # float rounding pick different experts on the two sides.
                param.copy_(2.0 * torch.randn_like(param))
            elif pname.endswith("mlp.experts.gate_up_proj") and "gate_up_std" in spec:
                # gpt-oss: gate/up values past the SwiGLU clamp (7) on many elements, so the
                # clamp and the (up + 1) factor both shape the output.
                param.copy_(spec["gate_up_std"] * torch.randn_like(param))
            else:
                param.copy_(WEIGHT_STD * torch.randn_like(param))
    model.eval()
    return model, spec


def _permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """convert_hf_to_gguf LlamaModel.permute: HF rotate_half rows -> interleaved pairs."""
    return (
        w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:])
        .swapaxes(1, 2)
        .reshape(w.shape)
    )


def _unpermute(w: np.ndarray, n_head: int) -> np.ndarray:
    return (
        w.reshape(n_head, w.shape[0] // n_head // 2, 2, *w.shape[1:])
        .swapaxes(1, 2)
        .reshape(w.shape)
    )


def _gguf_name(arch: str, hf_name: str) -> str | None:
    """llama.cpp's tensor name for an HF parameter (gguf-py tensor_mapping), None to skip."""
    fixed = {
        "model.embed_tokens.weight": "token_embd.weight",
        "model.norm.weight": "output_norm.weight",
        "lm_head.weight": "output.weight",
    }
    if hf_name in fixed:
        return fixed[hf_name]
    parts = hf_name.split(".")
    if parts[:2] != ["model", "layers"]:
        raise ValueError(f"unmapped parameter {hf_name}")
    i, rest = parts[2], ".".join(parts[3:])
    post_attention = "post_attention_norm" if arch in ("gemma2", "olmo2") else "ffn_norm"
    table = {
        "input_layernorm.weight": "attn_norm",
        "post_attention_layernorm.weight": post_attention,
        "pre_feedforward_layernorm.weight": "ffn_norm",
        "post_feedforward_layernorm.weight": "post_ffw_norm",
        "self_attn.q_proj.weight": "attn_q",
        "self_attn.k_proj.weight": "attn_k",
        "self_attn.v_proj.weight": "attn_v",
        "self_attn.qkv_proj.weight": "attn_qkv",
        "self_attn.o_proj.weight": "attn_output",
        "self_attn.q_norm.weight": "attn_q_norm",
        "self_attn.k_norm.weight": "attn_k_norm",
        "mlp.gate_proj.weight": "ffn_gate",
        "mlp.up_proj.weight": "ffn_up",
        "mlp.gate_up_proj.weight": "ffn_up",
        "mlp.down_proj.weight": "ffn_down",
        "mlp.gate.weight": "ffn_gate_inp",
        "mlp.experts.down_proj": "ffn_down_exps",
    }
    # gpt-oss (gguf-py's tensor_mapping: attn_sinks, the router, biases under the same names;
    # its post_attention_layernorm is the FFN's input norm, named post_attention_norm)
    biases = {
        "self_attn.q_proj.bias": "attn_q",
        "self_attn.k_proj.bias": "attn_k",
        "self_attn.v_proj.bias": "attn_v",
        "self_attn.o_proj.bias": "attn_output",
        "mlp.router.bias": "ffn_gate_inp",
        "mlp.experts.down_proj_bias": "ffn_down_exps",
    }
    if arch == "gpt-oss":
        table["post_attention_layernorm.weight"] = "post_attention_norm"
        table["self_attn.sinks"] = "attn_sinks"
        table["mlp.router.weight"] = "ffn_gate_inp"
    if rest in biases:
        return f"blk.{i}.{biases[rest]}.bias"
    if rest not in table:
        raise ValueError(f"unmapped parameter {hf_name}")
    return f"blk.{i}.{table[rest]}.weight"


def llama3_rope_factors(rope: dict, head_dim: int) -> np.ndarray:
    """convert_hf_to_gguf LlamaModel.generate_extra_tensors: the rope_freqs.weight values."""
    base, factor = rope["rope_theta"], rope["factor"]
    low, high = rope["low_freq_factor"], rope["high_freq_factor"]
    old = rope["original_max_position_embeddings"]
    low_wavelen, high_wavelen = old / low, old / high
    factors = []
    for freq in 1.0 / (base ** (np.arange(0, head_dim, 2, dtype=np.float64) / head_dim)):
        wavelen = 2 * math.pi / freq
        if wavelen < high_wavelen:
            factors.append(1.0)
        elif wavelen > low_wavelen:
            factors.append(factor)
        else:
            smooth = (old / wavelen - low) / (high - low)
            factors.append(1 / ((1 - smooth) / factor + smooth))
    return np.array(factors, np.float32)


def _store(writer: GGUFWriter, name: str, values: np.ndarray, wtype: GGMLQuantizationType):
    """Add `values` as `wtype`; return what the GGUF holds, dequantized (float32)."""
    values = np.ascontiguousarray(values, dtype=np.float32)
    if wtype == Q.F32:
        writer.add_tensor(name, values)
        return values
    if wtype == Q.F16:
        data = values.astype(np.float16)
        writer.add_tensor(name, data)
        return data.astype(np.float32)
    data = gguf_quants.quantize(values, wtype)
    writer.add_tensor(name, data, raw_dtype=wtype)
    return gguf_quants.dequantize(data, wtype).reshape(values.shape).astype(np.float32)


def _store_gpt_oss_experts(
    writer: GGUFWriter, hf_name: str, values: np.ndarray, wtype: GGMLQuantizationType
) -> np.ndarray:
    """One of transformers' GptOssExperts parameters, written as convert_hf_to_gguf's
    GptOssModel writes it; returns what the GGUF holds in the HF parameter's layout.

    gate_up_proj is (n_expert, d, 2 ff) with gate and up interleaved along the last axis (gate
    at even, up at odd columns); the converter transposes the stacks to llama.cpp's (n_expert,
    out, in) and splits them into ffn_gate_exps / ffn_up_exps, likewise the (n_expert, 2 ff)
    bias. down_proj (n_expert, ff, d) becomes ffn_down_exps (n_expert, d, ff). Weights are
    stored as `wtype` (MXFP4, gpt-oss's native expert format), biases as float32."""
    prefix = f"blk.{hf_name.split('.')[2]}."
    if hf_name.endswith("gate_up_proj"):
        stacked = values.transpose(0, 2, 1)  # (n_expert, 2 ff, d)
        gate = _store(writer, prefix + "ffn_gate_exps.weight", stacked[:, 0::2], wtype)
        up = _store(writer, prefix + "ffn_up_exps.weight", stacked[:, 1::2], wtype)
        back = np.empty_like(stacked)
        back[:, 0::2], back[:, 1::2] = gate, up
        return np.ascontiguousarray(back.transpose(0, 2, 1))
    if hf_name.endswith("gate_up_proj_bias"):
        gate = _store(writer, prefix + "ffn_gate_exps.bias", values[:, 0::2], Q.F32)
        up = _store(writer, prefix + "ffn_up_exps.bias", values[:, 1::2], Q.F32)
        back = np.empty_like(values)
        back[:, 0::2], back[:, 1::2] = gate, up
        return back
    if hf_name.endswith("down_proj"):
        stored = _store(writer, prefix + "ffn_down_exps.weight", values.transpose(0, 2, 1), wtype)
        return np.ascontiguousarray(stored.transpose(0, 2, 1))
    if hf_name.endswith("down_proj_bias"):
        return _store(writer, prefix + "ffn_down_exps.bias", values, Q.F32)
    raise ValueError(f"unmapped parameter {hf_name}")


def write_gguf(model, spec: dict, path: Path) -> Path:
    """Write `model` as llama.cpp would and load the dequantized weights back into it."""
    import torch

    arch, qtype = spec["arch"], spec["qtype"]
    cfg = model.config
    rope = dict(cfg.rope_parameters)
    state = model.state_dict()
    tied = bool(cfg.tie_word_embeddings)
    writer = GGUFWriter(path, arch)
    U32, F32 = GGUFValueType.UINT32, GGUFValueType.FLOAT32

    def put(key: str, value: Any, vtype: GGUFValueType) -> None:
        writer.add_key_value(f"{arch}.{key}", value, vtype)

    writer.add_key_value("general.name", f"tiny-hf-{arch}", GGUFValueType.STRING)
    put("context_length", int(cfg.max_position_embeddings), U32)
    put("embedding_length", D_MODEL, U32)
    put("block_count", int(cfg.num_hidden_layers), U32)
    put("feed_forward_length", int(cfg.intermediate_size), U32)
    put("attention.head_count", N_HEAD, U32)
    put("attention.head_count_kv", N_KV, U32)
    put("attention.key_length", HEAD_DIM, U32)
    put("attention.value_length", HEAD_DIM, U32)
    rot = int(HEAD_DIM * rope.get("partial_rotary_factor", 1.0))
    put("rope.dimension_count", rot, U32)
    put("attention.layer_norm_rms_epsilon", float(cfg.rms_norm_eps), F32)
    put("rope.freq_base", float(rope["rope_theta"]), F32)
    put("vocab_size", VOCAB, U32)
    if arch == "gemma2":
        put("attention.sliding_window", int(cfg.sliding_window), U32)
        put("final_logit_softcapping", float(cfg.final_logit_softcapping), F32)
        put("attn_logit_softcapping", float(cfg.attn_logit_softcapping), F32)
    if arch == "granite":
        put("embedding_scale", float(cfg.embedding_multiplier), F32)
        put("residual_scale", float(cfg.residual_multiplier), F32)
        put("attention.scale", float(cfg.attention_multiplier), F32)
        put("logit_scale", float(cfg.logits_scaling), F32)
    if arch == "phi3":
        orig = int(cfg.original_max_position_embeddings)
        scale = cfg.max_position_embeddings / orig
        put("rope.scaling.original_context_length", orig, U32)
        # convert_hf_to_gguf Phi3MiniModel: LongRoPE's attention factor
        put("rope.scaling.attn_factor", math.sqrt(1 + math.log(scale) / math.log(orig)), F32)
    if rope.get("rope_type") == "yarn":
        writer.add_key_value(f"{arch}.rope.scaling.type", "yarn", GGUFValueType.STRING)
        put("rope.scaling.factor", float(rope["factor"]), F32)
        put(
            "rope.scaling.original_context_length",
            int(rope["original_max_position_embeddings"]),
            U32,
        )
        put("rope.scaling.yarn_beta_fast", float(rope.get("beta_fast", 32.0)), F32)
        put("rope.scaling.yarn_beta_slow", float(rope.get("beta_slow", 1.0)), F32)
    if cfg.model_type == "qwen3_moe":
        put("expert_count", int(cfg.num_experts), U32)
        put("expert_used_count", int(cfg.num_experts_per_tok), U32)
        put("expert_feed_forward_length", int(cfg.moe_intermediate_size), U32)
    if arch == "gpt-oss":
        # convert_hf_to_gguf GptOssModel: the expert width is intermediate_size, the window
        # the config's sliding_window
        put("expert_count", int(cfg.num_local_experts), U32)
        put("expert_used_count", int(cfg.num_experts_per_tok), U32)
        put("expert_feed_forward_length", int(cfg.intermediate_size), U32)
        put("attention.sliding_window", int(cfg.sliding_window), U32)
    if arch == "mistral3":
        # convert_hf_to_gguf Mistral3Model: llama_4_scaling_beta / original_max_position_embeddings
        put("attention.temperature_scale", float(rope["llama_4_scaling_beta"]), F32)
        put("attention.temperature_length", int(rope["original_max_position_embeddings"]), U32)

    loaded: dict[str, torch.Tensor] = {}
    for hf_name, tensor in state.items():
        if hf_name == "lm_head.weight" and tied:
            continue
        values = tensor.detach().numpy().astype(np.float32)
        if arch == "gpt-oss" and ".mlp.experts." in hf_name:
            loaded[hf_name] = torch.from_numpy(
                _store_gpt_oss_experts(writer, hf_name, values, spec["expert_qtype"])
            )
            continue
        if hf_name.endswith("mlp.experts.gate_up_proj"):
            # (n_expert, 2 * ff, d): the converter splits it into gate and up stacks
            half = values.shape[1] // 2
            prefix = f"blk.{hf_name.split('.')[2]}."
            parts = []
            for part, stored in (
                ("ffn_gate_exps", values[:, :half]),
                ("ffn_up_exps", values[:, half:]),
            ):
                parts.append(_store(writer, prefix + part + ".weight", stored, qtype))
            loaded[hf_name] = torch.from_numpy(np.concatenate(parts, axis=1))
            continue
        name = _gguf_name(arch, hf_name)
        assert name is not None
        if values.ndim == 1:
            stored = values + 1.0 if arch == "gemma2" else values  # Gemma's converter adds 1
            writer.add_tensor(name, stored.astype(np.float32))
            continue
        permute = arch in _PERMUTED and hf_name.endswith(("q_proj.weight", "k_proj.weight"))
        heads = N_HEAD if hf_name.endswith("q_proj.weight") else N_KV
        if permute:
            values = _permute(values, heads)
        wtype = Q.Q8_0 if name == "token_embd.weight" and qtype == Q.F16 else qtype
        if name.endswith("ffn_gate_inp.weight"):
            wtype = Q.F32  # the router stays float, as llama.cpp's converter keeps it
        back = _store(writer, name, values, wtype)
        if permute:
            back = _unpermute(back, heads)
        loaded[hf_name] = torch.from_numpy(np.ascontiguousarray(back))
    if rope.get("rope_type") == "llama3":
        writer.add_tensor("rope_freqs.weight", llama3_rope_factors(rope, rot))
    if rope.get("rope_type") == "longrope":
        writer.add_tensor("rope_factors_long.weight", np.array(rope["long_factor"], np.float32))
        writer.add_tensor("rope_factors_short.weight", np.array(rope["short_factor"], np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    if tied:
        loaded["lm_head.weight"] = loaded["model.embed_tokens.weight"]
    missing, unexpected = model.load_state_dict(loaded, strict=False)
    weights_missing = [m for m in missing if m.endswith(("proj.weight", "_proj")) or "embed" in m]
    if weights_missing or unexpected:
        raise RuntimeError(
            f"state dict mismatch: missing {weights_missing}, unexpected {unexpected}"
        )
    return path
