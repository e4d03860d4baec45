"""A scripted OpenAI-compatible server on loopback, for the window's remote flows that depend on
what a model says (a tool call, then an answer from its result): no model runs, each reply is the
test's script, and every request body is kept so a test checks what the app sent.

It speaks the streamed chat completions the app's client reads (app/backends/openai_client.py):
`GET /v1/models`, and `POST /v1/chat/completions` with `stream: true` answered as server-sent
events, one word per chunk with its logprobs entry, tool calls as `delta.tool_calls` fragments,
the include_usage chunk, then `data: [DONE]`. Real servers are tested by test_remote_client.py,
test_remote_tools.py (llama-cpp-python and `python -m engine serve`) and, in the window, by
test_app_remote.py's llama-cpp-python chat."""

from __future__ import annotations

import json
import re
import threading
import time
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

MODEL = "scripted"
AUTO = "auto"  # Reply.finish: "tool_calls" after calls, else "stop"
ENDLESS_FOR_AT_MOST_S = 120.0  # an endless reply whose client never stops still ends


@dataclass(frozen=True)
class Reply:
    """One scripted answer. `text` is streamed a word per chunk; `tool_calls` are (name,
    arguments) pairs streamed as OpenAI tool_calls deltas after it; `usage` is the include_usage
    chunk's (prompt_tokens, completion_tokens). `endless`: after `text`, keep streaming a word
    every `word_every_s` until the client goes away (Stop), never finishing on its own. `finish`:
    the finish_reason the last chunk says (None: a last chunk that names none)."""

    text: str = ""
    tool_calls: tuple = ()
    usage: tuple[int, int] = (17, 0)  # completion 0: the number of words streamed
    endless: bool = False
    word_every_s: float = 0.02
    finish: str | None = AUTO


def _chunk(delta: dict, *, logprob_of: str | None = None, finish: str | None = None) -> dict:
    choice: dict = {"index": 0, "delta": delta, "finish_reason": finish}
    if logprob_of is not None:
        entry = {"token": logprob_of, "logprob": -0.25, "top_logprobs": []}
        choice["logprobs"] = {"content": [entry]}
    return {"id": "chatcmpl-scripted", "object": "chat.completion.chunk", "choices": [choice]}


class ScriptedOpenAIServer:
    """`ScriptedOpenAIServer([Reply(...), ...]).start()`: the n-th chat request gets the n-th
    reply (the last one again after the script ends). `requests` holds the request bodies;
    `client_left` is set when a client closed its connection in the middle of a stream."""

    def __init__(self, replies: list[Reply]):
        self.replies = list(replies)
        self.requests: list[dict] = []
        self.client_left = threading.Event()
        self._lock = threading.Lock()
        self._http = ThreadingHTTPServer(("127.0.0.1", 0), self._handler_class())
        self._http.daemon_threads = True
        self._thread = threading.Thread(
            target=self._http.serve_forever, args=(0.05,), name="scripted-openai", daemon=True
        )

    model = MODEL

    @property
    def port(self) -> int:
        return self._http.server_address[1]

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def start(self) -> ScriptedOpenAIServer:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._http.shutdown()
        self._http.server_close()
        self._thread.join(10)

    def _next_reply(self, body: dict) -> Reply:
        with self._lock:
            self.requests.append(body)
            return self.replies[min(len(self.requests), len(self.replies)) - 1]

    def _handler_class(self):
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format, *args):
                pass  # quiet: pytest would show every request line

            def do_GET(self):
                if self.path.rstrip("/") != "/v1/models":
                    self._json(404, {"error": {"message": f"no route {self.path}"}})
                    return
                self._json(200, {"object": "list", "data": [{"id": MODEL, "object": "model"}]})

            def do_POST(self):
                length = int(self.headers.get("Content-Length") or 0)
                body = json.loads(self.rfile.read(length) or b"{}")
                if self.path.rstrip("/") != "/v1/chat/completions" or not body.get("stream"):
                    self._json(404, {"error": {"message": "only streamed chat completions"}})
                    return
                reply = server._next_reply(body)
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.send_header("Connection", "close")
                self.end_headers()
                self.close_connection = True
                try:
                    # as real servers do: logprobs entries only when the request asks for them
                    self._stream(reply, with_logprobs=bool(body.get("logprobs")))
                except (BrokenPipeError, ConnectionResetError):
                    server.client_left.set()

            def _stream(self, reply: Reply, with_logprobs: bool = True) -> None:
                words = re.findall(r"\s*\S+", reply.text)
                for word in words:
                    self._event(
                        _chunk({"content": word}, logprob_of=word if with_logprobs else None)
                    )
                sent = len(words)
                give_up = time.monotonic() + ENDLESS_FOR_AT_MOST_S
                while reply.endless and time.monotonic() < give_up:
                    time.sleep(reply.word_every_s)
                    more = " more" if with_logprobs else None
                    self._event(_chunk({"content": " more"}, logprob_of=more))
                    sent += 1
                for index, (name, arguments) in enumerate(reply.tool_calls):
                    text = json.dumps(arguments)
                    head = {"name": name, "arguments": ""}
                    opening = {"index": index, "id": f"call_{index}", "type": "function"}
                    self._event(_chunk({"tool_calls": [{**opening, "function": head}]}))
                    for start in range(0, len(text), 4):  # the arguments in fragments
                        part = {"index": index, "function": {"arguments": text[start : start + 4]}}
                        self._event(_chunk({"tool_calls": [part]}))
                finish = reply.finish
                if finish == AUTO:
                    finish = "tool_calls" if reply.tool_calls else "stop"
                self._event(_chunk({}, finish=finish))
                prompt, completion = reply.usage
                usage = {
                    "prompt_tokens": prompt,
                    "completion_tokens": completion or sent,
                    "total_tokens": prompt + (completion or sent),
                }
                self._event({"id": "chatcmpl-scripted", "choices": [], "usage": usage})
                self.wfile.write(b"data: [DONE]\n\n")
                self.wfile.flush()

            def _event(self, data: dict) -> None:
                self.wfile.write(b"data: " + json.dumps(data).encode() + b"\n\n")
                self.wfile.flush()

            def _json(self, status: int, data: dict) -> None:
                payload = json.dumps(data).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

        return Handler
