"""The tool-call modules piece by piece (engine/tool_calls/), for every branch a client would
notice: where a call's JSON ends, what a call body streams and how it is read, each format
parser's items for text, calls, cut-off calls and look-alikes, and the events a ToolCallStream
gives a client (text around calls, ids, schema checks, the problems named for a call that must
not run). Expected values are written by hand from the formats' definitions; messages from
jsonschema and json are theirs (an independent source). The templates' own call texts, cut in
every way, are tests/test_tool_call_parsers.py."""

from __future__ import annotations

import json
import re

import pytest

from engine.events import (
    TextDelta,
    ToolCallArgumentsDelta,
    ToolCallFinished,
    ToolCallMalformed,
    ToolCallStarted,
)
from engine.tool_calls.call_body import CallBody, looks_like_call_head
from engine.tool_calls.hermes import HermesParser
from engine.tool_calls.items import (
    CallArguments,
    CallBroken,
    CallClosed,
    CallOpened,
    Text,
    cut_off,
    feed_body,
    split_at_tag,
)
from engine.tool_calls.json_lines import JsonLinesParser
from engine.tool_calls.json_scan import JsonValueEnd
from engine.tool_calls.mistral import MistralParser
from engine.tool_calls.spec import parse_tools
from engine.tool_calls.stream import ToolCallStream, marker_token_texts, new_call_id
from engine.types import ToolCall, ToolCallFormat
from tests.tool_call_helpers import SPECS

H = ToolCallFormat.HERMES
CUT_OFF = "the reply ended in the middle of the call"
ENDED_EARLY = "the call ended before its JSON object closed"


# --- json_scan: where a JSON value ends ------------------------------------------------------------
def closes_at(text: str) -> int | None:
    scan = JsonValueEnd()
    for i, ch in enumerate(text):
        if scan.feed(ch):
            return i
    return None


@pytest.mark.parametrize(
    "text, end",
    [
        ('{"a": 1}', 7),
        ('{"a": "}"}', 9),  # a bracket inside a string is text
        ('{"a": "\\"}"}', 11),  # an escaped quote does not end the string
        ('{"a": "\\\\"}', 10),  # an escaped backslash does: the quote after it ends the string
        ('{"\\"}": 1}', 9),  # the first string of the value starts unescaped
        ('[{"a": [1, 2]}]', 14),  # nesting counts
        ('{"n": XX}', 8),  # bare words are neither brackets nor strings
        ("}{}", 2),  # a closer before any opener is not an end
        ('{"a": 1', None),
    ],
)
def test_json_value_end(text, end):
    assert closes_at(text) == end


def test_json_value_end_state():
    scan = JsonValueEnd()
    assert (scan.in_string, scan.escaped, scan.started, scan.done) == (False, False, False, False)
    for ch in '{"\\"':
        scan.feed(ch)
    assert (scan.in_string, scan.escaped, scan.started) == (True, False, True)
    scan.feed('"')
    assert scan.in_string is False and scan.done is False


def test_json_value_end_reports_the_end_once():
    scan = JsonValueEnd()
    assert [scan.feed(ch) for ch in "{}"] == [False, True]
    assert scan.feed("}") is False and scan.done


# --- call_body: one call object, streamed -------------------------------------------------------------
def test_call_body_streams_the_name_then_the_arguments():
    body = CallBody()
    out = body.feed('{"name": "get_weather", "argu')
    assert (out.started, out.arguments, out.leftover, body.streaming) == (None, "", None, False)
    out = body.feed('ments": {"ci')
    assert (out.started, out.arguments, out.leftover) == ("get_weather", '{"ci', None)
    assert body.streaming and body.name == "get_weather"
    out = body.feed('ty": "Oslo"}} after')
    assert (out.started, out.arguments, out.leftover) == (None, 'ty": "Oslo"}', " after")
    assert body.done and not body.broken
    assert body.arguments_text == '{"city": "Oslo"}'
    assert body.raw == '{"name": "get_weather", "arguments": {"city": "Oslo"}}'
    assert body.decode() == ("get_weather", {"city": "Oslo"}, "")
    late = body.feed("more")  # after the object: nothing is read
    assert (late.arguments, late.leftover, late.started) == ("", "more", None)
    assert body.raw.endswith("}}")


