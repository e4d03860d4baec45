"""The generation loop on scripted logits: stops, hold-back, precedence, cancel, usage, ceilings,
and the prefix-cache / JSON / speculative seams."""

import numpy as np
import pytest
from fake_model import (
    BOS,
    EOS,
    IM_END,
    VOCAB_SIZE,
    FakeTokenizer,
    fake_lm,
    ids,
    one_hot,
    script_steps,
    script_tokens,
    token_id,
    use_fake_detokenizer,
)

import engine.constrained
from engine.cancel import CancelToken
from engine.errors import ConfigValidationError, ContextOverflowError, MemoryBudgetError
from engine.events import Finished, ReasoningDelta, TextDelta, TokenSampled
from engine.generate import PREFILL_CHUNK, GenerationRequest, PrefixHit, generate
from engine.kv_cache import KVCache

PROMPT = "Hello"  # -> [BOS, Hello]: 2 tokens
N_PROMPT = 2


@pytest.fixture(autouse=True)
def _fake_detokenizer(monkeypatch):
    use_fake_detokenizer(monkeypatch)


def run(lm, cancel=None, **request):
    request.setdefault("prompt", PROMPT)
    return list(generate(lm, GenerationRequest(**request), cancel))


def text_of(events):
    return "".join(e.text for e in events if isinstance(e, TextDelta))


def finished(events) -> Finished:
    assert isinstance(events[-1], Finished)
    assert sum(isinstance(e, Finished) for e in events) == 1
    return events[-1]


# --- end of generation ---------------------------------------------------------------------------
@pytest.mark.parametrize("eog", [EOS, IM_END])
def test_every_end_of_generation_id_stops_and_is_not_emitted(eog):
    lm = fake_lm(script_tokens(N_PROMPT, ids("Hello", " world"), after=eog))
    events = run(lm)
    done = finished(events)
    assert done.finish_reason == "stop"
    assert done.text == text_of(events) == "Hello world"
    assert done.token_ids == tuple(ids("Hello", " world"))
    assert [e.token_id for e in events if isinstance(e, TokenSampled)] == ids("Hello", " world")
    assert done.usage.completion_tokens == 3  # the end-of-generation token was sampled too


def test_generation_config_eos_ids_also_stop(tmp_path):
    (tmp_path / "generation_config.json").write_text(f'{{"eos_token_id": [{token_id("!")}]}}')
    model_path = tmp_path / "m.gguf"
    model_path.write_bytes(b"")
    lm = fake_lm(script_tokens(N_PROMPT, ids("Hello", "!", " world")), path=model_path)
    done = finished(run(lm))
    assert (done.finish_reason, done.text) == ("stop", "Hello")


# --- stop strings --------------------------------------------------------------------------------
def test_stop_string_across_tokens_ends_before_it():
    lm = fake_lm(script_tokens(N_PROMPT, ids("Hello", " ", "E", "N", "D", "!", " world")))
    events = run(lm, overrides={"stop": [" END"]})
    done = finished(events)
    assert done.finish_reason == "stop_sequence"
    assert done.text == text_of(events) == "Hello"
    assert len(lm.model.calls) == 1 + 4  # prefill + one forward per token until the match


def test_text_is_released_the_moment_a_stop_match_is_disproved():
    lm = fake_lm(script_tokens(N_PROMPT, ids("Hello", " ", "E", "x", "y")))
    events = run(lm, overrides={"stop": [" END"]})
    deltas = []
    for e in events:
        if isinstance(e, TokenSampled):
            deltas.append([])
        elif isinstance(e, TextDelta):
            deltas[-1].append(e.text)
    # "Hello" at once; " " and "E" held; released with "x" which disproves " END"
    assert deltas == [["Hello"], [], [], [" Ex"], ["y"]]


