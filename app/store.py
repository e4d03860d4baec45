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
reasoning, finish reason, usage and sampled tokens; version 3 makes a chat a tree (each message
has a parent; regenerate and edit add a sibling "version" instead of overwriting, and the
`selected` sibling of each group is the one on the visible branch) and stores each reply's
receipt (engine/receipt.py). Version 4 adds tool calls: a message's `tool_json` (an assistant reply's
`tool_calls` in OpenAI's shape plus any malformed calls it wrote; a `role: "tool"` message's
`tool_call_id`, tool name, approval and error kind) and a chat's `tools_json` (the tools enabled
in it and those the user allowed always). Version 5 adds projects (a `projects` table holding a
name, a system prompt and `settings_json`, and `conversations.project_id`, set to NULL when its
project is deleted so the chats stay), the `compactions` table (a summary standing in for a run
of older messages, which stay in `messages`), and a full-text index for search (below).
`_migrate` upgrades in place, one version at a time, each step in one transaction.

Search: two external-content FTS5 tables, `message_search` over `messages.content` and
`title_search` over `conversations.title`, kept in step by triggers. A reply is indexed once it
stops streaming (status != 'streaming'): re-indexing the whole text on every partial save would
make a long reply cost quadratic time, and a half-written reply is not worth finding. The index
is not part of the versioned schema: it is created (and filled from the rows) whenever a database
is opened without it, and a Python whose SQLite lacks FTS5 drops the triggers (so writes keep
working) and searches with LIKE instead (`Store.search_uses_fts` says which).

The tree: `parent_id` is the message this one follows (NULL for a chat's first message);
siblings are the messages sharing a parent (for the first message: the chat's NULL-parent
messages), ordered by id, and exactly one per group has `selected=1`. The visible branch starts
at the selected first message and follows each message's selected child, so choosing another
version of a message also brings back the branch below it as it was left. `position` is the
message's depth on its branch (0 for the first).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import sqlite3
import time
import unicodedata
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Literal

import platformdirs

from app.names import clean_name
from app.project_settings import ChatDefaults, Project, ProjectSettings, chat_defaults
from engine.types import MessageStatus

if TYPE_CHECKING:
    from app.archive_import import ImportedCompaction
    from app.chat_import import ImportedChat, ImportedMessage

SCHEMA_VERSION = 5
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
    project_id: int | None = None  # schema 5: the project the chat is in, None for none


@dataclass(frozen=True)
class SearchHit:
    """A chat that matches a search: `snippet` shows the match, with the matched words between
    SNIPPET_MARK characters; `message_id` is the best matching message (None: the title matched)."""

    conversation: Conversation
    snippet: str
    message_id: int | None


# Put around each matched word in a SearchHit snippet; the sidebar draws them bold. Private-use
# characters: message text cannot be confused with them (unlike "<b>" in a chat about HTML).
SNIPPET_MARK = ("\ue000", "\ue001")


@dataclass(frozen=True)
class ChatBackend:
    """What answers a chat: kind "local" (model is the GGUF path) or "remote" (connection id and
    the server's model id)."""

    kind: str
    connection_id: str | None
    model: str


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
    parent_id: int | None = None
    # The ids of this message's versions (its siblings and itself, oldest first); filled by the
    # branch readers (`messages`, `branch`), () elsewhere.
    version_ids: tuple[int, ...] = ()
    receipt: dict | None = None  # engine.receipt record of how this reply was produced
    # Tool calls (schema 4). An assistant reply: {"tool_calls": [ToolCall.to_openai()],
    # "malformed": [{"id", "name", "text", "problem"}]}. A role "tool" message: {"tool_call_id",
    # "name", "approval": APPROVAL_*, "is_error": bool, "error": error type name or None}.
    tool: dict | None = None

    @property
    def tool_calls(self) -> list[dict]:
        return list((self.tool or {}).get("tool_calls") or [])

    @property
    def version_number(self) -> int:
        """1-based index of this message among its versions (1 when it has none)."""
        return self.version_ids.index(self.id) + 1 if self.id in self.version_ids else 1

    @property
    def version_count(self) -> int:
        return max(1, len(self.version_ids))


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

# The current schema: version 2 plus the tree and receipts (see the module docstring).
_SCHEMA_V3 = (
    _SCHEMA_V2.replace(
        "    json_mode TEXT NOT NULL DEFAULT 'off',\n",
        "    json_mode TEXT NOT NULL DEFAULT 'off',\n"
        "    parent_id INTEGER REFERENCES messages(id) ON DELETE CASCADE,\n"
        "    selected INTEGER NOT NULL DEFAULT 1,\n"
        "    receipt_json TEXT,\n",
    )
    + "CREATE INDEX messages_by_parent ON messages(parent_id);\n"
)

# A compaction (schema 5): `summary` stands in, while `active`, for the messages whose ids
# `covered_json` lists (oldest first); those messages stay in `messages` so it can be undone.
_COMPACTIONS = """
CREATE TABLE compactions (
    id INTEGER PRIMARY KEY,
    conversation_id INTEGER NOT NULL REFERENCES conversations(id) ON DELETE CASCADE,
    covered_json TEXT NOT NULL,
    summary TEXT NOT NULL,
    active INTEGER NOT NULL DEFAULT 1,
    receipt_json TEXT,
    created_at REAL NOT NULL
);
CREATE INDEX compactions_by_conversation ON compactions(conversation_id);
"""

# The full-text index (module docstring). `WHEN`-less triggers with `SELECT ... WHERE` bodies: an
# update must remove the old text before adding the new one, in that order, which two separate
# triggers would not guarantee. A streaming reply is not in the index (module docstring), so its
# removal is skipped too: FTS5's 'delete' must be given exactly what was indexed.
_SEARCH_INDEX = """
CREATE VIRTUAL TABLE IF NOT EXISTS message_search USING fts5(
    content, content='messages', content_rowid='id', tokenize='unicode61 remove_diacritics 2'
);
CREATE VIRTUAL TABLE IF NOT EXISTS title_search USING fts5(
    title, content='conversations', content_rowid='id', tokenize='unicode61 remove_diacritics 2'
);
CREATE TRIGGER IF NOT EXISTS message_search_insert AFTER INSERT ON messages BEGIN
    INSERT INTO message_search(rowid, content)
        SELECT new.id, new.content WHERE new.status != 'streaming';
END;
CREATE TRIGGER IF NOT EXISTS message_search_delete AFTER DELETE ON messages BEGIN
    INSERT INTO message_search(message_search, rowid, content)
        SELECT 'delete', old.id, old.content WHERE old.status != 'streaming';
END;
CREATE TRIGGER IF NOT EXISTS message_search_update AFTER UPDATE OF content, status ON messages BEGIN
    INSERT INTO message_search(message_search, rowid, content)
        SELECT 'delete', old.id, old.content WHERE old.status != 'streaming';
    INSERT INTO message_search(rowid, content)
        SELECT new.id, new.content WHERE new.status != 'streaming';
END;
CREATE TRIGGER IF NOT EXISTS title_search_insert AFTER INSERT ON conversations BEGIN
    INSERT INTO title_search(rowid, title) VALUES (new.id, new.title);
END;
CREATE TRIGGER IF NOT EXISTS title_search_delete AFTER DELETE ON conversations BEGIN
    INSERT INTO title_search(title_search, rowid, title) VALUES ('delete', old.id, old.title);
END;
CREATE TRIGGER IF NOT EXISTS title_search_update AFTER UPDATE OF title ON conversations BEGIN
    INSERT INTO title_search(title_search, rowid, title) VALUES ('delete', old.id, old.title);
    INSERT INTO title_search(rowid, title) VALUES (new.id, new.title);
END;
"""
_SEARCH_TRIGGERS = (
    "message_search_insert",
    "message_search_delete",
    "message_search_update",
    "title_search_insert",
    "title_search_delete",
    "title_search_update",
)

# Version 4: tool calls on messages and the tools enabled per chat (module docstring).
_SCHEMA_V4 = _SCHEMA_V3.replace(
    "    receipt_json TEXT,\n", "    receipt_json TEXT,\n    tool_json TEXT,\n"
).replace(
    "    system_prompt TEXT NOT NULL DEFAULT '',\n",
    "    system_prompt TEXT NOT NULL DEFAULT '',\n    tools_json TEXT,\n",
)
# Version 5: projects, compactions (module docstring). The search index is created apart
# (`_SEARCH_INDEX`), since a Python without FTS5 must still open the database.
# A project's `settings_json`: {"model", "preset", "tools", "collections"} (app/projects.py).
_PROJECTS = """
CREATE TABLE projects (
    id INTEGER PRIMARY KEY,
    name TEXT NOT NULL,
    system_prompt TEXT NOT NULL DEFAULT '',
    settings_json TEXT,
    position INTEGER NOT NULL DEFAULT 0,
    created_at REAL NOT NULL,
    updated_at REAL NOT NULL
);
"""
_CONVERSATIONS_BY_PROJECT = "CREATE INDEX conversations_by_project ON conversations(project_id);\n"
_SCHEMA_V5 = (
    _PROJECTS
    + _SCHEMA_V4.replace(
        "    tools_json TEXT,\n",
        "    tools_json TEXT,\n    project_id INTEGER REFERENCES projects(id) ON DELETE SET NULL,\n",
    )
    + _COMPACTIONS
    + _CONVERSATIONS_BY_PROJECT
)
# Version 4 as it shipped; kept so tests build a v4 database and test the 4 -> 5 migration.
SCHEMA_V4 = _SCHEMA_V4 + "PRAGMA user_version = 4;\n"
# Version 3 as it shipped; kept so tests build a v3 database and test the 3 -> 4 migration.
SCHEMA_V3 = _SCHEMA_V3 + "PRAGMA user_version = 3;\n"

# Version 2 as it shipped (the release before the tree); kept so tests build a v2 database with
# the exact DDL that release wrote and the 2 -> 3 migration is tested on it.
SCHEMA_V2 = _SCHEMA_V2 + "PRAGMA user_version = 2;\n"

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


class StoreWriteError(StoreError):
    """A write was refused (disk full, I/O error, read-only file); the database is unchanged."""

    def __init__(self, message: str, *, disk_full: bool):
        super().__init__(message)
        self.disk_full = disk_full


def lenient_text(raw: bytes) -> str:
    """TEXT columns decoded with U+FFFD for invalid bytes. Python's default decoder raises
    OperationalError on one flipped byte, which made every start of the app fail."""
    return raw.decode("utf-8", errors="replace")


def create_private_dir(directory: Path) -> None:
    """Create `directory` (and parents) readable by the owner only; existing ones are left as
    they are (a --data-dir chosen by the user keeps the user's permissions)."""
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)


