"""Replay end to end in the fast tier: replies made by the real generation loop on a scripted
model (tests/fake_model.py: logits are a pure function of the token prefix, so a run is exactly
repeatable), recorded with build_receipt, stored as JSON (as the app stores and exports them) and
replayed with engine.receipt.replay.

Every kind of reply the app records replays: the default preset (sampled, a seed the engine
picked, max_new_tokens None: no cap), a reply that filled the context window, a cancelled one (also
before its first token), one that failed midway, JSON mode; and what a replay reports when it does
not reproduce (a changed seed, an edited output, another model, a smaller context, a stop)."""

import json
from types import SimpleNamespace

import numpy as np
import pytest

import engine.constrained
from engine.cancel import CancelToken
from engine.errors import ContextOverflowError
from engine.events import Finished, TokenSampled
from engine.generate import generate
from engine.receipt import ReceiptError, build_receipt, replay
from engine.types import GenerationRequest
from tests.fake_model import (
    BOS,
    EOS,
    IM_END,
    IM_START,
    VOCAB_SIZE,
    CancelAfter,
    fake_lm,
    ids,
    one_hot,
    script_tokens,
    use_fake_detokenizer,
)

SHA = "5a" * 32
MESSAGES = ({"role": "user", "content": "Hello"},)


@pytest.fixture(autouse=True)
def _fake_detokenizer(monkeypatch):
    use_fake_detokenizer(monkeypatch)


def wandering(ends_at: int = 14):
    """Logits that spread over the ordinary pieces (a sampled reply varies with its seed), then
    end-of-sequence once the prefix is `ends_at` tokens long. Specials and reasoning markers are
    left out: the reply is plain answer text."""

    def logits_for(prefix):
        if len(prefix) >= ends_at:
            return one_hot(EOS)
        rng = np.random.default_rng([len(prefix), *prefix])
        logits = rng.normal(0.0, 1.0, VOCAB_SIZE).astype(np.float32)
        logits[[BOS, EOS, IM_END, IM_START, *ids("<think>", "</think>")]] = -30.0
        return logits

    return logits_for


endless = wandering(10**9)  # a model that never ends a reply by itself


def record(lm, request, cancel=None):
    """Run `request` as the app does and keep what the store keeps: the receipt (through JSON)
    and the token records."""
    events = list(generate(lm, request, cancel))
    done = events[-1]
    assert isinstance(done, Finished)
    receipt = json.loads(json.dumps(build_receipt(lm, request, done, SHA)))
    tokens = [
        {
            "index": e.index,
            "token_id": e.token_id,
            "text": e.text,
            "logprob": e.logprob,
            "top": [{"token_id": a.token_id, "text": a.text, "logprob": a.logprob} for a in e.top],
        }
        for e in events
        if isinstance(e, TokenSampled)
    ]
    return receipt, tokens, done


def chat(**kwargs):
    return GenerationRequest(messages=MESSAGES, top_logprobs=5, **kwargs)


def run_until_tokens(lm, request, n):
    """Generate and press Stop once `n` tokens were sampled -> the Finished event and receipt."""
    cancel = CancelToken()
    events = []
    for event in generate(lm, request, cancel):
        events.append(event)
        if isinstance(event, TokenSampled) and event.index + 1 == n:
            cancel.cancel()
    done = events[-1]
    return json.loads(json.dumps(build_receipt(lm, request, done, SHA))), done


# --- the default path -------------------------------------------------------------------------
def test_a_reply_with_the_default_preset_replays_exactly():
    # No max_new_tokens, no seed, nothing set: what a new user's first reply records. Issue 31:
    # "Replay failed: ... int() argument must be ... not 'NoneType'".
    lm = fake_lm(wandering(), n_ctx=64)
    receipt, tokens, done = record(lm, chat())
    values = receipt["preset"]["values"]
    assert values["max_new_tokens"] is None and receipt["preset"]["sources"]["max_new_tokens"]
    assert values["do_sample"] is True and isinstance(receipt["preset"]["seed_used"], int)
    assert receipt["output"]["finish_reason"] == "stop" and len(done.token_ids) >= 3
    report = replay(fake_lm(wandering(), n_ctx=64), receipt, tokens, SHA)
    assert report.identical and report.divergence is None and report.differences == ()
    assert report.replayed_tokens == report.original_tokens == len(done.token_ids)
    assert report.replay_text == done.text and not report.stopped


