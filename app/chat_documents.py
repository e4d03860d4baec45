"""Which document collection each chat uses, and its retrieval settings, in a small JSON file
beside the chat database (chat_documents.json).

A file of its own rather than a column in the chat database: the collection is a feature's
setting on a chat, like a sidebar preference, and keeping it apart leaves the chat schema (and
its migrations) alone. Entries are keyed by the chat's id AND its creation time, so a chat that
gets the id of a deleted one (SQLite reuses the highest id) does not inherit its documents.
Writes go through a temp file and os.replace, so a kill mid-write never leaves half a file.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, replace
from pathlib import Path

# the light module: this file is read while the window opens, before numpy loads
from engine.documents.defaults import DEFAULT_BUDGET_TOKENS, DEFAULT_TOP_K

BUDGET_RANGE = (64, 32_768)  # tokens of the prompt the sources may take
TOP_K_RANGE = (1, 50)


@dataclass(frozen=True)
class ChatDocumentSettings:
    collection: str
    budget_tokens: int = DEFAULT_BUDGET_TOKENS
    top_k: int = DEFAULT_TOP_K

    def clamped(self) -> ChatDocumentSettings:
        return replace(
            self,
            budget_tokens=max(BUDGET_RANGE[0], min(int(self.budget_tokens), BUDGET_RANGE[1])),
            top_k=max(TOP_K_RANGE[0], min(int(self.top_k), TOP_K_RANGE[1])),
        )


class ChatDocumentsFile:
    def __init__(self, path: Path):
        self.path = path
        self.problem: str | None = None  # why the file could not be read or written, for the user
        self._entries: dict[str, dict] = self._read()

    @staticmethod
    def key(conversation_id: int, created_at: float) -> str:
        return f"{conversation_id}@{created_at!r}"

    def get(self, key: str) -> ChatDocumentSettings | None:
        raw = self._entries.get(key)
        if not isinstance(raw, dict) or not isinstance(raw.get("collection"), str):
            return None
        try:
            return ChatDocumentSettings(
                raw["collection"],
                int(raw.get("budget_tokens", DEFAULT_BUDGET_TOKENS)),
                int(raw.get("top_k", DEFAULT_TOP_K)),
            ).clamped()
        except (TypeError, ValueError):
            return None

    def set(self, key: str, settings: ChatDocumentSettings | None) -> bool:
        if settings is None:
            self._entries.pop(key, None)
        else:
            self._entries[key] = asdict(settings.clamped())
        return self._write()

    def _read(self) -> dict[str, dict]:
        try:
            raw = json.loads(self.path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            return {}
        except (OSError, ValueError) as exc:
            self.problem = f"{self.path} cannot be read ({exc}); chats start without documents"
            return {}
        return raw if isinstance(raw, dict) else {}

    def _write(self) -> bool:
        tmp = self.path.with_suffix(".tmp")
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            tmp.write_text(json.dumps(self._entries, indent=1), encoding="utf-8")
            os.replace(tmp, self.path)
        except OSError as exc:
            self.problem = f"{self.path} could not be saved: {exc}"
            return False
        self.problem = None
        return True
