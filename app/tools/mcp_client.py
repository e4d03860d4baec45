"""MCP servers as tools, through the official `mcp` SDK: a stdio server (a command the app
starts) or a streamable-HTTP server (a URL).

    server = McpServer(McpServerConfig(name="files", command=["uvx", "mcp-server-x"]))
    tools = server.start()                    # connect, handshake, list tools (typed errors)
    result = server.call_tool("read", {"path": "a.txt"}, timeout=30, cancel=token)
    server.close()

The SDK is asyncio code whose context managers must open and close in one task, so each server
gets a thread with its own event loop and one long-lived task that holds the transport and the
session; calls from any thread are handed to that loop and waited for with a deadline, checking
the cancel token (Stop) every 50 ms. Nothing here imports Qt.

Failures, each a type in app/tools/errors.py with a message naming the server and the tool:
McpConnectError (cannot start, handshake fails or times out), McpServerCrashed (the process
exited or the connection dropped; its last stderr lines are quoted), McpTimeout (no answer in
time: the call is abandoned and the server told so), McpErrorResult (the tool reported an
error), McpResultTooLarge (more than MAX_RESULT_CHARS of content: dropped, so one call cannot
flood the model's context or the conversation database), ToolCancelled (Stop).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import tempfile
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from app.tools.errors import (
    McpConnectError,
    McpErrorResult,
    McpResultTooLarge,
    McpServerCrashed,
    McpTimeout,
    ToolError,
)
from app.tools.result import ToolResult

MAX_RESULT_CHARS = 100_000  # ~25k tokens: more than a small model's whole context
DEFAULT_CALL_TIMEOUT_S = 60.0
DEFAULT_CONNECT_TIMEOUT_S = 20.0
_POLL_S = 0.05
_STDERR_TAIL_CHARS = 600


class ToolCancelled(ToolError):
    """The user stopped the reply while the tool was running."""


@dataclass(frozen=True)
class McpServerConfig:
    name: str  # the user's label for the server
    command: Sequence[str] = ()  # stdio: program and arguments
    url: str | None = None  # streamable HTTP endpoint, e.g. http://127.0.0.1:8000/mcp
    env: dict[str, str] | None = None  # extra environment for a stdio server
    headers: dict[str, str] | None = None  # for an HTTP server (e.g. an Authorization token)
    connect_timeout_s: float = DEFAULT_CONNECT_TIMEOUT_S
    call_timeout_s: float = DEFAULT_CALL_TIMEOUT_S

    def __post_init__(self) -> None:
        if bool(self.command) == bool(self.url):
            raise ValueError(f"MCP server {self.name!r}: give either a command or a URL")


@dataclass(frozen=True)
class McpTool:
    server: str
    name: str
    description: str
    input_schema: dict = field(default_factory=dict)

    def schema(self) -> dict:
        """The OpenAI function tool for GenerationRequest.tools."""
        parameters = dict(self.input_schema or {"type": "object", "properties": {}})
        parameters.setdefault("type", "object")
        return {
            "type": "function",
            "function": {
                "name": self.name,
                "description": self.description,
                "parameters": parameters,
            },
        }


class McpServer:
    def __init__(self, config: McpServerConfig):
        self.config = config
        self.tools: list[McpTool] = []
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self._loop.run_forever, name=f"mcp-{config.name}", daemon=True
        )
        self._session: Any = None
        self._stop: asyncio.Event | None = None
        self._runner: concurrent.futures.Future | None = None
        # the server's stderr, quoted in crash messages; closed in close()
        self._stderr = tempfile.TemporaryFile(  # noqa: SIM115
            mode="w+", encoding="utf-8", errors="replace"
        )
        self._closed = False

    # --- lifecycle ---------------------------------------------------------------------------
    def start(self) -> list[McpTool]:
        """Connect, handshake and list the server's tools (McpConnectError on any failure)."""
        self._thread.start()
        ready: concurrent.futures.Future = concurrent.futures.Future()
        self._runner = asyncio.run_coroutine_threadsafe(self._run(ready), self._loop)
        try:
            ready.result(timeout=self.config.connect_timeout_s)
        except concurrent.futures.TimeoutError:
            self.close()
            raise McpConnectError(
                f"MCP server {self.config.name!r} did not finish the handshake within "
                f"{self.config.connect_timeout_s:g} s{self._stderr_note()}"
            ) from None
        except Exception as exc:
            note = self._stderr_note()
            self.close()
            raise McpConnectError(
                f"MCP server {self.config.name!r} could not be started: {_describe(exc)}{note}"
            ) from None
        self.tools = self._wait(
            self._list_tools(), self.config.connect_timeout_s, None, "listing tools"
        )
        return self.tools

    def close(self) -> None:
        """Stop the session and the server process (idempotent)."""
        if self._closed:
            return
        self._closed = True
        if self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
        if self._runner is not None:
            with contextlib.suppress(Exception):
                self._runner.result(timeout=10)
        if self._thread.is_alive():
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=10)
        if not self._loop.is_running():
            self._loop.close()
        self._stderr.close()

    def __enter__(self) -> McpServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- calls -------------------------------------------------------------------------------
    def call_tool(
        self, name: str, arguments: dict, timeout: float | None = None, cancel: Any = None
    ) -> ToolResult:
        """Run one tool; -> its text result, or a typed ToolError naming what went wrong."""
        limit = self.config.call_timeout_s if timeout is None else timeout
        result = self._wait(self._session_call(name, arguments), limit, cancel, f"running {name!r}")
        text = _result_text(result)
        if len(text) > MAX_RESULT_CHARS:
            raise McpResultTooLarge(
                f"{self._label(name)} returned {len(text):,} characters, more than the limit of "
                f"{MAX_RESULT_CHARS:,}; the result was not passed to the model"
            )
        if getattr(result, "isError", False):
            raise McpErrorResult(f"{self._label(name)} reported an error: {text or '(no message)'}")
        return ToolResult(text)

    # --- inside the loop -----------------------------------------------------------------------
    async def _run(self, ready: concurrent.futures.Future) -> None:
        from mcp import ClientSession

        self._stop = asyncio.Event()
        try:
            async with contextlib.AsyncExitStack() as stack:
                read, write = await stack.enter_async_context(self._transport())
                session = await stack.enter_async_context(ClientSession(read, write))
                await session.initialize()
                self._session = session
                ready.set_result(True)
                await self._stop.wait()
        except BaseException as exc:  # the SDK raises ExceptionGroups from its task groups
            if not ready.done():
                ready.set_exception(exc if isinstance(exc, Exception) else RuntimeError(str(exc)))
            elif not isinstance(exc, (Exception, asyncio.CancelledError)):
                raise
        finally:
            self._session = None

    def _transport(self):
        if self.config.url:
            import httpx
            from mcp.client.streamable_http import streamable_http_client

            @contextlib.asynccontextmanager
            async def http():
                timeout = httpx.Timeout(30.0, read=self.config.call_timeout_s + 5.0)
                async with (
                    httpx.AsyncClient(headers=self.config.headers, timeout=timeout) as client,
                    streamable_http_client(self.config.url, http_client=client) as (read, write, _),
                ):
                    yield read, write

            return http()
        from mcp import StdioServerParameters
        from mcp.client.stdio import stdio_client

        program, *args = list(self.config.command)
        params = StdioServerParameters(command=program, args=args, env=self.config.env)
        return stdio_client(params, errlog=self._stderr)

    async def _list_tools(self) -> list[McpTool]:
        session = self._require_session()
        tools: list[McpTool] = []
        cursor = None
        while True:
            page = await session.list_tools(cursor)
            for tool in page.tools:
                tools.append(
                    McpTool(
                        self.config.name,
                        tool.name,
                        tool.description or "",
                        dict(tool.inputSchema or {}),
                    )
                )
            cursor = page.nextCursor
            if not cursor:
                return tools

    async def _session_call(self, name: str, arguments: dict):
        return await self._require_session().call_tool(name, arguments)

    def _require_session(self):
        if self._session is None:
            raise McpServerCrashed(
                f"MCP server {self.config.name!r} is not running{self._stderr_note()}"
            )
        return self._session

    # --- waiting from the caller's thread ------------------------------------------------------
    def _wait(self, coroutine, timeout: float, cancel: Any, what: str):
        if self._closed or not self._thread.is_alive():
            coroutine.close()
            raise McpServerCrashed(f"MCP server {self.config.name!r} is closed")
        future = asyncio.run_coroutine_threadsafe(coroutine, self._loop)
        deadline = time.monotonic() + timeout
        while True:
            try:
                return future.result(timeout=_POLL_S)
            except concurrent.futures.TimeoutError:
                pass
            except (concurrent.futures.CancelledError, asyncio.CancelledError):
                raise ToolCancelled(
                    f"{what} on MCP server {self.config.name!r} was stopped"
                ) from None
            except ToolError:
                raise
            except Exception as exc:
                raise self._failure(exc, what) from None
            if cancel is not None and getattr(cancel, "cancelled", False):
                future.cancel()
                raise ToolCancelled(f"{what} on MCP server {self.config.name!r} was stopped")
            if self._runner is not None and self._runner.done():
                future.cancel()
                raise McpServerCrashed(
                    f"MCP server {self.config.name!r} stopped while {what}{self._stderr_note()}"
                )
            if time.monotonic() >= deadline:
                future.cancel()
                raise McpTimeout(
                    f"MCP server {self.config.name!r} did not answer within {timeout:g} s while "
                    f"{what}; the call was abandoned"
                )

    def _failure(self, exc: Exception, what: str) -> ToolError:
        from mcp.shared.exceptions import McpError
        from mcp.types import CONNECTION_CLOSED

        if isinstance(exc, McpError) and exc.error.code == CONNECTION_CLOSED:
            return McpServerCrashed(
                f"MCP server {self.config.name!r} exited or closed the connection while {what}"
                f"{self._stderr_note()}"
            )
        if isinstance(exc, McpError):
            return McpErrorResult(
                f"MCP server {self.config.name!r} refused {what}: {exc.error.message}"
            )
        return McpServerCrashed(
            f"MCP server {self.config.name!r} failed while {what}: {_describe(exc)}{self._stderr_note()}"
        )

    def _label(self, name: str) -> str:
        return f"tool {name!r} of MCP server {self.config.name!r}"

    def _stderr_note(self) -> str:
        try:
            self._stderr.flush()
            self._stderr.seek(0)
            tail = self._stderr.read()[-_STDERR_TAIL_CHARS:].strip()
        except (OSError, ValueError):
            return ""
        return f" (its last output: {tail})" if tail else ""


def _describe(exc: BaseException) -> str:
    """One line for an exception, looking inside the SDK's exception groups."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__


def _result_text(result) -> str:
    parts = []
    for item in getattr(result, "content", None) or []:
        kind = getattr(item, "type", "")
        if kind == "text":
            parts.append(item.text)
        elif kind in ("image", "audio"):
            parts.append(f"[{kind}: {getattr(item, 'mimeType', 'unknown type')}]")
        elif kind == "resource":
            resource = item.resource
            parts.append(getattr(resource, "text", None) or f"[resource {resource.uri}]")
        elif kind == "resource_link":
            parts.append(f"[resource {item.uri}]")
    if not parts and getattr(result, "structuredContent", None) is not None:
        import json

        parts.append(json.dumps(result.structuredContent))
    return "\n".join(parts)
