"""Start the server: check the bind address, listen, run uvicorn until Ctrl-C (or `stop()`).

Security defaults: loopback only unless an API key is given (`check_bind`), Host and Origin
checked (engine.server.access), a request body limit (engine.server.app.DEFAULT_MAX_BODY_BYTES),
and for connections (`GuardedH11Protocol`): at most `max_connections` open at once (more are
answered 503 and closed at once), and a request whose headers and body have not arrived within
`request_timeout_s` of its first byte (or of the connection opening) is answered 408 and closed;
uvicorn alone holds a half-sent request open forever.

The socket is bound here rather than by uvicorn, so a port in use is an OSError the CLI reports in
one line, port 0 picks a free port, and the "ready" callback receives the real URL once the
server accepts connections.
"""

from __future__ import annotations

import asyncio
import ipaddress
import json
import socket
from collections.abc import Callable
from typing import Any

import h11
import uvicorn
from uvicorn.protocols.http.h11_impl import H11Protocol

from engine.errors import ConfigValidationError
from engine.server.api_errors import error_body
from engine.server.app import LocalChatServer, build_app

SHUTDOWN_GRACE_S = 5.0  # in-flight requests are cancelled first, so they end within a step


def is_loopback(host: str) -> bool:
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:  # a host name: it may resolve to anything
        return False


def check_bind(host: str, api_key: str | None) -> None:
    """Refuse to listen beyond this machine without an API key."""
    if api_key is not None and not api_key.strip():
        raise ConfigValidationError("--api-key", api_key, "a non-empty key")
    if not is_loopback(host) and not api_key:
        raise ConfigValidationError(
            "--host",
            host,
            "a loopback address (127.0.0.1, ::1, localhost) unless --api-key KEY is given: "
            "anyone who can reach the port could use the model",
        )


MAX_CONNECTIONS_LIMIT = 10_000
MAX_REQUEST_TIMEOUT_S = 3600.0


def check_limits(max_connections: int, request_timeout_s: float) -> None:
    if not 1 <= max_connections <= MAX_CONNECTIONS_LIMIT:
        raise ConfigValidationError(
            "--max-connections", max_connections, f"an integer in [1, {MAX_CONNECTIONS_LIMIT}]"
        )
    if not 0 < request_timeout_s <= MAX_REQUEST_TIMEOUT_S:  # also refuses NaN
        raise ConfigValidationError(
            "--request-timeout", request_timeout_s, f"seconds in (0, {MAX_REQUEST_TIMEOUT_S:g}]"
        )


def bind(host: str, port: int) -> socket.socket:
    """A listening socket on host:port (port 0: a free port)."""
    if not 0 <= port <= 65535:
        raise ConfigValidationError("--port", port, "an integer in [0, 65535]")
    family, kind, proto, _, address = socket.getaddrinfo(
        host.strip("[]"), port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
    )[0]
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
        sock.listen(128)
    except OSError:
        sock.close()
        raise
    sock.setblocking(False)
    return sock


def url_of(sock: socket.socket, host: str) -> str:
    port = sock.getsockname()[1]
    shown = host.strip("[]")
    if ":" in shown:
        shown = f"[{shown}]"
    return f"http://{shown}:{port}/v1"


def raw_response(status: int, reason: str, message: str, code: str) -> bytes:
    """A whole HTTP/1.1 error response that closes the connection, written before any request
    was parsed (so not through h11's state machine, which has no request to answer)."""
    body = json.dumps(error_body(message, code=code)).encode("utf-8")
    head = (
        f"HTTP/1.1 {status} {reason}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
    )
    return head.encode("ascii") + body


