"""Projects and search in the window: the sidebar's tree of projects and chats, drag and drop
between projects, new/rename/delete with bad names refused, the settings dialog, a chat using its
project's system prompt, tools, preset and default model, and search hits with snippets. A fake
engine (tests/app_fakes.py) records each request; the store is a real SQLite file."""

from __future__ import annotations

import pytest
from PySide6.QtCore import QPoint, QPointF, Qt
from PySide6.QtGui import QDropEvent
from PySide6.QtWidgets import QDialog, QInputDialog, QLabel, QMessageBox

from app.project_settings import ProjectSettings, parse_preset
from app.store import Store
from app.tool_registry import builtin_key
from app.views.project_dialog import ProjectDialog
from engine.errors import ConfigValidationError
from tests.app_fakes import WAIT_MS, FakeEngine, close_window, make_window


def _send(qtbot, window, text):
    window.input.setPlainText(text)
    with qtbot.waitSignal(
        window.session.busyChanged, timeout=WAIT_MS, check_params_cb=lambda busy: busy is False
    ):
        window.send()


def _rows(sidebar):
    """The tree as (text, [child texts]) per top-level row."""
    tree, rows = sidebar.tree, []
    for i in range(tree.topLevelItemCount()):
        top = tree.topLevelItem(i)
        rows.append((top.text(0), [top.child(j).text(0) for j in range(top.childCount())]))
    return rows


class _Drop(QDropEvent):
    """A drop as Qt delivers it at the end of a drag started in `source` (a real drag cannot run
    under the offscreen platform: QDrag.exec needs a window system's drag loop)."""

    def __init__(self, source, pos, mime):
        super().__init__(QPointF(pos), Qt.MoveAction, mime, Qt.LeftButton, Qt.NoModifier)
        self._source = source

    def source(self):
        return self._source


def _drop(sidebar, chat_id, onto):
    """Drag the chat's row and drop it on `onto` (a row) or, with None, below the last row."""
    tree = sidebar.tree
    tree.setCurrentItem(sidebar.item_for("chat", chat_id))  # opens it: the list is rebuilt
    item = sidebar.item_for("chat", chat_id)
    if isinstance(onto, tuple):
        onto = sidebar.item_for(*onto)
    if onto is None:
        pos = tree.viewport().rect().bottomLeft() + QPoint(5, -5)
    else:
        pos = tree.visualItemRect(onto).center()
    event = _Drop(tree, pos, tree.mimeData([item]))
    tree.dropEvent(event)
    return event


@pytest.fixture
def filled(tmp_path):
    """A data dir with two projects (one holding a chat) and two chats in none."""
    store = Store(tmp_path / "chats.sqlite3")
    ids = {
        "essays": store.create_project("Essays", "You are a careful editor."),
        "trip": store.create_project("Trip"),
    }
    ids["draft"] = store.create_conversation("Draft one", project_id=ids["essays"])
    ids["loose"] = store.create_conversation("Loose chat")
    store.add_message(ids["loose"], "user", "Where do puffins nest?")
    ids["other"] = store.create_conversation("Other chat")
    store.close()
    return ids


def test_the_sidebar_shows_projects_with_their_chats_then_the_rest(qtbot, tmp_path, filled):
    window = make_window(qtbot, tmp_path, FakeEngine(), load=False)
    try:
        assert _rows(window.sidebar) == [
            ("Essays", ["Draft one"]),
            ("Trip", []),
            ("Other chat", []),
            ("Loose chat", []),
        ]
        assert window.sidebar.project_items()[0].isExpanded()
    finally:
        close_window(window)


