"""The HTTP server itself, without a model: a real uvicorn server on a loopback port (the same
RunningServer `python -m engine serve` runs), in front of a scripted scheduler whose requests
finish with the events a test chooses. Raw sockets and http.client, so nothing between the test
and the server adds or fixes a header.

What it covers: who may call (Host, Origin, Content-Type, CORS preflight), what a hostile or
broken client cannot do (hold connections open half-sent, open too many, send lone surrogates or
token ids outside the vocabulary, NaN), and what an accepted request that fails looks like
(HTTP 500 with the engine's message; in a stream, an error event before [DONE])."""

from __future__ import annotations

import contextlib
import http.client
import json
import socket
import threading
import time
from dataclasses import dataclass, field
from types import SimpleNamespace

import pytest

from engine.errors import ContextOverflowError, QueueFullError, SchedulerClosedError
from engine.events import Finished, TextDelta, Usage
from engine.generate import check_ceilings
from engine.server.app import LocalChatServer, ServerOptions
from engine.server.serve import RunningServer
from engine.types import FinishReason

MODEL = "tiny-model"
MODEL_PATH_ALIAS = "/home/someone/models/tiny-model.gguf"  # what the command line named
VOCAB = 100
WAIT_S = 30.0  # a deadline for the server to do what the test waits for, never a duration
CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}]}


def usage() -> Usage:
    return Usage(
        prompt_tokens=3,
        completion_tokens=2,
        cached_tokens=0,
        prefill_ms=1.0,
        decode_ms=1.0,
        ttft_ms=1.0,
        prompt_tok_s=1.0,
        decode_tok_s=1.0,
        context_used=5,
        context_limit=64,
    )


@dataclass
class Stats:
    running: int = 0
    queued: int = 0
    kv_bytes_reserved: int = 0
    kv_budget_bytes: int = 2**20


HOLD = object()  # in a reply: wait here until the request is cancelled, then end "cancelled"


class ScriptedTicket:
    def __init__(self, events, cancel, scheduler, queue_position=0):
        self.queue_position = queue_position
        self._events = events
        self._cancel = cancel
        self._scheduler = scheduler

    def events(self):
        for event in self._events:
            if event is HOLD:
                self._scheduler.holding.set()
                assert self._cancel._event.wait(WAIT_S), "the request was never cancelled"
                self._scheduler.saw_cancel.set()
                yield Finished(FinishReason.CANCELLED, usage(), text="")
                return
            yield event


@dataclass
class ScriptedScheduler:
    """submit() answers with `reply` (a list of events ending in Finished) or raises `refusal`."""

    lm: object
    reply: list = field(default_factory=list)
    refusal: Exception | None = None
    queue_position: int = 0
    submitted: list = field(default_factory=list)
    holding: threading.Event = field(default_factory=threading.Event)
    saw_cancel: threading.Event = field(default_factory=threading.Event)

    def submit(self, request, cancel):
        self.submitted.append(request)
        if self.refusal is not None:
            raise self.refusal
        max_new = request.overrides.get("max_new_tokens")
        if max_new and 10 + max_new > self.lm.n_ctx:
            # the engine's own check and message, for a prompt of 10 positions
            check_ceilings(self.lm, 10, max_new, 2**40)
        return ScriptedTicket(list(self.reply), cancel, self, self.queue_position)

    def stats(self):
        return Stats()


def tiny_lm():
    tokenizer = SimpleNamespace(
        vocab_size=VOCAB + 5,  # the embedding table is the smaller: VOCAB ids are usable
        piece_bytes=lambda token_id, special=True: b"x",
    )
    return SimpleNamespace(
        n_ctx=64,
        tokenizer=tokenizer,
        config=SimpleNamespace(n_vocab=VOCAB),
        kv_bytes_per_position=1,
    )


@dataclass
class Served:
    host: str
    port: int
    scheduler: ScriptedScheduler
    server: LocalChatServer