def test_call_body_closing_at_the_end_of_a_piece_leaves_empty_text():
    body = CallBody()
    out = body.feed('{"name": "f", "parameters": {}}')
    assert out.started == "f" and out.arguments == "{}" and out.leftover == ""


def test_call_body_with_the_arguments_first_is_read_when_it_closes():
    body = CallBody()
    out = body.feed('{"arguments": {"a": 1}, "name": "x"} ')
    assert (out.started, out.arguments, out.leftover) == (None, "", " ")
    assert not body.streaming and body.decode() == ("x", {"a": 1}, "")


def test_call_body_breaks_on_its_terminator():
    body = CallBody(terminator="</tool_call>")
    out = body.feed('{"name": "get_weather"</tool_call>after')
    assert out.broken and body.broken and not body.done
    assert out.leftover == "after" and body.raw == '{"name": "get_weather"'
    assert body.feed("x").leftover == "x"


def test_a_terminator_that_closes_the_object_is_its_end():
    body = CallBody(terminator="}")
    out = body.feed("{}")
    assert body.done and not out.broken and not body.broken


def test_call_body_head_limit_is_4096_characters():
    at_limit = '{"name": "' + "a" * 4069 + '", "arguments": {'
    assert len(at_limit) == 4096
    assert CallBody().feed(at_limit).started == "a" * 4069
    past = CallBody()
    assert past.feed('{"name": "' + "a" * 4070 + '", "arguments": {').started is None
    past.feed("}}")
    assert past.done and past.decode() == ("a" * 4070, {}, "")


def test_call_body_reads_escapes_in_the_name():
    assert CallBody().feed('{"name": "get\\u0041", "arguments": {').started == "getA"
    # an escape JSON does not have: the name as written
    assert CallBody().feed('{"name": "get\\x", "arguments": {').started == "get\\x"


def body_of(text: str) -> CallBody:
    body = CallBody()
    body.feed(text)
    return body


@pytest.mark.parametrize(
    "text, decoded",
    [
        ('{"name": "f"}', ("f", {}, "")),
        ('{"name": "f", "parameters": {"p": 1}}', ("f", {"p": 1}, "")),
        ('{"name": "f", "parameters": {"p": 1}, "arguments": {"a": 1}}', ("f", {"a": 1}, "")),
        ('{"name": "f", "arguments": "{\\"a\\": 1}"}', ("f", {"a": 1}, "")),
        ('{"name": "f", "arguments": ""}', ("f", {}, "")),
        ('{"name": "f", "arguments": "  "}', ("f", {}, "")),
        (
            '{"name": "f", "arguments": [1]}',
            ("f", None, "the arguments must be a JSON object, not list"),
        ),
        (
            '{"name": "f", "arguments": 3}',
            ("f", None, "the arguments must be a JSON object, not int"),
        ),
        ('{"arguments": {}}', ("", None, 'the call has no "name"')),
        ('{"name": "", "arguments": {}}', ("", None, 'the call has no "name"')),
        ('{"name": 5, "arguments": {}}', ("", None, 'the call has no "name"')),
        ("[1, 2]", ("", None, "the call is not a JSON object")),
    ],
)
def test_call_body_decode(text, decoded):
    assert body_of(text).decode() == decoded


def test_call_body_decode_names_json_errors():
    name, arguments, problem = body_of('{"name": "f", "arguments": "{x"}').decode()
    assert (name, arguments) == ("f", None)
    assert problem.startswith("the arguments are not valid JSON (Expecting property name")
    # streamed, then not JSON: the name already read is kept
    name, arguments, problem = body_of('{"name": "f", "arguments": {"a": 1,}}').decode()
    assert (name, arguments) == ("f", None)
    assert problem.startswith("the call is not valid JSON (Expecting property name")
    assert problem.endswith(")")
    assert body_of('{"arguments": {"a": 1,}, "name": "f"}').decode()[0] == ""