def create_private_file(path: Path) -> None:
    """Create `path` empty with mode 0600 if it does not exist; tighten it to 0600 if it does.
    SQLite creates the -wal and -shm files with the database file's permissions."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    os.close(fd)
    if path.stat().st_mode & 0o077:
        path.chmod(0o600)


Connect = Callable[..., sqlite3.Connection]


class Store:
    def __init__(
        self,
        path: Path | str | None = None,
        *,
        connect: Connect = sqlite3.connect,
        connection: sqlite3.Connection | None = None,
        mark_interrupted: bool = True,
    ):
        """Open (creating if needed) the database at `path`.

        `connect` is how the file is opened (tests inject a connection that fails like a full
        disk); `connection` is an already open database (the in-memory copy of `in_memory_copy`).
        `mark_interrupted=False` leaves replies another process is streaming as they are.
        """
        self.path = Path(path) if path is not None else default_db_path()
        self.saves_to_disk = connection is None
        if connection is None:
            create_private_dir(self.path.parent)
            create_private_file(self.path)
            # check_same_thread=False: the store is only used from the GUI thread, but pytest-qt
            # and qasync may call in from a helper thread; sqlite3 itself serialises access.
            connection = connect(self.path, isolation_level=None, check_same_thread=False)
        self._db = connection
        self._db.row_factory = sqlite3.Row
        self._db.text_factory = lenient_text
        if self.saves_to_disk:
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA synchronous=NORMAL")
        self._db.execute("PRAGMA foreign_keys=ON")
        # Whether search uses the FTS5 index or LIKE (module docstring).
        self.search_uses_fts = fts5_available()
        self._migrate()
        self._ensure_search_index()
        self._create_chat_backends()
        if mark_interrupted:
            # A reply that was streaming when the app died is kept, marked so the user can see
            # why it stops mid-sentence.
            self._db.execute(
                "UPDATE messages SET status=? WHERE status=?",
                (STATUS_INTERRUPTED, STATUS_STREAMING),
            )

    @classmethod
    def in_memory_copy(cls, path: Path | str) -> Store:
        """A writable copy, in memory, of the database at `path` (empty if there is none or it
        cannot be read): for a read-only data directory or a second window on the same data.
        Nothing is ever written to `path`, and replies streaming elsewhere are not marked."""
        memory = sqlite3.connect(":memory:", isolation_level=None, check_same_thread=False)
        source = open_read_only(Path(path))
        if source is not None:
            try:
                source.backup(memory)
            except sqlite3.Error:
                memory.close()
                memory = sqlite3.connect(":memory:", isolation_level=None, check_same_thread=False)
            finally:
                source.close()
        return cls(path, connection=memory, mark_interrupted=False)

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
                for statement in _statements(_SCHEMA_V5):
                    self._db.execute(statement)
                if self.search_uses_fts:
                    self._create_search_index()
                self._db.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
            return
        if version == 1:
            self._migrate_1_to_2()
            version = 2
        if version == 2:
            self._migrate_2_to_3()
            version = 3
        if version == 3:
            self._migrate_3_to_4()
            version = 4
        if version == 4:
            self._migrate_4_to_5()

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
            self._db.execute("PRAGMA user_version = 2")

    def _migrate_2_to_3(self) -> None:
        """Each message of a version-2 chat becomes a one-version node whose parent is the
        message before it (version 2 chats are linear, ordered by position then id)."""
        with self._transaction():
            for column in (
                "parent_id INTEGER REFERENCES messages(id) ON DELETE CASCADE",
                "selected INTEGER NOT NULL DEFAULT 1",
                "receipt_json TEXT",
            ):
                self._db.execute(f"ALTER TABLE messages ADD COLUMN {column}")
            rows = self._db.execute(
                "SELECT id, conversation_id FROM messages ORDER BY conversation_id, position, id"
            ).fetchall()
            previous: dict[int, int] = {}
            depth: dict[int, int] = {}
            updates = []
            for row in rows:
                cid = row["conversation_id"]
                parent = previous.get(cid)
                depth[cid] = depth.get(cid, -1) + 1
                updates.append((parent, depth[cid], row["id"]))
                previous[cid] = row["id"]
            self._db.executemany("UPDATE messages SET parent_id=?, position=? WHERE id=?", updates)
            self._db.execute("CREATE INDEX messages_by_parent ON messages(parent_id)")
            self._db.execute("PRAGMA user_version = 3")

    def _migrate_3_to_4(self) -> None:
        """Tool calls: nullable JSON columns, so every version-3 row stays as it was."""
        with self._transaction():
            self._db.execute("ALTER TABLE messages ADD COLUMN tool_json TEXT")
            self._db.execute("ALTER TABLE conversations ADD COLUMN tools_json TEXT")
            self._db.execute("PRAGMA user_version = 4")

    def _migrate_4_to_5(self) -> None:
        """Projects, compactions and the search index; a version-4 chat is in no project."""
        with self._transaction():
            for statement in _statements(_PROJECTS + _COMPACTIONS):
                self._db.execute(statement)
            self._db.execute(
                "ALTER TABLE conversations ADD COLUMN"
                " project_id INTEGER REFERENCES projects(id) ON DELETE SET NULL"
            )
            self._db.execute(_CONVERSATIONS_BY_PROJECT)
            if self.search_uses_fts:
                self._create_search_index()
            self._db.execute("PRAGMA user_version = 5")

    def _create_search_index(self) -> None:
        """Create the FTS5 tables and triggers and fill them from the rows (inside the caller's
        transaction). 'delete-all' first: a table left from before (its triggers dropped by a
        Python without FTS5, see the module docstring) may hold stale entries."""
        for statement in _statements_with_bodies(_SEARCH_INDEX):
            self._db.execute(statement)
        self._db.execute("INSERT INTO message_search(message_search) VALUES ('delete-all')")
        self._db.execute("INSERT INTO title_search(title_search) VALUES ('delete-all')")
        self._db.execute(
            "INSERT INTO message_search(rowid, content)"
            " SELECT id, content FROM messages WHERE status != 'streaming'"
        )
        self._db.execute(
            "INSERT INTO title_search(rowid, title) SELECT id, title FROM conversations"
        )

    def _ensure_search_index(self) -> None:
        """The index for a database written without it (an FTS5-less Python, a recovered copy),
        or, without FTS5 here, no triggers that would make every write fail."""
        present = {
            row[0]
            for row in self._db.execute(
                "SELECT name FROM sqlite_master WHERE type IN ('table', 'trigger')"
            )
        }
        with contextlib.suppress(sqlite3.OperationalError):  # read-only: search with what is there
            if not self.search_uses_fts:
                for trigger in _SEARCH_TRIGGERS:
                    if trigger in present:
                        self._db.execute(f"DROP TRIGGER {trigger}")
            elif not {"message_search", "title_search", *_SEARCH_TRIGGERS} <= present:
                with self._transaction():
                    self._create_search_index()

    def _transaction(self):
        return _Transaction(self._db)

    # --- which backend answers each chat (issue 12) -----------------------------------------------
    # Its own table, created when missing, so the schema versions of the message tables stay
    # untouched: kind is "local" (model = the GGUF path) or "remote" (connection_id + model id).
    _CHAT_BACKENDS = """CREATE TABLE IF NOT EXISTS chat_backends (
        conversation_id INTEGER PRIMARY KEY REFERENCES conversations(id) ON DELETE CASCADE,
        kind TEXT NOT NULL,
        connection_id TEXT,
        model TEXT NOT NULL
    )"""

    def _create_chat_backends(self) -> None:
        # e.g. a full disk: set_chat_backend tries again and reports it
        with contextlib.suppress(sqlite3.OperationalError):
            self._db.execute(self._CHAT_BACKENDS)

    def chat_backend(self, conversation_id: int) -> ChatBackend | None:
        try:
            row = self._db.execute(
                "SELECT kind, connection_id, model FROM chat_backends WHERE conversation_id=?",
                (conversation_id,),
            ).fetchone()
        except sqlite3.OperationalError:  # the table could not be created
            return None
        return ChatBackend(row["kind"], row["connection_id"], row["model"]) if row else None

    def set_chat_backend(
        self, conversation_id: int, kind: str, connection_id: str | None, model: str
    ) -> None:
        with self._writing():
            self._db.execute(self._CHAT_BACKENDS)
            self._db.execute(
                "INSERT INTO chat_backends(conversation_id, kind, connection_id, model) "
                "VALUES (?,?,?,?) ON CONFLICT(conversation_id) DO UPDATE SET "
                "kind=excluded.kind, connection_id=excluded.connection_id, model=excluded.model",
                (conversation_id, kind, connection_id, model),
            )

    @contextlib.contextmanager
    def _writing(self) -> Iterator[None]:
        """Turn SQLite's write failures into StoreWriteError, which callers handle (a full disk
        must not become a traceback per token)."""
        try:
            yield
        except sqlite3.OperationalError as exc:
            text = str(exc).lower()
            disk_full = "full" in text or "no space" in text
            raise StoreWriteError(str(exc), disk_full=disk_full) from exc
        except sqlite3.DatabaseError as exc:
            raise StoreWriteError(str(exc), disk_full=False) from exc

    def close(self) -> None:
        self._db.close()

    def integrity_check(self) -> str:
        return self._db.execute("PRAGMA integrity_check").fetchone()[0]

    # --- conversations --------------------------------------------------------------------------
    def create_conversation(
        self, title: str = DEFAULT_TITLE, system_prompt: str = "", project_id: int | None = None
    ) -> int:
        with self._writing():
            now = time.time()
            cur = self._db.execute(
                "INSERT INTO conversations(title, system_prompt, created_at, updated_at,"
                " project_id) VALUES (?,?,?,?,?)",
                (title, system_prompt, now, now, project_id),
            )
            return cur.lastrowid

    def conversation(self, conversation_id: int) -> Conversation | None:
        row = self._db.execute(
            f"SELECT {_CONVERSATION_COLUMNS} FROM conversations WHERE id=?", (conversation_id,)
        ).fetchone()
        return Conversation(**dict(row)) if row else None

    def list_conversations(self, search: str = "") -> list[Conversation]:
        """Newest first. `search` matches titles and message text, case-insensitively."""
        if search.strip():
            return [hit.conversation for hit in self.search(search)]
        sql = f"SELECT {_CONVERSATION_COLUMNS} FROM conversations ORDER BY updated_at DESC, id DESC"
        return [Conversation(**dict(r)) for r in self._db.execute(sql)]

    def search(self, text: str, limit: int = 200) -> list[SearchHit]:
        """Chats whose title or message text holds every word of `text` (a word may be the start
        of a longer one, so results come while typing), newest first, each with a snippet.
        Case and accents are ignored. Punctuation typed with the words must be there as typed
        ("50%" finds "50% off", not "500 off"): the word hits are narrowed to those holding the
        text itself. Text without any word ("%", "\\") and any search without FTS5 (module
        docstring) is one substring matched with LIKE (case-insensitive for ASCII letters)."""
        text = text.strip()
        words = _search_words(text)
        if not text:
            return []
        if not words or not self.search_uses_fts:
            return self._search_like(text, limit)
        query = " ".join('"' + w.replace('"', '""') + '"*' for w in words)
        # instr on lower(): ASCII case only, enough for the punctuation it is there for
        literal = "" if " ".join(words) == text else text.lower()
        # First which chats match, without snippets or ranking: the first letter typed is a
        # prefix of most words, and a snippet per matching message took 3 s on 20,000 messages.
        # Then snippets for the `limit` newest chats only. A title match stands for its chat;
        # else the chat's first matching message does.
        title_ids = {
            r[0]
            for r in self._db.execute(
                "SELECT conversations.id FROM title_search JOIN conversations"
                " ON conversations.id = title_search.rowid"
                " WHERE title_search MATCH ? AND instr(lower(conversations.title), ?) > 0",
                (query, literal),
            )
        }
        first_message: dict[int, int] = {}
        # the text itself only when there is punctuation to check: reading every matching
        # message's content doubled the time of a one-letter search
        narrowed = " AND instr(lower(messages.content), ?) > 0" if literal else ""
        for cid, mid in self._db.execute(
            "SELECT messages.conversation_id, messages.id FROM message_search"
            " JOIN messages ON messages.id = message_search.rowid"
            f" WHERE message_search MATCH ?{narrowed}",
            (query, literal) if literal else (query,),
        ):
            if cid not in title_ids and mid < first_message.get(cid, mid + 1):
                first_message[cid] = mid
        chats = self._db.execute(
            f"SELECT {_CONVERSATION_COLUMNS} FROM conversations"
            " WHERE id IN (SELECT value FROM json_each(?))"
            " ORDER BY updated_at DESC, id DESC LIMIT ?",
            (json.dumps([*title_ids, *first_message]), limit),
        ).fetchall()
        shown = [Conversation(**dict(r)) for r in chats]
        # Snippets are cut here, not by FTS5's snippet(): asked for a few rows by rowid, FTS5
        # runs the whole MATCH again for each (200 snippets of a prefix query took 30 s).
        wanted = [first_message[c.id] for c in shown if c.id in first_message]
        contents = dict(
            self._db.execute(
                "SELECT id, content FROM messages WHERE id IN (SELECT value FROM json_each(?))",
                (json.dumps(wanted),),
            ).fetchall()
        )
        hits = []
        for conv in shown:
            if conv.id in title_ids:
                hits.append(SearchHit(conv, _word_snippet(conv.title, words), None))
            else:
                mid = first_message[conv.id]
                hits.append(SearchHit(conv, _word_snippet(contents.get(mid, ""), words), mid))
        return hits

    def _search_like(self, text: str, limit: int) -> list[SearchHit]:
        pattern = "%" + _escape_like(text) + "%"
        rows = self._db.execute(
            f"SELECT {_CONVERSATION_COLUMNS}, (SELECT id FROM messages"
            " WHERE conversation_id = conversations.id AND content LIKE ? ESCAPE '\\'"
            " ORDER BY id LIMIT 1) AS message_id FROM conversations"
            " WHERE title LIKE ? ESCAPE '\\' OR message_id IS NOT NULL"
            " ORDER BY updated_at DESC, id DESC LIMIT ?",
            (pattern, pattern, limit),
        ).fetchall()
        hits = []
        for r in rows:
            conv = Conversation(**{k: r[k] for k in _CONVERSATION_FIELDS})
            source = conv.title
            if r["message_id"] is not None and text.lower() not in conv.title.lower():
                message = self._db.execute(
                    "SELECT content FROM messages WHERE id=?", (r["message_id"],)
                ).fetchone()
                source = message[0] if message else ""
            hits.append(SearchHit(conv, _like_snippet(source, text), r["message_id"]))
        return hits

    def rename_conversation(self, conversation_id: int, title: str) -> None:
        with self._writing():
            self._db.execute(
                "UPDATE conversations SET title=?, updated_at=? WHERE id=?",
                (title.strip() or DEFAULT_TITLE, time.time(), conversation_id),
            )

    def set_system_prompt(self, conversation_id: int, system_prompt: str) -> None:
        with self._writing():
            self._db.execute(
                "UPDATE conversations SET system_prompt=? WHERE id=?",
                (system_prompt, conversation_id),
            )

    def delete_conversation(self, conversation_id: int) -> None:
        with self._writing():
            self._db.execute("DELETE FROM conversations WHERE id=?", (conversation_id,))

    # --- projects (schema 5; app/project_settings.py says what a project holds) ----------------
    def create_project(
        self, name: str, system_prompt: str = "", settings: ProjectSettings | None = None
    ) -> int:
        """A new project, last in the list. `name` is checked by app.names.clean_name (an
        InvalidNameError says what is wrong; nothing is written)."""
        name = clean_name(name, "project name")
        with self._writing():
            now = time.time()
            position = self._db.execute(
                "SELECT coalesce(max(position) + 1, 0) FROM projects"
            ).fetchone()[0]
            cur = self._db.execute(
                "INSERT INTO projects(name, system_prompt, settings_json, position, created_at,"
                " updated_at) VALUES (?,?,?,?,?,?)",
                (
                    name,
                    system_prompt,
                    json.dumps((settings or ProjectSettings()).to_json()),
                    position,
                    now,
                    now,
                ),
            )
            return cur.lastrowid

    def project(self, project_id: int) -> Project | None:
        row = self._db.execute("SELECT * FROM projects WHERE id=?", (project_id,)).fetchone()
        return _project_from_row(row) if row else None

    def projects(self) -> list[Project]:
        """In the user's order (`position`, then creation)."""
        rows = self._db.execute("SELECT * FROM projects ORDER BY position, id").fetchall()
        return [_project_from_row(r) for r in rows]

    def rename_project(self, project_id: int, name: str) -> None:
        name = clean_name(name, "project name")
        self._update_project(project_id, "name=?", (name,))

    def set_project_system_prompt(self, project_id: int, system_prompt: str) -> None:
        self._update_project(project_id, "system_prompt=?", (system_prompt,))

    def set_project_settings(self, project_id: int, settings: ProjectSettings) -> None:
        self._update_project(project_id, "settings_json=?", (json.dumps(settings.to_json()),))

    def _update_project(self, project_id: int, assignment: str, args: tuple) -> None:
        with self._writing():
            cur = self._db.execute(
                f"UPDATE projects SET {assignment}, updated_at=? WHERE id=?",
                (*args, time.time(), project_id),
            )
        if cur.rowcount == 0:
            raise StoreError(f"There is no project {project_id} (deleted meanwhile?).")

    def delete_project(self, project_id: int) -> None:
        """Delete the project; its chats stay, in no project (the foreign key's SET NULL)."""
        with self._writing():
            self._db.execute("DELETE FROM projects WHERE id=?", (project_id,))

    def chat_defaults(self, conversation_id: int) -> ChatDefaults:
        """The system prompt, tools, default model and preset the chat uses: its own, else its
        project's (app/project_settings.py), each with where it came from."""
        conv = self.conversation(conversation_id)
        if conv is None:
            return ChatDefaults()
        project = self.project(conv.project_id) if conv.project_id is not None else None
        return chat_defaults(conv.system_prompt, self.chat_tools(conversation_id), project)

    def move_conversation(self, conversation_id: int, project_id: int | None) -> None:
        """Put a chat in a project, or (None) in none. Its last-changed time stays: moving a chat
        does not make it the newest."""
        with self._writing():
            if project_id is not None and self.project(project_id) is None:
                raise StoreError(f"There is no project {project_id} (deleted meanwhile?).")
            self._db.execute(
                "UPDATE conversations SET project_id=? WHERE id=?", (project_id, conversation_id)
            )

    def _touch(self, conversation_id: int) -> None:
        with self._writing():
            self._db.execute(
                "UPDATE conversations SET updated_at=? WHERE id=?", (time.time(), conversation_id)
            )

    # --- messages -------------------------------------------------------------------------------
    def messages(self, conversation_id: int, *, with_tokens: bool = True) -> list[StoredMessage]:
        """The visible branch of the chat, first message first. `with_tokens=False` leaves each
        reply's token records and receipt (by far the largest columns) unread: `tokens()` and
        `receipt()` read them when they are wanted."""
        return self._branch_of(self._tree_rows(conversation_id, with_tokens))

    def branch(self, conversation_id: int, limit: int | None = None) -> list[StoredMessage]:
        """The visible branch without token records (what the window holds in memory);
        `limit`: only its last `limit` messages (see `branch_window`)."""
        if limit is None:
            return self.messages(conversation_id, with_tokens=False)
        return self.branch_window(conversation_id, limit)[0]

    def branch_window(self, conversation_id: int, limit: int) -> tuple[list[StoredMessage], int]:
        """The last `limit` messages of the visible branch (no token records) and how many
        messages come before them. The branch is found from the tree columns alone and only
        those messages' text is read, so opening a chat of 150,000 messages costs what its
        last `limit` messages cost (plus a walk over small integers)."""
        ids, groups = self._branch_ids(conversation_id)
        earlier = max(len(ids) - max(limit, 0), 0)
        shown = ids[earlier:]
        rows: dict[int, sqlite3.Row] = {}
        for at in range(0, len(shown), 500):  # SQLite allows 999 bound parameters (or more)
            chunk = shown[at : at + 500]
            rows.update(
                (r["id"], r)
                for r in self._db.execute(
                    f"SELECT {_COLUMNS_WITHOUT_TOKENS} FROM messages"
                    f" WHERE id IN ({','.join('?' * len(chunk))})",
                    chunk,
                )
            )
        messages = [
            _message_from_row(rows[i], version_ids=groups[rows[i]["parent_id"]]) for i in shown
        ]
        return messages, earlier

    def _branch_ids(
        self, conversation_id: int
    ) -> tuple[list[int], dict[int | None, tuple[int, ...]]]:
        """The visible branch's ids, first message first, and the version groups, by the same
        rule as `_branch_of`, read from the tree columns only."""
        rows = self._db.execute(
            "SELECT id, parent_id, selected FROM messages WHERE conversation_id=?"
            " ORDER BY position, id",
            (conversation_id,),
        ).fetchall()
        return [r["id"] for r in _branch_rows(rows)], _sibling_groups(rows)

    def tree(self, conversation_id: int) -> list[StoredMessage]:
        """Every message of the chat, every version, parents before children (for export)."""
        rows = self._tree_rows(conversation_id, True)
        groups = _sibling_groups(rows)
        return [_message_from_row(r, version_ids=groups[(r["parent_id"])]) for r in rows]

    def _tree_rows(self, conversation_id: int, with_tokens: bool) -> list[sqlite3.Row]:
        columns = "*" if with_tokens else _COLUMNS_WITHOUT_TOKENS
        return self._db.execute(
            f"SELECT {columns} FROM messages WHERE conversation_id=? ORDER BY position, id",
            (conversation_id,),
        ).fetchall()

    def _branch_of(self, rows: list[sqlite3.Row]) -> list[StoredMessage]:
        groups = _sibling_groups(rows)
        return [
            _message_from_row(r, version_ids=groups[r["parent_id"]]) for r in _branch_rows(rows)
        ]

    def message(self, message_id: int) -> StoredMessage | None:
        row = self._db.execute("SELECT * FROM messages WHERE id=?", (message_id,)).fetchone()
        if not row:
            return None
        return _message_from_row(row, version_ids=self._version_ids(row))

    def _version_ids(self, row: sqlite3.Row) -> tuple[int, ...]:
        if row["parent_id"] is None:
            ids = self._db.execute(
                "SELECT id FROM messages WHERE conversation_id=? AND parent_id IS NULL ORDER BY id",
                (row["conversation_id"],),
            )
        else:
            ids = self._db.execute(
                "SELECT id FROM messages WHERE parent_id=? ORDER BY id", (row["parent_id"],)
            )
        return tuple(r[0] for r in ids)

    def tokens(self, message_id: int) -> list:
        """A reply's token records (for the token inspector), read only when asked for."""
        row = self._db.execute(
            "SELECT tokens_json FROM messages WHERE id=?", (message_id,)
        ).fetchone()
        return _json_or(row[0], []) if row else []

    def receipt(self, message_id: int) -> dict | None:
        row = self._db.execute(
            "SELECT receipt_json FROM messages WHERE id=?", (message_id,)
        ).fetchone()
        return _json_or(row[0], None) if row else None

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
        parent_id: int | None | Literal["end"] = "end",
        receipt: dict | None = None,
        tool: dict | None = None,
    ) -> int:
        """Add a message after `parent_id` ("end": after the last message of the visible branch;
        None: as a first message). It becomes the selected version among its siblings, so the
        visible branch now runs through it."""
        with self._writing():
            with self._transaction():
                if parent_id == "end":
                    branch = self._branch_of(self._tree_rows(conversation_id, False))
                    parent_id = branch[-1].id if branch else None
                if parent_id is None:
                    position = 0
                    self._db.execute(
                        "UPDATE messages SET selected=0 WHERE conversation_id=? AND parent_id IS NULL",
                        (conversation_id,),
                    )
                else:
                    row = self._db.execute(
                        "SELECT position FROM messages WHERE id=? AND conversation_id=?",
                        (parent_id, conversation_id),
                    ).fetchone()
                    if row is None:
                        raise StoreError(
                            f"message {parent_id} is not in conversation {conversation_id}"
                        )
                    position = row[0] + 1
                    self._db.execute(
                        "UPDATE messages SET selected=0 WHERE parent_id=?", (parent_id,)
                    )
                cur = self._db.execute(
                    "INSERT INTO messages(conversation_id, position, role, content, reasoning, status,"
                    " finish_reason, usage_json, tokens_json, json_mode, created_at, parent_id,"
                    " selected, receipt_json, tool_json) VALUES (?,?,?,?,?,?,?,?,?,?,?,?,1,?,?)",
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
                        parent_id,
                        json.dumps(receipt) if receipt is not None else None,
                        json.dumps(tool) if tool is not None else None,
                    ),
                )
                self._touch(conversation_id)
            return cur.lastrowid

    def select_version(self, message_id: int) -> None:
        """Make `message_id` the visible version among its siblings (the branch below it comes
        back as it was left)."""
        with self._writing(), self._transaction():
            row = self._db.execute(
                "SELECT conversation_id, parent_id FROM messages WHERE id=?", (message_id,)
            ).fetchone()
            if row is None:
                return
            if row["parent_id"] is None:
                self._db.execute(
                    "UPDATE messages SET selected=(id=?) WHERE conversation_id=? AND parent_id IS NULL",
                    (message_id, row["conversation_id"]),
                )
            else:
                self._db.execute(
                    "UPDATE messages SET selected=(id=?) WHERE parent_id=?",
                    (message_id, row["parent_id"]),
                )

    def branch_conversation(self, message_id: int, title: str | None = None) -> int | None:
        """A new chat holding the visible path from the first message up to `message_id`
        (each message's current text, usage, tokens and receipt; one version each), with the
        same system prompt. Returns its id (None if the message is gone)."""
        target = self.message(message_id)
        if target is None:
            return None
        conv = self.conversation(target.conversation_id)
        path = self._path_to(target)
        with self._writing():
            with self._transaction():
                now = time.time()
                cur = self._db.execute(
                    "INSERT INTO conversations(title, system_prompt, created_at, updated_at)"
                    " VALUES (?,?,?,?)",
                    (title or f"{conv.title} (branch)", conv.system_prompt, now, now),
                )
                new_cid = cur.lastrowid
                self._db.execute(
                    "UPDATE conversations SET tools_json="
                    "(SELECT tools_json FROM conversations WHERE id=?) WHERE id=?",
                    (conv.id, new_cid),
                )
                parent: int | None = None
                for depth, old_id in enumerate(path):
                    cur = self._db.execute(
                        "INSERT INTO messages(conversation_id, position, role, content, reasoning,"
                        " status, finish_reason, usage_json, tokens_json, json_mode, created_at,"
                        " parent_id, selected, receipt_json, tool_json)"
                        " SELECT ?, ?, role, content, reasoning, status, finish_reason, usage_json,"
                        " tokens_json, json_mode, created_at, ?, 1, receipt_json, tool_json"
                        " FROM messages"
                        " WHERE id=?",
                        (new_cid, depth, parent, old_id),
                    )
                    parent = cur.lastrowid
            return new_cid

    def import_conversation(self, chat: ImportedChat) -> int:
        """A new chat holding an imported export's whole tree (app/chat_import.py validated it),
        in one transaction: a failure leaves the database as it was. The branch's messages are
        the selected versions; a group off the branch shows its newest. Returns the chat's id."""
        return self.import_conversations([chat])[0]

    def import_conversations(
        self,
        chats: Sequence[ImportedChat],
        projects: Sequence[str | None] | None = None,
        compactions: Sequence[Sequence[ImportedCompaction]] | None = None,
    ) -> list[int]:
        """Many imported chats (a zip export, app/archive_import.py) in one transaction: all or
        none. `projects[i]` names chat i's project: the first project of that name, created when
        there is none; `compactions[i]` are chat i's summaries (covering messages by their keys
        in the file). Returns the new chats' ids in order."""
        names = list(projects) if projects is not None else [None] * len(chats)
        summaries = list(compactions) if compactions is not None else [()] * len(chats)
        with self._writing():
            with self._transaction():
                project_ids: dict[str, int] = {}
                ids: list[int] = []
                for chat, name in zip(chats, names, strict=True):
                    if name is not None and name not in project_ids:
                        project_ids[name] = self._project_named(name)
                    project = None if name is None else project_ids[name]
                    cid, new_id = self._insert_imported(chat, project)
                    for c in summaries[len(ids)]:
                        self._insert_imported_compaction(cid, c, new_id)
                    ids.append(cid)
            return ids

    def _project_named(self, name: str) -> int:
        """The first project called `name`, created (inside the caller's transaction) if none."""
        name = clean_name(name, "project name")
        row = self._db.execute(
            "SELECT id FROM projects WHERE name=? ORDER BY id LIMIT 1", (name,)
        ).fetchone()
        return row[0] if row is not None else self.create_project(name)

    def _insert_imported_compaction(
        self, cid: int, c: ImportedCompaction, new_id: dict[int, int]
    ) -> None:
        """One imported summary, its covered messages' file keys mapped to their new ids (the
        reader checked every key is one of the chat's messages)."""
        self._db.execute(
            "INSERT INTO compactions(conversation_id, covered_json, summary, active,"
            " receipt_json, created_at) VALUES (?,?,?,?,?,?)",
            (
                cid,
                json.dumps([new_id[k] for k in c.covered]),
                c.summary,
                int(c.active),
                json.dumps(c.receipt) if c.receipt is not None else None,
                c.created_at,
            ),
        )

    def _insert_imported(
        self, chat: ImportedChat, project_id: int | None
    ) -> tuple[int, dict[int, int]]:
        """One imported chat's rows (inside the caller's transaction): the chat's id and each
        message's file key -> its new id."""
        on_branch = set(chat.branch)
        now = time.time()
        cur = self._db.execute(
            "INSERT INTO conversations(title, system_prompt, created_at, updated_at, project_id)"
            " VALUES (?,?,?,?,?)",
            (chat.title, chat.system_prompt, chat.created_at or now, now, project_id),
        )
        cid = cur.lastrowid
        groups: dict[int | None, list[int]] = {}
        for m in chat.messages:
            groups.setdefault(m.parent_key, []).append(m.key)
        new_id: dict[int, int] = {}
        depth: dict[int, int] = {}
        for m in chat.messages:  # parents before children
            siblings = groups[m.parent_key]
            branch_sibling = next((k for k in siblings if k in on_branch), None)
            selected = m.key == (branch_sibling if branch_sibling is not None else siblings[-1])
            parent = None if m.parent_key is None else new_id[m.parent_key]
            depth[m.key] = 0 if m.parent_key is None else depth[m.parent_key] + 1
            cur = self._db.execute(
                "INSERT INTO messages(conversation_id, position, parent_id, selected,"
                f" {_MESSAGE_COLUMNS}) VALUES (?,?,?,?,{_MESSAGE_PLACEHOLDERS})",
                (cid, depth[m.key], parent, int(selected), *_message_row(m)),
            )
            new_id[m.key] = cur.lastrowid
        return cid, new_id

    def _path_to(self, message: StoredMessage) -> list[int]:
        """Ids from the chat's first message down to `message` (following parents)."""
        path = [message.id]
        parent = message.parent_id
        while parent is not None and parent not in path:
            path.append(parent)
            row = self._db.execute(
                "SELECT parent_id FROM messages WHERE id=?", (parent,)
            ).fetchone()
            parent = row[0] if row else None
        return path[::-1]

    def begin_reply(
        self,
        conversation_id: int,
        json_mode: str = "off",
        parent_id: int | None | Literal["end"] = "end",
    ) -> int:
        """An empty assistant message in status 'streaming'; `save_partial` grows it."""
        return self.add_message(
            conversation_id,
            "assistant",
            "",
            status=STATUS_STREAMING,
            json_mode=json_mode,
            parent_id=parent_id,
        )

    def save_partial(self, message_id: int, content: str, reasoning: str = "") -> None:
        with self._writing():
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
        receipt: dict | None = None,
    ) -> None:
        with self._writing():
            self._db.execute(
                "UPDATE messages SET content=?, reasoning=?, status=?, finish_reason=?, usage_json=?,"
                " tokens_json=?, receipt_json=coalesce(?, receipt_json) WHERE id=?",
                (
                    content,
                    reasoning,
                    status,
                    finish_reason,
                    json.dumps(usage) if usage is not None else None,
                    json.dumps(tokens) if tokens else None,
                    json.dumps(receipt) if receipt is not None else None,
                    message_id,
                ),
            )

    def set_tool(self, message_id: int, tool: dict | None) -> None:
        """Record a reply's tool calls (or a tool message's outcome) on the message."""
        with self._writing():
            self._db.execute(
                "UPDATE messages SET tool_json=? WHERE id=?",
                (json.dumps(tool) if tool is not None else None, message_id),
            )

    def update_tool_message(
        self, message_id: int, *, content: str, status: str, tool: dict
    ) -> None:
        """A role "tool" message's outcome: its result text, status and approval record."""
        with self._writing():
            self._db.execute(
                "UPDATE messages SET content=?, status=?, tool_json=? WHERE id=?",
                (content, status, json.dumps(tool), message_id),
            )

    def chat_tools(self, conversation_id: int) -> dict:
        """{"enabled": [tool keys], "always": [tool keys]} for a chat ({} if never set)."""
        row = self._db.execute(
            "SELECT tools_json FROM conversations WHERE id=?", (conversation_id,)
        ).fetchone()
        value = _json_or(row[0], {}) if row else {}
        return value if isinstance(value, dict) else {}

    def set_chat_tools(self, conversation_id: int, tools: dict) -> None:
        with self._writing():
            self._db.execute(
                "UPDATE conversations SET tools_json=? WHERE id=?",
                (json.dumps(tools), conversation_id),
            )

    def set_receipt(self, message_id: int, receipt: dict) -> None:
        with self._writing():
            self._db.execute(
                "UPDATE messages SET receipt_json=? WHERE id=?", (json.dumps(receipt), message_id)
            )

    # --- recovery (app/recovery.py copies what a damaged database still holds) ---------------
    def restoring(self):
        """One transaction around many restore_* calls: a commit per row made recovering a
        300 MB database take a minute."""
        return self._transaction()

    def restore_conversation(self, conversation: Conversation, tools: dict | None = None) -> None:
        """The chat with its id, its project (restored first) and its tools (`chat_tools`)."""
        with self._writing():
            self._db.execute(
                "INSERT INTO conversations(id, title, system_prompt, created_at, updated_at,"
                " project_id, tools_json) VALUES (?,?,?,?,?,?,?)",
                (
                    conversation.id,
                    conversation.title,
                    conversation.system_prompt,
                    conversation.created_at,
                    conversation.updated_at,
                    conversation.project_id,
                    json.dumps(tools) if tools is not None else None,
                ),
            )

    def restore_project(self, project: Project) -> None:
        """The project with its id (chats name it), position and times, as they were."""
        with self._writing():
            self._db.execute(
                "INSERT INTO projects(id, name, system_prompt, settings_json, position,"
                " created_at, updated_at) VALUES (?,?,?,?,?,?,?)",
                (
                    project.id,
                    project.name,
                    project.system_prompt,
                    json.dumps(project.settings.to_json()),
                    project.position,
                    project.created_at,
                    project.updated_at,
                ),
            )

    def restore_compaction(self, c: StoredCompaction) -> None:
        """The compaction as it was (active or not); its chat and messages are restored first."""
        with self._writing():
            self._db.execute(
                "INSERT INTO compactions(id, conversation_id, covered_json, summary, active,"
                " receipt_json, created_at) VALUES (?,?,?,?,?,?,?)",
                (
                    c.id,
                    c.conversation_id,
                    json.dumps(list(c.covered)),
                    c.summary,
                    int(c.active),
                    json.dumps(c.receipt) if c.receipt is not None else None,
                    c.created_at,
                ),
            )

    def restore_message(self, m: StoredMessage, selected: bool = True) -> None:
        with self._writing():
            self._db.execute(
                "INSERT INTO messages(id, conversation_id, position, parent_id, selected,"
                f" {_MESSAGE_COLUMNS}) VALUES (?,?,?,?,?,{_MESSAGE_PLACEHOLDERS})",
                (m.id, m.conversation_id, m.position, m.parent_id, int(selected), *_message_row(m)),
            )

    def update_message_content(self, message_id: int, content: str) -> None:
        with self._writing():
            self._db.execute("UPDATE messages SET content=? WHERE id=?", (content, message_id))

    def delete_messages_from(self, conversation_id: int, position: int) -> None:
        """Delete the message at `position` and everything after it (regenerate / edit)."""
        with self._writing():
            self._db.execute(
                "DELETE FROM messages WHERE conversation_id=? AND position>=?",
                (conversation_id, position),
            )

    # --- compactions (issue 35: a summary standing in for older messages) -----------------------
    def add_compaction(
        self, conversation_id: int, covered: list[int], summary: str, receipt: dict | None = None
    ) -> int:
        """Make `summary` stand in for the messages `covered` (ids, oldest first) in one
        transaction: the chat's earlier compaction, if any, goes inactive (the new summary
        includes it) and this one is the active one. `receipt` is how the summary was written.
        The covered messages themselves are not touched."""
        if not covered or not summary.strip():
            raise ValueError("a compaction needs covered messages and a summary")
        with self._writing():
            with self._transaction():
                self._db.execute(
                    "UPDATE compactions SET active=0 WHERE conversation_id=? AND active=1",
                    (conversation_id,),
                )
                cur = self._db.execute(
                    "INSERT INTO compactions(conversation_id, covered_json, summary, active,"
                    " receipt_json, created_at) VALUES (?,?,?,1,?,?)",
                    (
                        conversation_id,
                        json.dumps([int(i) for i in covered]),
                        summary,
                        json.dumps(receipt) if receipt is not None else None,
                        time.time(),
                    ),
                )
            return cur.lastrowid

    def active_compaction(self, conversation_id: int) -> StoredCompaction | None:
        row = self._db.execute(
            "SELECT * FROM compactions WHERE conversation_id=? AND active=1 ORDER BY id DESC",
            (conversation_id,),
        ).fetchone()
        return _compaction_from_row(row) if row is not None else None

    def count_chats_with_messages(self) -> int:
        """How many chats hold at least one message (what exporting everything writes)."""
        row = self._db.execute("SELECT count(DISTINCT conversation_id) FROM messages").fetchone()
        return row[0]

    def compactions(self, conversation_id: int) -> list[StoredCompaction]:
        """Every compaction of the chat, active or not, oldest first (an export carries them)."""
        rows = self._db.execute(
            "SELECT * FROM compactions WHERE conversation_id=? ORDER BY id", (conversation_id,)
        ).fetchall()
        return [_compaction_from_row(r) for r in rows]

    def compaction(self, compaction_id: int) -> StoredCompaction | None:
        row = self._db.execute("SELECT * FROM compactions WHERE id=?", (compaction_id,)).fetchone()
        return _compaction_from_row(row) if row is not None else None

    def set_compaction_summary(self, compaction_id: int, summary: str) -> None:
        """The user's edit of a summary (what the model sees from the next reply on)."""
        if not summary.strip():
            raise ValueError("a summary cannot be empty")
        with self._writing():
            self._db.execute(
                "UPDATE compactions SET summary=? WHERE id=?", (summary, compaction_id)
            )

    def deactivate_compaction(self, compaction_id: int) -> None:
        """Restore the originals: the summary stops standing in for them (the row stays, so a
        reply's receipt can still name it)."""
        with self._writing():
            self._db.execute("UPDATE compactions SET active=0 WHERE id=?", (compaction_id,))

    def branch_ids(self, conversation_id: int) -> list[int]:
        """The visible branch's message ids, first first, from the tree columns alone (whether
        a compaction's messages are on the branch of a chat too long to read whole)."""
        return self._branch_ids(conversation_id)[0]


