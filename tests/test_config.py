"""ModelConfig.from_gguf on the real models, the tiny fixtures, and broken metadata."""

import math
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from gguf import GGMLQuantizationType

from engine.config import ModelConfig
from engine.errors import EngineError, ModelFileError, UnsupportedModelError
from engine.gguf import open_gguf
from engine.qtensor import QTensor
from engine.tensor_checks import expected_shapes

FIXTURES = Path(__file__).parent / "fixtures"


def _fake(arch: str, **metadata):
    embd = QTensor(
        "token_embd.weight", GGMLQuantizationType.F32, (100, 64), np.zeros((100, 64), np.float32)
    )
    base = {
        f"{arch}.{k}": v
        for k, v in dict(
            embedding_length=64,
            block_count=2,
            feed_forward_length=128,
            context_length=512,
            **{"attention.head_count": 4},
        ).items()
    }
    base.update(metadata)
    fake = SimpleNamespace(arch=arch, metadata=base, tensors={"token_embd.weight": embd})
    try:  # every tensor the metadata asks for (shapes only), so only the metadata is under test
        required, _ = expected_shapes(ModelConfig.from_metadata(fake))
    except EngineError:
        return fake  # the metadata itself is bad: from_gguf refuses it before the tensors
    fake.tensors = {
        name: SimpleNamespace(name=name, shape=shape) for name, shape in required.items()
    }
    return fake


def test_smollm2_config(smollm2_path):
    cfg = ModelConfig.from_gguf(open_gguf(smollm2_path))
    assert (cfg.arch, cfg.n_layers, cfg.d_model, cfg.n_ff) == ("llama", 30, 576, 1536)
    assert (cfg.n_head, cfg.n_kv_head, cfg.head_dim, cfg.n_vocab) == (9, 3, 64, 49152)
    assert cfg.rope_theta == 100000.0 and not cfg.rope_neox
    assert cfg.sliding_window == 0 and not any(cfg.layer_uses_window)
    assert cfg.activation == "silu" and cfg.embed_scale == 1.0 and cfg.attn_scale == 1 / 8


def test_gemma3_270m_config(gemma3_path):
    cfg = ModelConfig.from_gguf(open_gguf(gemma3_path))
    assert (cfg.n_layers, cfg.d_model, cfg.n_head, cfg.n_kv_head, cfg.head_dim) == (
        18,
        640,
        4,
        1,
        256,
    )
    assert [i for i, local in enumerate(cfg.layer_uses_window) if not local] == [5, 11, 17]
    assert cfg.sliding_window == 512
    assert cfg.layer_rope_theta(0) == 10000.0 and cfg.layer_rope_theta(5) == 1_000_000.0
    assert cfg.layer_window(0) == 512 and cfg.layer_window(5) == 0
    assert cfg.embed_scale == pytest.approx(math.sqrt(640))
    assert cfg.attn_scale == pytest.approx(1 / 16)  # query_pre_attn_scalar = 256 = head_dim
    assert cfg.rope_neox and cfg.qk_norm and cfg.sandwich_norms and cfg.activation == "gelu_tanh"


@pytest.mark.parametrize(
    "arch,neox,qk_norm,bias",
    [
        ("llama", False, False, False),
        ("qwen2", True, False, True),
        ("qwen3", True, True, False),
        ("gemma3", True, True, False),
    ],
)
def test_per_arch_switches_on_tiny_files(arch, neox, qk_norm, bias):
    cfg = ModelConfig.from_gguf(open_gguf(FIXTURES / f"tiny_{arch}.gguf"))
    assert (cfg.rope_neox, cfg.qk_norm, cfg.qkv_bias) == (neox, qk_norm, bias)