def test_an_unbounded_reply_that_filled_the_context_replays_exactly():
    lm = fake_lm(endless, n_ctx=24)
    receipt, tokens, done = record(lm, chat(overrides={"max_new_tokens": None}))
    n_prompt = receipt["prompt"]["n_tokens"]
    assert receipt["output"]["finish_reason"] == "length"
    assert len(done.token_ids) == 24 - n_prompt  # every position the window had
    report = replay(fake_lm(endless, n_ctx=24), receipt, tokens, SHA)
    assert report.identical and report.differences == (), report
    assert report.replayed_tokens == 24 - n_prompt


def test_a_reply_cut_by_its_cap_replays_exactly():
    lm = fake_lm(endless, n_ctx=64)
    receipt, tokens, done = record(lm, chat(overrides={"max_new_tokens": 6, "seed": 3}))
    assert receipt["output"]["finish_reason"] == "length" and len(done.token_ids) == 6
    report = replay(fake_lm(endless, n_ctx=64), receipt, tokens, SHA)
    assert report.identical and report.replayed_tokens == 6 and report.differences == ()


def test_a_greedy_reply_replays_exactly():
    lm = fake_lm(wandering(), n_ctx=64)
    receipt, tokens, done = record(lm, chat(overrides={"do_sample": False}))
    assert receipt["preset"]["seed_used"] is None
    report = replay(fake_lm(wandering(), n_ctx=64), receipt, tokens, SHA)
    assert report.identical and report.replayed_tokens == len(done.token_ids) > 0


def test_a_raw_prompt_reply_with_a_stop_string_replays_exactly():
    script = ids("Hello", " world", "!", " How", " are", " you", "?")
    lm = fake_lm(script_tokens(2, script))
    request = GenerationRequest(prompt="Hello", overrides={"stop": [" How"]})
    receipt, tokens, done = record(lm, request)
    assert receipt["output"]["finish_reason"] == "stop_sequence"
    report = replay(fake_lm(script_tokens(2, script)), receipt, tokens, SHA)
    assert report.identical and report.replayed_tokens == len(done.token_ids) == 4


# --- replies that did not end by themselves ---------------------------------------------------
def test_a_cancelled_reply_replays_exactly_as_far_as_it_went():
    lm = fake_lm(endless, n_ctx=64)
    receipt, done = run_until_tokens(lm, chat(), 4)
    assert receipt["output"]["finish_reason"] == "cancelled"
    assert receipt["output"]["n_tokens"] == 4
    report = replay(fake_lm(endless, n_ctx=64), receipt, [], SHA)
    # the replay asks for 4 tokens (it would go on): matching so far is reproducing it
    assert report.identical and report.replayed_tokens == 4 and report.divergence is None


def test_a_reply_cancelled_before_its_first_token_replays():
    lm = fake_lm(endless, n_ctx=64)
    cancel = CancelToken()
    cancel.cancel()
    receipt, tokens, done = record(lm, chat(), cancel)
    assert receipt["output"] == {"token_ids": [], "n_tokens": 0, "finish_reason": "cancelled"}
    report = replay(fake_lm(endless, n_ctx=64), receipt, tokens, SHA)
    assert report.identical and report.original_tokens == 0 and report.divergence is None


def test_an_errored_original_is_compared_only_as_far_as_it_got():
    # A reply that failed midway (finish_reason "error") kept its tokens; the model did not
    # choose to end there, so the replay going on is not a difference.
    failing = fake_lm(endless, n_ctx=64)
    forwards = []

    def fail_on_fifth(call):
        forwards.append(call)
        if len(forwards) == 5:
            raise RuntimeError("the kernel crashed")

    failing.model.on_forward = fail_on_fifth
    receipt, tokens, done = record(failing, chat(overrides={"seed": 11}))
    assert receipt["output"]["finish_reason"] == "error" and done.error
    n = receipt["output"]["n_tokens"]
    assert n >= 2
    report = replay(fake_lm(endless, n_ctx=64), receipt, tokens, SHA)
    assert report.identical and report.replayed_tokens == n and report.divergence is None


def test_a_json_mode_reply_replays_exactly(monkeypatch):
    schemas = []

    class Constraint:
        """Allows exactly one token per step; complete after the script (a JSON value)."""

        def __init__(self, script):
            self.script, self.accepted = list(script), []

        def __call__(self, tokens, logits):
            mask = np.full_like(logits, -np.inf)
            mask[self.script[len(self.accepted)]] = 0.0
            return mask

        def accept(self, token):
            self.accepted.append(token)

        @property
        def is_complete(self):
            return len(self.accepted) == len(self.script)

    def make(tokenizer, mode, schema):
        schemas.append((str(mode), schema))
        return Constraint(ids("x", "y", "z"))

    monkeypatch.setattr(engine.constrained, "make_json_constraint", make)
    schema = {"type": "string"}
    request = chat(json_mode="schema", json_schema=json.dumps(schema))
    receipt, tokens, done = record(fake_lm(endless, n_ctx=64), request)
    assert receipt["output"]["finish_reason"] == "grammar_complete"
    assert (receipt["json_mode"], receipt["json_schema"]) == ("schema", schema)
    report = replay(fake_lm(endless, n_ctx=64), receipt, tokens, SHA)
    assert report.identical and report.replayed_tokens == 3 and report.replay_text == "xyz"
    assert schemas == [("schema", json.dumps(schema)), ("schema", schema)]