@dataclass(frozen=True)
class StoredCompaction:
    id: int
    conversation_id: int
    covered: tuple[int, ...]  # message ids the summary stands in for, oldest first
    summary: str
    active: bool
    receipt: dict | None  # how the summary was written (engine/receipt.py)
    created_at: float


def _compaction_from_row(row: sqlite3.Row) -> StoredCompaction:
    return StoredCompaction(
        id=row["id"],
        conversation_id=row["conversation_id"],
        covered=tuple(int(i) for i in _json_or(row["covered_json"], [])),
        summary=row["summary"],
        active=bool(row["active"]),
        receipt=_json_or(row["receipt_json"], None),
        created_at=row["created_at"],
    )


class _Transaction:
    """BEGIN IMMEDIATE ... COMMIT, rolled back on error (autocommit connection otherwise)."""

    def __init__(self, db: sqlite3.Connection):
        self._db = db

    def __enter__(self):
        self._db.execute("BEGIN IMMEDIATE")
        return self

    def __exit__(self, exc_type, exc, tb):
        if exc_type is None:
            self._db.execute("COMMIT")
            return False
        # A failed COMMIT (disk full) may already have ended the transaction; the first error
        # is the one to report.
        with contextlib.suppress(sqlite3.Error):
            self._db.execute("ROLLBACK")
        return False


