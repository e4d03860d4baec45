"""Every branch of the OpenAI-compatible client (app/backends/openai_client.py) that a user or a
server would notice, in the fast tier: a raw HTTP server on loopback answers each request with
bytes written out here (the OpenAI API's documented shapes, and the ways real servers differ
from them or break), so no model is loaded and every expected value is hand-written.

Real servers (llama-cpp-python and `python -m engine serve`, slow tier): test_remote_client.py."""

from __future__ import annotations

import contextlib
import json
import socket
import socketserver
import threading
import time
from dataclasses import dataclass, field

import pytest

from app.backends.errors import (
    AuthError,
    MalformedChunkError,
    RateLimitedError,
    RemoteTimeoutError,
    RequestRejectedError,
    ServerError,
    TlsError,
    UnknownModelError,
    UnreachableHostError,
)
from app.backends.openai_client import (
    MAX_ERROR_TEXT,
    Connection,
    OpenAIClient,
    RemoteModel,
    _is_tls_failure,
    _retry_after_s,
)
from app.engine_bridge import StreamNotice
from app.finish_reasons import PLAIN_SERVER_WORDS, SERVER_ENDS
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
)
from engine.types import FinishReason, ToolCall

KEY = "sk-secret-key-0123456789"
QUESTION = [{"role": "user", "content": "Hi"}]


# --- the raw server ------------------------------------------------------------------------------
@dataclass
class Answer:
    """One scripted HTTP answer. `pieces` go out one chunk each (chunked encoding); `cut`: the
    connection closes with no terminating chunk (a broken stream); `hold_s`: wait that long
    before the status line (a slow first byte); `hold_after`: after the pieces, wait that long
    before ending (a server that goes quiet mid-stream)."""

    status: int = 200
    pieces: list[bytes] = field(default_factory=list)
    headers: dict[str, str] = field(default_factory=dict)
    cut: bool = False
    hold_s: float = 0.0
    hold_after: float = 0.0


class RawServer:
    """`RawServer([Answer, ...])`: the n-th request gets the n-th answer (the last one again after
    the script ends). `requests` holds (method, path, headers, body) of each."""

    def __init__(self, answers: list[Answer]):
        self.answers = answers
        self.requests: list[tuple[str, str, dict[str, str], dict | None]] = []
        self.release = threading.Event()  # ends every hold at once (teardown)
        server = self

        class Handler(socketserver.StreamRequestHandler):
            def handle(self):
                head = b""
                if self.rfile.peek(1)[:1] == b"\x16":  # a TLS hello, answered in plain HTTP
                    self.wfile.write(b"HTTP/1.1 400 Bad Request\r\n\r\n")
                    return
                while b"\r\n\r\n" not in head:
                    byte = self.rfile.read(1)
                    if not byte:
                        return
                    head += byte
                lines = head.decode("latin-1").split("\r\n")
                method, path, _ = lines[0].split(" ", 2)
                headers = {}
                for line in lines[1:]:
                    if ": " in line:
                        name, value = line.split(": ", 1)
                        headers[name.lower()] = value
                length = int(headers.get("content-length") or 0)
                raw = self.rfile.read(length) if length else b""
                body = json.loads(raw) if raw else None
                with threading.Lock():
                    server.requests.append((method, path, headers, body))
                    answer = server.answers[min(len(server.requests), len(server.answers)) - 1]
                with contextlib.suppress(OSError):  # the client went away (Stop)
                    self._answer(answer)

            def _answer(self, answer: Answer):
                if answer.hold_s and server.release.wait(answer.hold_s):
                    return
                out = self.wfile
                out.write(f"HTTP/1.1 {answer.status} X\r\n".encode())
                headers = {"Content-Type": "text/event-stream", **answer.headers}
                for name, value in headers.items():
                    out.write(f"{name}: {value}\r\n".encode())
                out.write(b"Transfer-Encoding: chunked\r\nConnection: close\r\n\r\n")
                out.flush()
                for piece in answer.pieces:
                    out.write(f"{len(piece):x}\r\n".encode() + piece + b"\r\n")
                    out.flush()
                if answer.hold_after:
                    server.release.wait(answer.hold_after)
                if not answer.cut:
                    out.write(b"0\r\n\r\n")
                    out.flush()

        class Server(socketserver.ThreadingTCPServer):
            daemon_threads = True
            allow_reuse_address = True

        self._tcp = Server(("127.0.0.1", 0), Handler)
        self._thread = threading.Thread(target=self._tcp.serve_forever, args=(0.05,), daemon=True)
        self._thread.start()

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self._tcp.server_address[1]}/v1"

    def bodies(self) -> list[dict | None]:
        return [r[3] for r in self.requests]

    def stop(self) -> None:
        self.release.set()
        self._tcp.shutdown()
        self._tcp.server_close()


@pytest.fixture
def serve():
    servers: list[RawServer] = []

    def start(*answers: Answer) -> RawServer:
        servers.append(RawServer(list(answers)))
        return servers[-1]

    yield start
    for server in servers:
        server.stop()


def client_for(server: RawServer, key: str | None = None, timeout_s: float = 10.0):
    return OpenAIClient(Connection("c1", "srv", server.base_url, timeout_s), key)


def label(server: RawServer) -> str:
    return f"srv ({server.base_url.split('/')[2]})"


def data(obj) -> bytes:
    return b"data: " + (obj if isinstance(obj, bytes) else json.dumps(obj).encode()) + b"\n\n"


def chunk(finish: str | None = None, **delta) -> bytes:
    return data({"choices": [{"index": 0, "delta": delta, "finish_reason": finish}]})


DONE = b"data: [DONE]\n\n"


def stream(*pieces: bytes, **kw) -> Answer:
    return Answer(pieces=list(pieces), **kw)


def json_answer(status: int, obj, **headers: str) -> Answer:
    body = obj if isinstance(obj, bytes) else json.dumps(obj).encode()
    return Answer(status, [body], {"Content-Type": "application/json", **headers})


def chat(server: RawServer, params: dict | None = None, cancel=None, key=None, timeout_s=10.0):
    with client_for(server, key, timeout_s) as client:
        return list(client.chat("m1", QUESTION, params or {}, cancel or CancelToken()))


def finished(events) -> Finished:
    finals = [e for e in events if isinstance(e, Finished)]
    assert len(finals) == 1 and events[-1] is finals[0]
    return finals[0]


def of(kind, events) -> list:
    return [e for e in events if isinstance(e, kind)]


# --- models --------------------------------------------------------------------------------------
def test_models_listed_with_their_context_lengths_and_the_key_sent(serve):
    rows = [
        {"id": "a", "owned_by": "me", "max_model_len": 4096},
        {"id": "b", "context_length": 8192},
        {"id": "c", "context_window": 100},
        {"id": "d", "n_ctx": 2048},
        {"id": "e", "meta": {"n_ctx_train": 512}},
        {"id": "f", "context_length": 0, "n_ctx": -1, "meta": {"n_ctx_train": "x"}},
        {"id": 7, "owned_by": None, "context_length": "4096", "meta": "none"},
        {"id": "g", "n_ctx": 1},
    ]
    server = serve(json_answer(200, {"object": "list", "data": rows}))
    with client_for(server, KEY) as client:
        models = client.list_models()
    assert models == [
        RemoteModel("a", "me", 4096),
        RemoteModel("b", "", 8192),
        RemoteModel("c", "", 100),
        RemoteModel("d", "", 2048),
        RemoteModel("e", "", 512),
        RemoteModel("f", "", None),
        RemoteModel("7", "", None),
        RemoteModel("g", "", 1),
    ]
    method, path, headers, _ = server.requests[0]
    assert (method, path) == ("GET", "/v1/models")
    assert headers["authorization"] == f"Bearer {KEY}"
    assert headers["accept"] == "application/json"


