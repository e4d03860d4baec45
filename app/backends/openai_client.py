"""A client for OpenAI-compatible chat servers (vLLM, llama.cpp's llama-server, Ollama's /v1,
LM Studio, SGLang, TGI, OpenAI, OpenRouter, llama-cpp-python) that yields the engine's own event
dataclasses, so the app's views cannot tell a remote reply from a local one.

No Qt here: it runs on the backend's worker thread (app/backends/remote.py), blocking in httpx's
synchronous streaming. Stop must not wait for the next chunk (a slow server may send none for a
minute), so `interrupt()`, called from the GUI thread, shuts the request's socket down: the
blocked read returns at once and the server sees the connection close, which is how every one
of those servers notices a client has gone and stops generating. Connections are therefore not
pooled (one TCP connection per request, negligible beside a model's time to first token), and
httpcore's trace hook hands us each request's socket as soon as it is connected, before a single
byte of the answer has arrived.

Tool calls: `delta.tool_calls` fragments (OpenAI's shape: index, then id/type/name in a call's
first delta and argument fragments after) become the engine's ToolCallStarted ->
ToolCallArgumentsDelta* events as they arrive. When the stream ends each call is checked the way
the local engine checks its own (engine.tool_calls.stream): arguments that parse as a JSON object
and validate against the offered tool's schema make a ToolCallFinished (and an entry of
Finished.tool_calls, the only calls the app executes); anything else, including a call cut off by
Stop or a broken stream, is a ToolCallMalformed naming the problem. A server that ignores tools
just answers in text; when a call was required (tool_choice "required" or a named function) a
StreamNotice says the server does not support tools.

Timing is measured here from the stream itself (time to the first delta, time between the first
and the last), so it includes the network; Usage says so (`measured_over_network`).
"""

from __future__ import annotations

import contextlib
import email.utils
import json
import socket
import ssl
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

import httpx

from app.backends.connection import DEFAULT_TIMEOUT_S, Connection, RemoteModel, normalized_base_url
from app.backends.errors import (
    AuthError,
    MalformedChunkError,
    RateLimitedError,
    RemoteError,
    RemoteTimeoutError,
    RequestRejectedError,
    ServerError,
    StreamEndedError,
    TlsError,
    UnknownModelError,
    UnreachableHostError,
    redact,
)
from app.backends.sse import DONE, SseParser
from app.engine_bridge import StreamNotice
from app.finish_reasons import PLAIN_SERVER_WORDS
from engine.cancel import CancelToken
from engine.events import (
    Finished,
    ReasoningDelta,
    TextDelta,
    TokenSampled,
    ToolCallArgumentsDelta,
    ToolCallFinished,
    ToolCallMalformed,
    ToolCallStarted,
    TopAlternative,
    Usage,
)
from engine.reasoning import ANSWER, ReasoningSplitter
from engine.types import FinishReason, ToolCall

CONNECT_TIMEOUT_S = 10.0
__all__ = ["DEFAULT_TIMEOUT_S", "Connection", "OpenAIClient", "RemoteModel", "normalized_base_url"]
MAX_ERROR_TEXT = 600  # characters of a server's error body shown to the user
# Request fields a server may refuse without the request being wrong; on a 400 that names one of
# them, the request is sent once more without it and the user is told (OPTIONAL_FIELDS' notice).
OPTIONAL_FIELDS = (
    "stream_options",
    "logprobs",
    "top_logprobs",
    "top_k",
    "min_p",
    "repeat_penalty",
    "repetition_penalty",
    "seed",
)

# A server's finish_reason -> ours: app/finish_reasons.py holds the table (PLAIN_SERVER_WORDS)
# and says each in words. The words that end a reply badly become an error, with this said to the
# user (the partial reply is kept, no tool call runs); so does any word not in either table, which
# must never pass for a clean end of turn.
SERVER_END_DETAILS = {
    "cancelled": (
        "cut the reply short (finish_reason 'cancelled': the server stopped generating, for "
        "example because it was shutting down)"
    ),
    "error": "ended the reply with an error (finish_reason 'error')",
    "content_filter": "stopped the reply (content filter)",
}