# --- replays that do not reproduce -------------------------------------------------------------
def test_another_seed_diverges_where_a_direct_run_with_it_differs():
    lm = fake_lm(wandering(30), n_ctx=64)
    receipt, tokens, done = record(lm, chat(overrides={"seed": 1}))
    original = receipt["output"]["token_ids"]
    # the first seed whose own run differs from the original within it
    for seed in range(2, 50):
        other = list(generate(lm, chat(overrides={"seed": seed})))[-1].token_ids
        if list(other[: len(original)]) != original:
            break
    expected = next(i for i, (a, b) in enumerate(zip(original, other, strict=False)) if a != b)
    receipt["preset"]["seed_used"] = seed
    report = replay(fake_lm(wandering(30), n_ctx=64), receipt, tokens, SHA)
    assert not report.identical and report.divergence.index == expected
    d = report.divergence
    assert (d.original.token_id, d.replayed.token_id) == (original[expected], other[expected])
    assert d.original.logprob == tokens[expected]["logprob"]
    assert d.replayed.text == lm.tokenizer.piece(other[expected])
    assert d.same_distribution is True  # the model saw the same thing; the sampler chose
    assert report.replayed_tokens == expected + 1  # stopped at the divergence
    assert report.differences == ("the receipt's preset was changed after it was recorded",)


def test_an_edited_output_diverges_at_the_edit_and_says_it_was_edited():
    lm = fake_lm(wandering(), n_ctx=64)
    receipt, tokens, done = record(lm, chat(overrides={"seed": 5}))
    real = receipt["output"]["token_ids"][1]
    edited = ids("x")[0] if real != ids("x")[0] else ids("y")[0]
    receipt["output"]["token_ids"][1] = edited
    report = replay(fake_lm(wandering(), n_ctx=64), receipt, tokens, SHA)
    d = report.divergence
    assert not report.identical and d.index == 1 and report.replayed_tokens == 2
    assert d.original.token_id == edited and d.original.text == lm.tokenizer.piece(edited)
    assert d.original.logprob is None  # the stored record is of another token
    assert d.replayed.token_id == real and d.replayed_logprob_in_original == tokens[1]["logprob"]
    assert report.differences == ("the receipt's output was changed after it was recorded",)


def test_a_model_that_goes_on_past_the_original_end_diverges_there():
    script = ids("Hello", " world", "!")
    receipt, tokens, done = record(
        fake_lm(script_tokens(2, script)), GenerationRequest(prompt="Hello")
    )
    longer = fake_lm(script_tokens(2, [*script, *ids(" How", " are")]))
    report = replay(longer, receipt, tokens, "be" * 32)
    d = report.divergence
    assert not report.identical and d.index == 3 and d.original is None
    assert d.replayed.token_id == ids(" How")[0] and report.replayed_tokens == 4
    assert report.differences[0].startswith("model file: ")


def test_a_model_that_ends_before_the_original_diverges_where_it_ended():
    script = ids("Hello", " world", "!")
    receipt, tokens, done = record(
        fake_lm(script_tokens(2, script)), GenerationRequest(prompt="Hello")
    )
    report = replay(fake_lm(script_tokens(2, script[:1])), receipt, tokens, SHA)
    d = report.divergence
    assert not report.identical and d.index == 1 and d.replayed is None
    assert d.original.token_id == script[1] and d.original.text == " world"
    assert report.replayed_tokens == 1 and report.original_tokens == 3
    assert report.differences == ()


def test_a_smaller_context_window_is_named_with_where_the_replay_ended():
    lm = fake_lm(endless, n_ctx=64)
    receipt, tokens, done = record(lm, chat(overrides={"max_new_tokens": 20, "seed": 2}))
    n_prompt = receipt["prompt"]["n_tokens"]
    small = fake_lm(endless, n_ctx=n_prompt + 8)
    report = replay(small, receipt, tokens, SHA)
    assert not report.identical and report.divergence.index == 8
    assert report.divergence.replayed is None and report.replayed_tokens == 8
    assert report.differences == (
        f"context window: {n_prompt + 8} positions here leave room for 8 reply tokens after the "
        f"{n_prompt}-token prompt; the original reply has 20",
    )


