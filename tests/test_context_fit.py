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


# --- very long chats on a real tokenizer and template (SmolLM2: GPT-2 BPE, ChatML) ---------------
@pytest.fixture(scope="module")
def smollm2_text_lm(smollm2_path):
    """What fitting needs of a loaded model (tokenizer, template, n_ctx), without the weights."""
    from types import SimpleNamespace

    from engine.chat_template import ChatTemplate
    from engine.gguf import open_gguf
    from engine.tokenizer import Tokenizer

    gguf_file = open_gguf(smollm2_path)
    tokenizer = Tokenizer.from_gguf(gguf_file)
    template = ChatTemplate.from_gguf(gguf_file, tokenizer)
    return SimpleNamespace(tokenizer=tokenizer, chat_template=template, n_ctx=4096)


def long_chat(n_chars: int, turn_chars: int = 10_000) -> list[dict]:
    """A system prompt, then user/assistant turns of ordinary text, then a short question."""
    sentence = "The river carried the boat past the old mill and into the harbour. "
    body = (sentence * (turn_chars // len(sentence) + 1))[:turn_chars]
    chat = [{"role": "system", "content": "You are a helpful assistant."}]
    while sum(len(m["content"]) for m in chat) < n_chars:
        chat += [{"role": "user", "content": body}, {"role": "assistant", "content": body}]
    return [*chat, {"role": "user", "content": "Summarise the story so far."}]


def test_a_chat_of_four_million_characters_is_fitted_to_its_newest_turns(smollm2_text_lm):
    from engine.context_fit import count_prompt_tokens

    lm = smollm2_text_lm
    chat = long_chat(4_000_000, turn_chars=2_000)  # a turn (user + reply) is ~900 tokens
    assert sum(len(m["content"]) for m in chat) >= 4_000_000
    result = fit_conversation(lm, chat, reserve_tokens=512)
    kept = result.messages
    first_kept = len(chat) - len(kept) + 1  # index in `chat` of the oldest kept turn
    assert kept[0] == chat[0] and kept[1:] == chat[first_kept:]
    assert kept[1]["role"] == "user" and len(kept) > 3 and result.dropped_turns > 0
    assert result.prompt_tokens == count_prompt_tokens(lm, kept) <= 4096 - 512
    # the fewest turns were dropped: one more turn back no longer fits
    one_more = [chat[0], *chat[first_kept - 2 :]]
    assert one_more[1]["role"] == "user"
    assert count_prompt_tokens(lm, one_more) > 4096 - 512


def test_a_last_message_longer_than_the_context_is_a_typed_error_naming_its_size(
    smollm2_text_lm,
):
    from engine.context_fit import MAX_COUNTED_CHARS, LastMessageTooLongError

    lm = smollm2_text_lm
    chat = long_chat(4_000_000, turn_chars=4_000_000)
    huge = [chat[0], chat[1]]  # the system prompt and one user message of 4,000,000 characters
    with pytest.raises(LastMessageTooLongError) as info:
        fit_conversation(lm, huge, reserve_tokens=512)
    error = info.value
    assert not error.exact and error.budget == 4096 - 512
    counted = huge[-1]["content"][:MAX_COUNTED_CHARS]
    assert error.last_message_tokens == len(lm.tokenizer.encode(counted, add_special=False))
    assert "4000000 characters" in str(error) and "3584 tokens" in str(error)
    assert "unsafe" not in str(error)

    short_enough_to_count = [huge[0], {"role": "user", "content": counted[:50_000]}]
    with pytest.raises(LastMessageTooLongError) as info:
        fit_conversation(lm, short_enough_to_count, reserve_tokens=512)
    assert info.value.exact and f"is {info.value.last_message_tokens} tokens" in str(info.value)
