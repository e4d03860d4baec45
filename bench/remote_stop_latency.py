"""How fast Stop ends a remote reply: the time from Stop (cancel token + socket shutdown, as the
GUI thread does it, 0.37 s after the 5th delta or 1 s after the request) to the client's Finished event, against llama-cpp-python's server on
loopback, mid-stream and while the server has not sent its first byte (a fault proxy holds it
back 20 s). "poll only" is the same without the socket shutdown, as if Stop were only checked
between chunks.

    .venv/bin/python -m bench.remote_stop_latency [RUNS]
"""

from __future__ import annotations

import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

from app.backends.connection import Connection
from app.backends.openai_client import OpenAIClient
from engine.cancel import CancelToken
from engine.events import Finished, TextDelta
from engine.model_files import default_model_path
from tests.fault_proxy import Fault, FaultProxy
from tools.remote_demo import _free_port, _start_server

STORY = [{"role": "user", "content": "Write a long story about a dragon."}]
PARAMS = {"temperature": 0, "max_tokens": 300}


def stop_latency_ms(base_url: str, *, after_deltas: int, shutdown: bool) -> float:
    cancel = CancelToken()
    client = OpenAIClient(Connection("b", "bench", base_url, 120))
    stopped_at: list[float] = []

    def stop() -> None:
        stopped_at.append(time.perf_counter())
        cancel.cancel()
        if shutdown:
            client.interrupt()

    deltas = 0
    if after_deltas == 0:
        threading.Timer(1.0, stop).start()
    with client:
        for event in client.chat("smollm2", STORY, PARAMS, cancel):
            if isinstance(event, TextDelta):
                deltas += 1
                if deltas == after_deltas:  # Stop lands between two chunks, as a click does
                    threading.Timer(0.37, stop).start()
            if isinstance(event, Finished):
                return (time.perf_counter() - stopped_at[0]) * 1000
    raise RuntimeError("no Finished")


def main(argv: list[str]) -> int:
    runs = int(argv[0]) if argv else 5
    log = Path(tempfile.mkdtemp()) / "server.log"
    port = _free_port()
    server = _start_server(default_model_path(), port, log)
    proxy = FaultProxy("127.0.0.1", port).start()
    try:
        direct = f"http://127.0.0.1:{port}/v1"
        rows = []
        for label, url, after, fault in (
            ("mid-stream, shutdown", direct, 5, None),
            ("mid-stream, poll only", direct, 5, None),
            ("before first byte, shutdown", proxy.base_url, 0, Fault(first_byte_delay_s=20)),
            ("before first byte, poll only", proxy.base_url, 0, Fault(first_byte_delay_s=20)),
        ):
            proxy.fault = fault or Fault()
            times = [
                stop_latency_ms(url, after_deltas=after, shutdown="shutdown" in label)
                for _ in range(runs)
            ]
            rows.append((label, statistics.median(times), min(times), max(times)))
        print(f"| Stop ({runs} runs) | median ms | min | max |\n|---|---|---|---|")
        for label, med, lo, hi in rows:
            print(f"| {label} | {med:.1f} | {lo:.1f} | {hi:.1f} |")
    finally:
        proxy.stop()
        server.terminate()
        server.wait(15)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