def test_looks_like_call_head():
    assert looks_like_call_head('{"name": "x", "arguments": {')
    assert looks_like_call_head(' {"name" : "x" , "parameters":{"a": 1}}')
    assert not looks_like_call_head('{"arguments": {}, "name": "x"}')
    assert not looks_like_call_head('so {"name": "x", "arguments": {')


# --- items: the pieces every format parser shares ----------------------------------------------------
def test_split_at_tag():
    assert split_at_tag("ab<t>cd", "<t>") == ("ab", "cd", "")
    assert split_at_tag("ab<ta", "<tag>") == ("ab", None, "<ta")
    assert split_at_tag("abc", "<tag>") == ("abc", None, "")


def test_feed_body_reports_opened_arguments_and_closed():
    body, items = CallBody(), []
    assert feed_body(body, 4, '{"name": "f", "arguments": {"a"', items) is None
    assert items == [CallOpened(4, "f"), CallArguments(4, '{"a"')]
    assert feed_body(body, 4, ": 1}}", items) == ""
    assert items[2] == CallArguments(4, ": 1}") and items[3] == CallClosed(4, body)


def test_feed_body_reports_a_broken_call():
    body, items = CallBody(terminator="</tool_call>"), []
    assert feed_body(body, 2, '{"name": "f", "arguments": {</tool_call>x', items) == "x"
    assert items[-1] == CallBroken(2, "f", '{"name": "f", "arguments": {', ENDED_EARLY)
    body, items = CallBody(terminator="</tool_call>"), []
    assert feed_body(body, 0, "{</tool_call>", items) == ""
    assert items == [CallBroken(0, "", "{", ENDED_EARLY)]


def test_cut_off():
    assert cut_off(body_of('{"name": "f", "arguments": {'), 1) == CallBroken(
        1, "f", '{"name": "f", "arguments": {', CUT_OFF
    )
    assert cut_off(body_of('{"a'), 0) == CallBroken(0, "", '{"a', CUT_OFF)


# --- Hermes ------------------------------------------------------------------------------------------
def kinds(items):
    return [(type(i).__name__, getattr(i, "key", None)) for i in items]


def text_of(items):
    return "".join(i.text for i in items if isinstance(i, Text))


def hermes_items(*pieces):
    parser = HermesParser()
    items = []
    for piece in pieces:
        items += parser.push(piece)
    return items + parser.flush()


CALL_F = '{"name": "f", "arguments": {"x": 1}}'


def test_hermes_text_calls_and_text():
    items = hermes_items(f"a<tool_call>\n{CALL_F}\n</tool_call>b<tool_call>{CALL_F}</tool_call>")
    assert kinds(items) == [
        ("Text", None),
        ("CallOpened", 0),
        ("CallArguments", 0),
        ("CallClosed", 0),
        ("Text", None),
        ("CallOpened", 1),
        ("CallArguments", 1),
        ("CallClosed", 1),
    ]
    assert text_of(items) == "ab"
    assert items[1] == CallOpened(0, "f") and items[2] == CallArguments(0, '{"x": 1}')


def test_hermes_numbers_calls_and_reads_on_after_a_closing_tag():
    three = f"<tool_call>{CALL_F}</tool_call>" * 3
    assert [i.key for i in hermes_items(three) if isinstance(i, CallClosed)] == [0, 1, 2]
    assert text_of(hermes_items(f"<tool_call>{CALL_F}</tool_call>\n")) == "\n"
    parser = HermesParser()
    parser.push("<tool_call>" + CALL_F[:9])
    assert len(parser.flush()) == 1 and parser.flush() == []


def test_hermes_call_without_its_closing_tag_is_followed_by_text():
    items = hermes_items(f"<tool_call>{CALL_F}Hello")
    assert kinds(items)[-1] == ("Text", None) and text_of(items) == "Hello"
    items = hermes_items(f"<tool_call>{CALL_F}", "\n", "ok")
    assert text_of(items) == "\nok"


def test_hermes_closing_tag_may_arrive_in_pieces():
    items = hermes_items(f"<tool_call>{CALL_F}", "</tool", "_call>x")
    assert text_of(items) == "x"
    # a reply that ends inside the closing tag has no text left
    assert text_of(hermes_items(f"<tool_call>{CALL_F}\n</tool_")) == ""
    assert text_of(hermes_items(f"<tool_call>{CALL_F}\n  ")) == ""


