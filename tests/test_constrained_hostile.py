"""JSON mode against a hostile vocabulary (issue 17): a token llguidance cannot take is withheld,
and a native panic (pyo3_runtime.PanicException, a BaseException) never escapes as such."""

from __future__ import annotations

import functools

import llguidance
import numpy as np
import pytest
from gguf import GGUFValueType

from engine.constrained import (
    MAX_TOKEN_BYTES,
    json_grammar,
    make_json_constraint,
)
from engine.errors import ConstraintError
from engine.gguf import open_gguf
from engine.tokenizer import Tokenizer
from tests.test_constrained import TinyTokenizer
from tests.tiny_models import tokenizer_metadata, write_tiny_model

LONG_TOKEN = "a" * 5000  # the vocabulary entry that made llguidance panic


class TinyWithLongToken(TinyTokenizer):
    def __init__(self):
        super().__init__()
        self.hf.add_tokens([LONG_TOKEN])
        self.vocab_size = self.hf.get_vocab_size(with_added_tokens=True)


@functools.cache
def real_panic_type() -> type[BaseException]:
    """pyo3_runtime.PanicException, obtained the way users met it (it cannot be imported)."""
    tok = TinyWithLongToken()
    try:
        llguidance.LLTokenizer(tok.hf.to_str(), n_vocab=tok.vocab_size, eos_token=[tok.eos_id])
    except BaseException as exc:  # noqa: B036 - the panic is what this helper is after
        assert not isinstance(exc, Exception)
        return type(exc)
    pytest.skip("this llguidance build no longer panics on a long token")


# --- the vocabulary ------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def model_with_long_token(tmp_path_factory):
    tokens = list(
        next(v for k, v, _, _ in tokenizer_metadata("smollm2") if k == "tokenizer.ggml.tokens")
    )
    long_id = len(tokens) - 1
    tokens[long_id] = LONG_TOKEN
    path = write_tiny_model(
        tmp_path_factory.mktemp("long") / "m.gguf",
        "llama",
        extra_metadata={"tokenizer.ggml.tokens": (tokens, GGUFValueType.ARRAY)},
    )
    return Tokenizer.from_gguf(open_gguf(path)), long_id


def test_a_5000_char_token_is_withheld_and_json_mode_still_works(model_with_long_token):
    tokenizer, long_id = model_with_long_token
    constraint = make_json_constraint(tokenizer, "object")
    mask = constraint.allowed_mask()
    assert mask.any() and not mask[long_id]
    ids = tokenizer.encode('{"a": 1}', add_special=False)
    tokens = [1]
    for token in ids:
        logits = constraint(tokens, np.zeros(tokenizer.vocab_size, np.float32))
        assert np.isfinite(logits[token])
        tokens.append(token)
    constraint(tokens, np.zeros(tokenizer.vocab_size, np.float32))
    assert constraint.is_accepting


def test_a_long_token_in_an_hf_vocabulary_is_a_typed_error():
    with pytest.raises(ConstraintError, match=rf"5000 bytes long .*at most {MAX_TOKEN_BYTES}"):
        make_json_constraint(TinyWithLongToken(), "object")


def test_a_panic_inside_llguidance_becomes_a_constraint_error(monkeypatch):
    panic = real_panic_type()
    constraint = make_json_constraint(TinyTokenizer(), "object")

    class PanickingMatcher:
        def __getattr__(self, name):
            def call(*args):
                raise panic("assertion failed: num_parents <= (1 << PARENT_BITS) as usize")

            return call

    monkeypatch.setattr(constraint, "_matcher", PanickingMatcher())
    with pytest.raises(ConstraintError, match="grammar library crashed.*num_parents"):
        constraint.allowed_mask()
    constraint._start = 0
    with pytest.raises(ConstraintError, match="accepting token 5"):
        constraint.accept(5)

    def panics(*args, **kwargs):
        raise panic("boom")

    monkeypatch.setattr(llguidance.LLMatcher, "grammar_from_json_schema", panics)
    with pytest.raises(ConstraintError, match="crashed"):
        json_grammar("schema", {"type": "integer"})


def test_keyboard_interrupt_is_not_swallowed(monkeypatch):
    constraint = make_json_constraint(TinyTokenizer(), "object")

    class InterruptedMatcher:
        def unsafe_compute_mask_ptr(self, *args):
            raise KeyboardInterrupt

    monkeypatch.setattr(constraint, "_matcher", InterruptedMatcher())
    with pytest.raises(KeyboardInterrupt):
        constraint.allowed_mask()