def _statements(script: str) -> list[str]:
    return [s.strip() for s in script.split(";") if s.strip()]


def _statements_with_bodies(script: str) -> list[str]:
    """`_statements` for a script with triggers, whose bodies hold `;` themselves: a statement
    ends where SQLite says it is complete."""
    statements, current = [], ""
    for piece in script.split(";"):
        current += piece + ";"
        if sqlite3.complete_statement(current):
            if current.strip(" \n;"):
                statements.append(current.strip())
            current = ""
    return statements


def fts5_available() -> bool:
    """Whether this Python's SQLite has the FTS5 module (most builds; some distributions' do not)."""
    probe = sqlite3.connect(":memory:")
    try:
        probe.execute("CREATE VIRTUAL TABLE probe USING fts5(text)")
        return True
    except sqlite3.OperationalError:
        return False
    finally:
        probe.close()


_CONVERSATION_FIELDS = ("id", "title", "system_prompt", "created_at", "updated_at", "project_id")
_CONVERSATION_COLUMNS = ", ".join(_CONVERSATION_FIELDS)
# The same in a join with messages, which has columns of the same names
_CONVERSATION_COLUMNS_QUALIFIED = ", ".join(
    f"conversations.{f} AS {f}" for f in _CONVERSATION_FIELDS
)