class GuardedH11Protocol(H11Protocol):
    """uvicorn's HTTP/1.1 protocol with a cap on open connections and a deadline for each
    request to arrive. The limits are class attributes set by `guarded_protocol`."""

    max_connections: int
    request_timeout_s: float

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._deadline: asyncio.TimerHandle | None = None
        self._deferred = False  # the body deadline was left to the app once
        self._bytes_seen = False  # some of the current request arrived

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        if len(self.connections) > self.max_connections:
            transport.write(
                raw_response(
                    503,
                    "Service Unavailable",
                    f"This server has {self.max_connections} connections open, its limit; "
                    "try again when one closes",
                    "too_many_connections",
                )
            )
            transport.close()
            return
        self._arm()

    def data_received(self, data: bytes) -> None:
        if self.conn.their_state is h11.IDLE and data:
            self._bytes_seen = True
        super().data_received(data)
        if self.conn.their_state in (h11.IDLE, h11.SEND_BODY):
            if self._deadline is None:  # the next request on a kept-alive connection
                self._arm()
        else:  # received whole (or the connection is done): the app has it, no deadline
            self._disarm()
            self._bytes_seen = False

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def _arm(self) -> None:
        self._disarm()
        self._deferred = False
        self._deadline = self.loop.call_later(self.request_timeout_s, self._expired)

    def _disarm(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None

    def _expired(self) -> None:
        self._deadline = None
        if self.transport.is_closing():
            return
        waiting_for_headers = self.conn.their_state is h11.IDLE and self.conn.our_state is h11.IDLE
        if waiting_for_headers:
            if self._bytes_seen:  # a connection that sent nothing is closed without a word
                self.transport.write(
                    raw_response(
                        408,
                        "Request Timeout",
                        f"The request's headers did not arrive within {self.request_timeout_s:g} s",
                        "request_timeout",
                    )
                )
        elif (
            self.conn.their_state is h11.SEND_BODY
            and self.cycle is not None
            and not self.cycle.response_started
            and not self._deferred
        ):
            # the app is reading the body under the same deadline and answers 408 itself;
            # this timer only closes the connection if it has not done so a timeout later
            self._deferred = True
            self._deadline = self.loop.call_later(self.request_timeout_s, self._expired)
            return
        self.transport.close()


def guarded_protocol(max_connections: int, request_timeout_s: float) -> type[GuardedH11Protocol]:
    return type(
        "LocalChatH11Protocol",
        (GuardedH11Protocol,),
        {"max_connections": max_connections, "request_timeout_s": request_timeout_s},
    )


class _Uvicorn(uvicorn.Server):
    def __init__(self, config: uvicorn.Config, server: LocalChatServer, on_ready) -> None:
        super().__init__(config)
        self.localchat = server
        self.on_ready = on_ready

    async def startup(self, sockets=None) -> None:
        await super().startup(sockets)
        if self.started and not self.should_exit:
            self.on_ready()

    async def shutdown(self, sockets=None) -> None:
        self.localchat.cancel_all()  # streams end within a decode step instead of at the grace
        await super().shutdown(sockets)


class RunningServer:
    """A bound, configured server; `run()` blocks until `stop()` or Ctrl-C (SIGINT/SIGTERM
    when run on the main thread)."""

    def __init__(
        self,
        server: LocalChatServer,
        host: str,
        port: int,
        on_ready: Callable[[str], None] = lambda url: None,
    ) -> None:
        check_bind(host, server.options.api_key)
        check_limits(server.options.max_connections, server.options.request_timeout_s)
        server.options.bound_host = host  # a Host header may name the address listened on
        self.socket = bind(host, port)
        self.url = url_of(self.socket, host)
        config = uvicorn.Config(
            build_app(server),
            http=guarded_protocol(server.options.max_connections, server.options.request_timeout_s),
            log_level="warning",
            access_log=False,
            lifespan="off",
            timeout_graceful_shutdown=int(SHUTDOWN_GRACE_S),
            # keep-alive connections idle this long are closed
            timeout_keep_alive=5,
        )
        self._uvicorn = _Uvicorn(config, server, lambda: on_ready(self.url))

    def run(self) -> None:
        try:
            self._uvicorn.run(sockets=[self.socket])
        finally:
            self.socket.close()

    def stop(self) -> None:
        """From any thread: stop accepting, cancel what runs, return from run()."""
        self._uvicorn.should_exit = True
