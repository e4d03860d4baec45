"""The Tools panel says where the open chat's tools come from (issue 35): a chat in a project
that has a tool list uses it until the chat gets its own, and the panel showed the project's
ticks with no word of that, so switching one off looked like changing the project."""

from __future__ import annotations

from app.project_settings import ProjectSettings
from app.store import Store
from app.tool_registry import builtin_key
from tests.app_fakes import FakeEngine, close_window, make_window


def test_the_tools_panel_says_from_project_until_the_chat_has_its_own_choice(qtbot, tmp_path):
    store = Store(tmp_path / "chats.sqlite3")
    essays = store.create_project(
        "Essays", settings=ProjectSettings(tools=[builtin_key("calculator")])
    )
    draft = store.create_conversation("Draft", project_id=essays)
    loose = store.create_conversation("Loose")
    store.close()
    window = make_window(qtbot, tmp_path, FakeEngine(), load=False)
    try:
        panel = window.tools_panel
        window.session.open_conversation(draft)
        assert panel.source_label.isVisibleTo(panel)
        assert panel.source_label.text() == "From project “Essays”"
        assert panel.boxes[builtin_key("calculator")].isChecked()
        # a tick here gives the chat its own choice; the panel says so
        panel.boxes[builtin_key("get_current_datetime")].click()
        assert panel.source_label.text() == "This chat's own choice"
        assert "Essays" in panel.source_label.toolTip()
        assert window.store.project(essays).settings.tools == [builtin_key("calculator")]
        # a chat in no project: nothing to say
        window.session.open_conversation(loose)
        assert not panel.source_label.isVisibleTo(panel)
    finally:
        close_window(window)
