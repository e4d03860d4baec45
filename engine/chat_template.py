"""Chat messages -> prompt text, with the model's own Jinja template rendered in a sandbox.

A chat template comes from a downloaded file, so it is untrusted code: CVE-2024-34359
(llama-cpp-python) was a GGUF whose template reached Python internals through `__class__`
attributes and ran shell commands. We render with jinja2's ImmutableSandboxedEnvironment, and
make every unsafe attribute access an error instead of jinja's default of quietly rendering
nothing, so an attack shows up as a ChatTemplateError rather than as odd output.

The environment matches what HF transformers gives templates (templates are written against
it): trim_blocks/lstrip_blocks, the loopcontrols extension, a `{% generation %}` block,
`raise_exception(message)`, `strftime_now(format)`, a `tojson` that does not HTML-escape,
and the variables `messages`, `add_generation_prompt`, `bos_token`, `eos_token` (plus any
extra keyword given to `render`, e.g. `tools` or `enable_thinking`).

A template that writes `bos_token` first would give two BOS tokens once the tokenizer adds its
own; `render` drops that leading BOS text when the tokenizer adds BOS (llama.cpp does the same),
so `tokenizer.encode(template.render(messages))` always starts with exactly one BOS.

A hostile template is bounded by limits checked *before* each operation that could allocate
without bound (see "Resource limits" below), including every conversion of a value to text
(`{{ value }}`, |string, |tojson, `~`, join, `%`, str.format, str.translate, the text of a block):
its size is measured from lengths without making the text. A template holding many distinct
large values at once (each legal, e.g. `l|map('upper')|list` over a list of 3-million-character
strings, or `s ~ loop.index` kept in a loop) is bounded by a budget on everything one render
produces: every filter, call, `*`, `+`, `%`, `~` and block text adds the size of the value it made
(checked before making it where the size is known) to a total, refused as "output size" past
MAX_PRODUCED_BYTES (64 MB, so that a render grows the process by less than 100 MB). Past the
budget, where the process's resident size can be read (Linux), the render's real growth decides
instead: values made and already dropped (a prompt built piece by piece over a long chat) do not
refuse a render that holds little. What one render made does not outlive it (its context, its last value and its error's frames are let go).

A file without a template gets a named fallback: Gemma's turn format for Gemma models (whose
vocabulary has `<start_of_turn>`; the system prompt goes in front of the first user turn, as
Gemma's own template does), ChatML otherwise.
"""

from __future__ import annotations

import collections
import functools
import gc
import json
import os
import re
import string
import sys
import threading
import time
import traceback
import types
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime
from typing import Any

import jinja2
import jinja2.ext
import jinja2.filters
import jinja2.nodes
import jinja2.runtime
import jinja2.utils
from jinja2.compiler import CodeGenerator
from jinja2.exceptions import SecurityError, TemplateError, TemplateSyntaxError
from jinja2.sandbox import ImmutableSandboxedEnvironment

from engine.errors import ChatTemplateError, ChatTemplateLimitError, TemplateCancelled

TEMPLATE_FILENAME = "<chat template>"

CHATML_TEMPLATE = (
    "{%- for message in messages -%}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{ '<|im_start|>assistant\\n' }}{%- endif -%}"
)

# Gemma's turn format: roles user/model, no system role (it is folded into the first user turn).
GEMMA_TEMPLATE = (
    "{{- bos_token -}}"
    "{%- if messages and messages[0]['role'] == 'system' -%}"
    "{%- set first_user_prefix = messages[0]['content'] + '\\n\\n' -%}"
    "{%- set loop_messages = messages[1:] -%}"
    "{%- else -%}"
    "{%- set first_user_prefix = '' -%}"
    "{%- set loop_messages = messages -%}"
    "{%- endif -%}"
    "{%- for message in loop_messages -%}"
    "{%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) -%}"
    "{{- raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') -}}"
    "{%- endif -%}"
    "{%- set role = 'model' if message['role'] == 'assistant' else message['role'] -%}"
    "{{- '<start_of_turn>' + role + '\\n' + (first_user_prefix if loop.first else '') + message['content'] | trim + '<end_of_turn>\\n' -}}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<start_of_turn>model\\n' -}}{%- endif -%}"
)  # fmt: skip


class _TemplateRaised(TemplateError):
    """raise_exception() was called by the template."""


def _raise_exception(message: str = "") -> None:
    raise _TemplateRaised(str(message))


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


def _tojson(value: Any, ensure_ascii: bool = False, indent: int | None = None, separators=None,
            sort_keys: bool = False) -> str:  # fmt: skip
    # HF's tojson: plain json.dumps (jinja's own escapes <, >, & and ' for HTML, which breaks prompts).
    return json.dumps(
        value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
    )


class _GenerationBlock(jinja2.ext.Extension):
    """`{% generation %}...{% endgeneration %}` (HF marks assistant text with it): render the body."""

    tags = {"generation"}

    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return jinja2.nodes.Scope(body, lineno=lineno)


# Resource limits for one render. A real template writes a few KB and loops over the messages;
# these only stop a hostile one from hanging or filling memory. They are checked *before* each
# operation that could allocate or compute without bound (jinja's own sandbox only caps a single
# range() at 100k items, and the output cap alone is checked too late: `'x'|center(10**9)` has
# already allocated its gigabyte when the chunk is measured).
MAX_OUTPUT_CHARS = 4_000_000  # the prompt, and any one string or list built on the way
MAX_RANGE_ITEMS = 1_000_000  # summed over every range() call of one render
MAX_INT_BITS = 100_000  # ~30,000 decimal digits; big-integer arithmetic is quadratic or worse
MAX_JSON_INDENT = 64
RENDER_TIMEOUT_S = 5.0  # the caller never waits longer than this for a prompt

_TEMPLATE_CODE_FILENAME = "<template>"  # co_filename of the Python code jinja compiles to


