"""Conversations in SQLite: every message is committed the moment it completes, and the reply being
streamed is saved as it grows, so killing the app loses at most the last fraction of a second.

Durability choices:
- WAL journal: a commit is one append to the -wal file; a killed process leaves the database
  consistent and the next open replays the log.
- synchronous=NORMAL: a transaction committed before a *process* kill (SIGKILL, crash) survives;
  only an OS crash or power cut may lose the last commits, which is the usual desktop trade-off.
- autocommit (isolation_level=None): each write is its own transaction, nothing waits for a
  later commit.

Schema versions live in PRAGMA user_version. Version 1 (the first release) stored only
role/content per message; version 2 adds per-conversation system prompts, message status,
reasoning, finish reason, usage and sampled tokens. `_migrate` upgrades in place.
"""

from __future__ import annotations

import json
import sqlite3
import time
from dataclasses import dataclass, field
from pathlib import Path

import platformdirs

from engine.types import MessageStatus

SCHEMA_VERSION = 2
DEFAULT_TITLE = "New chat"

# Message status values (engine/types.py says what each means).
STATUS_COMPLETE = MessageStatus.COMPLETE
STATUS_STREAMING = MessageStatus.STREAMING
STATUS_CANCELLED = MessageStatus.CANCELLED
STATUS_ERROR = MessageStatus.ERROR
STATUS_INTERRUPTED = MessageStatus.INTERRUPTED


@dataclass
class Conversation:
    id: int
    title: str
    system_prompt: str
    created_at: float
    updated_at: float


@dataclass
class StoredMessage:
    id: int
    conversation_id: int
    position: int
    role: str  # "system" | "user" | "assistant"
    content: str
    reasoning: str = ""
    status: str = STATUS_COMPLETE
    finish_reason: str | None = None
    usage: dict | None = None
    tokens: list = field(default_factory=list)  # TokenSampled as dicts, for the token inspector
    json_mode: str = "off"
    created_at: float = 0.0


_SCHEMA_V2 = """
CREATE TABLE conversations (
    id INTEGER PRIMARY KEY,
    title TEXT NOT NULL,
    system_prompt TEXT NOT NULL DEFAULT '',
    created_at REAL NOT NULL,
    updated_at REAL NOT NULL
);
CREATE TABLE messages (
    id INTEGER PRIMARY KEY,
    conversation_id INTEGER NOT NULL REFERENCES conversations(id) ON DELETE CASCADE,
    position INTEGER NOT NULL,
    role TEXT NOT NULL,
    content TEXT NOT NULL,
    reasoning TEXT NOT NULL DEFAULT '',
    status TEXT NOT NULL DEFAULT 'complete',
    finish_reason TEXT,
    usage_json TEXT,
    tokens_json TEXT,
    json_mode TEXT NOT NULL DEFAULT 'off',
    created_at REAL NOT NULL
);
CREATE INDEX messages_by_conversation ON messages(conversation_id, position);
"""

# Version 1 as it shipped; kept so tests can build an old database and migrations stay honest.
SCHEMA_V1 = """
CREATE TABLE conversations (
    id INTEGER PRIMARY KEY,
    title TEXT NOT NULL,
    created_at REAL NOT NULL
);
CREATE TABLE messages (
    id INTEGER PRIMARY KEY,
    conversation_id INTEGER NOT NULL REFERENCES conversations(id) ON DELETE CASCADE,
    role TEXT NOT NULL,
    content TEXT NOT NULL,
    created_at REAL NOT NULL
);
PRAGMA user_version = 1;
"""


def default_db_path() -> Path:
    return Path(platformdirs.user_data_dir("LocalChat", appauthor=False)) / "chats.sqlite3"


class StoreError(Exception):
    """The conversation database cannot be opened or is from a newer version of the app."""


