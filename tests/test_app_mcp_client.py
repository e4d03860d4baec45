"""The MCP client against a real MCP server (tests/mcp_test_server.py, written with the `mcp`
SDK) started over stdio by the test: list tools, a round trip, and the named failures: an
error result, a huge result, a hang (timeout), Stop (cancel) and a crash. A fresh server per
failure that leaves it unusable; the rest share one."""

from __future__ import annotations

import sys
import threading
from pathlib import Path

import pytest

from app.tools.errors import (
    McpConnectError,
    McpErrorResult,
    McpResultTooLarge,
    McpServerCrashed,
    McpTimeout,
)
from app.tools.mcp_client import MAX_RESULT_CHARS, McpServer, McpServerConfig, ToolCancelled

SERVER = [sys.executable, str(Path(__file__).with_name("mcp_test_server.py"))]


def new_server(**kwargs) -> McpServer:
    return McpServer(McpServerConfig(name="test", command=SERVER, **kwargs))


@pytest.fixture(scope="module")
def server():
    with new_server() as started:
        started.start()
        yield started


def test_lists_the_servers_tools_with_their_schemas(server):
    names = {t.name: t for t in server.tools}
    assert {"add", "echo", "fail", "hang", "hang_blocking", "crash", "huge"} <= set(names)
    add = names["add"].schema()["function"]
    assert add["parameters"]["properties"].keys() == {"a", "b"}
    assert add["parameters"]["required"] == ["a", "b"]


def test_round_trip(server):
    assert server.call_tool("add", {"a": 2, "b": 40}).text == "42"
    assert server.call_tool("echo", {"text": "héllo\nwörld"}).text == "héllo\nwörld"


def test_error_result_is_named(server):
    with pytest.raises(McpErrorResult, match="boom"):
        server.call_tool("fail", {"message": "boom"})
    assert server.call_tool("echo", {"text": "still usable"}).text == "still usable"


def test_huge_result_is_refused_not_truncated(server):
    with pytest.raises(McpResultTooLarge, match=f"{MAX_RESULT_CHARS + 1:,} characters"):
        server.call_tool("huge", {"n": MAX_RESULT_CHARS + 1})
    assert len(server.call_tool("huge", {"n": 1000}).text) == 1000


def test_hang_times_out():
    with new_server() as hung:
        hung.start()
        with pytest.raises(McpTimeout, match="within 0.5 s"):
            hung.call_tool("hang_blocking", {"seconds": 20}, timeout=0.5)


def test_stop_cancels_a_running_call():
    class Token:
        cancelled = False

    token = Token()
    with new_server() as busy:
        busy.start()
        threading.Timer(0.3, lambda: setattr(token, "cancelled", True)).start()
        with pytest.raises(ToolCancelled):
            busy.call_tool("hang", {"seconds": 20}, timeout=30, cancel=token)


def test_crash_is_named_with_the_servers_last_words():
    with new_server() as doomed:
        doomed.start()
        with pytest.raises(McpServerCrashed, match="about to crash on purpose"):
            doomed.call_tool("crash", {})
        with pytest.raises(McpServerCrashed):
            doomed.call_tool("echo", {"text": "anyone?"})


def test_a_server_that_cannot_start_is_a_connect_error():
    with pytest.raises(McpConnectError, match="No such file"):
        McpServer(McpServerConfig(name="missing", command=["/nonexistent/server"])).start()


def test_config_needs_exactly_one_transport():
    with pytest.raises(ValueError, match="either a command or a URL"):
        McpServerConfig(name="both", command=["x"], url="http://127.0.0.1:1/mcp")


@pytest.fixture
def http_server_url():
    """The same server over streamable HTTP on a loopback port, stopped after the test."""
    import socket
    import subprocess
    import time

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    process = subprocess.Popen(
        [*SERVER, "--http", str(port)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
                break
            except OSError:
                assert process.poll() is None, "the HTTP test server exited"
                time.sleep(0.1)
        yield f"http://127.0.0.1:{port}/mcp"
    finally:
        process.terminate()
        process.wait(timeout=10)


def test_streamable_http_round_trip_and_error(http_server_url):
    with McpServer(McpServerConfig(name="web", url=http_server_url)) as web:
        assert "add" in {t.name for t in web.start()}
        assert web.call_tool("add", {"a": 20, "b": 22}).text == "42"
        with pytest.raises(McpErrorResult, match="nope"):
            web.call_tool("fail", {"message": "nope"})


def test_an_http_server_that_is_not_there_is_a_connect_error():
    with pytest.raises(McpConnectError, match="connection attempts failed|ConnectError"):
        McpServer(
            McpServerConfig(name="down", url="http://127.0.0.1:9/mcp", connect_timeout_s=5)
        ).start()