def test_no_match_output_is_identical_to_a_run_without_stop_strings():
    script = ids("Hello", " ", "E", "N", " world", " ", "E", "!")
    plain = run(fake_lm(script_tokens(N_PROMPT, script)))
    stopped = run(fake_lm(script_tokens(N_PROMPT, script)), overrides={"stop": [" END", "EN!"]})
    assert text_of(plain) == text_of(stopped) == finished(stopped).text
    assert finished(plain).token_ids == finished(stopped).token_ids
    assert finished(stopped).finish_reason == "stop"


def test_held_text_is_released_when_the_length_limit_ends_generation():
    lm = fake_lm(script_tokens(N_PROMPT, ids("Hello", " ", "E")))
    done = finished(run(lm, overrides={"stop": [" END"], "max_new_tokens": 3}))
    assert (done.finish_reason, done.text) == ("length", "Hello E")


# --- finish reasons and precedence ---------------------------------------------------------------
def test_length_after_max_new_tokens():
    lm = fake_lm(script_tokens(N_PROMPT, ids("a", "b", "c", "x", "y")))
    done = finished(run(lm, overrides={"max_new_tokens": 3}))
    assert (done.finish_reason, done.text, done.usage.completion_tokens) == ("length", "abc", 3)


def test_stop_sequence_beats_length_on_the_same_step():
    lm = fake_lm(script_tokens(N_PROMPT, ids("a", "b", "c", "x")))
    done = finished(run(lm, overrides={"max_new_tokens": 3, "stop": ["bc"]}))
    assert (done.finish_reason, done.text) == ("stop_sequence", "a")


def test_end_of_generation_on_the_last_allowed_token_is_stop():
    lm = fake_lm(script_tokens(N_PROMPT, ids("a", "b"), after=EOS))
    done = finished(run(lm, overrides={"max_new_tokens": 3}))
    assert done.finish_reason == "stop"


def test_context_limit_ends_with_length_when_max_new_tokens_is_unset():
    lm = fake_lm(script_tokens(N_PROMPT, ids("a") * 20), n_ctx=8)
    done = finished(run(lm))
    assert done.finish_reason == "length"
    assert done.usage.completion_tokens == 6 and done.usage.context_used == 8
    assert lm.model.caches_created == [8]


# --- cancellation --------------------------------------------------------------------------------
def test_cancel_keeps_everything_emitted_and_reports_cancelled():
    lm = fake_lm(script_tokens(N_PROMPT, ids("Hello", " world", "!", " How")))
    cancel = CancelToken()
    events = []
    for event in generate(lm, GenerationRequest(prompt=PROMPT), cancel):
        events.append(event)
        if isinstance(event, TextDelta) and event.text == " world":
            cancel.cancel()
    done = finished(events)
    assert done.finish_reason == "cancelled"
    assert done.text == text_of(events) == "Hello world"
    assert done.token_ids == tuple(ids("Hello", " world"))


def test_cancel_before_start_runs_no_forward_pass():
    lm = fake_lm(script_tokens(N_PROMPT, ids("Hello")))
    cancel = CancelToken()
    cancel.cancel()
    done = finished(run(lm, cancel))
    assert (done.finish_reason, done.text, lm.model.calls) == ("cancelled", "", [])


def test_cancel_stops_a_slow_chat_template_render(monkeypatch):
    # The request's token reaches the template: Stop during a render that would take minutes
    # ends it (issue 17; before, rendering could not be cancelled at all).
    import threading

    from engine import chat_template
    from engine.chat_template import ChatTemplate

    # Without the loop-items cap the render runs until the 5 s deadline, far past the Stop at
    # 0.2 s; with it, the cap (~0.5 s in) raced the Stop on a busy machine.
    monkeypatch.setattr(chat_template, "MAX_RANGE_ITEMS", 10**12)

    endless = "{% for a in range(100000) %}{% for b in range(100000) %}{% endfor %}{% endfor %}"
    lm = fake_lm(script_tokens(N_PROMPT, ids("Hello")))
    lm.chat_template = ChatTemplate(endless, name="endless")
    cancel = CancelToken()
    threading.Timer(0.2, cancel.cancel).start()
    done = finished(run(lm, cancel, prompt=None, messages=[{"role": "user", "content": "hi"}]))
    assert (done.finish_reason, done.text, lm.model.calls) == ("cancelled", "", [])