def test_dragging_a_chat_onto_a_project_moves_it_there_and_out_again(qtbot, tmp_path, filled):
    window = make_window(qtbot, tmp_path, FakeEngine(), load=False)
    sidebar = window.sidebar
    try:
        event = _drop(sidebar, filled["loose"], ("project", filled["trip"]))
        assert event.isAccepted() and event.dropAction() == Qt.IgnoreAction  # no Qt item move
        assert window.store.conversation(filled["loose"]).project_id == filled["trip"]
        assert _rows(sidebar)[1] == ("Trip", ["Loose chat"])
        # onto a chat inside a project: into that project
        _drop(sidebar, filled["other"], ("chat", filled["draft"]))
        assert window.store.conversation(filled["other"]).project_id == filled["essays"]
        # onto the empty space below the rows: out of any project
        _drop(sidebar, filled["loose"], None)
        assert window.store.conversation(filled["loose"]).project_id is None
        assert _rows(sidebar) == [
            ("Essays", ["Other chat", "Draft one"]),
            ("Trip", []),
            ("Loose chat", []),
        ]
        # a drop from elsewhere (another widget) is not a move
        loose = sidebar.item_for("chat", filled["loose"])
        trip = sidebar.item_for("project", filled["trip"])
        pos = sidebar.tree.visualItemRect(trip).center()
        outside = _Drop(window.input, pos, sidebar.tree.mimeData([loose]))
        sidebar.tree.dropEvent(outside)
        assert not outside.isAccepted()
        assert window.store.conversation(filled["loose"]).project_id is None
    finally:
        close_window(window)


def test_the_chat_menu_moves_a_chat_to_a_project_and_out(qtbot, tmp_path, filled):
    window = make_window(qtbot, tmp_path, FakeEngine(), load=False)
    sidebar = window.sidebar
    try:
        menu = sidebar.context_menu(sidebar.item_for("chat", filled["draft"]))
        move = next(a.menu() for a in menu.actions() if a.text() == "Move to project")
        actions = {a.text(): a for a in move.actions() if a.text()}
        assert actions["Essays"].isChecked() and not actions["Trip"].isChecked()
        actions["Trip"].trigger()
        assert window.store.conversation(filled["draft"]).project_id == filled["trip"]
        menu = sidebar.context_menu(sidebar.item_for("chat", filled["draft"]))
        move = next(a.menu() for a in menu.actions() if a.text() == "Move to project")
        next(a for a in move.actions() if a.text() == "No project").trigger()
        assert window.store.conversation(filled["draft"]).project_id is None
    finally:
        close_window(window)


def test_a_new_project_name_is_asked_again_until_it_is_valid(qtbot, tmp_path, monkeypatch):
    window = make_window(qtbot, tmp_path, FakeEngine(), load=False)
    typed = iter([("", True), ("x" * 10_000, True), ("a\x00b", True), ("  Recipes  ", True)])
    asked_with, warnings = [], []

    def get_text(parent, title, label, text=""):
        asked_with.append(text)
        return next(typed)

    monkeypatch.setattr(QInputDialog, "getText", get_text)
    monkeypatch.setattr(QMessageBox, "warning", lambda _p, _t, text: warnings.append(text))
    try:
        window.sidebar.new_project_button.click()
        assert [p.name for p in window.store.projects()] == ["Recipes"]
        assert warnings[0].startswith("The project name is empty")
        assert "10,000 characters long; the limit is 200" in warnings[1]
        assert "U+0000" in warnings[2]
        # each retry starts from what was typed (a 10,000-char paste is cut to fit a line edit)
        assert asked_with[1] == "" and len(asked_with[2]) == 400 and asked_with[3] == "a\x00b"
        assert window.sidebar.tree.currentItem().text(0) == "Recipes"  # selected, ready to use
    finally:
        close_window(window)


def test_a_chat_title_with_control_characters_is_refused(qtbot, tmp_path, filled, monkeypatch):
    window = make_window(qtbot, tmp_path, FakeEngine(), load=False)
    typed = iter([("\x1b[31mred", True), ("", False)])
    warnings = []
    monkeypatch.setattr(QInputDialog, "getText", lambda *a, **k: next(typed))
    monkeypatch.setattr(QMessageBox, "warning", lambda _p, _t, text: warnings.append(text))
    try:
        window.sidebar.tree.setCurrentItem(window.sidebar.item_for("chat", filled["loose"]))
        window.sidebar.rename_button.click()
        assert warnings == ["The chat title contains the control character U+001B; remove it."]
        assert window.store.conversation(filled["loose"]).title == "Loose chat"
    finally:
        close_window(window)


