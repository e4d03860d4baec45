"""A tiny real MCP server over stdio, written with the `mcp` SDK, for tests/test_app_mcp_client.py:
one tool per path the client must handle (a result, an error result, a hang, a crash, a huge
result). Run as `python tests/mcp_test_server.py` (stdio) or `... --http PORT` (streamable HTTP
on 127.0.0.1:PORT/mcp)."""

from __future__ import annotations

import os
import sys
import time

import anyio
from mcp.server.fastmcp import FastMCP

server = FastMCP("localchat-test-server")


@server.tool()
def add(a: int, b: int) -> str:
    """Add two integers."""
    return str(a + b)


@server.tool()
def echo(text: str) -> str:
    """Return the text unchanged."""
    return text


@server.tool()
def fail(message: str) -> str:
    """Raise an error with this message (the SDK reports it as an error result)."""
    raise ValueError(message)


@server.tool()
async def hang(seconds: float) -> str:
    """Sleep (the client's timeout or cancel must fire first). Async, so the server still reads
    its stdin and exits as soon as the client closes it."""
    await anyio.sleep(seconds)
    return "woke up"


@server.tool()
def hang_blocking(seconds: float) -> str:
    """Sleep in the server's event loop: a server stuck in a call, which reads nothing until it
    returns, so closing its stdin does not end it (the client must terminate it)."""
    time.sleep(seconds)
    return "woke up"


@server.tool()
def crash(code: int = 3) -> str:
    """Exit the process without answering."""
    print("about to crash on purpose", file=sys.stderr, flush=True)
    os._exit(code)


@server.tool()
def huge(n: int) -> str:
    """A result of n characters."""
    return "x" * n


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--http":
        server.settings.host = "127.0.0.1"
        server.settings.port = int(sys.argv[2])
        server.settings.log_level = "WARNING"
        server.run("streamable-http")
    else:
        server.run("stdio")