def _project_from_row(row: sqlite3.Row) -> Project:
    return Project(
        id=row["id"],
        name=row["name"],
        system_prompt=row["system_prompt"],
        settings=ProjectSettings.from_json(_json_or(row["settings_json"], {})),
        position=row["position"],
        created_at=row["created_at"],
        updated_at=row["updated_at"],
    )


def _search_words(text: str) -> list[str]:
    """The words of a search, as FTS5's unicode61 tokenizer splits them (letters and digits;
    everything else separates), so punctuation typed in the box cannot become query syntax."""
    return "".join(ch if ch.isalnum() else " " for ch in text).split()


def _fold(text: str) -> str:
    """Lower case without accents, as the index's tokenizer (unicode61 remove_diacritics 2)
    compares words."""
    decomposed = unicodedata.normalize("NFKD", text)
    return "".join(ch for ch in decomposed if not unicodedata.combining(ch)).casefold()


_WORD = re.compile(r"[^\W_]+")  # runs of letters and digits: the tokenizer's words


def _word_snippet(text: str, words: list[str], width: int = 40) -> str:
    """The text around the first word that starts with one of `words` (folded as `_fold`), up
    to `width` characters before it and twice that after, whole words only, each matching word
    between SNIPPET_MARK characters."""
    wanted = [_fold(w) for w in words]
    matches = [m for m in _WORD.finditer(text) if _fold(m.group()).startswith(tuple(wanted))]
    if not matches:
        return text[: 3 * width]
    first = matches[0]
    start = max(0, first.start() - width)
    end = min(len(text), first.end() + 2 * width)
    if start > 0 and not text[start - 1].isspace():  # do not begin or end inside a word
        start = next(
            (i + 1 for i in range(start, first.start()) if text[i].isspace()), first.start()
        )
    if end < len(text) and not text[end].isspace():
        end = next((i for i in range(end, first.end(), -1) if text[i].isspace()), end)
    out, at = [], start
    for m in matches:
        if m.start() < start or m.end() > end:
            continue
        out += [text[at : m.start()], SNIPPET_MARK[0], m.group(), SNIPPET_MARK[1]]
        at = m.end()
    out.append(text[at:end])
    return ("…" if start > 0 else "") + "".join(out) + ("…" if end < len(text) else "")