@contextlib.contextmanager
def serving(**options):
    lm = tiny_lm()
    scheduler = ScriptedScheduler(lm)
    scheduler.reply = [TextDelta("Hello"), Finished(FinishReason.STOP, usage(), text="Hello")]
    server = LocalChatServer(
        lm, scheduler, ServerOptions(model_id=MODEL, aliases=[MODEL_PATH_ALIAS], **options)
    )
    ready = threading.Event()
    running = RunningServer(server, "127.0.0.1", 0, on_ready=lambda url: ready.set())
    thread = threading.Thread(target=running.run, daemon=True)
    thread.start()
    try:
        assert ready.wait(WAIT_S), "the server did not start"
        yield Served("127.0.0.1", running.socket.getsockname()[1], scheduler, server)
    finally:
        running.stop()
        thread.join(WAIT_S)


@pytest.fixture(scope="module")
def served():
    with serving(allowed_hosts=["box.local"], allowed_origins=["http://localhost:3000"]) as s:
        yield s


@pytest.fixture(autouse=True)
def fresh_script(request):
    """Each test starts from the default reply (tests that use `served` may change it)."""
    if "served" in request.fixturenames:
        s = request.getfixturevalue("served")
        s.scheduler.reply = [TextDelta("Hello"), Finished(FinishReason.STOP, usage(), "Hello")]
        s.scheduler.refusal = None
        s.scheduler.queue_position = 0
        s.scheduler.submitted.clear()
        s.scheduler.holding.clear()
        s.scheduler.saw_cancel.clear()


def request(s: Served, method, path, body=None, headers=None, *, json_type=True):
    """-> (status, headers with lower-case names, parsed JSON or text)."""
    connection = http.client.HTTPConnection(s.host, s.port, timeout=WAIT_S)
    try:
        sent = dict(headers or {})
        if body is not None and not isinstance(body, bytes):
            body = json.dumps(body).encode()
        if body is not None and json_type:
            sent.setdefault("Content-Type", "application/json")
        connection.request(method, path, body=body, headers=sent)
        response = connection.getresponse()
        data = response.read()
        try:
            parsed = json.loads(data)
        except ValueError:
            parsed = data.decode("utf-8", "replace")
        return response.status, {k.lower(): v for k, v in response.getheaders()}, parsed
    finally:
        connection.close()


def raw_exchange(s: Served, data: bytes) -> bytes:
    """Send bytes as they are (a Host header of our choosing, or none) and read the answer
    until the server closes."""
    with socket.create_connection((s.host, s.port), timeout=WAIT_S) as sock:
        sock.sendall(data)
        return read_until_closed(sock)


def read_until_closed(sock: socket.socket) -> bytes:
    answer = b""
    while chunk := sock.recv(65536):
        answer += chunk
    return answer


def status_of(answer: bytes) -> int:
    return int(answer.split(b" ", 2)[1])


def body_of(answer: bytes) -> dict:
    return json.loads(answer.partition(b"\r\n\r\n")[2])


def post_with_host(host: bytes, body: dict = CHAT) -> bytes:
    data = json.dumps(body).encode()
    return (
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: " + host + b"\r\n"
        b"Content-Type: application/json\r\nConnection: close\r\n"
        b"Content-Length: " + str(len(data)).encode() + b"\r\n\r\n" + data
    )


# --- who may call ----------------------------------------------------------------------------------
def test_a_rebound_host_name_is_refused_before_anything_runs(served):
    for host in (b"attacker.example:8080", b"attacker.example", b"127.0.0.1.attacker.example"):
        answer = raw_exchange(served, post_with_host(host))
        assert status_of(answer) == 400, answer
        error = body_of(answer)["error"]
        assert error["code"] == "invalid_host" and "--allowed-host" in error["message"]
    # /health too: a rebound page must not read anything
    answer = raw_exchange(served, b"GET /health HTTP/1.1\r\nHost: evil.example\r\n\r\n")
    assert status_of(answer) == 400
    assert served.scheduler.submitted == []


def test_this_servers_own_names_and_an_allowed_host_are_accepted(served):
    port = str(served.port).encode()
    for host in (
        b"127.0.0.1:" + port,
        b"localhost:" + port,
        b"LOCALHOST",
        b"[::1]:" + port,
        b"box.local:" + port,  # --allowed-host box.local
    ):
        answer = raw_exchange(served, post_with_host(host))
        assert status_of(answer) == 200, (host, answer)
        assert body_of(answer)["choices"][0]["message"]["content"] == "Hello"


def test_a_request_without_a_host_header_is_refused(served):
    answer = raw_exchange(served, b"GET /health HTTP/1.0\r\n\r\n")
    assert status_of(answer) == 400 and body_of(answer)["error"]["code"] == "invalid_host"