def test_issue10_arch_switches_on_tiny_files():
    def cfg(name):
        return ModelConfig.from_gguf(open_gguf(FIXTURES / f"tiny_{name}.gguf"))

    phi3 = cfg("phi3")
    assert phi3.fused_gate_up and phi3.rope_neox and phi3.rope_scaling == "longrope"
    assert (phi3.rope_orig_context, round(phi3.rope_attn_factor, 4)) == (16, 1.2247)
    gemma2 = cfg("gemma2")
    assert gemma2.layer_uses_window == (True, False, True, False)
    assert (gemma2.attn_logit_softcap, gemma2.final_logit_softcap) == (2.0, 3.0)
    granite = cfg("granite")
    assert not granite.rope_neox
    assert (granite.embed_scale, granite.residual_scale, granite.attn_scale) == (3.0, 0.5, 0.25)
    assert granite.logit_scale == 2.5
    olmo2 = cfg("olmo2")
    assert not olmo2.pre_norms and olmo2.qk_norm_full and olmo2.sandwich_norms
    assert cfg("smollm3").layer_uses_rope == (True, True, True, False)
    mistral3 = cfg("mistral3")
    assert (mistral3.rope_scaling, mistral3.rope_attn_factor) == ("yarn", 1.0)
    assert (mistral3.attn_temp_scale, mistral3.attn_temp_length) == (pytest.approx(0.3), 16)
    yarn = cfg("qwen3_yarn")
    assert yarn.rope_attn_factor == pytest.approx(0.1 * math.log(4.0) + 1.0)
    gpt_oss = cfg("gpt_oss")
    assert gpt_oss.layer_uses_window == (True, False, True, False)
    assert gpt_oss.sliding_window == 4 and gpt_oss.layer_window(0) == 4
    # YaRN on the windowed layers too (one rotary embedding), without rounding its range
    assert gpt_oss.layer_rope_scaled(0) and gpt_oss.layer_attn_scale(0) == gpt_oss.layer_attn_scale(
        1
    )
    assert not gpt_oss.yarn_truncate and yarn.yarn_truncate
    assert (gpt_oss.n_expert, gpt_oss.n_expert_used, gpt_oss.n_ff_exp) == (8, 2, 32)


def test_unsupported_arch_names_it_and_the_supported_ones():
    with pytest.raises(
        UnsupportedModelError,
        match=r"architecture 'mamba' is not supported; supported: llama, mistral3, qwen2, qwen3, "
        r"gemma2, gemma3, phi3, granite, olmo2, smollm3, qwen3moe, gpt-oss$",
    ):
        ModelConfig.from_gguf(_fake("mamba"))


def test_missing_required_key_is_named():
    fake = _fake("llama")
    del fake.metadata["llama.feed_forward_length"]
    with pytest.raises(ModelFileError, match="llama.feed_forward_length"):
        ModelConfig.from_gguf(fake)


@pytest.mark.parametrize(
    "key,value",
    [
        ("embedding_length", 0),
        ("attention.head_count_kv", 3),
        ("rope.freq_base", -1.0),
        ("block_count", "two"),
    ],
)
def test_invalid_values_are_refused_with_the_value(key, value):
    with pytest.raises(ModelFileError, match=str(value)):
        ModelConfig.from_gguf(_fake("llama", **{f"llama.{key}": value}))


def test_defaults_head_dim_and_kv_heads():
    cfg = ModelConfig.from_gguf(_fake("qwen2"))
    assert (cfg.head_dim, cfg.n_kv_head) == (16, 4)


def test_gemma3_explicit_window_pattern_and_linear_rope_scaling():
    cfg = ModelConfig.from_gguf(
        _fake(
            "gemma3",
            **{
                "gemma3.attention.sliding_window_pattern": [True, False],
                "gemma3.rope.scaling.type": "linear",
                "gemma3.rope.scaling.factor": 8.0,
            },
        )
    )
    assert cfg.layer_uses_window == (True, False)
    assert cfg.layer_rope_freq_scale(0) == 1.0 and cfg.layer_rope_freq_scale(1) == 1 / 8


def test_unknown_rope_scaling_is_refused():
    with pytest.raises(UnsupportedModelError, match="'dynamic' is not supported.*yarn"):
        ModelConfig.from_gguf(_fake("llama", **{"llama.rope.scaling.type": "dynamic"}))


def test_yarn_without_its_original_context_is_refused_by_name():
    with pytest.raises(ModelFileError, match="rope.scaling.original_context_length"):
        ModelConfig.from_gguf(_fake("qwen3", **{"qwen3.rope.scaling.type": "yarn"}))


def test_mixture_of_experts_is_refused():
    with pytest.raises(UnsupportedModelError, match="expert_count=8"):
        ModelConfig.from_gguf(_fake("llama", **{"llama.expert_count": 8}))