class _LimitExceeded(SecurityError):
    """An operation of the template would exceed one of the limits above (`.limit` names it)."""

    def __init__(self, limit: str, message: str):
        super().__init__(message)
        self.limit = limit


def _too_long(what: str, size: int) -> _LimitExceeded:
    return _LimitExceeded(
        "output size", f"{what} would be {size} items long (limit {MAX_OUTPUT_CHARS})"
    )


def _check_size(what: str, size: int) -> None:
    if size > MAX_OUTPUT_CHARS:
        raise _too_long(what, size)


def _check_int_bits(what: str, bits: int) -> None:
    if bits > MAX_INT_BITS:
        raise _LimitExceeded(
            "integer size", f"{what} would have about {bits} bits (limit {MAX_INT_BITS})"
        )


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


# --- the total size of what one render produces ------------------------------------------------
# Each value above is bounded on its own, but a template can keep many of them at once: 1,000
# upper-cased copies of a 3-million-character string (`l|map('upper')|list`), `s ~ loop.index`
# collected in a loop, `dict` of many products. So every value a template makes (the result of a
# filter, a call, `*`, `+`, `%`, `~`, the text of a block) adds its size in bytes to a total kept
# for the render, and the render is refused once the total passes the budget. A value that is
# one of its own inputs (`s|trim` returning `s`) is not new and costs nothing; a container costs
# its own slots (its items were counted when they were made). Where the size is known in advance
# (`*`, `+`, `~`) the budget is checked before the value is made; elsewhere right after, which
# can overshoot by one value, itself at most MAX_OUTPUT_CHARS characters (16 MB).
MAX_PRODUCED_BYTES = 64 * 2**20  # + one last value + the measuring: under 100 MB of growth
_render_state = threading.local()  # .produced: the budget of the render running in this thread


class _Produced:
    """The running total of one render (kept per render thread)."""

    def __init__(self) -> None:
        self.total = 0
        self.last: Any = None  # the value counted last: a macro returns its block's text again
        self.resident_at_start = _resident_bytes()


def _resident_bytes() -> int | None:
    """The process's resident size now (Linux's /proc/self/statm), or None where unreadable."""
    try:
        with open("/proc/self/statm", "rb") as statm:
            return int(statm.read().split()[1]) * _PAGE_SIZE
    except (OSError, ValueError, IndexError):
        return None


_PAGE_SIZE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def _still_over_budget(state: _Produced, extra: int) -> bool:
    """The charged total passed the budget; is the render really that large? The total counts
    every value made, also those already dropped: a prompt built piece by piece
    (`ns.s = ns.s ~ piece` over a long chat) is charged its length at every step, quadratically,
    though only the last string is alive. Where the process's resident size can be read, the
    render's real growth since it started replaces the total, and only a growth (plus the value
    about to be made) over the budget refuses the render; elsewhere the total stands."""
    if state.resident_at_start is None:
        return True
    now = _resident_bytes()
    if now is None:
        return True
    growth = max(0, now - state.resident_at_start)
    if growth + extra > MAX_PRODUCED_BYTES:
        return True
    state.total = growth
    return False


def _produced() -> _Produced | None:
    return getattr(_render_state, "produced", None)


def _budget_exceeded(total: int) -> _LimitExceeded:
    return _LimitExceeded(
        "output size",
        f"the template would have produced {total} bytes of values in one render "
        f"(limit {MAX_PRODUCED_BYTES})",
    )


def _precheck_produced(size: int) -> None:
    """Refuse a value of `size` characters before it is made when it would pass the budget."""
    state = _produced()
    if (
        state is not None
        and state.total + size > MAX_PRODUCED_BYTES
        and _still_over_budget(state, size)
    ):
        raise _budget_exceeded(state.total + size)


def _charge(value: Any, *inputs: Any) -> Any:
    """Add a value just made to the render's total (unless it is one of `inputs`); returns it."""
    state = _produced()
    if state is None or value is state.last or not isinstance(value, _COUNTED):
        return value
    if any(value is x for x in inputs):
        return value
    state.total += sys.getsizeof(value)
    state.last = value
    if state.total > MAX_PRODUCED_BYTES and _still_over_budget(state, 0):
        raise _budget_exceeded(state.total)
    return value


_COUNTED = (str, bytes, list, tuple, dict, set, frozenset)


# --- the size of a value's text, known before the text is made ------------------------------
# A legal 3-million-character string referenced 1,000 times from a list is a small list, but its
# text (`{{ l }}`, `|string`, `|tojson`, `~`, `join`, `%`, `.format`) is 3 billion characters:
# every conversion of a value to text is measured here first, without building the text, and
# refused over the limit. The measure is an upper bound computed from lengths (a value referenced
# many times is measured once) and stops as soon as it passes the limit.
_CHUNK = 1 << 16  # strings whose escaped length is not a simple count are measured per chunk


def _escaped_len(text: str, mode: str) -> int:
    """An upper bound of len(repr(text)) ("repr"), len(ascii(text)) ("ascii") or
    len(json.dumps(text)) ("json"; "json_ascii" with ensure_ascii). Printable ASCII costs
    two C-speed counts; other text is escaped chunk by chunk (a bounded buffer)."""
    if text.isascii() and text.isprintable():
        quotes = text.count('"') if mode.startswith("json") else text.count("'")
        return len(text) + text.count("\\") + quotes + 2
    escape: Callable[[str], str] = {
        "repr": repr,
        "ascii": ascii,
        "json": lambda c: json.dumps(c, ensure_ascii=False),
        "json_ascii": json.dumps,
    }[mode]
    total = 2 + text.count("'")  # quotes: repr chooses per string, so each chunk may differ
    for at in range(0, len(text), _CHUNK):
        total += len(escape(text[at : at + _CHUNK])) - 2
    return total


