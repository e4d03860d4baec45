"""File > Import chat: a LocalChat JSON export (version 2, or version 1 from before the tree) comes
back as a new chat with the same tree, branch and receipts; a hostile or corrupted file is refused
with ChatImportError naming the problem and the database is left exactly as it was."""

import json
import sqlite3

import pytest

from app.chat_import import MAX_IMPORT_BYTES, ImportedChat, ImportedMessage, read_chat_export
from app.export import to_json
from app.store import Store
from engine.errors import ChatImportError
from engine.receipt import ModelDigests, file_sha256, model_file_note

RECEIPT = {
    "model": {"file_name": "m.gguf", "sha256": "ab" * 32, "size_bytes": 3, "architecture": "x"},
    "preset": {"values": {"temperature": 0.7}, "seed_used": 11, "sources": {}},
    "prompt": {"token_ids": [1, 2, 3], "messages": [{"role": "user", "content": "Hi"}]},
    "output": {"token_ids": [4, 5], "finish_reason": "stop"},
}


def build_tree(store: Store) -> int:
    """A chat with versions at two levels, a first message with two versions, receipts, and a
    branch that is not the newest path (so 'newest wins' would be caught)."""
    cid = store.create_conversation("Tree ✓", system_prompt="Be brief.")
    q1 = store.add_message(cid, "user", "Q1")
    a1 = store.add_message(
        cid, "assistant", "A1", usage={"prompt_tokens": 3}, receipt=RECEIPT, reasoning="hm"
    )
    store.add_message(cid, "assistant", "A1 v2", parent_id=q1, receipt={**RECEIPT, "v": 2})
    follow = store.add_message(cid, "user", "follow-up", parent_id=a1)
    a2 = store.add_message(
        cid, "assistant", "A2", json_mode="object", receipt={**RECEIPT, "v": 3}, parent_id=follow
    )
    call = {"id": "call_1", "type": "function", "function": {"name": "calc", "arguments": "{}"}}
    store.set_tool(a2, {"tool_calls": [call]})  # a reply that called a tool (schema 4)
    store.add_message(cid, "user", "Q1 edited", parent_id=None)
    store.select_version(q1)
    store.select_version(a1)
    return cid


def shape(store: Store, cid: int):
    """The chat as plain data without database ids: each message's fields with its children
    nested (oldest first), and the visible branch as contents."""
    tree = store.tree(cid)
    children: dict = {}
    for m in tree:
        children.setdefault(m.parent_id, []).append(m)

    def node(m):
        fields = (m.role, m.content, m.reasoning, m.status, m.finish_reason, m.usage, m.json_mode)
        return (fields, m.created_at, m.receipt, m.tool, [node(c) for c in children.get(m.id, [])])

    conv = store.conversation(cid)
    return (
        conv.title,
        conv.system_prompt,
        conv.created_at,
        [node(m) for m in children.get(None, [])],
        [m.content for m in store.branch(cid)],
    )


def export_file(store: Store, cid: int, path):
    conv = store.conversation(cid)
    path.write_text(to_json(conv, store.branch(cid), store.tree(cid)), encoding="utf-8")
    return path


def snapshot(store: Store):
    db = store._db
    return (
        db.execute("SELECT * FROM conversations ORDER BY id").fetchall(),
        db.execute("SELECT * FROM messages ORDER BY id").fetchall(),
    )


def test_export_then_import_gives_the_same_tree_branch_and_receipts(tmp_path):
    here = Store(tmp_path / "here.sqlite3")
    cid = build_tree(here)
    file = export_file(here, cid, tmp_path / "chat.json")
    there = Store(tmp_path / "there.sqlite3")  # the other machine
    there.create_conversation("already here")
    new = there.import_conversation(read_chat_export(file))
    assert shape(there, new) == shape(here, cid)
    assert [m.content for m in there.branch(new)] == ["Q1", "A1", "follow-up", "A2"]
    imported_a1 = there.branch(new)[1]
    assert (imported_a1.version_number, imported_a1.version_count) == (1, 2)
    assert there.receipt(imported_a1.id) == RECEIPT
    # choosing another version works on the imported tree as on the original
    there.select_version(imported_a1.version_ids[1])
    assert [m.content for m in there.branch(new)] == ["Q1", "A1 v2"]
    here.close()
    there.close()


