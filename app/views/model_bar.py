"""Model bar: which model is loaded, open another (dialog, recent list, or drop a .gguf on the
window), and load progress including the first-run kernel compile."""

from __future__ import annotations

from pathlib import Path

from PySide6.QtCore import Signal
from PySide6.QtGui import QAction
from PySide6.QtWidgets import (
    QHBoxLayout,
    QLabel,
    QMenu,
    QProgressBar,
    QPushButton,
    QToolButton,
    QWidget,
)

from app.views.file_dialogs import open_file

PANEL_GLYPHS = ("◧", "◨")  # the chats list (left) and the side panel (right)


class ModelBar(QWidget):
    openRequested = Signal(str)  # path; "remote://connection/model" for a server's model
    settingsRequested = Signal()
    connectionsRequested = Signal()  # Settings > Connections

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
        # The models of the user's OpenAI-compatible servers, beside the local files.
        self.remote_button = QToolButton()
        self.remote_button.setObjectName("remote_models_button")
        self.remote_button.setText("Remote")
        self.remote_button.setToolTip("Models on your OpenAI-compatible servers")
        self.remote_button.setPopupMode(QToolButton.InstantPopup)
        self.remote_menu = QMenu(self)
        self.remote_button.setMenu(self.remote_menu)
        self.set_remote_models([], {})
        self.model_label = QLabel("No model loaded")
        self.model_label.setObjectName("model_label")
        # Wraps, and a file name longer than the room is cut (the tooltip has it whole) rather
        # than widening the window past the screen with Settings off its edge.
        self.model_label.setWordWrap(True)
        self.model_label.setMinimumWidth(1)
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
        layout.addWidget(self.remote_button)
        layout.addWidget(self.model_label, 1)
        layout.addWidget(self.stage_label)
        layout.addWidget(self.progress)
        layout.addWidget(self.settings_button)

    def set_panel_actions(self, chats: QAction, side: QAction) -> None:
        """Small buttons at either end of the bar that show or hide the window's side panels
        (View menu actions: the buttons follow them and they follow the buttons)."""
        self.chats_toggle = self._panel_toggle(chats, PANEL_GLYPHS[0])
        self.side_toggle = self._panel_toggle(side, PANEL_GLYPHS[1])
        self.layout().insertWidget(0, self.chats_toggle)
        self.layout().addWidget(self.side_toggle)

    @staticmethod
    def _panel_toggle(action: QAction, glyph: str) -> QToolButton:
        button = QToolButton()
        button.setText(glyph)
        button.setToolTip(f"{action.toolTip()} ({action.shortcut().toString()})")
        button.setCheckable(True)
        button.setAutoRaise(True)
        button.setChecked(action.isChecked())
        button.toggled.connect(lambda on: on != action.isChecked() and action.trigger())
        action.toggled.connect(button.setChecked)
        return button

    def set_recent(self, paths: list[str]) -> None:
        self.recent_menu.clear()
        for path in paths:
            action = self.recent_menu.addAction(Path(path).name)
            action.setToolTip(path)
            action.triggered.connect(lambda _=False, p=path: self.openRequested.emit(p))
        self.recent_button.setEnabled(bool(paths))

    def set_remote_models(
        self, models: list[tuple[str, str, str]], problems: dict[str, str]
    ) -> None:
        """models: (path, model id, host) per remote model; problems: connection label ->
        why its models could not be listed."""
        self.remote_menu.clear()
        for path, model, host in models:
            action = self.remote_menu.addAction(f"{model}  —  remote · {host}")
            action.setToolTip(f"{model} on the server at {host}")
            action.setData(path)
            action.triggered.connect(lambda _=False, p=path: self.openRequested.emit(p))
        for label, problem in problems.items():
            action = self.remote_menu.addAction(f"{label}: not reachable")
            action.setToolTip(problem)
            action.setEnabled(False)
        if models or problems:
            self.remote_menu.addSeparator()
        manage = self.remote_menu.addAction("Connections…")
        manage.triggered.connect(self.connectionsRequested)

    def remote_paths(self) -> list[str]:
        return [a.data() for a in self.remote_menu.actions() if a.data()]

    def ask_open(self) -> None:
        path = open_file(self, "Open a GGUF model", "GGUF models (*.gguf);;All files (*)")
        if path:
            self.openRequested.emit(path)

    def show_loading(self, path: str) -> None:
        self.model_label.setText(f"Loading <b>{Path(path).name}</b>…")
        self.model_label.setToolTip(path)
        self.stage_label.setText("starting")
        self.progress.setValue(0)
        self.progress.setVisible(True)

    def show_progress(self, stage: str, fraction: float) -> None:
        self.stage_label.setText(stage)
        self.progress.setVisible(True)
        self.progress.setValue(int(max(0.0, min(1.0, fraction)) * 1000))

    def show_loaded(self, name: str, detail: str) -> None:
        self.model_label.setText(f"<b>{name}</b> <span style='color:gray'>{detail}</span>")
        self.model_label.setToolTip(f"{name} · {detail}")
        self.stage_label.setText("")
        self.progress.setVisible(False)

    def show_failed(self, previous: str | None) -> None:
        self.model_label.setText(previous or "No model loaded — open a GGUF file")
        self.stage_label.setText("")
        self.progress.setVisible(False)
