"""Tool-call parsers, per format, on the text each model's own chat template writes for a call
(tests/fixtures/templates; SOURCES.md names where each template comes from), fed whole, one
character at a time and in random small pieces: the text, the calls and the argument deltas
must not depend on the cut."""

from __future__ import annotations

import json

import pytest

from engine.events import (
    ToolCallArgumentsDelta,
    ToolCallFinished,
    ToolCallMalformed,
    ToolCallStarted,
)
from engine.tool_calls.formats import detect_format
from engine.types import ToolCallFormat
from tests.tool_call_helpers import (
    assistant_turn,
    call,
    random_pieces,
    run,
    summary,
    template,
)

USER = {"role": "user", "content": "What is the weather in Paris?"}
PARIS = {"city": "Paris", "unit": "celsius"}
CUTS = [None, [1], [2], [3], [5], *(random_pieces(seed) for seed in range(12))]


def check_all_cuts(fmt, text: str) -> dict:
    whole = summary(run(fmt, text))
    for cut in CUTS[1:]:
        assert summary(run(fmt, text, cut)) == whole, cut
    return whole


# --- Hermes / Qwen2.5 --------------------------------------------------------------------------
def qwen():
    return template("qwen2.5_instruct.jinja")


def test_qwen_template_is_detected_as_hermes():
    assert detect_format(qwen().source) == ToolCallFormat.HERMES


def test_hermes_call_from_the_qwen_template_with_text_before_and_after():
    reply = {
        "role": "assistant",
        "content": "Let me look that up.",
        "tool_calls": [call("get_weather", PARIS)],
    }
    written = assistant_turn(qwen(), [USER], reply)
    assert written.endswith("</tool_call><|im_end|>\n")
    text = written.removesuffix("<|im_end|>\n") + "\nOne moment."
    got = check_all_cuts(ToolCallFormat.HERMES, text)
    assert got["text"] == "Let me look that up.\nOne moment."
    assert got["finished"] == [("get_weather", PARIS)]
    assert got["started"] == ["get_weather"]
    assert json.loads(got["arguments"][0]) == PARIS  # the streamed deltas are the arguments' JSON
    assert got["malformed"] == []


def test_hermes_two_calls_in_one_reply():
    reply = {
        "role": "assistant",
        "content": None,
        "tool_calls": [call("get_weather", {"city": "Oslo"}), call("get_current_datetime", {})],
    }
    text = assistant_turn(qwen(), [USER], reply).removesuffix("<|im_end|>\n")
    got = check_all_cuts(ToolCallFormat.HERMES, text)
    assert got["text"] == ""
    assert got["finished"] == [("get_weather", {"city": "Oslo"}), ("get_current_datetime", {})]


def test_hermes_braces_quotes_and_escapes_inside_argument_strings():
    tricky = {"city": 'Saint-"Denis }]{ \\ </tool_call'}
    reply = {"role": "assistant", "content": None, "tool_calls": [call("get_weather", tricky)]}
    text = assistant_turn(qwen(), [USER], reply).removesuffix("<|im_end|>\n")
    got = check_all_cuts(ToolCallFormat.HERMES, text)
    assert got["finished"] == [("get_weather", tricky)]


def test_hermes_arguments_stream_before_the_call_closes():
    text = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Lyon"}}\n</tool_call>'
    events = run(ToolCallFormat.HERMES, text, [1])
    kinds = [type(e) for e in events]
    first_delta = kinds.index(ToolCallArgumentsDelta)
    assert kinds.index(ToolCallStarted) < first_delta < kinds.index(ToolCallFinished)
    assert sum(k is ToolCallArgumentsDelta for k in kinds) == len('{"city": "Lyon"}')


def test_hermes_call_whose_arguments_break_the_schema_is_malformed_not_finished():
    text = '<tool_call>\n{"name": "get_weather", "arguments": {"city": 7}}\n</tool_call>'
    events = run(ToolCallFormat.HERMES, text, [2])
    assert not [e for e in events if isinstance(e, ToolCallFinished)]
    (bad,) = [e for e in events if isinstance(e, ToolCallMalformed)]
    assert bad.name == "get_weather" and "city" in bad.problem


def test_hermes_unknown_tool_and_cut_off_call_are_malformed():
    unknown = run(
        ToolCallFormat.HERMES, '<tool_call>{"name": "rm_rf", "arguments": {}}</tool_call>'
    )
    assert "no tool is named 'rm_rf'" in unknown[-1].problem
    cut = run(ToolCallFormat.HERMES, '<tool_call>\n{"name": "get_weather", "arguments": {"ci', [3])
    assert isinstance(cut[-1], ToolCallMalformed) and "ended" in cut[-1].problem
    early = run(ToolCallFormat.HERMES, '<tool_call>{"name": "get_weather"</tool_call>after')
    assert isinstance(early[0], ToolCallMalformed) and "ended before" in early[0].problem
    assert summary(early)["text"] == "after"