def test_deleting_a_project_keeps_its_chats_outside_any_project(
    qtbot, tmp_path, filled, monkeypatch
):
    window = make_window(qtbot, tmp_path, FakeEngine(), load=False)
    questions = []

    def question(_parent, _title, text, *_args):
        questions.append(text)
        return QMessageBox.Yes

    monkeypatch.setattr(QMessageBox, "question", question)
    try:
        window.sidebar.tree.setCurrentItem(window.sidebar.item_for("project", filled["essays"]))
        window.sidebar.delete_button.click()
        assert "Its 1 chat stay" in questions[0]
        assert [p.name for p in window.store.projects()] == ["Trip"]
        assert window.store.conversation(filled["draft"]).project_id is None
        assert [row[0] for row in _rows(window.sidebar)] == [
            "Trip",
            "Other chat",
            "Loose chat",
            "Draft one",
        ]
    finally:
        close_window(window)


def test_a_chat_in_a_project_uses_the_projects_prompt_tools_and_preset(qtbot, tmp_path, filled):
    store = Store(tmp_path / "chats.sqlite3")
    store.set_project_settings(
        filled["essays"],
        ProjectSettings(tools=[builtin_key("calculator")], preset={"top_p": 0.5}),
    )
    store.close()
    engine = FakeEngine(replies=["Noted.", "Fine."])
    window = make_window(qtbot, tmp_path, engine)
    try:
        window.sidebar.tree.setCurrentItem(window.sidebar.item_for("chat", filled["draft"]))
        assert window.session.conversation_id == filled["draft"]
        # the window says where the prompt comes from
        assert window.system_prompt.text() == ""
        assert window.system_prompt.placeholderText() == (
            "From project “Essays”: You are a careful editor."
        )
        assert window.preset_panel.source_text("top_p") == "project"
        assert window.preset_panel.source_text("temperature") != "project"
        _send(qtbot, window, "Tighten this sentence.")
        request = engine.requests[-1]
        assert request.messages[0] == {"role": "system", "content": "You are a careful editor."}
        assert [t["function"]["name"] for t in request.tools] == ["calculator"]
        assert request.overrides == {"top_p": 0.5}
        # the chat's own prompt, and a value typed in the preset panel, come first
        window.system_prompt.setText("Be blunt.")
        window.system_prompt.editingFinished.emit()
        assert window.session.set_preset_value("top_p", 0.7) is None
        assert window.preset_panel.source_text("top_p") == "override"
        _send(qtbot, window, "Again.")
        request = engine.requests[-1]
        assert request.messages[0] == {"role": "system", "content": "Be blunt."}
        assert request.overrides == {"top_p": 0.7}
        # a chat in no project has none of it
        window.sidebar.tree.setCurrentItem(window.sidebar.item_for("chat", filled["loose"]))
        assert window.system_prompt.placeholderText() == "System prompt for this chat (optional)"
        assert window.preset_panel.source_text("top_p") != "project"
    finally:
        close_window(window)