def test_hermes_holds_a_possible_opening_tag_until_it_is_known():
    parser = HermesParser()
    assert parser.push("abc<tool_c") == [Text("abc")]
    assert parser.flush() == [Text("<tool_c")]
    assert parser.flush() == []
    assert parser.push("<tool_c") == [] and parser.push("at>") == [Text("<tool_cat>")]


def test_hermes_cut_off_and_broken_calls():
    (broken,) = [
        i
        for i in hermes_items('<tool_call>{"name": "f", "arguments": {"x": ')
        if isinstance(i, CallBroken)
    ]
    assert broken == CallBroken(0, "f", '{"name": "f", "arguments": {"x": ', CUT_OFF)
    items = hermes_items('<tool_call>{"name": "f"</tool_call>after<tool_call>' + CALL_F)
    assert items[0] == CallBroken(0, "", '{"name": "f"', ENDED_EARLY)
    assert items[1] == Text("after")
    assert items[2] == CallOpened(1, "f")


# --- Mistral -----------------------------------------------------------------------------------------
def mistral_items(*pieces):
    parser = MistralParser()
    items = []
    for piece in pieces:
        items += parser.push(piece)
    return items + parser.flush()


M_CALL = '{"name": "f", "arguments": {}}'
M_CALL_G = '{"name": "g", "arguments": {"y": 2}}'


def test_mistral_marker_array_of_calls_then_text():
    items = mistral_items(f"Sure. [TOOL_CALLS] [{M_CALL}, {M_CALL_G}] done")
    assert kinds(items) == [
        ("Text", None),
        ("CallOpened", 0),
        ("CallArguments", 0),
        ("CallClosed", 0),
        ("CallOpened", 1),
        ("CallArguments", 1),
        ("CallClosed", 1),
        ("Text", None),
    ]
    assert items[0] == Text("Sure. ") and items[-1] == Text(" done")
    assert items[4] == CallOpened(1, "g")


def test_mistral_marker_with_one_object_or_with_text():
    assert kinds(mistral_items(f"[TOOL_CALLS] {M_CALL}"))[:1] == [("CallOpened", 0)]
    assert mistral_items("[TOOL_CALLS] hello") == [Text("hello")]
    # the marker, then the array in later pieces
    items = mistral_items("[TOOL_CALLS]", " ", f"[{M_CALL}]")
    assert kinds(items) == [("CallOpened", 0), ("CallArguments", 0), ("CallClosed", 0)]


def test_mistral_array_ended_by_text():
    items = mistral_items(f"[{M_CALL} oops")
    assert items[-1] == Text("oops")
    items = mistral_items(f"[{M_CALL},", "\n ", M_CALL_G + "]")
    assert [i.key for i in items if isinstance(i, CallClosed)] == [0, 1]


def test_mistral_leading_whitespace_and_a_lone_bracket():
    assert mistral_items("  ", "Hi") == [Text("  Hi")]
    assert mistral_items("  ") == [Text("  ")]
    assert mistral_items("[1, 2]") == [Text("[1, 2]")]
    lone = " " * 62 + "["  # 63 characters: may still be the start of the calls' array
    assert kinds(mistral_items(lone, M_CALL + "]"))[0] == ("CallOpened", 0)
    long = " " * 63 + "["  # 64: too long a wait, it is text
    assert text_of(mistral_items(long, M_CALL + "]")) == long + M_CALL + "]"


def test_mistral_numbers_calls_and_keeps_a_held_marker_start_after_them():
    three = f"[{M_CALL}, {M_CALL}, {M_CALL}]"
    assert [i.key for i in mistral_items(three) if isinstance(i, CallClosed)] == [0, 1, 2]
    # text after the calls (however the array ended) keeps what looked like a marker's start
    assert text_of(mistral_items("[TOOL_CALLS] hi [TOOL")) == "hi [TOOL"
    assert text_of(mistral_items(f"[{M_CALL}] x [TOOL")) == " x [TOOL"
    assert text_of(mistral_items(f"[{M_CALL} Xyz [TOOL")) == "Xyz [TOOL"


