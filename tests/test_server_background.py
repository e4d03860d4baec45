"""BackgroundServer: the server on a thread beside a program that keeps using the same loaded
model through the same scheduler (the desktop app's "Serve this model")."""

from __future__ import annotations

import http.client
import json
import socket
from concurrent.futures import ThreadPoolExecutor

import openai
import pytest

from engine.batching.scheduler import BatchScheduler
from engine.cancel import CancelToken
from engine.events import Finished
from engine.server.background import BackgroundServer
from engine.types import GenerationRequest

HI = [{"role": "user", "content": "Say hello."}]


def test_http_clients_and_the_owners_own_requests_share_one_scheduler(smollm2):
    scheduler = BatchScheduler(smollm2, max_concurrency=4)
    try:
        server = BackgroundServer(smollm2, scheduler, port=0)
        assert server.wait_ready(60)
        try:
            with openai.OpenAI(base_url=server.url, api_key="x", max_retries=0) as client:

                def over_http():
                    return client.chat.completions.create(
                        model=smollm2.path.stem, messages=HI, max_tokens=8, temperature=0
                    )

                def own_request():
                    ticket = scheduler.submit(
                        GenerationRequest(
                            messages=HI, overrides={"max_new_tokens": 8, "do_sample": False}
                        ),
                        CancelToken(),
                    )
                    return [e for e in ticket.events() if isinstance(e, Finished)][0]

                with ThreadPoolExecutor(2) as pool:
                    remote, local = pool.submit(over_http), pool.submit(own_request)
                    remote, local = remote.result(), local.result()
                assert remote.choices[0].message.content == local.text  # same model, same tokens
            status = server.status()
            assert status.url == server.url and (status.running, status.http_requests) == (0, 0)
            assert status.kv_bytes_reserved == 0
        finally:
            server.stop()
        host, port = server.url.removeprefix("http://").removesuffix("/v1").rsplit(":", 1)
        with pytest.raises(OSError):
            socket.create_connection((host, int(port)), timeout=5).close()
        # the scheduler outlives the server: its owner keeps generating
        ticket = scheduler.submit(
            GenerationRequest(prompt="Hi", overrides={"max_new_tokens": 2}), CancelToken()
        )
        assert isinstance(list(ticket.events())[-1], Finished)
    finally:
        scheduler.close()


def test_a_port_in_use_is_an_oserror_before_any_thread_starts(smollm2):
    scheduler = BatchScheduler(smollm2, max_concurrency=1)
    taken = socket.socket()
    try:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        with pytest.raises(OSError):
            BackgroundServer(smollm2, scheduler, port=taken.getsockname()[1])
    finally:
        taken.close()
        scheduler.close()


def test_stop_cancels_a_running_http_stream(smollm2):
    scheduler = BatchScheduler(smollm2, max_concurrency=2)
    try:
        server = BackgroundServer(smollm2, scheduler, port=0)
        server.wait_ready(60)
        host, port = server.url.removeprefix("http://").removesuffix("/v1").rsplit(":", 1)
        connection = http.client.HTTPConnection(host, int(port), timeout=60)
        try:
            connection.request(
                "POST",
                "/v1/completions",
                body=json.dumps(
                    {"model": smollm2.path.stem, "prompt": "1, 2, 3,", "max_tokens": 300}
                    | {"stream": True}
                ),
                headers={"Content-Type": "application/json"},
            )
            response = connection.getresponse()
            assert response.readline().startswith(b"data: ")
            server.stop()
            body = response.read().decode()
            assert '"finish_reason":"cancelled"' in body and body.endswith("data: [DONE]\n\n")
        finally:
            connection.close()
        assert scheduler.stats().running == 0
    finally:
        scheduler.close()