def test_a_cross_origin_text_plain_post_is_refused_and_never_run(served):
    # what a page's fetch(url, {method: "POST", body}) sends: no preflight, text/plain
    headers = {"Origin": "http://evil.example", "Content-Type": "text/plain;charset=UTF-8"}
    status, _, body = request(served, "POST", "/v1/chat/completions", CHAT, headers)
    assert status == 403 and body["error"]["code"] == "origin_not_allowed"
    assert "--allowed-origin" in body["error"]["message"]
    assert served.scheduler.submitted == []
    status, _, _ = request(served, "GET", "/v1/models", headers={"Origin": "null"})
    assert status == 403  # a sandboxed page or a file:// page


def test_a_body_that_is_not_declared_json_is_refused_with_415(served):
    for content_type in ("text/plain", "application/x-www-form-urlencoded", None):
        headers = {"Content-Type": content_type} if content_type else {}
        status, _, body = request(
            served, "POST", "/v1/chat/completions", CHAT, headers, json_type=False
        )
        assert status == 415, (content_type, body)
        assert body["error"]["code"] == "unsupported_media_type"
        assert "application/json" in body["error"]["message"]
    assert served.scheduler.submitted == []
    headers = {"Content-Type": "Application/JSON; charset=utf-8"}
    status, _, _ = request(served, "POST", "/v1/chat/completions", CHAT, headers)
    assert status == 200


def test_an_allowed_origin_gets_cors_answers_and_its_preflight(served):
    origin = "http://localhost:3000"
    preflight = {
        "Origin": origin,
        "Access-Control-Request-Method": "POST",
        "Access-Control-Request-Headers": "authorization,content-type",
    }
    status, headers, _ = request(served, "OPTIONS", "/v1/chat/completions", headers=preflight)
    assert status == 200
    assert headers["access-control-allow-origin"] == origin
    assert "POST" in headers["access-control-allow-methods"]
    assert "content-type" in headers["access-control-allow-headers"].lower()
    status, headers, body = request(
        served, "POST", "/v1/chat/completions", CHAT, {"Origin": origin}
    )
    assert status == 200 and headers["access-control-allow-origin"] == origin
    assert body["choices"][0]["message"]["content"] == "Hello"
    refused = {**preflight, "Origin": "http://localhost:3001"}
    status, headers, _ = request(served, "OPTIONS", "/v1/chat/completions", headers=refused)
    assert status == 403 and "access-control-allow-origin" not in headers


def test_no_origin_is_allowed_unless_named_and_star_allows_every_page():
    with serving() as s:
        status, headers, _ = request(s, "GET", "/v1/models", headers={"Origin": "http://a.b"})
        assert status == 403 and "access-control-allow-origin" not in headers
    with serving(allowed_origins=["*"], allowed_hosts=["*"]) as s:
        status, headers, _ = request(s, "GET", "/v1/models", headers={"Origin": "http://a.b"})
        assert status == 200 and headers["access-control-allow-origin"] == "*"
        answer = raw_exchange(s, post_with_host(b"any.name.example"))
        assert status_of(answer) == 200


def test_refusals_are_counted_by_status_in_health(served):
    before = request(served, "GET", "/health")[2]["requests"]["refused"]
    raw_exchange(served, post_with_host(b"evil.example"))
    request(served, "GET", "/v1/models", headers={"Origin": "http://evil.example"})
    after = request(served, "GET", "/health")[2]["requests"]["refused"]
    assert after.get("400", 0) == before.get("400", 0) + 1
    assert after.get("403", 0) == before.get("403", 0) + 1


# --- what the server says back ---------------------------------------------------------------------
def test_an_unknown_model_is_named_without_the_models_path(served):
    status, _, body = request(served, "POST", "/v1/chat/completions", {**CHAT, "model": "gpt-4o"})
    assert status == 404 and body["error"]["code"] == "model_not_found"
    message = body["error"]["message"]
    assert "'gpt-4o'" in message and repr(MODEL) in message
    assert "/home" not in message and "someone" not in message
    # the path the command line named still works as a name for the model
    status, _, _ = request(
        served, "POST", "/v1/chat/completions", {**CHAT, "model": MODEL_PATH_ALIAS}
    )
    assert status == 200
    status, _, body = request(served, "GET", "/v1/models/gpt-4o")
    assert status == 404 and body["error"]["param"] == "model"
    status, _, body = request(served, "GET", f"/v1/models/{MODEL}")
    assert status == 200 and body["id"] == MODEL