@dataclass
class _StreamedCall:
    """One tool call as its deltas arrive (keyed by the delta's `index`)."""

    id: str
    name: str = ""
    arguments: list[str] = field(default_factory=list)
    started: bool = False  # ToolCallStarted was yielded (the name is known)


@dataclass
class _Stream:
    """What one streamed reply has produced so far (kept whatever ends it)."""

    started: float
    text: list[str] = field(default_factory=list)
    reasoning: list[str] = field(default_factory=list)
    first_at: float | None = None
    last_at: float | None = None
    n_deltas: int = 0
    n_tokens: int = 0
    finish: str | None = None
    usage: dict | None = None
    done: bool = False
    calls: dict[int, _StreamedCall] = field(default_factory=dict)
    tool_calls: list[ToolCall] = field(default_factory=list)  # the executable ones, at the end


class OpenAIClient:
    def __init__(
        self,
        connection: Connection,
        api_key: str | None = None,
        *,
        transport: httpx.BaseTransport | None = None,
    ):
        self.connection = connection
        self._key = api_key or None
        headers = {"Accept": "application/json"}
        if self._key:
            headers["Authorization"] = f"Bearer {self._key}"
        timeout_s = connection.timeout_s
        self._client = httpx.Client(
            base_url=connection.base_url,
            headers=headers,
            timeout=httpx.Timeout(timeout_s, connect=min(CONNECT_TIMEOUT_S, timeout_s)),
            limits=httpx.Limits(max_keepalive_connections=0),  # a fresh socket per request
            transport=transport,
            trust_env=False,  # a proxy from the environment must not see the key or the chats
        )
        self._lock = threading.Lock()
        self._socket: socket.socket | None = None
        self._interrupted = False

    def close(self) -> None:
        self._client.close()

    def __enter__(self) -> OpenAIClient:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # --- models ---------------------------------------------------------------------------------
    def list_models(self) -> list[RemoteModel]:
        """GET /models ("Test connection", and the model picker)."""
        try:
            response = self._client.get("/models")
        except httpx.HTTPError as exc:
            raise self._transport_error(exc, "listing its models") from None
        if response.status_code >= 400:
            raise self._http_error(response.status_code, response.headers, response.text, None)
        try:
            data = response.json()
            rows = data["data"] if isinstance(data, dict) else data
            models = [
                RemoteModel(
                    id=str(row["id"]),
                    owned_by=str(row.get("owned_by") or ""),
                    context_length=_context_length(row),
                )
                for row in rows
            ]
        except (ValueError, KeyError, TypeError) as exc:
            raise MalformedChunkError(
                self.connection.label,
                f"{self.connection.label} answered /models with something that is not an "
                f"OpenAI model list ({type(exc).__name__}: {redact(str(exc), self._key)[:200]})",
            ) from None
        return models

    # --- chat -----------------------------------------------------------------------------------
    def interrupt(self) -> None:
        """Stop the request in flight now, from any thread: shut its socket down so a blocked
        read returns, and the server sees the client go."""
        with self._lock:
            self._interrupted = True
            sock = self._socket
        if sock is not None:
            with contextlib.suppress(OSError):  # already closed
                sock.shutdown(socket.SHUT_RDWR)

    def chat(
        self, model: str, messages: list[dict], params: dict, cancel: CancelToken
    ) -> Iterator[object]:
        """POST /chat/completions with stream=true; yields TextDelta / ReasoningDelta /
        TokenSampled / StreamNotice and exactly one Finished. A failure before the stream starts
        raises a RemoteError; one after it is a Finished with finish_reason error and the partial
        reply (and its message), like the local engine's."""
        body = {
            "model": model,
            "messages": messages,
            "stream": True,
            "stream_options": {"include_usage": True},
            **params,
        }
        with self._lock:
            # A Stop that came before this request started still counts (its socket is shut
            # down as soon as it connects).
            self._interrupted = cancel.cancelled
        dropped: list[str] = []
        while True:
            stream = _Stream(started=time.perf_counter())
            response = None
            try:
                response = self._open(body, cancel)
                if response is None:  # cancelled before the server answered
                    yield self._finished(stream, FinishReason.CANCELLED, body)
                    return
                if response.status_code >= 400:
                    text = response.read().decode("utf-8", "replace")
                    fallback = _json_schema_fallback(response.status_code, text, body)
                    if fallback is not None:
                        dropped.append("response_format json_schema")
                        body = fallback
                        continue
                    refused = _refused_optional_field(response.status_code, text, body)
                    if refused:
                        dropped.append(refused)
                        body = {k: v for k, v in body.items() if k != refused}
                        if refused == "logprobs":
                            body.pop("top_logprobs", None)
                        continue
                    raise self._http_error(response.status_code, response.headers, text, model)
                for name in dropped:
                    if name.startswith("response_format"):
                        yield StreamNotice(
                            f"{self.connection.label} does not accept response_format "
                            "json_schema; the schema was sent the way llama.cpp's servers take "
                            "it (json_object with a schema)."
                        )
                        continue
                    yield StreamNotice(
                        f"{self.connection.label} does not accept the field '{name}'; "
                        "it was left out of the request."
                    )
                yield from self._read_stream(response, stream, cancel, body)
                return
            finally:
                if response is not None:
                    response.close()
                with self._lock:
                    self._socket = None

    def _open(self, body: dict, cancel: CancelToken) -> httpx.Response | None:
        if cancel.cancelled:
            return None

        def trace(name: str, info: dict) -> None:
            if name in ("connection.connect_tcp.complete", "connection.start_tls.complete"):
                stream = info.get("return_value")
                sock = stream.get_extra_info("socket") if stream is not None else None
                with self._lock:
                    self._socket = sock
                    interrupted = self._interrupted
                if interrupted and sock is not None:
                    with contextlib.suppress(OSError):
                        sock.shutdown(socket.SHUT_RDWR)

        request = self._client.build_request(
            "POST", "/chat/completions", json=body, extensions={"trace": trace}
        )
        try:
            return self._client.send(request, stream=True)
        except httpx.HTTPError as exc:
            if cancel.cancelled:
                return None
            raise self._transport_error(exc, "sending the request") from None

    def _read_stream(
        self, response: httpx.Response, stream: _Stream, cancel: CancelToken, body: dict
    ) -> Iterator[object]:
        parser = SseParser()
        splitter = ReasoningSplitter()
        error: RemoteError | None = None
        try:
            for chunk in response.iter_bytes():  # decoded if a proxy compressed the stream
                for event in parser.feed(chunk):
                    yield from self._on_event(event, stream, splitter, body)
                    if stream.done:
                        break
                if stream.done or cancel.cancelled:
                    break
            else:
                for event in parser.close():
                    yield from self._on_event(event, stream, splitter, body)
        except RemoteError as exc:
            error = exc
        except httpx.HTTPError as exc:
            if not cancel.cancelled:
                error = self._transport_error(exc, "streaming the reply", stream)
        for kind, text in splitter.flush():
            yield from self._deliver(stream, kind, text)
        yield from self._close_calls(stream, body, complete=stream.done and error is None)
        forced = body.get("tools") and (
            body.get("tool_choice") == "required" or isinstance(body.get("tool_choice"), dict)
        )
        if forced and stream.done and error is None and not stream.calls:
            yield StreamNotice(
                f"{self.connection.label} answered in text although a tool call was required: "
                "this server (or its chat format for this model) does not support tools."
            )
        if cancel.cancelled and not stream.done:
            yield self._finished(stream, FinishReason.CANCELLED, body)
        elif error is not None:
            yield self._finished(stream, FinishReason.ERROR, body, str(error))
        elif not stream.done:
            error = StreamEndedError(
                self.connection.label,
                f"The stream from {self.connection.label} stopped before it was complete (no "
                "[DONE]); the reply may be cut short.",
            )
            yield self._finished(stream, FinishReason.ERROR, body, str(error))
        else:
            yield self._server_finished(stream, body)

    def _server_finished(self, stream: _Stream, body: dict) -> Finished:
        """The Finished of a stream that ended with [DONE], from the server's finish_reason."""
        label, word = self.connection.label, stream.finish or ""
        if word in SERVER_END_DETAILS:
            message = f"{label} {SERVER_END_DETAILS[word]}; the partial reply is kept."
            return self._finished(stream, FinishReason.ERROR, body, message)
        if word and word not in PLAIN_SERVER_WORDS:
            message = (
                f"{label} ended the reply with finish_reason {word!r}, which this app does not "
                "know: the reply may be incomplete."
            )
            return self._finished(stream, FinishReason.ERROR, body, message)
        reason = PLAIN_SERVER_WORDS.get(word, FinishReason.STOP)  # no word: [DONE] ended it
        if stream.tool_calls:
            reason = FinishReason.TOOL_CALLS  # some servers say "stop" after calls
        elif reason == FinishReason.TOOL_CALLS:
            reason = FinishReason.STOP  # none of the calls can be executed
        return self._finished(stream, reason, body)

    def _on_event(self, event, stream: _Stream, splitter: ReasoningSplitter, body: dict):
        label = self.connection.label
        if event.data == DONE:
            stream.done = True
            return
        try:
            chunk = json.loads(event.data)
        except ValueError as exc:
            raise MalformedChunkError(
                label,
                f"{label} sent a stream chunk that is not JSON ({exc}): "
                f"{redact(event.data, self._key)[:120]!r}",
            ) from None
        if not isinstance(chunk, dict):
            raise MalformedChunkError(label, f"{label} sent a stream chunk that is not an object")
        if event.event == "error" or chunk.get("error"):  # some servers send "error": null
            detail = _error_text(chunk) or event.data
            raise ServerError(
                label, f"{label} failed while streaming: {redact(detail, self._key)[:600]}"
            )
        if isinstance(chunk.get("usage"), dict):
            stream.usage = chunk["usage"]
        choices = chunk.get("choices") or []
        if not isinstance(choices, list):
            raise MalformedChunkError(label, f"{label} sent 'choices' that is not a list")
        for choice in choices[:1]:
            if not isinstance(choice, dict):
                raise MalformedChunkError(label, f"{label} sent a choice that is not an object")
            delta = choice.get("delta") or {}
            if not isinstance(delta, dict):
                raise MalformedChunkError(label, f"{label} sent a delta that is not an object")
            reasoning = delta.get("reasoning_content") or delta.get("reasoning")
            if isinstance(reasoning, str) and reasoning:
                yield from self._deliver(stream, "reasoning", reasoning)
            content = delta.get("content")
            if isinstance(content, str) and content:
                for kind, text in splitter.push(content):
                    yield from self._deliver(stream, kind, text)
            calls = delta.get("tool_calls")
            if isinstance(calls, list):
                yield from self._on_tool_calls(calls, stream)
            logprobs = choice.get("logprobs")
            if isinstance(logprobs, dict) and isinstance(logprobs.get("content"), list):
                for entry in logprobs["content"]:
                    token = _token_from_logprob(stream.n_tokens, entry)
                    if token is not None:
                        stream.n_tokens += 1
                        yield token
            if choice.get("finish_reason"):
                stream.finish = str(choice["finish_reason"])

    def _on_tool_calls(self, parts: list, stream: _Stream):
        label = self.connection.label
        for position, part in enumerate(parts):
            if not isinstance(part, dict):
                raise MalformedChunkError(label, f"{label} sent a tool call that is not an object")
            index = part.get("index", position)
            if not isinstance(index, int):
                raise MalformedChunkError(label, f"{label} sent a tool call index {index!r}")
            function = part.get("function") or {}
            if not isinstance(function, dict):
                raise MalformedChunkError(label, f"{label} sent a tool call without a function")
            call = stream.calls.get(index)
            if call is None:
                call_id = part.get("id")
                call_id = call_id if isinstance(call_id, str) and call_id else f"call_{index}"
                call = stream.calls[index] = _StreamedCall(call_id)
            name = function.get("name")
            if isinstance(name, str) and name and not call.name:
                call.name = name
            fragment = function.get("arguments")
            if isinstance(fragment, dict):  # a server that sends the object itself
                fragment = json.dumps(fragment)
            if isinstance(fragment, str) and fragment:
                call.arguments.append(fragment)
            self._mark_delta(stream)
            if not call.started and call.name:
                call.started = True
                yield ToolCallStarted(call.id, call.name)
                if call.arguments:  # what arrived before the name
                    yield ToolCallArgumentsDelta(call.id, "".join(call.arguments))
            elif call.started and isinstance(fragment, str) and fragment:
                yield ToolCallArgumentsDelta(call.id, fragment)

    def _close_calls(self, stream: _Stream, body: dict, complete: bool):
        """Each streamed call, checked: ToolCallFinished (executable) or ToolCallMalformed."""
        schemas = _offered_schemas(body)
        for index in sorted(stream.calls):
            call = stream.calls[index]
            text = "".join(call.arguments)
            problem = None
            arguments: object = None
            if not complete:
                problem = "the reply ended before the call was complete"
            elif not call.name:
                problem = "the server sent a call without a function name"
            elif call.name not in schemas:
                offered = ", ".join(schemas) or "none"
                problem = f"no tool is named {call.name!r} (offered: {offered})"
            else:
                try:
                    arguments = json.loads(text or "{}")
                except ValueError as exc:
                    problem = f"the arguments are not JSON ({exc})"
                else:
                    problem = _arguments_problem(arguments, call.name, schemas[call.name])
            if problem is None and isinstance(arguments, dict):
                stream.tool_calls.append(ToolCall(call.id, call.name, arguments))
                yield ToolCallFinished(call.id, call.name, arguments)
            else:
                yield ToolCallMalformed(call.id, call.name, text, problem or "not an object")

    def _mark_delta(self, stream: _Stream) -> None:
        now = time.perf_counter()
        if stream.first_at is None:
            stream.first_at = now
        stream.last_at = now
        stream.n_deltas += 1

    def _deliver(self, stream: _Stream, kind: str, text: str):
        now = time.perf_counter()
        if stream.first_at is None:
            stream.first_at = now
        stream.last_at = now
        stream.n_deltas += 1
        if kind == ANSWER:
            stream.text.append(text)
            yield TextDelta(text)
        else:
            stream.reasoning.append(text)
            yield ReasoningDelta(text)

    def _finished(
        self, stream: _Stream, reason: FinishReason, body: dict, error: str | None = None
    ) -> Finished:
        return Finished(
            finish_reason=reason,
            usage=_usage(stream),
            text="".join(stream.text),
            reasoning="".join(stream.reasoning),
            error=error,
            preset={
                k: v for k, v in body.items() if k not in ("messages", "stream", "model", "tools")
            },
            tool_calls=tuple(stream.tool_calls),
        )

    # --- errors ---------------------------------------------------------------------------------
    def _transport_error(
        self, exc: httpx.HTTPError, doing: str, stream: _Stream | None = None
    ) -> RemoteError:
        label, timeout = self.connection.label, self.connection.timeout_s
        detail = redact(str(exc) or type(exc).__name__, self._key)
        if isinstance(exc, httpx.ConnectTimeout):
            return RemoteTimeoutError(
                label, f"{label} did not accept a connection within {CONNECT_TIMEOUT_S:g} s."
            )
        if isinstance(exc, httpx.TimeoutException):
            what = "no answer" if stream is None or stream.first_at is None else "nothing more"
            return RemoteTimeoutError(
                label,
                f"{label} sent {what} within {timeout:g} s while {doing} (the connection's "
                "timeout; raise it in Settings > Connections for slow servers).",
            )
        if isinstance(exc, httpx.ConnectError):
            if _is_tls_failure(exc):
                return TlsError(
                    label,
                    f"The secure connection to {label} failed: {detail}. Check the certificate, "
                    "or whether the server speaks http:// rather than https://.",
                )
            return UnreachableHostError(
                label,
                f"Cannot reach {label}: {detail}. Is the server running, and are the address "
                "and port right?",
            )
        if stream is not None:
            return StreamEndedError(
                label,
                f"The connection to {label} broke while {doing} ({detail}); the reply is cut "
                "short.",
            )
        return UnreachableHostError(label, f"The connection to {label} failed: {detail}.")

    def _http_error(self, status: int, headers, text: str, model: str | None) -> RemoteError:
        label = self.connection.label
        detail = redact(_error_text_from_body(text), self._key)[:MAX_ERROR_TEXT]
        said = f": {detail}" if detail else ""
        if status in (401, 403):
            return AuthError(
                label,
                f"{label} refused the API key (HTTP {status}){said}. Check the key in "
                "Settings > Connections.",
            )
        if status == 404:
            what = f"the model '{model}'" if model else "this endpoint"
            return UnknownModelError(
                label, f"{label} does not know {what} (HTTP 404){said}. Pick another model."
            )
        if status == 429:
            retry_after = _retry_after_s(headers.get("retry-after"))
            wait = f" Try again in {retry_after:g} s." if retry_after is not None else ""
            return RateLimitedError(
                label, f"{label} is rate limiting requests (HTTP 429){said}.{wait}", retry_after
            )
        if status >= 500 and not _is_validation_failure(detail):
            return ServerError(label, f"{label} failed to answer (HTTP {status}){said}.")
        return RequestRejectedError(label, f"{label} refused the request (HTTP {status}){said}")


