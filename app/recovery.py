"""A damaged conversation database: find the damage, keep the file aside, copy what is readable.

What damage looked like (issue 17): garbage bytes or a truncated file ("file is not a database",
"database disk image is malformed"), and one invalid byte inside a message. The last one passes
SQLite's integrity check (SQLite does not validate UTF-8), but Python's sqlite3 raised
OperationalError("Could not decode to UTF-8 column 'content'") while the window was being built;
the engine thread was already running, so Qt aborted ("QThread: Destroyed while thread is still
running", SIGABRT) on every start.

The check (SQLite's quick_check, then every text value read as bytes and decoded strictly) sees
exactly what Python would fail on; on a 315 MB database (2,000 messages, 1,000 of them with
1,000-token lists) it took 0.27 s (median of 5, file in the page cache, machine shared).
Recovery is a row-by-row copy through Python's sqlite3 with per-row error handling (portable: no
dependency on the sqlite3 command-line tool and its `.recover`): a row that cannot be read is
counted and skipped, invalid UTF-8 becomes U+FFFD, unreadable JSON columns are dropped. The
damaged file is renamed with a timestamp and never deleted.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import sqlite3
import stat
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from app.project_settings import Project, ProjectSettings
from app.regular_files import NotRegularFileError, check_regular, is_special
from app.store import (
    SCHEMA_VERSION,
    STATUS_INTERRUPTED,
    STATUS_STREAMING,
    Conversation,
    Store,
    StoredCompaction,
    StoredMessage,
    StoreWriteError,
)

ORPHANS_TITLE = "Recovered messages"
# After a damaged page ends a table scan, rowids past it are looked up one by one until this many
# in a row are missing (rows on intact pages stay reachable through the b-tree's interior pages).
PROBE_MISSES = 256
RESTORE_BATCH = 500  # rows per transaction while copying into the fresh database
# SQLite's companions of a database file, moved with it so its last commits stay readable.
COMPANION_SUFFIXES = ("-wal", "-shm", "-journal")
_TEXT_COLUMNS = {
    "conversations": ("title", "system_prompt"),
    "messages": ("role", "content", "reasoning", "status", "finish_reason", "json_mode"),
}
# Schema 5's tables: a database before it has none of them, and that is not damage.
_OPTIONAL_TEXT_COLUMNS = {"projects": ("name", "system_prompt"), "compactions": ("summary",)}
RECOVERED_PROJECT_NAME = "Recovered project"  # a project whose name could not be read


@dataclass
class RecoveryReport:
    problem: str  # what was wrong with the original
    kept_as: Path  # where the original is now
    conversations: int = 0
    messages: int = 0
    projects: int = 0
    compactions: int = 0  # summaries standing in for older messages (schema 5)
    unreadable_rows: int = 0  # rows SQLite could not read at all (lost)
    repaired_values: int = 0  # text with invalid bytes replaced, or unreadable usage/tokens dropped
    incomplete: bool = False  # a table could not be scanned to its end (rows there may be lost)
    into: str = "a new database"

    def summary(self) -> str:
        lines = [
            f"The chat database was damaged ({self.problem}).",
            f"Recovered {self.conversations} chats and {self.messages} messages into {self.into}.",
        ]
        if self.projects or self.compactions:
            lines.append(
                f"Also recovered {self.projects} projects and {self.compactions} chat summaries."
            )
        if self.repaired_values:
            lines.append(
                f"{self.repaired_values} damaged values were repaired (unreadable characters "
                "shown as \ufffd)."
            )
        if self.unreadable_rows:
            lines.append(f"{self.unreadable_rows} rows could not be read and are missing.")
        if self.incomplete:
            lines.append("Part of the file could not be read; messages stored there are missing.")
        lines.append(f"The damaged file is kept as {self.kept_as}")
        return "\n".join(lines)


SQLITE_MAGIC = b"SQLite format 3\0"


def is_damage(exc: sqlite3.Error) -> bool:
    """Whether SQLite's error means the file's content is broken. A locked, unreadable or full
    file is not damage: moving it aside would be wrong."""
    name = getattr(exc, "sqlite_errorname", "") or ""
    text = str(exc).lower()
    return (
        name.startswith(("SQLITE_CORRUPT", "SQLITE_NOTADB"))
        or "malformed" in text
        or "not a database" in text
    )


def database_problem(path: Path) -> str | None:
    """What is wrong with the database at `path`, or None when it is readable as a whole, or
    when the trouble is not damage (missing, locked, unreadable, from a newer version of the app:
    Store reports those)."""
    try:
        # Never a FIFO (the open would block) nor a device (it never ends): app_data moves
        # those aside before asking; here they read as "cannot tell".
        header = _header(path)
    except OSError:
        return None
    if not header:
        return None  # created but never written: Store initialises it
    if header != SQLITE_MAGIC:
        return "not a SQLite database"
    db = None
    try:
        db = _connect_read_only(path)
        db.text_factory = bytes
        check = db.execute("PRAGMA quick_check").fetchone()[0]
        if check != b"ok" and check != "ok":
            return _short(check)
        version = db.execute("PRAGMA user_version").fetchone()[0]
        if version == 0 or version > SCHEMA_VERSION:
            return None  # empty, foreign or newer: Store decides
        for table, columns in (_TEXT_COLUMNS | _OPTIONAL_TEXT_COLUMNS).items():
            names = _column_names(db, table)
            if not names and table in _OPTIONAL_TEXT_COLUMNS:
                continue  # a database before schema 5 (Store migrates it)
            if not names:
                return f"table {table} is missing"
            # Only the text columns: usage/tokens JSON is read leniently by the store (a bad value
            # costs that value), and parsing megabytes of token lists would slow every start.
            present = [c for c in columns if c in names]
            sql = f"SELECT id, {', '.join(present)} FROM {table}"
            for row in db.execute(sql):
                for column, value in zip(present, row[1:], strict=True):
                    if not _decodes(value):
                        return f"{table} row {row[0]}: {column} is not valid UTF-8"
        return None
    except sqlite3.Error as exc:
        return _short(str(exc)) if is_damage(exc) else None
    finally:
        if db is not None:
            db.close()


def _header(path: Path) -> bytes:
    """The first bytes of the regular file at `path` (OSError for anything else, unopened)."""
    check_regular(path)
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))  # a FIFO swapped in: no wait
    with os.fdopen(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
            raise NotRegularFileError(path, "not a regular file")
        return f.read(len(SQLITE_MAGIC))


def _connect_read_only(path: Path) -> sqlite3.Connection:
    """Like store.open_read_only, but raising SQLite's error so it can be told apart."""
    error: sqlite3.Error | None = None
    for mode in ("mode=ro", "immutable=1"):
        try:
            db = sqlite3.connect(f"{path.resolve().as_uri()}?{mode}", uri=True)
        except sqlite3.Error as exc:
            error = exc
            continue
        try:
            db.execute("SELECT count(*) FROM sqlite_master").fetchone()
            return db
        except sqlite3.Error as exc:
            db.close()
            error = exc
            if is_damage(exc):
                break
    raise error