def test_cancel_is_checked_between_prefill_chunks():
    long_prompt = [BOS] + ids("a") * 600
    lm = fake_lm(script_tokens(len(long_prompt), ids("b")), n_ctx=1024)
    cancel = CancelToken()
    lm.model.on_forward = lambda call: cancel.cancel()
    done = finished(run(lm, cancel, prompt=None, prompt_ids=long_prompt))
    assert done.finish_reason == "cancelled"
    assert [len(c.tokens) for c in lm.model.calls] == [PREFILL_CHUNK]


def test_prefill_runs_in_chunks():
    long_prompt = [BOS] + ids("a") * 600
    lm = fake_lm(script_tokens(len(long_prompt), ids("b")), n_ctx=1024)
    finished(run(lm, prompt=None, prompt_ids=long_prompt))
    assert [len(c.tokens) for c in lm.model.calls][:3] == [256, 256, 89]


def test_an_unset_cancel_token_changes_nothing():
    make = lambda: fake_lm(script_tokens(N_PROMPT, ids("Hello", " world", "!")))  # noqa: E731
    with_token, without = run(make(), CancelToken()), run(make(), None)
    strip = lambda evs: [e for e in evs if not isinstance(e, Finished)]  # noqa: E731
    assert strip(with_token) == strip(without)
    assert finished(with_token).finish_reason == finished(without).finish_reason == "stop"


# --- events and usage ----------------------------------------------------------------------------
def test_usage_counts_and_timings():
    lm = fake_lm(script_tokens(N_PROMPT, ids("Hello", " world")), n_ctx=50)
    usage = finished(run(lm)).usage
    assert (usage.prompt_tokens, usage.completion_tokens, usage.cached_tokens) == (2, 3, None)
    assert usage.ttft_ms >= usage.prefill_ms > 0
    assert usage.decode_ms >= 0 and usage.prompt_tok_s > 0
    assert (usage.context_used, usage.context_limit) == (5, 50)


def test_token_events_carry_logprobs_and_sorted_alternatives():
    probs = np.full(VOCAB_SIZE, 1e-9)
    probs[[token_id("a"), token_id("b"), token_id("c")]] = [0.6, 0.3, 0.1]
    step = np.log(probs / probs.sum()).astype(np.float32)
    lm = fake_lm(script_steps(N_PROMPT, [step]))
    events = run(lm, top_logprobs=3, overrides={"max_new_tokens": 1})
    (sampled,) = [e for e in events if isinstance(e, TokenSampled)]
    assert sampled.token_id == token_id("a") and sampled.logprob == pytest.approx(
        np.log(0.6), abs=1e-5
    )
    assert [a.token_id for a in sampled.top] == ids("a", "b", "c")
    assert [a.logprob for a in sampled.top] == pytest.approx(np.log([0.6, 0.3, 0.1]), abs=1e-5)
    assert [a.text for a in sampled.top] == ["a", "b", "c"]


def test_reasoning_deltas_are_split_from_the_answer():
    lm = fake_lm(script_tokens(N_PROMPT, ids("<think>", "thinking", "</think>", "Hello", " world")))
    events = run(lm)
    done = finished(events)
    assert (
        "".join(e.text for e in events if isinstance(e, ReasoningDelta))
        == done.reasoning
        == "thinking"
    )
    assert done.text == "Hello world"


def test_chat_messages_use_the_template_and_keep_one_bos():
    lm = fake_lm(script_tokens(0, []))
    lm.model.logits_for = lambda prefix: one_hot(EOS)
    run(lm, prompt=None, messages=[{"role": "user", "content": "Hello"}])
    fed = lm.model.calls[0].tokens
    assert fed[:2] == [BOS, token_id("<|im_start|>")] and fed.count(BOS) == 1
    assert fed[-1] == token_id("\n")
    double = fake_lm(script_tokens(0, [], after=EOS))
    run(double, prompt="<s>Hello")  # the text's own BOS plus the tokenizer's: one is dropped
    assert double.model.calls[0].tokens == [BOS, token_id("Hello")]