def _offered_schemas(body: dict) -> dict[str, dict]:
    """name -> parameters schema of the tools the request offered."""
    schemas: dict[str, dict] = {}
    for tool in body.get("tools") or ():
        function = tool.get("function", tool) if isinstance(tool, dict) else None
        if isinstance(function, dict) and isinstance(function.get("name"), str):
            parameters = function.get("parameters")
            schemas[function["name"]] = parameters if isinstance(parameters, dict) else {}
    return schemas


def _arguments_problem(arguments: object, name: str, schema: dict) -> str | None:
    if not isinstance(arguments, dict):
        return "the arguments are not a JSON object"
    from jsonschema import Draft202012Validator
    from jsonschema.exceptions import SchemaError

    try:
        # A schema that is not one makes iter_errors raise anything (TypeError for {"type": 12}):
        # checked first, it is named instead of ending the stream with a traceback.
        Draft202012Validator.check_schema(schema)
        errors = sorted(
            Draft202012Validator(schema).iter_errors(arguments), key=lambda e: list(e.path)
        )
    except SchemaError as exc:
        return f"{name}'s schema cannot be checked ({exc.message})"
    if not errors:
        return None
    first = errors[0]
    where = "/".join(str(p) for p in first.absolute_path) or "(the arguments)"
    return f"the arguments do not match {name}'s schema at {where}: {first.message}"