def keep_aside(path: Path, now: float | None = None) -> Path:
    """Rename `path` (and its -wal/-shm/-journal) to `<name>.damaged-YYYYmmdd-HHMMSS`, never
    overwriting an earlier one; returns the new database path."""
    stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(now))
    target = path.with_name(f"{path.name}.damaged-{stamp}")
    n = 1
    while target.exists():
        n += 1
        target = path.with_name(f"{path.name}.damaged-{stamp}-{n}")
    path.rename(target)
    for suffix in COMPANION_SUFFIXES:
        companion = path.with_name(path.name + suffix)
        if companion.exists():
            companion.rename(target.with_name(target.name + suffix))
    with contextlib.suppress(OSError):
        target.chmod(0o600)  # still the user's chats
    return target


def recover_into(
    damaged: Path, store: Store, report: RecoveryReport, scratch_parent: Path | None = None
) -> RecoveryReport:
    """Copy every readable conversation and message of `damaged` into `store` (a fresh one).
    Works on a scratch copy (in `scratch_parent`, else the system's temporary directory), so the
    damaged original is never written to."""
    with tempfile.TemporaryDirectory(prefix=".recovery-", dir=scratch_parent) as scratch:
        db = _working_copy(damaged, Path(scratch))
        if db is None:
            return report
        try:
            projects = _recover_projects(db, store, report)
            _recover_conversations(db, store, report, projects)
            placed_in = _recover_messages(db, store, report)
            _recover_compactions(db, store, report, placed_in)
        finally:
            db.close()
    return report


