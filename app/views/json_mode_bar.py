"""JSON mode: off / any JSON object / a JSON schema, with a schema editor that validates first."""

from __future__ import annotations

from PySide6.QtCore import Signal
from PySide6.QtGui import QFont
from PySide6.QtWidgets import (
    QApplication,
    QComboBox,
    QDialog,
    QDialogButtonBox,
    QHBoxLayout,
    QLabel,
    QPlainTextEdit,
    QPushButton,
    QVBoxLayout,
    QWidget,
)

from app.schema_check import EXAMPLE_SCHEMA, check_schema
from app.theme import text_color
from app.views.elided_label import ElidedLabel, let_shrink
from engine.types import JsonMode

MODES = (
    (JsonMode.OFF, "Off"),
    (JsonMode.OBJECT, "Any JSON object"),
    (JsonMode.SCHEMA, "JSON schema…"),
)


class SchemaDialog(QDialog):
    def __init__(self, text: str, parent: QWidget | None = None):
        super().__init__(parent)
        self.setWindowTitle("JSON schema for replies")
        self.resize(520, 420)
        layout = QVBoxLayout(self)
        layout.addWidget(QLabel("Replies will be forced to match this JSON schema."))
        self.editor = QPlainTextEdit(text or EXAMPLE_SCHEMA)
        self.editor.setFont(QFont("monospace"))
        self.status = QLabel()
        self.status.setObjectName("schema_status")
        self.status.setWordWrap(True)
        self.buttons = QDialogButtonBox(QDialogButtonBox.Ok | QDialogButtonBox.Cancel)
        self.buttons.accepted.connect(self.accept)
        self.buttons.rejected.connect(self.reject)
        layout.addWidget(self.editor, 1)
        layout.addWidget(self.status)
        layout.addWidget(self.buttons)
        self.editor.textChanged.connect(self._validate)
        self.schema: dict | None = None
        self._validate()

    def _validate(self) -> None:
        self.schema, problem = check_schema(self.editor.toPlainText())
        self.status.setText("✔ valid schema" if problem is None else "✖ " + problem)
        meaning = "good" if problem is None else "bad"
        self.status.setStyleSheet(f"color: {text_color(QApplication.palette(), meaning)};")
        self.buttons.button(QDialogButtonBox.Ok).setEnabled(problem is None)


class JsonModeBar(QWidget):
    modeChanged = Signal(str, object)  # mode, schema (dict) or None

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        layout = QHBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.addWidget(QLabel("JSON mode:"))
        self.combo = QComboBox()
        for key, title in MODES:
            self.combo.addItem(title, key)
        self.combo.setToolTip("Force replies to be JSON (any object, or matching your schema)")
        let_shrink(self.combo, 6)
        self.edit_button = QPushButton("Edit schema")
        self.edit_button.setVisible(False)
        # The schema's fields, shortened with "…": choosing schema mode once widened the window.
        self.schema_label = ElidedLabel()
        layout.addWidget(self.combo)
        layout.addWidget(self.edit_button)
        layout.addWidget(self.schema_label, 1)
        self.schema_text = ""
        self.schema: dict | None = None
        self._previous_index = 0
        self.combo.currentIndexChanged.connect(self._on_mode)
        self.edit_button.clicked.connect(self.edit_schema)

    @property
    def mode(self) -> str:
        return self.combo.currentData()

    def _on_mode(self, index: int) -> None:
        mode = self.combo.itemData(index)
        if mode == JsonMode.SCHEMA and self.schema is None and not self.edit_schema():
            self.combo.blockSignals(True)
            self.combo.setCurrentIndex(self._previous_index)  # no valid schema: stay as before
            self.combo.blockSignals(False)
            return
        self._previous_index = index
        self.edit_button.setVisible(mode == JsonMode.SCHEMA)
        self._update_label()
        self.modeChanged.emit(mode, self.schema if mode == JsonMode.SCHEMA else None)

    def edit_schema(self) -> bool:
        dialog = SchemaDialog(self.schema_text, self)
        if dialog.exec() != QDialog.Accepted or dialog.schema is None:
            return False
        self.set_schema(dialog.editor.toPlainText(), dialog.schema)
        if self.mode == JsonMode.SCHEMA:
            self.modeChanged.emit(JsonMode.SCHEMA, self.schema)
        return True

    def set_schema(self, text: str, schema: dict) -> None:
        self.schema_text, self.schema = text, schema
        self._update_label()

    def _update_label(self) -> None:
        if self.mode == JsonMode.SCHEMA and self.schema:
            props = list((self.schema.get("properties") or {}).keys())
            self.schema_label.setText("fields: " + ", ".join(props[:5]) if props else "schema set")
        else:
            self.schema_label.setText("")