def _is_tls_failure(exc: BaseException) -> bool:
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, ssl.SSLError) or "SSL" in type(exc).__name__:
            return True
        if "CERTIFICATE" in str(exc).upper() or "SSL" in str(exc):
            return True
        exc = exc.__cause__ or exc.__context__
    return False


# Statuses with which servers refuse a request's content: 400/422, and 500 from
# llama-cpp-python, whose request validation errors come back as internal server errors.
REFUSAL_STATUSES = (400, 422, 500)


def _json_schema_fallback(status: int, text: str, body: dict) -> dict | None:
    """llama-cpp-python (and older llama.cpp servers) take a schema as
    {"type": "json_object", "schema": ...} and refuse the OpenAI json_schema form."""
    fmt = body.get("response_format")
    if (
        status in REFUSAL_STATUSES
        and isinstance(fmt, dict)
        and fmt.get("type") == "json_schema"
        and ("json_schema" in text or "response_format" in text)
    ):
        schema = (fmt.get("json_schema") or {}).get("schema", {})
        return {**body, "response_format": {"type": "json_object", "schema": schema}}
    return None


def _is_validation_failure(text: str) -> bool:
    return "validation error" in text.lower()


def _refused_optional_field(status: int, text: str, body: dict) -> str | None:
    if status not in REFUSAL_STATUSES:
        return None
    lowered = text.lower()
    for name in OPTIONAL_FIELDS:
        if name in body and name in lowered:
            return name
    return None


