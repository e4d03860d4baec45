"""A fault-injecting HTTP proxy on loopback, in front of a real OpenAI-compatible server, for
the faults a real server cannot produce on demand: a stream cut after N bytes, a malformed
chunk, a 429 with Retry-After, a slow first byte.

It runs an asyncio server on its own thread. Each client connection is one request (our client
does not keep connections alive); the request is forwarded unchanged and the answer is passed
back through the fault of the moment (`proxy.fault = Fault(...)`). `proxy.upstream_closed` is
set once the proxy's upstream connection closed, i.e. the real server saw the disconnect."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from dataclasses import dataclass


@dataclass
class Fault:
    cut_after_bytes: int | None = None  # of the response body; then the connection is dropped
    malformed_after_bytes: int | None = None  # insert a broken SSE chunk at that body offset
    status_429_retry_after: str | None = None  # answer 429 with this Retry-After, no upstream
    first_byte_delay_s: float = 0.0  # wait this long before forwarding the first byte
    # an SSE chunk to send just before `data: [DONE]` (e.g. the usage chunk of
    # stream_options.include_usage, which llama-cpp-python does not send)
    before_done: bytes | None = None
    drop_done: bool = False  # leave out `data: [DONE]` but end the HTTP body cleanly
    after_head: bytes | None = None  # SSE events to send before the server's first chunk
    # answer 400 naming this request field when the request carries it (a server without it)
    refuse_field: str | None = None


MALFORMED_CHUNK = b'data: {"choices": [{"delta": {"content": "oops"\n\n'


class FaultProxy:
    def __init__(self, upstream_host: str, upstream_port: int):
        self.upstream = (upstream_host, upstream_port)
        self.fault = Fault()
        self.port = 0
        self.requests = 0
        self.upstream_closed = threading.Event()
        # Set when the client went away while the server was still streaming (Stop).
        self.client_left_mid_stream = threading.Event()
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._server: asyncio.base_events.Server | None = None
        self._handlers: set[asyncio.Task] = set()
        self._thread = threading.Thread(target=self._run, name="fault-proxy", daemon=True)

    def start(self) -> FaultProxy:
        self._thread.start()
        self._ready.wait(10)
        return self

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def stop(self) -> None:
        async def shutdown():
            self._server.close()
            # handlers still running (a first byte held back, a stream being relayed) end now
            tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            await self._server.wait_closed()

        asyncio.run_coroutine_threadsafe(shutdown(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        self._loop.close()

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)

        async def start():
            self._server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
            self.port = self._server.sockets[0].getsockname()[1]
            self._ready.set()

        self._loop.run_until_complete(start())
        self._loop.run_forever()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        # asyncio keeps only a weak hold on a connection's handler once its transport closes:
        # without this reference a handler still awaiting upstream could be collected mid-await.
        task = asyncio.current_task()
        self._handlers.add(task)
        try:
            await self._serve(reader, writer)
        finally:
            self._handlers.discard(task)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.requests += 1
        fault = self.fault
        try:
            head = await reader.readuntil(b"\r\n\r\n")
            length = 0
            for line in head.split(b"\r\n"):
                if line.lower().startswith(b"content-length:"):
                    length = int(line.split(b":", 1)[1])
            body = await reader.readexactly(length) if length else b""
            if fault.refuse_field is not None and f'"{fault.refuse_field}"'.encode() in body:
                payload = (
                    b'{"error": {"message": "Unrecognized request argument supplied: '
                    + fault.refuse_field.encode()
                    + b'", "type": "invalid_request_error"}}'
                )
                writer.write(
                    b"HTTP/1.1 400 Bad Request\r\nContent-Type: application/json\r\n"
                    + f"Content-Length: {len(payload)}\r\nConnection: close\r\n\r\n".encode()
                    + payload
                )
                await writer.drain()
                return
            if fault.status_429_retry_after is not None:
                payload = b'{"error": {"message": "slow down", "type": "rate_limit"}}'
                writer.write(
                    b"HTTP/1.1 429 Too Many Requests\r\nContent-Type: application/json\r\n"
                    + f"Retry-After: {fault.status_429_retry_after}\r\n".encode()
                    + f"Content-Length: {len(payload)}\r\nConnection: close\r\n\r\n".encode()
                    + payload
                )
                await writer.drain()
                return
            up_reader, up_writer = await asyncio.open_connection(*self.upstream)
            self.upstream_closed.clear()
            try:
                up_writer.write(head + body)
                await up_writer.drain()
                try:
                    await self._relay(up_reader, writer, fault)
                except (ConnectionError, OSError):
                    self.client_left_mid_stream.set()
                    raise
            finally:
                up_writer.close()
                with contextlib.suppress(OSError):
                    await up_writer.wait_closed()
                self.upstream_closed.set()
        except (asyncio.IncompleteReadError, ConnectionError, OSError):
            pass
        finally:
            writer.close()
            with contextlib.suppress(OSError):
                await writer.wait_closed()

    async def _relay(self, up_reader, writer, fault: Fault) -> None:
        """Pass the answer back. A chunked body is re-framed chunk by chunk so that a fault can
        sit between two of the server's chunks (each one SSE event); byte offsets count the
        decoded body."""
        head = await up_reader.readuntil(b"\r\n\r\n")
        if fault.first_byte_delay_s:
            await asyncio.sleep(fault.first_byte_delay_s)
        writer.write(head)
        chunked = b"transfer-encoding: chunked" in head.lower()
        if fault.after_head is not None:
            writer.write(_chunked(fault.after_head) if chunked else fault.after_head)
        sent = 0
        malformed_done = False
        while True:
            if chunked:
                size = int((await up_reader.readuntil(b"\r\n")).split(b";")[0], 16)
                data = await up_reader.readexactly(size) if size else b""
                await up_reader.readuntil(b"\r\n")
            else:
                data = await up_reader.read(256)
            if not data:
                if chunked:
                    writer.write(b"0\r\n\r\n")
                    await writer.drain()
                return
            if fault.cut_after_bytes is not None and sent + len(data) >= fault.cut_after_bytes:
                part = data[: fault.cut_after_bytes - sent]
                writer.write(_chunked(part) if chunked and part else part)
                await writer.drain()
                return  # drop both connections mid-stream, no terminating chunk
            if fault.drop_done and data.startswith(b"data: [DONE]"):
                continue
            if fault.before_done is not None and data.startswith(b"data: [DONE]"):
                writer.write(_chunked(fault.before_done) if chunked else fault.before_done)
            writer.write(_chunked(data) if chunked else data)
            sent += len(data)
            if (
                fault.malformed_after_bytes is not None
                and not malformed_done
                and sent >= fault.malformed_after_bytes
            ):
                writer.write(_chunked(MALFORMED_CHUNK) if chunked else MALFORMED_CHUNK)
                malformed_done = True
            await writer.drain()


def _chunked(data: bytes) -> bytes:
    """One HTTP/1.1 chunk."""
    return f"{len(data):x}\r\n".encode() + data + b"\r\n"