def recover_database(path: Path, problem: str) -> tuple[Store, RecoveryReport]:
    """Keep the damaged file at `path` aside, create a fresh database there, copy into it."""
    kept = keep_aside(path)
    try:
        store = Store(path)
    except (OSError, sqlite3.Error) as exc:  # e.g. the disk is full too
        store, report = recover_in_memory(kept, problem)
        report.problem += f"; a new database could not be created: {exc}"
        return store, report
    report = RecoveryReport(problem=problem, kept_as=kept)
    try:
        recover_into(kept, store, report, scratch_parent=path.parent)
    except (sqlite3.Error, StoreWriteError, OSError) as exc:
        # Whatever was copied stays; the rest is in the kept file.
        report.problem += f"; recovery stopped early: {exc}"
    return store, report


def recover_in_memory(path: Path, problem: str) -> tuple[Store, RecoveryReport]:
    """For a damaged database that cannot be moved (read-only directory): what is readable, in an
    in-memory store; the file stays where it is."""
    store = Store.in_memory_copy(path.with_name(path.name + ".absent"))
    report = RecoveryReport(problem=problem, kept_as=path, into="this window (not saved)")
    try:
        recover_into(path, store, report)
    except (sqlite3.Error, StoreWriteError, OSError) as exc:
        report.problem += f"; recovery stopped early: {exc}"
    return store, report


def _working_copy(damaged: Path, scratch: Path) -> sqlite3.Connection | None:
    """A readable copy of `damaged` (with its WAL), or None. A truncated file's header still
    counts the missing pages and SQLite then refuses the whole file; the copy's header is
    corrected to the pages actually present."""
    copy = scratch / "copy.sqlite3"
    if is_special(damaged) is not None:
        return None  # a device would be copied without end, a FIFO would block: nothing to read
    shutil.copyfile(damaged, copy)
    wal = damaged.with_name(damaged.name + "-wal")
    if wal.exists() and is_special(wal) is None:
        shutil.copyfile(wal, scratch / "copy.sqlite3-wal")
    db = _open_checked(copy)
    if db is None and _fix_page_count(copy):
        db = _open_checked(copy)
    if db is not None:
        db.text_factory = bytes
    return db


def _open_checked(path: Path) -> sqlite3.Connection | None:
    # A table whose root page was cut off (a truncated file: since schema 5 the search index's
    # pages put later tables far into the file) makes SQLite refuse the whole schema. With
    # writable_schema on it reads the schema as it is, so the tables whose pages remain can
    # still be read; nothing is ever written to this working copy.
    for tolerate_schema in (False, True):
        try:
            db = sqlite3.connect(path)
        except sqlite3.Error:
            return None
        try:
            if tolerate_schema:
                db.execute("PRAGMA writable_schema=ON")
            db.execute("SELECT count(*) FROM sqlite_master").fetchone()
            return db
        except sqlite3.Error:
            db.close()
    return None


def _fix_page_count(path: Path) -> bool:
    """Set the header's database size (bytes 28-31) to the whole pages in the file."""
    with open(path, "r+b") as f:
        header = f.read(100)
        if len(header) < 100 or not header.startswith(b"SQLite format 3\0"):
            return False
        page_size = int.from_bytes(header[16:18], "big")
        page_size = 65536 if page_size == 1 else page_size
        if page_size < 512 or page_size & (page_size - 1):
            return False
        pages = path.stat().st_size // page_size
        f.seek(28)
        f.write(pages.to_bytes(4, "big"))
    return True


def _recover_projects(db: sqlite3.Connection, store: Store, report: RecoveryReport) -> set[int]:
    """Every readable project (schema 5), with its id so the chats' project_id still names it;
    returns the ids restored."""
    restored: set[int] = set()
    if not _column_names(db, "projects"):
        return restored  # before schema 5, or the table's schema entry is lost
    with store.restoring():
        for rowid in _row_ids(db, "projects", report):
            record = _read_row(db, "projects", rowid, report)
            if record is None:
                continue
            project = Project(
                id=int(record["id"]),
                # Control characters or a blank name would not pass clean_name; the name is
                # what the user gave, so only an empty one is replaced.
                name=_text(record.get("name"), report).strip() or RECOVERED_PROJECT_NAME,
                system_prompt=_text(record.get("system_prompt"), report),
                settings=ProjectSettings.from_json(_json(record.get("settings_json"), {}, report)),
                position=_int(record.get("position")) or 0,
                created_at=_number(record.get("created_at")),
                updated_at=_number(record.get("updated_at", record.get("created_at"))),
            )
            store.restore_project(project)
            restored.add(project.id)
            report.projects += 1
    return restored


