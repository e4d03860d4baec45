"""Schema 5 (projects, compactions, the search index) and the store's project and search API,
on real SQLite files."""

from __future__ import annotations

import json
import sqlite3

import pytest

from app import store as store_mod
from app.names import (
    EmptyNameError,
    InvalidNameError,
    NameControlCharacterError,
    NameTooLongError,
    clean_name,
)
from app.project_settings import Project, ProjectSettings, chat_defaults
from app.store import SCHEMA_V4, SCHEMA_VERSION, Store, StoreError


def _v4_database(path):
    """A database as the schema-4 release wrote it: two chats, a branched tree with receipts and
    tool calls, a streaming reply the app was killed during, and a chat backend binding."""
    db = sqlite3.connect(path)
    db.executescript(SCHEMA_V4)
    db.execute(
        "INSERT INTO conversations(id, title, system_prompt, tools_json, created_at, updated_at)"
        " VALUES (1, 'Lighthouse keeping', 'Be brief.', ?, 10.0, 20.0)",
        (json.dumps({"enabled": ["builtin:calculator"]}),),
    )
    db.execute(
        "INSERT INTO conversations(id, title, system_prompt, created_at, updated_at)"
        " VALUES (2, 'Bread', '', 11.0, 30.0)"
    )
    rows = [
        # id, conversation, position, role, content, status, parent, selected, receipt, tool
        (1, 1, 0, "user", "How often is the lamp cleaned?", "complete", None, 1, None, None),
        (2, 1, 1, "assistant", "Weekly, with a soft cloth.", "complete", 1, 0, '{"seed": 1}', None),
        (3, 1, 1, "assistant", "Daily during fog season.", "complete", 1, 1, '{"seed": 2}', None),
        (4, 1, 2, "tool", "42", "complete", 3, 1, None, '{"tool_call_id": "c1"}'),
        (5, 2, 0, "user", "Sourdough starter ratio?", "complete", None, 1, None, None),
        (6, 2, 1, "assistant", "Equal flour and wat", "streaming", 5, 1, None, None),
    ]
    db.executemany(
        "INSERT INTO messages(id, conversation_id, position, role, content, status, parent_id,"
        " selected, receipt_json, tool_json, created_at) VALUES (?,?,?,?,?,?,?,?,?,?,1.0)",
        rows,
    )
    db.execute(
        "CREATE TABLE chat_backends (conversation_id INTEGER PRIMARY KEY REFERENCES"
        " conversations(id) ON DELETE CASCADE, kind TEXT NOT NULL, connection_id TEXT,"
        " model TEXT NOT NULL)"
    )
    db.execute("INSERT INTO chat_backends VALUES (2, 'remote', 'lan', 'qwen')")
    db.commit()
    db.close()


def _columns(db: sqlite3.Connection, table: str) -> dict[str, tuple]:
    return {r[1]: (r[2], r[3], r[4]) for r in db.execute(f"PRAGMA table_info({table})")}


def _hits(store: Store, query: str) -> set[int]:
    return {
        r[0]
        for r in store._db.execute(
            "SELECT rowid FROM message_search WHERE message_search MATCH ?", (query,)
        )
    }


def test_a_schema_4_database_migrates_to_5_without_loss(tmp_path):
    path = tmp_path / "v4.sqlite3"
    _v4_database(path)
    store = Store(path)
    try:
        assert store.schema_version == SCHEMA_VERSION == 5
        assert store.integrity_check() == "ok"
        chats = {c.id: c for c in store.list_conversations()}
        assert chats[1].title == "Lighthouse keeping" and chats[1].system_prompt == "Be brief."
        assert store.chat_tools(1) == {"enabled": ["builtin:calculator"]}
        assert [m.id for m in store.branch(1)] == [1, 3, 4]
        assert store.receipt(3) == {"seed": 2} and store.receipt(2) == {"seed": 1}
        assert store.branch(1)[1].version_ids == (2, 3)
        assert store.branch(1)[2].tool == {"tool_call_id": "c1"}
        assert store.chat_backend(2).model == "qwen"
        # The reply that was streaming when the old app died is kept, marked interrupted, and
        # searchable like any finished one.
        assert store.message(6).status == "interrupted" and store.message(6).content.endswith("wat")
        assert _hits(store, "fog") == {3}
        assert _hits(store, "weekly") == {2}  # an unselected version is still found
        assert _hits(store, "wat") == {6}
        assert {
            r[0]
            for r in store._db.execute(
                "SELECT rowid FROM title_search WHERE title_search MATCH 'bread'"
            )
        } == {2}
        projects = store._db.execute("SELECT project_id FROM conversations").fetchall()
        assert [tuple(r) for r in projects] == [(None,), (None,)]
    finally:
        store.close()


