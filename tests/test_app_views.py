"""Smaller view behaviours: reasoning shown collapsed, schema editor validation, settings dialog,
drag-and-drop of a GGUF, recent models, shortcuts, title and icon, export through qasync."""

import asyncio
import json

from PySide6.QtCore import QMimeData, QPointF, Qt, QUrl
from PySide6.QtGui import QDropEvent
from PySide6.QtWidgets import QApplication, QDialog, QDialogButtonBox

from app.views.json_mode_bar import SchemaDialog
from app.views.settings_dialog import SettingsDialog
from tests.app_fakes import WAIT_MS, FakeEngine, close_window, make_window


def send_and_wait(qtbot, window, text):
    with qtbot.waitSignal(
        window.session.busyChanged, timeout=WAIT_MS, check_params_cb=lambda b: b is False
    ):
        window.input.setPlainText(text)
        window.send()


def test_title_icon_and_shortcuts(qtbot, tmp_path):
    window = make_window(qtbot, tmp_path, FakeEngine())
    assert window.windowTitle() == "LocalChat"
    assert not window.windowIcon().isNull()
    assert window.windowIcon().availableSizes()  # rendered from resources/icon.svg
    shortcuts = {
        a.text(): a.shortcut().toString()
        for a in (
            window.new_chat_action,
            window.cancel_action,
            window.regenerate_action,
            window.focus_action,
            window.chats_panel_action,
            window.side_panel_action,
        )
    }
    assert shortcuts == {
        "New chat": "Ctrl+N",
        "Stop generating": "Esc",
        "Regenerate reply": "Ctrl+R",
        "Focus input": "Ctrl+L",
        "Chats list": "Ctrl+B",
        "Side panel": "Ctrl+Alt+B",
    }
    send_and_wait(qtbot, window, "first chat")
    qtbot.keyClick(window, Qt.Key_N, Qt.ControlModifier)
    assert len(window.store.list_conversations()) == 2 and window.chat_view.widgets == []
    window.system_prompt.setFocus()
    qtbot.keyClick(window, Qt.Key_L, Qt.ControlModifier)
    qtbot.waitUntil(lambda: QApplication.focusWidget() is window.input, timeout=WAIT_MS)
    qtbot.keyClick(window, Qt.Key_B, Qt.ControlModifier)  # the chats list folds away
    assert not window.sidebar.isVisible() and window.settings.collapsed_panels == ["chats"]
    qtbot.keyClick(window, Qt.Key_B, Qt.ControlModifier)
    assert window.sidebar.isVisible() and window.settings.collapsed_panels == []
    close_window(window)


def test_reasoning_is_shown_apart_and_collapsed(qtbot, tmp_path):
    engine = FakeEngine(
        replies=["The answer is 4."], reasoning="2 plus 2: count two more from two."
    )
    window = make_window(qtbot, tmp_path, engine)
    send_and_wait(qtbot, window, "2+2?")
    reply = window.chat_view.widgets[-1]
    assert reply.text == "The answer is 4."
    assert "count two more" not in reply.body.toPlainText()
    assert reply.reasoning_toggle.isVisible() and not reply.reasoning_view.isVisible()
    assert reply.reasoning_toggle.text() == "Reasoning (8 words)"
    reply.reasoning_toggle.click()
    assert reply.reasoning_view.isVisible()
    assert reply.reasoning_view.toPlainText() == "2 plus 2: count two more from two."
    stored = window.store.messages(window.session.conversation_id)[-1]
    assert stored.reasoning == "2 plus 2: count two more from two."
    close_window(window)


def test_schema_dialog_validates_before_use(qtbot):
    dialog = SchemaDialog("")
    qtbot.addWidget(dialog)
    ok = dialog.buttons.button(QDialogButtonBox.Ok)
    assert ok.isEnabled() and dialog.schema["required"] == ["name", "age"]  # the example
    dialog.editor.setPlainText('{"type": "object", ')
    assert not ok.isEnabled() and dialog.status.text().startswith("✖ Not valid JSON")
    dialog.editor.setPlainText("[1, 2]")
    assert not ok.isEnabled() and "must be an object" in dialog.status.text()
    dialog.editor.setPlainText('{"type": "objekt"}')
    assert not ok.isEnabled() and dialog.status.text().endswith("Invalid type: objekt")
    dialog.editor.setPlainText('{"type": "object", "properties": {"a": {"type": "integer"}}}')
    assert ok.isEnabled() and dialog.status.text() == "✔ valid schema"


def test_choosing_schema_mode_without_a_valid_schema_stays_off(qtbot, tmp_path, monkeypatch):
    window = make_window(qtbot, tmp_path, FakeEngine())
    monkeypatch.setattr(SchemaDialog, "exec", lambda self: QDialog.Rejected)
    window.json_bar.combo.setCurrentIndex(2)
    assert window.json_bar.mode == "off" and window.session.json_mode == "off"

    def accept(self):
        self.editor.setPlainText('{"type": "object", "properties": {"city": {"type": "string"}}}')
        return QDialog.Accepted

    monkeypatch.setattr(SchemaDialog, "exec", accept)
    window.json_bar.combo.setCurrentIndex(2)
    assert window.session.json_mode == "schema"
    assert window.session.json_schema == {
        "type": "object",
        "properties": {"city": {"type": "string"}},
    }
    assert window.json_bar.schema_label.text() == "fields: city"
    send_and_wait(qtbot, window, "json please")
    assert window.controller.bridge.requests[-1].json_schema == window.session.json_schema
    close_window(window)


