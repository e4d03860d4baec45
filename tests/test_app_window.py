"""The main window over a fake engine (real event dataclasses): streaming, cancel, errors,
presets with provenance, persistence, edit + regenerate, export, JSON replies, token inspector."""

import json

import pytest
from PySide6.QtCore import Qt
from PySide6.QtWidgets import QMessageBox

from app.views.message_widget import MessageWidget
from app.views.tool_call_widget import ToolCallWidget
from tests.app_fakes import WAIT_MS, FakeEngine, close_window, make_window


@pytest.fixture
def dialogs(monkeypatch):
    shown = []
    monkeypatch.setattr(
        QMessageBox, "critical", lambda parent, title, text, *a, **k: shown.append((title, text))
    )
    return shown


def send_and_wait(qtbot, window, text, timeout=WAIT_MS):
    with qtbot.waitSignal(
        window.session.busyChanged, timeout=timeout, check_params_cb=lambda busy: busy is False
    ):
        window.input.setPlainText(text)
        qtbot.keyClick(window.input, Qt.Key_Return)


def test_reply_streams_into_the_view_in_order(qtbot, tmp_path):
    reply = "Paris is the capital of **France**. It has about two million people."
    engine = FakeEngine(replies=[reply], pause_after=4)
    window = make_window(qtbot, tmp_path, engine)
    seen = []

    def record():
        w = window.chat_view.streaming_widget
        if w is not None:
            seen.append(w.text)

    window.frame_timer.timeout.connect(record)
    with qtbot.waitSignal(
        window.session.busyChanged, timeout=WAIT_MS, check_params_cb=lambda busy: busy is False
    ):
        window.input.setPlainText("What is the capital of France?")
        qtbot.keyClick(window.input, Qt.Key_Return)
        # The engine holds after four tokens: a frame must draw them before the rest exists.
        qtbot.waitUntil(lambda: "Paris is the capital" in seen, timeout=WAIT_MS)
        engine.gate.set()
    user, assistant = window.chat_view.widgets
    assert user.text == "What is the capital of France?" and assistant.text == reply
    # Drawn progressively: every frame shows a prefix of the reply, growing.
    partial = [t for t in seen if t and t != reply]
    assert partial, "no intermediate frame was drawn"
    assert all(reply.startswith(t) for t in seen)
    assert [len(t) for t in seen] == sorted(len(t) for t in seen)
    assert "France" in assistant.body.toPlainText() and "**" not in assistant.body.toPlainText()
    assert window.input.toPlainText() == ""
    close_window(window)


def test_shift_enter_inserts_newline_instead_of_sending(qtbot, tmp_path):
    window = make_window(qtbot, tmp_path, FakeEngine())
    window.input.setPlainText("line one")
    from PySide6.QtGui import QTextCursor

    window.input.moveCursor(QTextCursor.End)
    qtbot.keyClick(window.input, Qt.Key_Return, Qt.ShiftModifier)
    assert window.input.toPlainText() == "line one\n"
    assert window.chat_view.widgets == []
    close_window(window)


def test_cancel_mid_stream_keeps_text_and_marks_it(qtbot, tmp_path):
    engine = FakeEngine(replies=["one two three four five six seven"], pause_after=3)
    window = make_window(qtbot, tmp_path, engine)
    window.input.setPlainText("count please")
    qtbot.keyClick(window.input, Qt.Key_Return)
    qtbot.waitUntil(
        lambda: (
            window.chat_view.streaming_widget is not None
            and window.chat_view.streaming_widget.text == "one two three"
        ),
        timeout=WAIT_MS,
    )
    assert window.cancel_button.isEnabled()
    with qtbot.waitSignal(window.session.busyChanged, timeout=WAIT_MS):
        qtbot.keyClick(window, Qt.Key_Escape)  # Esc shortcut -> CancelToken.cancel()
        engine.gate.set()
    reply = window.chat_view.widgets[-1]
    assert reply.text == "one two three"
    assert "cancelled" in reply.status_label.text()
    stored = window.store.messages(window.session.conversation_id)[-1]
    assert (stored.content, stored.status, stored.finish_reason) == (
        "one two three",
        "cancelled",
        "cancelled",
    )
    assert window.usage_panel.text_of("finish_reason") == "cancelled by you"
    close_window(window)