def test_gemma3_27b_scales_queries_by_model_width_per_head():
    fake = _fake(
        "gemma3",
        **{
            "gemma3.block_count": 62,
            "gemma3.embedding_length": 5376,
            "gemma3.attention.head_count": 32,
            "gemma3.attention.key_length": 128,
        },
    )
    assert ModelConfig.from_gguf(fake).attn_scale == pytest.approx(1 / math.sqrt(168))


# --- issue 10: the new architectures' keys and tensors, refused by name before any allocation --
@pytest.mark.parametrize(
    "arch,key,value,message",
    [
        ("granite", "granite.logit_scale", 1e30, r"granite\.logit_scale=1e\+30 .* up to 10000"),
        ("granite", "granite.embedding_scale", -2.0, r"granite\.embedding_scale=-2\.0"),
        ("granite", "granite.residual_scale", float("nan"), r"granite\.residual_scale=nan"),
        ("phi3", "phi3.rope.scaling.attn_factor", 1e9, r"attn_factor=1000000000\.0"),
        ("llama", "llama.rope.dimension_count", 7, r"dimension_count=7 must be even"),
        ("llama", "llama.rope.dimension_count", 32, r"at most the attention head size 16"),
        ("mistral3", "mistral3.attention.temperature_scale", 0.1, r"temperature_length"),
        ("mistral3", "mistral3.attention.temperature_scale", 1e5, r"at most 10000"),
    ],
)
def test_hostile_issue10_metadata_is_refused_by_name(arch, key, value, message):
    with pytest.raises(ModelFileError, match=message):
        ModelConfig.from_gguf(_fake(arch, **{key: value}))


def test_yarn_with_a_base_of_one_is_refused_not_divided_by_zero():
    yarn = {
        "qwen3.rope.scaling.type": "yarn",
        "qwen3.rope.scaling.factor": 4.0,
        "qwen3.rope.scaling.original_context_length": 4096,
        "qwen3.rope.freq_base": 1.0,
    }
    with pytest.raises(ModelFileError, match="freq_base must be above 1 for YaRN"):
        ModelConfig.from_gguf(_fake("qwen3", **yarn))


def test_a_misshapen_fused_qkv_is_refused_before_the_model_is_built():
    fake = _fake("phi3")
    for name in ("attn_q", "attn_k", "attn_v"):
        del fake.tensors[f"blk.0.{name}.weight"]
    fake.tensors["blk.0.attn_qkv.weight"] = SimpleNamespace(shape=(64 + 64 + 63, 64))
    with pytest.raises(ModelFileError, match=r"'blk\.0\.attn_qkv\.weight' has shape \(191, 64\)"):
        ModelConfig.from_gguf(fake)


def test_phi3_needs_its_fused_gate_up_of_twice_the_ffn_rows():
    fake = _fake("phi3")
    assert fake.tensors["blk.1.ffn_up.weight"].shape == (256, 64) and not any(
        "ffn_gate" in n for n in fake.tensors
    )
    fake.tensors["blk.1.ffn_up.weight"] = SimpleNamespace(shape=(128, 64))
    with pytest.raises(ModelFileError, match=r"'blk\.1\.ffn_up\.weight' has shape \(128, 64\)"):
        ModelConfig.from_gguf(fake)


def test_olmo2_has_no_pre_norms_and_full_width_qk_norms():
    required, _ = expected_shapes(ModelConfig.from_metadata(_fake("olmo2")))
    assert "blk.0.attn_norm.weight" not in required and "blk.0.ffn_norm.weight" not in required
    assert required["blk.0.attn_q_norm.weight"] == (64,)
    assert required["blk.0.post_ffw_norm.weight"] == (64,)


def test_ministral3_temperature_length_falls_back_to_the_yarn_original_context():
    yarn = {
        "mistral3.rope.scaling.type": "yarn",
        "mistral3.rope.scaling.factor": 16.0,
        "mistral3.rope.scaling.original_context_length": 16384,
        "mistral3.attention.temperature_scale": 0.1,
    }
    cfg = ModelConfig.from_gguf(_fake("mistral3", **yarn))
    assert (cfg.attn_temp_length, cfg.rope_attn_factor) == (16384, 1.0)
    with_mul = ModelConfig.from_gguf(
        _fake("mistral3", **yarn, **{"mistral3.rope.scaling.yarn_log_multiplier": 0.5})
    )
    expected = (0.1 * math.log(16.0) + 1) / (0.05 * math.log(16.0) + 1)
    assert with_mul.rope_attn_factor == pytest.approx(expected)