def test_mistral_flush_twice():
    parser = MistralParser()
    parser.push("abc [TOOL")
    assert parser.flush() == [Text("[TOOL")] and parser.flush() == []
    parser = MistralParser()
    parser.push("[" + M_CALL[:9])
    assert len(parser.flush()) == 1 and parser.flush() == []


def test_mistral_flush():
    assert mistral_items("abc [TOOL") == [Text("abc "), Text("[TOOL")]
    (broken,) = mistral_items('[{"name": "f", "arguments": {')[-1:]
    assert broken == CallBroken(0, "f", '{"name": "f", "arguments": {', CUT_OFF)


# --- JSON lines (Llama 3 and the generic format) ------------------------------------------------------
def lines_items(*pieces):
    parser = JsonLinesParser()
    items = []
    for piece in pieces:
        items += parser.push(piece)
    return items + parser.flush()


def calls_of(items):
    return [i.body.decode()[:2] for i in items if isinstance(i, CallClosed)]


L_CALL = '{"name": "f", "parameters": {"a": 1}}'


def test_json_lines_call_after_text_on_its_own_line():
    items = lines_items("Checking.\n" + L_CALL)
    assert items[0] == Text("Checking.\n")
    assert kinds(items)[1:] == [("CallOpened", 0), ("CallArguments", 0), ("CallClosed", 0)]
    assert calls_of(items) == [("f", {"a": 1})]


def test_json_lines_object_not_at_a_line_start_is_text():
    items = lines_items("x " + L_CALL)
    assert calls_of(items) == [] and text_of(items) == "x " + L_CALL
    items = lines_items("  " + L_CALL)  # indentation keeps the line start
    assert items[0] == Text("  ") and calls_of(items) == [("f", {"a": 1})]


def test_json_lines_calls_separated_by_semicolons():
    items = lines_items(L_CALL + ";" + L_CALL + "; " + L_CALL)
    assert calls_of(items) == [("f", {"a": 1})] * 3
    assert [i.key for i in items if isinstance(i, CallClosed)] == [0, 1, 2]
    assert text_of(items) == " "  # the stream drops layout before a call


def test_json_lines_text_after_a_call():
    assert text_of(lines_items(L_CALL + "\nXylophone")) == "\nXylophone"
    assert text_of(lines_items(L_CALL, "\n\n")) == "\n\n"


def test_json_lines_objects_that_are_not_calls_stay_text():
    for answer in [
        '{"city": "Paris"}\nmore',
        '{"name": "Bob", "age": 30}',  # the user asked for a person as JSON
        '{"name": "f", "arguments": [1]}',
        '{"title": "x"}',
    ]:
        items = lines_items(answer)
        assert text_of(items) == answer and calls_of(items) == [], answer
    # not written name first, but a call once it closes (Llama 3.2 adds "type")
    for call in [
        '{"parameters": {"a": 1}, "name": "f"}',
        '{"type": "function", "name": "f", "parameters": {"a": 1}}',
        '{"id": "c1", "arguments": {"a": 1}, "name": "f"}',
    ]:
        items = lines_items(call)
        assert calls_of(items) == [("f", {"a": 1})] and text_of(items) == "", call
        assert kinds(items) == [("CallClosed", 0)], call
    assert calls_of(lines_items('{"name": "get_current_datetime"}')) == [
        ("get_current_datetime", {})
    ]


def test_json_lines_fenced_calls():
    for fence in ("```json\n", "```JSON\n", "```\n"):
        items = lines_items(fence + L_CALL + "\n```\nafter")
        assert calls_of(items) == [("f", {"a": 1})], fence
        assert text_of(items) == "\nafter", fence
    assert text_of(lines_items("```json\n" + L_CALL + "\n```after")) == "after"
    assert text_of(lines_items("```json\n" + L_CALL + "\nmore")) == "\nmore"
    # the closing fence in pieces, or cut short at the end: never text
    assert text_of(lines_items("```json\n" + L_CALL + "\n`", "`", "`\nok")) == "\nok"
    assert text_of(lines_items("```json\n" + L_CALL + "\n``")) == ""


