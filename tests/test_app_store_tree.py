"""The store's tree (schema 3): the migration from the release before it, versions and branches,
lazy token records, and recovery of a damaged database keeping the tree.

tests/fixtures/chats_schema_v2.sqlite3 was written by that release's own Store code (schema 2):
chat "Lighthouse" (system prompt, two turns, reasoning, usage, a token record), chat "JSON chat"
(a JSON-mode reply that was still streaming) and an empty chat.
"""

import shutil
import sqlite3
from pathlib import Path

from app.recovery import RecoveryReport, recover_into
from app.store import SCHEMA_V2, SCHEMA_VERSION, Store

FIXTURE = Path(__file__).parent / "fixtures" / "chats_schema_v2.sqlite3"


def migrated_copy(tmp_path) -> Store:
    db = tmp_path / "chats.sqlite3"
    shutil.copyfile(FIXTURE, db)
    return Store(db)


def test_a_schema_2_database_migrates_without_loss(tmp_path):
    assert sqlite3.connect(FIXTURE).execute("PRAGMA user_version").fetchone()[0] == 2
    store = migrated_copy(tmp_path)
    assert store.schema_version == SCHEMA_VERSION == 4  # through 3 (tree) to 4 (tools)
    chats = {c.title: c for c in store.list_conversations()}
    assert set(chats) == {"Lighthouse", "JSON chat", "Empty chat"}
    assert chats["Lighthouse"].system_prompt == "Be brief."
    light = store.messages(chats["Lighthouse"].id)
    assert [(m.position, m.role, m.content) for m in light] == [
        (0, "user", "Who keeps the light?"),
        (1, "assistant", "The keeper."),
        (2, "user", "And at night?"),
        (3, "assistant", "He winds the clock."),
    ]
    # Each message is a one-version node whose parent is the message before it.
    assert [m.parent_id for m in light] == [None] + [m.id for m in light[:-1]]
    assert all(m.version_count == 1 and m.version_number == 1 for m in light)
    reply = light[1]
    assert (reply.reasoning, reply.finish_reason, reply.usage["ttft_ms"]) == (
        "short answer",
        "stop",
        12.5,
    )
    assert reply.tokens[0]["token_id"] == 504 and light[3].finish_reason == "length"
    json_chat = store.messages(chats["JSON chat"].id)
    assert [(m.status, m.json_mode, m.content) for m in json_chat] == [
        ("complete", "off", "A colour as JSON"),
        ("interrupted", "object", '{"colour": "bl'),
    ]
    assert store.messages(chats["Empty chat"].id) == []
    assert store.integrity_check() == "ok"

    # The migrated chat grows as a tree: a regenerated reply is a second version of reply 1.
    cid = chats["Lighthouse"].id
    store.add_message(cid, "assistant", "A robot.", parent_id=light[0].id)
    branch = store.messages(cid)
    assert [m.content for m in branch] == ["Who keeps the light?", "A robot."]
    assert (branch[1].version_number, branch[1].version_count) == (2, 2)
    store.select_version(light[1].id)
    assert [m.content for m in store.messages(cid)][-1] == "He winds the clock."
    store.close()


def test_the_v2_ddl_constant_is_what_the_fixture_holds(tmp_path):
    """SCHEMA_V2 (kept for tests and the migration) matches the file the release wrote."""
    fresh = sqlite3.connect(tmp_path / "v2.sqlite3")
    fresh.executescript(SCHEMA_V2)
    release = sqlite3.connect(FIXTURE)
    query = "SELECT type, name, sql FROM sqlite_master ORDER BY name"
    assert fresh.execute(query).fetchall() == release.execute(query).fetchall()
    fresh.close()
    release.close()


def test_the_branch_reader_leaves_token_records_for_when_they_are_asked_for(tmp_path):
    store = migrated_copy(tmp_path)
    cid = next(c.id for c in store.list_conversations() if c.title == "Lighthouse")
    branch = store.branch(cid)
    assert [m.tokens for m in branch] == [[], [], [], []]
    assert store.tokens(branch[1].id)[0]["text"] == "The"
    store.close()


def test_a_first_message_can_have_versions_and_a_branch_copies_one_path(tmp_path):
    store = Store(tmp_path / "chats.sqlite3")
    cid = store.create_conversation("t", system_prompt="sys")
    q1 = store.add_message(cid, "user", "Q1")
    store.add_message(cid, "assistant", "A1", tokens=[{"text": "A1"}], receipt={"seed": 7})
    q1b = store.add_message(cid, "user", "Q1 edited", parent_id=None)
    a1b = store.add_message(cid, "assistant", "A1b")
    assert [m.content for m in store.messages(cid)] == ["Q1 edited", "A1b"]
    assert store.message(q1b).version_ids == (q1, q1b)
    new = store.branch_conversation(a1b)
    copied = store.messages(new)
    assert [m.content for m in copied] == ["Q1 edited", "A1b"]
    assert all(m.version_count == 1 for m in copied)
    assert store.conversation(new).system_prompt == "sys"
    store.select_version(q1)
    first_path = store.messages(cid)
    assert [m.content for m in first_path] == ["Q1", "A1"] and first_path[1].receipt == {"seed": 7}
    # Deleting a version deletes the branch under it, nothing else.
    store._db.execute("DELETE FROM messages WHERE id=?", (q1,))
    assert [m.content for m in store.messages(cid)] == ["Q1 edited", "A1b"]
    store.close()


def test_recovery_keeps_versions_and_the_selected_branch(tmp_path):
    damaged = tmp_path / "old.sqlite3"
    old = Store(damaged)
    cid = old.create_conversation("tree")
    q = old.add_message(cid, "user", "Q")
    a1 = old.add_message(cid, "assistant", "A1", receipt={"seed": 1})
    old.add_message(cid, "user", "follow-up")
    old.add_message(cid, "assistant", "A2", parent_id=q)
    old.select_version(a1)
    old.close()

    fresh = Store(tmp_path / "new.sqlite3")
    report = recover_into(damaged, fresh, RecoveryReport(problem="test", kept_as=damaged))
    assert report.messages == 4
    branch = fresh.messages(cid)
    assert [m.content for m in branch] == ["Q", "A1", "follow-up"]
    assert (branch[1].version_number, branch[1].version_count, branch[1].receipt) == (
        1,
        2,
        {"seed": 1},
    )
    fresh.select_version(branch[1].version_ids[1])
    assert [m.content for m in fresh.messages(cid)] == ["Q", "A2"]
    fresh.close()
