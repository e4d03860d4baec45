"""ToolRegistry: the tools the app can offer a model — the built-in ones and those of the MCP
servers the user added — and the servers' state (starting, ready, error).

A server starts on its own thread (McpServer.start does the handshake and lists the tools, which
can take seconds or hang); the outcome comes back to the GUI thread over a queued signal, so the
window never waits for a server. Servers are saved in the settings (Settings.mcp_servers).

Tools are named by a key: "builtin:<name>" or "mcp:<server>:<name>". A chat stores the keys it
enabled (Store.chat_tools), so a server that is not running leaves its tools out of the request
instead of failing it.
"""

from __future__ import annotations

import shlex
import threading
from dataclasses import dataclass, field

from PySide6.QtCore import QObject, Signal

from app.settings import Settings, SettingsFile
from app.tools.builtin import BUILTIN_TOOLS
from app.tools.errors import ToolError
from app.tools.mcp_client import McpServer, McpServerConfig, McpTool

STARTING, READY, ERROR = "starting", "ready", "error"


def builtin_key(name: str) -> str:
    return f"builtin:{name}"


def mcp_key(server: str, name: str) -> str:
    return f"mcp:{server}:{name}"


class ServerConfigError(ValueError):
    """The user's server entry cannot be used (no name, a name in use, neither command nor URL)."""


@dataclass
class ServerState:
    config: McpServerConfig
    status: str = STARTING
    message: str = ""  # the error, for the user
    tools: list[McpTool] = field(default_factory=list)
    server: McpServer | None = None


@dataclass(frozen=True)
class OfferedTool:
    key: str
    name: str  # the function name the model sees
    schema: dict  # the OpenAI function tool
    server: str | None  # None for a built-in tool


def parse_server_entry(name: str, target: str) -> dict:
    """A settings entry from what the user typed: a URL (http:// or https://) or a command line."""
    name, target = name.strip(), target.strip()
    if not name:
        raise ServerConfigError("Give the MCP server a name.")
    if ":" in name:
        raise ServerConfigError("An MCP server name cannot contain ':'.")
    if not target:
        raise ServerConfigError("Give the server's command (stdio) or its http:// URL.")
    if target.startswith(("http://", "https://")):
        return {"name": name, "url": target}
    try:
        command = shlex.split(target)
    except ValueError as exc:
        raise ServerConfigError(f"The command cannot be read: {exc}") from None
    return {"name": name, "command": command}