def test_a_version_1_export_imports_as_a_linear_chat(tmp_path):
    # Written by hand in the shape app/export.py had at version 1 (git show 2bdc366^:app/export.py)
    v1 = {
        "format": "localchat-conversation",
        "version": 1,
        "title": "Old",
        "system_prompt": "",
        "created_at": 100.0,
        "messages": [
            {"role": "user", "content": "Hello", "reasoning": "", "status": "complete",
             "finish_reason": None, "usage": None, "json_mode": "off", "created_at": 101.0},
            {"role": "assistant", "content": "Hi!", "reasoning": "", "status": "streaming",
             "finish_reason": None, "usage": {"completion_tokens": 2}, "json_mode": "off",
             "created_at": 102.0},
        ],
    }  # fmt: skip
    file = tmp_path / "old.json"
    file.write_text(json.dumps(v1))
    store = Store(tmp_path / "s.sqlite3")
    cid = store.import_conversation(read_chat_export(file))
    branch = store.branch(cid)
    assert [(m.role, m.content, m.status, m.usage) for m in branch] == [
        ("user", "Hello", "complete", None),
        ("assistant", "Hi!", "interrupted", {"completion_tokens": 2}),  # not streaming here
    ]
    assert branch[1].parent_id == branch[0].id and store.conversation(cid).created_at == 100.0
    store.close()


def valid_export(tmp_path) -> dict:
    store = Store(tmp_path / "src.sqlite3")
    cid = build_tree(store)
    data = json.loads(to_json(store.conversation(cid), store.branch(cid), store.tree(cid)))
    store.close()
    return data


def cycle(data):
    ids = [m["id"] for m in data["messages"]]
    first = next(m for m in data["messages"] if m["parent_id"] is None)
    first["parent_id"] = ids[-1]  # the chat's root now hangs below its own descendant
    for m in data["messages"]:
        if m["parent_id"] is None:
            m["parent_id"] = ids[-1]


def deep(levels):
    """A receipt holding a list nested `levels` deep (written as text: json.dumps refuses
    very deep values). 100 is past our limit (64) and within what json parses; 5000 is past
    Python's recursion limit."""

    def spoil(data):
        next(m for m in data["messages"] if m["receipt"])["receipt"]["deep"] = "DEEP"
        return json.dumps(data).replace('"DEEP"', "[" * levels + "]" * levels)

    return spoil


HOSTILE = {
    "a parent cycle": (cycle, "form a cycle"),
    "an id that is text": (lambda d: d["messages"][0].update(id="1"), '"id" is text'),
    "an id that is true": (lambda d: d["messages"][0].update(id=True), "not an integer id"),
    "content that is a number": (lambda d: d["messages"][2].update(content=5), '"content"'),
    "an unknown role": (lambda d: d["messages"][0].update(role="root"), "\"role\" is 'root'"),
    "a receipt that is a list": (lambda d: d["messages"][1].update(receipt=[1]), '"receipt"'),
    "a duplicate id": (
        lambda d: d["messages"][1].update(id=d["messages"][0]["id"]),
        "appears twice",
    ),
    "a missing parent": (lambda d: d["messages"][3].update(parent_id=999), "not in the file"),
    "a branch that skips a message": (lambda d: d["branch"].pop(1), "not a path"),
    "another format": (lambda d: d.update(format="chatgpt"), "not a LocalChat export"),
    "a newer version": (lambda d: d.update(version=3), '"version" is 3'),
    "a time that is infinite": (lambda d: d.update(created_at=float("inf")), "finite number"),
    "nesting 100 deep": (deep(100), "nested deeper"),
    "nesting 5000 deep": (deep(5000), "nested deeper"),
}


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_a_hostile_file_is_refused_by_name_and_nothing_is_imported(tmp_path, name):
    spoil, problem = HOSTILE[name]
    data = valid_export(tmp_path)
    text = spoil(data)
    file = tmp_path / "bad.json"
    file.write_text(text if isinstance(text, str) else json.dumps(data))
    store = Store(tmp_path / "s.sqlite3")
    build_tree(store)
    before = snapshot(store)
    with pytest.raises(ChatImportError) as caught:
        store.import_conversation(read_chat_export(file))
    assert problem in caught.value.problem, caught.value.problem
    assert snapshot(store) == before
    store.close()


