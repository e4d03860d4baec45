"""Stop strings with minimal hold-back, finish-reason precedence, <think> splitting."""

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from engine.events import FINISH_REASONS
from engine.reasoning import ANSWER, REASONING, ReasoningSplitter, prompt_opens_reasoning
from engine.stopping import FINISH_PRECEDENCE, StopStringMatcher, decide_finish_reason


def feed(matcher, pieces):
    released = []
    for piece in pieces:
        text, matched = matcher.push(piece)
        released.append(text)
        if matched:
            return released, True
    released.append(matcher.flush())
    return released, False


def test_holds_back_only_a_possible_start_of_a_stop_string():
    m = StopStringMatcher(["</end>"])
    assert m.push("Hello <") == ("Hello ", False)
    assert m.held == "<"
    assert m.push("/e") == ("", False)
    assert m.held == "</e"
    # disproved the moment the text diverges: everything held is released at once
    assert m.push("x") == ("</ex", False)
    assert m.held == ""


def test_match_across_tokens_emits_nothing_of_the_stop_string_or_after():
    released, matched = feed(StopStringMatcher(["STOP"]), ["ab", "cS", "T", "OPdef", "more"])
    assert matched and "".join(released) == "abc"


def test_earliest_of_several_stop_strings_wins():
    released, matched = feed(StopStringMatcher(["world", "lo w"]), ["Hel", "lo world"])
    assert matched and "".join(released) == "Hel"


def test_hold_back_uses_the_longest_candidate_prefix():
    m = StopStringMatcher(["abc", "bcd"])
    assert m.push("xab") == ("x", False)  # "ab" could start "abc"
    assert m.push("c") == ("", True)  # "abc" matched: nothing after "x" is released


def test_overlapping_prefix_rescan():
    # "aab" contains the stop "ab" starting inside the held text
    released, matched = feed(StopStringMatcher(["ab"]), ["a", "a", "b"])
    assert matched and "".join(released) == "a"


@example(pieces=[" ", "<", ">"], stops=["<", " <>"])  # found by hypothesis in a full run
@settings(max_examples=300, deadline=None)
@given(
    pieces=st.lists(st.text(alphabet="abc<>/ é", max_size=4), max_size=12),
    stops=st.lists(st.text(alphabet="abc<>/ é", min_size=1, max_size=4), min_size=1, max_size=3),
)
def test_output_equals_input_up_to_the_first_match(pieces, stops):
    # Generation stops at the first piece after which some stop string is complete in the text,
    # as llama.cpp does: a longer stop string starting earlier but not complete yet does not
    # hold it (pieces " ", "<", ">" with stops "<" and " <>" stop at "<" and release " ").
    # The output is the text so far up to the earliest start among the stops present then.
    released, matched = feed(StopStringMatcher(stops), pieces)
    text = ""
    for piece in pieces:
        text += piece
        positions = [text.find(s) for s in stops if s in text]
        if positions:
            assert matched and "".join(released) == text[: min(positions)]
            return
    assert not matched and "".join(released) == text  # byte-identical to no stop strings


@settings(max_examples=200, deadline=None)
@given(pieces=st.lists(st.text(alphabet="abcS", max_size=3), max_size=10))
def test_hold_back_is_minimal(pieces):
    m = StopStringMatcher(["SaS"])
    for piece in pieces:
        _, matched = m.push(piece)
        if matched:
            return
        held = m.held
        assert len(held) < 3 and "SaS".startswith(held)
        # nothing longer than what is held could still be a stop start
        assert held == "" or held[0] == "S"


def test_no_stop_strings_releases_everything_immediately():
    m = StopStringMatcher([])
    assert m.push("abc") == ("abc", False)


def test_precedence_order_is_total_and_documented():
    assert set(FINISH_PRECEDENCE) == set(FINISH_REASONS)
    assert decide_finish_reason({"length", "stop_sequence"}) == "stop_sequence"
    assert decide_finish_reason({"length", "stop"}) == "stop"
    assert decide_finish_reason({"cancelled", "length"}) == "length"
    assert decide_finish_reason({"grammar_complete", "length"}) == "grammar_complete"
    assert decide_finish_reason({"stop", "grammar_complete"}) == "stop"
    assert decide_finish_reason({"error", "stop"}) == "error"
    assert decide_finish_reason({"tool_calls", "stop"}) == "tool_calls"
    assert decide_finish_reason(set()) is None
    with pytest.raises(ValueError):
        decide_finish_reason({"bogus"})