def _error_text(data) -> str:
    if not isinstance(data, dict):
        return ""
    error = data.get("error", data)
    if isinstance(error, dict):
        for key in ("message", "msg", "detail"):
            if isinstance(error.get(key), str):
                return error[key]
        if isinstance(error.get("detail"), list):  # FastAPI validation errors
            return "; ".join(_detail_item(d) for d in error["detail"])
    if isinstance(error, str):
        return error
    if isinstance(data.get("detail"), str):
        return data["detail"]
    if isinstance(data.get("detail"), list):
        return "; ".join(_detail_item(d) for d in data["detail"])
    return ""


def _detail_item(item) -> str:
    if isinstance(item, dict):
        where = ".".join(str(p) for p in item.get("loc", ()) if p != "body")
        return f"{where}: {item.get('msg', '')}" if where else str(item.get("msg", item))
    return str(item)


def _error_text_from_body(text: str) -> str:
    try:
        message = _error_text(json.loads(text))
    except ValueError:
        message = ""
    return " ".join((message or text).split())


def _retry_after_s(value: str | None) -> float | None:
    """Retry-After is seconds or an HTTP date (RFC 9110 10.2.3)."""
    if not value:
        return None
    value = value.strip()
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, round(when.timestamp() - time.time()))


def _context_length(row: dict) -> int | None:
    for key in ("max_model_len", "context_length", "context_window", "n_ctx"):
        value = row.get(key)
        if isinstance(value, int) and value > 0:
            return value
    meta = row.get("meta")
    if isinstance(meta, dict) and isinstance(meta.get("n_ctx_train"), int):
        return meta["n_ctx_train"]
    return None