def test_bad_json_and_a_huge_file_are_refused_before_anything_is_written(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text('{"format": "localchat-conversation", "version": 2, "messages": [')
    with pytest.raises(ChatImportError, match="not valid JSON"):
        read_chat_export(bad)
    huge = tmp_path / "huge.json"
    with open(huge, "wb") as f:
        f.truncate(MAX_IMPORT_BYTES + 1)  # sparse: costs no disk
    with pytest.raises(ChatImportError, match="the limit is"):
        read_chat_export(huge)
    with pytest.raises(ChatImportError, match="not a regular file"):
        read_chat_export(tmp_path)


def test_a_failure_halfway_through_the_write_leaves_the_database_unchanged(tmp_path):
    store = Store(tmp_path / "s.sqlite3")
    build_tree(store)
    before = snapshot(store)

    def message(key, parent):
        return ImportedMessage(key, parent, "user", "x", "", "complete", None, None, "off", 0.0,
                               None, None)  # fmt: skip

    # Not validated (read_chat_export would refuse it): the third message's parent is missing,
    # so the write fails after the chat and two messages were inserted.
    chat = ImportedChat("t", "", 0.0, (message(1, None), message(2, 1), message(3, 7)), (1, 2))
    with pytest.raises(KeyError):
        store.import_conversation(chat)
    assert snapshot(store) == before
    assert store.integrity_check() == "ok"
    store.close()


def test_a_model_file_hashed_here_is_found_by_its_sha256(tmp_path):
    model = tmp_path / "m.gguf"
    model.write_bytes(b"GGUF model")
    digests = ModelDigests(tmp_path / "digests.json")
    sha = digests.digest(model)
    assert sha == file_sha256(model)
    again = ModelDigests(tmp_path / "digests.json")  # another run of the app
    assert again.path_for(sha) == model.resolve()
    assert again.path_for("cd" * 32) is None
    note = model_file_note(RECEIPT, None)
    assert "m.gguf" in note and "ab" * 32 in note and "not on this machine" in note
    assert str(model) in model_file_note(RECEIPT, model)
    model.write_bytes(b"GGUF model, changed")  # no longer the file that was hashed
    assert ModelDigests(tmp_path / "digests.json").path_for(sha) is None


def test_the_window_imports_a_file_and_names_a_bad_one(qtbot, tmp_path, monkeypatch):
    from tests.app_fakes import FakeEngine, close_window, make_window

    source = Store(tmp_path / "src.sqlite3")
    source_id = build_tree(source)
    file = export_file(source, source_id, tmp_path / "chat.json")
    window = make_window(qtbot, tmp_path, FakeEngine())
    errors = []
    monkeypatch.setattr(window, "show_error", lambda title, text: errors.append((title, text)))
    new = window.import_from(str(file))
    assert new is not None and window.session.conversation_id == new and not errors
    assert shape(window.store, new) == shape(source, source_id)
    assert [w.message.content for w in window.chat_view.widgets] == ["Q1", "A1", "follow-up", "A2"]
    data = json.loads(file.read_text())
    cycle(data)
    file.write_text(json.dumps(data))
    before = snapshot(window.store)
    assert window.import_from(str(file)) is None
    assert errors and errors[0][0] == "Could not import the chat" and "cycle" in errors[0][1]
    assert snapshot(window.store) == before
    source.close()
    close_window(window)


def test_sqlite_rows_compare_by_value():
    # snapshot() relies on it: sqlite3.Row equality compares values, so a changed row shows
    db = sqlite3.connect(":memory:")
    db.row_factory = sqlite3.Row
    a = db.execute("SELECT 1 AS x").fetchall()
    assert a == db.execute("SELECT 1 AS x").fetchall() != db.execute("SELECT 2 AS x").fetchall()
    db.close()


# --- what one import may hold (issue 31) ---------------------------------------------------------
def linear_export(n_messages: int, content: str = "x") -> str:
    messages = [
        {"id": i, "parent_id": i - 1 if i else None, "role": ("user", "assistant")[i % 2],
         "content": content}
        for i in range(n_messages)
    ]  # fmt: skip
    return json.dumps(
        {"format": "localchat-conversation", "version": 2, "title": "long", "system_prompt": "",
         "messages": messages, "branch": list(range(n_messages))}
    )  # fmt: skip


def test_an_import_is_capped_at_10000_messages_by_name(tmp_path):
    file = tmp_path / "long.json"
    file.write_text(linear_export(10_001))
    with pytest.raises(ChatImportError) as caught:
        read_chat_export(file)
    assert caught.value.problem == (
        "the chat has 10,001 messages; the limit is 10,000 messages per imported chat"
    )
    file.write_text(linear_export(10_000))
    store = Store(tmp_path / "s.sqlite3")
    cid = store.import_conversation(read_chat_export(file))
    assert store.branch_window(cid, 1)[1] == 9_999
    store.close()


@pytest.mark.parametrize("field", ["content", "reasoning"])
def test_one_message_is_capped_at_a_million_characters_by_name(tmp_path, field):
    data = valid_export(tmp_path)
    data["messages"][1][field] = "y" * 1_000_001
    file = tmp_path / "big.json"
    file.write_text(json.dumps(data))
    with pytest.raises(ChatImportError) as caught:
        read_chat_export(file)
    assert caught.value.problem == (
        f'message 2: "{field}" is 1,000,001 characters; the limit is 1,000,000 characters per '
        "message"
    )
    data["messages"][1][field] = "y" * 1_000_000
    file.write_text(json.dumps(data))
    chat = read_chat_export(file)
    assert [len(getattr(m, field)) for m in chat.messages].count(1_000_000) == 1
