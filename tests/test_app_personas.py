"""Personas: saved system prompts picked per chat, kept in the settings file across restarts; a
chat keeps its own copy of the prompt when the persona is deleted; a broken personas value in a
hand-edited settings file gives none instead of a failed start."""

import json

from PySide6.QtCore import Qt
from PySide6.QtWidgets import QInputDialog

from app.settings import SettingsFile
from tests.app_fakes import WAIT_MS, FakeEngine, close_window, make_window


def send(qtbot, window, text):
    window.input.setPlainText(text)
    with qtbot.waitSignal(
        window.session.busyChanged, timeout=WAIT_MS, check_params_cb=lambda busy: busy is False
    ):
        qtbot.keyClick(window.input, Qt.Key_Return)


def choose(window, name):
    picker = window.persona_picker
    index = picker.combo.findText(name)
    assert index >= 0, [picker.combo.itemText(i) for i in range(picker.combo.count())]
    picker.combo.setCurrentIndex(index)
    picker.combo.activated.emit(index)


def test_a_saved_persona_is_picked_for_another_chat_and_survives_a_restart(
    qtbot, tmp_path, monkeypatch
):
    engine = FakeEngine(replies=["Arr.", "Bonjour.", "Aye."])
    window = make_window(qtbot, tmp_path, engine)
    picker = window.persona_picker
    window.system_prompt.setText("You are a pirate. Answer in one line.")
    assert picker.combo.currentText() == "(custom prompt)"
    monkeypatch.setattr(QInputDialog, "getText", lambda *a, **k: ("Pirate", True))
    picker.save_button.click()
    assert picker.combo.currentText() == "Pirate" and picker.delete_button.isEnabled()
    send(qtbot, window, "Hello")

    window.new_chat()
    assert window.system_prompt.text() == "" and picker.combo.currentText() == "(no persona)"
    choose(window, "Pirate")
    assert window.system_prompt.text() == "You are a pirate. Answer in one line."
    send(qtbot, window, "Who are you?")
    assert engine.requests[-1].messages[0] == {
        "role": "system",
        "content": "You are a pirate. Answer in one line.",
    }
    second_chat = window.session.conversation_id
    close_window(window)

    window = make_window(qtbot, tmp_path, FakeEngine())
    window.sidebar.tree.setCurrentItem(window.sidebar.chat_items()[0])
    assert window.session.conversation_id == second_chat
    assert window.persona_picker.combo.currentText() == "Pirate"
    window.persona_picker.delete_button.click()
    assert window.persona_picker.combo.findText("Pirate") < 0
    # The chat keeps its prompt; it is now just a custom one.
    assert window.store.conversation(second_chat).system_prompt.startswith("You are a pirate.")
    assert window.persona_picker.combo.currentText() == "(custom prompt)"
    choose(window, "(no persona)")
    assert window.store.conversation(second_chat).system_prompt == ""
    close_window(window)
    assert SettingsFile(tmp_path / "settings.json").load().personas == {}


def test_an_empty_system_prompt_is_not_saved_as_a_persona(qtbot, tmp_path, monkeypatch):
    window = make_window(qtbot, tmp_path, FakeEngine())
    monkeypatch.setattr(QInputDialog, "getText", lambda *a, **k: ("Nobody", True))
    window.persona_picker.save_button.click()
    assert window.settings.personas == {} and "system prompt first" in window.state_label.text()
    close_window(window)


def test_broken_personas_in_the_settings_file_are_dropped_not_fatal(tmp_path):
    path = tmp_path / "settings.json"
    path.write_text(json.dumps({"personas": ["not", "a", "mapping"], "theme": "dark"}))
    settings = SettingsFile(path).load()
    assert settings.personas == {} and settings.theme == "dark"
    path.write_text(json.dumps({"personas": {"ok": "Be kind.", "": "x", "n": 5, " pad ": "y"}}))
    assert SettingsFile(path).load().personas == {"ok": "Be kind.", "pad": "y"}
