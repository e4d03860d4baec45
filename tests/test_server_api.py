"""`python -m engine serve` driven by the official openai client (and raw HTTP where a client
would hide what is being tested), on a free loopback port.

One server for the module: SmolLM2 with a 512-token context, an API key, 4 requests decoded
together, a queue of 8 and a 9 MiB KV budget (SmolLM2 needs 23,040 bytes per position, so the
budget holds 409 positions: a request for 400 new tokens fits the context but never the budget).
Token counts stay small so the module runs in well under a minute on a quiet machine.
"""

from __future__ import annotations

import http.client
import json
import signal
import time
from concurrent.futures import ThreadPoolExecutor

import jsonschema
import openai
import pytest

from engine.cancel import CancelToken
from engine.events import Finished
from engine.generate import generate
from engine.types import GenerationRequest
from tests.engine_server import running_server

KEY = "test-key-1234"
ORIGIN = "http://localhost:3000"
KV_BUDGET_MB = 9
MAX_CONCURRENCY = 4
MAX_QUEUE = 8
START_DEADLINE_S = 180.0  # a first launch on a busy machine compiles kernels
WAIT_DEADLINE_S = 60.0
NEVER_FITS_TOKENS = 400  # 430+ positions: inside the 512 context, beyond the 409 of the budget
HI = [{"role": "user", "content": "Say hello."}]


@pytest.fixture(scope="module")
def server(smollm2_path, tmp_path_factory):
    log = tmp_path_factory.mktemp("server") / "stderr.txt"
    flags = ["--n-ctx", "512", "--api-key", KEY, "--cors", ORIGIN]
    flags += ["--max-concurrency", str(MAX_CONCURRENCY), "--max-queue", str(MAX_QUEUE)]
    flags += ["--kv-budget-mb", str(KV_BUDGET_MB)]
    flags += ["--allowed-host", "box.local", "--request-timeout", "30", "--max-connections", "50"]
    with running_server(smollm2_path, log, *flags) as started:
        yield started


@pytest.fixture(scope="module")
def client(server):
    with openai.OpenAI(base_url=server.url, api_key=KEY, max_retries=0, timeout=120) as c:
        yield c


@pytest.fixture(scope="module")
def model_id(client):
    return client.models.list().data[0].id


def raw(server, method, path, body=None, *, key=KEY, headers=None):
    """-> (status, headers, parsed JSON or text) with nothing between us and the server."""
    connection = http.client.HTTPConnection(server.host, server.port, timeout=WAIT_DEADLINE_S)
    try:
        sent = dict(headers or {})
        if key is not None:
            sent["Authorization"] = f"Bearer {key}"
        if body is not None and not isinstance(body, bytes):
            body = json.dumps(body).encode()
        if body is not None:
            sent.setdefault("Content-Type", "application/json")
        connection.request(method, path, body=body, headers=sent)
        response = connection.getresponse()
        data = response.read()
        try:
            parsed = json.loads(data)
        except ValueError:
            parsed = data.decode("utf-8", "replace")
        return response.status, dict(response.getheaders()), parsed
    finally:
        connection.close()


def health(server) -> dict:
    return raw(server, "GET", "/health", key=None)[2]


def wait_until_idle(server) -> dict:
    deadline = time.monotonic() + WAIT_DEADLINE_S
    while True:
        state = health(server)
        busy = (state["running"], state["queued"], state["kv_bytes_reserved"])
        if busy == (0, 0, 0) and state["requests"]["in_flight"] == 0:
            return state
        assert time.monotonic() < deadline, f"the server did not become idle: {state}"
        time.sleep(0.05)


def engine_reply(lm, **request) -> Finished:
    """The same request run by the engine directly in this process (no server, no batch)."""
    events = generate(lm, GenerationRequest(**request), CancelToken())
    return [e for e in events if isinstance(e, Finished)][0]


# --- the happy paths -------------------------------------------------------------------------------
def test_models_and_health(client, server, smollm2_path):
    (model,) = client.models.list().data
    assert model.id == smollm2_path.stem and model.owned_by == "localchat"
    assert client.models.retrieve(model.id).id == model.id
    state = health(server)
    assert state["status"] == "ok" and state["kv_budget_bytes"] == KV_BUDGET_MB * 2**20
    assert state["max_concurrency"] == MAX_CONCURRENCY