class ToolRegistry(QObject):
    changed = Signal()  # a server was added, removed, or changed state
    serverFailed = Signal(str, str)  # server name, message (it crashed or could not start)
    _started = Signal(str, object, object)  # name, McpServer, list[McpTool] | ToolError (thread)

    def __init__(self, settings: Settings, settings_file: SettingsFile, parent=None):
        super().__init__(parent)
        self.settings, self.settings_file = settings, settings_file
        self.servers: dict[str, ServerState] = {}
        self.call_timeout_s: float | None = None  # None: each server's own (tests shorten it)
        self._started.connect(self._on_started)
        self._closing = False

    # --- servers ---------------------------------------------------------------------------------
    def start_saved(self) -> None:
        for entry in self.settings.mcp_servers:
            self._start(entry)

    def add_server(self, name: str, target: str, **config) -> None:
        """Add, save and start a server (ServerConfigError if the entry cannot be used)."""
        entry = parse_server_entry(name, target)
        if entry["name"] in self.servers:
            raise ServerConfigError(f"There is already an MCP server named {entry['name']!r}.")
        self.settings.mcp_servers.append(entry)
        self.settings_file.save(self.settings)
        self._start(entry, **config)

    def remove_server(self, name: str) -> None:
        state = self.servers.pop(name, None)
        self.settings.mcp_servers = [s for s in self.settings.mcp_servers if s["name"] != name]
        self.settings_file.save(self.settings)
        if state is not None and state.server is not None:
            _close_in_background(state.server)
        self.changed.emit()

    def restart_server(self, name: str) -> None:
        state = self.servers.get(name)
        if state is None or state.status == STARTING:
            return
        if state.server is not None:
            _close_in_background(state.server)
        entry = next((s for s in self.settings.mcp_servers if s["name"] == name), None)
        if entry is not None:
            self._start(entry, connect_timeout_s=state.config.connect_timeout_s)

    def _start(self, entry: dict, **config) -> None:
        cfg = McpServerConfig(
            name=entry["name"],
            command=tuple(entry.get("command") or ()),
            url=entry.get("url"),
            **config,
        )
        self.servers[cfg.name] = ServerState(cfg)
        self.changed.emit()

        def run() -> None:
            server = McpServer(cfg)
            try:
                outcome: object = server.start()
            except ToolError as exc:
                outcome = exc
            except Exception as exc:
                outcome = ToolError(f"MCP server {cfg.name!r} could not be started: {exc}")
            self._started.emit(cfg.name, server, outcome)

        threading.Thread(target=run, name=f"mcp-start-{cfg.name}", daemon=True).start()

    def _on_started(self, name: str, server: McpServer, outcome) -> None:
        state = self.servers.get(name)
        if state is None or state.config is not server.config or self._closing:
            _close_in_background(server)  # removed (or restarted) while it started
            return
        if isinstance(outcome, ToolError):
            state.status, state.message, state.server = ERROR, str(outcome), None
            self.serverFailed.emit(name, str(outcome))
        else:
            state.status, state.message, state.tools, state.server = READY, "", outcome, server
        self.changed.emit()

    def mark_failed(self, name: str, message: str) -> None:
        """A call found the server dead (crashed): show it as an error until restarted."""
        state = self.servers.get(name)
        if state is None or state.status != READY:
            return
        state.status, state.message = ERROR, message
        if state.server is not None:
            _close_in_background(state.server)
            state.server = None
        self.changed.emit()

    def close(self) -> None:
        self._closing = True
        for state in self.servers.values():
            if state.server is not None:
                state.server.close()
                state.server = None

    # --- tools -------------------------------------------------------------------------------
    def available(self) -> list[OfferedTool]:
        """Every tool that can run now: the built-ins, then each ready server's tools. A name
        already taken (two servers with a `search`) keeps its first owner."""
        offered: list[OfferedTool] = []
        names: set[str] = set()
        for tool in BUILTIN_TOOLS.values():
            offered.append(OfferedTool(builtin_key(tool.name), tool.name, tool.schema, None))
            names.add(tool.name)
        for state in self.servers.values():
            if state.status != READY:
                continue
            for mcp_tool in state.tools:
                if mcp_tool.name in names:
                    continue
                names.add(mcp_tool.name)
                key = mcp_key(state.config.name, mcp_tool.name)
                offered.append(
                    OfferedTool(key, mcp_tool.name, mcp_tool.schema(), state.config.name)
                )
        return offered

    def offered(self, enabled_keys) -> list[OfferedTool]:
        keys = set(enabled_keys)
        return [t for t in self.available() if t.key in keys]

    def snapshot(self) -> list[dict]:
        """Plain records for the Tools panel (views do not import app.tools)."""
        rows = []
        for state in self.servers.values():
            cfg = state.config
            rows.append(
                {
                    "name": cfg.name,
                    "target": cfg.url or shlex.join(cfg.command),
                    "status": state.status,
                    "message": state.message,
                    "tools": [
                        {
                            "key": mcp_key(cfg.name, t.name),
                            "name": t.name,
                            "description": t.description,
                        }
                        for t in state.tools
                    ],
                }
            )
        return rows

    def builtin_rows(self) -> list[dict]:
        return [
            {
                "key": builtin_key(t.name),
                "name": t.name,
                "description": t.schema["function"]["description"],
            }
            for t in BUILTIN_TOOLS.values()
        ]


def _close_in_background(server: McpServer) -> None:
    """Closing waits for the process to exit (up to seconds): never on the GUI thread."""
    threading.Thread(target=server.close, name="mcp-close", daemon=True).start()