def _recover_conversations(
    db: sqlite3.Connection, store: Store, report: RecoveryReport, projects: set[int]
) -> None:
    with store.restoring():
        _copy_conversations(db, store, report, projects)


def _copy_conversations(
    db: sqlite3.Connection, store: Store, report: RecoveryReport, projects: set[int]
) -> None:
    for rowid in _row_ids(db, "conversations", report):
        record = _read_row(db, "conversations", rowid, report)
        if record is None:
            continue
        project_id = _int(record.get("project_id"))
        tools = _json(record.get("tools_json"), None, report)
        conv = Conversation(
            id=int(record["id"]),
            title=_text(record.get("title"), report) or "Recovered chat",
            system_prompt=_text(record.get("system_prompt"), report),
            created_at=_number(record.get("created_at")),
            updated_at=_number(record.get("updated_at", record.get("created_at"))),
            # A chat whose project row was lost stays, in no project (as when it is deleted).
            project_id=project_id if project_id in projects else None,
        )
        store.restore_conversation(conv, tools=tools if isinstance(tools, dict) else None)
        report.conversations += 1


def _recover_compactions(
    db: sqlite3.Connection, store: Store, report: RecoveryReport, placed_in: dict[int, int]
) -> None:
    """Every readable compaction whose messages were recovered. `placed_in` maps each restored
    message id to the chat it went into, so a compaction follows its messages (into a
    "Recovered messages" chat when its own chat row was lost); covered messages that were lost
    are left out of it, and one that covers none of the recovered messages is dropped."""
    if not _column_names(db, "compactions"):
        return
    with store.restoring():
        for rowid in _row_ids(db, "compactions", report):
            record = _read_row(db, "compactions", rowid, report)
            if record is None:
                continue
            covered_value = _json(record.get("covered_json"), [], report)
            covered = [
                i
                for i in (covered_value if isinstance(covered_value, list) else [])
                if isinstance(i, int) and i in placed_in
            ]
            summary = _text(record.get("summary"), report)
            if not covered or not summary.strip():
                continue
            chat = placed_in[covered[0]]
            covered = [i for i in covered if placed_in[i] == chat]
            receipt = _json(record.get("receipt_json"), None, report)
            store.restore_compaction(
                StoredCompaction(
                    id=int(record["id"]),
                    conversation_id=chat,
                    covered=tuple(covered),
                    summary=summary,
                    active=bool(_int(record.get("active"))),
                    receipt=receipt if isinstance(receipt, dict) else None,
                    created_at=_number(record.get("created_at")),
                )
            )
            report.compactions += 1


@dataclass
class _Key:
    """What placing a message in the recovered tree needs: its ids and tree columns as read."""

    rowid: int
    id: int
    chat: int | None  # its conversation_id as stored (None: unreadable)
    position: int  # its depth on its branch (version 1 had none: 0, id order is the order)
    parent: (
        int | None
    )  # parent_id as stored; None for a first message or a database before the tree
    in_tree: bool  # the database has the tree columns (schema 3+)
    selected: bool


@dataclass
class _Placed:
    key: _Key
    parent: int | None
    selected: bool


