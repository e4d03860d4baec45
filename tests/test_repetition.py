"""Runaway repetition (engine/repetition.py) and its stop in the generation loop.

Every expected position below is counted by hand from the thresholds the module documents
(MAX_PERIOD 128, MIN_REPEATS 4, MIN_SPAN 256): a loop of period p fires on the generated token
at which its periodic tail first covers max(256, 4 * p) tokens."""

import numpy as np
import pytest
from fake_model import (
    EOS,
    fake_lm,
    ids,
    script_tokens,
    use_fake_detokenizer,
)

from engine.events import Finished, TextDelta, TokenSampled
from engine.generate import GenerationRequest, generate
from engine.model_summary import is_base_model, summarize_model_file
from engine.repetition import Loop, RepetitionDetector
from engine.server.responses import OPENAI_FINISH_REASON, openai_finish_reason
from engine.stopping import decide_finish_reason
from engine.types import FinishReason


def first_fire(tokens) -> tuple[int, Loop] | None:
    """(1-based count of tokens pushed when the detector first fired, its Loop), or None."""
    detector = RepetitionDetector()
    for n, token in enumerate(tokens, start=1):
        loop = detector.push(token)
        if loop is not None:
            return n, loop
    return None


def distinct(n: int, start: int = 1000) -> list[int]:
    return list(range(start, start + n))


# --- what is a loop ------------------------------------------------------------------------------
@pytest.mark.parametrize("token", [0, 1, 7, 262_143])
def test_one_token_written_256_times_fires_on_the_256th(token):
    # ids 0 and 1 too: nothing stands for "before the first token" that a real id could equal
    assert first_fire([token] * 255) is None
    assert first_fire([token] * 256) == (256, Loop(period=1, span=256))


def test_a_question_written_again_and_again_fires_once_it_covers_256_tokens():
    question = distinct(16)  # a 16-token question: 16 copies make 256 tokens
    assert first_fire(question * 16) == (256, Loop(period=16, span=256))
    assert first_fire((question * 16)[:255]) is None


def test_a_long_block_needs_four_whole_copies():
    paragraph = distinct(100)  # 4 copies = 400 tokens, past MIN_SPAN
    assert first_fire((paragraph * 4)[:399]) is None
    assert first_fire(paragraph * 5) == (400, Loop(period=100, span=400))


def test_a_60_token_block_fires_at_256_tokens_not_after_four_copies():
    block = distinct(60)  # 4 copies are 240 tokens, under MIN_SPAN: the span decides
    assert first_fire(block * 4) is None
    assert first_fire(block * 5) == (256, Loop(period=60, span=256))


def test_the_longest_period_is_128_and_a_longer_loop_is_left_to_the_length_limit():
    assert first_fire(distinct(128) * 5) == (512, Loop(period=128, span=512))
    assert first_fire(distinct(129) * 20) is None  # 2,580 tokens of a 129-token loop


def test_only_the_looping_tail_counts():
    # 50 tokens of ordinary text, then an 8-token phrase over and over: the tail reaches 256
    # tokens at token 50 + 256
    tokens = distinct(50, start=5000) + distinct(8) * 40
    assert first_fire(tokens) == (306, Loop(period=8, span=256))


def test_a_loop_broken_once_starts_counting_again():
    # (a b c d) x 50, one other token X at index 200, then (a b c d) again. t[i] == t[i-4]
    # fails for i = 200..204 (each compares with X or across it) and holds from i = 205, so the
    # period-4 tail is t[201..]: it covers 256 tokens at index 456, the 457th token.
    abcd = distinct(4)
    tokens = abcd * 50 + [9999] + abcd * 100
    assert first_fire(tokens) == (457, Loop(period=4, span=256))


# --- what is not a loop --------------------------------------------------------------------------
def test_a_json_array_of_similar_items_is_not_a_loop():
    # [{"id": k, "name": "item"}, ...] for 300 items: 3,000 tokens, every copy has its own number
    open_, key_id, colon, key_name, item, close, comma = distinct(7)
    tokens = [distinct(1, start=1)[0]]
    for k in range(300):
        tokens += [open_, key_id, colon, 20000 + k, comma, key_name, colon, item, close, comma]
    assert first_fire(tokens) is None


