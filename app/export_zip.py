"""Many chats as one zip: for each chat a Markdown file (to read) and a JSON file (the whole tree
and every reply's receipt, what File > Import reads back), in a folder per project, and a
manifest.json saying what the archive holds (app/archive_import.py reads it back).

Member names come from chat and project titles made safe for every file system (app/export.py's
export_file_name) and numbered when two would collide; they never hold "..", a leading "/" or a
backslash, so unpacking the archive with any tool stays inside its folder."""

from __future__ import annotations

import json
import time
import zipfile
from pathlib import Path

from app.export import export_file_name, to_json, to_markdown
from app.export_job import ChatSnapshot, ExportScope, Step

ARCHIVE_FORMAT = "localchat-archive"
ARCHIVE_VERSION = 1
MANIFEST_NAME = "manifest.json"
# Member names are kept well below the 255-byte name limit: "(12)" and ".json" are added after.
MEMBER_STEM_BYTES = 120


def write_zip(
    path: Path, chats: list[ChatSnapshot], scope: ExportScope, step: Step, left_out_empty: int = 0
) -> None:
    """`left_out_empty`: how many chats without messages the caller left out (the manifest's
    "left_out": {"empty_chats": n}, so a reader can tell the archive is not short of chats)."""
    names = _MemberNames()
    entries: list[dict] = []
    total = len(chats)
    step(0, total)
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED) as archive:
        for done, chat in enumerate(chats, start=1):
            base = names.unique(chat.project, chat.conversation.title)
            markdown_name, json_name = base + ".md", base + ".json"
            archive.writestr(markdown_name, to_markdown(chat.conversation, chat.branch))
            archive.writestr(json_name, _chat_json(chat))
            entries.append(
                {
                    "title": chat.conversation.title,
                    "project": chat.project,
                    "markdown": markdown_name,
                    "json": json_name,
                    "messages": len(chat.tree),
                }
            )
            step(done, total)
        manifest = {
            "format": ARCHIVE_FORMAT,
            "version": ARCHIVE_VERSION,
            "app": "LocalChat",
            "exported_at": time.time(),
            "scope": str(scope),
            "counts": {
                "chats": len(entries),
                "messages": sum(e["messages"] for e in entries),
                "projects": len({c.project for c in chats if c.project is not None}),
            },
            "left_out": {"empty_chats": left_out_empty},
            "chats": entries,
        }
        archive.writestr(MANIFEST_NAME, json.dumps(manifest, indent=2, ensure_ascii=False) + "\n")


def _chat_json(chat: ChatSnapshot) -> str:
    """The chat's JSON export (app/export.py) plus its compactions, each covering messages by
    their "id" in the same file (the importer maps those to the new ids)."""
    record = json.loads(to_json(chat.conversation, chat.branch, chat.tree))
    if chat.compactions:
        record["compactions"] = [
            {
                "covered": list(c.covered),
                "summary": c.summary,
                "active": c.active,
                "receipt": c.receipt,
                "created_at": c.created_at,
            }
            for c in chat.compactions
        ]
    return json.dumps(record, indent=2, ensure_ascii=False) + "\n"


class _MemberNames:
    """Unique member names without extension: "Project/Title", "Title (2)", ..."""

    def __init__(self) -> None:
        self.taken: set[str] = {MANIFEST_NAME.removesuffix(".json").casefold()}

    def unique(self, project: str | None, title: str) -> str:
        folder = ""
        if project is not None:
            folder = (export_file_name(project, "", MEMBER_STEM_BYTES).strip() or "project") + "/"
        stem = export_file_name(title, "", MEMBER_STEM_BYTES).strip() or "chat"
        candidate, n = folder + stem, 1
        # casefold: macOS and Windows file systems do not tell "Chat" from "chat"
        while candidate.casefold() in self.taken:
            n += 1
            candidate = f"{folder}{stem} ({n})"
        self.taken.add(candidate.casefold())
        return candidate
