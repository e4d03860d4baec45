"""Fitting a conversation into the context window (hand-counted token sizes on the fake ChatML)."""

import pytest
from fake_model import fake_lm, script_tokens

from engine.context_fit import fit_conversation
from engine.errors import ConfigValidationError, ContextOverflowError

# With the fake ChatML template every one-piece message is 6 tokens
# (<|im_start|> role \n content <|im_end|> \n), plus BOS (1) and the generation prompt (3).
SYS = {"role": "system", "content": "Hello"}
U1, A1 = {"role": "user", "content": "x"}, {"role": "assistant", "content": "y"}
U2, A2 = {"role": "user", "content": "z"}, {"role": "assistant", "content": "a"}
U3 = {"role": "user", "content": "b"}
CHAT = [SYS, U1, A1, U2, A2, U3]  # 1 + 6 * 6 + 3 = 40 tokens


def size(n_messages):
    return 1 + 6 * n_messages + 3


@pytest.fixture
def lm():
    return fake_lm(script_tokens(0, []), n_ctx=40)


def test_a_fitting_conversation_is_unchanged(lm):
    result = fit_conversation(lm, CHAT, reserve_tokens=0)
    assert (
        result.messages == CHAT and result.dropped == [] and result.prompt_tokens == size(6) == 40
    )


def test_drop_oldest_drops_the_fewest_whole_turns_and_keeps_the_system_prompt(lm):
    result = fit_conversation(lm, CHAT, reserve_tokens=5)  # budget 35: one turn must go
    assert result.messages == [SYS, U2, A2, U3]
    assert (
        result.dropped == [U1, A1]
        and result.dropped_indices == [1, 2]
        and result.dropped_turns == 1
    )
    assert result.prompt_tokens == size(4)
    result = fit_conversation(lm, CHAT, reserve_tokens=20)  # budget 20: only the last turn fits
    assert result.messages == [SYS, U3] and result.dropped == [U1, A1, U2, A2]
    assert result.prompt_tokens == size(2) == 16


def test_even_the_last_turn_not_fitting_is_refused(lm):
    with pytest.raises(ContextOverflowError) as info:
        fit_conversation(lm, CHAT, reserve_tokens=25)  # budget 15 < 16
    assert "16" in str(info.value) and "40" in str(info.value)


def test_refuse_policy_never_drops(lm):
    with pytest.raises(ContextOverflowError) as info:
        fit_conversation(lm, CHAT, reserve_tokens=5, policy="refuse")
    assert "40 tokens" in str(info.value)
    assert fit_conversation(lm, CHAT, reserve_tokens=0, policy="refuse").messages == CHAT


def test_a_leading_assistant_greeting_is_dropped_with_the_oldest_turn(lm):
    greeting = {"role": "assistant", "content": "Hello"}
    chat = [SYS, greeting, U2, A2, U3]  # 34 tokens
    result = fit_conversation(lm, chat, reserve_tokens=10)  # budget 30
    assert result.messages == [SYS, U2, A2, U3] and result.dropped == [greeting]


def test_bad_policy_and_reserve_are_validation_errors(lm):
    with pytest.raises(ConfigValidationError):
        fit_conversation(lm, CHAT, reserve_tokens=0, policy="truncate_middle")
    with pytest.raises(ConfigValidationError):
        fit_conversation(lm, CHAT, reserve_tokens=40)
    with pytest.raises(ConfigValidationError):
        fit_conversation(lm, [], reserve_tokens=0)
