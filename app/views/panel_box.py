"""A group box for the narrow right panel: its title is elided to the box's width instead of
setting the box's minimum width (at 16 pt "Usage — selected reply" and "Time to first token"
were each wider than the whole panel at 1280 px, which then scrolled sideways). title() is the
whole title; the elided part shows in the tooltip."""

from __future__ import annotations

from PySide6.QtCore import QSize, Qt
from PySide6.QtGui import QFont, QFontMetrics
from PySide6.QtWidgets import QGroupBox, QWidget


class ElidingGroupBox(QGroupBox):
    def __init__(self, title: str, parent: QWidget | None = None):
        self._title = title
        super().__init__(title, parent)

    def title(self) -> str:
        return self._title

    def setTitle(self, title: str) -> None:
        self._title = title
        self._show_title()

    def _show_title(self) -> None:
        font = QFont(self.font())
        font.setBold(True)  # Fusion draws a group box title in bold
        room = self.width() - 2 * self.fontMetrics().averageCharWidth() - 16
        shown = QFontMetrics(font).elidedText(self._title, Qt.ElideRight, max(room, 0))
        if shown != super().title():
            super().setTitle(shown)
            self.setToolTip(self._title if shown != self._title else "")

    def minimumSizeHint(self) -> QSize:
        # QGroupBox asks for its whole title; this one elides it, so only its contents count.
        layout = self.layout()
        if layout is None:
            return super().minimumSizeHint()
        margins = self.contentsMargins()
        width = layout.minimumSize().width() + margins.left() + margins.right()
        return QSize(width, super().minimumSizeHint().height())

    def resizeEvent(self, event) -> None:
        super().resizeEvent(event)
        self._show_title()