class Store:
    def __init__(self, path: Path | str | None = None):
        self.path = Path(path) if path is not None else default_db_path()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        # check_same_thread=False: the store is only used from the GUI thread, but pytest-qt and
        # qasync may call in from a helper thread; sqlite3 itself serialises access.
        self._db = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
        self._db.row_factory = sqlite3.Row
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=NORMAL")
        self._db.execute("PRAGMA foreign_keys=ON")
        self._migrate()
        # A reply that was streaming when the app died is kept, marked so the user can see why
        # it stops mid-sentence.
        self._db.execute(
            "UPDATE messages SET status=? WHERE status=?", (STATUS_INTERRUPTED, STATUS_STREAMING)
        )

    # --- schema ---------------------------------------------------------------------------------
    @property
    def schema_version(self) -> int:
        return self._db.execute("PRAGMA user_version").fetchone()[0]

    def _migrate(self) -> None:
        version = self.schema_version
        if version > SCHEMA_VERSION:
            raise StoreError(
                f"{self.path} has schema version {version}; this app reads versions up to "
                f"{SCHEMA_VERSION}. Update LocalChat or choose another data directory."
            )
        if version == 0:
            has_tables = self._db.execute(
                "SELECT count(*) FROM sqlite_master WHERE type='table'"
            ).fetchone()[0]
            if has_tables:
                raise StoreError(f"{self.path} is not a LocalChat database (no schema version).")
            # executescript would commit on its own; statements one by one keep it atomic.
            with self._transaction():
                for statement in _statements(_SCHEMA_V2):
                    self._db.execute(statement)
                self._db.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
            return
        if version == 1:
            self._migrate_1_to_2()

    def _migrate_1_to_2(self) -> None:
        with self._transaction():
            self._db.execute(
                "ALTER TABLE conversations ADD COLUMN system_prompt TEXT NOT NULL DEFAULT ''"
            )
            self._db.execute(
                "ALTER TABLE conversations ADD COLUMN updated_at REAL NOT NULL DEFAULT 0"
            )
            self._db.execute("UPDATE conversations SET updated_at = created_at")
            for column in (
                "position INTEGER NOT NULL DEFAULT 0",
                "reasoning TEXT NOT NULL DEFAULT ''",
                "status TEXT NOT NULL DEFAULT 'complete'",
                "finish_reason TEXT",
                "usage_json TEXT",
                "tokens_json TEXT",
                "json_mode TEXT NOT NULL DEFAULT 'off'",
            ):
                self._db.execute(f"ALTER TABLE messages ADD COLUMN {column}")
            # Version 1 ordered messages by id; positions keep that order per conversation.
            self._db.execute(
                "UPDATE messages SET position = (SELECT count(*) FROM messages AS earlier "
                "WHERE earlier.conversation_id = messages.conversation_id AND earlier.id < messages.id)"
            )
            self._db.execute(
                "CREATE INDEX messages_by_conversation ON messages(conversation_id, position)"
            )
            self._db.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")

    def _transaction(self):
        return _Transaction(self._db)

    def close(self) -> None:
        self._db.close()

    def integrity_check(self) -> str:
        return self._db.execute("PRAGMA integrity_check").fetchone()[0]

    # --- conversations --------------------------------------------------------------------------
    def create_conversation(self, title: str = DEFAULT_TITLE, system_prompt: str = "") -> int:
        now = time.time()
        cur = self._db.execute(
            "INSERT INTO conversations(title, system_prompt, created_at, updated_at) VALUES (?,?,?,?)",
            (title, system_prompt, now, now),
        )
        return cur.lastrowid

    def conversation(self, conversation_id: int) -> Conversation | None:
        row = self._db.execute(
            "SELECT id, title, system_prompt, created_at, updated_at FROM conversations WHERE id=?",
            (conversation_id,),
        ).fetchone()
        return Conversation(**dict(row)) if row else None

    def list_conversations(self, search: str = "") -> list[Conversation]:
        """Newest first. `search` matches titles and message text, case-insensitively."""
        sql = "SELECT id, title, system_prompt, created_at, updated_at FROM conversations"
        args: tuple = ()
        if search.strip():
            pattern = "%" + _escape_like(search.strip()) + "%"
            sql += (
                " WHERE title LIKE ? ESCAPE '\\' OR id IN (SELECT conversation_id FROM messages"
                " WHERE content LIKE ? ESCAPE '\\')"
            )
            args = (pattern, pattern)
        sql += " ORDER BY updated_at DESC, id DESC"
        return [Conversation(**dict(r)) for r in self._db.execute(sql, args)]

    def rename_conversation(self, conversation_id: int, title: str) -> None:
        self._db.execute(
            "UPDATE conversations SET title=?, updated_at=? WHERE id=?",
            (title.strip() or DEFAULT_TITLE, time.time(), conversation_id),
        )

    def set_system_prompt(self, conversation_id: int, system_prompt: str) -> None:
        self._db.execute(
            "UPDATE conversations SET system_prompt=? WHERE id=?", (system_prompt, conversation_id)
        )

    def delete_conversation(self, conversation_id: int) -> None:
        self._db.execute("DELETE FROM conversations WHERE id=?", (conversation_id,))

    def _touch(self, conversation_id: int) -> None:
        self._db.execute(
            "UPDATE conversations SET updated_at=? WHERE id=?", (time.time(), conversation_id)
        )

    # --- messages -------------------------------------------------------------------------------
    def messages(self, conversation_id: int) -> list[StoredMessage]:
        rows = self._db.execute(
            "SELECT * FROM messages WHERE conversation_id=? ORDER BY position, id",
            (conversation_id,),
        ).fetchall()
        return [_message_from_row(r) for r in rows]

    def message(self, message_id: int) -> StoredMessage | None:
        row = self._db.execute("SELECT * FROM messages WHERE id=?", (message_id,)).fetchone()
        return _message_from_row(row) if row else None

    def add_message(
        self,
        conversation_id: int,
        role: str,
        content: str,
        *,
        status: str = STATUS_COMPLETE,
        reasoning: str = "",
        finish_reason: str | None = None,
        usage: dict | None = None,
        tokens: list | None = None,
        json_mode: str = "off",
    ) -> int:
        with self._transaction():
            position = self._db.execute(
                "SELECT coalesce(max(position) + 1, 0) FROM messages WHERE conversation_id=?",
                (conversation_id,),
            ).fetchone()[0]
            cur = self._db.execute(
                "INSERT INTO messages(conversation_id, position, role, content, reasoning, status,"
                " finish_reason, usage_json, tokens_json, json_mode, created_at)"
                " VALUES (?,?,?,?,?,?,?,?,?,?,?)",
                (
                    conversation_id,
                    position,
                    role,
                    content,
                    reasoning,
                    status,
                    finish_reason,
                    json.dumps(usage) if usage is not None else None,
                    json.dumps(tokens) if tokens else None,
                    json_mode,
                    time.time(),
                ),
            )
            self._touch(conversation_id)
        return cur.lastrowid

    def begin_reply(self, conversation_id: int, json_mode: str = "off") -> int:
        """An empty assistant message in status 'streaming'; `save_partial` grows it."""
        return self.add_message(
            conversation_id, "assistant", "", status=STATUS_STREAMING, json_mode=json_mode
        )

    def save_partial(self, message_id: int, content: str, reasoning: str = "") -> None:
        self._db.execute(
            "UPDATE messages SET content=?, reasoning=? WHERE id=?",
            (content, reasoning, message_id),
        )

    def finish_reply(
        self,
        message_id: int,
        *,
        content: str,
        reasoning: str,
        status: str,
        finish_reason: str | None,
        usage: dict | None,
        tokens: list | None = None,
    ) -> None:
        self._db.execute(
            "UPDATE messages SET content=?, reasoning=?, status=?, finish_reason=?, usage_json=?,"
            " tokens_json=? WHERE id=?",
            (
                content,
                reasoning,
                status,
                finish_reason,
                json.dumps(usage) if usage is not None else None,
                json.dumps(tokens) if tokens else None,
                message_id,
            ),
        )

    def update_message_content(self, message_id: int, content: str) -> None:
        self._db.execute("UPDATE messages SET content=? WHERE id=?", (content, message_id))

    def delete_messages_from(self, conversation_id: int, position: int) -> None:
        """Delete the message at `position` and everything after it (regenerate / edit)."""
        self._db.execute(
            "DELETE FROM messages WHERE conversation_id=? AND position>=?",
            (conversation_id, position),
        )


class _Transaction:
    """BEGIN IMMEDIATE ... COMMIT, rolled back on error (autocommit connection otherwise)."""

    def __init__(self, db: sqlite3.Connection):
        self._db = db

    def __enter__(self):
        self._db.execute("BEGIN IMMEDIATE")
        return self

    def __exit__(self, exc_type, exc, tb):
        self._db.execute("ROLLBACK" if exc_type else "COMMIT")
        return False


def _statements(script: str) -> list[str]:
    return [s.strip() for s in script.split(";") if s.strip()]


def _escape_like(text: str) -> str:
    return text.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")


def _message_from_row(row: sqlite3.Row) -> StoredMessage:
    return StoredMessage(
        id=row["id"],
        conversation_id=row["conversation_id"],
        position=row["position"],
        role=row["role"],
        content=row["content"],
        reasoning=row["reasoning"],
        status=row["status"],
        finish_reason=row["finish_reason"],
        usage=json.loads(row["usage_json"]) if row["usage_json"] else None,
        tokens=json.loads(row["tokens_json"]) if row["tokens_json"] else [],
        json_mode=row["json_mode"],
        created_at=row["created_at"],
    )