def _recover_messages(
    db: sqlite3.Connection, store: Store, report: RecoveryReport
) -> dict[int, int]:
    """Returns each restored message's id -> the chat it was restored into."""
    # The tree columns of every readable row first (keys only, so a large database is not held
    # in memory), the recovered tree planned from them, then the rows copied in batches.
    names = _column_names(db, "messages")
    columns = ["id", "conversation_id"] + [
        c for c in ("position", "parent_id", "selected") if c in names
    ]
    in_tree = "parent_id" in names
    by_chat: dict[int | None, list[_Key]] = {}
    for rowid in _row_ids(db, "messages", report):
        record = _read_row(db, "messages", rowid, report, columns=", ".join(columns))
        if record is None:
            continue
        selected = record.get("selected")
        key = _Key(
            rowid=rowid,
            id=int(record["id"]),
            chat=_int(record.get("conversation_id")),
            position=_int(record.get("position")) or 0,
            parent=_int(record.get("parent_id")),
            in_tree=in_tree,
            selected=selected is None or bool(_int(selected)),
        )
        by_chat.setdefault(key.chat, []).append(key)
    restored_chats = {c.id for c in store.list_conversations()}
    lost_chats = 0
    plan: list[tuple[int, _Placed]] = []  # (chat id in the store, placement), parents first
    for chat in sorted(by_chat, key=lambda c: (c is None, c or 0)):
        target = chat
        if chat is None or chat not in restored_chats:
            # Its conversation row is lost: its messages get a chat of their own. (All of them
            # in one chat made every lost chat's first message a version of one message, so
            # all but one chat were hidden on side branches.)
            lost_chats += 1
            title = ORPHANS_TITLE if lost_chats == 1 else f"{ORPHANS_TITLE} ({lost_chats})"
            target = store.create_conversation(title)
        plan.extend((target, placed) for placed in _plan_tree(by_chat[chat]))
    # Parents are restored before their children; a row that cannot be read now hands its
    # children to its own parent, so nothing below it is lost.
    restored: dict[int, int] = {}  # message id -> position it was restored at
    stand_in: dict[int, int | None] = {}  # unreadable message id -> its parent's id
    placed_in: dict[int, int] = {}  # message id -> the chat it was restored into
    for start in range(0, len(plan), RESTORE_BATCH):
        with store.restoring():
            for conversation_id, placed in plan[start : start + RESTORE_BATCH]:
                parent = placed.parent
                while parent is not None and parent not in restored:
                    parent = stand_in.get(parent)
                record = _read_row(db, "messages", placed.key.rowid, report)
                if record is None:
                    stand_in[placed.key.id] = parent
                    continue
                position = restored[parent] + 1 if parent is not None else 0
                message = _message(record, conversation_id, position, report)
                message.id, message.parent_id = placed.key.id, parent
                store.restore_message(message, selected=placed.selected)
                restored[message.id] = position
                placed_in[message.id] = conversation_id
                report.messages += 1
    return placed_in


def _first_selected(siblings: list[_Key]) -> _Key:
    """The version a group shows: its first selected one, else its newest (Store._branch_of)."""
    return next((k for k in siblings if k.selected), siblings[-1])


def _plan_tree(keys: list[_Key]) -> list[_Placed]:
    """Where each readable message of one chat goes, parents before children, keeping the chat's
    visible branch visible.

    A message keeps its parent when the parent was read and sits one level above it (position is
    the depth, so a damaged parent_id or position shows as a mismatch). The others are detached:
    those sharing a lost parent stay versions of each other and go back where their depth says,
    as the continuation of the visible branch when it ends above that depth (the rows between
    are lost), else as hidden versions at that depth (they were on a side branch). A database
    before the tree has no parents: its messages continue the branch one after another in order.
    Every group of versions ends with exactly one selected."""
    keys = sorted(keys, key=lambda k: (k.position, k.id))
    by_id = {k.id: k for k in keys}
    children: dict[int | None, list[_Key]] = {}
    detached: dict[tuple, list[_Key]] = {}
    for k in keys:
        parent = by_id.get(k.parent) if k.parent is not None else None
        if not k.in_tree:
            detached[("row", k.id)] = [k]
        elif k.parent is None:
            children.setdefault(None, []).append(k)
        elif parent is not None and parent.position == k.position - 1:
            children.setdefault(k.parent, []).append(k)
        else:
            detached.setdefault(("lost", k.parent), []).append(k)
    for siblings in children.values():
        siblings.sort(key=lambda k: k.id)
    chosen: dict[int | None, int] = {p: _first_selected(s).id for p, s in children.items()}

    branch: list[int] = []  # the visible branch as planned so far

    def extend_branch(node: int | None) -> None:
        while node in chosen:
            node = chosen[node]
            branch.append(node)

    extend_branch(None)
    for group in sorted(detached.values(), key=lambda g: (g[0].position, g[0].id)):
        group.sort(key=lambda k: k.id)
        depth = group[0].position
        if group[0].in_tree and len(branch) > depth:  # a message at this depth: a side branch
            anchor = branch[depth - 1] if depth > 0 else None
            children.setdefault(anchor, []).extend(group)
            children[anchor].sort(key=lambda k: k.id)
        else:  # lost rows end the branch above this depth: continue it here
            tail = branch[-1] if branch else None
            children.setdefault(tail, []).extend(group)
            chosen[tail] = _first_selected(group).id
            extend_branch(tail)

    plan: list[_Placed] = []
    level: list[int | None] = [None]
    while level:  # breadth first: every parent is placed before its children
        below: list[int | None] = []
        for parent in level:
            for k in children.get(parent, ()):
                plan.append(_Placed(k, parent, selected=chosen.get(parent) == k.id))
                below.append(k.id)
        level = below
    return plan