def test_generation_error_shows_dialog_and_app_keeps_working(qtbot, tmp_path, dialogs):
    from engine.errors import ContextOverflowError

    engine = FakeEngine(replies=["fine now"])
    engine.fail_generate_with = ContextOverflowError(
        "prompt 9000 tokens + max_new_tokens 256 > context 8192"
    )
    window = make_window(qtbot, tmp_path, engine)
    send_and_wait(qtbot, window, "a very long question")
    assert dialogs and dialogs[0][0] == "Generation failed" and "context 8192" in dialogs[0][1]
    assert window.store.messages(window.session.conversation_id)[-1].status == "error"
    engine.fail_generate_with = None
    assert window.send_button.isEnabled()
    send_and_wait(qtbot, window, "shorter")
    assert window.chat_view.widgets[-1].text == "fine now"
    close_window(window)


def test_bad_model_file_shows_dialog(qtbot, tmp_path, dialogs):
    window = make_window(qtbot, tmp_path, FakeEngine(), load=False)
    with qtbot.waitSignal(window.controller.loadFailed, timeout=WAIT_MS):
        window.open_model(str(tmp_path / "broken.bad"))
    assert dialogs[0][0] == "Could not open the model" and "not a GGUF file" in dialogs[0][1]
    assert not window.send_button.isEnabled()
    close_window(window)


def test_preset_panel_shows_sources_refuses_invalid_saves_and_resets(qtbot, tmp_path):
    window = make_window(qtbot, tmp_path, FakeEngine())
    panel = window.preset_panel
    assert panel.value_text("temperature") == "0.2"
    assert panel.source_text("temperature") == "generation_config.json"
    assert panel.source_text("do_sample") == "gguf metadata"
    row = panel.row_of("temperature")
    assert panel.source_label("temperature") == "gen. config"  # what the cell shows
    assert "generation_config.json" in panel.table.item(row, 2).toolTip()

    panel.table.item(panel.row_of("top_p"), 1).setText("1.5")
    assert panel.error_label.isVisible()
    assert panel.error_label.text() == "Refused: top_p=1.5 is invalid: must be a number in (0, 1]"
    assert panel.value_text("top_p") == "0.9"  # refused value put back

    panel.table.item(panel.row_of("temperature"), 1).setText("0.7")
    assert not panel.error_label.isVisible()
    assert (panel.value_text("temperature"), panel.source_text("temperature")) == (
        "0.7",
        "override",
    )
    send_and_wait(qtbot, window, "hi")
    assert window.controller.bridge.requests[-1].overrides == {"temperature": 0.7}

    panel.save_button.click()
    assert panel.source_text("temperature") == "saved preset"
    assert window.settings_file.load().presets["/models/fake-model.gguf"] == {"temperature": 0.7}

    panel.reset_button.click()
    assert (panel.value_text("temperature"), panel.source_text("temperature")) == (
        "0.2",
        "generation_config.json",
    )
    assert "/models/fake-model.gguf" not in window.settings_file.load().presets
    close_window(window)


def test_conversations_persist_and_reload(qtbot, tmp_path):
    window = make_window(qtbot, tmp_path, FakeEngine(replies=["First answer.", "Second answer."]))
    window.system_prompt.setText("You are terse.")
    send_and_wait(qtbot, window, "First question")
    window.new_chat()
    # The old messages leave the layout at once (not only at the next deferred delete).
    layout = window.chat_view._layout
    in_layout = [layout.itemAt(i).widget() for i in range(layout.count())]
    assert window.chat_view.widgets == []
    assert not [w for w in in_layout if isinstance(w, (MessageWidget, ToolCallWidget))]
    send_and_wait(qtbot, window, "Second question")
    close_window(window)

    window = make_window(qtbot, tmp_path, FakeEngine())
    titles = [item.text(0) for item in window.sidebar.chat_items()]
    assert titles == ["Second question", "First question"]
    window.sidebar.tree.setCurrentItem(window.sidebar.chat_items()[1])
    assert [w.text for w in window.chat_view.widgets] == ["First question", "First answer."]
    first_ttft = window.store.messages(window.sidebar.current_id())[-1].usage["ttft_ms"]
    assert window.ttft_panel.strip.values_ms == [first_ttft]  # the strip survives a restart
    assert window.usage_panel.text_of("completion_tokens") == "2"
    assert window.system_prompt.text() == "You are terse."
    window.sidebar.search.setText("second")
    qtbot.keyClick(window.sidebar.search, Qt.Key_Return)  # Enter searches at once
    assert len(window.sidebar.chat_items()) == 1
    close_window(window)


def test_system_prompt_goes_first_in_the_request(qtbot, tmp_path):
    engine = FakeEngine(replies=["ok"])
    window = make_window(qtbot, tmp_path, engine)
    window.system_prompt.setText("Answer in French.")
    send_and_wait(qtbot, window, "Hello")
    assert engine.requests[-1].messages == (
        {"role": "system", "content": "Answer in French."},
        {"role": "user", "content": "Hello"},
    )
    close_window(window)