def test_the_migrated_schema_is_the_schema_a_new_database_gets(tmp_path):
    """A user who upgraded and a new user must have the same tables and columns, or a later
    migration written against one breaks the other."""
    _v4_database(tmp_path / "old.sqlite3")
    Store(tmp_path / "old.sqlite3").close()
    Store(tmp_path / "new.sqlite3").close()
    old, new = sqlite3.connect(tmp_path / "old.sqlite3"), sqlite3.connect(tmp_path / "new.sqlite3")
    names = "SELECT name FROM sqlite_master WHERE name NOT LIKE 'sqlite_%' ORDER BY name"
    assert [r[0] for r in old.execute(names)] == [r[0] for r in new.execute(names)]
    for table in ("conversations", "messages", "projects", "compactions"):
        assert _columns(old, table) == _columns(new, table), table
    assert _columns(new, "conversations")["project_id"] == ("INTEGER", 0, None)
    fks = {(r[2], r[3], r[6]) for r in old.execute("PRAGMA foreign_key_list(conversations)")}
    assert ("projects", "project_id", "SET NULL") in fks


def test_a_failed_migration_leaves_the_version_4_database_as_it_was(tmp_path, monkeypatch):
    path = tmp_path / "v4.sqlite3"
    _v4_database(path)

    def broken(self):
        raise sqlite3.OperationalError("disk I/O error")

    monkeypatch.setattr(Store, "_create_search_index", broken)
    with pytest.raises(sqlite3.OperationalError):
        Store(path)
    db = sqlite3.connect(path)
    assert db.execute("PRAGMA user_version").fetchone()[0] == 4
    assert "project_id" not in _columns(db, "conversations")
    assert db.execute("SELECT name FROM sqlite_master WHERE name='projects'").fetchone() is None
    assert db.execute("SELECT count(*) FROM messages").fetchone()[0] == 6


def test_the_index_follows_inserts_edits_finished_replies_and_deletes(tmp_path):
    store = Store(tmp_path / "c.sqlite3")
    chat = store.create_conversation("Walks")
    store.add_message(chat, "user", "a cliff path near Zennor")
    reply = store.begin_reply(chat)
    store.save_partial(reply, "half written puffin")
    assert _hits(store, "puffin") == set()  # a streaming reply is not indexed yet
    store.finish_reply(
        reply,
        content="puffins nest there",
        reasoning="",
        status="complete",
        finish_reason="stop",
        usage=None,
    )
    assert _hits(store, "puffins") == {reply}
    store.update_message_content(reply, "gannets nest there")
    assert _hits(store, "puffins") == set() and _hits(store, "gannets") == {reply}
    store.delete_conversation(chat)  # the cascade removes the messages' entries too
    assert _hits(store, "gannets") == set() and _hits(store, "zennor") == set()
    store._db.execute("INSERT INTO message_search(message_search) VALUES ('integrity-check')")
    store._db.execute("INSERT INTO title_search(title_search) VALUES ('integrity-check')")
    store.close()


def test_without_fts5_the_triggers_go_and_writes_still_work(tmp_path, monkeypatch):
    """A database with the index, opened by a Python whose SQLite lacks FTS5: the triggers would
    make every message write fail with 'no such module', so they are dropped; reopened with FTS5,
    the index is rebuilt from the rows, including those written meanwhile."""
    path = tmp_path / "c.sqlite3"
    store = Store(path)
    chat = store.create_conversation("Tides")
    store.add_message(chat, "user", "spring tide tables")
    store.close()

    monkeypatch.setattr(store_mod, "fts5_available", lambda: False)
    store = Store(path)
    assert store.search_uses_fts is False
    triggers = "SELECT name FROM sqlite_master WHERE type='trigger'"
    assert store._db.execute(triggers).fetchall() == []
    store.add_message(chat, "user", "neap tide at noon")
    store.close()

    monkeypatch.setattr(store_mod, "fts5_available", lambda: True)
    store = Store(path)
    assert _hits(store, "neap") == {2} and _hits(store, "spring") == {1}
    store._db.execute("INSERT INTO message_search(message_search) VALUES ('integrity-check')")
    store.close()