def test_a_bare_list_of_models_and_no_key_header_without_a_key(serve):
    server = serve(json_answer(200, [{"id": "x"}]))
    with client_for(server) as client:
        assert client.list_models() == [RemoteModel("x")]
    assert "authorization" not in server.requests[0][2]


@pytest.mark.parametrize(
    "body, problem",
    [
        (b"<html>not json</html>", "JSONDecodeError: Expecting value: line 1 column 1 (char 0))"),
        (b'{"data": [{"name": "no id"}]}', "KeyError: 'id')"),
        (b'{"data": 5}', "TypeError: 'int' object is not iterable)"),
        (b'{"models": []}', "KeyError: 'data')"),
    ],
)
def test_a_model_list_that_is_not_one_is_named(serve, body, problem):
    server = serve(json_answer(200, body))
    with client_for(server) as client, pytest.raises(MalformedChunkError) as caught:
        client.list_models()
    assert str(caught.value) == (
        f"{label(server)} answered /models with something that is not an OpenAI model list "
        f"({problem}"
    )


def test_model_list_errors_are_named(serve):
    server = serve(json_answer(401, {"error": {"message": f"bad key {KEY}"}}))
    with client_for(server, KEY) as client, pytest.raises(AuthError) as caught:
        client.list_models()
    assert str(caught.value) == (
        f"{label(server)} refused the API key (HTTP 401): bad key [API key]. Check the key in "
        "Settings > Connections."
    )
    server = serve(json_answer(404, {"error": "no such route"}))
    with client_for(server) as client, pytest.raises(UnknownModelError) as caught:
        client.list_models()
    assert str(caught.value) == (
        f"{label(server)} does not know this endpoint (HTTP 404): no such route. Pick another "
        "model."
    )


def test_more_model_list_errors_are_named(serve):
    server = serve(json_answer(400, {"error": {"message": "bad request"}}))
    with client_for(server) as client, pytest.raises(RequestRejectedError) as caught:
        client.list_models()
    assert str(caught.value) == f"{label(server)} refused the request (HTTP 400): bad request"
    assert caught.value.host == label(server)
    server = serve(json_answer(429, {"error": {"message": "busy"}}, **{"Retry-After": "5"}))
    with client_for(server) as client, pytest.raises(RateLimitedError) as caught:
        client.list_models()
    assert caught.value.retry_after_s == 5
    assert str(caught.value).endswith("(HTTP 429): busy. Try again in 5 s.")
    server = serve(json_answer(200, b"[1]"))
    with client_for(server) as client, pytest.raises(MalformedChunkError) as caught:
        client.list_models()
    assert caught.value.host == label(server)


def test_a_model_list_that_takes_too_long_says_what_was_being_done(serve):
    server = serve(Answer(hold_s=30))
    with client_for(server, timeout_s=0.3) as client, pytest.raises(RemoteTimeoutError) as caught:
        client.list_models()
    assert str(caught.value) == (
        f"{label(server)} sent no answer within 0.3 s while listing its models (the "
        "connection's timeout; raise it in Settings > Connections for slow servers)."
    )


def test_an_unreachable_host_is_named_with_what_was_being_done():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    connection = Connection("c1", "srv", f"http://127.0.0.1:{port}/v1")
    with OpenAIClient(connection) as client, pytest.raises(UnreachableHostError) as caught:
        client.list_models()
    text = str(caught.value)
    assert text.startswith(f"Cannot reach srv (127.0.0.1:{port}): ")
    assert text.endswith(". Is the server running, and are the address and port right?")


def test_https_to_a_plain_http_server_is_a_tls_error(serve):
    server = serve(json_answer(200, []))
    url = server.base_url.replace("http://", "https://")
    with OpenAIClient(Connection("c1", "srv", url)) as client, pytest.raises(TlsError) as caught:
        client.list_models()
    assert str(caught.value).startswith(f"The secure connection to {label(server)} failed: ")
    assert str(caught.value).endswith(
        "Check the certificate, or whether the server speaks http:// rather than https://."
    )


def test_tls_failures_are_recognised_through_the_exception_chain():
    import ssl

    assert _is_tls_failure(ssl.SSLError("x"))
    assert _is_tls_failure(OSError("[SSL: WRONG_VERSION_NUMBER] wrong version number"))
    assert _is_tls_failure(OSError("certificate verify failed"))

    class SSLBroken(Exception):
        pass

    assert _is_tls_failure(SSLBroken("handshake"))
    outer = ConnectionError("connect failed")
    outer.__cause__ = ssl.SSLError("inner")
    assert _is_tls_failure(outer)
    context_only = ConnectionError("connect failed")
    context_only.__context__ = OSError("CERTIFICATE_VERIFY_FAILED")
    assert _is_tls_failure(context_only)
    assert not _is_tls_failure(ConnectionRefusedError("refused"))
    looped = ConnectionError("a")
    looped.__cause__ = looped  # a cycle ends the walk
    assert not _is_tls_failure(looped)
    assert not _is_tls_failure(OSError("ssl in lower case is not the library's word"))


# --- the request ---------------------------------------------------------------------------------
def test_the_request_body_and_what_finished_records_of_it(serve):
    server = serve(stream(chunk(content="Hello"), chunk("stop"), DONE))
    params = {"temperature": 0.5, "tools": [{"type": "function", "function": {"name": "t"}}]}
    events = chat(server, params, key=KEY)
    method, path, headers, body = server.requests[0]
    assert (method, path) == ("POST", "/v1/chat/completions")
    assert headers["authorization"] == f"Bearer {KEY}"
    assert body == {
        "model": "m1",
        "messages": QUESTION,
        "stream": True,
        "stream_options": {"include_usage": True},
        **params,
    }
    done = finished(events)
    assert done.preset == {"stream_options": {"include_usage": True}, "temperature": 0.5}
    assert (done.text, done.finish_reason, done.error) == ("Hello", FinishReason.STOP, None)


def test_stop_before_the_request_sends_nothing(serve):
    server = serve(stream(DONE))
    cancel = CancelToken()
    cancel.cancel()
    events = chat(server, cancel=cancel)
    assert server.requests == []
    done = finished(events)
    assert (done.finish_reason, done.text) == (FinishReason.CANCELLED, "")
    assert done.usage.server_finish_reason == ""


def test_a_refused_json_schema_goes_again_in_llama_cpps_form(serve):
    schema = {"type": "object"}
    params = {
        "response_format": {"type": "json_schema", "json_schema": {"name": "r", "schema": schema}}
    }
    server = serve(
        json_answer(400, {"error": {"message": "response_format json_schema not supported"}}),
        stream(chunk(content="{}"), chunk("stop"), DONE),
    )
    events = chat(server, params)
    assert server.bodies()[1]["response_format"] == {"type": "json_object", "schema": schema}
    assert [e.message for e in of(StreamNotice, events)] == [
        f"{label(server)} does not accept response_format json_schema; the schema was sent the "
        "way llama.cpp's servers take it (json_object with a schema)."
    ]
    assert finished(events).text == "{}"