# --- seeds ---------------------------------------------------------------------------------------
def _noisy_steps(n):
    rng = np.random.default_rng(0)
    return [rng.standard_normal(VOCAB_SIZE).astype(np.float32) for _ in range(n)]


def _sampled_run(seed, **extra):
    eog_free = FakeTokenizer(eog_ids=())
    lm = fake_lm(script_steps(N_PROMPT, _noisy_steps(12)), tokenizer=eog_free)
    overrides = {
        "do_sample": True,
        "temperature": 1.0,
        "top_k": 0,
        "max_new_tokens": 12,
        "seed": seed,
    }
    return finished(run(lm, overrides=overrides, **extra))


def test_same_seed_same_tokens_and_the_used_seed_is_reported():
    a, b, c = _sampled_run(7), _sampled_run(7), _sampled_run(8)
    assert a.token_ids == b.token_ids != c.token_ids
    assert a.preset["seed_used"] == 7
    random = _sampled_run(None)
    assert isinstance(random.preset["seed_used"], int)
    assert _sampled_run(random.preset["seed_used"]).token_ids == random.token_ids


def test_greedy_ignores_the_seed():
    def make():
        return fake_lm(script_steps(N_PROMPT, _noisy_steps(6)), tokenizer=FakeTokenizer(eog_ids=()))

    a = finished(run(make(), overrides={"max_new_tokens": 6, "seed": 1}))
    b = finished(run(make(), overrides={"max_new_tokens": 6, "seed": 2}))
    assert a.token_ids == b.token_ids and a.preset["seed_used"] is None
    # greedy = argmax of each step's logits
    assert list(a.token_ids) == [int(np.argmax(step)) for step in _noisy_steps(6)]


# --- ceilings ------------------------------------------------------------------------------------
def test_prompt_plus_max_new_tokens_over_the_context_is_refused_before_allocation():
    lm = fake_lm(script_tokens(N_PROMPT, []), n_ctx=16)
    with pytest.raises(ContextOverflowError) as info:
        generate(lm, GenerationRequest(prompt=PROMPT, overrides={"max_new_tokens": 15}))
    assert "17" in str(info.value) and "16" in str(info.value)
    assert lm.model.calls == [] and lm.model.caches_created == []


def test_absurd_max_new_tokens_is_an_error_not_a_crash():
    lm = fake_lm(script_tokens(N_PROMPT, []), n_ctx=16)
    with pytest.raises(ConfigValidationError):
        generate(lm, GenerationRequest(prompt=PROMPT, overrides={"max_new_tokens": 10**40}))
    with pytest.raises(ContextOverflowError):
        generate(lm, GenerationRequest(prompt=PROMPT, overrides={"max_new_tokens": 2**31 - 1}))
    assert lm.model.caches_created == []


def test_kv_memory_budget_is_enforced_before_allocation():
    lm = fake_lm(script_tokens(N_PROMPT, []), n_ctx=64)
    need = KVCache.bytes_needed(lm.config, 10)
    with pytest.raises(MemoryBudgetError) as info:
        generate(
            lm,
            GenerationRequest(
                prompt=PROMPT, overrides={"max_new_tokens": 8}, kv_budget_bytes=need - 1
            ),
        )
    assert str(need) in str(info.value) and str(need - 1) in str(info.value)
    assert lm.model.caches_created == []
    finished(run(lm, overrides={"max_new_tokens": 8}, kv_budget_bytes=need))
    assert lm.model.caches_created == [10]


def test_prompt_filling_the_context_is_refused():
    lm = fake_lm(script_tokens(N_PROMPT, []), n_ctx=2)
    with pytest.raises(ContextOverflowError):
        generate(lm, GenerationRequest(prompt=PROMPT))


