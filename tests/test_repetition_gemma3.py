"""The case issue 31 (defect 8) reported, on the real model: gemma-3-270m is a base model (no
chat template), and asked a question in a chat it writes the question again and again until the
context is full. The repetition stop ends it once the loop covers 256 tokens. Slow tier (gemma3
fixture)."""

from engine.generate import GenerationRequest, generate
from engine.model_summary import is_base_model

QUESTION = "What is the capital of France?"


def ask(lm, **overrides):
    request = GenerationRequest(
        messages=[{"role": "user", "content": QUESTION}], overrides=overrides
    )
    return list(generate(lm, request))[-1]


def test_gemma3_is_a_base_model_and_its_question_loop_is_stopped(gemma3):
    assert is_base_model(gemma3.gguf.metadata)
    assert gemma3.chat_template.is_fallback
    stopped = ask(gemma3)  # greedy (no sampling values in the file, no chat defaults for a base)
    assert stopped.finish_reason == "repetition"
    assert stopped.text.count(QUESTION) >= 8  # the question written over and over
    assert 256 <= len(stopped.token_ids) < 400
    # without the stop the same loop runs until the 512-token context is full
    endless = ask(gemma3, stop_on_repetition=False)
    assert endless.finish_reason == "length"
    assert endless.usage.context_used == 512
    assert endless.token_ids[: len(stopped.token_ids)] == stopped.token_ids
