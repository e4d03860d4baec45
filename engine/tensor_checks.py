"""The tensors a model of a given ModelConfig must have, and the check that a file has them.

Every shape the forward pass relies on is derived here from the config, in one place, and
compared with the file before anything is allocated: activation buffers, the KV cache and the
kernels' loops all take their sizes from the config, so a norm vector one element short or a
projection with the wrong row count would otherwise be read past its end (garbage or NaN output)
instead of refused. Names and shapes follow llama.cpp (numpy order: (out_features, in_features)).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from engine.errors import ModelFileError

# Each layer holds at least this many tensors (Phi-3's attn norm, fused qkv, output, ffn norm,
# fused gate-up, down), which bounds block_count by the file's tensor count before any per-layer
# work.
MIN_TENSORS_PER_LAYER = 6
_LAYER_NAME = re.compile(r"blk\.(\d+)\.")


def expected_shapes(
    cfg, tensors: Mapping[str, Any] | None = None
) -> tuple[dict[str, tuple[int, ...]], dict[str, tuple[int, ...]]]:
    """(required, optional) tensor name -> numpy shape for a model of `cfg`. With `tensors`, a
    layer that stores a fused `attn_qkv` (llama.cpp accepts one for any architecture) is expected
    to have that instead of separate q/k/v."""
    d, q_dim, kv_dim, n_ff, head = cfg.d_model, cfg.q_dim, cfg.kv_dim, cfg.n_ff, cfg.head_dim
    required: dict[str, tuple[int, ...]] = {
        "token_embd.weight": (cfg.n_vocab, d),
        "output_norm.weight": (d,),
    }
    q_norm, k_norm = ((q_dim,), (kv_dim,)) if cfg.qk_norm_full else ((head,), (head,))
    rot = cfg.rope_dims or head
    for i in range(cfg.n_layers):
        p = f"blk.{i}."
        if tensors is not None and p + "attn_qkv.weight" in tensors:
            required[p + "attn_qkv.weight"] = (q_dim + 2 * kv_dim, d)
        else:
            required[p + "attn_q.weight"] = (q_dim, d)
            required[p + "attn_k.weight"] = (kv_dim, d)
            required[p + "attn_v.weight"] = (kv_dim, d)
        required[p + "attn_output.weight"] = (d, q_dim)
        if cfg.pre_norms:
            required[p + "attn_norm.weight"] = (d,)
            required[p + cfg.ffn_norm_tensor + ".weight"] = (d,)
        if cfg.n_expert:
            e, ff_exp = cfg.n_expert, cfg.n_ff_exp
            required[p + "ffn_gate_inp.weight"] = (e, d)  # the router
            # gate and up as one (gate rows, then up rows per expert) stack, or two
            fused = tensors is not None and p + "ffn_gate_up_exps.weight" in tensors
            gate_up = ("ffn_gate_up_exps", 2 * ff_exp) if fused else None
            for part, rows in (
                [gate_up] if gate_up else [("ffn_gate_exps", ff_exp), ("ffn_up_exps", ff_exp)]
            ):
                required[p + part + ".weight"] = (e, rows, d)
                if cfg.moe_bias:
                    required[p + part + ".bias"] = (e, rows)
            required[p + "ffn_down_exps.weight"] = (e, d, ff_exp)
            if cfg.moe_bias:
                required[p + "ffn_gate_inp.bias"] = (e,)
                required[p + "ffn_down_exps.bias"] = (e, d)
        elif cfg.fused_gate_up:
            required[p + "ffn_up.weight"] = (2 * n_ff, d)
            required[p + "ffn_down.weight"] = (d, n_ff)
        else:
            required[p + "ffn_gate.weight"] = (n_ff, d)
            required[p + "ffn_up.weight"] = (n_ff, d)
            required[p + "ffn_down.weight"] = (d, n_ff)
        if cfg.qkv_bias:
            required[p + "attn_q.bias"] = (q_dim,)
            required[p + "attn_k.bias"] = (kv_dim,)
            required[p + "attn_v.bias"] = (kv_dim,)
        if cfg.attn_output_bias:
            required[p + "attn_output.bias"] = (d,)
        if cfg.attn_sinks:
            required[p + "attn_sinks.weight"] = (cfg.n_head,)
        if cfg.qk_norm:
            required[p + "attn_q_norm.weight"] = q_norm
            required[p + "attn_k_norm.weight"] = k_norm
        if cfg.sandwich_norms:
            required[p + "post_attention_norm.weight"] = (d,)
            required[p + "post_ffw_norm.weight"] = (d,)
    optional = {
        "output.weight": (cfg.n_vocab, d),  # absent: tied to token_embd
        "rope_freqs.weight": (rot // 2,),  # Llama 3.1+ per-frequency RoPE divisors
        "rope_factors_long.weight": (rot // 2,),  # Phi-3 LongRoPE, past the original context
        "rope_factors_short.weight": (rot // 2,),  # Phi-3 LongRoPE, within it
    }
    return required, optional


def check_layer_count(arch: str, n_layers: int, tensors: Mapping[str, Any]) -> None:
    """block_count against the number of tensors, before anything is built per layer (a
    block_count of 10^9 would otherwise cost gigabytes of per-layer bookkeeping)."""
    if n_layers * MIN_TENSORS_PER_LAYER > len(tensors):
        raise ModelFileError(
            f"metadata {arch}.block_count={n_layers} needs at least "
            f"{n_layers * MIN_TENSORS_PER_LAYER} tensors ({MIN_TENSORS_PER_LAYER} per layer), "
            f"but the file holds {len(tensors)}"
        )


def check_tensors(cfg, tensors: Mapping[str, Any]) -> None:
    """Raise ModelFileError naming the first tensor that is missing, misshapen or belongs to a
    layer the metadata does not have."""
    check_layer_count(cfg.arch, cfg.n_layers, tensors)
    required, optional = expected_shapes(cfg, tensors)
    sizes = (
        f"embedding_length={cfg.d_model}, heads={cfg.n_head}x{cfg.head_dim}, "
        f"kv_heads={cfg.n_kv_head}, feed_forward_length={cfg.n_ff}"
        + (f", experts={cfg.n_expert}x{cfg.n_ff_exp}" if cfg.n_expert else "")
    )
    for name, shape in required.items():
        tensor = tensors.get(name)
        if tensor is None:
            raise ModelFileError(f"tensor '{name}' is missing from the model file")
        _check_shape(name, tensor, shape, sizes)
    for name, shape in optional.items():
        if name in tensors:
            _check_shape(name, tensors[name], shape, sizes)
    for name in tensors:
        match = _LAYER_NAME.match(name)
        if match and int(match.group(1)) >= cfg.n_layers:
            raise ModelFileError(
                f"tensor '{name}' belongs to layer {match.group(1)}, but metadata "
                f"{cfg.arch}.block_count={cfg.n_layers} (layers 0 to {cfg.n_layers - 1})"
            )


def _check_shape(name: str, tensor: Any, expected: tuple[int, ...], sizes: str) -> None:
    shape = tuple(int(n) for n in tensor.shape)
    if shape != expected:
        raise ModelFileError(
            f"tensor '{name}' has shape {shape}, expected {expected} from the metadata ({sizes})"
        )
