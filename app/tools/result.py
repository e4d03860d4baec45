"""What running a tool gives the chat: text for the model (the `role: "tool"` message) and
whether it is an error, in one shape for built-in and MCP tools."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ToolResult:
    text: str  # the content of the {"role": "tool", "tool_call_id": ..., "content": text} message
    is_error: bool = False

    def message(self, tool_call_id: str) -> dict:
        """The chat message that answers the call (engine.types.Role.TOOL)."""
        return {"role": "tool", "tool_call_id": tool_call_id, "content": self.text}