def test_lone_surrogates_anywhere_are_a_400_naming_the_field(served):
    for raw_body, param in [
        (b'{"model": "tiny-model", "messages": [{"role": "user", "content": "a\\ud800b"}]}',
         "messages[0].content"),
        (b'{"model": "tiny-model", "messages": [{"role": "user", "content": "x"}],'
         b' "stop": ["\\udfff"]}', "stop[0]"),
        (b'{"model": "tiny-model", "messages": [{"role": "user", "content": "x"}],'
         b' "\\ud800": 1}', "body"),
        (b'{"model": "\\ud83d", "messages": []}', "model"),
    ]:  # fmt: skip
        status, _, body = request(served, "POST", "/v1/chat/completions", raw_body)
        assert status == 400, body
        assert body["error"]["param"] == param
        assert "surrogate" in body["error"]["message"]
    # a pair is a character, not a lone surrogate
    pair = b'{"model": "tiny-model", "messages": [{"role": "user", "content": "\\ud83d\\ude00"}]}'
    status, _, _ = request(served, "POST", "/v1/chat/completions", pair)
    assert status == 200
    assert served.scheduler.submitted[-1].messages[0]["content"] == "\U0001f600"


def test_token_ids_outside_the_vocabulary_are_a_400_naming_the_position(served):
    for prompt, param in [
        ([1, VOCAB], "prompt[1]"),
        ([-1], "prompt[0]"),
        ([[5, 10**30]], "prompt[1]"),
    ]:
        body = {"model": MODEL, "prompt": prompt}
        status, _, answer = request(served, "POST", "/v1/completions", body)
        assert status == 400, answer
        assert answer["error"]["param"] == param
        assert f"[0, {VOCAB - 1}]" in answer["error"]["message"]
    status, _, _ = request(
        served, "POST", "/v1/completions", {"model": MODEL, "prompt": [0, VOCAB - 1]}
    )
    assert status == 200
    assert served.scheduler.submitted[-1].prompt_ids == [0, VOCAB - 1]


def test_nan_and_infinity_are_not_json(served):
    for constant in (b"NaN", b"Infinity", b"-Infinity"):
        raw_body = b'{"model": "tiny-model", "messages": [], "temperature": ' + constant + b"}"
        status, _, body = request(served, "POST", "/v1/chat/completions", raw_body)
        assert status == 400 and body["error"]["code"] == "invalid_json", body


def test_a_context_overflow_names_max_tokens_as_the_client_sent_it(served):
    status, _, body = request(served, "POST", "/v1/chat/completions", {**CHAT, "max_tokens": 100})
    assert status == 400 and body["error"]["code"] == "context_length_exceeded"
    message = body["error"]["message"]
    assert "max_tokens (100)" in message and "max_new_tokens" not in message
    assert "64 positions" in message


def test_an_engine_failure_on_an_accepted_request_is_a_500_with_the_engines_message(served):
    served.scheduler.reply = [
        TextDelta("Hel"),
        Finished(FinishReason.ERROR, usage(), text="Hel", error="ModelOutputError: NaN logits"),
    ]
    before = request(served, "GET", "/health")[2]["requests"]
    status, _, body = request(served, "POST", "/v1/chat/completions", CHAT)
    assert status == 500, body
    assert body["error"] == {
        "message": "ModelOutputError: NaN logits",
        "type": "server_error",
        "param": None,
        "code": None,
    }
    after = request(served, "GET", "/health")[2]["requests"]
    assert after["failed"] == before["failed"] + 1
    assert after["completed"] == before["completed"]