def test_invalid_request_fields_raise_up_front():
    lm = fake_lm(script_tokens(N_PROMPT, []))
    for bad in ({"top_logprobs": -1}, {"json_mode": "yaml"}, {"overrides": {"top_p": 2}}):
        with pytest.raises(ConfigValidationError):
            generate(lm, GenerationRequest(prompt=PROMPT, **bad))
    with pytest.raises(ConfigValidationError):
        generate(lm, GenerationRequest(prompt=PROMPT, messages=[{"role": "user", "content": "x"}]))


# --- errors after acceptance ---------------------------------------------------------------------
def test_an_exception_mid_generation_is_a_finished_error_keeping_the_text():
    script = script_tokens(N_PROMPT, ids("Hello", " world", "!"))

    def failing(prefix):
        if len(prefix) == N_PROMPT + 2:
            raise RuntimeError("kernel exploded")
        return script(prefix)

    done = finished(run(fake_lm(failing)))
    assert done.finish_reason == "error" and "kernel exploded" in done.error
    assert done.text == "Hello world"  # the forward for the third token failed


# --- JSON constraint seam ------------------------------------------------------------------------
class ScriptedConstraint:
    """Allows exactly one token per step; complete after the script."""

    def __init__(self, script):
        self.script, self.accepted = list(script), []

    def __call__(self, tokens, logits):
        allowed = self.script[len(self.accepted)]
        mask = np.full_like(logits, -np.inf)
        mask[allowed] = logits[allowed]
        return mask

    def accept(self, token):
        self.accepted.append(token)

    @property
    def is_complete(self):
        return len(self.accepted) == len(self.script)


def test_constraint_masks_and_reports_grammar_complete(monkeypatch):
    made = []
    monkeypatch.setattr(
        engine.constrained,
        "make_json_constraint",
        lambda tok, mode, schema: made.append(ScriptedConstraint(ids("x", "y"))) or made[-1],
    )
    lm = fake_lm(script_tokens(N_PROMPT, ids("a", "b", "c", "z")))
    done = finished(run(lm, json_mode="object"))
    assert (done.finish_reason, done.text) == ("grammar_complete", "xy")
    assert made[0].accepted == ids("x", "y")


# --- speculative seam ----------------------------------------------------------------------------
class OracleDrafter:
    """Drafts from a known continuation, optionally corrupting some positions."""

    def __init__(self, continuation, n_prompt, wrong_at=()):
        self.continuation, self.n_prompt, self.wrong_at = continuation, n_prompt, set(wrong_at)
        self.calls = 0

    def draft(self, tokens, max_tokens):
        self.calls += 1
        start = len(tokens) - self.n_prompt
        out = list(self.continuation[start : start + max_tokens])
        return [token_id("z") if start + i in self.wrong_at else t for i, t in enumerate(out)]


SPEC_SCRIPT = ids("Hello", " world", "!", " How", " are", " you", "?", "a", "b", "c")


@pytest.mark.parametrize("wrong_at", [(), (3,), (1, 4, 8)])
def test_speculative_greedy_output_equals_plain_decoding(wrong_at):
    plain_lm = fake_lm(script_tokens(N_PROMPT, SPEC_SCRIPT))
    plain = run(plain_lm, speculative=False)
    spec_lm = fake_lm(script_tokens(N_PROMPT, SPEC_SCRIPT))
    drafter = OracleDrafter(SPEC_SCRIPT + [EOS], N_PROMPT, wrong_at)
    spec = run(spec_lm, speculative=drafter)
    strip = lambda evs: [e for e in evs if not isinstance(e, Finished)]  # noqa: E731
    assert strip(spec) == strip(plain)
    a, b = finished(plain), finished(spec)
    assert (a.text, a.token_ids, a.finish_reason) == (b.text, b.token_ids, b.finish_reason)
    assert len(spec_lm.model.calls) < len(plain_lm.model.calls)
    assert b.usage.draft_tokens_accepted <= b.usage.draft_tokens_proposed
    if not wrong_at:
        assert b.usage.draft_tokens_accepted == b.usage.draft_tokens_proposed > 0


