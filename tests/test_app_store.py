"""Conversation store: persistence across reopen, search, edit/regenerate truncation, migration
from the version-1 schema, and interrupted replies."""

import sqlite3

import pytest

from app import store as store_mod
from app.store import Store, StoreError


@pytest.fixture
def db_path(tmp_path):
    return tmp_path / "chats.sqlite3"


def test_conversations_and_messages_survive_reopen(db_path):
    s = Store(db_path)
    cid = s.create_conversation("Greetings", system_prompt="Be brief.")
    s.add_message(cid, "user", "Hello?")
    reply = s.begin_reply(cid)
    s.save_partial(reply, "Hi th")
    s.finish_reply(
        reply,
        content="Hi there!",
        reasoning="",
        status="complete",
        finish_reason="stop",
        usage={"prompt_tokens": 12, "completion_tokens": 3},
        tokens=[{"index": 0, "token_id": 5, "text": "Hi", "logprob": -0.1, "top": []}],
    )
    s.close()

    s = Store(db_path)
    [conv] = s.list_conversations()
    assert (conv.title, conv.system_prompt) == ("Greetings", "Be brief.")
    msgs = s.messages(cid)
    assert [(m.role, m.content, m.status) for m in msgs] == [
        ("user", "Hello?", "complete"),
        ("assistant", "Hi there!", "complete"),
    ]
    assert msgs[1].usage == {"prompt_tokens": 12, "completion_tokens": 3}
    assert msgs[1].tokens[0]["text"] == "Hi"
    assert s.integrity_check() == "ok"
    assert s._db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"


def test_streaming_reply_left_behind_is_marked_interrupted(db_path):
    s = Store(db_path)
    cid = s.create_conversation()
    reply = s.begin_reply(cid)
    s.save_partial(reply, "partial te")
    s._db.close()  # like a crash: finish_reply never ran

    s = Store(db_path)
    [m] = s.messages(cid)
    assert (m.content, m.status) == ("partial te", "interrupted")


def test_search_matches_titles_and_message_text(db_path):
    s = Store(db_path)
    a = s.create_conversation("Python questions")
    b = s.create_conversation("Cooking")
    s.add_message(b, "user", "How long to boil an egg (100% soft)?")
    assert [c.id for c in s.list_conversations("python")] == [a]
    assert [c.id for c in s.list_conversations("EGG")] == [b]
    assert [c.id for c in s.list_conversations("100%")] == [b]  # % is literal, not a wildcard
    assert s.list_conversations("nothing like this") == []


def test_rename_delete_and_truncate_for_regenerate(db_path):
    s = Store(db_path)
    cid = s.create_conversation()
    s.rename_conversation(cid, "  ")
    assert s.conversation(cid).title == store_mod.DEFAULT_TITLE
    s.rename_conversation(cid, "Renamed")
    assert s.conversation(cid).title == "Renamed"
    for i, role in enumerate(["user", "assistant", "user", "assistant"]):
        s.add_message(cid, role, f"m{i}")
    s.delete_messages_from(cid, 2)
    assert [m.content for m in s.messages(cid)] == ["m0", "m1"]
    assert s.add_message(cid, "user", "again") and s.messages(cid)[-1].position == 2
    s.delete_conversation(cid)
    assert s.list_conversations() == []
    # ON DELETE CASCADE removed the messages too
    assert s._db.execute("SELECT count(*) FROM messages").fetchone()[0] == 0


def test_version_1_database_migrates_in_place(db_path):
    old = sqlite3.connect(db_path)
    old.executescript(store_mod.SCHEMA_V1)
    old.execute("INSERT INTO conversations(id, title, created_at) VALUES (7, 'Old chat', 100.0)")
    old.executemany(
        "INSERT INTO messages(conversation_id, role, content, created_at) VALUES (7, ?, ?, 100.0)",
        [("user", "first"), ("assistant", "second"), ("user", "third")],
    )
    old.commit()
    old.close()

    s = Store(db_path)
    assert s.schema_version == store_mod.SCHEMA_VERSION
    conv = s.conversation(7)
    assert (conv.title, conv.system_prompt, conv.updated_at) == ("Old chat", "", 100.0)
    msgs = s.messages(7)
    assert [(m.position, m.content, m.status) for m in msgs] == [
        (0, "first", "complete"),
        (1, "second", "complete"),
        (2, "third", "complete"),
    ]
    s.add_message(7, "assistant", "fourth")
    assert s.messages(7)[-1].position == 3
    assert s.integrity_check() == "ok"


def test_newer_or_foreign_database_is_refused(db_path, tmp_path):
    db = sqlite3.connect(db_path)
    db.execute(f"PRAGMA user_version = {store_mod.SCHEMA_VERSION + 1}")
    db.close()
    with pytest.raises(StoreError, match="schema version"):
        Store(db_path)

    foreign = tmp_path / "other.sqlite3"
    db = sqlite3.connect(foreign)
    db.execute("CREATE TABLE t(x)")
    db.close()
    with pytest.raises(StoreError, match="not a LocalChat database"):
        Store(foreign)
