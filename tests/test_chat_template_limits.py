"""Hostile chat templates (issue 17): every payload ends in a ChatTemplateLimitError naming the
limit, soon, without a memory spike, and a render can be cancelled or abandoned on a deadline.

The payloads run in a child process so that a regression (a gigabyte allocated, a frozen
big-integer power) shows up as a failing assertion or a child timeout, not a dead pytest.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.cancel import CancelToken
from engine.chat_template import ChatTemplate
from engine.errors import ChatTemplateLimitError, TemplateCancelled

# (template, the limit it must hit)
PAYLOADS = [
    # from the issue
    ("{{ 'x'|center(500000000) }}", "output size"),  # folded at compile time by jinja
    ("{{ ((10**1000)**1000)**1000 }}", "integer size"),
    # classics
    ("{{ 'a'*10**9 }}", "output size"),
    ("{{ range(10**10)|list }}", "loop items"),
    (
        "{% for i in range(10**5) %}{% for j in range(10**5) %}{% endfor %}{% endfor %}",
        "loop items",
    ),
    ("{{ lipsum(10**6) }}", "output size"),
    ("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}", "recursion depth"),
    # padding and formatting filters and str methods that allocate before the output cap
    ("{{ 'x'|indent(10**9, true) }}", "output size"),
    ("{{ '%1000000000s'|format('x') }}", "output size"),
    ("{{ '%*s'|format(10**9, 'x') }}", "output size"),
    ("{{ '%1000000000d' % 1 }}", "output size"),
    ("{{ '{:>1000000000}'.format('x') }}", "output size"),
    ("{{ '{:>{}}'.format('x', 10**9) }}", "output size"),
    ("{{ 'x'.ljust(10**9) }}", "output size"),
    ("{{ ('a '*10**6)|wordwrap(1, wrapstring='x'*1000) }}", "output size"),
    ("{{ ('x'*10**6)|replace('', 'y'*100) }}", "output size"),
    ("{{ ('x'*1000)|list|join('y'*100000) }}", "output size"),
    ("{{ [1]|batch(10**9, 'x')|list }}", "item count"),
    ("{{ messages|tojson(indent=10**8) }}", "output size"),
    # growth by doubling in a loop: ~, +, list +, int *
    (
        "{% set ns = namespace(s='x') %}{% for i in range(64) %}{% set ns.s = ns.s ~ ns.s %}"
        "{% endfor %}{{ ns.s|length }}",
        "output size",
    ),
    (
        "{% set ns = namespace(s='x') %}{% for i in range(64) %}{% set ns.s = ns.s + ns.s %}"
        "{% endfor %}{{ ns.s|length }}",
        "output size",
    ),
    (
        "{% set ns = namespace(l=[1]) %}{% for i in range(64) %}{% set ns.l = ns.l + ns.l %}"
        "{% endfor %}{{ ns.l|length }}",
        "output size",
    ),
    (
        "{% set ns = namespace(n=3) %}{% for i in range(64) %}{% set ns.n = ns.n * ns.n %}"
        "{% endfor %}{{ ns.n > 0 }}",
        "integer size",
    ),
    # no single operation is big, the loops are just endless: the deadline ends it
    ("{% set s = 'x'*3000000 %}{% for a in s %}{% for b in s %}{% endfor %}{% endfor %}", "time"),
]

_CHILD = """
import json, resource, sys, time
from engine.chat_template import ChatTemplate
from engine.errors import ChatTemplateError, ChatTemplateLimitError

def peak_mb():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024

msgs = [{"role": "user", "content": "hi"}]
ChatTemplate("{% for m in messages %}{{ m.content }}{% endfor %}", name="warm").render(msgs)
base = peak_mb()
for source, timeout in json.loads(sys.argv[1]):
    start = time.monotonic()
    try:
        ChatTemplate(source, name="hostile").render(msgs, timeout=timeout)
        outcome = {"error": None}
    except ChatTemplateLimitError as exc:
        outcome = {"error": type(exc).__name__, "limit": exc.limit, "message": str(exc)}
    except ChatTemplateError as exc:
        outcome = {"error": type(exc).__name__, "limit": None, "message": str(exc)}
    outcome.update(seconds=time.monotonic() - start, growth_mb=peak_mb() - base)
    print(json.dumps(outcome), flush=True)