def test_text_that_only_resembles_the_tag_is_text():
    got = check_all_cuts(ToolCallFormat.HERMES, "use <tool> or <tool_cal and <b>bold</b>")
    assert got["text"] == "use <tool> or <tool_cal and <b>bold</b>"


# --- Llama 3.1 JSON ------------------------------------------------------------------------------
def llama():
    return template("llama3.1_instruct.jinja", bos="<|begin_of_text|>")


def test_llama_template_is_detected():
    assert detect_format(llama().source) == ToolCallFormat.LLAMA3_JSON


def test_llama_call_from_the_llama_template():
    reply = {"role": "assistant", "content": "", "tool_calls": [call("get_weather", PARIS)]}
    written = assistant_turn(llama(), [USER], reply)
    assert written.endswith("}<|eot_id|>")
    got = check_all_cuts(ToolCallFormat.LLAMA3_JSON, written.removesuffix("<|eot_id|>"))
    assert got["finished"] == [("get_weather", PARIS)]
    assert got["text"] == ""


def test_llama_json_that_is_not_a_call_stays_text():
    answer = 'Here it is:\n{"city": "Paris", "temp": 21}\nanything else?'
    got = check_all_cuts(ToolCallFormat.LLAMA3_JSON, answer)
    assert got["text"] == answer and got["started"] == []


def test_llama_text_before_a_call_on_its_own_line():
    text = 'Checking.\n{"name": "get_current_datetime", "parameters": {}}'
    got = check_all_cuts(ToolCallFormat.LLAMA3_JSON, text)
    assert got["text"] == "Checking." and got["finished"] == [("get_current_datetime", {})]


def test_llama_arguments_before_name_are_read_when_the_object_closes():
    text = '{"parameters": {"city": "Rome"}, "name": "get_weather"}'
    got = check_all_cuts(ToolCallFormat.LLAMA3_JSON, text)
    assert got["finished"] == [("get_weather", {"city": "Rome"})]


# --- Mistral ----------------------------------------------------------------------------------
def mistral():
    return template("mistral_7b_instruct_v0.3.jinja", bos="<s>", eos="</s>")


def test_mistral_template_is_detected():
    assert detect_format(mistral().source) == ToolCallFormat.MISTRAL


def test_mistral_calls_from_the_mistral_template():
    reply = {
        "role": "assistant",
        "tool_calls": [call("get_weather", PARIS), call("get_current_datetime", {}, "zyx987WVU")],
    }
    written = assistant_turn(mistral(), [USER], reply)
    assert written.startswith("[TOOL_CALLS] [") and written.endswith("]</s>")
    got = check_all_cuts(ToolCallFormat.MISTRAL, "Sure. " + written.removesuffix("</s>"))
    assert got["text"] == "Sure."
    assert got["finished"] == [("get_weather", PARIS), ("get_current_datetime", {})]


def test_mistral_bare_array_at_the_start_is_calls():
    got = check_all_cuts(
        ToolCallFormat.MISTRAL, '[{"name": "get_weather", "arguments": {"city": "Bern"}}]'
    )
    assert got["finished"] == [("get_weather", {"city": "Bern"})]


def test_mistral_text_with_brackets_stays_text():
    got = check_all_cuts(
        ToolCallFormat.MISTRAL, "Lists look like [1, 2] and [TOOL or [TOOL_ nothing"
    )
    assert got["text"] == "Lists look like [1, 2] and [TOOL or [TOOL_ nothing"


# --- generic JSON (SmolLM2's ChatML template has no tool support) --------------------------------
def test_smollm2_template_gets_the_generic_format_and_tools_in_a_system_message(smollm2_path):
    from engine.chat_template import ChatTemplate
    from engine.gguf import open_gguf
    from engine.tokenizer import Tokenizer

    gguf_file = open_gguf(smollm2_path)
    tmpl = ChatTemplate.from_gguf(gguf_file, Tokenizer.from_gguf(gguf_file))
    assert detect_format(tmpl.source) == ToolCallFormat.GENERIC_JSON
    reply = {"role": "assistant", "content": "", "tool_calls": [call("get_weather", PARIS)]}
    written = assistant_turn(tmpl, [USER], reply)
    prompt_part = tmpl.render(*_prepared([USER], tmpl))
    assert '"name": "get_weather"' in prompt_part  # the tools are described to the model
    got = check_all_cuts(ToolCallFormat.GENERIC_JSON, written.removesuffix("<|im_end|>\n"))
    assert got["finished"] == [("get_weather", PARIS)]