@pytest.mark.parametrize(
    "status, said", [(422, "response_format bad"), (500, "unknown type json_schema")]
)
def test_the_json_schema_fallback_also_on_422_and_llama_cpp_pythons_500(serve, status, said):
    params = {"response_format": {"type": "json_schema", "json_schema": {}}}
    server = serve(json_answer(status, {"detail": said}), stream(DONE))
    chat(server, params)
    assert server.bodies()[1]["response_format"] == {"type": "json_object", "schema": {}}


@pytest.mark.parametrize(
    "status, text, fmt",
    [
        (404, "json_schema", {"type": "json_schema", "json_schema": {}}),  # not a refusal
        (400, "json_schema", {"type": "json_object"}),  # not the json_schema form
        (400, "something else", {"type": "json_schema", "json_schema": {}}),  # not about it
        (400, "json_schema", "json_schema"),  # not a dict
    ],
)
def test_no_json_schema_fallback_when_the_refusal_is_not_about_it(serve, status, text, fmt):
    server = serve(json_answer(status, {"error": {"message": text}}), stream(DONE))
    with pytest.raises((RequestRejectedError, UnknownModelError)):
        chat(server, {"response_format": fmt})
    assert len(server.requests) == 1


@pytest.mark.parametrize("field_name", ["seed", "top_k", "min_p", "stream_options"])
def test_a_refused_optional_field_is_left_out_and_said(serve, field_name):
    server = serve(
        json_answer(400, {"error": {"message": f"Unrecognized argument: {field_name.upper()}"}}),
        stream(chunk(content="ok"), chunk("stop"), DONE),
    )
    params = {"seed": 1, "top_k": 5, "min_p": 0.1, "top_logprobs": 2}
    events = chat(server, params)
    assert field_name not in server.bodies()[1]
    assert all(k in server.bodies()[1] for k in params if k != field_name)
    assert [e.message for e in of(StreamNotice, events)] == [
        f"{label(server)} does not accept the field '{field_name}'; it was left out of the request."
    ]
    assert finished(events).text == "ok"


def test_refused_logprobs_take_top_logprobs_with_them_and_both_refusals_are_said(serve):
    server = serve(
        json_answer(400, {"error": {"message": "logprobs not supported"}}),
        json_answer(422, {"error": {"message": "seed is not allowed"}}),
        stream(chunk("stop"), DONE),
    )
    events = chat(server, {"logprobs": True, "top_logprobs": 3, "seed": 4})
    last = server.bodies()[2]
    assert "logprobs" not in last and "top_logprobs" not in last and "seed" not in last
    assert [e.message for e in of(StreamNotice, events)] == [
        f"{label(server)} does not accept the field 'logprobs'; it was left out of the request.",
        f"{label(server)} does not accept the field 'seed'; it was left out of the request.",
    ]


def test_an_optional_field_named_in_a_non_refusal_is_not_dropped(serve):
    server = serve(json_answer(503, {"error": {"message": "seed overloaded"}}), stream(DONE))
    with pytest.raises(ServerError):
        chat(server, {"seed": 1})
    assert len(server.requests) == 1


def test_an_optional_field_not_in_the_request_is_not_blamed(serve):
    server = serve(json_answer(400, {"error": {"message": "bad seed"}}), stream(DONE))
    with pytest.raises(RequestRejectedError) as caught:
        chat(server, {"temperature": 1})
    assert len(server.requests) == 1
    assert str(caught.value) == f"{label(server)} refused the request (HTTP 400): bad seed"


# --- HTTP errors ---------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "status, body, kind, text",
    [
        (
            403,
            {"error": {"message": "no access"}},
            AuthError,
            "{L} refused the API key (HTTP 403): no access. Check the key in Settings > "
            "Connections.",
        ),
        (
            404,
            {"error": {"message": "model not found"}},
            UnknownModelError,
            "{L} does not know the model 'm1' (HTTP 404): model not found. Pick another model.",
        ),
        (
            500,
            {"error": {"message": "CUDA out of memory"}},
            ServerError,
            "{L} failed to answer (HTTP 500): CUDA out of memory.",
        ),
        (502, b"", ServerError, "{L} failed to answer (HTTP 502)."),
        (
            500,
            {"detail": [{"loc": ["body", "max_tokens"], "msg": "validation error: not int"}]},
            RequestRejectedError,
            "{L} refused the request (HTTP 500): max_tokens: validation error: not int",
        ),
        (
            422,
            {"detail": [{"loc": ["body"], "msg": "bad"}, {"msg": "worse"}, "plain"]},
            RequestRejectedError,
            "{L} refused the request (HTTP 422): bad; worse; plain",
        ),
        (
            400,
            {"error": {"detail": [{"loc": ["x", 0], "msg": "m"}, {"loc": []}, {"loc": ["a"]}]}},
            RequestRejectedError,
            "{L} refused the request (HTTP 400): x.0: m; {{'loc': []}}; a:",
        ),
        (
            400,
            {"error": {"msg": "from msg"}},
            RequestRejectedError,
            "{L} refused the request (HTTP 400): from msg",
        ),
        (
            400,
            {"error": {"detail": "from detail"}},
            RequestRejectedError,
            "{L} refused the request (HTTP 400): from detail",
        ),
        (
            400,
            {"detail": "top detail"},
            RequestRejectedError,
            "{L} refused the request (HTTP 400): top detail",
        ),
        (400, {"error": {"code": 1}}, RequestRejectedError, 'REJ {{"error": {{"code": 1}}}}'),
        (
            400,
            {"error": None, "detail": "top, beside a null error"},
            RequestRejectedError,
            "REJ top, beside a null error",
        ),
        (
            400,
            {"error": 0, "detail": [{"loc": ["body", "n"], "msg": "m"}, {"msg": "o"}]},
            RequestRejectedError,
            "REJ n: m; o",
        ),
        (400, {"other": 1}, RequestRejectedError, 'REJ {{"other": 1}}'),
        (400, [1, 2], RequestRejectedError, "REJ [1, 2]"),
        (400, {"error": {"message": 5}}, RequestRejectedError, 'REJ {{"error": {{"message": 5}}}}'),
        (400, b"  plain\n\n text  ", RequestRejectedError, "REJ plain text"),
    ],
)
def test_http_errors_in_the_servers_own_words(serve, status, body, kind, text):
    server = serve(json_answer(status, body))
    with pytest.raises(kind) as caught:
        chat(server)
    expected = text.replace("REJ ", "{L} refused the request (HTTP 400): ").format(L=label(server))
    assert str(caught.value) == expected
    assert caught.value.host == label(server)


def test_an_error_text_is_cut_to_its_limit_and_never_shows_the_key(serve):
    long = f"{KEY} " + "x" * 2000
    server = serve(json_answer(400, {"error": {"message": long}}))
    with pytest.raises(RequestRejectedError) as caught:
        chat(server, key=KEY)
    said = str(caught.value).split("(HTTP 400): ", 1)[1]
    assert said == ("[API key] " + "x" * 2000)[:MAX_ERROR_TEXT]
    assert KEY not in str(caught.value)