class _Measure:
    """Upper bounds of the text of values, with a budget: `size` returns a number above `limit`
    as soon as the bound passes it, having looked at no more than it needed to."""

    def __init__(self, limit: int = MAX_OUTPUT_CHARS, indent: int | None = None):
        self.limit = limit
        self.indent = indent  # json.dumps's indent: a newline and depth * indent per item
        self._known: dict[tuple[int, str], int] = {}
        self._open: set[int] = set()

    def size(self, value: Any, mode: str = "str", depth: int = 0) -> int:
        """mode: "str" (str(value)), "repr", "ascii", "json" / "json_ascii"."""
        if isinstance(value, str):
            if mode == "str":
                return len(value)
            extra = len(type(value).__name__) + 2 if type(value) is not str else 0  # Markup('')
            key = (id(value), mode)
            if len(value) > _CHUNK and key in self._known:
                return self._known[key]
            size = _escaped_len(value, mode) + extra
            if len(value) > _CHUNK:
                self._known[key] = size
            return size
        if value is None or isinstance(value, (bool, float, complex)):
            return 64
        if isinstance(value, int):
            return value.bit_length() * 3 // 10 + 3  # decimal digits (and a sign) of the number
        if isinstance(value, (bytes, bytearray)):
            return 4 * len(value) + 16
        if isinstance(value, jinja2.runtime.Undefined):
            return 0 if mode == "str" else 64
        if isinstance(value, jinja2.utils.Namespace):
            attrs = object.__getattribute__(value, "_Namespace__attrs")
            return 12 + self.size(attrs, "repr" if mode == "str" else mode, depth)
        items: Any
        if isinstance(value, Mapping) or type(value) in _DICT_VIEWS_WITH_PAIRS:
            pairs = value.items() if isinstance(value, Mapping) else value
            items = [x for pair in pairs for x in pair]
            per_item = 2  # ": " and ", " between them
        elif isinstance(value, (list, tuple, set, frozenset)) or type(value) in _DICT_VIEWS:
            items = value
            per_item = 2
        else:
            # Anything else a template can reach (a loop, a macro, a generator) has a short
            # repr of its own; measuring it costs one short string.
            return len(str(value)) if mode == "str" else len(repr(value))
        key = (id(value), mode)
        if key in self._known:
            return self._known[key]
        if id(value) in self._open:
            return 5  # "[...]": a container that holds itself
        self._open.add(id(value))
        try:
            item_mode = mode if mode.startswith(("json", "ascii")) else "repr"
            if self.indent is not None and mode.startswith("json"):
                per_item += 1 + self.indent * (depth + 1)
            total = len(type(value).__name__) + 4
            for item in items:
                total += self.size(item, item_mode, depth + 1) + per_item
                if total > self.limit:
                    break
        finally:
            self._open.discard(id(value))
        self._known[key] = total
        return total


_DICT_VIEWS: tuple[type, ...] = (type({}.keys()), type({}.values()))
_DICT_VIEWS_WITH_PAIRS: tuple[type, ...] = (type({}.items()),)


def _text_size(value: Any, mode: str = "str") -> int:
    return _Measure().size(value, mode)


def _check_text(what: str, value: Any, mode: str = "str") -> None:
    """Refuse before converting `value` to text when that text would pass the output limit."""
    if not isinstance(value, str) or mode != "str":
        _check_size(what, _text_size(value, mode))


def _listed_for_join(items: Any, sep_len: int) -> list:
    """An iterator's items (|map, |select: each may be a new string) listed for a join, measured
    one by one: the listing stops once their joined text would pass the limit, instead of
    holding every item first (1,000 new 3-million-character strings are 3 GB)."""
    measure, listed, total = _Measure(), list[Any](), 0
    for item in items:
        total += measure.size(item) + (sep_len if listed else 0)
        if total > MAX_OUTPUT_CHARS:
            raise _too_long("a joined string", total)
        listed.append(item)
    return listed


def _joined_length(items: Any, sep_len: int) -> int:
    """Length of `sep.join(map(str, items))`, stopping as soon as it passes the limit; nothing
    is converted (a list inside `items` could be gigabytes as text)."""
    measure = _Measure()
    total = 0
    for i, item in enumerate(items):
        total += measure.size(item) + (sep_len if i else 0)
        if total > MAX_OUTPUT_CHARS:
            break
    return total


# Width and precision of a field: `%-10.3f` (printf style) and `{0:>10.3}` (str.format spec).
_PERCENT_FIELD = re.compile(r"%(?:\([^)]*\))?[#0\- +]*(\d*)(?:\.(\d*))?")
_FORMAT_SPEC = re.compile(r"\{[^{}]*:([^{}]*)\}")
_SPEC_NUMBERS = re.compile(r"\d+")
# A field whose width or precision comes from an argument: `%*s`, `%.*s`, `{:{}}`, `{0:>{1}}`.
_ARGUMENT_WIDTH = re.compile(r"%[#0\- +]*(?:\*|\d*\.\*)|\{[^{}]*:[^{}]*\{")


def _check_format(fmt: Any, args: Sequence[Any], kwargs: Mapping[str, Any] | None = None) -> None:
    """A %-format or str.format string must not ask for a field wider than the output limit."""
    if not isinstance(fmt, str):
        return
    numbers = [n for field in _PERCENT_FIELD.findall(fmt) for n in field if n]
    numbers += [n for spec in _FORMAT_SPEC.findall(fmt) for n in _SPEC_NUMBERS.findall(spec)]
    for number in numbers:
        if len(number) > 7 or int(number) > MAX_OUTPUT_CHARS:
            raise _too_long("a formatted field", int(number[:30]))
    if _ARGUMENT_WIDTH.search(fmt):
        values = [*args, *(kwargs or {}).values()]
        for value in values:
            if _is_int(value) and abs(value) > MAX_OUTPUT_CHARS:
                raise _too_long("a formatted field", abs(value))


def _check_percent(fmt: Any, right: Any) -> None:
    """`fmt % right` (the operator and the |format filter): field widths, then the output."""
    if isinstance(fmt, str):
        _check_format(fmt, right if isinstance(right, tuple) else (right,))
        _check_size("a %-formatted string", _percent_size(fmt, right))


