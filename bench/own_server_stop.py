"""Stop in the app against LocalChat's own server (`python -m engine serve`, SmolLM2, loopback):
the app's OpenAI client streams a long greedy reply and Stops it after the 5th delta (cancel
token + socket shutdown, as the GUI thread does it). Measured per run, from Stop:
  - client: until the client's Finished (the partial reply saved, the chat usable again);
  - server: until the server's /health counts the request as cancelled with no KV reserved
    (polled every 2 ms, so the figure includes up to 2 ms of polling and the poll's round trip).
Also a streamed tool call (tool_choice "required"): time to the first tool-call delta and to
the whole call, through the same client.

    .venv/bin/python -m bench.own_server_stop [RUNS]
"""

from __future__ import annotations

import json
import statistics
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

from app.backends.connection import Connection
from app.backends.openai_client import OpenAIClient
from engine.cancel import CancelToken
from engine.events import Finished, TextDelta, ToolCallFinished, ToolCallStarted
from engine.model_files import default_model_path
from tests.engine_server import Server, start_server, stop_server

STORY = [{"role": "user", "content": "Write a long story about a dragon."}]
PARAMS = {"temperature": 0, "max_tokens": 300}
TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather in a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "maxLength": 40}},
            "required": ["city"],
            "additionalProperties": False,
        },
    },
}


def _health(server: Server) -> dict:
    with urllib.request.urlopen(f"http://{server.host}:{server.port}/health", timeout=30) as r:
        return json.loads(r.read())


def stop_run(server: Server) -> tuple[float, float]:
    cancel = CancelToken()
    client = OpenAIClient(Connection("b", "bench", server.base_url, 120))
    before = _health(server)["requests"]["cancelled"]
    stopped_at: list[float] = []
    finished_at = None
    deltas = 0
    try:
        for event in client.chat(server.model, STORY, PARAMS, cancel):
            if isinstance(event, TextDelta):
                deltas += 1
                if deltas == 5:
                    stopped_at.append(time.perf_counter())
                    threading.Thread(target=lambda: (cancel.cancel(), client.interrupt())).start()
            if isinstance(event, Finished):
                finished_at = time.perf_counter()
    finally:
        client.close()
    assert finished_at is not None and stopped_at
    while True:
        health = _health(server)
        if health["requests"]["cancelled"] > before and health["kv_bytes_reserved"] == 0:
            server_at = time.perf_counter()
            break
        time.sleep(0.002)
    return (finished_at - stopped_at[0]) * 1000, (server_at - stopped_at[0]) * 1000


def tool_run(server: Server) -> tuple[float, float]:
    client = OpenAIClient(Connection("b", "bench", server.base_url, 120))
    params = {"temperature": 0, "max_tokens": 60, "tools": [TOOL], "tool_choice": "required"}
    messages = [{"role": "user", "content": "What is the weather in Paris?"}]
    started = time.perf_counter()
    first = whole = None
    try:
        for event in client.chat(server.model, messages, params, CancelToken()):
            if isinstance(event, ToolCallStarted) and first is None:
                first = time.perf_counter()
            if isinstance(event, ToolCallFinished):
                whole = time.perf_counter()
    finally:
        client.close()
    assert first is not None and whole is not None
    return (first - started) * 1000, (whole - started) * 1000


def main(argv: list[str]) -> int:
    runs = int(argv[0]) if argv else 5
    log = Path(tempfile.mkdtemp()) / "server.log"
    server = start_server(default_model_path(), log, "--n-ctx", "2048")
    try:
        stop_run(server)  # warm-up
        stops = [stop_run(server) for _ in range(runs)]
        tools = [tool_run(server) for _ in range(runs)]
    finally:
        stop_server(server.process)
    rows = [
        ("Stop -> client's Finished", [c for c, _ in stops]),
        ("Stop -> server counts it cancelled, KV freed", [s for _, s in stops]),
        ("request -> first tool-call delta (required)", [f for f, _ in tools]),
        ("request -> whole tool call checked", [w for _, w in tools]),
    ]
    print(f"| own server, SmolLM2 ({runs} runs) | median ms | min | max |\n|---|---|---|---|")
    for label, times in rows:
        print(f"| {label} | {statistics.median(times):.1f} | {min(times):.1f} | {max(times):.1f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
