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
    # through 3 (tree), 4 (tools) to 5 (projects)
    assert store.schema_version == SCHEMA_VERSION == 5
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


# --- every branch of the tree code (issue 31: a planted bug there went unnoticed) -------------
def _tree(store: Store):
    """Q1 -> {A1, A1b (selected)} -> under A1b: Q2 -> A2; under A1: Q2x. A second chat's first
    message shares nothing with this one."""
    cid = store.create_conversation("tree", system_prompt="sys")
    other = store.create_conversation("other")
    store.add_message(other, "user", "elsewhere")
    ids = {"Q1": store.add_message(cid, "user", "Q1")}
    ids["A1"] = store.add_message(cid, "assistant", "A1", usage={"n": 1}, receipt={"seed": 1})
    ids["Q2x"] = store.add_message(cid, "user", "Q2x")
    ids["A1b"] = store.add_message(cid, "assistant", "A1b", parent_id=ids["Q1"])
    ids["Q2"] = store.add_message(cid, "user", "Q2", json_mode="object")
    ids["A2"] = store.add_message(cid, "assistant", "", tool={"tool_calls": [{"id": "c1"}]})
    store.finish_reply(ids["A2"], content="A2", reasoning="r", status="cancelled",
                       finish_reason="cancelled", usage={"n": 2}, tokens=[{"text": "A2"}])  # fmt: skip
    return cid, other, ids


def test_versions_and_the_visible_branch_are_what_the_selection_says(tmp_path):
    store = Store(tmp_path / "s.sqlite3")
    cid, other, ids = _tree(store)
    branch = store.branch(cid)
    assert [m.content for m in branch] == ["Q1", "A1b", "Q2", "A2"]
    assert [m.version_ids for m in branch] == [
        (ids["Q1"],),
        (ids["A1"], ids["A1b"]),
        (ids["Q2"],),
        (ids["A2"],),
    ]
    assert [(m.version_number, m.version_count) for m in branch] == [(1, 1), (2, 2), (1, 1), (1, 1)]
    # message() knows the versions too: of a first message (this chat's only) and of a reply
    assert store.message(ids["Q1"]).version_ids == (ids["Q1"],)
    assert store.message(ids["A1"]).version_ids == (ids["A1"], ids["A1b"])
    assert store.message(ids["A1"] + 1000) is None

    store.select_version(ids["A1"])
    assert [m.content for m in store.branch(cid)] == ["Q1", "A1", "Q2x"]
    store.select_version(ids["A1b"])  # the branch below comes back as it was left
    assert [m.content for m in store.branch(cid)] == ["Q1", "A1b", "Q2", "A2"]
    store.select_version(ids["A1"] + 1000)  # gone: nothing changes
    assert [m.content for m in store.branch(cid)] == ["Q1", "A1b", "Q2", "A2"]
    assert [m.content for m in store.branch(other)] == ["elsewhere"]

    # A second first message: selecting among first messages leaves the other chat alone.
    q1b = store.add_message(cid, "user", "Q1b", parent_id=None)
    assert [m.content for m in store.branch(cid)] == ["Q1b"]
    assert store.message(q1b).version_ids == (ids["Q1"], q1b)
    store.select_version(ids["Q1"])
    assert [m.content for m in store.branch(cid)] == ["Q1", "A1b", "Q2", "A2"]
    assert [m.content for m in store.branch(other)] == ["elsewhere"]
    store.close()


def test_the_tree_lists_every_version_parents_first_with_all_columns(tmp_path):
    store = Store(tmp_path / "s.sqlite3")
    cid, _other, ids = _tree(store)
    tree = store.tree(cid)
    assert [m.content for m in tree] == ["Q1", "A1", "A1b", "Q2x", "Q2", "A2"]
    assert [m.position for m in tree] == [0, 1, 1, 2, 2, 3]
    assert [m.version_ids for m in tree] == [
        (ids["Q1"],),
        (ids["A1"], ids["A1b"]),
        (ids["A1"], ids["A1b"]),
        (ids["Q2x"],),
        (ids["Q2"],),
        (ids["A2"],),
    ]
    a2 = tree[-1]
    assert (a2.tokens, a2.tool, a2.status, a2.finish_reason, a2.usage, a2.reasoning) == (
        [{"text": "A2"}], {"tool_calls": [{"id": "c1"}]}, "cancelled", "cancelled", {"n": 2}, "r"
    )  # fmt: skip
    assert tree[1].receipt == {"seed": 1} and tree[4].json_mode == "object"
    assert store.branch(cid)[-1].tokens == [] and store.messages(cid)[-1].tokens == [{"text": "A2"}]
    store.close()