def test_edit_user_message_and_regenerate_from_there(qtbot, tmp_path, monkeypatch):
    engine = FakeEngine(replies=["Answer one.", "Answer two.", "Answer three."])
    window = make_window(qtbot, tmp_path, engine)
    send_and_wait(qtbot, window, "Question one")
    send_and_wait(qtbot, window, "Question two")
    first_user = window.chat_view.widgets[0]

    from PySide6.QtWidgets import QInputDialog

    monkeypatch.setattr(
        QInputDialog, "getMultiLineText", lambda *a, **k: ("Question one, edited", True)
    )
    with qtbot.waitSignal(
        window.session.busyChanged, timeout=WAIT_MS, check_params_cb=lambda b: b is False
    ):
        first_user.edit_button.click()
    assert [w.text for w in window.chat_view.widgets] == ["Question one, edited", "Answer three."]
    assert engine.requests[-1].messages == ({"role": "user", "content": "Question one, edited"},)
    stored = window.store.messages(window.session.conversation_id)
    assert [m.content for m in stored] == ["Question one, edited", "Answer three."]
    close_window(window)


def test_regenerate_replaces_last_reply(qtbot, tmp_path):
    engine = FakeEngine(replies=["Draft.", "Better."])
    window = make_window(qtbot, tmp_path, engine)
    send_and_wait(qtbot, window, "Write a line")
    with qtbot.waitSignal(
        window.session.busyChanged, timeout=WAIT_MS, check_params_cb=lambda b: b is False
    ):
        qtbot.keyClick(window, Qt.Key_R, Qt.ControlModifier)
    assert [w.text for w in window.chat_view.widgets] == ["Write a line", "Better."]
    assert engine.requests[-1].messages == ({"role": "user", "content": "Write a line"},)
    close_window(window)


def test_export_markdown_and_json(qtbot, tmp_path):
    window = make_window(qtbot, tmp_path, FakeEngine(replies=["Use `print()`."]))
    window.system_prompt.setText("Be helpful.")
    send_and_wait(qtbot, window, "How do I print in Python?")
    md, js = tmp_path / "chat.md", tmp_path / "chat.json"
    window.export_to(str(md))
    window.export_to(str(js))
    text = md.read_text()
    assert text.startswith("# How do I print in Python?\n")
    assert (
        "## You\n\nHow do I print in Python?" in text and "## Assistant\n\nUse `print()`." in text
    )
    assert "Be helpful." in text
    record = json.loads(js.read_text())
    assert record["format"] == "localchat-conversation" and record["system_prompt"] == "Be helpful."
    assert [(m["role"], m["content"]) for m in record["messages"]] == [
        ("user", "How do I print in Python?"),
        ("assistant", "Use `print()`."),
    ]
    assert record["messages"][1]["usage"]["completion_tokens"] == 2
    close_window(window)


def test_usage_ttft_and_token_inspector_filled_after_reply(qtbot, tmp_path):
    window = make_window(qtbot, tmp_path, FakeEngine(replies=["alpha beta gamma"]))
    send_and_wait(qtbot, window, "three words")
    assert window.usage_panel.text_of("completion_tokens") == "3"
    assert window.usage_panel.text_of("finish_reason") == "stop (end of turn)"
    assert window.usage_panel.context_bar.maximum() == 4096  # settings.context_size passed to load
    assert "ms" in window.ttft_panel.current.text()
    assert len(window.ttft_panel.strip.values_ms) == 1
    inspector = window.token_inspector
    assert [t["text"] for t in inspector.tokens] == ["alpha", " beta", " gamma"]
    inspector._on_anchor(__import__("PySide6.QtCore").QtCore.QUrl("token:1"))
    assert inspector.table.rowCount() == 2
    assert inspector.table.item(0, 0).text() == "▶ ·beta"
    assert inspector.table.item(0, 1).text() == "81.9%"  # exp(-0.2)
    close_window(window)


def test_json_mode_reply_is_pretty_printed_with_status(qtbot, tmp_path):
    engine = FakeEngine(replies=['{"name": "Ada", "age": 36}', '{"name": "Ada", '])
    window = make_window(qtbot, tmp_path, engine)
    window.json_bar.combo.setCurrentIndex(1)  # any JSON object
    send_and_wait(qtbot, window, "A person as JSON")
    assert engine.requests[-1].json_mode == "object"
    reply = window.chat_view.widgets[-1]
    assert reply.json_status.text() == "✔ valid JSON object"
    assert '"name": "Ada",\n  "age": 36' in reply.body.toPlainText()
    send_and_wait(qtbot, window, "Again")
    assert window.chat_view.widgets[-1].json_status.text().startswith("✖ not valid JSON")
    close_window(window)