# A %-format field, as Python's printf-style formatting reads it.
_PERCENT_CONVERSION = re.compile(
    r"%(?:\((?P<key>[^)]*)\))?[#0\- +]*(?P<width>\*|\d*)(?:\.(?P<prec>\*|\d*))?[hlL]?"
    r"(?P<conv>[diouxXeEfFgGcrsa%])"
)
_FLOAT_DIGITS = 330  # the integer part of the largest float (1.8e308), its sign and point


def _number_text_size(value: Any, precision: int) -> int:
    """An upper bound of a number's text in a numeric field with that precision."""
    digits = value.bit_length() * 3 // 10 + 3 if _is_int(value) else _FLOAT_DIGITS
    return digits + precision + 8  # exponent, sign, point


def _percent_size(fmt: str, right: Any) -> int:
    """An upper bound of len(fmt % right), stopping once it passes the limit: each field holds
    the text of the value it names (`%(a)s` repeated 1,000 times over a 3-million-character
    value is 3 billion characters from a 5,000-character format)."""
    mapping = right if isinstance(right, Mapping) else None
    args = list(right) if isinstance(right, tuple) else [right]
    measure, total, next_arg = _Measure(), len(fmt), 0

    def take() -> Any:
        nonlocal next_arg
        next_arg += 1
        return args[next_arg - 1] if next_arg <= len(args) else None

    for field in _PERCENT_CONVERSION.finditer(fmt):
        conv = field["conv"]
        if conv == "%":
            continue
        width = take() if field["width"] == "*" else int(field["width"] or 0)
        precision = take() if field["prec"] == "*" else int(field["prec"] or 0)
        if field["key"] is not None and mapping is not None:
            value = mapping.get(field["key"])
        else:
            value = take()
        if conv in "sra":
            size = measure.size(value, {"s": "str", "r": "repr", "a": "ascii"}[conv])
        elif conv == "c":
            size = 1
        else:
            size = _number_text_size(value, precision if _is_int(precision) else 0)
        total += max(size, width if _is_int(width) else 0)
        if total > MAX_OUTPUT_CHARS:
            break
    return total


def _str_format_size(fmt: str, args: Sequence[Any], kwargs: Mapping[str, Any]) -> int:
    """An upper bound of len(fmt.format(*args, **kwargs)), like _percent_size. A field naming an
    element or attribute (`{0[1]}`, `{a.b}`) is bounded by the repr of the value it starts
    from; numbers in the spec (width, precision) are added."""
    measure, total, auto = _Measure(), 0, 0
    try:
        fields = list(string.Formatter().parse(fmt))
    except ValueError:
        return 0  # malformed: str.format raises the same error without building anything
    for literal, name, spec, conv in fields:
        total += len(literal)
        if name is None:
            continue
        base = re.match(r"[^.\[]*", name).group()  # type: ignore[union-attr]
        if base == "":
            value = args[auto] if auto < len(args) else None
            auto += 1
        elif base.isdigit():
            value = args[int(base)] if int(base) < len(args) else None
        else:
            value = kwargs.get(base)
        mode = {"r": "repr", "a": "ascii"}.get(conv or "", "str" if base == name else "repr")
        total += measure.size(value, mode) + sum(int(n) for n in _SPEC_NUMBERS.findall(spec or ""))
        if spec and "{" in spec:
            total += MAX_OUTPUT_CHARS // 2  # a width from an argument: checked to be at most this
        if total > MAX_OUTPUT_CHARS:
            break
    return total


def _check_translate(s: Any, table: Any = None, *_: Any, **__: Any) -> None:
    """str.translate maps each character to a string: one character mapped to a 3-million-
    character string, in a 1,000-character text, is 3 billion characters."""
    if not isinstance(s, str):
        return
    values: Any
    if isinstance(table, Mapping):
        values = table.values()
    elif isinstance(table, (list, tuple)):
        values = table
    else:
        return  # a str table maps to single characters; other objects cannot map to strings
    longest = max((len(v) for v in values if isinstance(v, str)), default=1)
    if len(s) * longest <= MAX_OUTPUT_CHARS:
        return
    total = 0
    for char, count in collections.Counter(s).items():
        try:
            mapped = table[ord(char)]
        except (LookupError, TypeError):
            mapped = char
        total += count * (len(mapped) if isinstance(mapped, str) else mapped is not None)
        if total > MAX_OUTPUT_CHARS:
            break
    _check_size("a translated string", total)


MAX_TRANSLATE_ENTRIES = 100_000  # a maketrans table of a million entries is ~100 MB of dict


def _check_maketrans(owner: Any, x: Any = None, y: Any = None, *_: Any, **__: Any) -> None:
    entries = len(x) if isinstance(x, (str, Mapping)) else 0
    if entries > MAX_TRANSLATE_ENTRIES:
        raise _LimitExceeded(
            "item count",
            f"maketrans with {entries} entries exceeds the {MAX_TRANSLATE_ENTRIES}-entry limit",
        )


def _lines(text: Any) -> int:
    _check_text("a string", text)
    return str(text).count("\n") + 1


# Size checks for the filters (and str methods) whose output can be far larger than their input.
# Each takes the filter's own arguments and raises before the filter runs.
def _check_center(value: Any, width: Any = 80, *_: Any, **__: Any) -> None:
    _check_text("a string to pad", value)
    if _is_int(width):
        _check_size("a padded string", width)


def _check_indent(s: Any, width: Any = 4, *_: Any, **__: Any) -> None:
    _check_text("an indent", width)
    pad = width if _is_int(width) else len(str(width))
    _check_size("an indented string", _text_size(s) + pad * _lines(s))


