"""Export a conversation to Markdown (for reading) or JSON (for tools), and write it off the GUI
thread through asyncio (qasync runs the loop on the Qt event loop in app/__main__.py).

Markdown holds the visible branch. JSON (format version 2) holds the whole tree: every version
of every message with its `id` and `parent_id`, `branch` lists the ids of the visible branch,
and each reply carries its receipt (how it was produced, for replay on another machine)."""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path

from app.finish_reasons import end_note
from app.store import Conversation, StoredMessage
from engine.types import MessageStatus, Role

EXPORT_FORMAT_VERSION = 2  # 2: the tree (id, parent_id, branch) and receipts
ROLE_TITLES: dict[str, str] = {
    Role.SYSTEM: "System",
    Role.USER: "You",
    Role.ASSISTANT: "Assistant",
    Role.TOOL: "Tool",
}  # also on screen
# POSIX file systems (ext4, btrfs, APFS, NTFS via the OS) limit a name to 255 bytes, not
# characters: a title of 200 accented letters is 400 bytes and the write fails.
DEFAULT_NAME_MAX = 255


def name_max(directory: Path) -> int:
    """The longest file name, in bytes, that `directory`'s file system accepts."""
    try:
        return os.pathconf(directory, "PC_NAME_MAX")
    except (AttributeError, OSError, ValueError):
        return DEFAULT_NAME_MAX


def truncate_file_name(name: str, limit: int = DEFAULT_NAME_MAX) -> str:
    """`name` cut to at most `limit` UTF-8 bytes, keeping its extension and never splitting a
    character."""
    if len(name.encode("utf-8")) <= limit:
        return name
    stem, dot, extension = name.rpartition(".")
    if not dot or not stem or len(extension.encode("utf-8")) > 16:
        stem, extension = name, ""
    suffix = ("." + extension) if extension else ""
    room = limit - len(suffix.encode("utf-8"))
    # errors="ignore" drops the partial character left at the cut.
    cut = stem.encode("utf-8")[:room].decode("utf-8", errors="ignore").rstrip()
    return cut + suffix


def export_file_name(title: str, extension: str = ".md", limit: int = DEFAULT_NAME_MAX) -> str:
    """A file name suggested for exporting a chat titled `title`: letters, digits, spaces, - and
    _ kept, everything else (path separators included) replaced, within the byte limit."""
    stem = "".join(ch if ch.isalnum() or ch in " -_" else "_" for ch in title).strip() or "chat"
    return truncate_file_name(stem + extension, limit)


def safe_export_path(path: Path) -> Path:
    """`path` with its last component truncated to what its directory's file system accepts."""
    path = Path(path)
    return path.with_name(truncate_file_name(path.name, name_max(path.parent)))


def to_markdown(conversation: Conversation, messages: list[StoredMessage]) -> str:
    lines = [f"# {conversation.title}", ""]
    if conversation.system_prompt:
        lines += ["**System prompt:**", "", conversation.system_prompt, ""]
    for m in messages:
        heading = f"## {ROLE_TITLES.get(m.role, m.role)}"
        # how the reply ended, when not cleanly: the same words as its header in the window
        if m.role == Role.ASSISTANT:
            note = end_note(m.status, m.finish_reason, m.usage)
        else:
            note = "" if m.status == MessageStatus.COMPLETE else str(m.status)
        if note:
            heading += f" ({note})"
        lines += [heading, ""]
        if m.reasoning:
            quoted = "\n".join("> " + line for line in m.reasoning.splitlines())
            lines += ["<details><summary>Reasoning</summary>", "", quoted, "", "</details>", ""]
        if m.role == Role.TOOL and m.tool:
            lines += _tool_markdown(m)
            continue
        lines += [m.content, ""]
        for call in m.tool_calls:
            function = call.get("function", {})
            lines += [f"**Tool call** `{function.get('name')}`", "", "```json"]
            lines += [_pretty_arguments(function.get("arguments")), "```", ""]
        for bad in (m.tool or {}).get("malformed") or []:
            lines += [
                f"**Malformed tool call** `{bad.get('name')}` (not run): {bad.get('problem')}",
                "",
            ]
    return "\n".join(lines).rstrip() + "\n"


def _pretty_arguments(arguments) -> str:
    try:
        return json.dumps(json.loads(arguments), indent=2, ensure_ascii=False)
    except (TypeError, ValueError):
        return str(arguments)


def _tool_markdown(m: StoredMessage) -> list[str]:
    tool = m.tool or {}
    note = f"`{tool.get('name')}` ({tool.get('approval')}"
    note += f", {tool['error']})" if tool.get("error") else ")"
    fence = "````" if "```" in m.content else "```"
    return [
        f"Result of {note}:",
        "",
        "<details><summary>Result</summary>",
        "",
        fence,
        m.content,
        fence,
        "",
        "</details>",
        "",
    ]


def to_json(
    conversation: Conversation,
    messages: list[StoredMessage],
    tree: list[StoredMessage] | None = None,
) -> str:
    """`messages` is the visible branch; `tree` every message of the chat (default: the branch)."""
    record = {
        "format": "localchat-conversation",
        "version": EXPORT_FORMAT_VERSION,
        "title": conversation.title,
        "system_prompt": conversation.system_prompt,
        "created_at": conversation.created_at,
        "branch": [m.id for m in messages],
        "messages": [
            {
                "id": m.id,
                "parent_id": m.parent_id,
                "role": m.role,
                "content": m.content,
                "reasoning": m.reasoning,
                "status": m.status,
                "finish_reason": m.finish_reason,
                "usage": m.usage,
                "json_mode": m.json_mode,
                "created_at": m.created_at,
                "receipt": m.receipt,
                "tool": m.tool,  # tool_calls (OpenAI shape) or a tool result's call id/approval
            }
            for m in (tree if tree is not None else messages)
        ],
    }
    return json.dumps(record, indent=2, ensure_ascii=False) + "\n"


def render_export(
    path: Path,
    conversation: Conversation,
    messages: list[StoredMessage],
    tree: list[StoredMessage] | None = None,
) -> str:
    """JSON (the whole `tree` when given) when the file name ends in .json, Markdown (the visible
    branch, `messages`) otherwise."""
    if Path(path).suffix.lower() == ".json":
        return to_json(conversation, messages, tree)
    return to_markdown(conversation, messages)


async def write_export(
    path: Path,
    conversation: Conversation,
    messages: list[StoredMessage],
    tree: list[StoredMessage] | None = None,
) -> Path:
    path = safe_export_path(path)
    text = render_export(path, conversation, messages, tree)
    await asyncio.to_thread(path.write_text, text, encoding="utf-8")
    return path
