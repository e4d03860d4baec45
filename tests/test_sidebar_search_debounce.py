"""The chats list's search waits for the typing to pause (issue 35): it ran a full-text query on
every keystroke, 0.3-0.5 s each for a one-letter prefix on a large store, so typing a word
stalled the window once per letter. Enter searches at once; clearing the box shows the whole
list at once."""

from __future__ import annotations

from PySide6.QtCore import Qt

from app.views.sidebar import SEARCH_DEBOUNCE_MS, Sidebar
from tests.app_fakes import WAIT_MS, FakeEngine, close_window, make_window


def _sidebar(qtbot) -> tuple[Sidebar, list[str]]:
    sidebar = Sidebar()
    qtbot.addWidget(sidebar)
    searched: list[str] = []
    sidebar.searchChanged.connect(searched.append)
    return sidebar, searched


def test_typing_a_word_searches_once_for_the_whole_word(qtbot):
    sidebar, searched = _sidebar(qtbot)
    qtbot.keyClicks(sidebar.search, "puffin")
    assert searched == []  # not one search per letter while typing
    assert sidebar._search_timer.isActive() and sidebar._search_timer.interval() == 200
    qtbot.waitUntil(lambda: searched != [], timeout=WAIT_MS)
    assert searched == ["puffin"] and sidebar.search_text() == "puffin"


def test_enter_searches_at_once_and_no_second_search_follows(qtbot):
    sidebar, searched = _sidebar(qtbot)
    qtbot.keyClicks(sidebar.search, "puf")
    qtbot.keyClick(sidebar.search, Qt.Key_Return)
    assert searched == ["puf"]
    assert not sidebar._search_timer.isActive()  # the pending search was the same one


def test_clearing_the_box_shows_the_whole_list_at_once(qtbot):
    sidebar, searched = _sidebar(qtbot)
    qtbot.keyClicks(sidebar.search, "puf")
    qtbot.keyClick(sidebar.search, Qt.Key_Return)
    sidebar.search.clear()  # the clear button's action
    assert searched == ["puf", ""] and sidebar.search_text() == ""
    # typed and erased before the pause: nothing was searched, nothing to undo
    qtbot.keyClicks(sidebar.search, "x")
    qtbot.keyClick(sidebar.search, Qt.Key_Backspace)
    assert searched == ["puf", ""] and not sidebar._search_timer.isActive()


def test_in_the_window_typing_runs_one_query_and_shows_its_hits(qtbot, tmp_path, monkeypatch):
    window = make_window(qtbot, tmp_path, FakeEngine(), load=False)
    try:
        store = window.store
        cid = store.create_conversation("Birds")
        store.add_message(cid, "user", "Where do puffins nest?")
        window._refresh_sidebar()
        queries: list[str] = []
        real_search = store.search
        monkeypatch.setattr(store, "search", lambda text: queries.append(text) or real_search(text))
        qtbot.keyClicks(window.sidebar.search, "puffins")
        assert queries == []
        qtbot.waitUntil(lambda: queries != [], timeout=WAIT_MS + SEARCH_DEBOUNCE_MS)
        assert queries == ["puffins"]
        (hit,) = window.sidebar.chat_items()
        assert "<b>puffins</b>" in window.sidebar.tree.itemWidget(hit, 0).text()
    finally:
        close_window(window)