def _check_wordwrap(s: Any, width: Any = 79, _break: Any = True, wrapstring: Any = None,
                    *_: Any, **kwargs: Any) -> None:  # fmt: skip
    _check_text("a string to wrap", s)
    wrap = kwargs.get("wrapstring", wrapstring)
    if isinstance(wrap, str) and wrap:
        width = kwargs.get("width", width)
        n_breaks = len(str(s)) // max(width if _is_int(width) else 1, 1) + _lines(s)
        _check_size("a word-wrapped string", len(str(s)) + len(wrap) * n_breaks)


def _check_value_text(value: Any, *_: Any, **kwargs: Any) -> None:
    """Filters that turn their value into text first (|string, |upper, |escape, ...)."""
    _check_text("the text of a value", value)
    for argument in kwargs.values():
        _check_text("the text of an argument", argument)


def _check_pprint(value: Any, *_: Any, **__: Any) -> None:
    # pformat's indentation at most doubles the repr of what it lays out
    _check_size("a pretty-printed value", 2 * _text_size(value, "repr"))


def _check_xmlattr(d: Any, *_: Any, **__: Any) -> None:
    if isinstance(d, Mapping):
        _check_size("XML attributes", _joined_length([*d.keys(), *d.values()], 4))


def _check_replace(s: Any, old: Any, new: Any, count: Any = None, *_: Any, **__: Any) -> None:
    for part in (s, old, new):
        _check_text("a string to replace in", part)
    s, old, new = str(s), str(old), str(new)
    hits = s.count(old) if old else len(s) + 1
    if _is_int(count) and count >= 0:
        hits = min(hits, count)
    _check_size("a string after replace", len(s) + hits * max(len(new) - len(old), 0))


def _check_batch(value: Any, linecount: Any, *_: Any, **__: Any) -> None:
    if _is_int(linecount) and linecount > MAX_RANGE_ITEMS:
        raise _LimitExceeded(
            "item count", f"batch({linecount}) exceeds the {MAX_RANGE_ITEMS}-item limit"
        )


def _check_format_filter(value: Any, *args: Any, **kwargs: Any) -> None:
    _check_text("a format string", value)
    _check_percent(str(value), kwargs or args)  # jinja's |format is `value % (kwargs or args)`


def _check_tojson(value: Any, ensure_ascii: Any = False, indent: Any = None, *_: Any,
                  **kwargs: Any) -> None:  # fmt: skip
    indent = kwargs.get("indent", indent)
    width = indent if _is_int(indent) else len(indent) if isinstance(indent, str) else 0
    if width > MAX_JSON_INDENT:
        raise _LimitExceeded(
            "output size", f"tojson indent {width} exceeds the limit of {MAX_JSON_INDENT}"
        )
    ascii_only = kwargs.get("ensure_ascii", ensure_ascii)
    measure = _Measure(indent=width if indent is not None else None)
    _check_size("a JSON text", measure.size(value, "json_ascii" if ascii_only else "json"))


def _join_filter(join: Callable[..., str]) -> Callable[..., str]:
    """jinja's |join with the joined length checked first. An iterator (|map, |select) is
    listed first, so that its items can be measured and then joined (references only)."""

    @jinja2.pass_eval_context
    @functools.wraps(join)
    def checked(eval_ctx: Any, value: Any, d: Any = "", attribute: Any = None) -> str:
        if attribute is not None:
            getter = jinja2.filters.make_attrgetter(eval_ctx.environment, attribute)
            value = map(getter, value)
        _check_text("a join separator", d)
        sep = len(str(d))
        if not isinstance(value, (str, list, tuple)):
            value = _listed_for_join(value, sep)
        if isinstance(value, str):
            size = len(value) + sep * max(len(value) - 1, 0)
        else:
            size = _joined_length(value, sep)
        _check_size("a joined string", size)
        return join(eval_ctx, value, d)

    return checked


_FILTER_CHECKS: dict[str, Callable[..., None]] = {
    "center": _check_center,
    "indent": _check_indent,
    "wordwrap": _check_wordwrap,
    "replace": _check_replace,
    "pprint": _check_pprint,
    "xmlattr": _check_xmlattr,
    # filters that turn their value into text before anything else
    **dict.fromkeys(
        [
            "string",
            "safe",
            "e",
            "escape",
            "forceescape",
            "trim",
            "upper",
            "lower",
            "title",
            "capitalize",
            "striptags",
            "urlize",
            "urlencode",
            "wordcount",
            "truncate",
        ],
        _check_value_text,
    ),
    "batch": _check_batch,
    "slice": _check_batch,
    "format": _check_format_filter,
    "tojson": _check_tojson,
}

# str methods a template can call; same hazards as the filters.
_STR_METHOD_CHECKS: dict[str, Callable[..., None]] = {
    "center": _check_center,
    "ljust": _check_center,
    "rjust": _check_center,
    "zfill": _check_center,
    "expandtabs": lambda s, tabsize=8, *_, **__: _check_size(
        "a string with expanded tabs", len(s) * max(tabsize if _is_int(tabsize) else 8, 1)
    ),
    "replace": _check_replace,
    "join": lambda sep, items, *_, **__: _check_size(
        "a joined string", _joined_length(items, len(sep))
    ),
    "translate": _check_translate,
    "maketrans": _check_maketrans,
}


def _guarded(filter_fn: Callable[..., Any], check: Callable[..., None]) -> Callable[..., Any]:
    """`filter_fn` with `check` run on its arguments first. functools.wraps keeps jinja's
    pass_environment / pass_eval_context marker, whose extra first argument the check skips."""
    skip = 1 if hasattr(filter_fn, "jinja_pass_arg") else 0

    @functools.wraps(filter_fn)
    def guarded(*args: Any, **kwargs: Any) -> Any:
        check(*args[skip:], **kwargs)
        return filter_fn(*args, **kwargs)

    return guarded


