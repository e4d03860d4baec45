"""Conversations as trees: regenerate and edit add versions, `< n/m >` switches them and the chat
below follows, "Branch from here" copies the path into a new chat, versions survive a restart and
the export (JSON: the whole tree; Markdown: the visible branch)."""

import json

from PySide6.QtCore import Qt
from PySide6.QtWidgets import QInputDialog

from tests.app_fakes import WAIT_MS, FakeEngine, close_window, make_window


def wait_idle(qtbot, window, action):
    with qtbot.waitSignal(
        window.session.busyChanged, timeout=WAIT_MS, check_params_cb=lambda busy: busy is False
    ):
        action()


def send(qtbot, window, text):
    window.input.setPlainText(text)
    wait_idle(qtbot, window, lambda: qtbot.keyClick(window.input, Qt.Key_Return))


def texts(window):
    return [w.text for w in window.chat_view.widgets]


def versions(window):
    return [
        w.version_label.text() if w.version_label is not None else ""
        for w in window.chat_view.widgets
    ]


def test_regenerate_twice_keeps_three_versions_that_switch_and_survive_restart(qtbot, tmp_path):
    engine = FakeEngine(replies=["Draft one.", "Draft two.", "Draft three.", "Follow-up answer."])
    window = make_window(qtbot, tmp_path, engine)
    send(qtbot, window, "Write a line")
    wait_idle(qtbot, window, lambda: window.chat_view.widgets[1].regenerate_button.click())
    wait_idle(qtbot, window, lambda: qtbot.keyClick(window, Qt.Key_R, Qt.ControlModifier))
    assert texts(window) == ["Write a line", "Draft three."]
    assert versions(window) == ["", "3/3"]
    # Each regenerate asked the same question again: the old drafts are not in the prompt.
    assert [r.messages for r in engine.requests] == [
        ({"role": "user", "content": "Write a line"},)
    ] * 3

    # Continue the chat on version 3, then go back to version 1: its branch has no follow-up.
    send(qtbot, window, "And another?")
    assert texts(window) == ["Write a line", "Draft three.", "And another?", "Follow-up answer."]
    reply = window.chat_view.widgets[1]
    reply.previous_version.click()
    assert texts(window) == ["Write a line", "Draft two."]
    window.chat_view.widgets[1].previous_version.click()
    assert texts(window) == ["Write a line", "Draft one."] and versions(window) == ["", "1/3"]
    assert not window.chat_view.widgets[1].previous_version.isEnabled()
    # Forward to 3 again: the follow-up comes back with it.
    window.chat_view.widgets[1].next_version.click()
    window.chat_view.widgets[1].next_version.click()
    assert texts(window)[-1] == "Follow-up answer."
    window.chat_view.widgets[1].previous_version.click()  # leave version 2 showing
    close_window(window)

    window = make_window(qtbot, tmp_path, FakeEngine())
    assert texts(window) == ["Write a line", "Draft two."] and versions(window) == ["", "2/3"]
    window.chat_view.widgets[1].next_version.click()
    assert texts(window) == ["Write a line", "Draft three.", "And another?", "Follow-up answer."]
    close_window(window)


def test_a_request_after_switching_uses_the_chosen_branch(qtbot, tmp_path):
    engine = FakeEngine(replies=["First.", "Second.", "Next."])
    window = make_window(qtbot, tmp_path, engine)
    send(qtbot, window, "Q")
    wait_idle(qtbot, window, lambda: window.chat_view.widgets[1].regenerate_button.click())
    window.chat_view.widgets[1].previous_version.click()
    send(qtbot, window, "Q2")
    assert engine.requests[-1].messages == (
        {"role": "user", "content": "Q"},
        {"role": "assistant", "content": "First."},
        {"role": "user", "content": "Q2"},
    )
    close_window(window)


def test_edit_makes_a_new_version_of_the_user_message(qtbot, tmp_path, monkeypatch):
    engine = FakeEngine(replies=["A1", "A2", "A1 edited"])
    window = make_window(qtbot, tmp_path, engine)
    send(qtbot, window, "Q1")
    send(qtbot, window, "Q2")
    monkeypatch.setattr(QInputDialog, "getMultiLineText", lambda *a, **k: ("Q1 edited", True))
    wait_idle(qtbot, window, lambda: window.chat_view.widgets[0].edit_button.click())
    assert texts(window) == ["Q1 edited", "A1 edited"] and versions(window) == ["2/2", ""]
    assert engine.requests[-1].messages == ({"role": "user", "content": "Q1 edited"},)
    window.chat_view.widgets[0].previous_version.click()  # the original, with all that followed
    assert texts(window) == ["Q1", "A1", "Q2", "A2"]
    close_window(window)


def test_branch_from_here_copies_the_path_into_a_new_chat(qtbot, tmp_path):
    engine = FakeEngine(replies=["A1", "A2", "A3"])
    window = make_window(qtbot, tmp_path, engine)
    window.system_prompt.setText("Be brief.")
    send(qtbot, window, "Q1")
    send(qtbot, window, "Q2")
    original = window.session.conversation_id
    window.chat_view.widgets[1].branch_button.click()  # branch after A1
    branched = window.session.conversation_id
    assert branched != original
    assert texts(window) == ["Q1", "A1"] and window.system_prompt.text() == "Be brief."
    assert window.sidebar.current_id() == branched
    send(qtbot, window, "Q2 in the branch")
    assert engine.requests[-1].messages == (
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Q1"},
        {"role": "assistant", "content": "A1"},
        {"role": "user", "content": "Q2 in the branch"},
    )
    # The original chat is untouched; the branch keeps the copied reply's usage and tokens.
    assert [m.content for m in window.store.messages(original)] == ["Q1", "A1", "Q2", "A2"]
    copied = window.store.messages(branched)[1]
    assert copied.usage["completion_tokens"] == 1 and copied.tokens[0]["text"] == "A1"
    close_window(window)


def test_export_json_holds_the_tree_and_markdown_the_visible_branch(qtbot, tmp_path):
    engine = FakeEngine(replies=["Old reply.", "New reply."])
    window = make_window(qtbot, tmp_path, engine)
    send(qtbot, window, "Question")
    wait_idle(qtbot, window, lambda: window.chat_view.widgets[1].regenerate_button.click())
    md, js = tmp_path / "chat.md", tmp_path / "chat.json"
    window.export_to(str(md))
    window.export_to(str(js))
    text = md.read_text()
    assert "New reply." in text and "Old reply." not in text
    record = json.loads(js.read_text())
    by_id = {m["id"]: m for m in record["messages"]}
    assert sorted(m["content"] for m in record["messages"]) == [
        "New reply.",
        "Old reply.",
        "Question",
    ]
    assert [by_id[i]["content"] for i in record["branch"]] == ["Question", "New reply."]
    question = next(m for m in record["messages"] if m["role"] == "user")
    assert question["parent_id"] is None
    assert {m["parent_id"] for m in record["messages"] if m["role"] == "assistant"} == {
        question["id"]
    }
    close_window(window)
