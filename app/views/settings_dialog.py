"""Settings: threads, context size, KV cache type, theme, font size, whether fetch_url may reach
private addresses, and the way to Connections (remote servers, app/views/connections_dialog.py)."""

from __future__ import annotations

import os
from dataclasses import replace

from PySide6.QtWidgets import (
    QCheckBox,
    QComboBox,
    QDialog,
    QDialogButtonBox,
    QFormLayout,
    QLabel,
    QPushButton,
    QSpinBox,
    QWidget,
)

from app.settings import CONTEXT_SIZE_RANGE, FONT_SIZE_RANGE, LONG_CHAT_MODES, THEMES, Settings
from engine.types import KV_CACHE_TYPES, KvCacheType

# What each KV cache type is called in the dialog (every KV_CACHE_TYPES member has one).
KV_CACHE_LABELS = {
    KvCacheType.F16: "16-bit (f16, exact)",
    KvCacheType.Q8_0: "8-bit (q8_0, half the memory)",
}

# "When a chat is too long" (engine/compaction.py LONG_CHAT_MODES)
LONG_CHAT_LABELS = {
    "drop_oldest": "Drop the oldest turns",
    "offer": "Offer a summary",
    "auto": "Summarise automatically",
}

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
        self.kv_cache = QComboBox()
        for cache_type in KV_CACHE_TYPES:
            self.kv_cache.addItem(KV_CACHE_LABELS[KvCacheType(cache_type)], cache_type)
        self.kv_cache.setCurrentIndex(KV_CACHE_TYPES.index(settings.kv_cache_type))
        self.kv_cache.setToolTip(
            "How the model's memory of the conversation is stored: 8-bit takes about half "
            "the RAM of 16-bit, with a small change in the model's output"
        )
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
        form.addRow("KV cache", self.kv_cache)
        note = QLabel("Threads, context size and KV cache apply the next time a model loads.")
        note.setWordWrap(True)
        form.addRow(note)
        form.addRow("Theme", self.theme)
        form.addRow("Font size", self.font_size)
        self.long_chat = QComboBox()
        self.long_chat.setObjectName("long_chat")
        for mode in LONG_CHAT_MODES:
            self.long_chat.addItem(LONG_CHAT_LABELS[mode], mode)
        self.long_chat.setCurrentIndex(LONG_CHAT_MODES.index(settings.long_chat))
        self.long_chat.setToolTip(
            "Near the model's context limit: leave the oldest turns out of the prompt, or have "
            "the model summarise them (the messages stay in the chat and can be restored)"
        )
        form.addRow("When a chat is too long", self.long_chat)
        connections = QPushButton("Connections…")
        connections.setObjectName("open_connections")
        connections.setToolTip("OpenAI-compatible servers whose models you can chat with")
        connections.clicked.connect(lambda: self.done(OPEN_CONNECTIONS))
        form.addRow("Remote servers", connections)
        self.fetch_private = QCheckBox("Let fetch_url reach local and private network addresses")
        self.fetch_private.setObjectName("fetch_allow_private")
        self.fetch_private.setToolTip(
            "Off: the fetch_url tool refuses this computer (localhost), your local network "
            "(192.168.x.x, 10.x.x.x), link-local and multicast addresses, so a model cannot "
            "read your router's pages or a cloud metadata service"
        )
        self.fetch_private.setChecked(settings.fetch_allow_private)
        form.addRow("Web tool", self.fetch_private)
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
            kv_cache_type=self.kv_cache.currentData(),
            theme=self.theme.currentData(),
            font_size=self.font_size.value(),
            fetch_allow_private=self.fetch_private.isChecked(),
            long_chat=self.long_chat.currentData(),
        )
