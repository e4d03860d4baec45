"""The OpenAI-compatible client against a real server (llama-cpp-python serving SmolLM2 on
loopback) and, for faults a real server cannot make on demand, the fault proxy in front of it.

Golden data comes from the server itself through another route: the streamed reply must equal
the same server's non-streamed reply to the same greedy request (read with urllib, not our
client)."""

from __future__ import annotations

import json
import threading
import time
import urllib.request

import pytest

from app.backends.errors import (
    AuthError,
    RateLimitedError,
    RemoteTimeoutError,
    RequestRejectedError,
    TlsError,
    UnknownModelError,
    UnreachableHostError,
)
from app.backends.openai_client import Connection, OpenAIClient, _retry_after_s
from app.backends.remote import ConnectionBook, RemoteEngine, remote_model_path
from app.engine_bridge import StreamNotice
from engine.cancel import CancelToken
from engine.events import Finished, TextDelta, TokenSampled
from engine.types import FinishReason, GenerationRequest, JsonMode
from tests.fault_proxy import Fault, FaultProxy

GREEDY = {"temperature": 0.0, "max_tokens": 24}
QUESTION = [{"role": "user", "content": "Name three colors."}]
LONG = [{"role": "user", "content": "Write a long story about a dragon and a knight."}]


def _client(base_url: str, key: str | None = None, timeout_s: float = 60.0) -> OpenAIClient:
    return OpenAIClient(Connection("c1", "test", base_url, timeout_s), key)


def _run(client, messages, params, cancel=None, model="smollm2"):
    return list(client.chat(model, messages, params, cancel or CancelToken()))


def _finished(events) -> Finished:
    finals = [e for e in events if isinstance(e, Finished)]
    assert len(finals) == 1 and events[-1] is finals[0]
    return finals[0]


def _text(events) -> str:
    return "".join(e.text for e in events if isinstance(e, TextDelta))


