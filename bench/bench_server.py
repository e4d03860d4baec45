"""`python -m engine serve` under concurrent clients: aggregate decode throughput over HTTP at 1, 2
and 4 streaming clients beside the same requests submitted to a BatchScheduler in-process (what
HTTP, JSON and SSE cost), and how long a client's disconnect takes to free its slot.

    nice .venv/bin/python bench/bench_server.py [--model smollm2|gemma3] [--streams 1 2 4]
        [--tokens 64] [--trials 3] [--json]

Throughput: N streaming /v1/completions requests (different prompts, seeded sampling, no
drafts, `logprobs: 0` so every chunk says how many tokens it carries) sent together to a server
running in its own process; the arrival time of every token is recorded by the client. As in
bench_batching.py, the aggregate rate counts the tokens of all streams inside the window where all
N are decoding. The in-process figure is bench_batching.aggregate_rate on the same requests, in
this process, alternating with the HTTP runs. Median over trials.

Disconnect: one stream of 300 tokens; after 5 chunks the client closes its socket; reported is
the time from the close until /health shows nothing running and no KV reserved (polled every
2 ms). Median of 5.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import re
import selectors
import signal
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_batching import MODELS, TOPICS, aggregate_rate

from engine.loader import load_model


def start_server(path: Path, max_concurrency: int) -> tuple[subprocess.Popen, str, int]:
    command = [sys.executable, "-m", "engine", "serve", str(path), "--port", "0"]
    command += ["--max-concurrency", str(max_concurrency), "--n-ctx", "1024"]
    process = subprocess.Popen(
        command, stdout=subprocess.PIPE, env={**os.environ, "PYTHONUNBUFFERED": "1"}
    )
    deadline = time.monotonic() + 300
    with selectors.DefaultSelector() as selector:
        selector.register(process.stdout, selectors.EVENT_READ)
        while time.monotonic() < deadline:
            if selector.select(timeout=1.0):
                line = process.stdout.readline().decode()
                found = re.search(r"http://([\d.]+):(\d+)/v1", line)
                if found:
                    return process, found.group(1), int(found.group(2))
                if not line:
                    break
    raise SystemExit("the server did not start")


def stop_server(process: subprocess.Popen) -> None:
    process.send_signal(signal.SIGINT)
    process.wait(timeout=60)
    process.stdout.close()


def _stream(host, port, model, topic, tokens, seed, times: list, failures: list) -> None:
    body = {
        "model": model,
        "prompt": f"Once upon a time, in a story about {topic}, there was",
        "max_tokens": tokens,
        "temperature": 1.0,
        "top_k": 0,
        "top_p": 1.0,
        "min_p": 0.0,
        "seed": seed,
        "stream": True,
        "logprobs": 0,
    }
    connection = http.client.HTTPConnection(host, port, timeout=300)
    try:
        connection.request("POST", "/v1/completions", json.dumps(body), JSON_HEADERS)
        response = connection.getresponse()
        for line in response:
            if not line.startswith(b"data: ") or line.startswith(b"data: [DONE]"):
                continue
            chunk = json.loads(line[6:])
            logprobs = chunk["choices"][0]["logprobs"] if chunk.get("choices") else None
            now = time.perf_counter()
            times.extend([now] * len(logprobs["tokens"]) if logprobs else [])
    except Exception as exc:  # reported, not hidden
        failures.append(repr(exc))
    finally:
        connection.close()


# The server refuses a POST that does not say it is JSON (engine/server/access.py: a page in a
# browser cannot send that header to a local server without asking first).
JSON_HEADERS = {"Content-Type": "application/json"}


def http_rate(host, port, model, n: int, tokens: int, trial: int) -> float:
    times: list[list[float]] = [[] for _ in range(n)]
    failures: list[str] = []
    threads = [
        threading.Thread(
            target=_stream,
            args=(host, port, model, TOPICS[i % len(TOPICS)], tokens, 100 * trial + i),
            kwargs={"times": times[i], "failures": failures},
        )
        for i in range(n)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if failures:
        raise SystemExit(f"requests failed: {failures}")
    start = max(s[0] for s in times)
    end = min(s[-1] for s in times)
    if end <= start:
        raise SystemExit("a stream ended before all had started; use more --tokens")
    inside = sum(sum(1 for t in s if start < t <= end) for s in times)
    return inside / (end - start)


def _health(host, port) -> dict:
    connection = http.client.HTTPConnection(host, port, timeout=30)
    try:
        connection.request("GET", "/health")
        return json.loads(connection.getresponse().read())
    finally:
        connection.close()


def disconnect_ms(host, port, model) -> float:
    body = {"model": model, "prompt": "1, 2, 3,", "max_tokens": 300, "stream": True}
    connection = http.client.HTTPConnection(host, port, timeout=60)
    connection.request("POST", "/v1/completions", json.dumps(body), JSON_HEADERS)
    response = connection.getresponse()
    chunks = 0
    while chunks < 5:
        if response.readline().startswith(b"data: "):
            chunks += 1
    closed = time.perf_counter()
    connection.close()
    while True:
        state = _health(host, port)
        if state["running"] == 0 and state["kv_bytes_reserved"] == 0:
            return (time.perf_counter() - closed) * 1000.0
        time.sleep(0.002)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=sorted(MODELS), default="smollm2")
    parser.add_argument("--streams", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--trials", type=int, default=3)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    path = MODELS[args.model]()
    process, host, port = start_server(path, max(args.streams))
    model = path.stem
    http_rates: dict[int, list[float]] = {n: [] for n in args.streams}
    local_rates: dict[int, list[float]] = {n: [] for n in args.streams}
    try:
        lm = load_model(path, n_ctx=1024)
        try:
            for trial in range(args.trials):
                for n in args.streams:
                    http_rates[n].append(http_rate(host, port, model, n, args.tokens, trial))
                    local_rates[n].append(aggregate_rate(lm, n, args.tokens, trial))
        finally:
            lm.close()
        disconnects = [disconnect_ms(host, port, model) for _ in range(5)]
    finally:
        stop_server(process)
    result = {
        "model": args.model,
        "tokens": args.tokens,
        "trials": args.trials,
        "http_tok_s": {n: statistics.median(r) for n, r in http_rates.items()},
        "in_process_tok_s": {n: statistics.median(r) for n, r in local_rates.items()},
        "disconnect_to_idle_ms": {
            "median": statistics.median(disconnects),
            "max": max(disconnects),
        },
    }
    if args.json:
        print(json.dumps(result))
        return
    print(f"{args.model}, {args.tokens} tokens per stream, median of {args.trials}")
    print("streams  HTTP tok/s  in-process tok/s  HTTP/in-process")
    for n in args.streams:
        h, local = result["http_tok_s"][n], result["in_process_tok_s"][n]
        print(f"{n:>7}  {h:>10.1f}  {local:>16.1f}  {h / local:>15.2f}")
    d = result["disconnect_to_idle_ms"]
    print(f"disconnect -> slot and KV free: median {d['median']:.1f} ms, max {d['max']:.1f} ms")


if __name__ == "__main__":
    main()