def _like_snippet(text: str, needle: str, width: int = 40) -> str:
    """Up to `width` characters either side of the first `needle` in `text`, marked like FTS5's
    snippet() marks its matches."""
    at = text.lower().find(needle.lower())
    if at < 0:
        return text[: 2 * width]
    start, end = max(0, at - width), at + len(needle)
    return (
        ("…" if start else "")
        + text[start:at]
        + SNIPPET_MARK[0]
        + text[at:end]
        + SNIPPET_MARK[1]
        + text[end : end + width]
        + ("…" if end + width < len(text) else "")
    )


def _escape_like(text: str) -> str:
    return text.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")


# Every column but the token records and receipts (the branch readers leave those, by far the
# largest columns, for `tokens()` and `receipt()`).
_COLUMNS_WITHOUT_TOKENS = (
    "id, conversation_id, position, role, content, reasoning, status, finish_reason, usage_json,"
    " NULL AS tokens_json, json_mode, created_at, parent_id, selected, NULL AS receipt_json,"
    " tool_json"
)


def _branch_rows(rows: list[sqlite3.Row]) -> list[sqlite3.Row]:
    """The rows of the visible branch among a chat's `rows` (ordered by position, id): from the
    selected first message, each message's selected child."""
    by_parent: dict[int | None, list[sqlite3.Row]] = {}
    for r in rows:
        by_parent.setdefault(r["parent_id"], []).append(r)
    branch: list[sqlite3.Row] = []
    parent: int | None = None
    # No message is reached twice, whatever the rows say: each has one parent, and the walk
    # starts at the messages without one, so parent ids that form a cycle are never reached.
    while parent in by_parent:
        siblings = by_parent[parent]
        # The selected one; a group with none selected (never written so, but a recovered
        # database may be) shows its newest version.
        chosen = next((r for r in siblings if r["selected"]), siblings[-1])
        branch.append(chosen)
        parent = chosen["id"]
    return branch


