"""What the engine does for one chat send from the app: warm-up at load, fitting the chat into the
context with room for the reply, and resolving the preset once (hand-counted sizes on the fake
ChatML: every one-piece message is 6 tokens, plus BOS and the 3-token generation prompt)."""

import pytest
from fake_model import BOS, fake_lm, script_tokens, token_id, use_fake_detokenizer

import engine.generate
import engine.presets
from app.engine_bridge import ContextTrimmed, RealEngine
from engine.cancel import CancelToken
from engine.context_fit import fit_chat
from engine.errors import PresetFileError
from engine.events import Finished
from engine.generate import generate
from engine.loader import warm_up
from engine.types import GenerationRequest

SYS = {"role": "system", "content": "Hello"}
U1, A1 = {"role": "user", "content": "x"}, {"role": "assistant", "content": "y"}
U2, A2 = {"role": "user", "content": "z"}, {"role": "assistant", "content": "a"}
U3 = {"role": "user", "content": "b"}
CHAT = [SYS, U1, A1, U2, A2, U3]  # 1 + 6 * 6 + 3 = 40 tokens


@pytest.fixture
def lm(monkeypatch):
    use_fake_detokenizer(monkeypatch)
    return fake_lm(script_tokens(0, [token_id("Hello")] * 8), n_ctx=40)


def test_fit_chat_keeps_max_new_tokens_free_for_the_reply(lm):
    fit = fit_chat(lm, CHAT, 5)  # budget 35: the oldest turn (U1, A1) goes, 28 tokens remain
    assert fit.messages == [SYS, U2, A2, U3] and fit.dropped == [U1, A1]
    assert fit.reserved_tokens == 5 and fit.prompt_tokens == 28


def test_fit_chat_without_a_maximum_keeps_a_quarter_of_a_small_context(lm):
    fit = fit_chat(lm, CHAT, None)  # min(512, 40 // 4) = 10 reserved
    assert fit.reserved_tokens == 10 and fit.messages == [SYS, U2, A2, U3]
    assert fit_chat(lm, CHAT[:2], None).dropped == []


def test_fit_chat_gives_up_when_the_reply_alone_fills_the_context(lm):
    assert fit_chat(lm, CHAT, 40) is None


def test_warm_up_reads_a_multi_token_prompt_and_keeps_no_state(lm):
    warm_up(lm)
    # the prefill path: 8 tokens in one forward (a one-token prompt left the first real
    # prompt's first chunk cold)
    assert [(c.tokens, c.start) for c in lm.model.calls] == [([BOS] * 8, 0)]
    assert lm.model.caches_created == [9]  # its own throwaway cache: prompt + one token


def test_warm_up_fits_a_context_smaller_than_its_prompt(monkeypatch):
    use_fake_detokenizer(monkeypatch)
    tiny = fake_lm(script_tokens(0, [token_id("Hello")] * 8), n_ctx=5)
    warm_up(tiny)
    assert [c.tokens for c in tiny.model.calls][0] == [BOS] * 3  # 5 - 2: room for its tokens


def test_warm_up_leaves_a_broken_preset_file_to_the_first_request(lm, tmp_path):
    (tmp_path / "generation_config.json").write_text("{not json")
    lm.path = tmp_path / "m.gguf"
    warm_up(lm)  # no exception: the load succeeds
    with pytest.raises(PresetFileError, match="generation_config.json"):
        generate(lm, GenerationRequest(prompt_ids=[BOS]))


def test_a_send_resolves_the_preset_once_and_fits_the_chat(lm, monkeypatch):
    calls = []
    real = engine.presets.resolve_preset

    def counting(*args, **kwargs):
        calls.append(kwargs)
        return real(*args, **kwargs)

    monkeypatch.setattr(engine.presets, "resolve_preset", counting)
    monkeypatch.setattr(engine.generate, "resolve_preset", counting)
    request = GenerationRequest(messages=tuple(CHAT), overrides={"max_new_tokens": 5})
    events = list(RealEngine().generate(lm, request, CancelToken()))
    assert len(calls) == 1
    assert events[0] == ContextTrimmed(1, 2, 28, 40)
    finished = events[-1]
    assert isinstance(finished, Finished) and finished.usage.prompt_tokens == 28