def test_a_context_with_room_for_the_whole_reply_is_not_a_difference():
    lm = fake_lm(endless, n_ctx=64)
    receipt, tokens, done = record(lm, chat(overrides={"max_new_tokens": 8, "seed": 2}))
    n_prompt = receipt["prompt"]["n_tokens"]
    report = replay(fake_lm(endless, n_ctx=n_prompt + 8), receipt, tokens, SHA)
    assert report.identical and report.differences == ()


def test_a_stopped_replay_gives_no_verdict():
    lm = fake_lm(endless, n_ctx=64)
    receipt, tokens, done = record(lm, chat(overrides={"max_new_tokens": 12, "seed": 4}))
    receipt["json_schema"] = {"type": "object"}  # edited; unused with JSON mode off
    report = replay(fake_lm(endless, n_ctx=64), receipt, tokens, "be" * 32, CancelAfter(6))
    assert report.stopped and not report.identical and report.divergence is None
    assert 0 < report.replayed_tokens < report.original_tokens == 12
    assert len(report.differences) == 2  # the model file, and the edited preset section
    assert report.differences[0].startswith("model file: ")
    assert report.differences[1] == "the receipt's preset was changed after it was recorded"
    assert report.replay_text == "".join(t["text"] for t in tokens[: report.replayed_tokens])


def test_a_replay_that_fails_says_why():
    lm = fake_lm(endless, n_ctx=64)
    receipt, tokens, done = record(lm, chat(overrides={"max_new_tokens": 4, "seed": 4}))
    failing = fake_lm(endless, n_ctx=64)

    def crash(call):
        raise RuntimeError("out of memory in the kernel")

    failing.model.on_forward = crash
    with pytest.raises(ReceiptError, match="the replay failed: RuntimeError: out of memory"):
        replay(failing, receipt, tokens, SHA)


@pytest.mark.parametrize(
    "damage",
    [
        lambda r: r.pop("output"),
        lambda r: r["output"].pop("token_ids"),
        lambda r: r["output"].update(token_ids=None),
        lambda r: r["output"].update(token_ids=["seven"]),
    ],
)
def test_a_receipt_without_its_output_cannot_be_replayed(damage):
    lm = fake_lm(endless, n_ctx=64)
    receipt, tokens, done = record(lm, chat(overrides={"max_new_tokens": 2}))
    damage(receipt)
    with pytest.raises(ReceiptError, match="the receipt has no recorded output tokens"):
        replay(lm, receipt, tokens, SHA)


# --- the replay's own stream -------------------------------------------------------------------
def usage():
    return list(generate(fake_lm(script_tokens(2, [])), GenerationRequest(prompt="Hello")))[
        -1
    ].usage


def stream(token_ids, finish="stop", cancel_after=None):
    """A `run` for replay: `token_ids` as TokenSampled events then a Finished with `finish`
    (None: no Finished at all); the user presses Stop after `cancel_after` tokens."""
    asked = []

    def run(request, cancel):
        asked.append(request)
        for i, t in enumerate(token_ids):
            yield TokenSampled(i, t, f"<{t}>", -0.5)
            if cancel_after is not None and i + 1 == cancel_after:
                cancel.cancel()
        if finish is not None:
            text = "".join(f"<{t}>" for t in token_ids)
            yield Finished(finish, usage(), text, token_ids=tuple(token_ids))

    run.asked = asked
    return run


# a model object with no chat template that knows none of n_ctx, path, gguf (a stand-in for
# another engine's): replay asks only what it needs
BARE = SimpleNamespace(chat_template=None)


def scripted_receipt(token_ids, finish_reason):
    lm = fake_lm(script_tokens(2, ids("Hello", " world", "!")))
    receipt, tokens, done = record(lm, GenerationRequest(prompt="Hello"))
    receipt["output"] = {"token_ids": token_ids, "finish_reason": finish_reason}
    receipt.pop("checks")
    return receipt


@pytest.mark.parametrize(
    ("finish_reason", "asked"),
    [
        ("stop", 4),  # one past the original: does the replay end there too?
        ("length", 4),
        ("grammar_complete", 4),
        ("tool_calls", 4),
        ("stop_sequence", 4),
        ("cancelled", 3),  # stopped by the user: as far as it went, no further
        ("error", 3),  # failed midway: the same
    ],
)
def test_the_replay_asks_one_token_past_an_original_that_ended_by_itself(finish_reason, asked):
    run = stream([5, 6, 7], "length")
    report = replay(BARE, scripted_receipt([5, 6, 7], finish_reason), [], SHA, None, run)
    assert run.asked[0].overrides["max_new_tokens"] == asked
    assert report.identical and report.replayed_tokens == 3