# --- names ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("typed", "error"),
    [
        ("", EmptyNameError),
        (" \t\n ", EmptyNameError),
        ("x" * 10_000, NameTooLongError),
        ("x" * 201, NameTooLongError),
        ("\x00\x01\x02\x1b[31m", NameControlCharacterError),
        ("Essays\x07", NameControlCharacterError),
        ("txt.exe\u202egpj", NameControlCharacterError),
    ],
)
def test_a_bad_project_name_is_refused_with_a_typed_error_and_nothing_is_written(
    tmp_path, typed, error
):
    store = Store(tmp_path / "c.sqlite3")
    with pytest.raises(error) as info:
        store.create_project(typed)
    assert isinstance(info.value, InvalidNameError) and str(info.value).startswith("The project")
    assert store.projects() == []
    kept = store.create_project("Kept")
    with pytest.raises(error):
        store.rename_project(kept, typed)
    assert [p.name for p in store.projects()] == ["Kept"]
    store.close()


def test_the_error_says_how_long_and_which_character():
    with pytest.raises(NameTooLongError, match="10,000 characters long; the limit is 200"):
        clean_name("x" * 10_000, "project name")
    with pytest.raises(NameControlCharacterError, match=r"character U\+001B; remove it"):
        clean_name("a\x1bb")
    with pytest.raises(NameControlCharacterError, match=r"U\+202E \(RIGHT-TO-LEFT OVERRIDE\)"):
        clean_name("a\u202eb")


def test_a_name_is_trimmed_and_its_line_breaks_become_spaces_but_emoji_stay():
    assert clean_name("  Trip\r\n  to\tRome  ") == "Trip to Rome"
    assert clean_name("x" * 200) == "x" * 200
    family = "\U0001f468\u200d\U0001f469\u200d\U0001f467"  # joined by U+200D (category Cf)
    assert clean_name(f"{family} chats") == f"{family} chats"


# --- projects -------------------------------------------------------------------------------------


def test_projects_are_created_listed_in_order_renamed_and_keep_their_settings(tmp_path):
    path = tmp_path / "c.sqlite3"
    store = Store(path)
    essays = store.create_project("Essays", "You are an editor.")
    code = store.create_project("Code")
    settings = ProjectSettings(
        model="/models/qwen.gguf",
        preset={"temperature": 0.2},
        tools=["builtin:calculator"],
        collections=[3],
        extra={"from_a_newer_app": True},
    )
    store.set_project_settings(code, settings)
    store.rename_project(essays, "  Long essays ")
    store.close()
    store = Store(path)  # read back from the file
    assert [(p.id, p.name) for p in store.projects()] == [(essays, "Long essays"), (code, "Code")]
    assert store.project(essays).system_prompt == "You are an editor."
    assert store.project(code).settings == settings
    store.set_project_system_prompt(code, "Answer with code only.")
    assert store.project(code).system_prompt == "Answer with code only."
    with pytest.raises(StoreError, match="no project 99"):
        store.rename_project(99, "Ghost")
    store.close()


def test_a_damaged_settings_value_costs_that_setting_not_the_project(tmp_path):
    store = Store(tmp_path / "c.sqlite3")
    pid = store.create_project("P")
    store._db.execute(
        "UPDATE projects SET settings_json=? WHERE id=?",
        (json.dumps({"model": 7, "preset": "hot", "tools": ["a", 1], "collections": {}}), pid),
    )
    assert store.project(pid).settings == ProjectSettings(tools=["a"])
    store._db.execute("UPDATE projects SET settings_json='{not json' WHERE id=?", (pid,))
    assert store.project(pid).settings == ProjectSettings()
    store.close()


def test_chats_move_into_and_out_of_projects_and_survive_their_projects_deletion(tmp_path):
    store = Store(tmp_path / "c.sqlite3")
    pid = store.create_project("Trip")
    a = store.create_conversation("Hotels", project_id=pid)
    b = store.create_conversation("Trains")
    store.add_message(b, "user", "Night train to Vienna")
    before = store.conversation(b).updated_at
    store.move_conversation(b, pid)
    assert store.conversation(b).project_id == pid
    assert store.conversation(b).updated_at == before  # moving is not a change to the chat
    store.move_conversation(a, None)
    assert store.conversation(a).project_id is None
    store.move_conversation(a, pid)
    store.delete_project(pid)
    assert store.projects() == []
    assert {c.id: c.project_id for c in store.list_conversations()} == {a: None, b: None}
    assert [m.content for m in store.branch(b)] == ["Night train to Vienna"]
    with pytest.raises(StoreError, match="no project"):
        store.move_conversation(a, pid)
    assert store.conversation(a).project_id is None
    store.close()


# --- search ---------------------------------------------------------------------------------------


def _search_fixture(store: Store) -> dict[str, int]:
    chats = {
        "bread": store.create_conversation("Sourdough"),
        "paris": store.create_conversation("Weekend in Paris"),
        "code": store.create_conversation("Regex help"),
    }
    store.add_message(chats["bread"], "user", "My starter smells of acetone, is it dead?")
    store.add_message(chats["bread"], "assistant", "No: feed it twice a day at 25 °C.")
    store.add_message(chats["paris"], "user", "Where is the best crème brûlée?")
    store.add_message(chats["code"], "user", 'Match "a_b%" literally AND NOT other text')
    return chats