def _charged(filter_fn: Callable[..., Any]) -> Callable[..., Any]:
    """`filter_fn` with its result added to the render's produced total (a filter over a lazy
    iterator, |map, counts each item it makes as |list or |join draws it)."""

    @functools.wraps(filter_fn)
    def charged(*args: Any, **kwargs: Any) -> Any:
        return _charge(filter_fn(*args, **kwargs), *args, *kwargs.values())

    return charged


def _lipsum(n: int = 5, html: bool = True, min: int = 20, max: int = 100) -> str:
    words = (n if _is_int(n) else 0) * (max if _is_int(max) else 0)
    _check_size("lipsum text", words * 12)  # ~12 characters per word with punctuation
    return jinja2.utils.generate_lorem_ipsum(n=n, html=html, min=min, max=max)


def _checked_concat(parts: Sequence[Any]) -> str:
    """`a ~ b ~ c` (jinja's Concat node), with the result's length checked before it is built
    (and before any part that is not a string is turned into text)."""
    size = _joined_length(parts, 0)
    _check_size("a concatenated string", size)
    _precheck_produced(size)
    return _charge("".join(part if isinstance(part, str) else str(part) for part in parts), *parts)


def _checked_join(parts: Any) -> str:
    """jinja's `concat` (the text of a block: `{% set %}...{% endset %}`, a macro, a call or
    filter block), with its length checked before the pieces are joined."""
    parts = parts if isinstance(parts, list) else list(parts)
    size = sum(len(part) for part in parts)
    _check_size("the text of a block", size)
    _precheck_produced(size)
    return _charge("".join(parts), *parts)


def _finalize(value: Any) -> Any:
    """Every `{{ value }}` passes here before jinja turns it into text."""
    if not isinstance(value, str):
        _check_size("the text of a value", _text_size(value))
    return value


class _CheckedCodeGenerator(CodeGenerator):
    """Compiles `~` to the environment's size-checked concatenation instead of a bare join
    (autoescape is off in this environment, so jinja's str_join is the only case to replace)."""

    def visit_Concat(self, node: jinja2.nodes.Concat, frame: Any) -> None:
        self.write("environment.checked_concat((")
        for arg in node.nodes:
            self.visit(arg, frame)
            self.write(", ")
        self.write("))")


class _Sandbox(ImmutableSandboxedEnvironment):
    intercepted_binops = frozenset({"*", "**", "+", "%"})
    code_generator_class = _CheckedCodeGenerator
    checked_concat = staticmethod(_checked_concat)
    concat = staticmethod(_checked_join)

    def unsafe_undefined(self, obj: Any, attribute: str):
        # jinja's default returns an Undefined that renders as "", hiding the attempt.
        raise SecurityError(
            f"access to attribute {attribute!r} of a {type(obj).__name__!r} object is not allowed"
        )

    def call_binop(self, context, operator: str, left: Any, right: Any) -> Any:
        if operator == "*":
            for seq, count in ((left, right), (right, left)):
                if isinstance(seq, (str, list, tuple)) and _is_int(count):
                    _check_size("a repeated sequence", len(seq) * count)
                    _precheck_produced(len(seq) * count)
            if _is_int(left) and _is_int(right):
                _check_int_bits("a product", left.bit_length() + right.bit_length())
        elif operator == "**":
            if _is_int(left) and _is_int(right) and right > 0 and abs(left) > 1:
                _check_int_bits("a power", left.bit_length() * right)
            elif isinstance(right, (int, float)) and abs(right) > MAX_INT_BITS:
                raise _LimitExceeded("integer size", f"exponent {right} is too large")
        elif operator == "+":
            if isinstance(left, (str, list, tuple)) and isinstance(right, (str, list, tuple)):
                _check_size("a concatenation", len(left) + len(right))
                _precheck_produced(len(left) + len(right))
        elif operator == "%" and isinstance(left, str):
            _check_percent(left, right)
        return _charge(super().call_binop(context, operator, left, right), left, right)

    def wrap_str_format(self, value: Any) -> Callable[..., str] | None:
        # jinja swaps str.format / format_map for a sandboxed formatter when the attribute is
        # read; the width check goes in front of that.
        wrapped = super().wrap_str_format(value)
        if wrapped is None:
            return None
        fmt, is_map = value.__self__, value.__name__ == "format_map"

        def checked(*args: Any, **kwargs: Any) -> str:
            mapping = args[0] if is_map and args and isinstance(args[0], Mapping) else kwargs
            positional = [] if is_map else args
            _check_format(fmt, positional, mapping)
            _check_size("a formatted string", _str_format_size(fmt, positional, mapping))
            return wrapped(*args, **kwargs)

        return checked

    def call(__self, __context, __obj, *args: Any, **kwargs: Any) -> Any:
        owner = getattr(__obj, "__self__", None)
        if __obj is str.maketrans:  # a static method: ''.maketrans has no __self__
            _check_maketrans(None, *args)
        if isinstance(owner, str):
            name = getattr(__obj, "__name__", "")
            if name == "join" and args and not isinstance(args[0], (list, tuple, str)):
                args = (_listed_for_join(args[0], len(owner)), *args[1:])
            check = _STR_METHOD_CHECKS.get(name)
            if check is not None:
                check(owner, *args, **kwargs)
        result = super().call(__context, __obj, *args, **kwargs)
        return _charge(result, __obj, owner, *args, *kwargs.values())


def _budgeted_range():
    """A range() for one render whose items, over all calls, stay under MAX_RANGE_ITEMS, so
    nested loops cannot spin for hours."""
    used = 0

    def range_(*args: int) -> range:
        nonlocal used
        items = range(*args)
        used += len(items)
        if used > MAX_RANGE_ITEMS:
            raise _LimitExceeded(
                "loop items", f"the template asked for more than {MAX_RANGE_ITEMS} loop items"
            )
        return items

    return range_