def _sibling_groups(rows: list[sqlite3.Row]) -> dict[int | None, tuple[int, ...]]:
    """parent id -> the ids of its children, oldest first (the versions of one message)."""
    groups: dict[int | None, list[int]] = {}
    for r in sorted(rows, key=lambda r: r["id"]):
        groups.setdefault(r["parent_id"], []).append(r["id"])
    return {parent: tuple(ids) for parent, ids in groups.items()}


# A message's own columns (what it says and how it was made), as `_message_row` fills them; the
# tree columns (conversation, position, parent, selected) are the caller's.
_MESSAGE_COLUMNS = (
    "role, content, reasoning, status, finish_reason, usage_json, tokens_json, json_mode,"
    " created_at, receipt_json, tool_json"
)
_MESSAGE_PLACEHOLDERS = ",".join("?" * len(_MESSAGE_COLUMNS.split(",")))


def _message_row(m: StoredMessage | ImportedMessage) -> tuple:
    """`m`'s values for `_MESSAGE_COLUMNS`, in that order (JSON columns encoded, empty ones NULL)."""
    return (
        m.role,
        m.content,
        m.reasoning,
        m.status,
        m.finish_reason,
        json.dumps(m.usage) if m.usage is not None else None,
        json.dumps(m.tokens) if m.tokens else None,
        m.json_mode,
        m.created_at,
        json.dumps(m.receipt) if m.receipt is not None else None,
        json.dumps(m.tool) if m.tool is not None else None,
    )


