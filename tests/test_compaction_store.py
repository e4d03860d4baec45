"""Store side of compaction (issue 35): the compactions table of schema 5 on real SQLite."""

from __future__ import annotations

import pytest

from app.store import Store, StoreWriteError
from engine.types import Role


@pytest.fixture
def store(tmp_path):
    s = Store(tmp_path / "chats.sqlite3")
    yield s
    s.close()


def _chat(store: Store, n: int) -> tuple[int, list[int]]:
    cid = store.create_conversation()
    ids: list[int] = []
    for k in range(n):
        role = Role.USER if k % 2 == 0 else Role.ASSISTANT
        ids.append(store.add_message(cid, role, f"m{k}", parent_id=ids[-1] if ids else None))
    return cid, ids


def test_a_compaction_stands_in_for_its_messages_which_stay(store):
    cid, ids = _chat(store, 6)
    kid = store.add_compaction(cid, ids[:4], "They greeted.", receipt={"x": 1})
    active = store.active_compaction(cid)
    assert active is not None and active.id == kid
    assert active.covered == tuple(ids[:4]) and active.summary == "They greeted."
    assert active.receipt == {"x": 1} and active.active
    assert [m.id for m in store.branch(cid)] == ids  # the originals are untouched


def test_a_new_compaction_replaces_the_active_one(store):
    cid, ids = _chat(store, 8)
    first = store.add_compaction(cid, ids[:2], "one")
    second = store.add_compaction(cid, ids[:4], "two")
    assert store.active_compaction(cid).id == second
    assert not store.compaction(first).active  # kept for receipts, no longer used


def test_edit_and_restore(store):
    cid, ids = _chat(store, 4)
    kid = store.add_compaction(cid, ids[:2], "draft")
    store.set_compaction_summary(kid, "edited")
    assert store.active_compaction(cid).summary == "edited"
    store.deactivate_compaction(kid)
    assert store.active_compaction(cid) is None
    assert store.compaction(kid).summary == "edited"


def test_empty_summary_or_nothing_covered_is_refused_and_nothing_written(store):
    cid, ids = _chat(store, 4)
    with pytest.raises(ValueError, match="summary"):
        store.add_compaction(cid, ids[:2], "  ")
    with pytest.raises(ValueError, match="covered"):
        store.add_compaction(cid, [], "text")
    kid = store.add_compaction(cid, ids[:2], "kept")
    with pytest.raises(ValueError, match="empty"):
        store.set_compaction_summary(kid, "\n")
    assert store.compaction(kid).summary == "kept"
    assert store._db.execute("SELECT count(*) FROM compactions").fetchone()[0] == 1


def test_a_failed_write_leaves_the_earlier_compaction_active(store):
    """One transaction: when the insert fails, the deactivation of the old one is undone."""
    cid, ids = _chat(store, 6)
    kid = store.add_compaction(cid, ids[:2], "old")
    store._db.execute(
        "CREATE TRIGGER fail_insert BEFORE INSERT ON compactions "
        "BEGIN SELECT RAISE(ABORT, 'database or disk is full'); END"
    )
    with pytest.raises(StoreWriteError):
        store.add_compaction(cid, ids[:4], "new")
    assert store.active_compaction(cid).id == kid


def test_deleting_the_chat_deletes_its_compactions(store):
    cid, ids = _chat(store, 4)
    store.add_compaction(cid, ids[:2], "s")
    store.delete_conversation(cid)
    count = store._db.execute("SELECT count(*) FROM compactions").fetchone()[0]
    assert count == 0