def _message(record: dict, conversation_id: int, position: int, report) -> StoredMessage:
    status = _text(record.get("status"), report) or "complete"
    return StoredMessage(
        id=int(record["id"]),
        conversation_id=conversation_id,
        position=position,
        role=_text(record.get("role"), report) or "assistant",
        content=_text(record.get("content"), report),
        reasoning=_text(record.get("reasoning"), report),
        status=STATUS_INTERRUPTED if status == STATUS_STREAMING else status,
        finish_reason=_text(record.get("finish_reason"), report) or None,
        usage=_json(record.get("usage_json"), None, report),
        tokens=_json(record.get("tokens_json"), [], report),
        receipt=_json(record.get("receipt_json"), None, report),
        tool=_json(record.get("tool_json"), None, report),
        json_mode=_text(record.get("json_mode"), report) or "off",
        created_at=_number(record.get("created_at")),
    )


def _row_ids(db: sqlite3.Connection, table: str, report: RecoveryReport) -> list[int]:
    """Every rowid that can be found. A scan of the table b-tree (no index: an index may be the
    damaged part) stops at the first damaged page; past it, rowids are looked up one by one."""
    ids: list[int] = []
    try:
        for (rowid,) in db.execute(f"SELECT rowid FROM {table} NOT INDEXED"):
            ids.append(rowid)
        return ids
    except sqlite3.DatabaseError:
        report.incomplete = True
    rowid, misses = (max(ids) if ids else 0), 0
    while misses < PROBE_MISSES:
        rowid += 1
        try:
            found = db.execute(f"SELECT rowid FROM {table} WHERE rowid=?", (rowid,)).fetchone()
        except sqlite3.DatabaseError:
            found = None
        if found is None:
            misses += 1
        else:
            ids.append(rowid)
            misses = 0
    return ids


def _read_row(
    db: sqlite3.Connection, table: str, rowid: int, report: RecoveryReport, columns: str = "*"
) -> dict | None:
    try:
        cur = db.execute(f"SELECT {columns} FROM {table} WHERE rowid=?", (rowid,))
        row = cur.fetchone()
    except sqlite3.DatabaseError:
        report.unreadable_rows += 1
        return None
    if row is None:
        return None
    record = dict(zip([d[0] for d in cur.description], row, strict=True))
    if record.get("id") is None:
        record["id"] = rowid
    return record


def _column_names(db: sqlite3.Connection, table: str) -> list[str]:
    names = []
    for row in db.execute(f"PRAGMA table_info({table})"):
        name = row[1]
        names.append(name.decode("utf-8", "replace") if isinstance(name, bytes) else name)
    return names


def _decodes(value) -> bool:
    if not isinstance(value, bytes):
        return True
    try:
        value.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


def _json_readable(value) -> bool:
    if value is None or value == b"":
        return True
    if not _decodes(value):
        return False
    try:
        json.loads(value)
    except (ValueError, RecursionError):
        return False
    return True


def _text(value, report: RecoveryReport) -> str:
    if value is None:
        return ""
    if isinstance(value, bytes):
        try:
            return value.decode("utf-8")
        except UnicodeDecodeError:
            report.repaired_values += 1
            return value.decode("utf-8", errors="replace")
    return str(value)


def _json(value, default, report: RecoveryReport):
    if value is None or value == b"":
        return default
    if not _json_readable(value):
        report.repaired_values += 1
        return default
    return json.loads(value)


def _number(value) -> float:
    try:
        return float(value)
    except (TypeError, ValueError):
        return 0.0


def _int(value) -> int | None:
    try:
        return int(value)
    except (TypeError, ValueError):
        return None


def _short(text) -> str:
    if isinstance(text, bytes):
        text = text.decode("utf-8", "replace")
    first = str(text).splitlines()[0] if text else "unknown damage"
    return first[:200]
