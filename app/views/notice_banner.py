"""A banner above the chat for things the user must know but that must not block the window:
recovered data, a read-only data directory, a full disk. Non-modal, so tests never hang on it."""

from __future__ import annotations

from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import QFrame, QHBoxLayout, QLabel, QToolButton, QWidget

KIND_COLORS = {"warning": "#fff4d6", "error": "#fde2e1", "info": "#e4f0fb"}


class NoticeBanner(QFrame):
    dismissed = Signal(str)  # key of the notice

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        self.setObjectName("notice_banner")
        self.setFrameShape(QFrame.StyledPanel)
        layout = QHBoxLayout(self)
        layout.setContentsMargins(8, 4, 4, 4)
        self.label = QLabel()
        self.label.setWordWrap(True)
        self.label.setTextInteractionFlags(Qt.TextSelectableByMouse)  # paths can be copied
        self.close_button = QToolButton()
        self.close_button.setText("✕")
        self.close_button.setToolTip("Hide this message")
        self.close_button.setAutoRaise(True)
        self.close_button.clicked.connect(self._dismiss)
        layout.addWidget(self.label, 1)
        layout.addWidget(self.close_button)
        self._notices: dict[str, tuple[str, str]] = {}  # key -> (text, kind), in arrival order
        self.setVisible(False)

    @property
    def text(self) -> str:
        return self.label.text()

    def keys(self) -> list[str]:
        return list(self._notices)

    def show_notice(self, key: str, text: str, kind: str = "warning") -> None:
        """Show `text` under `key`; a later notice with the same key replaces it."""
        self._notices[key] = (text, kind)
        self._refresh()

    def clear_notice(self, key: str) -> None:
        if self._notices.pop(key, None) is not None:
            self._refresh()

    def _dismiss(self) -> None:
        for key in list(self._notices):
            self._notices.pop(key)
            self.dismissed.emit(key)
        self._refresh()

    def _refresh(self) -> None:
        if not self._notices:
            self.label.setText("")
            self.setVisible(False)
            return
        texts = [text for text, _kind in self._notices.values()]
        kinds = {kind for _text, kind in self._notices.values()}
        kind = "error" if "error" in kinds else "warning" if "warning" in kinds else "info"
        self.label.setText("\n\n".join(texts))
        self.setStyleSheet(f"#notice_banner {{ background: {KIND_COLORS[kind]}; color: #222; }}")
        self.setVisible(True)
