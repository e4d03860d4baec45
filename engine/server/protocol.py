"""OpenAI request bodies -> engine requests.

`parse_chat(body, model_names, vocab_size=N)` and `parse_completion(...)` check the fields the
server implements and return a `ParsedRequest` (the engine's GenerationRequest plus what the
response needs: streaming, usage chunk, logprobs). A bad value raises ConfigValidationError with
the OpenAI field name (e.g. "max_tokens", "messages[1].content", "response_format.json_schema")
or an ApiError; the app answers 400 in OpenAI's error shape. Anywhere in the body, a string (or
key) holding a lone UTF-16 surrogate (`"\ud800"` unpaired: JSON allows the escape, UTF-8 cannot
encode it) is refused naming where it is; token ids (a completions prompt given as ids) must lie
in [0, vocab_size).

Fields the OpenAI API has and this server does not implement (`user`, `metadata`, `store`,
`service_tier`, `parallel_tool_calls`, ...) are ignored, as OpenAI ignores fields it does not
know. Fields whose silent omission would change the answer a client asked for are refused
instead: n > 1, best_of > 1, echo, suffix, a non-empty logit_bias, the legacy `functions` /
`function_call` (send `tools` / `tool_choice`).

Tools: `tools` and `tool_choice` become GenerationRequest.tools / tool_choice as they are; the
engine validates them when the request is planned (engine.tool_calls.spec), and its
ConfigValidationError names the field (`tools[0].function.name`, `tool_choice`), which the app
answers as a 400. In the history, an assistant message may carry `tool_calls` (OpenAI's
{"id", "type": "function", "function": {"name", "arguments": JSON text}}) and `role: "tool"`
messages carry a result (`content`) and the `tool_call_id` they answer.

Sampling values a request leaves out (or sends as null) come from the model's own preset, as in
the desktop app (`python -m engine info MODEL` lists them). `temperature: 0` means greedy and any
temperature > 0 samples. `max_tokens` (or `max_completion_tokens`) left out means "until the
context window is full" for chat and 16 for /v1/completions (OpenAI's documented default there).
"""

from __future__ import annotations

import json
import math
from collections.abc import Collection
from dataclasses import dataclass
from typing import Any

from engine.errors import ConfigValidationError
from engine.generation_config import GenerationConfig
from engine.server.api_errors import ApiError
from engine.types import GenerationRequest, JsonMode, Role

CHAT, COMPLETION = "chat", "completion"
COMPLETIONS_DEFAULT_MAX_TOKENS = 16  # OpenAI's default for /v1/completions
MAX_CHAT_TOP_LOGPROBS = 20  # OpenAI's limit for chat top_logprobs
MAX_COMPLETION_LOGPROBS = 20  # OpenAI says 5; the engine serves up to 20 alternatives
MAX_MESSAGES = 4096

# OpenAI (and llama.cpp-server) sampling field -> GenerationConfig field
SAMPLING_FIELDS = {
    "top_p": "top_p",
    "top_k": "top_k",
    "min_p": "min_p",
    "presence_penalty": "presence_penalty",
    "frequency_penalty": "frequency_penalty",
    "repetition_penalty": "repetition_penalty",
    "repeat_penalty": "repetition_penalty",  # llama.cpp server's name
    "repeat_last_n": "repeat_last_n",
    "seed": "seed",
}
# "developer" is OpenAI's newer name for the system role
CHAT_ROLES = {"system": Role.SYSTEM, "developer": Role.SYSTEM, "user": Role.USER}
CHAT_ROLES["assistant"] = Role.ASSISTANT
CHAT_ROLES["tool"] = Role.TOOL


@dataclass
class ParsedRequest:
    kind: str  # CHAT or COMPLETION
    model: str  # as the client named it
    request: GenerationRequest
    stream: bool
    include_usage: bool  # stream_options.include_usage: a last chunk with usage
    logprobs: bool  # report each token's logprob
    top_logprobs: int  # alternatives per token (0..20)
    # tool_choice "required" or a named function: every call is decoded under the call grammar,
    # so its deltas can be streamed as they form (see engine/server/responses.py)
    tools_constrained: bool = False


