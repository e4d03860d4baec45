"""`python -m engine serve MODEL --port 0 ...` as a test server on loopback: started in its own
process, its URL read from the line it prints when it listens, stopped with Ctrl-C (which must
end it cleanly, exit 0). Used by tests/test_server_api.py (a module-scoped server with a key and
small budgets) and by the session fixture `localchat_server` in tests/conftest.py (the app's
remote client against our own server)."""

from __future__ import annotations

import contextlib
import json
import os
import re
import selectors
import signal
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

START_DEADLINE_S = 180.0  # a first launch on a busy machine compiles kernels
STOP_DEADLINE_S = 60.0


@dataclass
class Server:
    process: subprocess.Popen
    url: str  # http://127.0.0.1:PORT/v1
    host: str
    port: int
    log_path: Path
    model: str = ""  # the id GET /v1/models lists (the file's stem)
    api_key: str | None = None

    @property
    def base_url(self) -> str:  # the name tests/llama_server.py's OpenAIServer uses
        return self.url

    def health(self) -> dict:
        with urllib.request.urlopen(f"http://{self.host}:{self.port}/health", timeout=30) as r:
            return json.loads(r.read())


def start_server(model_path, log: Path, *flags: str) -> Server:
    command = [sys.executable, "-m", "engine", "serve", str(model_path), "--port", "0", *flags]
    with open(log, "wb") as stderr:
        process = subprocess.Popen(
            command,
            stdout=subprocess.PIPE,
            stderr=stderr,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
    try:
        url = _wait_for_url(process, log)
    except BaseException:
        stop_server(process, check=False)
        raise
    host, port = re.match(r"http://([\d.]+):(\d+)/v1$", url).groups()
    key = flags[flags.index("--api-key") + 1] if "--api-key" in flags else None
    server = Server(process, url, host, int(port), log, api_key=key)
    server.model = _model_id(server)
    return server


def stop_server(process: subprocess.Popen, check: bool = True) -> int | None:
    if process.poll() is None:
        process.send_signal(signal.SIGINT)
    try:
        code = process.wait(timeout=STOP_DEADLINE_S)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
        code = None
    process.stdout.close()
    return code


@contextlib.contextmanager
def running_server(model_path, log: Path, *flags: str):
    """The server until the block ends; then Ctrl-C, which must stop it cleanly (exit 0)."""
    server = start_server(model_path, log, *flags)
    try:
        yield server
    finally:
        code = stop_server(server.process)
    assert code == 0, log.read_text()


def _model_id(server: Server) -> str:
    headers = {"Authorization": f"Bearer {server.api_key}"} if server.api_key else {}
    request = urllib.request.Request(f"{server.url}/models", headers=headers)
    with urllib.request.urlopen(request, timeout=30) as response:
        return json.loads(response.read())["data"][0]["id"]


def _wait_for_url(process: subprocess.Popen, log: Path) -> str:
    deadline = time.monotonic() + START_DEADLINE_S
    with selectors.DefaultSelector() as selector:
        selector.register(process.stdout, selectors.EVENT_READ)
        while time.monotonic() < deadline:
            if not selector.select(timeout=1.0):
                if process.poll() is not None:
                    break
                continue
            line = process.stdout.readline().decode()
            if not line:
                break
            found = re.search(r"http://\S+/v1", line)
            if found:
                return found.group(0).rstrip('",')
    raise AssertionError(f"the server did not start: {log.read_text()}")
