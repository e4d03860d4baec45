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

A file without a template gets a named fallback: Gemma's turn format for Gemma models (whose
vocabulary has `<start_of_turn>`; the system prompt goes in front of the first user turn, as
Gemma's own template does), ChatML otherwise.
"""

from __future__ import annotations

import json
import types
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

import jinja2
import jinja2.ext
import jinja2.nodes
from jinja2.exceptions import SecurityError, TemplateError, TemplateSyntaxError
from jinja2.sandbox import ImmutableSandboxedEnvironment

from engine.errors import ChatTemplateError

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
# these only stop a hostile one from hanging or filling memory (the sandbox itself only caps a
# single range() at 100k items).
MAX_OUTPUT_CHARS = 4_000_000
MAX_RANGE_ITEMS = 1_000_000  # summed over every range() call of one render


class _Sandbox(ImmutableSandboxedEnvironment):
    intercepted_binops = frozenset({"*", "**"})

    def unsafe_undefined(self, obj: Any, attribute: str):
        # jinja's default returns an Undefined that renders as "", hiding the attempt.
        raise SecurityError(
            f"access to attribute {attribute!r} of a {type(obj).__name__!r} object is not allowed"
        )

    def call_binop(self, context, operator: str, left: Any, right: Any) -> Any:
        if operator == "*":
            for seq, count in ((left, right), (right, left)):
                if (
                    isinstance(seq, (str, list, tuple))
                    and isinstance(count, int)
                    and len(seq) * count > MAX_OUTPUT_CHARS
                ):
                    raise SecurityError(
                        f"repeating a sequence {count} times exceeds the {MAX_OUTPUT_CHARS}-item limit"
                    )
        if operator == "**" and isinstance(right, (int, float)) and abs(right) > 1024:
            raise SecurityError(f"exponent {right} is too large")
        return super().call_binop(context, operator, left, right)


def _budgeted_range():
    """A range() for one render whose items, over all calls, stay under MAX_RANGE_ITEMS, so
    nested loops cannot spin for hours."""
    used = 0

    def range_(*args: int) -> range:
        nonlocal used
        items = range(*args)
        used += len(items)
        if used > MAX_RANGE_ITEMS:
            raise SecurityError(f"the template asked for more than {MAX_RANGE_ITEMS} loop items")
        return items

    return range_


def _environment() -> jinja2.Environment:
    env = _Sandbox(
        trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols, _GenerationBlock]
    )
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    return env


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
        self._template = None
        try:
            self._template = _environment().from_string(source)
            self._template.filename = TEMPLATE_FILENAME
        except TemplateSyntaxError as exc:
            self.error = ChatTemplateError(
                f"the chat template {name!r} has a syntax error on line {exc.lineno}: {exc.message}"
            )
        except TemplateError as exc:
            self.error = ChatTemplateError(f"the chat template {name!r} cannot be compiled: {exc}")

    # --- construction ------------------------------------------------------------------------
    @classmethod
    def from_gguf(cls, gguf_file, tokenizer) -> ChatTemplate:
        return cls.from_metadata(gguf_file.metadata, tokenizer)

    @classmethod
    def from_metadata(cls, metadata: Mapping[str, Any], tokenizer) -> ChatTemplate:
        bos = _token_text(tokenizer, tokenizer.bos_id)
        eos = _token_text(tokenizer, tokenizer.eos_id)
        common = dict(bos_token=bos, eos_token=eos, strip_leading_bos=bool(tokenizer.add_bos))
        source = metadata.get("tokenizer.chat_template")
        if isinstance(source, str) and source.strip():
            return cls(source, name=_guess_name(source), **common)
        if _is_gemma(metadata, tokenizer):
            return cls(GEMMA_TEMPLATE, name="gemma (fallback)", is_fallback=True, **common)
        return cls(CHATML_TEMPLATE, name="chatml (fallback)", is_fallback=True, **common)

    # --- rendering ---------------------------------------------------------------------------
    def render(
        self,
        messages: Sequence[Mapping[str, Any]],
        add_generation_prompt: bool = True,
        **extra: Any,
    ) -> str:
        """Prompt text for `messages` ([{"role": ..., "content": ...}, ...]). Raises
        ChatTemplateError naming the problem (syntax, unsafe access, raise_exception, ...)."""
        if self.error is not None:
            raise self.error
        _check_messages(messages)
        variables = {
            "bos_token": self.bos_token,
            "eos_token": self.eos_token,
            **extra,
            "range": _budgeted_range(),
            "messages": [dict(m) for m in messages],
            "add_generation_prompt": bool(add_generation_prompt),
        }
        try:
            text = self._render_bounded(variables)
        except _TemplateRaised as exc:
            raise ChatTemplateError(
                f"the chat template {self.name!r} refused the conversation: {exc}"
            ) from None
        except SecurityError as exc:
            raise ChatTemplateError(
                f"the chat template {self.name!r} tried an unsafe operation: {exc}"
            ) from None
        except (
            Exception
        ) as exc:  # any error inside untrusted template code is the template's problem
            line = _template_line(exc.__traceback__)
            where = f" on line {line}" if line is not None else ""
            raise ChatTemplateError(
                f"the chat template {self.name!r} failed{where}: {type(exc).__name__}: {exc}"
            ) from None
        if self._strip_leading_bos and text.startswith(self.bos_token):
            text = text[len(self.bos_token) :]
        return text

    def _render_bounded(self, variables: dict[str, Any]) -> str:
        parts, size = [], 0
        for chunk in self._template.generate(**variables):
            size += len(chunk)
            if size > MAX_OUTPUT_CHARS:
                raise SecurityError(f"the rendered prompt exceeds {MAX_OUTPUT_CHARS} characters")
            parts.append(chunk)
        return "".join(parts)

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