# The order the module docstring and README document, written out here rather than read from
# FINISH_PRECEDENCE so that reordering the constant is caught.
DOCUMENTED_PRECEDENCE = [
    "error",
    "stop",
    "stop_sequence",
    "grammar_complete",
    "length",
    "cancelled",
]


def test_every_pair_of_finish_reasons_follows_the_documented_precedence():
    for i, higher in enumerate(DOCUMENTED_PRECEDENCE):
        for lower in DOCUMENTED_PRECEDENCE[i + 1 :]:
            assert decide_finish_reason([lower, higher]) == higher, (higher, lower)
    # the pair the original test never compared: a stop string that completes the JSON value
    assert decide_finish_reason({"grammar_complete", "stop_sequence"}) == "stop_sequence"
    assert decide_finish_reason(DOCUMENTED_PRECEDENCE[::-1]) == "error"


def test_unknown_finish_reason_is_named():
    with pytest.raises(ValueError, match=r"unknown finish reasons \['bogus'\]"):
        decide_finish_reason({"bogus", "stop"})


def test_no_push_after_a_match_and_nothing_held_or_flushed():
    matcher = StopStringMatcher(["END"])
    assert matcher.push("abc EN") == ("abc ", False) and matcher.held == "EN"
    assert matcher.push("D tail") == ("", True)
    assert (matcher.matched, matcher.held, matcher.flush()) == ("END", "", "")
    with pytest.raises(
        RuntimeError, match="^a stop string already matched; generation should have ended$"
    ):
        matcher.push("more")


def test_flush_releases_the_held_text_once():
    matcher = StopStringMatcher(["END"])
    assert matcher.push("abc E") == ("abc ", False)
    assert matcher.flush() == "E"
    assert (matcher.held, matcher.flush()) == ("", "")


def test_stop_strings_matching_at_the_same_place_report_the_first_listed():
    for stops, want in ((["ab", "abc"], "ab"), (["abc", "ab"], "abc")):
        matcher = StopStringMatcher(stops)
        assert matcher.push("xxabcd") == ("xx", True)
        assert matcher.matched == want


# --- reasoning -----------------------------------------------------------------------------------
def split(pieces, starts_inside=False):
    splitter = ReasoningSplitter(starts_inside)
    parts = []
    for piece in pieces:
        parts.extend(splitter.push(piece))
    parts.extend(splitter.flush())
    merged = {REASONING: "", ANSWER: ""}
    for kind, text in parts:
        merged[kind] += text
    return merged


def test_think_block_split_across_tokens():
    out = split(["<th", "ink>\nLet me", " think.</th", "ink>\n\nThe answer", " is 4."])
    assert out == {REASONING: "Let me think.", ANSWER: "The answer is 4."}


def test_no_think_tags_is_all_answer_and_unchanged():
    out = split(["a < b", " and <t", "ag>"])
    assert out == {REASONING: "", ANSWER: "a < b and <tag>"}


def test_prompt_that_opens_think_starts_inside():
    assert prompt_opens_reasoning("<|im_start|>assistant\n<think>\n")
    assert not prompt_opens_reasoning("<think>x</think> answer")
    out = split(["plan", "</think>", "done"], starts_inside=True)
    assert out == {REASONING: "plan", ANSWER: "done"}


def test_longest_partial_suffix_counts_only_proper_prefixes():
    # What a streaming matcher holds back (stop strings, tool-call tags): a whole tag at the end
    # is a match for the caller to find, never "a start of the tag" to hold.
    from engine.stopping import longest_partial_suffix

    assert longest_partial_suffix("say <tool", ["<tool_call>"]) == 5
    assert longest_partial_suffix("say <tool_call>", ["<tool_call>"]) == 0
    assert longest_partial_suffix("END", ["END", "ENDING"]) == 3  # a proper prefix of "ENDING"
    assert longest_partial_suffix("x", ["x"]) == 0
