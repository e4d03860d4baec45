"""A banner above the chat for things the user must know but that must not block the window:
recovered data, a read-only data directory, a full disk. Non-modal, so tests never hang on it.

Its colours come from app/theme.py for the theme in use (a pale banner in the light theme, a
dark tinted one in the dark theme), for the banner and its text together: a fixed pale
background under the dark theme's pale text was unreadable."""

from __future__ import annotations

from collections.abc import Callable

from PySide6.QtCore import QEvent, Qt, Signal
from PySide6.QtWidgets import QApplication, QFrame, QHBoxLayout, QLabel, QToolButton, QWidget

from app.theme import banner_colors


class NoticeBanner(QFrame):
    dismissed = Signal(str)  # key of the notice

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        self.setObjectName("notice_banner")
        self.setFrameShape(QFrame.StyledPanel)
        layout = QHBoxLayout(self)
        layout.setContentsMargins(8, 4, 4, 4)
        self.label = QLabel()
        self.label.setObjectName("notice_text")
        self.label.setWordWrap(True)
        self.label.setTextInteractionFlags(Qt.TextSelectableByMouse)  # paths can be copied
        self.close_button = QToolButton()
        self.close_button.setText("✕")
        self.close_button.setToolTip("Hide this message")
        self.close_button.setAutoRaise(True)
        self.close_button.clicked.connect(self._dismiss)
        # One notice may offer an action (e.g. "Use plain completion" for a base model): the
        # button runs the action of the latest notice that has one.
        self.action_button = QToolButton()
        self.action_button.setObjectName("notice_action")
        self.action_button.clicked.connect(self._run_action)
        self.action_button.setVisible(False)
        self._actions: dict[str, tuple[str, Callable[[], None]]] = {}  # key -> (label, action)
        self._action_key: str | None = None
        layout.addWidget(self.label, 1)
        layout.addWidget(self.action_button)
        layout.addWidget(self.close_button)
        self._notices: dict[str, tuple[str, str]] = {}  # key -> (text, kind), in arrival order
        self.kind = ""  # the kind the banner shows now: "error", "warning" or "info"
        self.setVisible(False)

    @property
    def text(self) -> str:
        return self.label.text()

    def keys(self) -> list[str]:
        return list(self._notices)

    def show_notice(
        self,
        key: str,
        text: str,
        kind: str = "warning",
        action: tuple[str, Callable[[], None]] | None = None,
    ) -> None:
        """Show `text` under `key`; a later notice with the same key replaces it (and its
        action: `action` is (button label, what the button does), None for no button)."""
        self._notices[key] = (text, kind)
        if action is None:
            self._actions.pop(key, None)
        else:
            self._actions[key] = action
        self._refresh()

    def clear_notice(self, key: str) -> None:
        self._actions.pop(key, None)
        if self._notices.pop(key, None) is not None:
            self._refresh()

    def _show_action(self) -> None:
        offered = [key for key in self._notices if key in self._actions]
        self._action_key = offered[-1] if offered else None
        if self._action_key is not None:
            self.action_button.setText(self._actions[self._action_key][0])
        self.action_button.setVisible(self._action_key is not None)

    def _run_action(self) -> None:
        if self._action_key is not None:
            self._actions[self._action_key][1]()

    def _dismiss(self) -> None:
        for key in list(self._notices):
            self._notices.pop(key)
            self._actions.pop(key, None)
            self.dismissed.emit(key)
        self._refresh()

    def changeEvent(self, event):
        super().changeEvent(event)
        # The theme changed (Settings): the colours follow it.
        if event.type() == QEvent.PaletteChange and self._notices:
            self._restyle()

    def _refresh(self) -> None:
        self._show_action()
        if not self._notices:
            self.label.setText("")
            self.kind = ""
            self.setVisible(False)
            return
        texts = [text for text, _kind in self._notices.values()]
        kinds = {kind for _text, kind in self._notices.values()}
        self.kind = "error" if "error" in kinds else "warning" if "warning" in kinds else "info"
        self.label.setText("\n\n".join(texts))
        self._restyle()
        self.setVisible(True)

    def _restyle(self) -> None:
        # The application's palette is the theme; the banner's own is changed by its style sheet.
        background, text, border = banner_colors(QApplication.palette(), self.kind)
        # The label and the close button are named too: a style sheet's colour does not pass
        # from a frame to its children, which kept the theme's own (pale) text colour.
        style = (
            f"#notice_banner {{ background: {background}; border: 1px solid {border}; }}"
            f"#notice_banner QLabel, #notice_banner QToolButton {{ color: {text}; }}"
        )
        if style != self.styleSheet():  # setting it changes the palette: no loop
            self.setStyleSheet(style)
