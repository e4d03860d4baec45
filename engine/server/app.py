"""The HTTP application: OpenAI's routes on top of the batch scheduler.

    GET  /health                status and the scheduler's load (no API key needed)
    GET  /v1/models             the served model
    POST /v1/chat/completions   chat, streamed (SSE, `data: [DONE]`) or whole
    POST /v1/completions        plain-text continuation, streamed or whole

Every request's Host and Origin are checked first (engine.server.access: DNS rebinding and
cross-origin pages). Every /v1 route then checks the API key (when one is set; constant-time
comparison), requires `Content-Type: application/json` on a body (415 otherwise: a page's
`text/plain` form post is not an API call), then reads the body under a size limit and a deadline:
a Content-Length above the limit is refused with 413 before any of the body is read, a body sent
without one is cut off at the limit, and one that has not arrived within the request timeout is
refused with 408. JSON must be standard (no NaN/Infinity); strings with lone surrogates and token
ids outside the vocabulary are refused by engine.server.protocol, naming the field.

A request is planned by `BatchScheduler.submit` on a worker thread (the chat template and the
tokenizer may take a moment; refusals come back as typed errors, mapped by api_errors); its
events are then pumped from `Ticket.events()` (blocking) into the event loop by one thread per
request. While a request runs, the connection is watched: when the client goes away its
CancelToken is set, the scheduler ends it within one decode step and frees its KV reservation,
and the pump drains to the final event.

A request that has to wait gets `X-Queue-Position: k` (its place in the queue when it arrived,
1 = next) in its response headers; a full queue answers 429 naming the bytes.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import hmac
import json
import threading
import time
from collections.abc import AsyncIterator, Callable, Collection
from functools import partial
from typing import Any

import anyio
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.middleware.cors import CORSMiddleware
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

from engine.cancel import CancelToken
from engine.errors import EngineError
from engine.events import Finished
from engine.model_protocol import LanguageModel
from engine.server.access import AccessGuard, AccessPolicy
from engine.server.api_errors import SERVER_ERROR, ApiError, error_body, from_engine_error
from engine.server.protocol import ParsedRequest, parse_chat, parse_completion
from engine.server.responses import ResponseWriter
from engine.types import FinishReason

_NO_FINAL_EVENT = "the request ended without a final event"
DEFAULT_MAX_BODY_BYTES = 2**20  # 1 MiB: a long chat is a few hundred KiB of JSON
DEFAULT_REQUEST_TIMEOUT_S = 10.0  # headers and body of a request must arrive within this
DEFAULT_MAX_CONNECTIONS = 100  # open connections (idle, half-sent or streaming) at once
QUEUE_POSITION_HEADER = "X-Queue-Position"
JSON_MEDIA_TYPE = "application/json"


@dataclasses.dataclass
class ServerOptions:
    model_id: str  # the name /v1/models lists
    aliases: Collection[str] = ()  # other names a request may use for the same model
    api_key: str | None = None
    cors_origin: str | None = None  # --cors: one more allowed origin (kept for old command lines)
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    bound_host: str = "127.0.0.1"  # the address listened on: a Host header may name it
    allowed_hosts: Collection[str] = ()  # more names a Host header may carry ("*": any)
    allowed_origins: Collection[str] = ()  # web pages that may call the API ("*": any)
    request_timeout_s: float = DEFAULT_REQUEST_TIMEOUT_S
    max_connections: int = DEFAULT_MAX_CONNECTIONS

    def origins(self) -> list[str]:
        return [*self.allowed_origins, *([self.cors_origin] if self.cors_origin else [])]


class LocalChatServer:
    """The routes' state: the model, the scheduler and the requests in flight."""

    def __init__(self, lm: LanguageModel, scheduler: Any, options: ServerOptions) -> None:
        self.lm = lm
        self.scheduler = scheduler
        self.options = options
        self.model_names = frozenset({options.model_id, *options.aliases})
        self.started = int(time.time())
        self._in_flight: set[CancelToken] = set()
        self._lock = threading.Lock()
        # /health counts: every admitted request ends as exactly one of completed, cancelled or
        # failed; refused ones are counted by HTTP status
        self._counts = {"admitted": 0, "completed": 0, "cancelled": 0, "failed": 0}
        self._refused: dict[str, int] = {}
        self._api_key = options.api_key.encode("utf-8") if options.api_key else None
        self.vocab_size = _vocab_size(lm)

    def count_refused(self, status: int) -> None:
        with self._lock:
            key = str(status)
            self._refused[key] = self._refused.get(key, 0) + 1

    def cancel_all(self) -> None:
        """Shutdown: end every running or queued request (each still ends with its Finished)."""
        with self._lock:
            tokens = list(self._in_flight)
        for token in tokens:
            token.cancel()

    def in_flight(self) -> int:
        with self._lock:
            return len(self._in_flight)

    # --- routes ------------------------------------------------------------------------------
    async def health(self, request: Request) -> Response:
        stats = self.scheduler.stats()
        if dataclasses.is_dataclass(stats):
            values = {f.name: getattr(stats, f.name) for f in dataclasses.fields(stats)}
        else:
            values = dict(vars(stats))
        with self._lock:
            requests: dict[str, Any] = {**self._counts, "in_flight": len(self._in_flight)}
            requests["refused"] = dict(self._refused)
        return JSONResponse(
            {"status": "ok", "model": self.options.model_id, **values, "requests": requests}
        )

    async def models(self, request: Request) -> Response:
        self._authorize(request)
        return JSONResponse({"object": "list", "data": [self._model_object()]})

    async def model(self, request: Request) -> Response:
        self._authorize(request)
        name = request.path_params["model"]
        if name not in self.model_names:
            raise ApiError(
                404,
                f"The model {name[:100]!r} does not exist (GET /v1/models lists the one served)",
                param="model",
                code="model_not_found",
            )
        return JSONResponse(self._model_object())

    async def chat_completions(self, request: Request) -> Response:
        return await self._generate(request, parse_chat)

    async def completions(self, request: Request) -> Response:
        return await self._generate(request, parse_completion)

    # --- generation --------------------------------------------------------------------------
    async def _generate(self, request: Request, parse: Callable[..., ParsedRequest]) -> Response:
        try:
            return await self._admit_and_run(request, parse)
        except ApiError as exc:
            self.count_refused(exc.status)
            raise

    async def _admit_and_run(
        self, request: Request, parse: Callable[..., ParsedRequest]
    ) -> Response:
        self._authorize(request)
        body = await self._read_json(request)
        prompt_param = "messages" if parse is parse_chat else "prompt"
        try:
            parsed = parse(body, self.model_names, vocab_size=self.vocab_size)
        except EngineError as exc:
            raise from_engine_error(exc, prompt_param) from None
        cancel = CancelToken()
        try:
            ticket = await anyio.to_thread.run_sync(
                partial(self.scheduler.submit, parsed.request, cancel)
            )
        except EngineError as exc:
            raise from_engine_error(exc, prompt_param) from None
        headers = {}
        if ticket.queue_position > 0:
            headers[QUEUE_POSITION_HEADER] = str(ticket.queue_position)
        with self._lock:
            self._in_flight.add(cancel)
            self._counts["admitted"] += 1
        pump = EventPump(ticket, asyncio.get_running_loop())
        writer = ResponseWriter(parsed, self.options.model_id, self._token_bytes)
        if parsed.stream:
            return CancellingStreamingResponse(
                self._sse(writer, pump, cancel), cancel, headers=headers
            )
        failure: ApiError | None = None
        try:
            async with anyio.create_task_group() as group:
                group.start_soon(cancel_on_disconnect, request.receive, cancel)
                try:
                    finished = await self._drain(writer, pump)
                except ApiError as exc:  # raised here, not as a task group's ExceptionGroup
                    failure = exc
                group.cancel_scope.cancel()
        except BaseException:
            self._finish(cancel, None)
            raise
        if failure is not None:
            self._finish(cancel, None, failed=True)
            raise failure
        self._finish(cancel, finished)
        if finished.error is not None:
            raise ApiError(500, finished.error, type=SERVER_ERROR)
        return JSONResponse(writer.response(finished), headers=headers)

    async def _drain(self, writer: ResponseWriter, pump: EventPump) -> Finished:
        """Every event up to the request's Finished (kept in `writer`)."""
        async for event in pump:
            writer.chunks(event)
            if isinstance(event, Finished):
                return event
        raise ApiError(500, _NO_FINAL_EVENT, type=SERVER_ERROR)

    async def _sse(
        self, writer: ResponseWriter, pump: EventPump, cancel: CancelToken
    ) -> AsyncIterator[bytes]:
        finished = None
        failed = False
        try:
            for chunk in writer.opening_chunks():
                yield sse(chunk)
            try:
                async for event in pump:
                    for chunk in writer.chunks(event):
                        yield sse(chunk)
                    if isinstance(event, Finished):
                        finished = event
                        if event.error is not None:
                            yield sse(error_body(event.error, type=SERVER_ERROR))
                        else:
                            for chunk in writer.closing_chunks(event):
                                yield sse(chunk)
                        break
                else:
                    raise ApiError(500, _NO_FINAL_EVENT, type=SERVER_ERROR)
            except ApiError as exc:  # the scheduler broke its contract: say so in the stream
                failed = True
                yield sse(exc.body())
            yield b"data: [DONE]\n\n"
        finally:
            cancel.cancel()  # a no-op after Finished; on a stream torn down early, it ends it
            self._finish(cancel, finished, failed=failed)

    def _finish(self, cancel: CancelToken, finished: Finished | None, failed: bool = False) -> None:
        """Count how an admitted request ended (None: torn down before its final event, or
        `failed`: the scheduler ended it without one)."""
        if failed:
            outcome = "failed"
        elif finished is None or finished.error is not None:
            outcome = "failed" if finished is not None else "cancelled"
        elif finished.finish_reason == FinishReason.CANCELLED:
            outcome = "cancelled"
        else:
            outcome = "completed"
        with self._lock:
            self._in_flight.discard(cancel)
            self._counts[outcome] += 1

    # --- request plumbing --------------------------------------------------------------------
    def _authorize(self, request: Request) -> None:
        if self._api_key is None:
            return
        header = request.headers.get("authorization")
        if not header:
            raise ApiError(
                401,
                "Missing API key: send it as 'Authorization: Bearer KEY'",
                code="invalid_api_key",
            )
        scheme, _, token = header.partition(" ")
        given = token.strip().encode("utf-8", "replace")
        # compare_digest takes time independent of where the bytes differ
        if not (scheme.lower() == "bearer" and hmac.compare_digest(given, self._api_key)):
            raise ApiError(401, "Incorrect API key provided", code="invalid_api_key")

    async def _read_json(self, request: Request) -> Any:
        media_type = request.headers.get("content-type", "").partition(";")[0].strip().lower()
        if media_type != JSON_MEDIA_TYPE:
            shown = repr(media_type[:100]) if media_type else "none"
            raise ApiError(
                415,
                f"The request body must be JSON sent with 'Content-Type: {JSON_MEDIA_TYPE}' "
                f"(this one's Content-Type is {shown})",
                code="unsupported_media_type",
            )
        limit = self.options.max_body_bytes
        declared = request.headers.get("content-length")
        if declared is not None:
            try:
                length = int(declared)
            except ValueError:
                raise ApiError(400, f"Content-Length {declared!r} is not a number") from None
            if length > limit:
                raise _too_large(length, limit)
        received = bytearray()
        timeout = self.options.request_timeout_s
        try:
            with anyio.fail_after(timeout):
                async for chunk in request.stream():
                    received += chunk
                    if len(received) > limit:
                        raise _too_large(len(received), limit)
        except TimeoutError:
            raise ApiError(
                408,
                f"The request body did not arrive within {timeout:g} s ({len(received)} bytes "
                "came)",
                code="request_timeout",
            ) from None
        except ClientDisconnect:  # nobody reads the answer; ends the request quietly
            raise ApiError(400, "The client closed the connection during the body") from None
        try:
            return json.loads(received, parse_constant=_refuse_constant)
        except (ValueError, RecursionError) as exc:
            raise ApiError(
                400,
                f"The request body is not valid JSON: {exc}",
                code="invalid_json",
            ) from None

    def _model_object(self) -> dict:
        return {
            "id": self.options.model_id,
            "object": "model",
            "created": self.started,
            "owned_by": "localchat",
            "context_length": int(self.lm.n_ctx),
        }

    def _token_bytes(self, token_id: int) -> bytes:
        return self.lm.tokenizer.piece_bytes(token_id, special=True)