def test_an_engine_failure_in_a_stream_sends_an_error_event_then_done(served):
    served.scheduler.reply = [
        TextDelta("Hel"),
        Finished(FinishReason.ERROR, usage(), text="Hel", error="the model broke"),
    ]
    status, headers, text = request(
        served, "POST", "/v1/chat/completions", {**CHAT, "stream": True}
    )
    assert status == 200 and headers["content-type"].startswith("text/event-stream")
    events = [line.removeprefix("data: ") for line in text.split("\n\n") if line]
    assert events[-1] == "[DONE]"
    payloads = [json.loads(e) for e in events[:-1]]
    assert payloads[-1] == {
        "error": {"message": "the model broke", "type": "server_error", "param": None, "code": None}
    }
    contents = [p["choices"][0]["delta"].get("content") for p in payloads[:-1]]
    assert "Hel" in contents
    # no finish chunk: the error event ends the choice
    assert all(p["choices"][0]["finish_reason"] is None for p in payloads[:-1])


def test_a_scheduler_that_breaks_its_contract_is_a_500_not_a_hang(served):
    served.scheduler.reply = [TextDelta("no final event")]
    before = request(served, "GET", "/health")[2]["requests"]["failed"]
    status, _, body = request(served, "POST", "/v1/chat/completions", CHAT)
    assert status == 500, body
    assert body["error"]["type"] == "server_error"
    assert body["error"]["message"] == "the request ended without a final event"
    status, _, text = request(served, "POST", "/v1/chat/completions", {**CHAT, "stream": True})
    events = [line.removeprefix("data: ") for line in text.split("\n\n") if line]
    assert status == 200 and events[-1] == "[DONE]"
    assert json.loads(events[-2])["error"]["message"] == "the request ended without a final event"
    assert request(served, "GET", "/health")[2]["requests"]["failed"] == before + 2


@pytest.mark.parametrize(
    ("refusal", "status", "code"),
    [
        (QueueFullError(100, 10, 8, 4), 429, "queue_full"),
        (SchedulerClosedError("closed"), 503, "shutting_down"),
        (ContextOverflowError("The prompt takes 70 positions"), 400, "context_length_exceeded"),
    ],
)
def test_scheduler_refusals_map_to_statuses(served, refusal, status, code):
    served.scheduler.refusal = refusal
    got, _, body = request(served, "POST", "/v1/chat/completions", CHAT)
    assert (got, body["error"]["code"]) == (status, code)


def test_a_queued_request_is_told_its_place(served):
    served.scheduler.queue_position = 3
    status, headers, _ = request(served, "POST", "/v1/chat/completions", CHAT)
    assert status == 200 and headers["x-queue-position"] == "3"
    served.scheduler.queue_position = 0
    status, headers, _ = request(served, "POST", "/v1/chat/completions", CHAT)
    assert status == 200 and "x-queue-position" not in headers


def test_body_limits(served):
    # Headers only: a body the server never reads (it cannot, without a length) would still sit in
    # its socket when it closes, and that close resets the connection before the 400 is read.
    with socket.create_connection((served.host, served.port), timeout=WAIT_S) as sock:
        sock.sendall(
            b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
            b"Content-Type: application/json\r\nContent-Length: abc\r\n\r\n"
        )
        answer = read_until_closed(sock)
    assert status_of(answer) == 400, answer
    huge = {"Content-Length": str(2**20 + 1)}
    connection = http.client.HTTPConnection(served.host, served.port, timeout=WAIT_S)
    try:
        connection.putrequest("POST", "/v1/chat/completions")
        connection.putheader("Content-Type", "application/json")
        connection.putheader("Content-Length", huge["Content-Length"])
        connection.endheaders()
        response = connection.getresponse()
        assert response.status == 413 and response.getheader("Connection") == "close"
    finally:
        connection.close()


# --- connections -----------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def impatient():
    """A server with a short request deadline and room for three connections."""
    with serving(request_timeout_s=0.5, max_connections=3) as s:
        yield s


def test_half_sent_headers_get_a_408_and_the_connection_closed(impatient):
    with socket.create_connection((impatient.host, impatient.port), timeout=WAIT_S) as sock:
        sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-")
        answer = read_until_closed(sock)
    assert status_of(answer) == 408, answer
    assert body_of(answer)["error"]["code"] == "request_timeout"


def test_a_half_sent_body_gets_a_408_and_the_connection_closed(impatient):
    with socket.create_connection((impatient.host, impatient.port), timeout=WAIT_S) as sock:
        sock.sendall(
            b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
            b'Content-Type: application/json\r\nContent-Length: 100\r\n\r\n{"model": '
        )
        answer = read_until_closed(sock)
    assert status_of(answer) == 408, answer
    assert body_of(answer)["error"]["code"] == "request_timeout"
    assert impatient.scheduler.submitted == []