@pytest.mark.parametrize(
    "retry_after, tail, wait",
    [
        ("7", ". Try again in 7 s.", 7),
        ("2.5", ". Try again in 2.5 s.", 2.5),
        ("-3", ". Try again in 0 s.", 0),
        ("soon", ".", None),
        (None, ".", None),
    ],
)
def test_rate_limits_say_when_to_try_again(serve, retry_after, tail, wait):
    headers = {"Retry-After": retry_after} if retry_after is not None else {}
    server = serve(json_answer(429, {"error": {"message": "slow down"}}, **headers))
    with pytest.raises(RateLimitedError) as caught:
        chat(server)
    assert (
        str(caught.value)
        == f"{label(server)} is rate limiting requests (HTTP 429): slow down{tail}"
    )
    assert caught.value.retry_after_s == wait
    assert caught.value.host == label(server)


def test_retry_after_as_an_http_date():
    in_two_minutes = time.strftime("%a, %d %b %Y %H:%M:%S GMT", time.gmtime(time.time() + 120))
    assert 118 <= _retry_after_s(in_two_minutes) <= 121
    past = time.strftime("%a, %d %b %Y %H:%M:%S GMT", time.gmtime(time.time() - 120))
    assert _retry_after_s(past) == 0
    assert _retry_after_s(" 12 ") == 12
    assert _retry_after_s("") is None
    assert _retry_after_s("Mon, 99 Foo 2025") is None


# --- the stream ----------------------------------------------------------------------------------
def test_text_reasoning_and_think_tags_stream_as_their_events(serve):
    server = serve(
        stream(
            chunk(reasoning_content="Plan A."),
            chunk(reasoning="Plan B."),
            chunk(content="<think>hidden</think>"),
            chunk(content="Hello"),
            chunk(content=" world"),
            chunk(content="", reasoning_content=""),
            chunk("stop"),
            DONE,
        )
    )
    events = chat(server)
    assert [type(e).__name__ for e in events if not isinstance(e, Finished)] == [
        "ReasoningDelta",
        "ReasoningDelta",
        "ReasoningDelta",
        "TextDelta",
        "TextDelta",
    ]
    assert [e.text for e in of(ReasoningDelta, events)] == ["Plan A.", "Plan B.", "hidden"]
    assert [e.text for e in of(TextDelta, events)] == ["Hello", " world"]
    done = finished(events)
    assert (done.text, done.reasoning) == ("Hello world", "Plan A.Plan B.hidden")


def test_only_the_first_choice_counts_and_events_after_done_are_ignored(serve):
    two = {
        "choices": [
            {"index": 0, "delta": {"content": "one"}, "finish_reason": None},
            {"index": 1, "delta": {"content": "two"}, "finish_reason": None},
        ]
    }
    server = serve(stream(data(two), chunk("stop"), DONE, chunk(content="after")))
    assert finished(chat(server)).text == "one"


def test_done_without_a_blank_line_at_the_end_still_ends_the_stream(serve):
    server = serve(stream(chunk(content="x"), chunk("stop"), b"data: [DONE]"))
    done = finished(chat(server))
    assert (done.finish_reason, done.text, done.error) == (FinishReason.STOP, "x", None)


def test_an_error_null_field_is_no_error(serve):
    body = {"error": None, "choices": [{"delta": {"content": "fine"}, "finish_reason": "stop"}]}
    server = serve(stream(data(body), DONE))
    done = finished(chat(server))
    assert (done.finish_reason, done.text) == (FinishReason.STOP, "fine")


@pytest.mark.parametrize(
    "piece, said",
    [
        (b'event: error\ndata: {"message": "boom"}\n\n', "boom"),
        (data({"error": {"message": "engine died"}}), "engine died"),
        (data({"error": "flat text"}), "flat text"),
        (b'event: error\ndata: {"x": 1}\n\n', '{"x": 1}'),
    ],
)
def test_an_error_in_the_stream_ends_the_reply_with_it(serve, piece, said):
    server = serve(stream(chunk(content="part"), piece, chunk(content="never"), DONE))
    done = finished(chat(server))
    assert done.finish_reason == FinishReason.ERROR
    assert done.text == "part"
    assert done.error == f"{label(server)} failed while streaming: {said}"


def test_an_error_in_the_stream_never_shows_the_key(serve):
    server = serve(stream(data({"error": {"message": f"key {KEY} " + "y" * 900}}), DONE))
    done = finished(chat(server, key=KEY))
    assert (
        done.error
        == f"{label(server)} failed while streaming: " + ("key [API key] " + "y" * 900)[:600]
    )


@pytest.mark.parametrize(
    "piece, said",
    [
        (b"data: {not json\n\n", "sent a stream chunk that is not JSON ("),
        (data([1, 2]), "sent a stream chunk that is not an object"),
        (data({"choices": {"0": 1}}), "sent 'choices' that is not a list"),
        (data({"choices": ["x"]}), "sent a choice that is not an object"),
        (data({"choices": [{"delta": "x"}]}), "sent a delta that is not an object"),
        (chunk(tool_calls=["x"]), "sent a tool call that is not an object"),
        (chunk(tool_calls=[{"index": "0"}]), "sent a tool call index '0'"),
        (chunk(tool_calls=[{"index": 0, "function": "f"}]), "sent a tool call without a function"),
    ],
)
def test_a_malformed_chunk_is_named_and_the_partial_reply_kept(serve, piece, said):
    server = serve(stream(chunk(content="kept"), piece, DONE))
    done = finished(chat(server))
    assert done.finish_reason == FinishReason.ERROR
    assert done.text == "kept"
    assert done.error.startswith(f"{label(server)} {said}")


def test_a_chunk_that_is_not_json_is_quoted_short_and_without_the_key(serve):
    server = serve(stream(data(f"{KEY} ".encode() + b"z" * 300), DONE))
    done = finished(chat(server, key=KEY))
    quoted = repr(f"[API key] {'z' * 300}"[:120])
    assert done.error.endswith(f": {quoted}")
    assert KEY not in done.error


def test_a_stream_without_done_is_an_error_that_says_so(serve):
    server = serve(stream(chunk(content="so far"), chunk("stop")))
    done = finished(chat(server))
    assert done.finish_reason == FinishReason.ERROR
    assert done.text == "so far"
    assert done.error == (
        f"The stream from {label(server)} stopped before it was complete (no [DONE]); the reply "
        "may be cut short."
    )
    assert done.usage.server_finish_reason == "stop"


def test_a_connection_cut_mid_stream_is_named(serve):
    server = serve(stream(chunk(content="half"), cut=True))
    done = finished(chat(server))
    assert done.finish_reason == FinishReason.ERROR
    assert done.text == "half"
    assert done.error.startswith(
        f"The connection to {label(server)} broke while streaming the reply ("
    )
    assert done.error.endswith("); the reply is cut short.")


def test_no_first_byte_within_the_timeout(serve):
    server = serve(Answer(hold_s=30))
    with pytest.raises(RemoteTimeoutError) as caught:
        chat(server, timeout_s=0.3)
    assert str(caught.value) == (
        f"{label(server)} sent no answer within 0.3 s while sending the request (the "
        "connection's timeout; raise it in Settings > Connections for slow servers)."
    )


def test_a_server_that_goes_quiet_mid_stream_times_out_with_the_partial_reply(serve):
    server = serve(stream(chunk(content="start"), hold_after=30))
    done = finished(chat(server, timeout_s=0.3))
    assert done.finish_reason == FinishReason.ERROR and done.text == "start"
    assert done.error == (
        f"{label(server)} sent nothing more within 0.3 s while streaming the reply (the "
        "connection's timeout; raise it in Settings > Connections for slow servers)."
    )