def _vocab_size(lm: Any) -> int | None:
    """Token ids a request may name: those both the tokenizer and the embedding table have."""
    sizes = [
        getattr(getattr(lm, "tokenizer", None), "vocab_size", None),
        getattr(getattr(lm, "config", None), "n_vocab", None),
    ]
    known = [int(s) for s in sizes if isinstance(s, int) and not isinstance(s, bool)]
    return min(known) if known else None


def _refuse_constant(name: str) -> Any:
    """json.loads reads NaN, Infinity and -Infinity, which JSON does not have."""
    raise ValueError(f"{name} is not a JSON value")


def _too_large(size: int, limit: int) -> ApiError:
    return ApiError(
        413,
        f"The request body is {size} bytes or more, over this server's limit of {limit} bytes",
        code="request_too_large",
    )


def sse(obj: dict) -> bytes:
    text = json.dumps(obj, ensure_ascii=False, separators=(",", ":"))
    return b"data: " + text.encode("utf-8") + b"\n\n"


async def cancel_on_disconnect(receive: Receive, cancel: CancelToken) -> None:
    """Wait for the client to go away, then cancel its request (the body was read already, so
    the next ASGI message is the disconnect)."""
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            cancel.cancel()
            return


class CancellingStreamingResponse(StreamingResponse):
    """An SSE response that watches the connection however the server's ASGI version says
    disconnects are reported: a client that leaves cancels the request (its CancelToken), and the
    stream still runs to the request's final event so the scheduler's bookkeeping stays exact."""

    def __init__(
        self, content: AsyncIterator[bytes], cancel: CancelToken, headers: dict[str, str]
    ) -> None:
        super().__init__(
            content,
            media_type="text/event-stream",
            headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no", **headers},
        )
        self.cancel = cancel

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        client_gone = anyio.Event()

        async def watch() -> None:
            await cancel_on_disconnect(receive, self.cancel)
            client_gone.set()

        async def send_while_connected(message) -> None:
            if client_gone.is_set():
                return  # nothing more reaches it; the stream only runs on to its final event
            try:
                await send(message)
            except OSError:  # servers that report a closed connection on send
                client_gone.set()
                self.cancel.cancel()

        async with anyio.create_task_group() as group:
            group.start_soon(watch)
            await self.stream_response(send_while_connected)
            group.cancel_scope.cancel()