def test_a_connection_that_sends_nothing_is_closed(impatient):
    with socket.create_connection((impatient.host, impatient.port), timeout=WAIT_S) as sock:
        assert read_until_closed(sock) == b""


def test_connections_beyond_the_limit_get_a_503_at_once():
    with serving(max_connections=2, request_timeout_s=WAIT_S * 4) as s:
        held = [socket.create_connection((s.host, s.port), timeout=WAIT_S) for _ in range(2)]
        try:
            # the two are open (idle); a third is answered and closed without sending anything
            with socket.create_connection((s.host, s.port), timeout=WAIT_S) as third:
                answer = read_until_closed(third)
            assert status_of(answer) == 503, answer
            assert body_of(answer)["error"]["code"] == "too_many_connections"
        finally:
            for sock in held:
                sock.close()
        # once they are closed there is room again (the server notices the close first)
        deadline = time.monotonic() + WAIT_S
        status = None
        while status != 200 and time.monotonic() < deadline:
            with contextlib.suppress(OSError, http.client.HTTPException):
                status = request(s, "GET", "/health")[0]
        assert status == 200


def test_a_kept_alive_connection_gets_a_fresh_deadline_for_each_request(impatient):
    with socket.create_connection((impatient.host, impatient.port), timeout=WAIT_S) as sock:
        sock.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        first = b""
        while b"}" not in first:  # the whole small JSON answer
            first += sock.recv(65536)
        assert status_of(first) == 200
        sock.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Half")
        answer = read_until_closed(sock)
    assert status_of(answer) == 408, answer


# --- the policy itself -----------------------------------------------------------------------------
def test_host_names_are_compared_without_port_case_brackets_or_trailing_dot():
    from engine.server.access import host_name

    assert host_name("LocalHost:8080") == "localhost"
    assert host_name("localhost.") == "localhost"
    assert host_name("[::1]:8080") == "::1" and host_name("[::1]") == "::1"
    assert host_name("::1") == "::1"  # unbracketed IPv6 (no port possible)
    assert host_name(" 127.0.0.1 ") == "127.0.0.1"
    assert host_name("[::1]x") == "[::1]x"  # malformed: matches nothing allowed
    assert host_name("[::1") == "[::1"


def test_the_policy_for_each_kind_of_bound_address():
    from engine.server.access import AccessPolicy

    def allowed(policy, host):
        return policy.check([host], []) is None

    loopback = AccessPolicy.build("127.0.0.1")
    assert all(allowed(loopback, h) for h in ("127.0.0.1:1", "localhost", "[::1]:1"))
    assert not allowed(loopback, "192.168.1.4:8080")  # an address, but not this server's
    assert not allowed(loopback, "127.0.0.2")
    named = AccessPolicy.build("192.168.1.4", ["Box.Local."])
    assert allowed(named, "192.168.1.4:8080") and allowed(named, "box.local:8080")
    assert not allowed(named, "10.0.0.1") and not allowed(named, "other.local")
    wildcard = AccessPolicy.build("0.0.0.0")
    assert allowed(wildcard, "10.0.0.7:8080") and allowed(wildcard, "[fe80::1]:8080")
    assert not allowed(wildcard, "attacker.example") and not allowed(wildcard, "0.0.0.0.nip.io")
    assert AccessPolicy.build("::").any_ip and not loopback.any_ip
    assert loopback.check([], []).code == "invalid_host"
    assert loopback.check(["localhost", "localhost"], []).code == "invalid_host"
    origins = AccessPolicy.build("127.0.0.1", allowed_origins=["HTTP://Localhost:3000/"])
    assert origins.check(["localhost"], ["http://localhost:3000"]) is None
    refusal = origins.check(["localhost"], ["http://localhost:3000", "http://evil.example"])
    assert (refusal.status, refusal.code) == (403, "origin_not_allowed")