def test_json_lines_fences_that_are_not_calls_stay_text():
    for text in ["```json\nhello", "```python\nx = {}\n```", "```json\n  ", "``", '```json\n{"a']:
        assert text_of(lines_items(text)) == text, text
    assert text_of(lines_items("```json\n", "  \n", '{"city": 1}')) == '```json\n  \n{"city": 1}'


def test_json_lines_fence_line_is_held_up_to_12_characters():
    parser = JsonLinesParser()
    assert parser.push("`") == [] and parser.push("``json     ") == []  # 12 characters
    assert calls_of(parser.push("\n" + L_CALL)) == [("f", {"a": 1})]
    parser = JsonLinesParser()
    parser.push("`")
    assert parser.push("``json      ") == [Text("```json      ")]  # 13: not a fence


def test_json_lines_what_follows_a_call_or_an_object():
    assert text_of(lines_items(L_CALL + "\n\nNext")) == "\n\nNext"
    assert text_of(lines_items("; hi")) == "; hi"  # a separator counts only after a call
    # an object right after a non-call object is not at a line start
    items = lines_items('{"city": "Paris"}' + L_CALL)
    assert calls_of(items) == [] and text_of(items) == '{"city": "Paris"}' + L_CALL
    # after a call, the next object is judged afresh
    items = lines_items(L_CALL + '\n{"city": "Paris"}')
    assert calls_of(items) == [("f", {"a": 1})] and text_of(items) == '\n{"city": "Paris"}'
    assert text_of(lines_items(L_CALL + "\n``")) == "\n``"
    # after a line that only looked like a fence, a call may start the next line
    assert calls_of(lines_items("`x`\n" + L_CALL)) == [("f", {"a": 1})]
    every_key = (
        '{"id": "c1", "type": "function", "name": "f", "parameters": {}, "arguments": {"a": 1}}'
    )
    assert calls_of(lines_items(every_key)) == [("f", {"a": 1})]


def test_json_lines_fenced_call_edges():
    # the fence line, then the call indented on the next line
    assert calls_of(lines_items("```json\n  " + L_CALL + "\n```")) == [("f", {"a": 1})]
    # a fence line opening a second fence line: the second one is the call's
    items = lines_items("```json\n```json\n" + L_CALL + "\n```")
    assert calls_of(items) == [("f", {"a": 1})] and text_of(items) == "```json\n"
    assert text_of(lines_items("```json\nX" + L_CALL)) == "```json\nX" + L_CALL
    items = lines_items("```python\nx\n" + '{"a": 1}')  # after a code block that is not a call
    assert text_of(items) == '```python\nx\n{"a": 1}'
    assert text_of(lines_items("```json\n" + L_CALL + "\nok")) == "\nok"
    assert text_of(lines_items("```json\n" + L_CALL + "\n```\n\n")) == "\n\n"


def test_json_lines_layout_between_fences_and_objects_is_ascii_whitespace_only():
    # a code fence that is not a call, then an object on a later line: judged on its own
    items = lines_items("```json\nhello\n" + '{"a": 1}')
    assert text_of(items) == '```json\nhello\n{"a": 1}' and calls_of(items) == []
    # any whitespace is layout, as at a line start: the fence line is the call's, not text
    items = lines_items("```json\n\u00a0" + L_CALL + "\n```")
    assert calls_of(items) == [("f", {"a": 1})] and text_of(items) == ""
    # what is not a closing fence right after a fenced call stays text, as written
    assert text_of(lines_items("```json\n" + L_CALL + "\nX```")) == "\nX```"
    assert text_of(lines_items("```json\n" + L_CALL + "\n;```x")) == "x"


def test_json_lines_flush_twice():
    parser = JsonLinesParser()
    parser.push('{"name": "f", "arguments": {')
    assert len(parser.flush()) == 1 and parser.flush() == []


def test_json_lines_cut_off_call_and_object():
    items = lines_items('{"name": "f", "arguments": {"a": ')
    assert items[-1] == CallBroken(0, "f", '{"name": "f", "arguments": {"a": ', CUT_OFF)
    assert lines_items('{"city": "Par') == [Text('{"city": "Par')]
    assert lines_items("```json\n", '{"city": "Par') == [Text('```json\n{"city": "Par')]


