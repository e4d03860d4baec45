"""Why a tool call produced no usable result, one type per case the chat shows by name.
`str(error)` is written for the user."""

from __future__ import annotations


class ToolError(Exception):
    """Base of every tool failure; the call's result is then this message, marked as an error."""


class ToolArgumentsError(ToolError):
    """The arguments cannot be used (a calculator expression it refuses, an unknown time zone)."""


class UnknownToolError(ToolError):
    """No enabled tool has this name."""


class McpConnectError(ToolError):
    """The MCP server could not be started or did not complete the handshake."""


class McpServerCrashed(ToolError):
    """The MCP server's process exited (or its connection dropped) before it answered."""


class McpTimeout(ToolError):
    """The MCP server did not answer within the time limit; the call was abandoned."""


class McpErrorResult(ToolError):
    """The MCP tool ran and reported an error (the result has isError set)."""


class McpResultTooLarge(ToolError):
    """The result is larger than the limit a chat can take; it was dropped, not truncated."""