def _environment() -> jinja2.Environment:
    env = _Sandbox(
        trim_blocks=True,
        lstrip_blocks=True,
        extensions=[jinja2.ext.loopcontrols, _GenerationBlock],
        finalize=_finalize,
    )
    env.filters["tojson"] = _tojson
    for name, check in _FILTER_CHECKS.items():
        env.filters[name] = _guarded(env.filters[name], check)
    env.filters["join"] = _join_filter(env.filters["join"])
    for name, filter_fn in env.filters.items():
        env.filters[name] = _charged(filter_fn)
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    env.globals["lipsum"] = _lipsum
    return env


class _Abandoned(BaseException):
    """Raised inside the render thread once its caller has stopped waiting (deadline, cancel).
    A BaseException so that no `except Exception` inside jinja can swallow it."""


def _run_abandonable(
    work: Callable[[], Any], timeout: float, cancel: Any = None, *, trace: bool = True
) -> Any:
    """Run `work` in a daemon thread; return its result, or raise _LimitExceeded when it takes
    longer than `timeout` and TemplateCancelled when `cancel.cancelled` turns true.

    The caller never waits past the deadline. A Python thread cannot be killed, so the thread is
    told to stop instead: a trace function raises _Abandoned on the next line the template's own
    code runs (loops, macro calls). A single C-level operation cannot be interrupted that way;
    the size limits above are what bound those. `trace=False` skips the trace function (compiling
    runs no template loops, and tracing jinja's parser would double the load time).
    """
    stop = threading.Event()
    done = threading.Event()
    outcome: dict[str, Any] = {}

    def on_line(frame, event, arg):
        if stop.is_set():
            raise _Abandoned
        return on_line

    def on_call(frame, event, arg):
        if stop.is_set():
            raise _Abandoned
        return on_line if frame.f_code.co_filename == _TEMPLATE_CODE_FILENAME else None

    def target() -> None:
        if trace:
            sys.settrace(on_call)
        try:
            outcome["value"] = work()
        except _Abandoned:
            pass
        except BaseException as exc:  # handed to the caller, which decides what it means
            # The template's frames hold what it made (up to the produced budget); the error
            # kept by the caller must not keep them alive (its line numbers stay readable).
            traceback.clear_frames(exc.__traceback__)
            outcome["error"] = exc
        finally:
            sys.settrace(None)
            done.set()

    thread = threading.Thread(target=target, name="chat-template", daemon=True)
    thread.start()
    deadline = time.monotonic() + timeout
    try:
        while not done.wait(min(0.05, max(deadline - time.monotonic(), 0.0))):
            if cancel is not None and cancel.cancelled:
                raise TemplateCancelled("rendering the chat template was cancelled")
            if time.monotonic() >= deadline:
                raise _LimitExceeded(
                    "time", f"rendering took longer than the {timeout:g} s limit and was abandoned"
                )
    finally:
        stop.set()
    thread.join()  # done: it only has to let go of its frames (what the template made)
    if "error" in outcome:
        raise outcome["error"]
    return outcome["value"]


def _template_line(tb: types.TracebackType | None) -> int | None:
    """Line in the template where a render error happened (jinja maps frames to template lines)."""
    line = None
    while tb is not None:
        if tb.tb_frame.f_code.co_filename == TEMPLATE_FILENAME:
            line = tb.tb_lineno
        tb = tb.tb_next
    return line