def test_speculative_seeded_sampling_equals_plain_sampling():
    steps = _noisy_steps(10)
    tok = FakeTokenizer(eog_ids=())
    overrides = {"do_sample": True, "top_k": 3, "max_new_tokens": 10, "seed": 11}
    plain = finished(
        run(fake_lm(script_steps(N_PROMPT, steps), tokenizer=tok), overrides=overrides)
    )
    drafter = OracleDrafter(list(plain.token_ids), N_PROMPT, wrong_at=(2, 6))
    spec = finished(
        run(
            fake_lm(script_steps(N_PROMPT, steps), tokenizer=tok),
            overrides=overrides,
            speculative=drafter,
        )
    )
    assert spec.token_ids == plain.token_ids


def test_stop_inside_a_verified_draft_leaves_a_consistent_cache():
    stored = []

    class Recorder:
        def lookup(self, lm, prompt_ids, min_capacity):
            return None

        def store(self, lm, token_ids, cache, next_logits):
            stored.append((list(token_ids), list(cache.tokens), cache.n_tokens))

    lm = fake_lm(script_tokens(N_PROMPT, SPEC_SCRIPT))
    done = finished(
        run(
            lm,
            overrides={"stop": [" are"]},
            speculative=OracleDrafter(SPEC_SCRIPT, N_PROMPT),
            prefix_cache=Recorder(),
        )
    )
    assert (done.finish_reason, done.text) == ("stop_sequence", "Hello world! How")
    for token_ids, cache_tokens, n in stored:
        assert token_ids == cache_tokens and n == len(token_ids)
    # the stored state is the prompt + generated tokens whose KV rows exist (the last sampled token,
    # " are", is included when it came from a verified draft row)
    generated = [BOS, token_id("Hello")] + ids("Hello", " world", "!", " How")
    assert stored[-1][0] in (generated, generated + ids(" are"))


# --- prefix cache seam ---------------------------------------------------------------------------
class DictPrefixCache:
    """Exact-prompt reuse, enough to exercise the seam."""

    def __init__(self):
        self.entries = {}

    def lookup(self, lm, prompt_ids, min_capacity):
        entry = self.entries.get(tuple(prompt_ids))
        if entry is None:
            return None
        cache, logits = entry
        return PrefixHit(cache.clone(), cache.n_tokens, logits.copy())

    def store(self, lm, token_ids, cache, next_logits):
        if next_logits is not None:
            self.entries[tuple(token_ids)] = (cache.clone(), next_logits.copy())


def test_prefix_cache_full_hit_needs_no_prompt_forward_and_gives_the_same_output():
    prefix_cache = DictPrefixCache()
    lm = fake_lm(script_tokens(N_PROMPT, ids("Hello", " world")))
    first = finished(run(lm, prefix_cache=prefix_cache))
    calls_first = len(lm.model.calls)
    second = finished(run(lm, prefix_cache=prefix_cache))
    assert first.usage.cached_tokens == 0 and second.usage.cached_tokens == N_PROMPT
    assert second.text == first.text and second.token_ids == first.token_ids
    assert len(lm.model.calls) - calls_first == calls_first - 1  # the prefill forward was skipped


# --- the real SmolLM2 (ChatML): end-of-turn stopping ---------------------------------------------
@pytest.fixture
def real_detokenizer(monkeypatch):
    """Undo the module's autouse fake: real models stream through engine.detokenizer."""
    import engine.generate
    from engine.detokenizer import StreamingDetokenizer

    monkeypatch.setattr(engine.generate, "new_detokenizer", StreamingDetokenizer)


def _chat_prefix(lm):
    # The answer is forced up to its last word, so the model's next choices (" Paris", ".", then
    # end of turn) have wide margins whatever kernel precision is in use.
    messages = [{"role": "user", "content": "What is the capital of France?"}]
    return (
        lm.chat_template.render(messages, add_generation_prompt=True) + "The capital of France is"
    )


