"""gpt-oss's harmony replies: the analysis channel becomes reasoning, the final channel the
answer, headers and the text between messages disappear, however the stream is cut. End to end
with a real tokenizer holding o200k_harmony's special tokens (the markers decode as text, as
llama.cpp renders them; <|return|> and <|call|> end the generation, <|end|> does not), a harmony
template and scripted logits: the loop's ReasoningDelta / TextDelta and Finished."""

import numpy as np
import pytest
from gguf import GGMLQuantizationType as Q
from gguf import GGUFValueType

from engine.cancel import CancelToken
from engine.chat_template import ChatTemplate
from engine.events import Finished, ReasoningDelta, TextDelta
from engine.generate import generate
from engine.gguf import open_gguf
from engine.harmony import HarmonySplitter, is_harmony_vocabulary, prompt_channel
from engine.reasoning import ANSWER, REASONING
from engine.tokenizer import Tokenizer
from engine.types import FinishReason, GenerationRequest
from tests.fake_model import FakeConfig, FakeGGUF, FakeLoadedModel, ScriptedModel
from tests.test_gpt_oss_chat import HARMONY

REPLY = (
    "<|channel|>analysis<|message|>The user greets. Reply briefly.<|end|>"
    "<|start|>assistant<|channel|>final<|message|>Hello! <|like|> this.<|end|>"
)


def _joined(parts: list[tuple[str, str]]) -> dict[str, str]:
    out = {REASONING: "", ANSWER: ""}
    for kind, text in parts:
        out[kind] += text
    return out


@pytest.mark.parametrize("cut", range(len(REPLY) + 1))
def test_channels_split_wherever_the_stream_is_cut(cut):
    splitter = HarmonySplitter()
    parts = splitter.push(REPLY[:cut]) + splitter.push(REPLY[cut:]) + splitter.flush()
    assert _joined(parts) == {
        REASONING: "The user greets. Reply briefly.",
        ANSWER: "Hello! <|like|> this.",
    }


def test_commentary_and_constrained_headers_are_answer_text_without_their_header():
    splitter = HarmonySplitter()
    text = (
        "<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>"
        '{"city":"Paris"}'
    )
    assert _joined(splitter.push(text) + splitter.flush())[ANSWER] == '{"city":"Paris"}'


def test_a_prompt_that_opens_the_final_channel_starts_in_the_answer():
    assert prompt_channel("<|start|>user<|message|>Hi<|end|><|start|>assistant") is None
    opened = "<|start|>user<|message|>Hi<|end|><|start|>assistant<|channel|>final<|message|>"
    assert prompt_channel(opened) == "final"
    assert prompt_channel(opened.replace("final", "analysis")) == "analysis"
    splitter = HarmonySplitter(prompt_channel(opened))
    assert splitter.push("Hi there<|end|>ignored") == [(ANSWER, "Hi there")]


# --- end to end ---------------------------------------------------------------------------------
HARMONY_TOKENS = ("<|start|>", "<|channel|>", "<|message|>", "<|end|>", "<|return|>", "<|call|>")


@pytest.fixture(scope="module")
def harmony_lm(tiny_model_factory):
    """SmolLM2's vocabulary with its last six tokens turned into harmony's special tokens."""
    from tests.tiny_models import tokenizer_metadata

    meta = {k: v for k, v, _, _ in tokenizer_metadata("smollm2")}
    tokens, types = list(meta["tokenizer.ggml.tokens"]), list(meta["tokenizer.ggml.token_type"])
    base = len(tokens) - len(HARMONY_TOKENS)
    for i, text in enumerate(HARMONY_TOKENS):
        tokens[base + i], types[base + i] = text, 3  # CONTROL
    path = tiny_model_factory(
        "gpt-oss",
        Q.F32,
        d_model=32,
        head_dim=16,
        d_ff=32,
        n_layers=1,
        extra_metadata={
            "tokenizer.ggml.tokens": (tokens, GGUFValueType.ARRAY),
            "tokenizer.ggml.token_type": (types, GGUFValueType.ARRAY),
            "tokenizer.chat_template": (HARMONY, GGUFValueType.STRING),
        },
    )
    gguf_file = open_gguf(path)
    tokenizer = Tokenizer.from_gguf(gguf_file)
    return gguf_file, tokenizer, ChatTemplate.from_gguf(gguf_file, tokenizer)


def test_a_scripted_harmony_reply_streams_reasoning_then_the_answer(harmony_lm):
    gguf_file, tokenizer, template = harmony_lm
    assert is_harmony_vocabulary(tokenizer)
    returns = tokenizer.token_id("<|return|>")
    assert returns in tokenizer.eog_ids and tokenizer.token_id("<|end|>") not in tokenizer.eog_ids
    reply = tokenizer.encode(REPLY.removesuffix("<|end|>"), add_special=False) + [returns]
    markers = {tokenizer.token_id(t) for t in HARMONY_TOKENS[:4]}
    assert markers <= set(reply)  # each marker is one special token
    assert tokenizer.decode(reply) == REPLY.removesuffix("<|end|>")  # and decodes as its text
    vocab = tokenizer.vocab_size
    n_prompt: list[int] = []

    def logits_for(prefix: list[int]) -> np.ndarray:
        logits = np.zeros(vocab, np.float32)
        step = len(prefix) - n_prompt[0]
        if 0 <= step < len(reply):
            logits[reply[step]] = 10.0
        return logits

    lm = FakeLoadedModel(
        ScriptedModel(logits_for, FakeConfig(vocab_size=vocab)),
        tokenizer,
        template,
        n_ctx=256,
        gguf=FakeGGUF(dict(gguf_file.metadata)),
    )
    request = GenerationRequest(
        messages=[{"role": "user", "content": "Hi"}],
        overrides={"max_new_tokens": len(reply) + 2, "do_sample": False},
    )
    n_prompt.append(len(tokenizer.encode(template.render(request.messages), add_special=False)))
    events = list(generate(lm, request, CancelToken()))
    finished = events[-1]
    assert isinstance(finished, Finished) and finished.error is None, finished.error
    assert finished.finish_reason == FinishReason.STOP
    assert finished.reasoning == "The user greets. Reply briefly."
    assert finished.text == "Hello! <|like|> this."
    streamed_reasoning = "".join(e.text for e in events if isinstance(e, ReasoningDelta))
    streamed_answer = "".join(e.text for e in events if isinstance(e, TextDelta))
    assert (streamed_reasoning, streamed_answer) == (finished.reasoning, finished.text)
