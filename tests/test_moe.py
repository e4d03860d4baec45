"""Mixture of experts (qwen3moe, gpt-oss): a token reads only the weights of the experts it is
routed to (gpt-oss's MXFP4 experts too), and the config refuses hostile expert counts by name.
Exactness against transformers is in test_forward_oracle (tiny_qwen3moe, tiny_gpt_oss)."""

from pathlib import Path

import numpy as np
import pytest

from engine.config import ModelConfig
from engine.errors import ModelFileError
from engine.gguf import open_gguf
from engine.kernels.reference import ReferenceBackend
from engine.models import build_model
from engine.models.transformer import TransformerModel

FIXTURES = Path(__file__).parent / "fixtures"


class _Recording(ReferenceBackend):
    """The reference backend, recording the name of every weight a linear reads."""

    def __init__(self):
        self.read: list[str] = []

    def linear(self, w, x, out=None):
        self.read.append(w.name)
        return super().linear(w, x, out=out)


@pytest.mark.parametrize("name", ["qwen3moe", "gpt_oss"])
def test_a_decode_step_reads_only_the_routed_experts(name):
    backend = _Recording()
    model = build_model(open_gguf(FIXTURES / f"tiny_{name}.gguf"), backend=backend)
    cfg = model.config
    assert (cfg.n_expert, cfg.n_expert_used) == (8, 2)
    cache = model.new_cache(16)
    model.forward([5, 9, 200, 31], cache)
    backend.read.clear()
    model.forward([77], cache)
    for layer in range(cfg.n_layers):
        experts = {
            name.split(".")[3]
            for name in backend.read
            if name.startswith(f"blk.{layer}.ffn_") and "gate_inp" not in name
        }
        assert len(experts) == cfg.n_expert_used, (layer, sorted(experts))
        for e in experts:  # each chosen expert runs its gate, up and down once
            for part in ("ffn_gate", "ffn_up", "ffn_down"):
                assert backend.read.count(f"blk.{layer}.{part}.{e}.weight") == 1
    # A prefill touches the union of its tokens' experts, each once per layer.
    backend.read.clear()
    model.forward(list(range(10, 26)), model.new_cache(16))
    gate_reads = [n for n in backend.read if n.startswith("blk.0.ffn_gate.")]
    assert len(gate_reads) == len(set(gate_reads)) <= cfg.n_expert


def test_gpt_oss_experts_stay_mxfp4_views_of_the_file():
    g = open_gguf(FIXTURES / "tiny_gpt_oss.gguf")
    model = build_model(g, backend=ReferenceBackend())
    gate, up, down = model.layers[2].experts[5]
    stack = g.tensors["blk.2.ffn_down_exps.weight"]
    assert stack.qtype.name == "MXFP4" and down.qtype.name == "MXFP4"
    assert np.shares_memory(down.data, stack.data) and down.shape == (32, 32)
    gate_bias = model.layers[2].expert_biases[5][0]
    assert np.array_equal(gate_bias, g.tensors["blk.2.ffn_gate_exps.bias"].data[5])


def test_expert_views_share_the_file_memory():
    g = open_gguf(FIXTURES / "tiny_qwen3moe.gguf")
    model = build_model(g, backend=ReferenceBackend())
    gate, up, down = model.layers[1].experts[3]
    stack = g.tensors["blk.1.ffn_gate_exps.weight"]
    assert np.shares_memory(gate.data, stack.data) and gate.shape == (32, 32)
    assert down.shape == (32, 32) and up.name == "blk.1.ffn_up.3.weight"


def _moe_fake(**metadata):
    from types import SimpleNamespace

    from gguf import GGMLQuantizationType

    from engine.qtensor import QTensor

    embd = QTensor("token_embd.weight", GGMLQuantizationType.F32, (100, 64), np.zeros((100, 64)))
    base = {
        "qwen3moe.embedding_length": 64,
        "qwen3moe.block_count": 2,
        "qwen3moe.context_length": 512,
        "qwen3moe.attention.head_count": 4,
        "qwen3moe.expert_count": 8,
        "qwen3moe.expert_used_count": 2,
        "qwen3moe.expert_feed_forward_length": 32,
        **metadata,
    }
    return SimpleNamespace(arch="qwen3moe", metadata=base, tensors={"token_embd.weight": embd})