def test_switching_a_tool_in_a_project_chat_makes_the_chats_own_choice(qtbot, tmp_path, filled):
    store = Store(tmp_path / "chats.sqlite3")
    store.set_project_settings(filled["essays"], ProjectSettings(tools=[builtin_key("calculator")]))
    store.close()
    window = make_window(qtbot, tmp_path, FakeEngine(), load=False)
    try:
        window.session.open_conversation(filled["draft"])
        assert window.session.chat_tools()["enabled"] == [builtin_key("calculator")]
        assert window.session.chat_tools()["source"] == "project"
        # switching one on starts from the project's: the calculator stays
        window.session.set_tool_enabled(builtin_key("get_current_datetime"), True)
        assert window.store.chat_tools(filled["draft"])["enabled"] == [
            builtin_key("calculator"),
            builtin_key("get_current_datetime"),
        ]
        assert window.session.chat_tools()["source"] == "chat"
        window.session.set_tool_enabled(builtin_key("calculator"), False)
        window.session.set_tool_enabled(builtin_key("get_current_datetime"), False)
        assert window.store.chat_defaults(filled["draft"]).tools == ()  # all off: its own choice
    finally:
        close_window(window)


def test_a_new_chat_of_a_project_opens_the_projects_default_model(qtbot, tmp_path, filled):
    store = Store(tmp_path / "chats.sqlite3")
    store.set_project_settings(filled["trip"], ProjectSettings(model="/models/trip-model.gguf"))
    store.close()
    engine = FakeEngine()
    window = make_window(qtbot, tmp_path, engine)
    try:
        menu = window.sidebar.context_menu(window.sidebar.item_for("project", filled["trip"]))
        with qtbot.waitSignal(window.controller.modelLoaded, timeout=WAIT_MS):
            next(a for a in menu.actions() if a.text() == "New chat in this project").trigger()
        assert engine.loads[-1][0] == "/models/trip-model.gguf"
        cid = window.session.conversation_id
        assert window.store.conversation(cid).project_id == filled["trip"]
        assert window.sidebar.item_for("chat", cid).parent().text(0) == "Trip"
    finally:
        close_window(window)


def test_the_settings_dialog_saves_the_project_and_the_open_chat_follows(
    qtbot, tmp_path, filled, monkeypatch
):
    engine = FakeEngine(replies=["Ok."])
    window = make_window(qtbot, tmp_path, engine)

    def fill_and_accept(dialog):
        dialog.name_edit.setText("Essays 2")
        dialog.prompt_edit.setPlainText("You are a poet.")
        dialog.preset_edit.setPlainText("temperature = 0.4")
        dialog.tools_box.setChecked(True)
        dialog.tool_checks[builtin_key("calculator")].setChecked(True)
        dialog.accept()
        return dialog.result()

    monkeypatch.setattr(ProjectDialog, "exec", fill_and_accept)
    try:
        window.session.open_conversation(filled["draft"])
        assert window.projects.edit_project(filled["essays"])
        project = window.store.project(filled["essays"])
        assert (project.name, project.system_prompt) == ("Essays 2", "You are a poet.")
        assert project.settings.preset == {"temperature": 0.4}
        assert project.settings.tools == [builtin_key("calculator")]
        assert window.sidebar.project_items()[0].text(0) == "Essays 2"
        assert window.system_prompt.placeholderText() == "From project “Essays 2”: You are a poet."
        assert window.preset_panel.source_text("temperature") == "project"
        _send(qtbot, window, "Hi")
        assert engine.requests[-1].messages[0]["content"] == "You are a poet."
        assert engine.requests[-1].overrides == {"temperature": 0.4}
    finally:
        close_window(window)


def test_the_dialog_refuses_a_bad_name_or_preset_beside_the_field(qtbot, tmp_path, filled):
    store = Store(tmp_path / "chats.sqlite3")
    project = store.project(filled["essays"])
    store.close()
    dialog = ProjectDialog(project, ["/m/a.gguf"], [{"key": "k", "name": "k", "description": ""}])
    qtbot.addWidget(dialog)
    dialog.name_edit.setText("   ")
    dialog.preset_edit.setPlainText("temprature = 0.3")
    dialog.accept()
    assert dialog.result() != QDialog.Accepted
    assert dialog.name_error.text().startswith("The project name is empty")
    assert "temprature" in dialog.preset_error.text()
    dialog.name_edit.setText("Essays")
    dialog.preset_edit.setPlainText('# cooler\ntemperature = 0.3\nstop = ["###"]')
    dialog.model_combo.setCurrentIndex(dialog.model_combo.findData("/m/a.gguf"))
    dialog.accept()
    assert dialog.result() == QDialog.Accepted
    assert dialog.result_settings == ProjectSettings(
        model="/m/a.gguf", preset={"temperature": 0.3, "stop": ["###"]}, tools=None
    )