def parse_chat(
    body: Any, model_names: Collection[str], *, vocab_size: int | None = None
) -> ParsedRequest:
    fields = _object(body, "body")
    _refuse_lone_surrogates(fields)
    model = _model(fields, model_names)
    messages = _messages(fields.get("messages"))
    logprobs = _optional_bool(fields, "logprobs") or False
    top = _optional_int(fields, "top_logprobs", 0, MAX_CHAT_TOP_LOGPROBS)
    if top and not logprobs:
        raise ConfigValidationError("top_logprobs", top, "used together with logprobs: true")
    _refuse_unsupported(fields, ("functions", "function_call"))
    request = GenerationRequest(messages=messages)
    request.overrides = _overrides(fields, default_max_tokens=None)
    request.json_mode, request.json_schema = _response_format(fields.get("response_format"))
    request.top_logprobs = top or 0
    tools, choice = fields.get("tools"), fields.get("tool_choice")
    if tools is not None:
        request.tools = tools  # checked by the engine when planned (typed, field-named)
    if choice is not None:
        request.tool_choice = choice
    constrained = bool(tools) and (choice == "required" or isinstance(choice, dict))
    stream, include_usage = _stream(fields)
    return ParsedRequest(
        CHAT, model, request, stream, include_usage, logprobs, top or 0, constrained
    )


def parse_completion(
    body: Any, model_names: Collection[str], *, vocab_size: int | None = None
) -> ParsedRequest:
    fields = _object(body, "body")
    _refuse_lone_surrogates(fields)
    model = _model(fields, model_names)
    request = _completion_prompt(fields.get("prompt"), vocab_size)
    top = _optional_int(fields, "logprobs", 0, MAX_COMPLETION_LOGPROBS)
    if _optional_bool(fields, "echo"):
        raise ConfigValidationError("echo", True, "false (echoing the prompt is not supported)")
    if fields.get("suffix") not in (None, ""):
        raise ConfigValidationError("suffix", fields["suffix"], "null (insertion is not supported)")
    best_of = _optional_int(fields, "best_of", 1, None)
    if best_of not in (None, 1):
        raise ConfigValidationError("best_of", best_of, "1 (one completion per request)")
    request.overrides = _overrides(fields, default_max_tokens=COMPLETIONS_DEFAULT_MAX_TOKENS)
    request.json_mode, request.json_schema = _response_format(fields.get("response_format"))
    request.top_logprobs = top or 0
    stream, include_usage = _stream(fields)
    return ParsedRequest(
        COMPLETION, model, request, stream, include_usage, top is not None, top or 0
    )


# --- pieces ----------------------------------------------------------------------------------------
def _object(value: Any, name: str) -> dict:
    if not isinstance(value, dict):
        raise ConfigValidationError(name, _short(value), "a JSON object")
    return value


def _model(fields: dict, model_names: Collection[str]) -> str:
    model = fields.get("model")
    if not isinstance(model, str) or not model:
        raise ConfigValidationError("model", model, "the name of the served model (GET /v1/models)")
    if model not in model_names:
        # names only: an alias may be the model's path on this machine, not for clients to see
        names = sorted(n for n in model_names if not any(sep in n for sep in "/\\"))
        raise ApiError(
            404,
            f"The model {model[:100]!r} does not exist on this server; it serves "
            f"{', '.join(repr(n) for n in names)} (GET /v1/models)",
            param="model",
            code="model_not_found",
        )
    return model


def _messages(value: Any) -> list[dict]:
    if not isinstance(value, list) or not value:
        raise ConfigValidationError("messages", _short(value), "a non-empty array of messages")
    if len(value) > MAX_MESSAGES:
        raise ConfigValidationError("messages", len(value), f"at most {MAX_MESSAGES} messages")
    out = []
    for i, message in enumerate(value):
        where = f"messages[{i}]"
        message = _object(message, where)
        role = message.get("role")
        if role not in CHAT_ROLES:
            allowed = ", ".join(sorted(CHAT_ROLES))
            raise ConfigValidationError(f"{where}.role", role, f"one of {allowed}")
        entry: dict[str, Any] = {"role": str(CHAT_ROLES[role]), "content": _content(message, where)}
        if role == "assistant" and message.get("tool_calls") is not None:
            entry["tool_calls"] = _history_tool_calls(message["tool_calls"], f"{where}.tool_calls")
        if role == "tool":
            call_id = message.get("tool_call_id")
            if not isinstance(call_id, str) or not call_id:
                raise ConfigValidationError(
                    f"{where}.tool_call_id", _short(call_id), "the id of the call it answers"
                )
            entry["tool_call_id"] = call_id
            if isinstance(message.get("name"), str):
                entry["name"] = message["name"]
        out.append(entry)
    return out