def test_a_stream_quiet_before_its_first_delta_says_no_answer(serve):
    server = serve(stream(b": keep-alive\n\n", hold_after=30))
    done = finished(chat(server, timeout_s=0.3))
    assert done.error.startswith(f"{label(server)} sent no answer within 0.3 s while streaming")


# Stop must not wait for the server: it holds its answer (or its next chunk) for HOLD_S, and the
# client's own timeout is as long, so only the interrupt (the socket shut down) can end the
# request early. A generous bound, far below HOLD_S, tells the two apart.
HOLD_S = 120.0
EARLY_S = 60.0


def test_stop_mid_stream_ends_at_once_with_the_partial_reply(serve):
    server = serve(stream(chunk(content="one"), chunk(content=" two"), hold_after=HOLD_S))
    cancel = CancelToken()
    events = []
    started = time.monotonic()
    with client_for(server, timeout_s=HOLD_S) as client:
        for event in client.chat("m1", QUESTION, {}, cancel):
            events.append(event)
            if len(of(TextDelta, events)) == 2:
                cancel.cancel()
                client.interrupt()
    assert time.monotonic() - started < EARLY_S
    done = finished(events)
    assert (done.finish_reason, done.text, done.error) == (FinishReason.CANCELLED, "one two", None)


def test_stop_before_the_first_byte_does_not_wait_for_it(serve):
    server = serve(Answer(hold_s=HOLD_S))
    cancel = CancelToken()
    with client_for(server, timeout_s=HOLD_S) as client:
        timer = threading.Timer(0.3, lambda: (cancel.cancel(), client.interrupt()))
        timer.start()
        started = time.monotonic()
        events = list(client.chat("m1", QUESTION, {}, cancel))
        timer.join()
    assert time.monotonic() - started < EARLY_S
    assert finished(events).finish_reason == FinishReason.CANCELLED


def test_a_stop_before_the_socket_exists_shuts_it_as_soon_as_it_connects(serve):
    """A Stop that lands after chat() checked its CancelToken but before the socket connected:
    the trace hook shuts the fresh socket down, so the request ends without waiting."""
    server = serve(Answer(hold_s=HOLD_S))
    cancel = CancelToken()
    with client_for(server, timeout_s=HOLD_S) as client:
        send = client._client.send

        def stop_then_send(request, **kw):
            cancel.cancel()
            client.interrupt()  # no socket yet: only the flag is set
            return send(request, **kw)

        client._client.send = stop_then_send  # type: ignore[method-assign]
        started = time.monotonic()
        events = list(client.chat("m1", QUESTION, {}, cancel))
    assert time.monotonic() - started < EARLY_S
    assert finished(events).finish_reason == FinishReason.CANCELLED
    assert len(server.requests) <= 1


def test_a_stop_from_before_the_request_still_counts(serve):
    """Stop pressed before the request started (the token already cancelled): nothing is sent."""
    server = serve(Answer(hold_s=HOLD_S))
    cancel = CancelToken()
    cancel.cancel()
    with client_for(server, timeout_s=HOLD_S) as client:
        client.interrupt()
        events = list(client.chat("m1", QUESTION, {}, cancel))
    assert finished(events).finish_reason == FinishReason.CANCELLED
    assert server.requests == []


def test_interrupt_with_no_request_in_flight_is_harmless(serve):
    server = serve(stream(chunk(content="ok"), chunk("stop"), DONE))
    with client_for(server) as client:
        client.interrupt()
        # a later request starts afresh (its CancelToken decides, not the old interrupt)
        events = list(client.chat("m1", QUESTION, {}, CancelToken()))
    assert finished(events).text == "ok"


# --- finish reasons ------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "word, reason",
    [
        ("stop", FinishReason.STOP),
        ("eos", FinishReason.STOP),
        ("eos_token", FinishReason.STOP),
        ("stop_sequence", FinishReason.STOP_SEQUENCE),
        ("length", FinishReason.LENGTH),
        ("max_tokens", FinishReason.LENGTH),
        ("tool_calls", FinishReason.STOP),  # no call in the reply: none to run
        ("function_call", FinishReason.STOP),
        (None, FinishReason.STOP),  # [DONE] ended it; no word
    ],
)
def test_clean_finish_reasons(serve, word, reason):
    server = serve(stream(chunk(content="text"), chunk(word), DONE))
    done = finished(chat(server))
    assert (done.finish_reason, done.error, done.text) == (reason, None, "text")
    assert done.usage.server_finish_reason == (word or "")


@pytest.mark.parametrize(
    "word, said",
    [
        (
            "cancelled",
            "cut the reply short (finish_reason 'cancelled': the server stopped generating, for "
            "example because it was shutting down); the partial reply is kept.",
        ),
        (
            "error",
            "ended the reply with an error (finish_reason 'error'); the partial reply is kept.",
        ),
        ("content_filter", "stopped the reply (content filter); the partial reply is kept."),
        (
            "foo",
            "ended the reply with finish_reason 'foo', which this app does not know: the reply may "
            "be incomplete.",
        ),
        (
            "abort",
            "ended the reply with finish_reason 'abort', which this app does not know: the reply "
            "may be incomplete.",
        ),
    ],
)
def test_finish_reasons_that_are_no_clean_end_are_errors_that_say_so(serve, word, said):
    server = serve(stream(chunk(content="partial"), chunk(word), DONE))
    done = finished(chat(server))
    assert done.finish_reason == FinishReason.ERROR
    assert done.text == "partial"
    assert done.error == f"{label(server)} {said}"
    assert done.usage.server_finish_reason == word


def test_the_clients_table_and_the_labels_table_name_the_same_words():
    from app.backends.openai_client import SERVER_END_DETAILS

    assert set(SERVER_END_DETAILS) == set(SERVER_ENDS)
    assert not set(SERVER_ENDS) & set(PLAIN_SERVER_WORDS)


def test_the_last_finish_reason_sent_counts(serve):
    server = serve(stream(chunk("length"), chunk("stop"), chunk(content="x"), DONE))
    done = finished(chat(server))
    assert done.finish_reason == FinishReason.STOP and done.usage.server_finish_reason == "stop"


# --- usage ---------------------------------------------------------------------------------------
def test_the_servers_usage_chunk_is_used(serve):
    usage = {
        "prompt_tokens": 30,
        "completion_tokens": 5,
        "prompt_tokens_details": {"cached_tokens": 20},
    }
    server = serve(
        stream(
            chunk(content="a"),
            chunk(content="b"),
            chunk("stop"),
            data({"choices": [], "usage": usage}),
            DONE,
        )
    )
    u = finished(chat(server)).usage
    assert (u.prompt_tokens, u.completion_tokens, u.cached_tokens) == (30, 5, 20)
    assert u.context_used == 35 and u.context_limit == 0
    assert u.measured_over_network
    assert u.ttft_ms > 0 and u.ttft_ms == u.prefill_ms
    assert u.prompt_tok_s == pytest.approx(30 / (u.ttft_ms / 1000))
    assert u.decode_ms > 0
    assert u.decode_tok_s == pytest.approx(4 / (u.decode_ms / 1000))


def test_cached_tokens_at_the_top_level_and_odd_values(serve):
    usage = {"prompt_tokens": -4, "completion_tokens": "7", "cached_tokens": 3}
    server = serve(stream(chunk(content="a"), data({"choices": [], "usage": usage}), DONE))
    u = finished(chat(server)).usage
    # nonsense counts are not believed: the reply's one delta is counted instead
    assert (u.prompt_tokens, u.completion_tokens, u.cached_tokens) == (0, 1, 3)
    assert u.prompt_tok_s == 0 and u.decode_tok_s == 0