def _non_streamed(server, messages, params) -> dict:
    body = json.dumps({"model": server.model, "messages": messages, **params}).encode()
    request = urllib.request.Request(
        f"{server.base_url}/chat/completions",
        body,
        {"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=120) as response:
        return json.loads(response.read())


@pytest.fixture
def proxy(openai_server):
    p = FaultProxy("127.0.0.1", openai_server.port).start()
    yield p
    p.stop()


def test_streamed_reply_equals_the_servers_own_reply_and_carries_usage(any_openai_server):
    server = any_openai_server
    with _client(server.base_url) as client:
        models = client.list_models()
        events = _run(client, QUESTION, GREEDY, model=server.model)
    assert server.model in [m.id for m in models]
    finished = _finished(events)
    golden = _non_streamed(server, QUESTION, GREEDY)
    assert _text(events) == golden["choices"][0]["message"]["content"] == finished.text
    assert len([e for e in events if isinstance(e, TextDelta)]) > 3  # really streamed
    assert finished.finish_reason == golden["choices"][0]["finish_reason"]
    assert finished.finish_reason in (FinishReason.STOP, FinishReason.LENGTH)
    u = finished.usage
    assert u.completion_tokens == golden["usage"]["completion_tokens"]
    assert u.measured_over_network and u.ttft_ms > 0 and u.decode_tok_s > 0
    if server is _localchat(server):
        # Ours answers stream_options.include_usage with the usage chunk: the prompt is counted
        # by the server, and the prefix cache's share is reported (the same question was asked
        # whole just now... or before: either way a number, never "unknown").
        assert u.prompt_tokens == golden["usage"]["prompt_tokens"] > 0
        assert isinstance(u.cached_tokens, int)
    else:
        # llama-cpp-python sends no usage chunk in a stream (include_usage is ignored): the
        # reply's tokens are counted from the stream (one delta per token there), the prompt is
        # unknown (0).
        assert u.prompt_tokens in (0, golden["usage"]["prompt_tokens"])


USAGE_CHUNK = (
    b'data: {"choices": [], "usage": {"prompt_tokens": 34, "completion_tokens": 11, '
    b'"total_tokens": 45, "prompt_tokens_details": {"cached_tokens": 30}}}\n\n'
)


def test_the_servers_usage_chunk_is_used(proxy):
    """The include_usage chunk as the OpenAI API documents it (numbers chosen here), added by
    the proxy because this server does not send one."""
    proxy.fault = Fault(before_done=USAGE_CHUNK)
    with _client(proxy.base_url) as client:
        u = _finished(_run(client, QUESTION, GREEDY)).usage
    assert (u.prompt_tokens, u.completion_tokens, u.cached_tokens) == (34, 11, 30)
    assert u.context_used == 45
    assert u.prompt_tok_s == pytest.approx(34 / (u.ttft_ms / 1000))


def _delta(**delta) -> bytes:
    chunk = {"choices": [{"index": 0, "delta": delta, "finish_reason": None}]}
    return b"data: " + json.dumps(chunk).encode() + b"\n\n"


def test_reasoning_from_reasoning_content_and_think_tags(proxy, openai_server):
    """Chunks as vLLM/DeepSeek (reasoning_content) and Qwen3 on llama.cpp (<think> split across
    chunks) send them, ahead of the real server's answer."""
    proxy.fault = Fault(
        after_head=_delta(reasoning_content="Colors first.")
        + _delta(content="<thi")
        + _delta(content="nk>\n\nhidden plan</th")
        + _delta(content="ink>\n\n")
    )
    with _client(proxy.base_url) as client:
        events = _run(client, QUESTION, GREEDY)
    finished = _finished(events)
    assert finished.reasoning == "Colors first.hidden plan"
    golden = _non_streamed(openai_server, QUESTION, GREEDY)["choices"][0]["message"]["content"]
    assert finished.text == _text(events) == golden


def test_a_value_the_server_refuses_comes_back_in_its_own_words(any_openai_server):
    server = any_openai_server
    with _client(server.base_url) as client, pytest.raises(RequestRejectedError) as caught:
        _run(client, QUESTION, {"max_tokens": "many"}, model=server.model)
    own_words = "an integer" if server is _localchat(server) else "valid integer"
    assert "max_tokens" in str(caught.value) and own_words in str(caught.value)


def test_logprobs_become_tokens_for_the_inspector(any_openai_server):
    server = any_openai_server
    with _client(server.base_url) as client:
        params = {**GREEDY, "logprobs": True, "top_logprobs": 3}
        events = _run(client, QUESTION, params, model=server.model)
    tokens = [e for e in events if isinstance(e, TokenSampled)]
    notices = [e for e in events if isinstance(e, StreamNotice)]
    if server is _localchat(server):
        assert not notices and tokens  # ours serves logprobs in streams
        assert all(len(t.top) == 3 for t in tokens)
    if notices:  # this server refused logprobs: the request went again without them
        assert "logprobs" in notices[0].message and not tokens
        return
    assert [t.index for t in tokens] == list(range(len(tokens)))
    assert "".join(t.text for t in tokens) == _finished(events).text
    assert all(t.logprob <= 0 for t in tokens)


def test_same_seed_same_reply_other_seed_other_reply(any_openai_server):
    sampled = {"temperature": 1.5, "max_tokens": 24}
    model = any_openai_server.model
    with _client(any_openai_server.base_url) as client:
        a = _finished(_run(client, QUESTION, {**sampled, "seed": 7}, model=model)).text
        b = _finished(_run(client, QUESTION, {**sampled, "seed": 7}, model=model)).text
        c = _finished(_run(client, QUESTION, {**sampled, "seed": 8}, model=model)).text
    assert a == b
    assert a != c


def test_json_schema_mode_reply_matches_the_schema(any_openai_server):
    schema = {
        "type": "object",
        "properties": {"color": {"type": "string"}, "count": {"type": "integer"}},
        "required": ["color", "count"],
    }
    server = any_openai_server
    engine = RemoteEngine(ConnectionBook([Connection("c1", "t", server.base_url)], _NoKeys()))
    handle = engine.load(
        remote_model_path("c1", server.model), n_ctx=0, n_threads=0, progress=_quiet
    )
    request = GenerationRequest(
        messages=({"role": "user", "content": "Give a color and a count as JSON."},),
        overrides={"do_sample": False, "max_new_tokens": 60},
        json_mode=JsonMode.SCHEMA,
        json_schema=schema,
    )
    try:
        events = list(engine.generate(handle, request, CancelToken()))
    finally:
        engine.unload(handle)
    finished = _finished(events)
    notices = [e.message for e in events if isinstance(e, StreamNotice)]
    if server is _localchat(server):
        assert notices == []  # ours takes the OpenAI json_schema form as it is
    else:
        # llama-cpp-python refuses the OpenAI json_schema form: the client sends its own form
        # once more and says so.
        assert any("json_object with a schema" in n for n in notices), notices
    assert not any("did not follow" in n for n in notices), notices
    value = json.loads(finished.text)
    assert isinstance(value["color"], str) and isinstance(value["count"], int)


def test_unknown_model_is_named(any_openai_server):
    engine = RemoteEngine(
        ConnectionBook([Connection("c1", "t", any_openai_server.base_url)], _NoKeys())
    )
    with pytest.raises(UnknownModelError, match="no-such-model"):
        engine.load(remote_model_path("c1", "no-such-model"), n_ctx=0, n_threads=0, progress=_quiet)


def test_wrong_key_is_refused_and_never_shown(openai_server_with_key):
    server = openai_server_with_key
    wrong = "sk-wrong-key-123456"
    with _client(server.base_url, wrong) as client:
        with pytest.raises(AuthError) as listed:
            client.list_models()
        with pytest.raises(AuthError) as chatted:
            _run(client, QUESTION, GREEDY)
    for exc in (listed.value, chatted.value):
        assert "API key" in str(exc) and wrong not in str(exc)
    with _client(server.base_url, server.api_key) as client:
        assert _finished(_run(client, QUESTION, GREEDY)).text


def test_stop_mid_stream_keeps_the_partial_reply_and_closes_the_servers_connection(
    proxy, openai_server
):
    cancel = CancelToken()
    events = []
    with _client(proxy.base_url) as client:
        for event in client.chat("smollm2", LONG, {"temperature": 0, "max_tokens": 400}, cancel):
            events.append(event)
            if len([e for e in events if isinstance(e, TextDelta)]) == 3:
                # Stop, as the GUI thread does it: the token, then the socket.
                threading.Thread(target=lambda: (cancel.cancel(), client.interrupt())).start()
    finished = _finished(events)
    assert finished.finish_reason == FinishReason.CANCELLED
    assert finished.text and finished.text == _text(events)
    assert proxy.client_left_mid_stream.wait(30)  # the server was still streaming
    assert proxy.upstream_closed.wait(30)  # and its connection was closed
    # and the server noticed and stopped generating (llama-cpp-python logs it)
    deadline = time.monotonic() + 60
    while "Disconnected from client" not in openai_server.log_path.read_text(errors="replace"):
        assert time.monotonic() < deadline, "the server never saw the client go"
        time.sleep(0.1)


def test_stop_before_the_first_byte_does_not_wait_for_it(proxy):
    proxy.fault = Fault(first_byte_delay_s=120)
    cancel = CancelToken()
    with _client(proxy.base_url) as client:
        timer = threading.Timer(0.5, lambda: (cancel.cancel(), client.interrupt()))
        timer.start()
        started = time.monotonic()
        events = _run(client, QUESTION, GREEDY, cancel)
        timer.join()
    assert _finished(events).finish_reason == FinishReason.CANCELLED
    assert time.monotonic() - started < 60  # far below the 120 s the first byte takes


def test_slow_first_byte_past_the_timeout_is_a_timeout(proxy):
    proxy.fault = Fault(first_byte_delay_s=5)
    with (
        _client(proxy.base_url, timeout_s=0.5) as client,
        pytest.raises(RemoteTimeoutError, match="within 0.5 s"),
    ):
        _run(client, QUESTION, GREEDY)


def test_stream_cut_after_n_bytes_keeps_the_partial_reply(proxy):
    proxy.fault = Fault(cut_after_bytes=900)
    with _client(proxy.base_url) as client:
        events = _run(client, QUESTION, GREEDY)
    finished = _finished(events)
    assert finished.finish_reason == FinishReason.ERROR
    assert "stopped before it was complete" in finished.error or "broke" in finished.error
    assert finished.text and finished.text == _text(events)


def test_stream_without_done_is_named_even_when_the_body_ends_cleanly(proxy):
    proxy.fault = Fault(drop_done=True)
    with _client(proxy.base_url) as client:
        events = _run(client, QUESTION, GREEDY)
    finished = _finished(events)
    assert finished.finish_reason == FinishReason.ERROR
    assert "no [DONE]" in finished.error
    assert finished.text and finished.text == _text(events)


def test_malformed_chunk_is_named_and_the_partial_reply_kept(proxy):
    proxy.fault = Fault(malformed_after_bytes=700)
    with _client(proxy.base_url) as client:
        events = _run(client, QUESTION, GREEDY)
    finished = _finished(events)
    assert finished.finish_reason == FinishReason.ERROR
    assert "not JSON" in finished.error
    assert finished.text and finished.text == _text(events)


def test_rate_limit_shows_retry_after(proxy):
    proxy.fault = Fault(status_429_retry_after="7")
    with (
        _client(proxy.base_url) as client,
        pytest.raises(RateLimitedError, match="Try again in 7 s") as caught,
    ):
        _run(client, QUESTION, GREEDY)
    assert caught.value.retry_after_s == 7
    assert "slow down" in str(caught.value)  # the server's own text


def test_server_killed_mid_stream(smollm2_path, tmp_path):
    from tests.llama_server import start_openai_server

    server = start_openai_server(smollm2_path, tmp_path)
    events = []
    try:
        with _client(server.base_url) as client:
            params = {"temperature": 0, "max_tokens": 400}
            for event in client.chat("smollm2", LONG, params, CancelToken()):
                events.append(event)
                if len(events) == 3:
                    server.process.kill()
    finally:
        server.stop()
    finished = _finished(events)
    assert finished.finish_reason == FinishReason.ERROR
    assert finished.text and finished.text == _text(events)
    assert "127.0.0.1" in finished.error


def test_unreachable_host_and_tls_mismatch_are_named(openai_server):
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        closed_port = s.getsockname()[1]
    with (
        _client(f"http://127.0.0.1:{closed_port}/v1") as client,
        pytest.raises(UnreachableHostError, match="Cannot reach"),
    ):
        client.list_models()
    with (
        _client(f"https://127.0.0.1:{openai_server.port}/v1") as client,
        pytest.raises(TlsError, match="secure connection"),
    ):
        client.list_models()


def test_stop_mid_stream_is_seen_by_our_server_as_a_cancelled_request(localchat_server):
    """Our server counts what happened to each request (/health): the Stop's closed socket must
    reach it as a cancelled request, and its KV reservation must be freed."""
    server = localchat_server
    before = server.health()["requests"]
    cancel = CancelToken()
    events = []
    with _client(server.base_url) as client:
        params = {"temperature": 0, "max_tokens": 400}
        for event in client.chat(server.model, LONG, params, cancel):
            events.append(event)
            if len([e for e in events if isinstance(e, TextDelta)]) == 3:
                threading.Thread(target=lambda: (cancel.cancel(), client.interrupt())).start()
    finished = _finished(events)
    assert finished.finish_reason == FinishReason.CANCELLED
    assert finished.text and finished.text == _text(events)
    deadline = time.monotonic() + 60
    while (health := server.health())["requests"]["cancelled"] == before["cancelled"]:
        assert time.monotonic() < deadline, f"our server never saw the client go: {health}"
        time.sleep(0.1)
    assert health["requests"]["completed"] == before["completed"]
    while (health := server.health())["kv_bytes_reserved"] != 0:
        assert time.monotonic() < deadline, f"the cancelled request kept its KV: {health}"
        time.sleep(0.1)


def test_our_server_with_a_key_refuses_a_wrong_one_and_dies_mid_stream(smollm2_path, tmp_path):
    """`python -m engine serve --api-key`: a wrong key is named without showing it, the right one
    chats, and the server killed mid-stream leaves the partial reply with a named error."""
    from tests.engine_server import start_server, stop_server

    key, wrong = "sk-ours-correct-key", "sk-ours-wrong-key-42"
    server = start_server(smollm2_path, tmp_path / "stderr.txt", "--api-key", key)
    events = []
    try:
        with _client(server.base_url, wrong) as client:
            with pytest.raises(AuthError) as listed:
                client.list_models()
            with pytest.raises(AuthError) as chatted:
                _run(client, QUESTION, GREEDY, model=server.model)
        for exc in (listed.value, chatted.value):
            assert "API key" in str(exc) and wrong not in str(exc) and key not in str(exc)
        with _client(server.base_url, key) as client:
            params = {"temperature": 0, "max_tokens": 400}
            for event in client.chat(server.model, LONG, params, CancelToken()):
                events.append(event)
                if len([e for e in events if isinstance(e, TextDelta)]) == 3:
                    server.process.kill()
    finally:
        stop_server(server.process)
    finished = _finished(events)
    assert finished.finish_reason == FinishReason.ERROR
    assert finished.text and finished.text == _text(events)
    assert "127.0.0.1" in finished.error


def _localchat(server):
    """`server` when it is our own (tests/engine_server.py), else None."""
    from tests.engine_server import Server

    return server if isinstance(server, Server) else None


def test_retry_after_as_http_date():
    when = time.strftime("%a, %d %b %Y %H:%M:%S GMT", time.gmtime(time.time() + 120))
    assert 110 <= _retry_after_s(when) <= 121
    assert _retry_after_s("3") == 3
    assert _retry_after_s("soon") is None


class _NoKeys:
    def get(self, _connection_id):
        return None


def _quiet(_stage, _fraction):
    pass


def test_our_server_stopped_mid_reply_is_no_clean_end(smollm2_path, tmp_path):
    """Issue 31, defect 2, end to end: `python -m engine serve` stopped normally (Ctrl-C) while it
    streams a reply ends that reply with finish_reason "cancelled" and a [DONE]. The client used
    to take any word it did not know for a normal stop, so the cut reply read "stop (end of
    turn)"; it must be an error that names the server's cancel, with the partial reply kept."""
    from tests.engine_server import start_server, stop_server

    server = start_server(smollm2_path, tmp_path / "stderr.txt", "--n-ctx", "2048")
    events: list = []
    codes: list = []
    stopper = threading.Thread(target=lambda: codes.append(stop_server(server.process)))
    try:
        with _client(server.base_url) as client:
            params = {"temperature": 0, "max_tokens": 1500}
            for event in client.chat(server.model, LONG, params, CancelToken()):
                events.append(event)
                if not stopper.ident and len(_text_deltas(events)) == 3:
                    stopper.start()  # SIGINT, as Ctrl-C in its terminal
    finally:
        if stopper.ident:
            stopper.join()
        else:
            codes.append(stop_server(server.process))
    assert codes == [0], server.log_path.read_text()
    finished = _finished(events)
    assert finished.usage.server_finish_reason == "cancelled"
    assert finished.finish_reason == FinishReason.ERROR
    assert "cut the reply short (finish_reason 'cancelled'" in finished.error
    assert finished.text and finished.text == _text(events)


def _text_deltas(events) -> list[TextDelta]:
    return [e for e in events if isinstance(e, TextDelta)]
