"""Recovery keeps schema 5's data (issue 35): which project each chat was in, the projects
themselves, the chats' tools and their compactions (summaries standing in for older messages).
A recovered database used to lose all of them: every chat came back in no project and every
summary was gone, so the model saw the full old history again."""

from __future__ import annotations

import sqlite3

from app.app_data import open_app_data
from app.project_settings import ProjectSettings
from app.recovery import RecoveryReport, database_problem, recover_into
from app.settings import SettingsFile
from app.store import Store
from tests.data_dir_helpers import MARKER, flip_marker_byte


def _organised(path):
    """Two projects, three chats (one in each project, one in none), a chat's tools, and two
    compactions on the first chat (the older one inactive)."""
    store = Store(path)
    work = store.create_project(
        "Work", "Be terse.", ProjectSettings(model="m.gguf", tools=["calc"])
    )
    home = store.create_project("Home")
    a = store.create_conversation("a", project_id=work)
    b = store.create_conversation("b", project_id=home)
    c = store.create_conversation("c")
    ids = [store.add_message(a, ("user", "assistant")[i % 2], f"a{i}") for i in range(6)]
    store.add_message(b, "user", "b0")
    store.add_message(c, "user", f"c0 {MARKER}")  # the byte that gets damaged
    store.set_chat_tools(a, {"enabled": ["calc"], "always": []})
    old = store.add_compaction(a, ids[:2], "first summary")
    new = store.add_compaction(a, ids[:4], "second summary", receipt={"model": "m"})
    store._db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    store.close()
    return {"work": work, "home": home, "a": a, "b": b, "c": c, "old": old, "new": new}, ids


def test_a_recovered_database_keeps_projects_chats_places_tools_and_summaries(tmp_path):
    db = tmp_path / "chats.sqlite3"
    k, ids = _organised(db)
    flip_marker_byte(db)

    result = open_app_data(db, SettingsFile(tmp_path / "settings.json"))
    store = result.store
    assert "Recovered 3 chats and 8 messages" in result.notices[0]
    assert "Also recovered 2 projects and 2 chat summaries" in result.notices[0]
    projects = store.projects()
    assert [(p.id, p.name, p.system_prompt) for p in projects] == [
        (k["work"], "Work", "Be terse."),
        (k["home"], "Home", ""),
    ]
    assert projects[0].settings.model == "m.gguf" and projects[0].settings.tools == ["calc"]
    chats = {c.id: c for c in store.list_conversations()}
    assert chats[k["a"]].project_id == k["work"]
    assert chats[k["b"]].project_id == k["home"]
    assert chats[k["c"]].project_id is None
    assert store.chat_tools(k["a"]) == {"enabled": ["calc"], "always": []}
    active = store.active_compaction(k["a"])
    assert active is not None and active.id == k["new"]
    assert active.summary == "second summary" and active.covered == tuple(ids[:4])
    assert active.receipt == {"model": "m"}
    old = store.compaction(k["old"])
    assert old is not None and not old.active and old.covered == tuple(ids[:2])
    assert store.integrity_check() == "ok"
    store.close()


def _recover_after(tmp_path, damage_sql: list[str]):
    damaged = tmp_path / "damaged.sqlite3"
    k, ids = _organised(damaged)
    raw = sqlite3.connect(damaged)  # foreign keys off: rows vanish as from a lost page
    for sql in damage_sql:
        raw.execute(sql.format(**k, a1=ids[1], a2=ids[2]))
    raw.commit()
    raw.close()
    fresh = Store(tmp_path / "fresh.sqlite3")
    report = recover_into(damaged, fresh, RecoveryReport(problem="test", kept_as=damaged))
    return fresh, k, ids, report


def test_a_chat_whose_project_row_is_lost_comes_back_in_no_project(tmp_path):
    store, k, _ids, report = _recover_after(tmp_path, ["DELETE FROM projects WHERE id={home}"])
    assert report.projects == 1
    chats = {c.id: c for c in store.list_conversations()}
    assert chats[k["b"]].project_id is None and chats[k["a"]].project_id == k["work"]


def test_a_summary_follows_its_messages_and_leaves_out_the_lost_ones(tmp_path):
    # The chat's own row and one covered message are lost: the messages go to a chat of their
    # own, and the summary with them, covering the messages that are still there.
    store, k, ids, report = _recover_after(
        tmp_path, ["DELETE FROM conversations WHERE id={a}", "DELETE FROM messages WHERE id={a1}"]
    )
    assert report.compactions == 2
    (orphans,) = [c for c in store.list_conversations() if c.id not in (k["b"], k["c"])]
    active = store.active_compaction(orphans.id)
    assert active is not None and active.covered == (ids[0], ids[2], ids[3])


def test_a_summary_none_of_whose_messages_survived_is_dropped(tmp_path):
    store, k, _ids, report = _recover_after(
        tmp_path, ["DELETE FROM messages WHERE conversation_id={a} AND id<={a2}"]
    )
    # The first compaction covered a0, a1 (both lost); the second still has a3.
    assert report.compactions == 1
    assert store.compaction(k["old"]) is None
    assert store.active_compaction(k["a"]).id == k["new"]


def test_an_invalid_byte_in_a_project_name_is_found_and_repaired(tmp_path):
    # Python's sqlite3 fails to read such a name (the window's project list would not build),
    # while SQLite's own check passes: the check must read the projects table too.
    db = tmp_path / "chats.sqlite3"
    store = Store(db)
    store.create_project(f"Trip {MARKER}")
    store._db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    store.close()
    flip_marker_byte(db)
    assert database_problem(db) == "projects row 1: name is not valid UTF-8"
    result = open_app_data(db, SettingsFile(tmp_path / "settings.json"))
    (project,) = result.store.projects()
    assert project.name.startswith("Trip \ufffd")
    result.store.close()