"""


def deadline(limit: str) -> float:
    """Short for the payload that only the deadline can stop; generous for the others, so that
    on a busy machine they still meet their own limit first."""
    return 3.0 if limit == "time" else 60.0


def test_hostile_templates_are_refused_by_their_limit_with_bounded_memory():
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            _CHILD,
            json.dumps([(source, deadline(limit)) for source, limit in PAYLOADS]),
        ],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
    )
    results = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    assert done.returncode == 0, f"child died ({done.returncode}) after {len(results)} payloads"
    assert len(results) == len(PAYLOADS)
    for (source, limit), result in zip(PAYLOADS, results, strict=True):
        assert result["error"] == "ChatTemplateLimitError", (source, result)
        assert result["limit"] == limit, (source, result)
        assert limit in result["message"], (source, result)
        assert result["seconds"] < 60, (source, result)  # generous: refused, not run to the end
        assert result["growth_mb"] < 200, (source, result)


def test_folding_a_huge_constant_does_not_happen_at_load_time():
    template = ChatTemplate("{{ 'x'|center(500000000) }}", name="t")
    assert template.error is None  # compiles (nothing evaluated) and fails only when rendered
    with pytest.raises(ChatTemplateLimitError, match="output size"):
        template.render([{"role": "user", "content": "hi"}])


_ENDLESS = (
    "{% set s = 'x'*3000000 %}{% for a in s %}{% for b in s %}{{ '' }}{% endfor %}{% endfor %}"
)


def test_rendering_is_cancelled_by_the_request_token():
    cancel = CancelToken()
    threading.Timer(0.2, cancel.cancel).start()
    start = time.monotonic()
    with pytest.raises(TemplateCancelled, match="cancelled"):
        ChatTemplate(_ENDLESS, name="t").render([{"role": "user", "content": "x"}], cancel=cancel,
                                                timeout=120)  # fmt: skip
    assert time.monotonic() - start < 60  # ended by the cancel, not by the 120 s deadline


def test_an_abandoned_render_stops_its_thread():
    with pytest.raises(ChatTemplateLimitError, match="time"):
        ChatTemplate(_ENDLESS, name="t").render([{"role": "user", "content": "x"}], timeout=0.5)

    def render_threads():
        return [t for t in threading.enumerate() if t.name == "chat-template"]

    deadline = time.monotonic() + 60
    while render_threads() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not render_threads()


# --- real templates render exactly as plain jinja renders them ---------------------------------
# Written after the published Qwen2.5 (tools), Llama 3.1 and Gemma templates: the features they use
# (namespace, reverse slices, tojson with indent, strftime_now, string methods, +, ~, |trim) must
# give the same text under the limits as in jinja's unmodified sandbox.
QWEN25_TOOLS = """{%- if tools %}
    {{- '<|im_start|>system\\n' }}
    {%- if messages[0]['role'] == 'system' %}{{- messages[0]['content'] }}
    {%- else %}{{- 'You are Qwen, created by Alibaba Cloud. You are a helpful assistant.' }}{%- endif %}
    {{- "\\n\\n# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\n<tools>" }}
    {%- for tool in tools %}{{- "\\n" }}{{- tool | tojson }}{%- endfor %}
    {{- "\\n</tools><|im_end|>\\n" }}
{%- endif %}
{%- for message in messages %}
    {%- if (message.role == "user") or (message.role == "system" and not loop.first) or (message.role == "assistant" and not message.tool_calls) %}
        {{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n' }}
    {%- elif message.role == "assistant" %}
        {{- '<|im_start|>' + message.role }}
        {%- if message.content %}{{- '\\n' + message.content }}{%- endif %}
        {%- for tool_call in message.tool_calls %}
            {%- if tool_call.function is defined %}{%- set tool_call = tool_call.function %}{%- endif %}
            {{- '\\n<tool_call>\\n{"name": "' }}{{- tool_call.name }}{{- '", "arguments": ' }}
            {{- tool_call.arguments | tojson }}{{- '}\\n</tool_call>' }}
        {%- endfor %}
        {{- '<|im_end|>\\n' }}
    {%- elif message.role == "tool" %}
        {%- if (loop.index0 == 0) or (messages[loop.index0 - 1].role != "tool") %}{{- '<|im_start|>user' }}{%- endif %}
        {{- '\\n<tool_response>\\n' }}{{- message.content }}{{- '\\n</tool_response>' }}
        {%- if loop.last or (messages[loop.index0 + 1].role != "tool") %}{{- '<|im_end|>\\n' }}{%- endif %}
    {%- endif %}
{%- endfor %}
{%- set ns = namespace(last_user=-1) %}
{%- for message in messages[::-1] %}{%- if ns.last_user < 0 and message.role == 'user' %}{%- set ns.last_user = loop.index0 %}{%- endif %}{%- endfor %}
{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"""  # fmt: skip

LLAMA31 = """{{- bos_token }}
{%- if not date_string is defined %}{%- set date_string = "26 Jul 2024" %}{%- endif %}
{%- if messages[0]['role'] == 'system' %}{%- set system_message = messages[0]['content']|trim %}{%- set messages = messages[1:] %}
{%- else %}{%- set system_message = "" %}{%- endif %}
{{- "<|start_header_id|>system<|end_header_id|>\\n\\n" }}
{{- "Cutting Knowledge Date: December 2023\\n" }}{{- "Today Date: " + date_string + "\\n\\n" }}
{%- if tools %}{%- for t in tools %}{{- t | tojson(indent=4) }}{{- "\\n\\n" }}{%- endfor %}{%- endif %}
{{- system_message }}{{- "<|eot_id|>" }}
{%- for message in messages %}
    {{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n'+ message['content'] | trim + '<|eot_id|>' }}
{%- endfor %}
{%- if add_generation_prompt %}{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{%- endif %}"""  # fmt: skip

_TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Weather for a city — «quoted» & <escaped>?",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
        },
    }
]
_CONVERSATION = [
    {"role": "system", "content": "  Be brief.  "},
    {"role": "user", "content": "Weather in Zürich?"},
    {
        "role": "assistant",
        "content": "",
        "tool_calls": [{"function": {"name": "get_weather", "arguments": {"city": "Zürich"}}}],
    },
    {"role": "tool", "content": '{"temp": 21}'},
    {"role": "assistant", "content": "It is 21 °C."},
    {"role": "user", "content": "And " + "x" * 3000 + " tomorrow?"},
]


def _plain_jinja(source: str, **variables) -> str:
    import jinja2.ext
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    from engine import chat_template

    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols]
    )
    env.filters["tojson"] = chat_template._tojson
    return env.from_string(source).render(**variables)


@pytest.mark.parametrize(
    "source",
    [QWEN25_TOOLS, LLAMA31, "GEMMA", "CHATML"],
    ids=["qwen2.5", "llama3.1", "gemma", "chatml"],
)
def test_real_templates_render_as_in_plain_jinja(source):
    from engine import chat_template

    source = {"GEMMA": chat_template.GEMMA_TEMPLATE, "CHATML": chat_template.CHATML_TEMPLATE}.get(
        source, source
    )
    conversation = _CONVERSATION
    if source == chat_template.GEMMA_TEMPLATE:  # alternating roles only
        conversation = [_CONVERSATION[0], _CONVERSATION[1], _CONVERSATION[4], _CONVERSATION[5]]
    if source == chat_template.CHATML_TEMPLATE:
        conversation = [m for m in _CONVERSATION if m["content"]]
    variables = dict(bos_token="<s>", eos_token="</s>", tools=_TOOLS, add_generation_prompt=True)
    expected = _plain_jinja(source, messages=conversation, **variables)
    template = ChatTemplate(source, name="real", bos_token="<s>", eos_token="</s>")
    assert template.render(conversation, add_generation_prompt=True, tools=_TOOLS) == expected
    assert "Zürich" in expected and len(expected) > 3000


def test_ordinary_formatting_and_long_numbers_in_text_still_work():
    source = (
        "{{ 'id 20241231235959123: %s' % 'x' }} {{ '%5.2f'|format(3.14159) }} "
        "{{ '{:>6}|{}'.format('ab', 12345678901) }} {{ 'a-b'|replace('-', '+') }} "
        "{{ ['x', 'y']|join(', ') }} {{ 'hi'|center(6) }}|"
    )
    text = ChatTemplate(source, name="t").render([{"role": "user", "content": "x"}])
    assert text == "id 20241231235959123: x  3.14     ab|12345678901 a+b x, y   hi  |"


# --- the text of a value is measured before it is made (issue 31) ------------------------------
# Each payload builds a legal 3-million-character string, refers to it 1,000 times from a list
# and turns the list into text: 3 billion characters from a few kilobytes of objects. Before the
# fix, 7 of these went past 2.5 GB. Each must be refused by its limit, with the process's peak
# memory growing by at most 100 MB.
_BIG = "{% set s = 'x' * 3000000 %}{% set l = [s] * 1000 %}"
# a loop that keeps a new 3-million-character value per step in a list
_GROW = (
    "{{% set s = 'x' * 3000000 %}}{{% set h = 'x' * 1500000 %}}{{% set ns = namespace(l=[]) %}}"
    "{{% for i in range(1000) %}}{{% set ns.l = ns.l + [{item}] %}}{{% endfor %}}{{{{ ns.l|length }}}}"
)
TEXT_PAYLOADS = [
    # the seven shapes from the issue
    (_BIG + "{{ l }}", "output size"),  # the list's own output
    (_BIG + "{{ l|string }}", "output size"),
    (_BIG + "{{ l|tojson }}", "output size"),
    (_BIG + "{{ {'a': l}|string }}", "output size"),  # dict|string
    (_BIG + "{{ [l]|join }}", "output size"),  # join over a nested list
    (
        "{% set s = 'x' * 3000000 %}{{ ('y' * 1000).translate(''.maketrans({'y': s})) }}",
        "output size",
    ),  # fmt: skip
    ("{% set s = 'x' * 3000000 %}{{ ('%(a)s' * 1000) % {'a': s} }}", "output size"),
    # the other ways a value becomes text
    (_BIG + "{{ l ~ '' }}", "output size"),
    ("{% set s = 'x' * 3000000 %}{{ ('{0}' * 1000).format(s) }}", "output size"),
    ("{% set s = 'x' * 3000000 %}{{ ('{a}' * 1000).format_map({'a': s}) }}", "output size"),
    ("{% set s = 'x' * 3000000 %}{{ ('%s' * 1000)|format(*([s] * 1000)) }}", "output size"),
    (_BIG + "{{ l|map('upper')|join }}", "output size"),  # new strings, listed one by one
    (_BIG + "{{ ''.join(l|map('upper')) }}", "output size"),
    (
        _BIG + "{% set b %}{% for x in l %}{{ x }}{% endfor %}{% endset %}{{ b|length }}",
        "output size",
    ),  # fmt: skip
    (
        _BIG + "{% macro m() %}{% for x in l %}{{ x }}{% endfor %}{% endmacro %}{{ m()|length }}",
        "output size",
    ),  # fmt: skip
    (_BIG + "{{ l|pprint }}", "output size"),
    (_BIG + "{{ l|upper }}", "output size"),
    (_BIG + "{{ l|escape }}", "output size"),
    (_BIG + "{{ 'a'|replace('a', l) }}", "output size"),
    (_BIG + "{{ l|center(10) }}", "output size"),
    (_BIG + "{{ {'a': l}|xmlattr }}", "output size"),
    ("{{ ''.maketrans('a' * 200000, 'b' * 200000)|length }}", "item count"),
    # many distinct large values held at once (each legal on its own): the render's budget on
    # everything it produces (MAX_PRODUCED_BYTES) refuses them; before it, only the deadline did,
    # after gigabytes
    (_BIG + "{{ l|map('upper')|list|length }}", "output size"),
    (_BIG + "{{ l|map('replace', 'x', 'y')|list|length }}", "output size"),
    (_BIG + "{{ l|map('trim')|map('upper')|select|list|length }}", "output size"),
    (_BIG + "{{ l|map('upper')|batch(10)|list|length }}", "output size"),
    (_GROW.format(item="s ~ loop.index"), "output size"),
    (_GROW.format(item="s.upper()"), "output size"),
    (_GROW.format(item="s.replace('x', 'y')"), "output size"),
    (_GROW.format(item="h * 2"), "output size"),  # 3,000,000 characters each
    (_GROW.format(item="s + 'y'"), "output size"),
    (_GROW.format(item="'%s!' % s"), "output size"),
    (_GROW.format(item="'{}!'.format(s)"), "output size"),
    (
        "{% set s = 'x' * 3000000 %}{% set ns = namespace(d={}) %}{% for i in range(1000) %}"
        "{% set ns.d = dict(ns.d, **{'k' ~ i: s ~ i}) %}{% endfor %}{{ ns.d|length }}",
        "output size",
    ),  # a dict of many big values
    (
        "{% set s = 'x' * 3000000 %}{{ dict(a=s ~ 1, b=s ~ 2, c=s ~ 3, d=s ~ 4, e=s ~ 5, f=s ~ 6,"
        " g=s ~ 7, h=s ~ 8, i=s ~ 9, j=s ~ 10, k=s ~ 11, m=s ~ 12, n=s ~ 13, o=s ~ 14, p=s ~ 15,"
        " q=s ~ 16, r=s ~ 17, t=s ~ 18, u=s ~ 19, v=s ~ 20, w=s ~ 21, y=s ~ 22, z=s ~ 23,"
        " aa=s ~ 24, ab=s ~ 25, ac=s ~ 26)|dictsort|length }}",
        "output size",
    ),
    (
        "{% set s = 'x' * 3000000 %}{% macro m(i) %}{{ s }}{{ i }}{% endmacro %}"
        "{% set ns = namespace(l=[]) %}{% for i in range(1000) %}{% set ns.l = ns.l + [m(i)] %}"
        "{% endfor %}{{ ns.l|length }}",
        "output size",
    ),  # the text of a macro, kept
]

_TEXT_CHILD = """
import json, resource, sys
from engine.chat_template import ChatTemplate
from engine.errors import ChatTemplateError, ChatTemplateLimitError

resource.setrlimit(resource.RLIMIT_AS, (3 * 2**30, 3 * 2**30))  # a regression fails, not the host

def peak_mb():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024

msgs = [{"role": "user", "content": "hi"}]
ChatTemplate("{{ messages|tojson }}{{ messages }}", name="warm").render(msgs)
base = peak_mb()
for source in json.loads(sys.argv[1]):
    try:
        ChatTemplate(source, name="hostile").render(msgs, timeout=60)
        outcome = {"error": None}
    except ChatTemplateLimitError as exc:
        outcome = {"error": type(exc).__name__, "limit": exc.limit, "message": str(exc)}
    except ChatTemplateError as exc:
        outcome = {"error": type(exc).__name__, "limit": None, "message": str(exc)}
    outcome["growth_mb"] = peak_mb() - base
    print(json.dumps(outcome), flush=True)
"""


def test_turning_a_value_into_text_is_refused_before_the_text_is_made():
    done = subprocess.run(
        [sys.executable, "-c", _TEXT_CHILD, json.dumps([p for p, _ in TEXT_PAYLOADS])],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
    )
    results = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    assert done.returncode == 0, f"child died ({done.returncode}): {done.stderr[-2000:]}"
    assert len(results) == len(TEXT_PAYLOADS)
    for (source, limit), result in zip(TEXT_PAYLOADS, results, strict=True):
        assert result["error"] == "ChatTemplateLimitError", (source, result)
        assert result["limit"] == limit and limit in result["message"], (source, result)
        assert result["growth_mb"] <= 100, (source, result)


# Just under and just over the limit (4,000,000 characters), and ordinary uses of every
# measured path, which must render exactly as in plain jinja.
_HALF = "{% set s = 'x' * 1999990 %}"


@pytest.mark.parametrize(
    ("source", "refused"),
    [
        (_HALF + "{{ [s, s] }}", False),  # 3,999,980 + 8 characters
        (_HALF + "{{ [s, s, 'xxxxxxxxxxxx'] }}", True),
        (_HALF + "{{ [s, s]|string|length }}", False),
        (_HALF + "{{ [s, s, 'xxxxxxxxxxxxxxxxx']|tojson|length }}", True),
        (_HALF + "{{ [s, s]|tojson|length }}", False),
        (_HALF + "{{ ('%s%s' % (s, s))|length }}", False),
        (_HALF + "{{ ('%s%s%s' % (s, s, 'x' * 30))|length }}", True),
        (_HALF + "{{ ('{0}{0}'.format(s))|length }}", False),
        (_HALF + "{{ ('{0}{0}{1}'.format(s, 'x' * 30))|length }}", True),
        (_HALF + "{{ [s, s]|join|length }}", False),
        (_HALF + "{{ [s, s]|join('x' * 30)|length }}", True),
    ],
)
def test_the_measure_refuses_only_past_the_limit(source, refused):
    template = ChatTemplate(source, name="t")
    if refused:
        with pytest.raises(ChatTemplateLimitError, match="output size"):
            template.render([{"role": "user", "content": "x"}])
    else:
        template.render([{"role": "user", "content": "x"}])


@pytest.mark.parametrize(
    "source",
    [
        "{{ messages }}|{{ messages|string }}|{{ messages|tojson }}|{{ messages|tojson(indent=2) }}",
        "{{ {'a': [1, 2.5, none, true], 'b': ('t', 'u')}|string }} {{ [messages]|join(',') }}",
        "{{ '%(a)s-%(a)s %%' % {'a': 'x'} }} {{ '%5.1f|%-3d|%c|%r' % (2.25, 7, 65, 'q') }}",
        "{{ '{0}{0}{1!r}{k}'.format('ab', 'c', k=[1]) }} {{ '{a[0]}'.format_map({'a': 'xy'}) }}",
        "{{ 'abc'.translate(''.maketrans('a', 'b')) }} {{ 'abc'.translate({97: 'zz'}) }}",
        "{{ messages|map(attribute='role')|join('/') }} {{ '-'.join(['a', 'b']|map('upper')) }}",
        "{{ messages|map(attribute='content')|map('upper')|list }} {{ 'a&b'|escape }}",
        "{% set b %}{{ messages[0] }}{% endset %}{{ b }} {{ messages ~ '!' }} {{ ns }}",
        "{{ {'k': 'v'}|xmlattr }} {{ [1, 'a']|pprint }} {{ '%s'|format(messages) }}",
    ],
)
def test_measured_conversions_render_as_in_plain_jinja(source):
    messages = [{"role": "user", "content": "Zürich \"quoted\" \\ 'single' \n\t\x01 😀"}]
    source = "{% set ns = namespace(a=[1, 'b']) %}" + source
    expected = _plain_jinja(source, messages=messages)
    assert ChatTemplate(source, name="t").render(messages) == expected


# The budget on what one render produces must leave room for real templates at the output cap:
# 150 messages of 25,000 characters, and one message of 3.7 million, render exactly as in plain
# jinja (each real template copies a message a few times: `+`, |trim, tojson of the tools).
_FIXTURES = os.path.join(os.path.dirname(__file__), "fixtures", "templates")


@pytest.mark.parametrize(
    "name",
    ["qwen2.5_instruct", "llama3.1_instruct", "mistral_7b_instruct_v0.3", "QWEN25_TOOLS",
     "LLAMA31", "GEMMA_TEMPLATE", "CHATML_TEMPLATE"],
)  # fmt: skip
@pytest.mark.parametrize("shape", ["many", "one"])
def test_real_templates_at_the_output_cap_render_within_the_budget(name, shape):
    from engine import chat_template

    path = os.path.join(_FIXTURES, name + ".jinja")
    if os.path.exists(path):
        with open(path, encoding="utf-8") as f:
            source = f.read()
    else:
        source = getattr(chat_template, name, None) or globals()[name]
    if shape == "many":
        contents = [f"m{i} " + "word " * 5000 for i in range(150)]
    else:
        contents = ["word " * 740000]
    conversation = [
        {"role": "user" if i % 2 == 0 else "assistant", "content": c}
        for i, c in enumerate(contents)
    ]
    extra = (
        {}
        if "mistral" in name or name in ("GEMMA_TEMPLATE", "CHATML_TEMPLATE")
        else {"tools": _TOOLS}
    )
    expected = _plain_jinja(source, messages=conversation, add_generation_prompt=True,
                            bos_token="", eos_token="", **extra)  # fmt: skip
    assert len(expected) > 3_700_000
    assert ChatTemplate(source, name="real").render(conversation, **extra) == expected


def test_a_prompt_built_piece_by_piece_over_a_long_chat_is_not_refused():
    # `ns.s = ns.s ~ piece` makes a new string at every message and drops the old one: the
    # render's budget charges their lengths, about n^2/2 (here over 1 GB), though the process
    # holds one prompt of 0.9 MB. The real growth, not that sum, decides.
    source = (
        "{% set ns = namespace(s='') %}{% for m in messages %}"
        "{% set ns.s = ns.s ~ '<' ~ m.role ~ '>' ~ m.content ~ '\\n' %}{% endfor %}{{ ns.s }}"
    )
    conversation = [
        {"role": "user" if i % 2 == 0 else "assistant", "content": f"m{i} " + "w" * 300}
        for i in range(3000)
    ]
    expected = _plain_jinja(source, messages=conversation)
    assert len(expected) > 900_000
    assert ChatTemplate(source, name="accumulating").render(conversation) == expected


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=200), st.sampled_from(["repr", "ascii", "json", "json_ascii"]))
def test_the_escaped_length_is_an_upper_bound_within_the_quotes(text, mode):
    from engine.chat_template import _escaped_len

    real = {
        "repr": repr,
        "ascii": ascii,
        "json": lambda t: json.dumps(t, ensure_ascii=False),
        "json_ascii": json.dumps,
    }[mode](text)
    bound = _escaped_len(text, mode)
    assert len(real) <= bound <= len(real) + text.count("'") + text.count('"')
