"""The server on a background thread, for a program that already has the model loaded (the
desktop app's "Serve this model").

    server = BackgroundServer(lm, scheduler, port=8080)   # binds now: OSError if the port is taken
    server.url                                             # http://127.0.0.1:8080/v1
    server.status()                                        # plain numbers, safe from any thread
    server.stop()                                          # cancels its requests, joins the thread

The caller owns the scheduler (the app sends its own chat through the same one, so every forward
pass of the model runs on the scheduler's thread) and closes it after `stop()`. Loopback only
unless an API key is given, as for `python -m engine serve`.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any

from engine.events import PrefillProgress
from engine.model_protocol import LanguageModel
from engine.server.app import LocalChatServer, ServerOptions
from engine.server.serve import RunningServer

STOP_JOIN_SECONDS = 30.0


@dataclass(frozen=True)
class ServerStatus:
    """What a status line shows."""

    url: str
    running: int  # requests being decoded now (HTTP clients and the app's own chat)
    queued: int
    http_requests: int  # HTTP requests in flight (running or queued)
    kv_bytes_reserved: int
    kv_budget_bytes: int
    prefills: tuple[PrefillProgress, ...] = ()  # running requests whose prompt is being read


class BackgroundServer:
    def __init__(
        self,
        lm: LanguageModel,
        scheduler: Any,
        *,
        host: str = "127.0.0.1",
        port: int = 8080,
        api_key: str | None = None,
        model_id: str | None = None,
    ) -> None:
        self.scheduler = scheduler
        options = ServerOptions(model_id=model_id or lm.path.stem, api_key=api_key)
        self._server = LocalChatServer(lm, scheduler, options)
        self._ready = threading.Event()
        self._running = RunningServer(
            self._server, host, port, on_ready=lambda url: self._ready.set()
        )
        self.url = self._running.url
        self._failure: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="localchat-http", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            self._running.run()
        except BaseException as exc:  # reported by wait_ready(); the thread must not die silently
            self._failure = exc
        finally:
            self._ready.set()

    def wait_ready(self, timeout: float | None = None) -> bool:
        """True once connections are accepted; raises what stopped the server from starting."""
        ready = self._ready.wait(timeout)
        if self._failure is not None:
            raise self._failure
        return ready

    def status(self) -> ServerStatus:
        stats = self.scheduler.stats()
        return ServerStatus(
            url=self.url,
            running=stats.running,
            queued=stats.queued,
            http_requests=self._server.in_flight(),
            kv_bytes_reserved=stats.kv_bytes_reserved,
            kv_budget_bytes=stats.kv_budget_bytes,
            prefills=self.scheduler.prefills(),
        )

    def stop(self) -> None:
        """Stop accepting, cancel the HTTP requests in flight (each ends within a decode step),
        and wait for the server thread. The scheduler stays open for its owner."""
        self._running.stop()
        self._server.cancel_all()
        self._thread.join(STOP_JOIN_SECONDS)