def test_preset_lines_are_checked_by_the_engine():
    assert parse_preset("temperature = 0.3\n\nseed = 7\n") == {"temperature": 0.3, "seed": 7}
    with pytest.raises(ConfigValidationError, match="top_p"):
        parse_preset("top_p = 7")
    with pytest.raises(ValueError, match="Line 2"):
        parse_preset("seed = 1\ntemperature 0.3")


def test_search_shows_hits_with_snippets_and_opening_one_opens_its_chat(qtbot, tmp_path, filled):
    window = make_window(qtbot, tmp_path, FakeEngine(), load=False)
    sidebar = window.sidebar
    try:
        sidebar.search.setText("puffin")
        qtbot.keyClick(sidebar.search, Qt.Key_Return)  # Enter: no wait for the pause
        (hit,) = sidebar.chat_items()
        label = sidebar.tree.itemWidget(hit, 0)
        assert isinstance(label, QLabel)
        assert label.text() == "<b>Loose chat</b><br><small>Where do <b>puffins</b> nest?</small>"
        hits = []
        sidebar.searchHitOpened.connect(lambda cid, mid: hits.append((cid, mid)))
        sidebar.tree.setCurrentItem(hit)
        assert window.session.conversation_id == filled["loose"]
        assert hits == [(filled["loose"], window.store.branch(filled["loose"])[0].id)]
        # a title hit in a project names the project
        sidebar.search.setText("draft")
        qtbot.keyClick(sidebar.search, Qt.Key_Return)  # Enter: no wait for the pause
        (hit,) = sidebar.chat_items()
        assert "in Essays · <b>Draft</b> one" in sidebar.tree.itemWidget(hit, 0).text()
        sidebar.search.setText("nothing like this")
        qtbot.keyClick(sidebar.search, Qt.Key_Return)  # Enter: no wait for the pause
        assert sidebar.chat_items() == [] and sidebar.empty_label.isVisibleTo(sidebar)
        assert sidebar.empty_label.text() == "Nothing matches “nothing like this”."
        sidebar.search.setText("")
        assert len(sidebar.chat_items()) == 3 and sidebar.empty_label.isHidden()
    finally:
        close_window(window)


def test_a_name_refused_by_the_store_is_shown_and_nothing_changes(qtbot, tmp_path, filled):
    window = make_window(qtbot, tmp_path, FakeEngine(), load=False)
    errors = []
    window.projects.show_error = lambda title, text: errors.append((title, text))
    try:
        window.projects.rename_project(filled["trip"], "y" * 300)  # not through the sidebar
        assert errors and errors[0][0] == "Rename project"
        assert "300 characters long" in errors[0][1]
        assert window.store.project(filled["trip"]).name == "Trip"
    finally:
        close_window(window)


def test_without_fts5_the_search_box_says_it_matches_exact_text(qtbot, tmp_path, monkeypatch):
    from app import store as store_mod

    monkeypatch.setattr(store_mod, "fts5_available", lambda: False)
    window = make_window(qtbot, tmp_path, FakeEngine(), load=False)
    try:
        assert window.sidebar.search.placeholderText() == "Search chats (exact text)…"
        assert "FTS5" in window.sidebar.search.toolTip()
        window.session.new_conversation()
        window.store.add_message(window.session.conversation_id, "user", "a_b% literally")
        window.sidebar.search.setText("b% lit")
        qtbot.keyClick(window.sidebar.search, Qt.Key_Return)
        assert len(window.sidebar.chat_items()) == 1
    finally:
        close_window(window)