# --- the stream: events a client gets ----------------------------------------------------------------
def events_for(fmt, *pieces, specs=SPECS):
    stream = ToolCallStream(fmt, specs)
    events = []
    for piece in pieces:
        events += stream.push(piece)
    return stream, events + stream.flush()


def test_new_call_ids():
    mistral = {new_call_id(ToolCallFormat.MISTRAL) for _ in range(200)}
    assert all(re.fullmatch(r"[A-Za-z0-9]{9}", i) for i in mistral) and len(mistral) == 200
    others = {new_call_id(f) for f in (H, ToolCallFormat.LLAMA3_JSON) for _ in range(100)}
    assert all(re.fullmatch(r"call_[A-Za-z0-9]{16}", i) for i in others) and len(others) == 200
    letters = "".join(mistral)
    assert (
        re.search("[0-9]", letters) and re.search("[a-z]", letters) and re.search("[A-Z]", letters)
    )


class Vocabulary:
    def __init__(self, token_id, piece):
        self._id, self._piece = token_id, piece

    def token_id(self, text):
        return self._id if text == "[TOOL_CALLS]" else None

    def piece_bytes(self, token_id):
        return self._piece if token_id == self._id else b"?"


def test_marker_token_texts():
    assert marker_token_texts(Vocabulary(5, b""), ToolCallFormat.MISTRAL) == {5: "[TOOL_CALLS]"}
    assert marker_token_texts(Vocabulary(None, b""), ToolCallFormat.MISTRAL) == {}
    assert marker_token_texts(Vocabulary(0, b""), ToolCallFormat.MISTRAL) == {0: "[TOOL_CALLS]"}
    visible = Vocabulary(5, b"[TOOL_CALLS]")  # decoding shows it: nothing to add
    assert marker_token_texts(visible, ToolCallFormat.MISTRAL) == {}
    assert marker_token_texts(Vocabulary(5, b""), ToolCallFormat.GENERIC_JSON) == {}


def test_stream_text_keeps_inner_whitespace_and_drops_layout_around_calls():
    assert ToolCallStream(H, SPECS).ended_on_call is False
    stream, events = events_for(H, "Hello ", "world", "\n")
    assert events == [TextDelta("Hello"), TextDelta(" world"), TextDelta("\n")]
    assert stream.text == ["Hello", " world", "\n"] and stream.ended_on_call is False
    stream, events = events_for(H, " ", " ", "x")
    assert events == [TextDelta("  x")]
    assert events_for(H, "  ")[1] == [TextDelta("  ")]  # a reply of only whitespace keeps it
    assert stream.flush() == []  # flushed once: nothing is left to give
    call = '<tool_call>{"name": "get_current_datetime", "arguments": {}}</tool_call>'
    stream, events = events_for(H, "Hi\n", call, "\n")
    assert events[0] == TextDelta("Hi") and stream.ended_on_call
    assert [type(e) for e in events[1:]] == [
        ToolCallStarted,
        ToolCallArgumentsDelta,
        ToolCallFinished,
    ]
    stream, events = events_for(H, call, "\n", "Done.")
    assert events[-1] == TextDelta("\nDone.") and stream.ended_on_call is False
    assert stream.push("") == []


def test_stream_call_events_share_one_id_and_are_recorded():
    stream, events = events_for(
        H, '<tool_call>{"name": "get_weather", "arguments": {"city": "Oslo"}}</tool_call>'
    )
    started, delta, finished = events
    assert started.name == "get_weather" and delta.text == '{"city": "Oslo"}'
    assert started.id == delta.id == finished.id and started.id.startswith("call_")
    assert stream.calls == [ToolCall(finished.id, "get_weather", {"city": "Oslo"})]
    assert stream.malformed == []


