"""Errors as the OpenAI API returns them: an HTTP status and
{"error": {"message", "type", "param", "code"}}, so an OpenAI client raises its usual exception
(BadRequestError, AuthenticationError, NotFoundError, RateLimitError, ...) with our message.

`ApiError` is the transport's own refusal (a body that is not JSON, a missing key, a field of the
wrong type); `from_engine_error` maps the engine's typed errors, raised while a request is planned,
onto a status, naming the OpenAI field they concern.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from engine import errors

INVALID_REQUEST = "invalid_request_error"
SERVER_ERROR = "server_error"
RATE_LIMIT = "rate_limit_exceeded"

# engine field (GenerationConfig / GenerationRequest) -> the OpenAI parameter a client sent
ENGINE_FIELD_TO_PARAM = {
    "max_new_tokens": "max_tokens",
    "repetition_penalty": "repetition_penalty",
    "do_sample": "temperature",
    "json_mode": "response_format",
    "prompt": "prompt",
}
# the engine's own name for a field a client sends under its OpenAI name, in error messages
_ENGINE_WORDS = re.compile(r"\bmax_new_tokens\b")


class ApiError(Exception):
    """A request refused before it reached the engine (or after, with an engine error mapped)."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        param: str | None = None,
        code: str | None = None,
        type: str = INVALID_REQUEST,
    ):
        super().__init__(message)
        self.status, self.message, self.param, self.code, self.type = (
            status,
            message,
            param,
            code,
            type,
        )

    def body(self) -> dict:
        return error_body(self.message, type=self.type, param=self.param, code=self.code)


def error_body(
    message: str, *, type: str = INVALID_REQUEST, param: str | None = None, code: str | None = None
) -> dict:
    return {"error": {"message": message, "type": type, "param": param, "code": code}}


@dataclass(frozen=True)
class _Mapping:
    status: int
    param: str | None
    code: str | None
    type: str = INVALID_REQUEST


def from_engine_error(exc: Exception, prompt_param: str) -> ApiError:
    """The HTTP answer for an engine error raised while planning a request. `prompt_param` is
    "messages" (chat) or "prompt" (completions): where a prompt-sized problem came from. The
    message names the field as the client sent it (`max_tokens`, not the engine's
    max_new_tokens, e.g. in a context overflow)."""
    message = _ENGINE_WORDS.sub("max_tokens", str(exc))
    mapping = _mapping_for(exc, prompt_param)
    if isinstance(exc, errors.ConfigValidationError):
        param = ENGINE_FIELD_TO_PARAM.get(exc.field, exc.field)
        if exc.field == "prompt":
            param = prompt_param
        mapping = _Mapping(400, param, "invalid_value")
    return ApiError(
        mapping.status, message, param=mapping.param, code=mapping.code, type=mapping.type
    )


def _mapping_for(exc: Exception, prompt_param: str) -> _Mapping:
    if isinstance(exc, errors.QueueFullError):
        return _Mapping(429, None, "queue_full", RATE_LIMIT)
    if isinstance(exc, errors.KVAdmissionError):  # before MemoryBudgetError, its base
        if exc.never_fits:
            return _Mapping(400, "max_tokens", "kv_budget_exceeded")
        return _Mapping(429, None, "kv_budget_busy", RATE_LIMIT)
    if isinstance(exc, errors.SchedulerClosedError):
        return _Mapping(503, None, "shutting_down", SERVER_ERROR)
    if isinstance(exc, errors.ContextOverflowError):
        return _Mapping(400, prompt_param, "context_length_exceeded")
    if isinstance(exc, errors.MemoryBudgetError):
        return _Mapping(400, "max_tokens", "kv_budget_exceeded")
    if isinstance(exc, errors.ChatTemplateError):
        return _Mapping(400, prompt_param, "chat_template_error")
    if isinstance(exc, errors.ConstraintError):
        return _Mapping(400, "response_format", "invalid_schema")
    if isinstance(exc, errors.TokenizerError):
        return _Mapping(400, prompt_param, "invalid_value")
    if isinstance(exc, errors.EngineError):
        return _Mapping(500, None, None, SERVER_ERROR)
    return _Mapping(500, None, None, SERVER_ERROR)