def _prepared(messages, tmpl):
    from engine.tool_calls.formats import prepare_messages
    from tests.tool_call_helpers import SPECS

    prepared, extra = prepare_messages(messages, SPECS, tmpl.source)
    assert extra == {}
    return (prepared,)


@pytest.mark.parametrize("fmt", list(ToolCallFormat))
def test_every_format_passes_plain_text_through_unchanged(fmt):
    text = "Plain answer: 3 < 4, {braces} on a line\n{ and an open one"
    assert summary(run(fmt, text, [1]))["text"] == text


# --- calls outside the format's own markup ----------------------------------------------------------
# What Qwen2.5-Coder-1.5B-Instruct (greedy, this engine) wrote for "What is today's date? Use a
# tool." with the built-in tools, instead of its template's <tool_call> tags.
CODER_REPLY = (
    '```json\n{\n  "name": "get_current_datetime",\n  "arguments": {\n    "timezone": "local"\n'
    "  }\n}\n```"
)


@pytest.mark.parametrize(
    "fmt", [ToolCallFormat.HERMES, ToolCallFormat.GENERIC_JSON, ToolCallFormat.LLAMA3_JSON]
)
def test_a_fenced_json_call_is_a_call(fmt):
    got = check_all_cuts(fmt, "Let me check.\n" + CODER_REPLY + "\n")
    assert got["text"] == "Let me check."
    assert got["finished"] == [("get_current_datetime", {"timezone": "local"})]


def test_a_fenced_block_that_is_not_a_call_stays_text():
    for text in [
        '```json\n{"city": "Paris"}\n```\ndone',
        "```python\nprint({})\n```",
        "``not a fence`` {x}",
    ]:
        for fmt in (ToolCallFormat.HERMES, ToolCallFormat.GENERIC_JSON):
            assert check_all_cuts(fmt, text)["text"] == text, (fmt, text)


def test_hermes_tag_call_and_fenced_call_in_one_reply_keep_their_order():
    text = (
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n</tool_call>\nand\n'
        + CODER_REPLY
    )
    got = check_all_cuts(ToolCallFormat.HERMES, text)
    assert [name for name, _ in got["finished"]] == ["get_weather", "get_current_datetime"]
    assert got["text"] == "\nand"


# --- the prompt side ------------------------------------------------------------------------------
def test_history_calls_with_json_text_arguments_render_as_objects():
    """OpenAI clients send arguments as JSON text; the templates write them with tojson, so they
    must reach the template as objects or the model would see a quoted string."""
    as_text = {
        "id": "abcDEF123",
        "type": "function",
        "function": {"name": "get_weather", "arguments": json.dumps(PARIS)},
    }
    reply = {"role": "assistant", "content": None, "tool_calls": [as_text]}
    written = assistant_turn(qwen(), [USER], reply)
    assert '{"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}' in written


def test_a_tool_result_is_rendered_as_the_template_says():
    from engine.tool_calls.formats import prepare_messages
    from tests.tool_call_helpers import SPECS

    history = [
        USER,
        {"role": "assistant", "content": None, "tool_calls": [call("get_weather", PARIS)]},
        {"role": "tool", "tool_call_id": "abcDEF123", "content": "21 C, sunny"},
    ]
    for tmpl, expected in [
        (qwen(), "<tool_response>\n21 C, sunny\n</tool_response>"),
        # Meta's template tests `is iterable`, true of a string too, so it writes the text as JSON
        (llama(), '<|start_header_id|>ipython<|end_header_id|>\n\n"21 C, sunny"<|eot_id|>'),
        (
            mistral(),
            '[TOOL_RESULTS] {"content": 21 C, sunny, "call_id": "abcDEF123"}[/TOOL_RESULTS]',
        ),
    ]:
        messages, extra = prepare_messages(history, SPECS, tmpl.source)
        assert expected in tmpl.render(messages, **extra), tmpl.name


def test_mistrals_hidden_marker_token_is_passed_to_the_parser():
    from engine.tool_calls.stream import marker_token_texts

    class Vocabulary:
        def token_id(self, text):
            return 5 if text == "[TOOL_CALLS]" else None

        def piece_bytes(self, token_id):
            return b""  # a control token: text decoding hides it

    assert marker_token_texts(Vocabulary(), ToolCallFormat.MISTRAL) == {5: "[TOOL_CALLS]"}
    assert marker_token_texts(Vocabulary(), ToolCallFormat.HERMES) == {}


def test_text_after_a_fenced_call_keeps_its_line_break():
    # Qwen2.5-Coder, round two: an explanation, a fenced call, more explanation
    text = "Here's how:\n" + CODER_REPLY + "\nThis returns the time."
    got = check_all_cuts(ToolCallFormat.HERMES, text)
    assert got["text"] == "Here's how:\nThis returns the time."
    assert [name for name, _ in got["finished"]] == ["get_current_datetime"]
