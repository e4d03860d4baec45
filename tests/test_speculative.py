"""Speculative decoding: the prompt-lookup drafter (engine/speculative.py) against a brute-force
reference, and greedy output with speculation == without it on the real models."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.errors import ConfigValidationError
from engine.speculative import PromptLookupDrafter, default_drafter


def brute_force_draft(seq, max_tokens, min_ngram, max_ngram, max_draft):
    """Longest suffix n-gram first; its latest earlier occurrence that has a follower."""
    limit = min(max_tokens, max_draft)
    if limit <= 0:
        return []
    for n in range(max_ngram, min_ngram - 1, -1):
        if len(seq) <= n:
            continue
        suffix = seq[-n:]
        for start in range(len(seq) - n - 1, -1, -1):
            if seq[start : start + n] == suffix:
                return seq[start + n : start + n + limit]
    return []


def test_drafts_what_followed_the_latest_occurrence_of_the_longest_suffix():
    d = PromptLookupDrafter(max_ngram=3, min_ngram=1, max_draft=4, adaptive=False)
    #        0  1  2  3  4  5  6  7  8  9 10 11
    seq = [5, 1, 2, 3, 9, 9, 1, 2, 3, 7, 8, 1, 2]
    # suffix (1, 2) -> latest earlier occurrence at 6..7, followed by 3 7 8 1
    assert d.draft(seq, 10) == [3, 7, 8, 1]
    assert d.draft(seq, 2) == [3, 7]
    seq.append(3)
    # suffix (1, 2, 3) -> occurrences at 1 and 6; the latest one (6) is followed by 7 8 1 2
    assert d.draft(seq, 10) == [7, 8, 1, 2]


def test_no_repeat_no_draft():
    d = PromptLookupDrafter()
    assert d.draft(list(range(50)), 8) == []
    assert d.draft([], 8) == []
    assert d.draft([1, 2, 1, 2], 0) == []


def test_a_changed_sequence_is_reindexed():
    d = PromptLookupDrafter(max_ngram=2, min_ngram=2, adaptive=False)
    assert d.draft([1, 2, 3, 1, 2], 5) == [3, 1, 2]
    assert d.draft([4, 2, 6, 4, 2], 5) == [6, 4, 2]  # a new request: nothing of the old index left
    assert d.draft([4, 2, 6], 5) == []


@settings(max_examples=200, deadline=None)
@given(
    seq=st.lists(st.integers(0, 4), max_size=60),
    steps=st.lists(st.integers(1, 5), max_size=12),
    min_ngram=st.integers(1, 3),
    extra=st.integers(0, 2),
    max_draft=st.integers(1, 6),
    max_tokens=st.integers(0, 8),
)
def test_incremental_index_matches_brute_force(seq, steps, min_ngram, extra, max_draft, max_tokens):
    """Fed the sequence a few tokens at a time (as during generation), the drafter proposes
    exactly what a full scan of the sequence proposes."""
    max_ngram = min_ngram + extra
    d = PromptLookupDrafter(
        max_ngram=max_ngram, min_ngram=min_ngram, max_draft=max_draft, adaptive=False
    )
    cut = 0
    for step in steps + [len(seq)]:
        cut = min(len(seq), cut + step)
        prefix = seq[:cut]
        assert d.draft(prefix, max_tokens) == brute_force_draft(
            prefix, max_tokens, min_ngram, max_ngram, max_draft
        )


def test_draft_length_grows_after_accepted_drafts_and_shrinks_after_rejected_ones():
    d = PromptLookupDrafter(max_ngram=2, min_ngram=2, max_draft=8)
    text = list(range(100, 130))
    seq = text + text[:2]  # the model is re-quoting `text`
    assert d.draft_length == 4
    proposal = d.draft(seq, 50)
    assert proposal == text[2:6]
    seq += proposal + [text[6]]  # all four kept, plus the model's next token
    proposal = d.draft(seq, 50)
    assert d.draft_length == 6 and proposal == text[7:13]
    seq += proposal[:2] + [999]  # the model diverged after two tokens
    assert d.draft(seq, 50) == []  # (no n-gram ending in 999 to look up)
    assert d.draft_length == 5
    seq += [text[0], text[1]]
    assert len(d.draft(seq, 50)) == 5
    assert len(d.draft(seq, 3)) == 3  # the loop's own limit still applies


def test_invalid_settings_are_refused():
    with pytest.raises(ConfigValidationError, match="speculative_ngram"):
        PromptLookupDrafter(max_ngram=1, min_ngram=2)
    with pytest.raises(ConfigValidationError, match="speculative_max_draft"):
        PromptLookupDrafter(max_draft=0)


def test_on_by_default_for_greedy_only():
    greedy, sampled = SimpleNamespace(do_sample=False), SimpleNamespace(do_sample=True)
    assert isinstance(default_drafter(None, greedy), PromptLookupDrafter)
    assert default_drafter(None, sampled) is None
    assert isinstance(default_drafter(None, sampled, required=True), PromptLookupDrafter)


# --- through the generation loop, tiny real models -----------------------------------------------
import numpy as np  # noqa: E402
from fake_model import id_token_lm  # noqa: E402

from engine.events import Finished  # noqa: E402
from engine.generate import GenerationRequest, generate  # noqa: E402
from engine.gguf import open_gguf  # noqa: E402
from engine.kernels.reference import ReferenceBackend  # noqa: E402
from engine.models import build_model  # noqa: E402


@pytest.fixture(params=["llama", "gemma3"])
def tiny_lm(request, tiny_model_factory, monkeypatch):
    model = build_model(open_gguf(tiny_model_factory(request.param)), backend=ReferenceBackend())
    return id_token_lm(model, 128, monkeypatch)


def finish(lm, prompt, speculative, **overrides) -> Finished:
    overrides.setdefault("max_new_tokens", 24)
    events = list(
        generate(
            lm, GenerationRequest(prompt_ids=prompt, overrides=overrides, speculative=speculative)
        )
    )
    assert isinstance(events[-1], Finished) and events[-1].error is None, events[-1].error
    return events[-1]


def test_speculative_greedy_equals_plain_greedy_on_tiny_models(tiny_lm):
    rng = np.random.default_rng(0)
    phrase = [int(t) for t in rng.integers(10, 49152, 12)]
    prompts = {
        "repeating": phrase + [5, 6] + phrase + [5, 6] + phrase[:4],
        "non-repeating": [int(t) for t in rng.integers(10, 49152, 30)],
    }
    drafted = 0
    for name, prompt in prompts.items():
        plain = finish(tiny_lm, prompt, False)
        spec = finish(tiny_lm, prompt, True)
        assert spec.token_ids == plain.token_ids, name
        assert plain.usage.draft_tokens_proposed == 0
        assert spec.usage.draft_tokens_accepted <= spec.usage.draft_tokens_proposed
        drafted += spec.usage.draft_tokens_proposed
    assert drafted > 0  # the repeating prompt (or a greedy loop) made the drafter propose


def test_a_drafter_that_is_always_right_saves_forward_passes(tiny_lm):
    prompt = [int(t) for t in np.random.default_rng(1).integers(10, 49152, 16)]
    plain = finish(tiny_lm, prompt, False)

    class Oracle:  # drafts exactly the greedy continuation: every draft token is accepted
        def draft(self, tokens, max_tokens):
            done = len(tokens) - len(prompt)
            return list(plain.token_ids[done : done + max_tokens])

    calls = []
    inner = tiny_lm.model.forward
    tiny_lm.model.forward = lambda tokens, cache, **kw: (
        calls.append(len(tokens)) or inner(tokens, cache, **kw)
    )
    spec = finish(tiny_lm, prompt, Oracle())
    tiny_lm.model.forward = inner
    assert spec.token_ids == plain.token_ids
    n = len(plain.token_ids)
    assert spec.usage.draft_tokens_accepted == spec.usage.draft_tokens_proposed > 0
    assert len(calls) < n // 2  # prefill + a few verify passes instead of one pass per token


def test_seeded_sampling_with_a_drafter_equals_without(tiny_lm):
    rng = np.random.default_rng(2)
    phrase = [int(t) for t in rng.integers(10, 49152, 10)]
    prompt = phrase * 3
    sampling = dict(do_sample=True, seed=77, temperature=0.7, top_k=0)
    assert (
        finish(tiny_lm, prompt, True, **sampling).token_ids
        == finish(tiny_lm, prompt, False, **sampling).token_ids
    )


# --- real models ---------------------------------------------------------------------------------
PARAGRAPH = (
    "The quick brown fox jumps over the lazy dog near the river bank every morning before "
    "the farmer wakes up, then runs back into the forest."
)
REAL_PROMPTS = {
    "rewrite (repeats the prompt)": dict(
        messages=[
            {
                "role": "user",
                "content": "Repeat this sentence exactly, but with 'cat' instead of 'fox':\n"
                + PARAGRAPH,
            }
        ]
    ),
    "free-form (no repeat)": dict(messages=[{"role": "user", "content": "Name a color."}]),
}
BASE_PROMPTS = {
    "list continues a pattern": dict(
        prompt="Monday, Tuesday, Wednesday. Monday, Tuesday, Wednesday. Monday,"
    ),
    "free text": dict(prompt="The history of the printing press"),
}


def greedy(lm, prompt, speculative, max_new_tokens):
    request = GenerationRequest(
        **prompt,
        speculative=speculative,
        overrides={"max_new_tokens": max_new_tokens, "do_sample": False},
    )
    done = list(generate(lm, request))[-1]
    assert done.error is None, done.error
    return done


@pytest.mark.slow
@pytest.mark.parametrize("name", list(REAL_PROMPTS))
def test_smollm2_speculative_greedy_is_identical(smollm2, name):
    plain = greedy(smollm2, REAL_PROMPTS[name], False, 24)
    spec = greedy(smollm2, REAL_PROMPTS[name], None, 24)  # None: the engine default (on for greedy)
    assert spec.token_ids == plain.token_ids
    assert spec.text == plain.text
    if name.startswith("rewrite"):
        assert spec.usage.draft_tokens_accepted > 0


@pytest.mark.slow
@pytest.mark.parametrize("name", list(BASE_PROMPTS))
def test_gemma3_speculative_greedy_is_identical(gemma3, name):
    plain = greedy(gemma3, BASE_PROMPTS[name], False, 16)
    spec = greedy(gemma3, BASE_PROMPTS[name], True, 16)
    assert spec.token_ids == plain.token_ids
    if name.startswith("list"):
        assert spec.usage.draft_tokens_accepted > 0


@pytest.mark.slow
def test_cli_speculative_flags_and_usage(smollm2_path, capsys):
    import json

    from engine.__main__ import main

    records = {}
    for flag in ("--speculative", "--no-speculative"):
        assert (
            main(
                [
                    "generate",
                    str(smollm2_path),
                    "Repeat exactly: one two three four five six",
                    "--chat",
                    "--greedy",
                    "--max-tokens",
                    "12",
                    "--n-ctx",
                    "256",
                    "--json",
                    flag,
                ]
            )
            == 0
        )
        records[flag] = json.loads(capsys.readouterr().out)
    on, off = records["--speculative"], records["--no-speculative"]
    assert on["ids"] == off["ids"]
    assert off["usage"]["draft_tokens_proposed"] == 0 and off["usage"]["acceptance_rate"] is None
    assert on["usage"]["draft_tokens_proposed"] > 0
    assert (
        on["usage"]["acceptance_rate"]
        == on["usage"]["draft_tokens_accepted"] / on["usage"]["draft_tokens_proposed"]
    )