@pytest.mark.slow
def test_smollm2_chat_answer_stops_at_end_of_turn(smollm2, real_detokenizer):
    prompt = _chat_prefix(smollm2)
    assert "<|im_start|>assistant\n" in prompt
    events = list(
        generate(
            smollm2,
            GenerationRequest(prompt=prompt, overrides={"max_new_tokens": 8}, top_logprobs=2),
        )
    )
    done = finished(events)
    im_end = smollm2.tokenizer.token_id("<|im_end|>")
    assert im_end in smollm2.tokenizer.eog_ids
    assert done.finish_reason == "stop"
    assert done.text == text_of(events) == " Paris."
    assert im_end not in done.token_ids and "<|im_end|>" not in done.text
    assert done.usage.completion_tokens == len(done.token_ids) + 1  # + the end-of-turn token
    assert done.usage.prompt_tokens == len(smollm2.tokenizer.encode(prompt))
    sampled = [e for e in events if isinstance(e, TokenSampled)]
    assert [e.token_id for e in sampled] == list(done.token_ids)
    assert all(e.top[0].token_id == e.token_id for e in sampled)  # greedy = the top alternative


@pytest.mark.slow
def test_smollm2_stop_string_and_prefix_reuse(smollm2, real_detokenizer):
    from engine.prefix_cache import PrefixCache

    prompt = _chat_prefix(smollm2)
    reuse = PrefixCache()
    first = finished(
        list(
            generate(
                smollm2,
                GenerationRequest(
                    prompt=prompt,
                    prefix_cache=reuse,
                    overrides={"max_new_tokens": 8, "stop": ["."]},
                ),
            )
        )
    )
    assert (first.finish_reason, first.text) == ("stop_sequence", " Paris")
    assert first.usage.cached_tokens == 0
    second = finished(
        list(
            generate(
                smollm2,
                GenerationRequest(
                    prompt=prompt, prefix_cache=reuse, overrides={"max_new_tokens": 8}
                ),
            )
        )
    )
    assert second.usage.cached_tokens == second.usage.prompt_tokens
    assert (second.finish_reason, second.text) == ("stop", " Paris.")


# --- properties over random scripts --------------------------------------------------------------
from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

_TEXT_PIECES = ["Hello", " world", "!", " ", "E", "N", "D", "a", "b", "c", "ab", "x", "é"]


@settings(max_examples=60, deadline=None)
@given(
    script=st.lists(st.sampled_from(_TEXT_PIECES), min_size=1, max_size=12),
    stops=st.lists(st.text(alphabet="abcEND !é", min_size=1, max_size=4), min_size=1, max_size=3),
)
def test_stop_strings_cut_exactly_at_the_first_match_or_change_nothing(script, stops):
    with pytest.MonkeyPatch.context() as patch:  # hypothesis cannot use function-scoped fixtures
        use_fake_detokenizer(patch)
        plain = finished(run(fake_lm(script_tokens(N_PROMPT, ids(*script)))))
        events = run(fake_lm(script_tokens(N_PROMPT, ids(*script))), overrides={"stop": stops})
    done = finished(events)
    full = "".join(script)
    hits = [full.find(s) for s in stops if s in full]
    assert text_of(events) == done.text
    if hits:
        assert done.finish_reason == "stop_sequence" and done.text == full[: min(hits)]
    else:
        assert done.finish_reason == plain.finish_reason == "stop"
        assert done.text == plain.text == full


def test_cancel_from_another_thread_while_decoding():
    import threading
    import time as _time

    lm = fake_lm(script_tokens(N_PROMPT, ids("a") * 200), n_ctx=512)
    slow_forward = lm.model.forward

    def forward(*args, **kwargs):
        _time.sleep(0.002)
        return slow_forward(*args, **kwargs)

    lm.model.forward = forward
    cancel = CancelToken()
    timer = threading.Timer(0.05, cancel.cancel)
    timer.start()
    events = run(lm, cancel, speculative=False)
    timer.join()
    done = finished(events)
    assert done.finish_reason == "cancelled"
    assert 0 < len(done.token_ids) < 200
    assert done.text == text_of(events) == "a" * len(done.token_ids)