def test_without_usage_the_reply_is_counted_from_the_stream(serve):
    server = serve(stream(chunk(content="a"), chunk(content="b"), chunk(content="c"), DONE))
    u = finished(chat(server)).usage
    assert (u.prompt_tokens, u.completion_tokens, u.cached_tokens) == (0, 3, None)
    assert u.context_used == 3
    details = {"prompt_tokens_details": {"cached_tokens": "many"}, "cached_tokens": None}
    server = serve(stream(chunk(content="a"), data({"choices": [], "usage": details}), DONE))
    assert finished(chat(server)).usage.cached_tokens is None


def test_an_empty_reply_has_no_timing(serve):
    server = serve(stream(chunk("stop"), DONE))
    u = finished(chat(server)).usage
    assert (u.ttft_ms, u.decode_ms, u.decode_tok_s, u.completion_tokens) == (0, 0, 0, 0)


# --- logprobs ------------------------------------------------------------------------------------
def test_logprobs_become_tokens_with_their_alternatives(serve):
    def lp(*entries):
        return {"content": list(entries)}

    first = {
        "token": "Hel",
        "logprob": -0.5,
        "top_logprobs": [
            {"token": "Hel", "logprob": -0.5},
            {"token": "Hi", "logprob": "bad"},
            {"token": 5, "logprob": -1},
            "junk",
            {"token": "Yo"},
        ],
    }
    body = {
        "choices": [
            {
                "delta": {"content": "Hello"},
                "logprobs": lp(first, {"token": "lo", "logprob": -0.25, "top_logprobs": None}),
            }
        ]
    }
    bad = {
        "choices": [
            {
                "delta": {"content": "!"},
                "logprobs": lp(
                    {"token": 3}, "x", {"token": "?", "logprob": "nan?"}, {"token": "!"}
                ),
            }
        ]
    }
    ignored = {"choices": [{"delta": {}, "logprobs": {"content": "not a list"}}]}
    server = serve(
        stream(data(body), data(bad), data(ignored), data({"choices": [{"logprobs": []}]}), DONE)
    )
    events = chat(server)
    assert of(TokenSampled, events) == [
        TokenSampled(
            0, -1, "Hel", -0.5, (TopAlternative(-1, "Hel", -0.5), TopAlternative(-1, "Yo", 0.0))
        ),
        TokenSampled(1, -1, "lo", -0.25, ()),
        TokenSampled(2, -1, "!", 0.0, ()),
    ]
    u = finished(events).usage
    assert u.completion_tokens == 3  # the tokens, not the 2 deltas


# --- tool calls ----------------------------------------------------------------------------------
CALC = {
    "type": "function",
    "function": {
        "name": "calc",
        "parameters": {
            "type": "object",
            "properties": {"x": {"type": "integer"}},
            "required": ["x"],
        },
    },
}
BARE = {"name": "bare"}  # a tool given as the bare function, no parameters


def call_delta(index=0, id=None, name=None, arguments=None, **extra) -> dict:
    part: dict = {"index": index, **extra}
    if id is not None:
        part["id"] = id
    function = {}
    if name is not None:
        function["name"] = name
    if arguments is not None:
        function["arguments"] = arguments
    if function:
        part["function"] = function
    return part


def test_a_streamed_call_becomes_its_events_and_runs(serve):
    server = serve(
        stream(
            chunk(tool_calls=[call_delta(0, "call_a", "calc", "")]),
            chunk(tool_calls=[call_delta(0, arguments='{"x"')]),
            chunk(tool_calls=[call_delta(0, arguments=": 2}")]),
            chunk("tool_calls"),
            DONE,
        )
    )
    events = chat(server, {"tools": [CALC, BARE]})
    assert [e for e in events if not isinstance(e, Finished)] == [
        ToolCallStarted("call_a", "calc"),
        ToolCallArgumentsDelta("call_a", '{"x"'),
        ToolCallArgumentsDelta("call_a", ": 2}"),
        ToolCallFinished("call_a", "calc", {"x": 2}),
    ]
    done = finished(events)
    assert done.finish_reason == FinishReason.TOOL_CALLS
    assert done.tool_calls == (ToolCall("call_a", "calc", {"x": 2}),)
    assert "tools" not in done.preset


def test_calls_after_a_stop_are_tool_calls_and_odd_shapes_are_read(serve):
    """No index (position), no id (call_N), arguments before the name, arguments as an object,
    a bare tool with empty arguments, two calls in one delta."""
    server = serve(
        stream(
            chunk(tool_calls=[{"function": {"arguments": '{"x": 1'}}]),
            chunk(tool_calls=[{"index": 0, "function": {"name": "calc", "arguments": "}"}}]),
            chunk(
                tool_calls=[
                    {"index": 1, "id": "", "function": {"name": "bare"}},
                    {"index": 2, "id": "c2", "function": {"name": "calc", "arguments": {"x": 5}}},
                ]
            ),
            chunk(tool_calls=[{"index": 2, "function": {"name": "other"}}]),  # a name is kept
            chunk("stop"),
            DONE,
        )
    )
    events = chat(server, {"tools": [CALC, BARE]})
    assert [e for e in events if not isinstance(e, Finished)] == [
        ToolCallStarted("call_0", "calc"),
        ToolCallArgumentsDelta("call_0", '{"x": 1}'),
        ToolCallStarted("call_1", "bare"),
        ToolCallStarted("c2", "calc"),
        ToolCallArgumentsDelta("c2", '{"x": 5}'),
        ToolCallFinished("call_0", "calc", {"x": 1}),
        ToolCallFinished("call_1", "bare", {}),
        ToolCallFinished("c2", "calc", {"x": 5}),
    ]
    done = finished(events)
    assert done.finish_reason == FinishReason.TOOL_CALLS
    assert [c.id for c in done.tool_calls] == ["call_0", "call_1", "c2"]


@pytest.mark.parametrize(
    "parts, problem",
    [
        ([call_delta(0, "c", "nope", "{}")], "no tool is named 'nope' (offered: calc, bare)"),
        ([call_delta(0, "c", arguments="{}")], "the server sent a call without a function name"),
        ([call_delta(0, "c", "calc", "{bad")], "the arguments are not JSON (Expecting property"),
        ([call_delta(0, "c", "calc", "[1]")], "the arguments are not a JSON object"),
        (
            [call_delta(0, "c", "calc", '{"x": "two"}')],
            "the arguments do not match calc's schema at x: 'two' is not of type 'integer'",
        ),
        (
            [call_delta(0, "c", "calc", "{}")],
            "the arguments do not match calc's schema at (the arguments): 'x' is a required "
            "property",
        ),
    ],
)
def test_a_call_that_cannot_run_is_malformed_and_named(serve, parts, problem):
    server = serve(stream(chunk(tool_calls=parts), chunk("tool_calls"), DONE))
    events = chat(server, {"tools": [CALC, BARE]})
    (bad,) = of(ToolCallMalformed, events)
    assert bad.id == "c" and bad.problem.startswith(problem)
    assert bad.text == parts[0]["function"].get("arguments", "")
    assert bad.name == parts[0]["function"].get("name", "")
    done = finished(events)
    assert done.tool_calls == () and done.finish_reason == FinishReason.STOP
    assert done.usage.server_finish_reason == "tool_calls"