def test_search_finds_titles_and_message_text_with_a_marked_snippet(tmp_path):
    store = Store(tmp_path / "c.sqlite3")
    chats = _search_fixture(store)
    (hit,) = store.search("acetone")
    assert hit.conversation.id == chats["bread"]
    assert hit.message_id == store.branch(chats["bread"])[0].id
    assert hit.snippet == "My starter smells of \ue000acetone\ue001, is it dead?"
    (hit,) = store.search("it")  # both bread messages say "it": the first stands for the chat
    assert hit.message_id == store.branch(chats["bread"])[0].id
    (hit,) = store.search("weekend")
    assert (hit.conversation.id, hit.message_id) == (chats["paris"], None)
    assert hit.snippet == "\ue000Weekend\ue001 in Paris"
    # accents and case are ignored, the last word may be unfinished, every word must be there
    (hit,) = store.search("CREME bru")
    assert hit.conversation.id == chats["paris"]
    assert hit.snippet == "Where is the best \ue000crème\ue001 \ue000brûlée\ue001?"
    assert [h.conversation.id for h in store.search("feed twi")] == [chats["bread"]]
    assert store.search("feed paris") == []
    # what the user types is never query syntax
    assert [h.conversation.id for h in store.search('"a_b%" literally AND NOT')] == [chats["code"]]
    assert store.search('" * ( NEAR') == []
    # punctuation typed with the words must be there as typed
    assert [h.conversation.id for h in store.search("25 °C")] == [chats["bread"]]
    assert store.search("25°C") == []
    assert [h.conversation.id for h in store.search("dead?")] == [chats["bread"]]
    assert store.search("   ") == []
    # list_conversations(search) is the same set, newest first
    assert [c.id for c in store.list_conversations("paris")] == [chats["paris"]]
    store.close()


def test_without_fts5_search_falls_back_to_a_substring_match(tmp_path, monkeypatch):
    monkeypatch.setattr(store_mod, "fts5_available", lambda: False)
    store = Store(tmp_path / "c.sqlite3")
    chats = _search_fixture(store)
    assert store.search_uses_fts is False
    (hit,) = store.search("ACETONE")
    assert hit.conversation.id == chats["bread"]
    assert hit.snippet == "My starter smells of \ue000acetone\ue001, is it dead?"
    # LIKE's wildcards are literal here
    assert [h.conversation.id for h in store.search("a_b%")] == [chats["code"]]
    assert store.search("a%b") == []
    (hit,) = store.search("weekend")
    assert hit.snippet == "\ue000Weekend\ue001 in Paris"
    store.close()


# --- what a chat in a project uses ----------------------------------------------------------------


def _project(**settings) -> Project:
    return Project(1, "Essays", "You are an editor.", ProjectSettings(**settings), 0, 0.0, 0.0)


def test_a_chat_uses_its_own_prompt_and_tools_else_its_projects():
    project = _project(tools=["builtin:calculator"], model="/m.gguf", preset={"temperature": 0.1})
    d = chat_defaults("", {}, project)
    assert (d.system_prompt, d.system_prompt_source) == ("You are an editor.", "project")
    assert (d.tools, d.tools_source) == (("builtin:calculator",), "project")
    assert (d.model, d.preset) == ("/m.gguf", {"temperature": 0.1})
    assert d.source_text(d.system_prompt_source) == "project “Essays”"
    d = chat_defaults("Be terse.", {"enabled": []}, project)
    assert (d.system_prompt, d.system_prompt_source) == ("Be terse.", "chat")
    assert (d.tools, d.tools_source) == ((), "chat")  # all tools off is the chat's own choice
    d = chat_defaults("  ", {"always": ["x"]}, None)
    assert (d.system_prompt, d.system_prompt_source, d.tools, d.tools_source) == ("", "", (), "")
    assert chat_defaults("", {}, _project()).tools_source == ""  # the project sets no tools


def test_a_long_messages_snippet_is_cut_at_words_around_the_first_match(tmp_path):
    store = Store(tmp_path / "c.sqlite3")
    chat = store.create_conversation("Long")
    # the match at 120; 40 characters before it, 80 after, moved out of the words they cut
    store.add_message(chat, "user", "alpha " * 20 + "needle here " + "omega " * 30)
    (hit,) = store.search("needle")
    assert hit.snippet == (
        "…" + "alpha " * 6 + "\ue000needle\ue001 here " + "omega " * 11 + "omega…"
    )
    store.close()