class ChatTemplate:
    """A compiled chat template. `render(messages)` gives the prompt text."""

    def __init__(self, source: str, *, name: str, is_fallback: bool = False, bos_token: str = "",
                 eos_token: str = "", strip_leading_bos: bool = False):  # fmt: skip
        self.source = source
        self.name = name
        self.is_fallback = is_fallback
        self.bos_token = bos_token
        self.eos_token = eos_token
        self._strip_leading_bos = strip_leading_bos and bool(bos_token)
        # A broken template does not stop the model from loading (raw prompts still work): the
        # error is kept in `.error` (for `info` and the app to show) and raised by render().
        self.error: ChatTemplateError | None = None
        self._template: jinja2.Template | None = None
        try:
            # Compiling runs template code too (jinja folds constant expressions such as
            # `'x'|center(10**9)` while compiling), so it gets the same limits and deadline.
            self._template = _run_abandonable(
                lambda: _environment().from_string(source), RENDER_TIMEOUT_S, trace=False
            )
            self._template.filename = TEMPLATE_FILENAME
        except TemplateSyntaxError as exc:
            self.error = ChatTemplateError(
                f"the chat template {name!r} has a syntax error on line {exc.lineno}: {exc.message}"
            )
        except _LimitExceeded as exc:
            self.error = ChatTemplateLimitError(
                exc.limit, f"the chat template {name!r} cannot be compiled: {exc}"
            )
        except Exception as exc:  # TemplateError, RecursionError on absurd nesting, ...
            self.error = ChatTemplateError(
                f"the chat template {name!r} cannot be compiled: {type(exc).__name__}: {exc}"
            )

    # --- construction ------------------------------------------------------------------------
    @classmethod
    def from_gguf(cls, gguf_file, tokenizer) -> ChatTemplate:
        return cls.from_metadata(gguf_file.metadata, tokenizer)

    @classmethod
    def from_metadata(cls, metadata: Mapping[str, Any], tokenizer) -> ChatTemplate:
        bos = _token_text(tokenizer, tokenizer.bos_id)
        eos = _token_text(tokenizer, tokenizer.eos_id)
        common: dict[str, Any] = dict(
            bos_token=bos, eos_token=eos, strip_leading_bos=bool(tokenizer.add_bos)
        )
        source = metadata.get("tokenizer.chat_template")
        if isinstance(source, str) and source.strip():
            return cls(source, name=_guess_name(source), **common)
        if _is_gemma(metadata, tokenizer):
            return cls(GEMMA_TEMPLATE, name="gemma (fallback)", is_fallback=True, **common)
        return cls(CHATML_TEMPLATE, name="chatml (fallback)", is_fallback=True, **common)

    # --- rendering ---------------------------------------------------------------------------
    @property
    def accepts_enable_thinking(self) -> bool:
        """Whether the template reads `enable_thinking` (Qwen3's switch for its <think> block):
        then a request's enable_thinking turns the model's reasoning on or off."""
        return bool(re.search(r"\benable_thinking\b", self.source))

    def render(
        self,
        messages: Sequence[Mapping[str, Any]],
        add_generation_prompt: bool = True,
        *,
        cancel: Any = None,
        timeout: float = RENDER_TIMEOUT_S,
        **extra: Any,
    ) -> str:
        """Prompt text for `messages` ([{"role": ..., "content": ...}, ...]). Raises
        ChatTemplateError naming the problem (syntax, unsafe access, raise_exception, ...), its
        subclass ChatTemplateLimitError naming the resource limit a hostile template hit, and
        TemplateCancelled when `cancel` (anything with a `.cancelled` flag, e.g. the request's
        CancelToken) is set while rendering. Never blocks the caller longer than `timeout`."""
        if self.error is not None:
            raise self.error
        template = self._template
        assert template is not None  # compiled whenever self.error is None
        _check_messages(messages)
        variables = {
            "bos_token": self.bos_token,
            "eos_token": self.eos_token,
            **extra,
            "range": _budgeted_range(),
            "messages": [dict(m) for m in messages],
            "add_generation_prompt": bool(add_generation_prompt),
        }
        produced = _Produced()
        error: ChatTemplateError | None = None
        try:
            text = _run_abandonable(
                lambda: self._render_bounded(template, variables, produced), timeout, cancel
            )
        except TemplateCancelled:
            raise
        except _TemplateRaised as exc:
            error = ChatTemplateError(
                f"the chat template {self.name!r} refused the conversation: {exc}"
            )
        except _LimitExceeded as exc:
            error = ChatTemplateLimitError(
                exc.limit, f"the chat template {self.name!r} hit the {exc.limit} limit: {exc}"
            )
        except RecursionError:
            error = ChatTemplateLimitError(
                "recursion depth",
                f"the chat template {self.name!r} hit the recursion depth limit "
                "(a macro or loop calls itself without end)",
            )
        except SecurityError as exc:
            error = ChatTemplateError(
                f"the chat template {self.name!r} tried an unsafe operation: {exc}"
            )
        except (
            Exception
        ) as exc:  # any error inside untrusted template code is the template's problem
            line = _template_line(exc.__traceback__)
            where = f" on line {line}" if line is not None else ""
            error = ChatTemplateError(
                f"the chat template {self.name!r} failed{where}: {type(exc).__name__}: {exc}"
            )
        if produced.total > MAX_PRODUCED_BYTES // 4:
            # What the template made sits in reference cycles (its context, its frames in the
            # error's traceback, dropped above); collected now, a next render cannot add its
            # own budget on top of it.
            gc.collect()
        if error is not None:
            raise error  # outside the handlers: no chain back to the template's frames
        if self._strip_leading_bos and text.startswith(self.bos_token):
            text = text[len(self.bos_token) :]
        return text

    def _render_bounded(
        self, template: jinja2.Template, variables: dict[str, Any], produced: _Produced
    ) -> str:
        _render_state.produced = produced  # this thread runs this one render
        # template.generate(), with its context kept: the template's top-level variables sit in a
        # reference cycle there, and would hold what it made (up to the produced budget) until
        # the next garbage collection, so that a second render could add as much again.
        context = template.new_context(variables)
        try:
            parts, size = [], 0
            for chunk in self._chunks(template, context):
                size += len(chunk)
                if size > MAX_OUTPUT_CHARS:
                    raise _LimitExceeded(
                        "output size", f"the rendered prompt exceeds {MAX_OUTPUT_CHARS} characters"
                    )
                parts.append(chunk)
            return "".join(parts)
        finally:
            context.vars.clear()
            context.exported_vars.clear()
            produced.last = None  # may be a list of everything the template made
            _render_state.produced = None

    @staticmethod
    def _chunks(template: jinja2.Template, context: jinja2.runtime.Context) -> Any:
        try:
            yield from template.root_render_func(context)
        except Exception:
            template.environment.handle_exception()  # re-raises, with the template's line numbers

    def __repr__(self) -> str:
        return f"ChatTemplate(name={self.name!r}, is_fallback={self.is_fallback})"


def _token_text(tokenizer, token_id: int | None) -> str:
    return tokenizer.tokens[token_id] if token_id is not None else ""


def _is_gemma(metadata: Mapping[str, Any], tokenizer) -> bool:
    arch = str(metadata.get("general.architecture", ""))
    if arch.startswith("gemma"):
        return True
    return (
        tokenizer.token_id("<start_of_turn>") is not None
        and tokenizer.token_id("<|im_start|>") is None
    )


def _guess_name(source: str) -> str:
    """A readable name for the file's template, from the turn markers it writes."""
    for marker, name in (
        ("<|im_start|>", "chatml"),
        ("<start_of_turn>", "gemma"),
        ("<|start_header_id|>", "llama3"),
        ("[INST]", "mistral/llama2"),
        ("<|user|>", "zephyr/phi"),
        ("<|start|>", "harmony"),  # gpt-oss: <|start|>role<|channel|>...<|message|>...<|end|>
    ):
        if marker in source:
            return f"{name} (from the model file)"
    return "custom (from the model file)"


def _check_messages(messages: Any) -> None:
    if isinstance(messages, (str, bytes)) or not isinstance(messages, Sequence):
        raise ChatTemplateError(
            f"messages must be a list of {{'role': ..., 'content': ...}} dicts, got {type(messages).__name__}"
        )
    for i, message in enumerate(messages):
        if not isinstance(message, Mapping):
            raise ChatTemplateError(
                f"messages[{i}] must be a dict with 'role' and 'content', got {type(message).__name__}"
            )
        role = message.get("role")
        if not isinstance(role, str) or not role:
            raise ChatTemplateError(f"messages[{i}] needs a non-empty string 'role', got {role!r}")