class EventPump:
    """`Ticket.events()` (a blocking iterator) -> an async iterator, through one thread."""

    _END = object()

    def __init__(self, ticket: Any, loop: asyncio.AbstractEventLoop) -> None:
        self._queue: asyncio.Queue = asyncio.Queue()
        self._loop = loop
        self._thread = threading.Thread(
            target=self._run, args=(ticket,), name="localchat-http-request", daemon=True
        )
        self._thread.start()

    def _run(self, ticket: Any) -> None:
        try:
            for event in ticket.events():
                self._put(event)
        except Exception as exc:  # the scheduler broke its contract: report, do not hang
            self._put(_PumpFailed(exc))
        finally:
            self._put(self._END)

    def _put(self, item: object) -> None:
        # RuntimeError: the event loop is closed, the server is gone
        with contextlib.suppress(RuntimeError):
            self._loop.call_soon_threadsafe(self._queue.put_nowait, item)

    def __aiter__(self) -> EventPump:
        return self

    async def __anext__(self) -> object:
        item = await self._queue.get()
        if item is self._END:
            raise StopAsyncIteration
        if isinstance(item, _PumpFailed):
            raise ApiError(500, f"generation failed: {item.exc}", type=SERVER_ERROR)
        return item


@dataclasses.dataclass
class _PumpFailed:
    exc: Exception