def test_each_call_of_a_reply_has_its_own_id_in_the_formats_style():
    two = (
        '<tool_call>{"name": "get_current_datetime", "arguments": {}}</tool_call>'
        '<tool_call>{"name": "get_current_datetime", "arguments": {}}</tool_call>'
    )
    stream, _ = events_for(H, two)
    first, second = stream.calls
    assert first.id != second.id
    stream, events = events_for(
        ToolCallFormat.MISTRAL, '[TOOL_CALLS] [{"name": "get_current_datetime", "arguments": {}}]'
    )
    assert re.fullmatch(r"[A-Za-z0-9]{9}", stream.calls[0].id)  # Mistral's template needs this
    assert {e.id for e in events} == {stream.calls[0].id}


def test_stream_call_read_when_it_closes_gets_started_and_its_arguments():
    stream, events = events_for(
        ToolCallFormat.LLAMA3_JSON, '{"parameters": {"city": "Rome"}, "name": "get_weather"}'
    )
    started, delta, finished = events
    assert (type(started), started.name) == (ToolCallStarted, "get_weather")
    assert (type(delta), delta.text) == (ToolCallArgumentsDelta, '{"city": "Rome"}')
    assert delta.id == started.id
    assert finished == ToolCallFinished(started.id, "get_weather", {"city": "Rome"})


def test_stream_unreadable_call_is_malformed_with_its_problem():
    stream, events = events_for(H, '<tool_call>{"arguments": {}, "name": ""}</tool_call>')
    started, bad = events
    assert started == ToolCallStarted(started.id, "")
    assert bad == ToolCallMalformed(
        started.id, "", '{"arguments": {}, "name": ""}', 'the call has no "name"'
    )
    assert stream.malformed == [bad] and stream.calls == []


def test_stream_unknown_tool_names_the_offered_ones():
    call = '<tool_call>\n{"name": "rm_rf", "arguments": {}}\n</tool_call>'
    _, events = events_for(H, call)
    bad = events[-1]
    assert (bad.id, bad.name) == (events[0].id, "rm_rf") and bad.id.startswith("call_")
    assert bad.problem == "no tool is named 'rm_rf' (offered: get_weather, get_current_datetime)"
    assert bad.text == '{"name": "rm_rf", "arguments": {}}'  # stripped of the layout
    _, events = events_for(H, call, specs=())
    assert events[-1].problem == "no tool is named 'rm_rf' (offered: none)"


def test_stream_schema_problems_name_the_first_place_in_path_order():
    def problem(arguments, specs=SPECS):
        text = json.dumps({"name": specs[0].name, "arguments": arguments})
        _, events = events_for(H, f"<tool_call>{text}</tool_call>", specs=specs)
        assert not any(isinstance(e, ToolCallFinished) for e in events)
        assert events[-1].id == events[0].id and events[-1].name == specs[0].name
        return events[-1].problem

    assert problem({"city": 7}) == (
        "the arguments do not match get_weather's schema at city: 7 is not of type 'string'"
    )
    assert problem({}) == (
        "the arguments do not match get_weather's schema at (the arguments): "
        "'city' is a required property"
    )
    # a root error sorts before a property's
    assert problem({"city": 7, "extra": 1}) == (
        "the arguments do not match get_weather's schema at (the arguments): "
        "Additional properties are not allowed ('extra' was unexpected)"
    )
    nested = parse_tools(
        [
            {
                "name": "locate",
                "parameters": {
                    "type": "object",
                    "properties": {
                        "at": {"type": "object", "properties": {"lat": {"type": "number"}}}
                    },
                },
            }
        ]
    )
    assert problem({"at": {"lat": "north"}}, nested) == (
        "the arguments do not match locate's schema at at/lat: 'north' is not of type 'number'"
    )


def test_stream_cut_off_call_is_started_once_and_malformed():
    _, events = events_for(H, '<tool_call>{"name": "get_weather", "arguments": {"ci')
    assert [type(e) for e in events] == [ToolCallStarted, ToolCallArgumentsDelta, ToolCallMalformed]
    assert events[-1].problem == CUT_OFF and events[-1].name == "get_weather"
    assert events[-1].id == events[0].id and events[0].id.startswith("call_")
    _, events = events_for(H, '<tool_call>{"arguments": {}</tool_call>')
    assert events == [ToolCallMalformed(events[0].id, "", '{"arguments": {}', ENDED_EARLY)]