def test_code_with_a_repeated_line_is_not_a_loop():
    line = distinct(6)  # e.g. "    x = 0\n": 20 copies = 120 tokens
    tokens = distinct(30, start=3000) + line * 20 + distinct(200, start=4000)
    assert first_fire(tokens) is None
    # and the same line 42 times (252 tokens) is still short of MIN_SPAN
    assert first_fire(line * 42) is None


def test_a_refrain_three_times_and_long_ordinary_text_are_not_loops():
    refrain = distinct(80)  # three copies: 240 tokens
    assert first_fire(distinct(100, start=5000) + refrain * 3 + distinct(500, start=6000)) is None
    rng = np.random.default_rng(0)
    assert first_fire(rng.integers(0, 50_000, size=5000).tolist()) is None


def test_thresholds_are_checked():
    with pytest.raises(ValueError, match="max_period=0"):
        RepetitionDetector(max_period=0)
    with pytest.raises(ValueError, match="min_repeats=1"):
        RepetitionDetector(min_repeats=1)
    with pytest.raises(ValueError, match="min_span=1"):
        RepetitionDetector(min_span=1)
    # period 2 needs max(5, 3 * 2) = 6 tokens; period 3 is beyond max_period
    # the smallest values allowed
    tightest = RepetitionDetector(max_period=1, min_repeats=2, min_span=2)
    assert [tightest.push(t) for t in [5, 6, 6]] == [None, None, Loop(period=1, span=2)]
    small = RepetitionDetector(max_period=2, min_repeats=3, min_span=5)
    assert [small.push(t) for t in [1, 2, 1, 2, 1]] == [None] * 5
    assert small.push(2) == Loop(period=2, span=6)
    assert small.loop == Loop(period=2, span=6) and small.loop.repeats == 3.0
    three = RepetitionDetector(max_period=2, min_repeats=3, min_span=5)
    assert not any(three.push(t) for t in [1, 2, 3] * 10)


# --- the finish reason everywhere ----------------------------------------------------------------
def test_repetition_ranks_below_what_the_step_produced_and_above_the_budget():
    assert decide_finish_reason({"repetition", "length"}) == "repetition"
    assert decide_finish_reason({"repetition", "cancelled"}) == "repetition"
    assert decide_finish_reason({"repetition", "grammar_complete"}) == "grammar_complete"
    assert decide_finish_reason({"repetition", "stop_sequence"}) == "stop_sequence"
    assert decide_finish_reason({"repetition", "stop"}) == "stop"


def test_the_server_sends_every_finish_reason_as_one_openai_clients_accept():
    assert set(OPENAI_FINISH_REASON) == set(FinishReason)
    # a loop the engine ended is a finished answer to a client, not one to continue ("length")
    assert openai_finish_reason(FinishReason.REPETITION) == "stop"


# --- in the generation loop ----------------------------------------------------------------------
@pytest.fixture
def _fake_detokenizer(monkeypatch):
    use_fake_detokenizer(monkeypatch)


LOOP = ids("Hello", " world", "!")  # period 3: fires at token 256 = 85 copies + "Hello"
N_PROMPT_HELLO = 2  # "Hello" -> [BOS, Hello]


def run(lm, **request):
    request.setdefault("prompt", "Hello")
    return list(generate(lm, GenerationRequest(**request)))


@pytest.mark.usefixtures("_fake_detokenizer")
@pytest.mark.parametrize("speculative", [None, False])
def test_a_looping_reply_ends_with_repetition_and_keeps_what_it_wrote(speculative):
    lm = fake_lm(script_tokens(N_PROMPT_HELLO, LOOP * 200), n_ctx=1024)
    events = run(lm, overrides={"max_new_tokens": 600}, speculative=speculative)
    done = events[-1]
    assert isinstance(done, Finished) and done.finish_reason == "repetition"
    assert done.text == "Hello world!" * 85 + "Hello"
    assert "".join(e.text for e in events if isinstance(e, TextDelta)) == done.text
    assert done.token_ids == tuple((LOOP * 86)[:256])
    assert sum(isinstance(e, TokenSampled) for e in events) == 256
    assert done.usage.completion_tokens == 256
    assert done.preset["values"]["stop_on_repetition"] is True
    assert done.preset["sources"]["stop_on_repetition"] == "default"


