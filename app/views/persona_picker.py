"""Saved system prompts ("personas"): pick one for the open chat, save the chat's system prompt
as a new one, delete one. The chat keeps its own copy of the prompt (store), so editing or
deleting a persona never changes chats that already use it."""

from __future__ import annotations

from PySide6.QtCore import Signal
from PySide6.QtWidgets import QComboBox, QHBoxLayout, QToolButton, QWidget

NO_PERSONA = "(no persona)"
CUSTOM = "(custom prompt)"


class PersonaPicker(QWidget):
    personaChosen = Signal(str)  # name
    saveRequested = Signal()
    deleteRequested = Signal(str)  # name

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        layout = QHBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        self.combo = QComboBox()
        self.combo.setToolTip("Persona: a saved system prompt to use in this chat")
        # As wide as 10 characters whatever the names (the list shows them whole): the system
        # prompt beside it is what needs the room, and a long name must not widen the window.
        self.combo.setMinimumContentsLength(10)
        self.combo.setSizeAdjustPolicy(QComboBox.AdjustToMinimumContentsLengthWithIcon)
        self.combo.activated.connect(self._on_activated)
        self.save_button = QToolButton()
        self.save_button.setText("Save…")
        self.save_button.setToolTip("Save this chat's system prompt as a persona")
        self.save_button.clicked.connect(self.saveRequested)
        self.delete_button = QToolButton()
        self.delete_button.setText("✕")
        self.delete_button.setToolTip("Delete this persona (chats using it keep their prompt)")
        self.delete_button.clicked.connect(
            lambda: self.deleteRequested.emit(self.combo.currentData() or "")
        )
        layout.addWidget(self.combo)
        layout.addWidget(self.save_button)
        layout.addWidget(self.delete_button)
        self.personas: dict[str, str] = {}

    def set_personas(self, personas: dict[str, str], system_prompt: str) -> None:
        """List the personas and select the one this chat's system prompt is (if any)."""
        self.personas = dict(personas)
        self.combo.blockSignals(True)
        self.combo.clear()
        self.combo.addItem(NO_PERSONA, "")
        for name in sorted(self.personas, key=str.casefold):
            self.combo.addItem(name, name)
        self.show_prompt(system_prompt)
        self.combo.blockSignals(False)

    def show_prompt(self, system_prompt: str) -> None:
        """Select the persona whose prompt the chat has; "(custom prompt)" for any other text."""
        match = next((n for n, p in self.personas.items() if p == system_prompt.strip()), None)
        custom = self.combo.findText(CUSTOM)
        if match is None and system_prompt.strip():
            if custom < 0:
                self.combo.addItem(CUSTOM, "")
            self.combo.setCurrentIndex(self.combo.findText(CUSTOM))
        else:
            if custom >= 0:
                self.combo.removeItem(custom)
            self.combo.setCurrentIndex(self.combo.findData(match) if match else 0)
        self.delete_button.setEnabled(match is not None)

    @property
    def current(self) -> str:
        return self.combo.currentData() or ""

    def _on_activated(self, index: int) -> None:
        text = self.combo.itemText(index)
        if text == CUSTOM:
            return
        self.personaChosen.emit(self.combo.itemData(index) or "")
