"""Recovery keeps each chat's visible branch (issue 31): after one damaged database page, 20 of 30
recovered messages were hidden on side branches. The damaged page was the conversations table's:
every message went into one "Recovered messages" chat, where each lost chat's first message
became a version of the first chat's, so two chats of three were hidden.

The damage below is made two ways: a page of the real file overwritten (the issue's case), and
rows deleted or tree columns changed with SQL in a copy (exactly which rows are lost, so the
expected branch can be written down by hand)."""

from __future__ import annotations

import sqlite3

from app.app_data import open_app_data
from app.recovery import ORPHANS_TITLE, RecoveryReport, recover_into
from app.settings import SettingsFile
from app.store import Store
from tests.data_dir_helpers import MARKER, make_chats


def test_a_damaged_conversations_page_gives_each_lost_chat_its_own_visible_chat(tmp_path):
    db = tmp_path / "chats.sqlite3"
    make_chats(db, n_chats=3, n_pairs=5).close()
    raw = sqlite3.connect(db)
    root = raw.execute("SELECT rootpage FROM sqlite_master WHERE name='conversations'").fetchone()
    page_size = raw.execute("PRAGMA page_size").fetchone()[0]
    raw.close()
    data = bytearray(db.read_bytes())
    at = (root[0] - 1) * page_size
    data[at : at + page_size] = b"\xaa" * page_size  # the page holding the three chats' rows
    db.write_bytes(bytes(data))

    result = open_app_data(db, SettingsFile(tmp_path / "settings.json"))
    store = result.store
    assert "Recovered 0 chats and 30 messages" in result.notices[0]
    chats = sorted(store.list_conversations(), key=lambda c: c.id)
    assert [c.title for c in chats] == [
        ORPHANS_TITLE,
        f"{ORPHANS_TITLE} (2)",
        f"{ORPHANS_TITLE} (3)",
    ]
    for c, chat in enumerate(chats):
        marked = f" {MARKER}" if c == 2 else ""  # make_chats marks the last chat's first question
        expected = [f"question {c}.0{marked} ", f"answer {c}.0 "]
        expected += [t for p in range(1, 5) for t in (f"question {c}.{p} ", f"answer {c}.{p} ")]
        assert [m.content for m in store.messages(chat.id)] == expected
        assert all(m.version_count == 1 for m in store.messages(chat.id))
    store.close()


def _chat_with_a_side_branch(path):
    """m0..m29 alternating user/assistant, plus a second version of m5 (side5) with side6..side8
    below it; m5 is the selected version, so m0..m29 is the visible branch."""
    store = Store(path)
    cid = store.create_conversation("long")
    ids = {}
    for i in range(30):
        ids[f"m{i}"] = store.add_message(cid, ("user", "assistant")[i % 2], f"m{i}")
    parent = ids["m4"]
    for j in range(5, 9):
        parent = ids[f"side{j}"] = store.add_message(
            cid, ("user", "assistant")[j % 2], f"side{j}", parent_id=parent
        )
    store.select_version(ids["m5"])
    assert [m.content for m in store.messages(cid)] == [f"m{i}" for i in range(30)]
    store.close()
    return cid, ids


def _recover(tmp_path, damage_sql: list[tuple[str, tuple]]):
    damaged = tmp_path / "damaged.sqlite3"
    cid, ids = _chat_with_a_side_branch(damaged)
    raw = sqlite3.connect(damaged)  # foreign keys off: rows vanish as from a lost page
    for sql, args in damage_sql:
        raw.execute(sql, tuple(ids[a] if isinstance(a, str) and a in ids else a for a in args))
    raw.commit()
    raw.close()
    fresh = Store(tmp_path / "fresh.sqlite3")
    report = recover_into(damaged, fresh, RecoveryReport(problem="test", kept_as=damaged))
    return fresh, cid, ids, report


def _one_selected_per_group(store: Store, cid: int) -> bool:
    groups = store._db.execute(
        "SELECT parent_id, sum(selected) FROM messages WHERE conversation_id=? GROUP BY parent_id",
        (cid,),
    ).fetchall()
    return all(selected == 1 for _parent, selected in groups)


