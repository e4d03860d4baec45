"""A real OpenAI-compatible server for the tests: llama-cpp-python's `python -m llama_cpp.server`
serving a GGUF on 127.0.0.1 (the session fixtures in conftest.py, and test modules that need a
server of their own)."""

from __future__ import annotations

import os
from pathlib import Path

from tests.requirements import PEER_HOW, missing


class OpenAIServer:
    """`python -m llama_cpp.server` serving a GGUF on 127.0.0.1; see openai_server below."""

    def __init__(self, model_path: Path, log_path: Path, api_key: str | None = None):
        import socket
        import subprocess
        import sys

        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.model = "smollm2"
        self.api_key = api_key
        self.log_path = log_path
        command = [sys.executable, "-m", "llama_cpp.server", "--model", str(model_path)]
        command += ["--host", "127.0.0.1", "--port", str(self.port), "--model_alias", self.model]
        command += ["--n_ctx", "2048", "--n_threads", "1", "--verbose", "False"]
        if api_key:
            command += ["--api_key", api_key]
        self._log = open(log_path, "wb")  # noqa: SIM115 - closed in stop()
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}  # its log lines arrive as they happen
        self.process = subprocess.Popen(
            command, stdout=self._log, stderr=subprocess.STDOUT, env=env
        )

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def wait_ready(self, deadline_s: float = 180.0) -> None:
        import time
        import urllib.error
        import urllib.request

        headers = {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}
        end = time.monotonic() + deadline_s
        while time.monotonic() < end:
            if self.process.poll() is not None:
                break
            request = urllib.request.Request(f"{self.base_url}/models", headers=headers)
            try:
                with urllib.request.urlopen(request, timeout=2) as response:
                    if response.status == 200:
                        return
            except (urllib.error.URLError, OSError):
                time.sleep(0.2)
        self.stop()
        raise RuntimeError(f"llama_cpp.server did not start: {self.log_path.read_text()[-2000:]}")

    def stop(self) -> None:
        import subprocess

        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(15)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(5)
        self._log.close()


def start_openai_server(model_path: Path, log_dir: Path, api_key: str | None = None):
    # Found, not imported: the server runs in its own process, and importing llama_cpp here
    # would load libllama into the test process (and leave a /dev/null handle open at exit).
    import importlib.util

    if importlib.util.find_spec("llama_cpp") is None or importlib.util.find_spec("uvicorn") is None:
        missing("llama-cpp-python[server]", PEER_HOW)
    server = OpenAIServer(model_path, log_dir / f"llama-server-{id(log_dir)}.log", api_key)
    server.wait_ready()
    return server