# --- keys, routes, disconnects ---------------------------------------------------------------------
def test_the_api_key_and_how_it_may_be_sent():
    with serving(api_key="s3cret") as s:
        status, headers, body = request(s, "POST", "/v1/chat/completions", CHAT)
        assert status == 401 and headers["www-authenticate"] == "Bearer"
        assert body["error"]["message"] == "Missing API key: send it as 'Authorization: Bearer KEY'"
        assert body["error"]["code"] == "invalid_api_key"
        for header in ("Bearer wrong", "Basic s3cret", "s3cret", "Bearer s3cret2"):
            status, _, body = request(s, "GET", "/v1/models", headers={"Authorization": header})
            assert status == 401, header
            assert body["error"]["message"] == "Incorrect API key provided"
        for header in ("Bearer s3cret", "bearer s3cret", "Bearer  s3cret "):
            status, _, body = request(s, "GET", "/v1/models", headers={"Authorization": header})
            assert status == 200, header
        assert request(s, "GET", "/health")[0] == 200  # no key needed
        assert request(s, "GET", f"/v1/models/{MODEL}")[0] == 401


def test_models_health_and_unknown_routes(served):
    status, _, body = request(served, "GET", "/v1/models")
    assert status == 200 and body["object"] == "list"
    (model,) = body["data"]
    assert {k: v for k, v in model.items() if k != "created"} == {
        "id": MODEL,
        "object": "model",
        "owned_by": "localchat",
        "context_length": 64,
    }
    health = request(served, "GET", "/health")[2]
    assert health["status"] == "ok" and health["model"] == MODEL
    assert health["kv_budget_bytes"] == 2**20 and health["running"] == 0
    status, _, body = request(served, "GET", "/v1/nothing-here")
    assert status == 404 and body["error"]["code"] == "http_404"
    status, _, body = request(served, "GET", "/v1/chat/completions")
    assert status == 405 and body["error"]["code"] == "http_405"


def test_an_unexpected_exception_is_a_500_naming_it(served):
    served.scheduler.refusal = RuntimeError("boom")
    status, _, body = request(served, "POST", "/v1/chat/completions", CHAT)
    assert status == 500
    assert body["error"] == {
        "message": "RuntimeError: boom",
        "type": "server_error",
        "param": None,
        "code": None,
    }


def _send_and_wait_until_running(s: Served, body: dict) -> socket.socket:
    data = json.dumps(body).encode()
    sock = socket.create_connection((s.host, s.port), timeout=WAIT_S)
    sock.sendall(
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        b"Content-Type: application/json\r\nContent-Length: "
        + str(len(data)).encode()
        + b"\r\n\r\n"
        + data
    )
    assert s.scheduler.holding.wait(WAIT_S), "the request never started"
    return sock


def _wait_for_count(s: Served, outcome: str, expected: int) -> None:
    deadline = time.monotonic() + WAIT_S
    while request(s, "GET", "/health")[2]["requests"][outcome] != expected:
        assert time.monotonic() < deadline, f"{outcome} never reached {expected}"


@pytest.mark.parametrize("stream", [False, True])
def test_a_client_that_leaves_cancels_its_request(served, stream):
    served.scheduler.reply = [TextDelta("partial"), HOLD]
    before = request(served, "GET", "/health")[2]["requests"]["cancelled"]
    sock = _send_and_wait_until_running(served, {**CHAT, "stream": stream})
    sock.close()
    assert served.scheduler.saw_cancel.wait(WAIT_S), "leaving did not cancel the request"
    _wait_for_count(served, "cancelled", before + 1)
    assert request(served, "GET", "/health")[2]["requests"]["in_flight"] == 0


def test_cancel_all_ends_a_running_request_as_cancelled(served):
    served.scheduler.reply = [TextDelta("partial"), HOLD]
    with _send_and_wait_until_running(served, CHAT) as sock:
        assert served.server.in_flight() == 1
        served.server.cancel_all()
        answer = read_until_closed_or_whole(sock)
    assert status_of(answer) == 200
    assert body_of(answer)["choices"][0]["finish_reason"] == "cancelled"
    assert served.server.in_flight() == 0


def read_until_closed_or_whole(sock: socket.socket) -> bytes:
    """A kept-alive response: read its head, then Content-Length bytes of body."""
    answer = b""
    while b"\r\n\r\n" not in answer:
        answer += sock.recv(65536)
    head, _, body = answer.partition(b"\r\n\r\n")
    length = int(
        next(
            line.split(b":", 1)[1]
            for line in head.split(b"\r\n")
            if line.lower().startswith(b"content-length")
        )
    )
    while len(body) < length:
        body += sock.recv(65536)
    return head + b"\r\n\r\n" + body