def test_lost_rows_in_the_middle_leave_the_rest_of_the_branch_visible(tmp_path):
    rows = [f"m{i}" for i in range(10, 20)]
    store, cid, ids, report = _recover(
        tmp_path, [("DELETE FROM messages WHERE id=?", (r,)) for r in rows]
    )
    assert report.messages == 24
    branch = store.messages(cid)
    assert [m.content for m in branch] == [f"m{i}" for i in (*range(10), *range(20, 30))]
    assert [m.position for m in branch] == list(range(20))
    assert branch[5].version_count == 2  # the side branch is still there, still hidden
    store.select_version(ids["side5"])
    assert [m.content for m in store.messages(cid)][4:] == [
        "m4",
        "side5",
        "side6",
        "side7",
        "side8",
    ]
    assert _one_selected_per_group(store, cid)


def test_a_side_branch_that_lost_a_message_stays_off_the_visible_branch(tmp_path):
    store, cid, ids, report = _recover(tmp_path, [("DELETE FROM messages WHERE id=?", ("side6",))])
    assert report.messages == 33
    branch = store.messages(cid)
    assert [m.content for m in branch] == [f"m{i}" for i in range(30)]
    # side7 (and side8 below it) went back at side7's depth, as a version of m7
    assert branch[7].version_count == 2
    store.select_version(ids["side7"])
    assert [m.content for m in store.messages(cid)][6:] == ["m6", "side7", "side8"]
    assert _one_selected_per_group(store, cid)


def test_a_damaged_parent_id_does_not_move_the_branch_below_it_aside(tmp_path):
    store, cid, _ids, report = _recover(
        tmp_path, [("UPDATE messages SET parent_id=? WHERE id=?", ("m3", "m15"))]
    )
    assert report.messages == 34
    assert [m.content for m in store.messages(cid)] == [f"m{i}" for i in range(30)]
    assert _one_selected_per_group(store, cid)


def test_a_damaged_position_keeps_every_message_visible(tmp_path):
    store, cid, _ids, report = _recover(
        tmp_path, [("UPDATE messages SET position=9999 WHERE id=?", ("m15",))]
    )
    assert report.messages == 34
    visible = [m.content for m in store.messages(cid)]
    assert sorted(visible) == sorted(f"m{i}" for i in range(30))
    assert visible[:15] == [f"m{i}" for i in range(15)]
    assert _one_selected_per_group(store, cid)


def test_two_selected_versions_are_recovered_as_one(tmp_path):
    # A damaged `selected` flag: two versions of m5 both selected. The visible branch is what the
    # app showed (the first selected version), and the copy holds one selected per group.
    store, cid, _ids, _report = _recover(
        tmp_path, [("UPDATE messages SET selected=1 WHERE id=?", ("side5",))]
    )
    assert [m.content for m in store.messages(cid)] == [f"m{i}" for i in range(30)]
    assert _one_selected_per_group(store, cid)


def test_a_database_before_the_tree_is_recovered_as_one_line(tmp_path):
    from app.store import SCHEMA_V1

    damaged = tmp_path / "v1.sqlite3"
    raw = sqlite3.connect(damaged)
    raw.executescript(SCHEMA_V1)
    raw.execute("INSERT INTO conversations(id, title, created_at) VALUES (1, 'old', 0)")
    for i in range(6):
        raw.execute(
            "INSERT INTO messages(conversation_id, role, content, created_at) VALUES (1, ?, ?, 0)",
            (("user", "assistant")[i % 2], f"v1 {i}"),
        )
    raw.execute("DELETE FROM messages WHERE content='v1 2'")
    raw.commit()
    raw.close()
    fresh = Store(tmp_path / "fresh.sqlite3")
    recover_into(damaged, fresh, RecoveryReport(problem="test", kept_as=damaged))
    assert [m.content for m in fresh.messages(1)] == ["v1 0", "v1 1", "v1 3", "v1 4", "v1 5"]
    assert _one_selected_per_group(fresh, 1)
