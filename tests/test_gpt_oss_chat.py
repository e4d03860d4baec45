"""A gpt-oss file end to end, before and through a chat turn: `engine info` names the architecture
and its experts, window and RoPE scaling; a harmony-format template (gpt-oss's <|start|>role
<|message|>...<|end|> turns, here a minimal one) and a file without any template both plan and
generate. The forward pass itself is checked against transformers in test_forward_oracle.

The file is a tiny random gpt-oss (tests/tiny_models.py: MXFP4 experts, biases, sinks) with
SmolLM2's vocabulary under gpt-oss's pre-tokenizer name (gpt-4o), so the harmony markers are
plain text to this tokenizer; what is under test is that nothing in loading, template rendering
or planning trips over the architecture.
"""

import pytest
from gguf import GGMLQuantizationType as Q
from gguf import GGUFValueType

from engine.__main__ import main, model_info
from engine.cancel import CancelToken
from engine.events import Finished
from engine.generate import generate
from engine.loader import load_model
from engine.types import FinishReason, GenerationRequest

# A minimal harmony template: the system header, each turn as <|start|>role<|message|>..<|end|>
# (assistant turns on the final channel), the generation prompt <|start|>assistant.
HARMONY = (
    "<|start|>system<|message|>Reasoning: medium\n\n# Valid channels: analysis, commentary, "
    "final. Channel must be included for every message.<|end|>"
    "{%- for message in messages -%}"
    "{%- if message.role == 'assistant' -%}"
    "<|start|>assistant<|channel|>final<|message|>{{ message.content }}<|end|>"
    "{%- else -%}<|start|>{{ message.role }}<|message|>{{ message.content }}<|end|>{%- endif -%}"
    "{%- endfor -%}{%- if add_generation_prompt -%}<|start|>assistant{%- endif -%}"
)
DIMS = dict(d_model=64, head_dim=16, d_ff=64, expert_qtype=Q.MXFP4)
GPT_4O = {"tokenizer.ggml.pre": ("gpt-4o", GGUFValueType.STRING)}


@pytest.fixture(scope="module")
def harmony_file(tiny_model_factory):
    return tiny_model_factory(
        "gpt-oss",
        Q.Q8_0,
        extra_metadata={**GPT_4O, "tokenizer.chat_template": (HARMONY, GGUFValueType.STRING)},
        **DIMS,
    )


def test_info_names_the_architecture_and_its_moe_shape(harmony_file, capsys):
    info = model_info(harmony_file)
    assert info["architecture"] == "gpt-oss" and info["supported"]
    assert info["tokenizer"]["pre"] == "gpt-4o"
    assert info["experts"] == "8 (2 per token)" and info["sliding_window"] == 128
    assert info["rope_scaling"] == "yarn"
    assert info["chat_template"]["name"] == "harmony (from the model file)"
    assert info["quant_mix"]["MXFP4"]["tensors"] == 3 * 2  # gate, up, down stacks per layer
    assert main(["info", str(harmony_file)]) == 0
    out = capsys.readouterr().out
    assert "architecture     gpt-oss" in out and "supported        yes" in out


def _chat(path) -> tuple[Finished, str]:
    """(the Finished event, the prompt as text) of a greedy 3-token reply to a short chat."""
    request = GenerationRequest(
        messages=[
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "Hi"},
            {"role": "assistant", "content": "Hello."},
            {"role": "user", "content": "Again"},
        ],
        overrides={"max_new_tokens": 3, "do_sample": False},
    )
    with load_model(path, n_ctx=256) as lm:
        events = list(generate(lm, request, CancelToken()))
        finished = events[-1]
        assert isinstance(finished, Finished) and finished.error is None
        return finished, lm.tokenizer.decode(list(finished.prompt_ids))


def test_a_harmony_template_plans_and_generates(harmony_file):
    finished, prompt = _chat(harmony_file)
    assert finished.finish_reason == FinishReason.LENGTH and len(finished.token_ids) == 3
    assert prompt.startswith("<|start|>system<|message|>Reasoning: medium")
    assert "<|start|>assistant<|channel|>final<|message|>Hello.<|end|>" in prompt
    assert prompt.endswith("<|start|>user<|message|>Again<|end|><|start|>assistant")


def test_a_gpt_oss_file_without_a_template_falls_back_and_generates(tiny_model_factory):
    path = tiny_model_factory(
        "gpt-oss", Q.Q8_0, extra_metadata=GPT_4O, omit_keys=("tokenizer.chat_template",), **DIMS
    )
    assert model_info(path)["chat_template"] == {"name": "chatml (fallback)", "is_fallback": True}
    finished, prompt = _chat(path)
    assert prompt.endswith("user\nAgain\nassistant\n")  # ChatML (its markers decode hidden)
    assert finished.finish_reason == FinishReason.LENGTH and len(finished.token_ids) == 3