# --- the application -------------------------------------------------------------------------------
async def _api_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, ApiError)
    headers = {"WWW-Authenticate": "Bearer"} if exc.status == 401 else None
    response = JSONResponse(exc.body(), status_code=exc.status, headers=headers)
    if exc.status in (408, 413):
        response.headers["Connection"] = "close"  # the rest of the body is never read
    return response


async def _http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    return JSONResponse(
        error_body(str(exc.detail), code=f"http_{exc.status_code}"), status_code=exc.status_code
    )


async def _unexpected(request: Request, exc: Exception) -> Response:
    return JSONResponse(
        error_body(f"{type(exc).__name__}: {exc}", type=SERVER_ERROR), status_code=500
    )


def build_app(server: LocalChatServer) -> Starlette:
    routes = [
        Route("/health", server.health, methods=["GET"]),
        Route("/v1/models", server.models, methods=["GET"]),
        Route("/v1/models/{model:path}", server.model, methods=["GET"]),
        Route("/v1/chat/completions", server.chat_completions, methods=["POST"]),
        Route("/v1/completions", server.completions, methods=["POST"]),
    ]
    options = server.options
    policy = AccessPolicy.build(options.bound_host, options.allowed_hosts, options.origins())
    middleware = [Middleware(AccessGuard, policy=policy, on_refused=server.count_refused)]
    if policy.origins:
        # allowed origins only (the guard refused the others): the headers and preflight answers
        # a browser needs to let the page read the response
        middleware.append(
            Middleware(
                CORSMiddleware,
                allow_origins=sorted(policy.origins),
                allow_methods=["GET", "POST", "OPTIONS"],
                allow_headers=["Authorization", "Content-Type"],
                expose_headers=[QUEUE_POSITION_HEADER],
            )
        )
    return Starlette(
        routes=routes,
        middleware=middleware,
        exception_handlers={
            ApiError: _api_error,
            HTTPException: _http_error,
            Exception: _unexpected,
        },
    )
