"""End to end on the real models through load_model with the default backend (the JIT kernels
when they compile): tokenizer ids equal transformers' tokenizer ids for the oracle prompts, and
free-running greedy decoding with the KV cache reproduces transformers' continuation.

Only steps whose top1-top2 margin in the oracle is >= 1.0 logit are compared: the JIT kernels
quantize activations to 8 bits, which moves logits by up to ~0.65 on these prompts (measured),
like llama.cpp's 0.1-1 nat; the float reference is held to 0.06 in test_forward_oracle.py.
"""

import json
from pathlib import Path

import numpy as np

from engine.loader import load_model

FIXTURES = Path(__file__).parent / "fixtures"
SAFE_MARGIN = 1.0


def _greedy(lm, prompt_ids: list[int], n: int) -> list[int]:
    cache = lm.model.new_cache(len(prompt_ids) + n)
    logits = lm.model.forward(prompt_ids, cache)
    out = []
    for _ in range(n):
        token = int(np.argmax(logits))
        out.append(token)
        logits = lm.model.forward([token], cache)
    return out


def _clear_prefix(case: dict) -> int:
    """Number of leading greedy steps that are all far from a tie."""
    n = 0
    while n < len(case["greedy"]) and case["greedy_margins"][n] >= SAFE_MARGIN:
        n += 1
    return n


def test_smollm2_chat_answer(smollm2_path):
    oracle = json.loads((FIXTURES / "oracle_smollm2.json").read_text())
    case = next(c for c in oracle["cases"] if c["name"] == "chat_capital")
    with load_model(smollm2_path, n_ctx=256) as lm:
        text = "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n"
        assert lm.tokenizer.encode(text, add_special=False) == case["prompt_ids"]
        n = _clear_prefix(case)
        assert n >= 7
        got = _greedy(lm, case["prompt_ids"], n)
        assert got == case["greedy"][:n]
        assert lm.tokenizer.decode(got).startswith("The capital of France is Paris.")


def test_gemma3_long_prompt_decode_past_the_window(gemma3_path):
    oracle = json.loads((FIXTURES / "oracle_gemma3.json").read_text())
    case = next(c for c in oracle["cases"] if c["name"] == "counting_long")
    with load_model(gemma3_path, n_ctx=1024) as lm:
        text = ", ".join(str(i) for i in range(1, 181)) + ","
        assert lm.tokenizer.encode(text, add_special=True) == case["prompt_ids"]
        n = min(_clear_prefix(case), 6)
        got = _greedy(lm, case["prompt_ids"], n)
        assert got == case["greedy"][:n]
        assert lm.tokenizer.decode(got) == " 181, "