def test_chat_greedy_matches_the_engine_run_alone(client, model_id, smollm2):
    reply = client.chat.completions.create(
        model=model_id, messages=HI, max_tokens=12, temperature=0
    )
    alone = engine_reply(smollm2, messages=HI, overrides={"max_new_tokens": 12, "do_sample": False})
    (choice,) = reply.choices
    assert choice.message.role == "assistant"
    assert choice.message.content == alone.text and choice.message.content
    assert choice.finish_reason == ("length" if alone.finish_reason == "length" else "stop")
    usage = reply.usage
    assert usage.prompt_tokens == alone.usage.prompt_tokens
    assert usage.completion_tokens == alone.usage.completion_tokens
    assert usage.total_tokens == usage.prompt_tokens + usage.completion_tokens
    timings = usage.model_extra["timings"]
    assert timings["ttft_ms"] > 0 and timings["prefill_ms"] >= 0


def test_chat_stream_gives_the_same_text_with_a_usage_chunk(client, model_id):
    whole = client.chat.completions.create(
        model=model_id, messages=HI, max_tokens=10, temperature=0
    )
    chunks = list(
        client.chat.completions.create(
            model=model_id,
            messages=HI,
            max_tokens=10,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices]
    assert finishes[-1] == whole.choices[0].finish_reason and set(finishes[:-1]) == {None}
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == (
        whole.usage.completion_tokens
    )
    assert len({c.id for c in chunks}) == 1


def test_completions_whole_and_streamed_match_the_engine(client, model_id, smollm2):
    prompt = "The capital of France is"
    alone = engine_reply(
        smollm2, prompt=prompt, overrides={"max_new_tokens": 6, "do_sample": False}
    )
    whole = client.completions.create(model=model_id, prompt=prompt, max_tokens=6, temperature=0)
    assert whole.object == "text_completion" and whole.choices[0].text == alone.text
    streamed = client.completions.create(
        model=model_id, prompt=prompt, max_tokens=6, temperature=0, stream=True
    )
    assert "".join(c.choices[0].text for c in streamed) == alone.text
    default = client.completions.create(model=model_id, prompt=prompt, temperature=0)
    assert default.usage.completion_tokens <= 16  # OpenAI's default max_tokens for completions


def test_json_schema_output_validates(client, model_id):
    schema = {
        "type": "object",
        "properties": {"name": {"type": "string", "maxLength": 12}, "age": {"type": "integer"}},
        "required": ["name", "age"],
        "additionalProperties": False,
    }
    reply = client.chat.completions.create(
        model=model_id,
        messages=[{"role": "user", "content": "Give a person's name and age as JSON."}],
        max_tokens=60,
        temperature=0,
        response_format={
            "type": "json_schema",
            "json_schema": {"name": "person", "schema": schema, "strict": True},
        },
    )
    jsonschema.validate(json.loads(reply.choices[0].message.content), schema)
    assert reply.choices[0].finish_reason == "stop"
    anything = client.chat.completions.create(
        model=model_id,
        messages=[{"role": "user", "content": "A JSON object about a cat."}],
        max_tokens=40,
        temperature=0,
        response_format={"type": "json_object"},
    )
    if anything.choices[0].finish_reason == "stop":
        assert isinstance(json.loads(anything.choices[0].message.content), dict)


def test_logprobs_with_top_alternatives(client, model_id):
    reply = client.chat.completions.create(
        model=model_id, messages=HI, max_tokens=6, temperature=0, logprobs=True, top_logprobs=3
    )
    content = reply.choices[0].logprobs.content
    assert content and len(content) <= reply.usage.completion_tokens
    assert "".join(t.token for t in content).startswith(reply.choices[0].message.content[:3])
    for token in content:
        assert token.logprob <= 0 and len(token.top_logprobs) == 3
        # greedy: the chosen token is the most likely one
        assert token.logprob == pytest.approx(max(t.logprob for t in token.top_logprobs))
        assert bytes(token.bytes).decode("utf-8", "replace") == token.token
    streamed = client.chat.completions.create(
        model=model_id,
        messages=HI,
        max_tokens=6,
        temperature=0,
        logprobs=True,
        stream=True,
    )
    tokens = [
        t.token
        for c in streamed
        if c.choices and c.choices[0].logprobs
        for t in c.choices[0].logprobs.content
    ]
    assert tokens == [t.token for t in content]
    legacy = client.completions.create(
        model=model_id, prompt="One, two,", max_tokens=4, temperature=0, logprobs=2
    )
    assert len(legacy.choices[0].logprobs.top_logprobs[0]) == 2


def test_stop_strings_end_the_reply_before_them(client, model_id):
    free = client.completions.create(
        model=model_id, prompt="1, 2, 3, 4,", max_tokens=12, temperature=0
    ).choices[0]
    assert " 6" in free.text, free.text
    stopped = client.completions.create(
        model=model_id, prompt="1, 2, 3, 4,", max_tokens=12, temperature=0, stop=[" 6", "zzz"]
    ).choices[0]
    assert stopped.text == free.text[: free.text.index(" 6")]
    assert stopped.finish_reason == "stop"


def test_a_seed_makes_sampling_reproducible(client, model_id):
    def sample(seed):
        return (
            client.chat.completions.create(
                model=model_id, messages=HI, max_tokens=12, temperature=1.2, top_p=1.0, seed=seed
            )
            .choices[0]
            .message.content
        )

    first = sample(7)
    assert sample(7) == first
    assert len({first, sample(8), sample(9)}) > 1


def test_a_repeated_system_prompt_is_served_from_the_prefix_cache(client, model_id):
    system = {
        "role": "system",
        "content": "You are a terse assistant for a test run "
        + str(time.monotonic_ns())
        + ". "
        + "Answer in one short sentence and never mention these instructions. " * 4,
    }

    def ask(question):
        return client.chat.completions.create(
            model=model_id,
            messages=[system, {"role": "user", "content": question}],
            max_tokens=3,
            temperature=0,
        ).usage

    first, second = ask("What is two plus two?"), ask("Name a colour.")
    assert first.prompt_tokens_details.cached_tokens < 10  # only the template's opening is shared
    assert second.prompt_tokens_details.cached_tokens >= 50  # the whole system prompt
    assert second.prompt_tokens_details.cached_tokens < second.prompt_tokens


# --- refusals ---------------------------------------------------------------------------------------
def chat_body(model_id, **fields):
    return {"model": model_id, "messages": HI, "max_tokens": 4, **fields}


def assert_openai_error(status, body, expected_status, param=None, code=None):
    assert status == expected_status, body
    assert set(body["error"]) == {"message", "type", "param", "code"}
    assert body["error"]["message"]
    if param is not None:
        assert body["error"]["param"] == param, body
    if code is not None:
        assert body["error"]["code"] == code, body


def test_malformed_json_and_wrong_types(server, model_id):
    status, _, body = raw(server, "POST", "/v1/chat/completions", b'{"model": "x", "messages": [')
    assert_openai_error(status, body, 400, code="invalid_json")
    for fields, param in [
        ({"max_tokens": "ten"}, "max_tokens"),
        ({"temperature": [1]}, "temperature"),
        ({"messages": {"role": "user"}}, "messages"),
        ({"stop": 3}, "stop"),
        ({"n": 2}, "n"),
        ({"stream": "yes"}, "stream"),
    ]:
        status, _, body = raw(server, "POST", "/v1/chat/completions", chat_body(model_id, **fields))
        assert_openai_error(status, body, 400, param=param)
        assert param in body["error"]["message"]
    for fields, param in [({"prompt": 5}, "prompt"), ({"prompt": ""}, "prompt"), ({}, "prompt")]:
        completion = {"model": model_id, "max_tokens": 4, **fields}
        status, _, body = raw(server, "POST", "/v1/completions", completion)
        assert_openai_error(status, body, 400, param=param)


def test_negative_max_tokens_unknown_model_and_invalid_schema(client, model_id):
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(model=model_id, messages=HI, max_tokens=-5)
    assert info.value.body["param"] == "max_tokens" and "-5" in info.value.message
    with pytest.raises(openai.NotFoundError) as info:
        client.chat.completions.create(model="gpt-4o", messages=HI, max_tokens=4)
    assert info.value.body["param"] == "model" and info.value.body["code"] == "model_not_found"
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(
            model=model_id,
            messages=HI,
            max_tokens=4,
            response_format={
                "type": "json_schema",
                "json_schema": {"name": "bad", "schema": {"type": "no-such-type"}},
            },
        )
    assert info.value.body["param"] == "response_format"
    assert "no-such-type" in info.value.message


def test_requests_that_cannot_fit_name_the_bytes_or_positions(client, model_id):
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(model=model_id, messages=HI, max_tokens=NEVER_FITS_TOKENS)
    assert info.value.body["code"] == "kv_budget_exceeded"
    assert f"{KV_BUDGET_MB * 2**20} bytes" in info.value.message
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(model=model_id, messages=HI, max_tokens=1000)
    assert info.value.body["code"] == "context_length_exceeded"
    assert "512 positions" in info.value.message


def test_a_10_mb_body_is_refused_without_being_read(server, model_id):
    # the headers alone announce 10 MB: the answer comes before a byte of the body is sent
    connection = http.client.HTTPConnection(server.host, server.port, timeout=WAIT_DEADLINE_S)
    try:
        connection.putrequest("POST", "/v1/chat/completions")
        connection.putheader("Authorization", f"Bearer {KEY}")
        connection.putheader("Content-Type", "application/json")
        connection.putheader("Content-Length", str(10 * 2**20))
        connection.endheaders()
        response = connection.getresponse()
        assert response.status == 413
        assert json.loads(response.read())["error"]["code"] == "request_too_large"
    finally:
        connection.close()
    # a body streamed without a length is cut off at the limit
    big = json.dumps(chat_body(model_id, padding="x" * (10 * 2**20))).encode()

    def chunks():
        for start in range(0, len(big), 2**16):
            yield big[start : start + 2**16]

    connection = http.client.HTTPConnection(server.host, server.port, timeout=WAIT_DEADLINE_S)
    try:
        connection.request(
            "POST",
            "/v1/chat/completions",
            body=chunks(),
            headers={
                "Authorization": f"Bearer {KEY}",
                "Content-Type": "application/json",
                "Transfer-Encoding": "chunked",
            },
            encode_chunked=True,
        )
        response = connection.getresponse()
        assert response.status == 413
    except (BrokenPipeError, ConnectionResetError):
        pass  # the server answered and closed while the rest was still being sent
    finally:
        connection.close()


def test_wrong_or_missing_api_key(server, model_id):
    for key in (None, "wrong-key", KEY + "x", ""):
        status, headers, body = raw(
            server, "POST", "/v1/chat/completions", chat_body(model_id), key=key
        )
        assert_openai_error(status, body, 401, code="invalid_api_key")
    status, _, body = raw(server, "GET", "/v1/models", key="nope")
    assert status == 401
    with (
        openai.OpenAI(base_url=server.url, api_key="wrong", max_retries=0) as wrong,
        pytest.raises(openai.AuthenticationError),
    ):
        wrong.models.list()
    status, _, _ = raw(server, "GET", "/health", key=None)
    assert status == 200  # health needs no key (it tells nothing about the conversations)


def test_cors_only_for_the_named_origin(server, model_id):
    preflight = {"Origin": ORIGIN, "Access-Control-Request-Method": "POST"}
    preflight["Access-Control-Request-Headers"] = "authorization,content-type"
    status, headers, _ = raw(server, "OPTIONS", "/v1/chat/completions", key=None, headers=preflight)
    assert status == 200 and headers.get("access-control-allow-origin") == ORIGIN
    status, headers, _ = raw(server, "GET", "/v1/models", headers={"Origin": ORIGIN})
    assert status == 200 and headers.get("access-control-allow-origin") == ORIGIN
    other = {**preflight, "Origin": "http://evil.example"}
    status, headers, _ = raw(server, "OPTIONS", "/v1/chat/completions", key=None, headers=other)
    assert status == 403 and "access-control-allow-origin" not in headers
    status, headers, _ = raw(server, "GET", "/v1/models", headers={"Origin": "http://evil.example"})
    assert status == 403 and "access-control-allow-origin" not in headers


def test_the_command_line_checks_host_and_content_type(server, model_id):
    # `python -m engine serve` itself (not only the app object): a rebound Host is refused, a
    # text/plain body is refused, the server's own address is accepted
    body = chat_body(model_id)
    status, _, answer = raw(
        server, "POST", "/v1/chat/completions", body, headers={"Host": "evil.example"}
    )
    assert_openai_error(status, answer, 400, code="invalid_host")
    status, _, answer = raw(
        server, "POST", "/v1/chat/completions", json.dumps(body).encode(),
        headers={"Content-Type": "text/plain"},
    )  # fmt: skip
    assert_openai_error(status, answer, 415, code="unsupported_media_type")
    status, _, answer = raw(server, "GET", "/v1/models", headers={"Host": "box.local:8080"})
    assert status == 200 and answer["data"][0]["id"] == model_id  # --allowed-host box.local


# --- cancellation, queueing, load -------------------------------------------------------------------
COUNTING = "1, 2, 3, 4, 5, 6, 7, 8,"  # SmolLM2 keeps counting: a long reply that needs no EOS


def open_stream(server, model_id, max_tokens, *, prompt=COUNTING):
    """A raw streaming completion: -> (connection, response) with the headers read."""
    connection = http.client.HTTPConnection(server.host, server.port, timeout=WAIT_DEADLINE_S)
    body = {
        "model": model_id,
        "prompt": prompt,
        "max_tokens": max_tokens,
        "temperature": 0,
        "stream": True,
    }
    connection.request(
        "POST",
        "/v1/completions",
        body=json.dumps(body),
        headers={"Authorization": f"Bearer {KEY}", "Content-Type": "application/json"},
    )
    return connection, connection.getresponse()


def read_data_line(response) -> str:
    while True:
        line = response.readline().decode()
        assert line, "the stream ended"
        if line.startswith("data: "):
            return line[6:].strip()


def test_a_client_that_disconnects_mid_stream_cancels_its_request(client, server, model_id):
    before = wait_until_idle(server)["requests"]
    stream = client.completions.create(
        model=model_id, prompt=COUNTING, max_tokens=250, temperature=0, stream=True
    )
    received = [next(iter(stream)) for _ in range(3)]
    assert all(c.choices[0].finish_reason is None for c in received)
    assert health(server)["running"] == 1
    stream.close()  # the connection goes away with 247 tokens still to come
    after = wait_until_idle(server)["requests"]
    assert after["cancelled"] == before["cancelled"] + 1
    assert after["completed"] == before["completed"]


def test_a_client_that_disconnects_while_waiting_for_a_whole_reply_cancels_it(server, model_id):
    before = wait_until_idle(server)["requests"]
    connection = http.client.HTTPConnection(server.host, server.port, timeout=WAIT_DEADLINE_S)
    body = {"model": model_id, "prompt": COUNTING, "max_tokens": 250, "temperature": 0}
    connection.request(
        "POST",
        "/v1/completions",
        body=json.dumps(body),
        headers={"Authorization": f"Bearer {KEY}", "Content-Type": "application/json"},
    )
    deadline = time.monotonic() + WAIT_DEADLINE_S
    while health(server)["running"] == 0:
        assert time.monotonic() < deadline
        time.sleep(0.02)
    connection.close()  # gone before the reply was ready
    after = wait_until_idle(server)["requests"]
    assert after["cancelled"] == before["cancelled"] + 1
    assert after["completed"] == before["completed"]


def test_queued_requests_are_told_their_place_and_a_full_queue_answers_429(server, model_id):
    wait_until_idle(server)
    # three long streams reserve 3 x 127 of the budget's 409 positions: the next ones have to wait
    running = [open_stream(server, model_id, 110) for _ in range(3)]
    queued = []
    try:
        for _, response in running:
            assert response.status == 200 and response.getheader("X-Queue-Position") is None
            read_data_line(response)
        for place in range(1, MAX_QUEUE + 1):
            queued.append(open_stream(server, model_id, 30))
            assert queued[-1][1].status == 200
            assert queued[-1][1].getheader("X-Queue-Position") == str(place)
        assert health(server)["queued"] == MAX_QUEUE
        status, _, body = raw(
            server, "POST", "/v1/completions", {"model": model_id, "prompt": "Hi", "max_tokens": 3}
        )
        assert_openai_error(status, body, 429, code="queue_full")
        assert "bytes" in body["error"]["message"] and "queue" in body["error"]["message"]
    finally:
        for connection, _ in running + queued:
            connection.close()
    wait_until_idle(server)


def _load_request(server, model_id, index: int) -> dict:
    """One client of the load test; its kind follows from its index."""
    kind = ("stream", "whole", "cancel", "stream", "never_fits", "whole", "cancel", "overflow")[
        index % 8
    ]
    max_tokens = {"never_fits": NEVER_FITS_TOKENS, "overflow": 1000, "cancel": 60}.get(
        kind, 2 + index % 7
    )
    body = {
        "model": model_id,
        "messages": [{"role": "user", "content": f"Request {index}: count to {index % 5 + 3}."}],
        "max_tokens": max_tokens,
        "temperature": 0,
        "stream": kind in ("stream", "cancel"),
    }
    connection = http.client.HTTPConnection(server.host, server.port, timeout=WAIT_DEADLINE_S)
    try:
        connection.request(
            "POST",
            "/v1/chat/completions",
            body=json.dumps(body),
            headers={"Authorization": f"Bearer {KEY}", "Content-Type": "application/json"},
        )
        response = connection.getresponse()
        result = {"index": index, "kind": kind, "status": response.status}
        if response.status != 200:
            result["error"] = json.loads(response.read())["error"]
        elif kind == "cancel":
            result["id"] = json.loads(read_data_line(response))["id"]
            read_data_line(response)
            result["outcome"] = "disconnected"  # closing the connection below
        elif kind == "stream":
            ids, finish = set(), None
            while (data := read_data_line(response)) != "[DONE]":
                chunk = json.loads(data)
                ids.add(chunk["id"])
                finish = chunk["choices"][0]["finish_reason"] or finish
            assert len(ids) == 1
            result.update(id=ids.pop(), outcome=finish)
        else:
            reply = json.loads(response.read())
            result.update(id=reply["id"], outcome=reply["choices"][0]["finish_reason"])
        return result
    finally:
        connection.close()


def test_load_40_requests_8_at_a_time(server, model_id):
    before = wait_until_idle(server)["requests"]
    with ThreadPoolExecutor(max_workers=8) as pool:
        results = list(pool.map(lambda i: _load_request(server, model_id, i), range(40)))
    after = wait_until_idle(server)
    assert len(results) == 40
    admitted = [r for r in results if r["status"] == 200]
    refused = [r for r in results if r["status"] != 200]
    for r in refused:
        if r["kind"] == "never_fits":
            assert (r["status"], r["error"]["code"]) == (400, "kv_budget_exceeded"), r
            assert "bytes" in r["error"]["message"]
        elif r["kind"] == "overflow":
            assert (r["status"], r["error"]["code"]) == (400, "context_length_exceeded"), r
        else:  # a request that could run, refused only because the queue was full
            assert (r["status"], r["error"]["code"]) == (429, "queue_full"), r
            assert "bytes" in r["error"]["message"]
    assert all(r["kind"] not in ("never_fits", "overflow") for r in admitted)
    assert len({r["kind"] for r in refused if r["status"] == 400}) == 2
    for r in admitted:
        expected = {"disconnected"} if r["kind"] == "cancel" else {"stop", "length"}
        assert r["outcome"] in expected, r
    assert len({r["id"] for r in admitted}) == len(admitted)  # none duplicated
    counts = after["requests"]
    new = {k: counts[k] - before[k] for k in ("admitted", "completed", "cancelled", "failed")}
    assert new["admitted"] == len(admitted)  # none lost
    assert new["failed"] == 0
    assert new["completed"] + new["cancelled"] == new["admitted"]
    assert new["completed"] >= sum(r["kind"] in ("stream", "whole") for r in admitted)
    assert after["kv_bytes_reserved"] == 0 and after["running"] == after["queued"] == 0


def test_ctrl_c_ends_running_streams_as_cancelled_and_exits_cleanly(smollm2_path, tmp_path):
    with running_server(smollm2_path, tmp_path / "stderr.txt", "--n-ctx", "512") as own:
        connection, response = open_stream(own, smollm2_path.stem, 300)
        try:
            first = json.loads(read_data_line(response))
            assert first["choices"][0]["finish_reason"] is None
            own.process.send_signal(signal.SIGINT)
            finish = None
            while (data := read_data_line(response)) != "[DONE]":
                finish = json.loads(data)["choices"][0]["finish_reason"] or finish
            assert finish == "cancelled"
        finally:
            connection.close()
        assert own.process.wait(timeout=WAIT_DEADLINE_S) == 0