def _token_from_logprob(index: int, entry) -> TokenSampled | None:
    if not isinstance(entry, dict) or not isinstance(entry.get("token"), str):
        return None
    try:
        logprob = float(entry.get("logprob", 0.0))
    except (TypeError, ValueError):
        return None
    top = []
    for alt in entry.get("top_logprobs") or []:
        if isinstance(alt, dict) and isinstance(alt.get("token"), str):
            try:
                top.append(TopAlternative(-1, alt["token"], float(alt.get("logprob", 0.0))))
            except (TypeError, ValueError):
                continue
    # Servers report token text, not ids: -1 says "id unknown" to the token inspector.
    return TokenSampled(index, -1, entry["token"], logprob, tuple(top))


def _usage(stream: _Stream) -> Usage:
    u = stream.usage or {}
    prompt = _int(u.get("prompt_tokens"))
    completion = _int(u.get("completion_tokens"))
    if completion == 0:
        completion = stream.n_tokens or stream.n_deltas  # the server sent no usage
    details = u.get("prompt_tokens_details")
    cached = details.get("cached_tokens") if isinstance(details, dict) else None
    cached = cached if isinstance(cached, int) else None
    if cached is None and isinstance(u.get("cached_tokens"), int):
        cached = u["cached_tokens"]
    ttft_ms = (stream.first_at - stream.started) * 1000 if stream.first_at else 0.0
    decode_ms = (
        (stream.last_at - stream.first_at) * 1000 if stream.first_at and stream.last_at else 0.0
    )
    return Usage(
        prompt_tokens=prompt,
        completion_tokens=completion,
        cached_tokens=cached,
        prefill_ms=ttft_ms,
        decode_ms=decode_ms,
        ttft_ms=ttft_ms,
        prompt_tok_s=prompt / (ttft_ms / 1000) if prompt and ttft_ms > 0 else 0.0,
        decode_tok_s=(completion - 1) / (decode_ms / 1000)
        if completion > 1 and decode_ms > 0
        else 0.0,
        context_used=prompt + completion,
        context_limit=0,
        measured_over_network=True,
        server_finish_reason=stream.finish or "",
    )


def _int(value) -> int:
    return value if isinstance(value, int) and value >= 0 else 0
