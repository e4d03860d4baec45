"""Settings: threads, context size, theme, font size, and the way to Connections (remote
servers, app/views/connections_dialog.py)."""

from __future__ import annotations

import os
from dataclasses import replace

from PySide6.QtWidgets import (
    QComboBox,
    QDialog,
    QDialogButtonBox,
    QFormLayout,
    QLabel,
    QPushButton,
    QSpinBox,
    QWidget,
)

from app.settings import CONTEXT_SIZE_RANGE, FONT_SIZE_RANGE, THEMES, Settings

# exec() result: the settings were accepted and the user asked for Settings > Connections
OPEN_CONNECTIONS = 2


class SettingsDialog(QDialog):
    def __init__(self, settings: Settings, parent: QWidget | None = None):
        super().__init__(parent)
        self.setWindowTitle("Settings")
        form = QFormLayout(self)
        self.threads = QSpinBox()
        self.threads.setRange(0, os.cpu_count() or 1)
        self.threads.setSpecialValueText("automatic (all cores)")
        self.threads.setValue(settings.threads)
        self.context = QSpinBox()
        self.context.setRange(*CONTEXT_SIZE_RANGE)
        self.context.setSingleStep(512)
        self.context.setSuffix(" tokens")
        self.context.setValue(settings.context_size)
        self.theme = QComboBox()
        for theme in THEMES:
            self.theme.addItem(theme.capitalize(), theme)
        self.theme.setCurrentIndex(THEMES.index(settings.theme))
        self.font_size = QSpinBox()
        self.font_size.setRange(*FONT_SIZE_RANGE)
        self.font_size.setSuffix(" pt")
        self.font_size.setValue(settings.font_size)
        form.addRow("Threads", self.threads)
        form.addRow("Context size", self.context)
        note = QLabel("Threads and context size apply the next time a model loads.")
        note.setWordWrap(True)
        form.addRow(note)
        form.addRow("Theme", self.theme)
        form.addRow("Font size", self.font_size)
        connections = QPushButton("Connections…")
        connections.setObjectName("open_connections")
        connections.setToolTip("OpenAI-compatible servers whose models you can chat with")
        connections.clicked.connect(lambda: self.done(OPEN_CONNECTIONS))
        form.addRow("Remote servers", connections)
        buttons = QDialogButtonBox(QDialogButtonBox.Ok | QDialogButtonBox.Cancel)
        buttons.accepted.connect(self.accept)
        buttons.rejected.connect(self.reject)
        form.addRow(buttons)
        self._base = settings

    def result_settings(self) -> Settings:
        return replace(
            self._base,
            threads=self.threads.value(),
            context_size=self.context.value(),
            theme=self.theme.currentData(),
            font_size=self.font_size.value(),
        )