@pytest.mark.usefixtures("_fake_detokenizer")
def test_the_preset_turns_the_stop_off():
    lm = fake_lm(script_tokens(N_PROMPT_HELLO, LOOP * 200), n_ctx=1024)
    done = run(lm, overrides={"max_new_tokens": 300, "stop_on_repetition": False})[-1]
    assert (done.finish_reason, len(done.token_ids)) == ("length", 300)
    assert done.preset["sources"]["stop_on_repetition"] == "override"


@pytest.mark.usefixtures("_fake_detokenizer")
def test_chat_requests_stop_a_loop_too():
    # BOS <|im_start|> user \n Hello <|im_end|> \n <|im_start|> assistant \n: 10 tokens
    lm = fake_lm(script_tokens(10, LOOP * 200), n_ctx=1024)
    done = run(lm, prompt=None, messages=[{"role": "user", "content": "Hello"}])[-1]
    assert len(done.prompt_ids) == 10
    assert (done.finish_reason, len(done.token_ids)) == ("repetition", 256)


@pytest.mark.usefixtures("_fake_detokenizer")
def test_a_reply_that_ends_before_the_loop_counts_ends_as_usual():
    lm = fake_lm(script_tokens(N_PROMPT_HELLO, LOOP * 85, after=EOS), n_ctx=1024)
    done = run(lm)[-1]  # 255 looping tokens, then end of turn
    assert (done.finish_reason, len(done.token_ids)) == ("stop", 255)


# --- base models ---------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("metadata", "base"),
    [
        ({}, True),
        ({"general.name": "gemma-3-270m"}, True),
        ({"general.name": "Smith 1B", "general.finetune": "chatty"}, True),  # whole words only
        ({"tokenizer.chat_template": "   "}, True),  # blank: the loader gives it a fallback too
        ({"tokenizer.chat_template": "{{ messages }}"}, False),
        ({"tokenizer.chat_template": "{{ messages }}", "general.name": "Qwen2.5 1.5B"}, False),
        ({"general.name": "gemma-3-270m-it"}, False),
        ({"general.name": "SmolLM2 135M Instruct"}, False),
        ({"general.finetune": "Chat"}, False),
        ({"general.basename": "llama", "general.finetune": "sft_v2"}, False),
        ({"general.name": 7}, True),  # not text: says nothing
    ],
)
def test_a_base_model_has_no_template_and_no_instruct_marker(metadata, base):
    assert is_base_model(metadata) is base


def test_the_library_summary_says_base_model(tmp_path):
    from tiny_models import write_tiny_model

    chat = write_tiny_model(tmp_path / "chat.gguf", "llama")  # SmolLM2's ChatML template
    base = write_tiny_model(tmp_path / "base.gguf", "llama", omit_keys=("tokenizer.chat_template",))
    assert summarize_model_file(chat).base_model is False
    summary = summarize_model_file(base)
    assert summary.base_model is True and summary.has_chat_template is False


# --- receipts and replay -------------------------------------------------------------------------
def _record(lm, request):
    import json

    from engine.receipt import build_receipt

    events = list(generate(lm, request))
    tokens = [
        {"index": e.index, "token_id": e.token_id, "text": e.text, "logprob": e.logprob, "top": []}
        for e in events
        if isinstance(e, TokenSampled)
    ]
    receipt = json.loads(json.dumps(build_receipt(lm, request, events[-1], "5a" * 32)))
    return receipt, tokens, events[-1]


@pytest.mark.usefixtures("_fake_detokenizer")
@pytest.mark.parametrize("stop_on_repetition", [True, False])
def test_a_reply_the_loop_stop_ended_replays_exactly_and_so_does_one_without(stop_on_repetition):
    from engine.receipt import replay

    def make():
        return fake_lm(script_tokens(N_PROMPT_HELLO, LOOP * 200), n_ctx=1024)

    request = GenerationRequest(
        prompt="Hello", overrides={"max_new_tokens": 300, "stop_on_repetition": stop_on_repetition}
    )
    receipt, tokens, done = _record(make(), request)
    expected = ("repetition", 256) if stop_on_repetition else ("length", 300)
    assert (receipt["output"]["finish_reason"], receipt["output"]["n_tokens"]) == expected
    assert receipt["preset"]["values"]["stop_on_repetition"] is stop_on_repetition
    report = replay(make(), receipt, tokens, "5a" * 32)
    assert report.identical and report.differences == (), report
    assert report.replayed_tokens == expected[1]