def test_with_no_tools_offered_a_call_names_none(serve):
    server = serve(stream(chunk(tool_calls=[call_delta(0, "c", "calc", "{}")]), DONE))
    (bad,) = of(
        ToolCallMalformed, chat(server, {"tools": ["not a dict", {"function": {"name": 3}}]})
    )
    assert bad.problem == "no tool is named 'calc' (offered: none)"


def test_a_tool_whose_schema_is_broken_is_named(serve):
    broken = {"type": "function", "function": {"name": "b", "parameters": {"type": 12}}}
    server = serve(stream(chunk(tool_calls=[call_delta(0, "c", "b", "{}")]), DONE))
    (bad,) = of(ToolCallMalformed, chat(server, {"tools": [broken]}))
    assert bad.problem.startswith("b's schema cannot be checked (12 is not valid under any")


def test_a_call_cut_off_is_malformed_and_never_runs(serve):
    for ending in ((), (b'data: {"error": {"message": "x"}}\n\n', DONE)):
        server = serve(stream(chunk(tool_calls=[call_delta(0, "c", "calc", '{"x": 1}')]), *ending))
        events = chat(server, {"tools": [CALC]})
        (bad,) = of(ToolCallMalformed, events)
        assert bad.problem == "the reply ended before the call was complete"
        assert finished(events).tool_calls == ()


def test_a_cancelled_reply_or_a_bad_finish_never_runs_its_calls(serve):
    server = serve(
        stream(chunk(tool_calls=[call_delta(0, "c", "calc", '{"x": 1}')]), chunk("cancelled"), DONE)
    )
    done = finished(chat(server, {"tools": [CALC]}))
    assert done.finish_reason == FinishReason.ERROR


@pytest.mark.parametrize("choice", ["required", {"type": "function", "function": {"name": "calc"}}])
def test_a_server_that_answers_in_text_when_a_call_was_required_is_named(serve, choice):
    server = serve(stream(chunk(content="I will not."), chunk("stop"), DONE))
    events = chat(server, {"tools": [CALC], "tool_choice": choice})
    assert [e.message for e in of(StreamNotice, events)] == [
        f"{label(server)} answered in text although a tool call was required: this server (or "
        "its chat format for this model) does not support tools."
    ]


@pytest.mark.parametrize(
    "params, pieces",
    [
        ({"tools": [CALC], "tool_choice": "auto"}, (chunk(content="t"), DONE)),
        ({"tool_choice": "required"}, (chunk(content="t"), DONE)),  # no tools offered
        ({"tools": [CALC], "tool_choice": "required"}, (chunk(content="t"),)),  # no [DONE]
        (
            {"tools": [CALC], "tool_choice": "required"},
            (chunk(content="t"), b"data: {oops\n\n", DONE),
        ),
        (
            {"tools": [CALC], "tool_choice": "required"},
            (chunk(tool_calls=[call_delta(0, "c", "calc", '{"x": 1}')]), DONE),
        ),
    ],
)
def test_no_tools_notice_when_none_was_required_or_the_stream_failed(serve, params, pieces):
    server = serve(stream(*pieces))
    assert of(StreamNotice, chat(server, params)) == []


# --- failures only a transport can make on demand --------------------------------------------
class Failing:
    """An httpx transport that raises `exc` for every request."""

    def __init__(self, exc: Exception):
        self.exc = exc

    def handle_request(self, request):
        raise self.exc

    def close(self):
        pass


def failing_client(exc: Exception) -> OpenAIClient:

    transport = Failing(exc)
    assert isinstance(transport, object)
    return OpenAIClient(
        Connection("c1", "srv", "http://example.invalid:1/v1", 5.0),
        transport=transport,  # type: ignore[arg-type]
    )


def test_a_connect_timeout_names_the_connect_limit():
    import httpx

    with (
        failing_client(httpx.ConnectTimeout("slow")) as client,
        pytest.raises(RemoteTimeoutError) as caught,
    ):
        client.list_models()
    assert str(caught.value) == "srv (example.invalid:1) did not accept a connection within 10 s."


def test_another_transport_failure_before_the_stream_is_named():
    import httpx

    with failing_client(httpx.ReadError(f"reset {KEY}")) as client:
        client._key = KEY
        with pytest.raises(UnreachableHostError) as caught:
            list(client.chat("m1", QUESTION, {}, CancelToken()))
    assert str(caught.value) == "The connection to srv (example.invalid:1) failed: reset [API key]."
    with (
        failing_client(httpx.ReadError("")) as client,
        pytest.raises(UnreachableHostError) as caught,
    ):
        client.list_models()
    assert str(caught.value) == "The connection to srv (example.invalid:1) failed: ReadError."


def test_a_failure_after_stop_is_a_cancel_not_an_error():
    import httpx

    cancel = CancelToken()

    class CancelThenFail(Failing):
        def handle_request(self, request):
            cancel.cancel()
            raise self.exc

    client = OpenAIClient(
        Connection("c1", "srv", "http://example.invalid:1/v1", 5.0),
        transport=CancelThenFail(httpx.ReadError("closed")),  # type: ignore[arg-type]
    )
    with client:
        events = list(client.chat("m1", QUESTION, {}, cancel))
    assert finished(events).finish_reason == FinishReason.CANCELLED


def test_the_timeouts_come_from_the_connection():
    connection = Connection("c1", "srv", "http://127.0.0.1:1/v1", 42.0)
    with OpenAIClient(connection) as client:
        timeout = client._client.timeout
    assert (timeout.read, timeout.connect) == (42.0, 10.0)
    with OpenAIClient(Connection("c1", "srv", "http://127.0.0.1:1/v1", 3.0)) as client:
        assert client._client.timeout.connect == 3.0
        assert client._client.trust_env is False


def test_the_first_schema_problem_is_the_one_nearest_the_start(serve):
    """Two arguments wrong: the problem named is the first by path (a before b), whatever order
    the validator finds them in; a nested one is named by its whole path."""
    tool = {
        "type": "function",
        "function": {
            "name": "t",
            "parameters": {
                "type": "object",
                "properties": {
                    "b": {"type": "integer"},
                    "a": {"type": "object", "properties": {"c": {"type": "integer"}}},
                },
            },
        },
    }
    server = serve(
        stream(chunk(tool_calls=[call_delta(0, "c", "t", '{"b": "x", "a": {"c": "y"}}')]), DONE)
    )
    (bad,) = of(ToolCallMalformed, chat(server, {"tools": [tool]}))
    assert (
        bad.problem == "the arguments do not match t's schema at a/c: 'y' is not of type 'integer'"
    )


def test_a_reply_of_only_tool_calls_is_timed_and_counted_by_its_deltas(serve):
    server = serve(
        stream(
            chunk(tool_calls=[call_delta(0, "c", "calc", "")]),
            chunk(tool_calls=[call_delta(0, arguments='{"x": 1}')]),
            chunk(tool_calls=[call_delta(1, "d", "calc", '{"x": 2}')]),
            chunk("tool_calls"),
            DONE,
        )
    )
    u = finished(chat(server, {"tools": [CALC]})).usage
    assert u.completion_tokens == 3  # no usage chunk: one per delta
    assert u.ttft_ms > 0 and u.decode_ms > 0