def _history_tool_calls(value: Any, where: str) -> list[dict]:
    """An assistant message's calls as OpenAI sends them back: arguments stay JSON text here
    (engine.tool_calls.formats.prepare_messages turns them into objects for the template)."""
    if not isinstance(value, list):
        raise ConfigValidationError(where, _short(value), "an array of tool calls")
    calls = []
    for i, call in enumerate(value):
        at = f"{where}[{i}]"
        call = _object(call, at)
        call_id = call.get("id")
        if not isinstance(call_id, str) or not call_id:
            raise ConfigValidationError(f"{at}.id", _short(call_id), "a non-empty string")
        if call.get("type", "function") != "function":
            raise ConfigValidationError(f"{at}.type", _short(call.get("type")), '"function"')
        function = _object(call.get("function"), f"{at}.function")
        name = function.get("name")
        if not isinstance(name, str) or not name:
            raise ConfigValidationError(f"{at}.function.name", _short(name), "a non-empty string")
        arguments = function.get("arguments", "{}")
        if isinstance(arguments, dict):  # some clients send the object itself
            arguments = json.dumps(arguments)
        if not isinstance(arguments, str):
            raise ConfigValidationError(
                f"{at}.function.arguments", _short(arguments), "a JSON text (string)"
            )
        calls.append(
            {
                "id": call_id,
                "type": "function",
                "function": {"name": name, "arguments": arguments},
            }
        )
    return calls


def _content(message: dict, where: str) -> str:
    """A string, or an array of {"type": "text", "text": ...} parts (joined); null only for an
    assistant message (OpenAI allows it there)."""
    content = message.get("content")
    if isinstance(content, str):
        return content
    if content is None and message.get("role") == "assistant":
        return ""  # e.g. a message that only carries tool_calls
    if not isinstance(content, list):
        raise ConfigValidationError(f"{where}.content", _short(content), "a string or text parts")
    texts = []
    for j, part in enumerate(content):
        part_where = f"{where}.content[{j}]"
        if not isinstance(part, dict) or part.get("type") != "text":
            kind = part.get("type") if isinstance(part, dict) else _short(part)
            raise ConfigValidationError(
                f"{part_where}.type", kind, "'text' (this server reads text only)"
            )
        text = part.get("text")
        if not isinstance(text, str):
            raise ConfigValidationError(f"{part_where}.text", _short(text), "a string")
        texts.append(text)
    return "".join(texts)


def _completion_prompt(value: Any, vocab_size: int | None) -> GenerationRequest:
    """A string, an array of one string, or an array of token ids (one prompt per request)."""
    if isinstance(value, list) and len(value) == 1 and isinstance(value[0], (str, list)):
        value = value[0]
    if isinstance(value, str):
        return GenerationRequest(prompt=value)
    if (
        isinstance(value, list)
        and value
        and all(isinstance(t, int) and not isinstance(t, bool) for t in value)
    ):
        high = None if vocab_size is None else vocab_size - 1
        for i, token in enumerate(value):
            if token < 0 or (high is not None and token > high):
                raise ConfigValidationError(f"prompt[{i}]", _short(token), _id_range(high))
        return GenerationRequest(prompt_ids=list(value))
    raise ConfigValidationError(
        "prompt", _short(value), "a string, or an array of token ids (one prompt per request)"
    )


def _overrides(fields: dict, default_max_tokens: int | None) -> dict:
    n = _optional_int(fields, "n", None, None)
    if n not in (None, 1):
        raise ConfigValidationError("n", n, "1 (one choice per request)")
    if fields.get("logit_bias"):
        raise ConfigValidationError("logit_bias", "{...}", "empty or absent (not supported)")
    overrides: dict[str, Any] = {}
    for name, engine_field in SAMPLING_FIELDS.items():
        if fields.get(name) is not None:
            overrides[engine_field] = _engine_value(name, engine_field, fields[name])
    temperature = fields.get("temperature")
    if temperature is not None:
        temperature = _engine_value("temperature", "temperature", temperature)
        if temperature > 0:
            overrides["temperature"] = temperature
        overrides["do_sample"] = temperature > 0
    if fields.get("stop") is not None:
        overrides["stop"] = list(_engine_value("stop", "stop", fields["stop"]))
    max_tokens = _max_tokens(fields)
    max_tokens = default_max_tokens if max_tokens is None else max_tokens
    if max_tokens is not None:
        overrides["max_new_tokens"] = max_tokens
    return overrides


def _max_tokens(fields: dict) -> int | None:
    for name in ("max_completion_tokens", "max_tokens"):
        value = fields.get(name)
        if value is not None:
            return _engine_value(name, "max_new_tokens", value)
    return None


def _engine_value(name: str, engine_field: str, value: Any) -> Any:
    """The engine's own validator for `engine_field`, reported under the OpenAI name."""
    try:
        return GenerationConfig.from_values({engine_field: value}).to_dict()[engine_field]
    except ConfigValidationError as exc:
        raise ConfigValidationError(name, _short(value), exc.allowed) from None