def test_sidebar_rename_and_delete(qtbot, tmp_path, monkeypatch):
    from PySide6.QtWidgets import QInputDialog

    window = make_window(qtbot, tmp_path, FakeEngine())
    send_and_wait(qtbot, window, "to be renamed")
    monkeypatch.setattr(QInputDialog, "getText", lambda *a, **k: ("Renamed chat", True))
    window.sidebar.rename_button.click()
    assert window.sidebar.chat_items()[0].text(0) == "Renamed chat"
    monkeypatch.setattr(QMessageBox, "question", lambda *a, **k: QMessageBox.Yes)
    window.sidebar.delete_button.click()
    assert [c.title for c in window.store.list_conversations()] == ["New chat"]
    assert window.chat_view.widgets == []
    close_window(window)


def test_context_trimming_notice_is_shown(qtbot, tmp_path):
    from app.engine_bridge import ContextTrimmed

    engine = FakeEngine(replies=["ok"], trimmed=ContextTrimmed(2, 4, 900, 1024))
    window = make_window(qtbot, tmp_path, engine)
    send_and_wait(qtbot, window, "one more question")
    assert window.state_label.text() == "Older turns left out to fit the context"
    assert (
        "2 oldest turns" in window.state_label.toolTip()
        and "1,024-token" in window.state_label.toolTip()
    )
    assert window.chat_view.widgets[-1].text == "ok"
    close_window(window)


def test_deleting_or_leaving_a_chat_while_it_streams(qtbot, tmp_path, monkeypatch):
    engine = FakeEngine(replies=["a b c d e f", "g h i j k l"], pause_after=2)
    window = make_window(qtbot, tmp_path, engine)
    first = window.session.conversation_id
    window.input.setPlainText("stream")
    window.send()
    qtbot.waitUntil(
        lambda: (
            window.chat_view.streaming_widget is not None
            and window.chat_view.streaming_widget.text == "a b"
        ),
        timeout=WAIT_MS,
    )
    second = window.session.new_conversation()  # leaving cancels
    with qtbot.waitSignal(window.session.busyChanged, timeout=WAIT_MS):
        engine.gate.set()
    assert window.session.conversation_id == second and window.chat_view.widgets == []
    assert window.store.messages(first)[-1].status == "cancelled"
    assert window.usage_panel.text_of("completion_tokens") == "—"  # not the other chat's reply

    engine.gate.clear()
    window.input.setPlainText("stream again")
    window.send()
    qtbot.waitUntil(
        lambda: (
            window.chat_view.streaming_widget is not None
            and window.chat_view.streaming_widget.text == "g h"
        ),
        timeout=WAIT_MS,
    )
    monkeypatch.setattr(QMessageBox, "question", lambda *a, **k: QMessageBox.Yes)
    window.sidebar.delete_button.click()  # deletes the streaming chat
    with qtbot.waitSignal(window.session.busyChanged, timeout=WAIT_MS):
        engine.gate.set()
    assert [c.id for c in window.store.list_conversations()] == [first]
    assert window.send_button.isEnabled()
    close_window(window)


def test_malformed_generation_config_is_reported_in_the_preset_panel(qtbot, tmp_path):
    from engine.errors import PresetFileError

    class BrokenPresetEngine(FakeEngine):
        def resolve_preset(self, lm, saved, overrides):
            raise PresetFileError(
                "/models/generation_config.json: Expecting value: line 1 column 1"
            )

    window = make_window(qtbot, tmp_path, BrokenPresetEngine())
    panel = window.preset_panel
    assert panel.error_label.isVisible()
    assert panel.error_label.text().startswith("/models/generation_config.json: Expecting value")
    assert window.tabs.currentWidget() is panel
    close_window(window)


def test_regenerate_an_earlier_reply_drops_what_followed(qtbot, tmp_path):
    engine = FakeEngine(replies=["A1", "A2", "A1 again"])
    window = make_window(qtbot, tmp_path, engine)
    send_and_wait(qtbot, window, "Q1")
    send_and_wait(qtbot, window, "Q2")
    first_reply = window.chat_view.widgets[1]
    with qtbot.waitSignal(
        window.session.busyChanged, timeout=WAIT_MS, check_params_cb=lambda b: b is False
    ):
        first_reply.regenerate_button.click()
    assert [w.text for w in window.chat_view.widgets] == ["Q1", "A1 again"]
    assert engine.requests[-1].messages == ({"role": "user", "content": "Q1"},)
    close_window(window)
