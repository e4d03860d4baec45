"""Import a LocalChat JSON export (File > Import chat...) as a new conversation with its whole tree:
every version of every message, the visible branch, token records when the file has them, and
each reply's receipt, so Details and Replay work on a reply exported from another machine.

The file is hostile input: its size is capped before it is read, its nesting depth is bounded,
every value is type-checked, and the tree must hang together (unique ids, parents that exist, no
cycles, a branch that is a path from a first message). Any problem raises ChatImportError naming
it, before anything is written; the write itself is one transaction (Store.import_conversation).

Formats (app/export.py writes them): version 2 holds `messages` with `id`/`parent_id`, a `branch`
of ids and each reply's `receipt`; version 1 (before the tree) is a flat list in order."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

from engine.errors import ChatImportError
from engine.types import JsonMode, MessageStatus, Role

FORMAT_NAME = "localchat-conversation"
READABLE_VERSIONS = (1, 2)
# A 200-turn chat with receipts exports to a few MB; 64 MiB is generous and still bounded.
MAX_IMPORT_BYTES = 64 * 2**20
# Receipts hold a JSON schema (JSON mode) and the prompt messages; 64 levels is far beyond
# what the app writes and keeps Python's recursion limit out of reach.
MAX_DEPTH = 64
MAX_TITLE_CHARS = 10_000
# What one import may hold. A valid 34.7 MB export of 150,000 messages froze the window at 2.6 GB
# and, being the newest chat, every later start; one 60 MB message froze it for 145 s. A long
# chat with every version is a few thousand messages, and a message of a million characters is
# a book (far beyond any context window).
MAX_IMPORT_MESSAGES = 10_000
MAX_MESSAGE_CHARS = 1_000_000


@dataclass(frozen=True)
class ImportedMessage:
    """One message as the file has it; `key` is its id in the file (not a database id)."""

    key: int
    parent_key: int | None
    role: str
    content: str
    reasoning: str
    status: str
    finish_reason: str | None
    usage: dict | None
    json_mode: str
    created_at: float
    receipt: dict | None
    tokens: list | None
    tool: dict | None = None  # tool calls of a reply, or a tool result's record (app/store.py)


@dataclass(frozen=True)
class ImportedChat:
    title: str
    system_prompt: str
    created_at: float
    messages: tuple[ImportedMessage, ...]  # parents before children
    branch: tuple[int, ...]  # keys of the visible branch, first message first


def read_chat_export(path: Path | str) -> ImportedChat:
    """Read and validate the export at `path`; raises ChatImportError naming the problem."""
    path = Path(path)
    try:
        if not path.is_file():
            raise ChatImportError(path, "not a regular file")
        size = path.stat().st_size
        if size > MAX_IMPORT_BYTES:
            raise ChatImportError(
                path, f"the file is {size:,} bytes; the limit is {MAX_IMPORT_BYTES:,}"
            )
        with open(path, "rb") as f:
            raw = f.read(MAX_IMPORT_BYTES + 1)  # the file may have grown since stat
    except OSError as exc:
        raise ChatImportError(path, f"cannot be read ({exc.strerror or exc})") from None
    if len(raw) > MAX_IMPORT_BYTES:
        raise ChatImportError(path, f"the file is larger than the limit of {MAX_IMPORT_BYTES:,}")
    return parse_chat_export(raw, path)


def parse_chat_export(raw: bytes, path: Path | str = "<export>") -> ImportedChat:
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ChatImportError(path, f"not UTF-8 text (byte {exc.start})") from None
    try:
        data = json.loads(text)
    except RecursionError:
        raise ChatImportError(path, f"JSON nested deeper than {MAX_DEPTH} levels") from None
    except ValueError as exc:
        raise ChatImportError(path, f"not valid JSON ({exc})") from None
    _check_depth(data, path)
    return _Reader(path).chat(data)


def _check_depth(value, path) -> None:
    """Iterative, so a deep value cannot exhaust the stack here either."""
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if depth > MAX_DEPTH:
            raise ChatImportError(path, f"JSON nested deeper than {MAX_DEPTH} levels")
        if isinstance(item, dict):
            stack.extend((v, depth + 1) for v in item.values())
        elif isinstance(item, list):
            stack.extend((v, depth + 1) for v in item)


class _Reader:
    def __init__(self, path):
        self.path = path

    def fail(self, problem: str):
        raise ChatImportError(self.path, problem)

    def chat(self, data) -> ImportedChat:
        if not isinstance(data, dict):
            self.fail("the top level is not a JSON object")
        if data.get("format") != FORMAT_NAME:
            self.fail(f'"format" is {data.get("format")!r}, not a LocalChat export ({FORMAT_NAME})')
        version = data.get("version")
        if type(version) is not int or version not in READABLE_VERSIONS:
            self.fail(
                f'"version" is {version!r}; this app reads export versions '
                + ", ".join(str(v) for v in READABLE_VERSIONS)
            )
        title = self.string(data, "title", "the chat")
        if len(title) > MAX_TITLE_CHARS:
            self.fail(f'"title" is {len(title):,} characters; the limit is {MAX_TITLE_CHARS:,}')
        system_prompt = self.string(data, "system_prompt", "the chat", default="")
        created_at = self.number(data, "created_at", "the chat", default=0.0)
        items = data.get("messages")
        if not isinstance(items, list):
            self.fail('"messages" is not a list')
        if len(items) > MAX_IMPORT_MESSAGES:
            self.fail(
                f"the chat has {len(items):,} messages; the limit is {MAX_IMPORT_MESSAGES:,} "
                "messages per imported chat"
            )
        if version == 1:
            messages = [
                self.message(item, i, key=i, parent_key=i - 1 if i else None)
                for i, item in enumerate(items)
            ]
            branch = tuple(m.key for m in messages)
        else:
            messages = [self.message(item, i) for i, item in enumerate(items)]
            branch = self.branch(data.get("branch"))
        ordered = self.tree_order(messages, branch)
        return ImportedChat(title, system_prompt, created_at, ordered, branch)

    # --- one message --------------------------------------------------------------------------
    def message(
        self, item, index: int, key: int | None = None, parent_key: int | None = None
    ) -> ImportedMessage:
        where = f"message {index + 1}"
        if not isinstance(item, dict):
            self.fail(f"{where} is not a JSON object")
        if key is None:
            key = self.integer(item, "id", where)
            parent = item.get("parent_id")
            parent_key = None if parent is None else self.integer(item, "parent_id", where)
        role = self.choice(item, "role", where, [r.value for r in Role])
        status = self.choice(
            item, "status", where, [s.value for s in MessageStatus], MessageStatus.COMPLETE
        )
        if status == MessageStatus.STREAMING:
            # it was being written when exported; here nothing is streaming it
            status = MessageStatus.INTERRUPTED
        finish = item.get("finish_reason")
        if finish is not None and not isinstance(finish, str):
            self.fail(f'{where}: "finish_reason" is {type(finish).__name__}, not text')
        return ImportedMessage(
            key=key,
            parent_key=parent_key,
            role=role,
            content=self.text(item, "content", where),
            reasoning=self.text(item, "reasoning", where, default=""),
            status=status,
            finish_reason=finish,
            usage=self.optional_object(item, "usage", where),
            json_mode=self.choice(
                item, "json_mode", where, [m.value for m in JsonMode], JsonMode.OFF
            ),
            created_at=self.number(item, "created_at", where, default=0.0),
            receipt=self.receipt(item, where),
            tokens=self.tokens(item, where),
            tool=self.optional_object(item, "tool", where),
        )

    def receipt(self, item: dict, where: str) -> dict | None:
        receipt = self.optional_object(item, "receipt", where)
        if receipt is None:
            return None
        # The sections Details and Replay read; their insides are checked when replayed
        # (engine/receipt.py raises ReceiptError naming what is missing).
        for section in ("model", "prompt", "preset", "output"):
            if section in receipt and not isinstance(receipt[section], dict):
                self.fail(f'{where}: receipt "{section}" is not a JSON object')
        return receipt

    def tokens(self, item: dict, where: str) -> list | None:
        tokens = item.get("tokens")
        if tokens is None:
            return None
        if not isinstance(tokens, list) or not all(isinstance(t, dict) for t in tokens):
            self.fail(f'{where}: "tokens" is not a list of token records')
        return tokens

    # --- the tree -----------------------------------------------------------------------------
    def branch(self, value) -> tuple[int, ...]:
        if not isinstance(value, list) or not all(type(v) is int for v in value):
            self.fail('"branch" is not a list of message ids')
        return tuple(value)

    def tree_order(
        self, messages: list[ImportedMessage], branch: tuple[int, ...]
    ) -> tuple[ImportedMessage, ...]:
        by_key: dict[int, ImportedMessage] = {}
        for m in messages:
            if m.key in by_key:
                self.fail(f"message id {m.key} appears twice")
            by_key[m.key] = m
        for m in messages:
            if m.parent_key is not None and m.parent_key not in by_key:
                self.fail(f"message {m.key}'s parent_id {m.parent_key} is not in the file")
        # Parents before children, breadth first from the first messages: a message never
        # reached sits on a cycle of parents (or hangs below one).
        children: dict[int | None, list[ImportedMessage]] = {}
        for m in messages:
            children.setdefault(m.parent_key, []).append(m)
        ordered: list[ImportedMessage] = []
        frontier = list(children.get(None, []))
        while frontier:
            ordered.extend(frontier)
            frontier = [c for m in frontier for c in children.get(m.key, [])]
        if len(ordered) != len(messages):
            reached = {m.key for m in ordered}
            stuck = sorted(m.key for m in messages if m.key not in reached)
            self.fail(f"the parents of messages {stuck[:10]} form a cycle")
        previous: int | None = None
        for key in branch:
            m = by_key.get(key)
            if m is None:
                self.fail(f"the branch names message {key}, which is not in the file")
            if m.parent_key != previous:
                self.fail(f"the branch is not a path: message {key} does not follow {previous}")
            previous = key
        if messages and not branch:
            self.fail("the branch is empty but the file has messages")
        return tuple(ordered)

    # --- typed fields -------------------------------------------------------------------------
    def string(self, item: dict, name: str, where: str, default: str | None = None) -> str:
        value = item.get(name, default)
        if not isinstance(value, str):
            self.fail(f'{where}: "{name}" is {_kind(value)}, not text')
        return value

    def text(self, item: dict, name: str, where: str, default: str | None = None) -> str:
        """A message's text, at most MAX_MESSAGE_CHARS characters."""
        value = self.string(item, name, where, default)
        if len(value) > MAX_MESSAGE_CHARS:
            self.fail(
                f'{where}: "{name}" is {len(value):,} characters; the limit is '
                f"{MAX_MESSAGE_CHARS:,} characters per message"
            )
        return value

    def integer(self, item: dict, name: str, where: str) -> int:
        value = item.get(name)
        if type(value) is not int:  # bool is an int subclass; true is not an id
            self.fail(f'{where}: "{name}" is {_kind(value)}, not an integer id')
        return value

    def number(self, item: dict, name: str, where: str, default: float) -> float:
        value = item.get(name, default)
        if type(value) not in (int, float) or not math.isfinite(value):
            self.fail(f'{where}: "{name}" is {_kind(value)}, not a finite number')
        return float(value)

    def choice(
        self, item: dict, name: str, where: str, allowed: list[str], default: str | None = None
    ) -> str:
        value = item.get(name, default)
        if value not in allowed or not isinstance(value, str):
            self.fail(f'{where}: "{name}" is {value!r}; one of {", ".join(allowed)} was expected')
        return value

    def optional_object(self, item: dict, name: str, where: str) -> dict | None:
        value = item.get(name)
        if value is not None and not isinstance(value, dict):
            self.fail(f'{where}: "{name}" is {_kind(value)}, not a JSON object')
        return value


def _kind(value) -> str:
    if value is None:
        return "missing"
    return {bool: "true/false", int: "a number", float: "a number", str: "text"}.get(
        type(value), "a list" if isinstance(value, list) else "an object"
    )
