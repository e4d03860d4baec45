"""Export a conversation to Markdown (for reading) or JSON (for tools), and write it off the GUI
thread through asyncio (qasync runs the loop on the Qt event loop in app/__main__.py)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

from app.store import Conversation, StoredMessage
from engine.types import MessageStatus, Role

EXPORT_FORMAT_VERSION = 1
ROLE_TITLES = {
    Role.SYSTEM: "System",
    Role.USER: "You",
    Role.ASSISTANT: "Assistant",
}  # also on screen


def to_markdown(conversation: Conversation, messages: list[StoredMessage]) -> str:
    lines = [f"# {conversation.title}", ""]
    if conversation.system_prompt:
        lines += ["**System prompt:**", "", conversation.system_prompt, ""]
    for m in messages:
        heading = f"## {ROLE_TITLES.get(m.role, m.role)}"
        if m.status != MessageStatus.COMPLETE:
            heading += f" ({m.status})"
        lines += [heading, ""]
        if m.reasoning:
            quoted = "\n".join("> " + line for line in m.reasoning.splitlines())
            lines += ["<details><summary>Reasoning</summary>", "", quoted, "", "</details>", ""]
        lines += [m.content, ""]
    return "\n".join(lines).rstrip() + "\n"


def to_json(conversation: Conversation, messages: list[StoredMessage]) -> str:
    record = {
        "format": "localchat-conversation",
        "version": EXPORT_FORMAT_VERSION,
        "title": conversation.title,
        "system_prompt": conversation.system_prompt,
        "created_at": conversation.created_at,
        "messages": [
            {
                "role": m.role,
                "content": m.content,
                "reasoning": m.reasoning,
                "status": m.status,
                "finish_reason": m.finish_reason,
                "usage": m.usage,
                "json_mode": m.json_mode,
                "created_at": m.created_at,
            }
            for m in messages
        ],
    }
    return json.dumps(record, indent=2, ensure_ascii=False) + "\n"


def render_export(path: Path, conversation: Conversation, messages: list[StoredMessage]) -> str:
    """JSON when the file name ends in .json, Markdown otherwise."""
    if Path(path).suffix.lower() == ".json":
        return to_json(conversation, messages)
    return to_markdown(conversation, messages)


async def write_export(
    path: Path, conversation: Conversation, messages: list[StoredMessage]
) -> Path:
    text = render_export(path, conversation, messages)
    await asyncio.to_thread(Path(path).write_text, text, encoding="utf-8")
    return Path(path)