def _response_format(value: Any) -> tuple[str, Any]:
    """{"type": "text" | "json_object" | "json_schema", "json_schema": {"schema": {...},
    "name", "strict"}} -> (JsonMode, schema). Output is always held to the schema token by token,
    so `strict: false` gets the same strict decoding."""
    if value is None:
        return JsonMode.OFF, None
    value = _object(value, "response_format")
    kind = value.get("type")
    if kind == "text":
        return JsonMode.OFF, None
    if kind == "json_object":
        return JsonMode.OBJECT, None
    if kind == "json_schema":
        spec = value.get("json_schema")
        if not isinstance(spec, dict):
            raise ConfigValidationError(
                "response_format.json_schema", _short(spec), 'an object {"name", "schema"}'
            )
        schema = spec.get("schema")
        if not isinstance(schema, dict):
            raise ConfigValidationError(
                "response_format.json_schema.schema", _short(schema), "a JSON schema object"
            )
        strict = spec.get("strict")
        if strict is not None and not isinstance(strict, bool):
            raise ConfigValidationError("response_format.json_schema.strict", strict, "a boolean")
        return JsonMode.SCHEMA, schema
    raise ConfigValidationError(
        "response_format.type", _short(kind), "one of text, json_object, json_schema"
    )


def _stream(fields: dict) -> tuple[bool, bool]:
    stream = _optional_bool(fields, "stream") or False
    options = fields.get("stream_options")
    include_usage = False
    if options is not None:
        options = _object(options, "stream_options")
        include_usage = _optional_bool(options, "include_usage", "stream_options.") or False
    return stream, include_usage


def _refuse_unsupported(fields: dict, names: tuple[str, ...]) -> None:
    for name in names:
        if fields.get(name):
            raise ConfigValidationError(name, "[...]", "absent (not supported by this server)")


def _optional_bool(fields: dict, name: str, prefix: str = "") -> bool | None:
    value = fields.get(name)
    if value is None or isinstance(value, bool):
        return value
    raise ConfigValidationError(prefix + name, _short(value), "true or false")


def _optional_int(fields: dict, name: str, low: int | None, high: int | None) -> int | None:
    value = fields.get(name)
    if value is None:
        return None
    integral = isinstance(value, float) and math.isfinite(value) and value.is_integer()
    if isinstance(value, bool) or not (isinstance(value, int) or integral):
        raise ConfigValidationError(name, _short(value), _int_range(low, high))
    value = int(value)
    if (low is not None and value < low) or (high is not None and value > high):
        raise ConfigValidationError(name, value, _int_range(low, high))
    return value


def _int_range(low: int | None, high: int | None) -> str:
    if low is not None and high is not None:
        return f"an integer in [{low}, {high}]"
    if low is not None:
        return f"an integer >= {low}"
    return "an integer"


def _id_range(high: int | None) -> str:
    if high is None:
        return "a token id >= 0"
    return f"a token id of this model's vocabulary, in [0, {high}]"


SURROGATE_PROBLEM = (
    "text without lone UTF-16 surrogates (a \\ud800-\\udfff escape must be half of a pair)"
)


def _refuse_lone_surrogates(body: dict) -> None:
    """Every string and key in the body must be encodable as UTF-8 (a lone surrogate is not):
    refused here, naming where, rather than failing in the tokenizer or in the JSON answer.
    Iterative, so a deeply nested body cannot exhaust the stack."""
    stack: list[tuple[Any, tuple]] = [(body, ())]
    while stack:
        value, path = stack.pop()
        if isinstance(value, str):
            if not _encodable(value):
                raise ConfigValidationError(_path(path), ascii(value[:40]), SURROGATE_PROBLEM)
        elif isinstance(value, dict):
            for key, item in value.items():
                if not _encodable(key):
                    raise ConfigValidationError(_path(path), ascii(key[:40]), SURROGATE_PROBLEM)
                stack.append((item, (*path, key)))
        elif isinstance(value, list):
            stack.extend((item, (*path, i)) for i, item in enumerate(value))


def _encodable(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _path(path: tuple) -> str:
    """("messages", 0, "content") -> "messages[0].content"; the body itself is "body"."""
    text = ""
    for part in path:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else str(part))
    return text or "body"


def _short(value: Any) -> Any:
    """A value for an error message: long strings and containers are cut, not echoed whole."""
    text = repr(value)
    return value if len(text) <= 80 else text[:77] + "..."
