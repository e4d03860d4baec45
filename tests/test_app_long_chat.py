"""A long chat opens with its last messages (issue 31): an imported chat of 150,000 messages
froze the window at 2.6 GB and, being the newest chat, every later start. The store reads only
the messages shown (Store.branch_window); the session opens the last OPEN_MESSAGES and loads
earlier ones on request; the window offers "Load earlier messages"."""

from __future__ import annotations

import tracemalloc

from app.chat_import import ImportedChat, ImportedMessage
from app.session import OPEN_MESSAGES
from app.store import Store
from tests.app_fakes import FakeEngine, close_window, make_window

FILLER = "z" * 1_000


def long_chat(store: Store, n: int, with_versions: bool = False) -> int:
    """A linear chat of `n` messages "m0".."m{n-1}" (each with 1,000 filler characters), written
    in one transaction; `with_versions`: m1 gets an older version "m1 old" off the branch."""
    messages = [
        ImportedMessage(i, i - 1 if i else None, ("user", "assistant")[i % 2], f"m{i} {FILLER}",
                        "", "complete", None, None, "off", 0.0, None, None)
        for i in range(n)
    ]  # fmt: skip
    if with_versions:
        messages.insert(1, ImportedMessage(-1, 0, "assistant", "m1 old", "", "complete", None,
                                           None, "off", 0.0, None, None))  # fmt: skip
    return store.import_conversation(
        ImportedChat("long", "", 0.0, tuple(messages), tuple(range(n)))
    )


def texts(messages) -> list[str]:
    return [m.content.split(" ")[0] if m.content.endswith(FILLER) else m.content for m in messages]


def test_the_last_messages_of_a_long_branch_are_read_without_the_rest(tmp_path):
    store = Store(tmp_path / "s.sqlite3")
    cid = long_chat(store, 20_000)
    tracemalloc.start()
    try:
        shown, earlier = store.branch_window(cid, 200)
        _size, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert texts(shown) == [f"m{i}" for i in range(19_800, 20_000)]
    assert earlier == 19_800
    assert [m.position for m in shown] == list(range(19_800, 20_000))
    # 20 MB of text in the chat: reading all of it would hold at least that; reading 200
    # messages holds ~200 KB of it, plus the walk over 20,000 rows of three integers.
    assert peak < 12 * 2**20, peak
    assert store.branch(cid, limit=3)[0].content.startswith("m19997 ")
    wide, earlier = store.branch_window(cid, 1_201)  # read in chunks of 500 ids
    assert texts(wide) == [f"m{i}" for i in range(18_799, 20_000)] and earlier == 18_799
    assert store.branch_window(cid, 0) == ([], 20_000)
    assert store.branch_window(cid, 50_000)[1] == 0
    store.close()


def test_the_window_follows_the_selected_versions_and_keeps_their_counts(tmp_path):
    store = Store(tmp_path / "s.sqlite3")
    cid = long_chat(store, 6, with_versions=True)
    full = store.branch(cid)
    shown, earlier = store.branch_window(cid, 5)
    assert earlier == 1
    assert [(m.id, m.version_ids, m.parent_id) for m in shown] == [
        (m.id, m.version_ids, m.parent_id) for m in full[1:]
    ]
    assert texts(shown) == ["m1", "m2", "m3", "m4", "m5"] and shown[0].version_count == 2
    store.select_version(shown[0].version_ids[0])  # the older version: the branch ends there
    assert texts(store.branch_window(cid, 5)[0]) == ["m0", "m1 old"]
    store.close()


def test_the_window_opens_a_long_chat_with_its_last_messages_and_loads_earlier_ones(
    qtbot, tmp_path
):
    store = Store(tmp_path / "chats.sqlite3")
    long_chat(store, 450)
    store.close()
    window = make_window(qtbot, tmp_path, FakeEngine(), load=False)
    try:
        session, view = window.session, window.chat_view
        assert len(view.widgets) == OPEN_MESSAGES == 200
        assert session.earlier == 250 and texts(session.branch)[0] == "m250"
        assert view.earlier_button.isVisible()
        assert view.earlier_button.text() == "Load earlier messages (250 more)"

        view.earlier_button.click()
        assert len(view.widgets) == 400 and session.earlier == 50
        assert view.earlier_button.text() == "Load earlier messages (50 more)"
        view.earlier_button.click()
        assert len(view.widgets) == 450 and session.earlier == 0
        assert not view.earlier_button.isVisible()
        assert texts(session.branch) == [f"m{i}" for i in range(450)]
    finally:
        close_window(window)


def test_a_request_from_a_partly_loaded_chat_holds_the_whole_history(qtbot, tmp_path):
    store = Store(tmp_path / "chats.sqlite3")
    cid = long_chat(store, 250)
    store.close()
    window = make_window(qtbot, tmp_path, FakeEngine(), load=False)
    try:
        assert window.session.earlier == 50
        request = window.session.build_request(cid)
        sent = [m["content"].split(" ")[0] for m in request.messages]
        assert sent == [f"m{i}" for i in range(250)]
    finally:
        close_window(window)