def test_a_stream_without_its_finished_event_is_a_failed_replay():
    run = stream([5, 6, 7], finish=None)
    with pytest.raises(
        ReceiptError, match="^the replay failed: its stream ended without a Finished event$"
    ):
        replay(BARE, scripted_receipt([5, 6, 7], "stop"), [], SHA, None, run)


def test_a_stop_after_every_token_matched_but_before_the_end_gives_no_verdict():
    receipt = scripted_receipt([5, 6, 7], "stop")
    run = stream([5, 6, 7], "cancelled", cancel_after=3)
    report = replay(BARE, receipt, [], SHA, None, run)
    assert report.stopped is True and report.identical is False and report.divergence is None
    assert report.replayed_tokens == 3 and report.replay_text == "<5><6><7>"


def test_a_stop_pressed_after_the_replay_ended_keeps_its_verdict():
    receipt = scripted_receipt([5, 6, 7], "stop")
    report = replay(BARE, receipt, [], SHA, None, stream([5, 6, 7], "stop", 3))
    assert report.identical is True and report.stopped is False
    stopped_original = scripted_receipt([5, 6, 7], "cancelled")
    run = stream([5, 6, 7], "cancelled", cancel_after=3)
    report = replay(BARE, stopped_original, [], SHA, None, run)
    assert report.identical is True and report.stopped is False  # it went as far as the original


def test_a_stop_mid_replay_reports_what_was_replayed():
    receipt = scripted_receipt([5, 6, 7], "stop")
    report = replay(BARE, receipt, [], SHA, None, stream([5], "cancelled", 1))
    assert report.stopped is True and report.identical is False
    assert (report.replayed_tokens, report.original_tokens, report.replay_text) == (1, 3, "<5>")
    assert report.differences == ()


def test_a_replay_without_a_context_size_or_model_file_still_compares():
    receipt = scripted_receipt([5, 6], "stop")
    report = replay(BARE, receipt, [], SHA, None, stream([5, 9], "stop"))
    assert not report.identical and report.divergence.index == 1
    assert report.divergence.original.text == "<6>"  # no vocabulary: the id is shown


def test_a_preset_field_the_receipt_lacks_is_named_as_resolved_by_the_replay():
    # A receipt from an engine version before a preset field existed: the replay resolves it
    # from today's defaults, and says so.
    lm = fake_lm(wandering(), n_ctx=64)
    receipt, tokens, done = record(lm, chat(overrides={"seed": 8}))
    del receipt["preset"]["values"]["repeat_last_n"]
    report = replay(fake_lm(wandering(), n_ctx=64), receipt, tokens, SHA)
    assert "preset repeat_last_n: None in the receipt, 64 in the replay" in report.differences


def test_a_loop_recorded_before_the_repetition_stop_existed_replays_to_its_end():
    # An older receipt has no stop_on_repetition: that engine let a loop run to its cap, and
    # today's default (the stop on) would end the replay at the 256th repeated token.
    def looping(prefix):
        return one_hot(ids("a")[0])

    lm = fake_lm(looping, n_ctx=512)
    receipt, tokens, done = record(lm, chat(overrides={"max_new_tokens": 300, "seed": 3}))
    assert done.finish_reason == "repetition"  # today's engine stops the loop itself
    lm_without = fake_lm(looping, n_ctx=512)
    old_request = chat(overrides={"max_new_tokens": 300, "seed": 3, "stop_on_repetition": False})
    receipt, tokens, done = record(lm_without, old_request)
    assert done.finish_reason == "length" and len(tokens) == 300
    del receipt["preset"]["values"]["stop_on_repetition"]
    report = replay(fake_lm(looping, n_ctx=512), receipt, tokens, SHA)
    assert report.identical


def test_a_prompt_longer_than_the_context_here_is_refused_by_name():
    lm = fake_lm(endless, n_ctx=64)
    receipt, tokens, done = record(lm, chat(overrides={"max_new_tokens": 3, "seed": 1}))
    n_prompt = receipt["prompt"]["n_tokens"]
    with pytest.raises(ContextOverflowError, match=f"The prompt takes {n_prompt} positions"):
        replay(fake_lm(endless, n_ctx=n_prompt), receipt, tokens, SHA)
