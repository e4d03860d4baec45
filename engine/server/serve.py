"""Start the server: check the bind address, listen, run uvicorn until Ctrl-C (or `stop()`).

Security defaults: loopback only unless an API key is given (`check_bind`), no CORS unless an
origin is named, a request body limit (engine.server.app.DEFAULT_MAX_BODY_BYTES).

The socket is bound here rather than by uvicorn, so a port in use is an OSError the CLI reports in
one line, port 0 picks a free port, and the "ready" callback receives the real URL once the
server accepts connections.
"""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Callable

import uvicorn

from engine.errors import ConfigValidationError
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
        self.socket = bind(host, port)
        self.url = url_of(self.socket, host)
        config = uvicorn.Config(
            build_app(server),
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