def _message_from_row(row: sqlite3.Row, version_ids: tuple[int, ...] = ()) -> StoredMessage:
    return StoredMessage(
        id=row["id"],
        conversation_id=row["conversation_id"],
        position=row["position"],
        role=row["role"],
        content=row["content"],
        reasoning=row["reasoning"],
        status=row["status"],
        finish_reason=row["finish_reason"],
        usage=_json_or(row["usage_json"], None),
        tokens=_json_or(row["tokens_json"], []),
        json_mode=row["json_mode"],
        created_at=row["created_at"],
        parent_id=row["parent_id"],
        version_ids=version_ids,
        receipt=_json_or(row["receipt_json"], None),
        tool=_tool_of(row),
    )


def _tool_of(row: sqlite3.Row) -> dict | None:
    value = _json_or(row["tool_json"], None) if "tool_json" in row.keys() else None  # noqa: SIM118 (Row's `in` tests values)
    return value if isinstance(value, dict) else None


def _json_or(text: str | None, default):
    """A JSON column's value; `default` when empty or unreadable (a damaged byte must cost the
    usage line or the token list of one message, not the whole chat)."""
    if not text:
        return default
    try:
        return json.loads(text)
    except (ValueError, RecursionError):
        return default


def open_read_only(path: Path) -> sqlite3.Connection | None:
    """A read-only connection to `path`, or None if it cannot be opened. In a read-only directory
    SQLite cannot create the WAL index, so `immutable=1` (no locking, no WAL) is the fallback."""
    if not path.is_file():
        return None
    for mode in ("mode=ro", "immutable=1"):
        try:
            db = sqlite3.connect(f"{path.resolve().as_uri()}?{mode}", uri=True)
            db.execute("SELECT count(*) FROM sqlite_master").fetchone()
            return db
        except sqlite3.Error:
            continue
    return None