def test_settings_dialog_applies_and_saves(qtbot, tmp_path, monkeypatch):
    window = make_window(qtbot, tmp_path, FakeEngine())

    def change(self):
        self.theme.setCurrentIndex(self.theme.findData("dark"))
        self.font_size.setValue(14)
        self.threads.setValue(1)
        self.context.setValue(2048)
        return QDialog.Accepted

    monkeypatch.setattr(SettingsDialog, "exec", change)
    window.open_settings()
    saved = window.settings_file.load()
    assert (saved.theme, saved.font_size, saved.threads, saved.context_size) == (
        "dark",
        14,
        1,
        2048,
    )
    app = QApplication.instance()
    assert app.font().pointSize() == 14
    assert app.palette().color(app.palette().ColorRole.Window).lightness() < 100
    from app.theme import apply_theme

    apply_theme(app, "light", 11)  # leave the shared QApplication as other tests expect it
    close_window(window)


def test_drop_a_gguf_opens_it_and_recent_models_remember(qtbot, tmp_path):
    window = make_window(qtbot, tmp_path, FakeEngine())
    model = tmp_path / "dropped.gguf"
    mime = QMimeData()
    mime.setUrls([QUrl.fromLocalFile(str(model))])
    event = QDropEvent(QPointF(10, 10), Qt.CopyAction, mime, Qt.LeftButton, Qt.NoModifier)
    with qtbot.waitSignal(window.controller.modelLoaded, timeout=WAIT_MS):
        window.dropEvent(event)
    assert window.controller.model.path == str(model)
    assert window.settings.recent_models[:2] == [str(model), "/models/fake-model.gguf"]
    actions = window.model_bar.recent_menu.actions()
    assert [a.text() for a in actions] == ["dropped.gguf", "fake-model.gguf"]
    with qtbot.waitSignal(window.controller.modelLoaded, timeout=WAIT_MS):
        actions[1].trigger()
    assert window.controller.model.path == "/models/fake-model.gguf"
    close_window(window)


def test_export_runs_through_the_qasync_loop(qtbot, tmp_path):
    import qasync

    window = make_window(qtbot, tmp_path, FakeEngine(replies=["Exported reply."]))
    send_and_wait(qtbot, window, "export me")
    loop = qasync.QEventLoop(QApplication.instance(), already_running=False)
    asyncio.set_event_loop(loop)
    target = tmp_path / "out.json"

    async def export_and_wait():
        window.export_to(str(target))
        assert window._export_tasks, "with a running loop the write goes through asyncio"
        await asyncio.gather(*window._export_tasks)

    try:
        loop.run_until_complete(export_and_wait())
    finally:
        asyncio.set_event_loop(None)
        loop.close()
    record = json.loads(target.read_text())
    assert record["messages"][-1]["content"] == "Exported reply."
    qtbot.waitUntil(lambda: window.state_label.text() == "Exported to out.json", timeout=WAIT_MS)
    close_window(window)


def test_details_selects_a_reply_and_copy_copies(qtbot, tmp_path):
    window = make_window(qtbot, tmp_path, FakeEngine(replies=["first reply here", "second"]))
    send_and_wait(qtbot, window, "one")
    send_and_wait(qtbot, window, "two")
    first_reply = window.chat_view.widgets[1]
    first_reply.details_button.click()
    assert window.selected_message_id == first_reply.message.id
    assert window.usage_panel.text_of("completion_tokens") == "3"
    assert [t["text"] for t in window.token_inspector.tokens] == ["first", " reply", " here"]
    first_reply.copy_button.click()
    assert QApplication.clipboard().text() == "first reply here"
    close_window(window)


def test_interrupted_reply_is_marked_after_restart(qtbot, tmp_path):
    from app.store import Store

    store = Store(tmp_path / "chats.sqlite3")
    cid = store.create_conversation("Crashed chat")
    store.add_message(cid, "user", "question")
    reply = store.begin_reply(cid)
    store.save_partial(reply, "half an ans")
    store._db.close()  # the app died here

    window = make_window(qtbot, tmp_path, FakeEngine())
    widget = window.chat_view.widgets[-1]
    assert widget.text == "half an ans"
    assert widget.status_label.text().startswith("⚠ interrupted")
    close_window(window)


def test_real_engine_bad_file_is_a_dialog_not_a_crash(qtbot, tmp_path, monkeypatch):
    from PySide6.QtWidgets import QMessageBox

    from app.engine_bridge import RealEngine

    shown = []
    monkeypatch.setattr(
        QMessageBox, "critical", lambda parent, title, text, *a, **k: shown.append((title, text))
    )
    bad = tmp_path / "notes.gguf"
    bad.write_text("these are not model weights\n" * 10)
    window = make_window(qtbot, tmp_path, RealEngine(), load=False)
    with qtbot.waitSignal(window.controller.loadFailed, timeout=WAIT_MS):
        window.open_model(str(bad))
    [(title, text)] = shown
    assert title == "Could not open the model" and text.startswith("notes.gguf\n\n")
    assert "GGUF" in text  # the engine's ModelFileError, written for people
    assert window.controller.model is None and not window.send_button.isEnabled()
    assert "No model loaded" in window.model_bar.model_label.text()
    close_window(window)


def test_code_blocks_are_tinted(qtbot):
    from PySide6.QtGui import QPalette, QTextDocument

    from app.views.markdown_style import code_background, set_markdown

    doc = QTextDocument()
    palette = QPalette()
    set_markdown(doc, "Prose here.\n\n```python\nx = 1\ny = 2\n```\n\nMore prose.", palette)
    tinted = []
    block = doc.begin()
    while block.isValid():
        tinted.append(
            (block.text(), block.blockFormat().background().color() == code_background(palette))
        )
        block = block.next()
    assert ("x = 1", True) in tinted and ("y = 2", True) in tinted
    assert ("Prose here.", False) in tinted and ("More prose.", False) in tinted
