"""Model bar: which model is loaded, open another (dialog, recent list, or drop a .gguf on the
window), and load progress including the first-run kernel compile."""

from __future__ import annotations

from pathlib import Path

from PySide6.QtCore import Signal
from PySide6.QtWidgets import (
    QFileDialog,
    QHBoxLayout,
    QLabel,
    QMenu,
    QProgressBar,
    QPushButton,
    QToolButton,
    QWidget,
)


class ModelBar(QWidget):
    openRequested = Signal(str)  # path
    settingsRequested = Signal()

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        layout = QHBoxLayout(self)
        layout.setContentsMargins(6, 4, 6, 4)
        self.open_button = QPushButton("Open model…")
        self.open_button.setToolTip("Open a GGUF model file (or drop one on the window)")
        self.open_button.clicked.connect(self.ask_open)
        self.recent_button = QToolButton()
        self.recent_button.setText("Recent")
        self.recent_button.setPopupMode(QToolButton.InstantPopup)
        self.recent_menu = QMenu(self)
        self.recent_button.setMenu(self.recent_menu)
        self.model_label = QLabel("No model loaded")
        self.model_label.setObjectName("model_label")
        self.stage_label = QLabel()
        self.progress = QProgressBar()
        self.progress.setRange(0, 1000)
        self.progress.setMaximumWidth(220)
        self.progress.setTextVisible(False)
        self.progress.setVisible(False)
        self.settings_button = QPushButton("Settings")
        self.settings_button.clicked.connect(self.settingsRequested)
        layout.addWidget(self.open_button)
        layout.addWidget(self.recent_button)
        layout.addWidget(self.model_label, 1)
        layout.addWidget(self.stage_label)
        layout.addWidget(self.progress)
        layout.addWidget(self.settings_button)

    def set_recent(self, paths: list[str]) -> None:
        self.recent_menu.clear()
        for path in paths:
            action = self.recent_menu.addAction(Path(path).name)
            action.setToolTip(path)
            action.triggered.connect(lambda _=False, p=path: self.openRequested.emit(p))
        self.recent_button.setEnabled(bool(paths))

    def ask_open(self) -> None:
        path, _ = QFileDialog.getOpenFileName(
            self, "Open a GGUF model", "", "GGUF models (*.gguf);;All files (*)"
        )
        if path:
            self.openRequested.emit(path)

    def show_loading(self, path: str) -> None:
        self.model_label.setText(f"Loading <b>{Path(path).name}</b>…")
        self.stage_label.setText("starting")
        self.progress.setValue(0)
        self.progress.setVisible(True)

    def show_progress(self, stage: str, fraction: float) -> None:
        self.stage_label.setText(stage)
        self.progress.setVisible(True)
        self.progress.setValue(int(max(0.0, min(1.0, fraction)) * 1000))

    def show_loaded(self, name: str, detail: str) -> None:
        self.model_label.setText(f"<b>{name}</b> <span style='color:gray'>{detail}</span>")
        self.stage_label.setText("")
        self.progress.setVisible(False)

    def show_failed(self, previous: str | None) -> None:
        self.model_label.setText(previous or "No model loaded — open a GGUF file")
        self.stage_label.setText("")
        self.progress.setVisible(False)