def test_transport_errors_name_their_host(serve):
    import httpx

    with (
        failing_client(httpx.ConnectTimeout("slow")) as client,
        pytest.raises(RemoteTimeoutError) as caught,
    ):
        client.list_models()
    assert caught.value.host == "srv (example.invalid:1)"
    with (
        failing_client(httpx.ReadError("x")) as client,
        pytest.raises(UnreachableHostError) as caught,
    ):
        client.list_models()
    assert caught.value.host == "srv (example.invalid:1)"
    server = serve(Answer(hold_s=30))
    with client_for(server, timeout_s=0.3) as client, pytest.raises(RemoteTimeoutError) as caught:
        client.list_models()
    assert caught.value.host == label(server)
    url = server.base_url.replace("http://", "https://")
    with OpenAIClient(Connection("c1", "srv", url)) as client, pytest.raises(TlsError) as caught:
        client.list_models()
    assert caught.value.host == label(server)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    connection = Connection("c1", "srv", f"http://127.0.0.1:{port}/v1")
    with OpenAIClient(connection) as client, pytest.raises(UnreachableHostError) as caught:
        client.list_models()
    assert caught.value.host == f"srv (127.0.0.1:{port})"


def test_a_refused_logprobs_without_top_logprobs_and_an_error_body_that_is_not_utf8(serve):
    server = serve(
        json_answer(400, b"logprobs: bad \xff byte"),
        json_answer(400, b"\xfe\xff"),
    )
    with pytest.raises(RequestRejectedError) as caught:
        chat(server, {"logprobs": True})
    assert "logprobs" not in server.bodies()[1]
    assert str(caught.value) == f"{label(server)} refused the request (HTTP 400): \ufffd\ufffd"


def test_the_json_schema_notice_and_a_refused_field_are_both_said_in_order(serve):
    params = {"response_format": {"type": "json_schema", "json_schema": {}}, "seed": 3}
    server = serve(
        json_answer(400, {"error": {"message": "json_schema unsupported"}}),
        json_answer(400, {"error": {"message": "seed unsupported"}}),
        stream(chunk("stop"), DONE),
    )
    events = chat(server, params)
    assert [e.message for e in of(StreamNotice, events)] == [
        f"{label(server)} does not accept response_format json_schema; the schema was sent the "
        "way llama.cpp's servers take it (json_object with a schema).",
        f"{label(server)} does not accept the field 'seed'; it was left out of the request.",
    ]


def test_interrupt_after_a_request_is_harmless(serve):
    server = serve(stream(chunk(content="ok"), chunk("stop"), DONE))
    with client_for(server) as client:
        assert finished(list(client.chat("m1", QUESTION, {}, CancelToken()))).text == "ok"
        client.interrupt()  # the request's socket is gone: nothing to shut down
        assert finished(list(client.chat("m1", QUESTION, {}, CancelToken()))).text == "ok"


class StepClock:
    """time for the client: perf_counter() advances `step_s` on every call, so the reply's
    times are known exactly (the request starts at call 1, the n-th delta is call n+1)."""

    def __init__(self, step_s: float):
        self.step_s, self.now = step_s, 1000.0

    def perf_counter(self) -> float:
        self.now += self.step_s
        return self.now

    @staticmethod
    def time() -> float:
        return time.time()


def _usage_with(serve, monkeypatch, step_s: float, *pieces: bytes):
    import app.backends.openai_client as openai_client

    server = serve(stream(*pieces, DONE))
    monkeypatch.setattr(openai_client, "time", StepClock(step_s))
    return finished(chat(server)).usage


def usage_chunk(prompt: int, completion: int) -> bytes:
    return data(
        {"choices": [], "usage": {"prompt_tokens": prompt, "completion_tokens": completion}}
    )


def test_times_and_speeds_from_the_streams_own_clock(serve, monkeypatch):
    # request at t, deltas at t+0.25, t+0.5, t+0.75: first after 250 ms, the rest over 500 ms
    u = _usage_with(
        serve,
        monkeypatch,
        0.25,
        chunk(content="a"),
        chunk(content="b"),
        chunk(content="c"),
        usage_chunk(10, 3),
    )
    assert (u.ttft_ms, u.prefill_ms, u.decode_ms) == (250.0, 250.0, 500.0)
    assert (u.prompt_tok_s, u.decode_tok_s) == (40.0, 4.0)  # 10 / 0.25 s; (3 - 1) / 0.5 s


def test_speeds_from_two_tokens_and_a_sub_millisecond_first_token(serve, monkeypatch):
    u = _usage_with(
        serve, monkeypatch, 0.0005, chunk(content="a"), chunk(content="b"), usage_chunk(4, 0)
    )
    assert u.ttft_ms == pytest.approx(0.5)
    assert u.prompt_tok_s == pytest.approx(8000.0)  # 4 / 0.0005 s
    assert u.decode_tok_s == pytest.approx(2000.0)  # (2 - 1) / 0.0005 s


def test_no_speed_without_the_time_or_the_tokens_to_measure_it(serve, monkeypatch):
    # a prompt counted but no delta: no time to first token, so no prefill speed (no 0 division)
    u = _usage_with(serve, monkeypatch, 0.25, chunk("stop"), usage_chunk(12, 0))
    assert (u.prompt_tokens, u.ttft_ms, u.prompt_tok_s, u.decode_tok_s) == (12, 0.0, 0.0, 0.0)
    # many tokens said, one delta seen: no decode time, so no decode speed
    u = _usage_with(serve, monkeypatch, 0.25, chunk(content="abc"), usage_chunk(1, 5))
    assert (u.completion_tokens, u.decode_ms, u.decode_tok_s) == (5, 0.0, 0.0)
    # one token over a measured time: no speed from a single token
    u = _usage_with(
        serve, monkeypatch, 0.25, chunk(content="a"), chunk(content="b"), usage_chunk(1, 1)
    )
    assert (u.completion_tokens, u.decode_tok_s) == (1, 0.0)


def test_content_that_is_not_text_is_left_out(serve):
    server = serve(
        stream(
            chunk(content=123), chunk(content=["part"]), chunk(content="ok"), chunk("stop"), DONE
        )
    )
    events = chat(server)
    assert [e.text for e in of(TextDelta, events)] == ["ok"]
    done = finished(events)
    assert (done.text, done.finish_reason, done.error) == ("ok", FinishReason.STOP, None)


def test_text_held_back_as_a_possible_think_tag_is_delivered_when_the_stream_ends(serve):
    server = serve(stream(chunk(content="Hello <thi"), chunk("stop"), DONE))
    events = chat(server)
    assert "".join(e.text for e in of(TextDelta, events)) == "Hello <thi"
    assert of(TextDelta, events)[-1].text.endswith("<thi")
    assert finished(events).text == "Hello <thi"


def test_reasoning_that_is_not_text_is_left_out(serve):
    server = serve(
        stream(
            chunk(reasoning_content=5),
            chunk(reasoning=["x"]),
            chunk(content="ok"),
            chunk("stop"),
            DONE,
        )
    )
    done = finished(chat(server))
    assert (done.text, done.reasoning, done.error) == ("ok", "", None)


def test_a_last_chunk_without_its_blank_line_still_counts(serve):
    last = b'data: {"choices": [{"delta": {"content": "b"}}]}'  # the body ends here: no [DONE]
    server = serve(stream(chunk(content="a"), last))
    done = finished(chat(server))
    assert done.text == "ab"
    assert done.finish_reason == FinishReason.ERROR and "no [DONE]" in done.error