def test_a_branch_copy_holds_one_path_with_every_column_and_the_chat_settings(tmp_path):
    store = Store(tmp_path / "s.sqlite3")
    cid, _other, ids = _tree(store)
    store.set_chat_tools(cid, {"enabled": ["calc"], "always": []})
    new = store.branch_conversation(ids["A2"])
    conv = store.conversation(new)
    assert (conv.title, conv.system_prompt) == ("tree (branch)", "sys")
    assert store.chat_tools(new) == {"enabled": ["calc"], "always": []}
    copied = store.messages(new)
    assert [m.content for m in copied] == ["Q1", "A1b", "Q2", "A2"]
    assert [m.position for m in copied] == [0, 1, 2, 3]
    assert [m.parent_id for m in copied] == [None] + [m.id for m in copied[:-1]]
    assert all(m.version_count == 1 and m.conversation_id == new for m in copied)
    a2 = copied[-1]
    assert (a2.tokens, a2.tool, a2.status, a2.finish_reason, a2.reasoning, a2.usage) == (
        [{"text": "A2"}], {"tool_calls": [{"id": "c1"}]}, "cancelled", "cancelled", "r", {"n": 2}
    )  # fmt: skip
    assert copied[2].json_mode == "object"
    # A copy up to a message off the visible branch follows that message's own path.
    side = store.branch_conversation(ids["Q2x"], title="side")
    assert store.conversation(side).title == "side"
    side_copy = store.messages(side)
    assert [m.content for m in side_copy] == ["Q1", "A1", "Q2x"]
    assert side_copy[1].receipt == {"seed": 1} and side_copy[1].usage == {"n": 1}
    assert store.branch_conversation(ids["A2"] + 1000) is None
    # The original is untouched.
    assert [m.content for m in store.branch(cid)] == ["Q1", "A1b", "Q2", "A2"]
    store.close()


def test_a_path_stops_at_a_missing_parent_and_at_a_cycle(tmp_path):
    store = Store(tmp_path / "s.sqlite3")
    cid, _other, ids = _tree(store)
    store._db.execute("PRAGMA foreign_keys=OFF")
    store._db.execute("UPDATE messages SET parent_id=? WHERE id=?", (ids["A2"], ids["Q1"]))
    copy = store.branch_conversation(ids["A2"])  # Q1's parent is A2: a cycle, walked once
    assert [m.content for m in store.tree(copy)] == ["Q1", "A1b", "Q2", "A2"]
    store._db.execute("UPDATE messages SET parent_id=? WHERE id=?", (99_999, ids["Q1"]))
    copy = store.branch_conversation(ids["A2"])  # Q1's parent is gone: the path starts at Q1
    assert [m.content for m in store.tree(copy)] == ["Q1", "A1b", "Q2", "A2"]
    store.close()


def test_a_branch_reader_survives_a_cycle_and_a_group_with_none_selected(tmp_path):
    store = Store(tmp_path / "s.sqlite3")
    cid, _other, ids = _tree(store)
    store._db.execute("UPDATE messages SET selected=0 WHERE id IN (?, ?)", (ids["A1"], ids["A1b"]))
    assert [m.content for m in store.branch(cid)] == ["Q1", "A1b", "Q2", "A2"]  # the newest
    store._db.execute("PRAGMA foreign_keys=OFF")
    store._db.execute("UPDATE messages SET parent_id=? WHERE id=?", (ids["A2"], ids["Q2"]))
    # Q2 -> A2 -> Q2 ...: the reader stops instead of looping (no first message reaches it)
    assert [m.content for m in store.branch(cid)] == ["Q1", "A1b"]
    assert [m.content for m in store.branch_window(cid, 10)[0]] == ["Q1", "A1b"]
    store.close()


def test_an_imported_tree_keeps_its_selection_depths_and_times(tmp_path, monkeypatch):
    from app.chat_import import ImportedChat, ImportedMessage

    def m(key, parent, text, created=5.0):
        return ImportedMessage(key, parent, "user" if text.startswith("Q") else "assistant",
                               text, "", "complete", None, None, "off", created, None, None)  # fmt: skip

    # 10 -> {20, 21} ; 20 -> {30, 31, 32}; the branch is 10, 20, 31; 21 has a child 40
    messages = (m(10, None, "Q"), m(20, 10, "A"), m(21, 10, "A'"), m(30, 20, "Q2a"),
                m(31, 20, "Q2b"), m(32, 20, "Q2c"), m(40, 21, "Q3"), m(41, 40, "A3"),
                m(42, 40, "A3'"))  # fmt: skip
    store = Store(tmp_path / "s.sqlite3")
    monkeypatch.setattr("app.store.time.time", lambda: 1234.0)
    cid = store.import_conversation(ImportedChat("imp", "sp", 0.0, messages, (10, 20, 31)))
    conv = store.conversation(cid)
    assert (conv.title, conv.system_prompt, conv.created_at, conv.updated_at) == (
        "imp", "sp", 1234.0, 1234.0,
    )  # fmt: skip
    assert [x.content for x in store.branch(cid)] == ["Q", "A", "Q2b"]
    tree = {x.content: x for x in store.tree(cid)}
    assert [tree[t].position for t in ("Q", "A", "A'", "Q2a", "Q3", "A3")] == [0, 1, 1, 2, 2, 3]
    assert tree["A3"].parent_id == tree["Q3"].id and tree["Q3"].parent_id == tree["A'"].id
    assert all(x.created_at == 5.0 for x in tree.values())
    # Exactly one selected version per group (the schema's rule), on the branch and off it.
    groups = store._db.execute(
        "SELECT parent_id, sum(selected) FROM messages WHERE conversation_id=? GROUP BY parent_id",
        (cid,),
    ).fetchall()
    assert sorted(n for _parent, n in groups) == [1, 1, 1, 1, 1]  # None, 10, 20, 21, 40
    # Off the branch, a group shows its newest version.
    store.select_version(tree["A'"].id)
    assert [x.content for x in store.branch(cid)] == ["Q", "A'", "Q3", "A3'"]
    dated = store.import_conversation(ImportedChat("dated", "", 99.0, messages[:1], (10,)))
    assert store.conversation(dated).created_at == 99.0
    store.close()