@pytest.mark.parametrize(
    "key,value,message",
    [
        (
            "qwen3moe.expert_used_count",
            9,
            r"expert_used_count=9 must be a positive integer up to 8",
        ),
        ("qwen3moe.expert_used_count", 0, r"expert_used_count=0"),
        ("qwen3moe.expert_count", 10**9, r"expert_count=1000000000 .* up to 4096"),
        ("qwen3moe.expert_feed_forward_length", -1, r"expert_feed_forward_length=-1"),
    ],
)
def test_hostile_expert_counts_are_refused_by_name(key, value, message):
    with pytest.raises(ModelFileError, match=message):
        ModelConfig.from_metadata(_moe_fake(**{key: value}))


def test_gpt_oss_without_its_sliding_window_key_is_refused_by_name():
    from types import SimpleNamespace

    fake = _moe_fake()
    metadata = {k.replace("qwen3moe.", "gpt-oss."): v for k, v in fake.metadata.items()}
    gpt_oss = SimpleNamespace(arch="gpt-oss", metadata=metadata, tensors=fake.tensors)
    with pytest.raises(ModelFileError, match=r"'gpt-oss.attention.sliding_window' is missing"):
        ModelConfig.from_metadata(gpt_oss)
    metadata["gpt-oss.attention.sliding_window"] = 128
    cfg = ModelConfig.from_metadata(gpt_oss)
    assert cfg.layer_uses_window == (True, False) and cfg.activation == "swiglu_oai"
    assert cfg.attn_sinks and cfg.moe_bias and cfg.ffn_norm_tensor == "post_attention_norm"


def test_moe_config_without_a_dense_ffn_length_uses_the_expert_one():
    cfg = ModelConfig.from_metadata(_moe_fake())
    assert (cfg.n_ff, cfg.n_ff_exp, cfg.qk_norm) == (32, 32, True)


@pytest.mark.parametrize("name", ["qwen3moe", "gpt_oss"])
def test_a_fused_gate_up_expert_stack_runs_as_the_two_stacks_do(name):
    """llama.cpp takes gate and up as one ffn_gate_up_exps stack (the converter's
    --fuse-gate-up-exps: per expert its gate rows, then its up rows; biases likewise): the same
    weights fused give the same logits."""
    from engine.qtensor import QTensor
    from engine.tensor_checks import check_tensors

    g = open_gguf(FIXTURES / f"tiny_{name}.gguf")
    cfg = ModelConfig.from_gguf(g)
    fused = dict(g.tensors)
    for layer in range(cfg.n_layers):
        p = f"blk.{layer}."
        for suffix in (".weight", ".bias") if cfg.moe_bias else (".weight",):
            gate = fused.pop(p + "ffn_gate_exps" + suffix)
            up = fused.pop(p + "ffn_up_exps" + suffix)
            data = np.concatenate([gate.data, up.data], axis=1)
            shape = (gate.shape[0], 2 * gate.shape[1], *gate.shape[2:])
            name_ = p + "ffn_gate_up_exps" + suffix
            fused[name_] = QTensor(name_, gate.qtype, shape, data)
    check_tensors(cfg, fused)
    tokens = [5, 9, 200, 31, 77, 3, 18, 250]
    plain = build_model(g, backend=ReferenceBackend())
    joined = TransformerModel(cfg, fused, ReferenceBackend())
    want = plain.forward(tokens, plain.new_cache(16), all_logits=True)
    got = joined.forward(tokens, joined.new_cache(16), all_logits=True)
    np.testing.assert_array_equal(got, want)
    caches = plain.new_cache(16), joined.new_cache(16)  # and the one-token decode path
    for model, cache in zip((plain, joined), caches, strict=True):
        model.forward(tokens[:-1], cache)
    np.testing.assert_array_equal(
        joined.forward(tokens[-1:], caches[1]), plain.forward(tokens[-1:], caches[0])
    )
