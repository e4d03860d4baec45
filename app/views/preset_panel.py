"""Sampling preset: every value resolved for the loaded model with where it came from. Values are
edited in place; the engine validates each edit and a refusal shows the engine's message."""

from __future__ import annotations

from PySide6.QtCore import Qt, Signal
from PySide6.QtGui import QBrush, QColor
from PySide6.QtWidgets import (
    QApplication,
    QHeaderView,
    QLabel,
    QTableWidget,
    QTableWidgetItem,
    QVBoxLayout,
    QWidget,
)

from app.preset_state import format_value
from app.theme import text_color
from app.views.flow_layout import FlowLayout, WrappingButton
from engine.types import ResolvedPreset

SOURCE_COLORS = {
    "override": "#c05a00",
    "saved preset": "#2a7ab8",
    "implied by your sampling values": "#c05a00",
}
# Short labels so the value column keeps its room; the tooltip says it in full.
SOURCE_LABELS = {
    "generation_config.json": "gen. config",
    "gguf metadata": "GGUF",
    "override": "you (unsaved)",
    "saved preset": "your preset",
    "LocalChat chat defaults": "chat defaults",
    "implied by your sampling values": "implied",
    "default": "default",
}
SOURCE_TIPS = {
    "generation_config.json": "From the checkpoint's generation_config.json beside the model file",
    "gguf metadata": "From the model file's general.sampling.* metadata",
    "override": "Changed by you in this session (not saved)",
    "saved preset": "From your saved preset for this model",
    "LocalChat chat defaults": (
        "LocalChat chat defaults: the model states no sampling values, so chat samples with "
        "temperature 0.7, top_p 0.9, min_p 0.05 instead of greedy decoding (which loops)"
    ),
    "implied by your sampling values": "Implied by a sampling value you set (see below)",
    "default": "The engine's built-in default (no other source sets it)",
}


class PresetPanel(QWidget):
    valueEdited = Signal(str, str)  # field, text as typed
    saveRequested = Signal()
    resetRequested = Signal()

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(4, 4, 4, 4)
        self.hint = QLabel(
            "Values used for the next reply. Double-click a value to change it; "
            "“Source” says where it comes from (hover for details)."
        )
        self.hint.setWordWrap(True)
        self.table = QTableWidget(0, 3)
        self.table.setHorizontalHeaderLabels(["Setting", "Value", "Source"])
        header = self.table.horizontalHeader()
        header.setSectionResizeMode(0, QHeaderView.ResizeToContents)
        header.setSectionResizeMode(1, QHeaderView.Stretch)
        header.setSectionResizeMode(2, QHeaderView.ResizeToContents)
        header.setMinimumSectionSize(60)
        self.table.setHorizontalScrollBarPolicy(Qt.ScrollBarAlwaysOff)
        self.table.setWordWrap(False)
        self.table.verticalHeader().setVisible(False)
        self.table.itemChanged.connect(self._on_item_changed)
        self.error_label = QLabel()
        self.error_label.setObjectName("preset_error")
        self.error_label.setWordWrap(True)
        self.error_label.setStyleSheet(f"color: {text_color(QApplication.palette(), 'bad')};")
        self.error_label.setVisible(False)
        # Why a value was implied rather than taken from a source (e.g. do_sample turned on by
        # your temperature): said in words under the table, not only in a tooltip.
        self.reasons_label = QLabel()
        self.reasons_label.setObjectName("preset_reasons")
        self.reasons_label.setWordWrap(True)
        self.reasons_label.setVisible(False)
        # on two lines, and their words wrapped, when the right panel is narrow (16 pt)
        buttons = FlowLayout()
        self.save_button = WrappingButton("Save preset")
        self.save_button.setToolTip(
            "Save as this model's preset: use these values every time this model is loaded"
        )
        self.save_button.clicked.connect(self.saveRequested)
        self.reset_button = WrappingButton("Reset to checkpoint")
        self.reset_button.setToolTip(
            "Forget your changes and the saved preset; use the model's own values"
        )
        self.reset_button.clicked.connect(self.resetRequested)
        buttons.addWidget(self.save_button)
        buttons.addWidget(self.reset_button)
        layout.addWidget(self.hint)
        layout.addWidget(self.table, 1)
        layout.addWidget(self.reasons_label)
        layout.addWidget(self.error_label)
        layout.addLayout(buttons)
        self.view: ResolvedPreset | None = None
        self._filling = False
        self.setEnabled(False)

    def show_preset(self, view: ResolvedPreset) -> None:
        self.view = view
        self._filling = True
        self.table.setRowCount(len(view.values))
        for row, (name, value) in enumerate(view.values.items()):
            name_item = QTableWidgetItem(name)
            name_item.setFlags(Qt.ItemIsEnabled)
            value_item = QTableWidgetItem(format_value(value))
            value_item.setData(Qt.UserRole, name)
            value_item.setToolTip(f"{name} = {format_value(value)!r} — double-click to edit")
            source = view.sources.get(name, "default")
            source_item = QTableWidgetItem(SOURCE_LABELS.get(source, source))
            source_item.setToolTip(view.reasons.get(name) or SOURCE_TIPS.get(source, source))
            source_item.setFlags(Qt.ItemIsEnabled)
            if source in SOURCE_COLORS:
                source_item.setForeground(QBrush(QColor(SOURCE_COLORS[source])))
            self.table.setItem(row, 0, name_item)
            self.table.setItem(row, 1, value_item)
            self.table.setItem(row, 2, source_item)
        self._filling = False
        reasons = "\n".join(view.reasons.values())  # each names its field
        self.reasons_label.setText(reasons)
        self.reasons_label.setVisible(bool(reasons))
        self.setEnabled(True)

    def show_error(self, message: str, prefix: str = "Refused: ") -> None:
        self.error_label.setText(prefix + message)
        self.error_label.setVisible(True)
        if self.view is not None:
            self.show_preset(self.view)  # put the accepted value back in the cell

    def clear_error(self) -> None:
        self.error_label.setVisible(False)
        self.error_label.clear()

    def row_of(self, field: str) -> int:
        for row in range(self.table.rowCount()):
            if self.table.item(row, 0).text() == field:
                return row
        raise KeyError(field)

    def value_text(self, field: str) -> str:
        return self.table.item(self.row_of(field), 1).text()

    def source_text(self, field: str) -> str:
        """The engine's source name (the cell shows a short label for it)."""
        return self.view.sources.get(field, "default")

    def source_label(self, field: str) -> str:
        return self.table.item(self.row_of(field), 2).text()

    def _on_item_changed(self, item: QTableWidgetItem) -> None:
        if self._filling or item.column() != 1:
            return
        self.valueEdited.emit(item.data(Qt.UserRole), item.text())
