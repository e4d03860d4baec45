"""A one-line label that shortens its text with "…" when it has less room than the text needs,
instead of demanding the room: a status line must never make the window wider."""

from __future__ import annotations

from PySide6.QtCore import QSize, Qt
from PySide6.QtGui import QPainter
from PySide6.QtWidgets import QLabel, QWidget

MIN_CHARS = 4  # it keeps room for about this many characters, then elides


class ElidedLabel(QLabel):
    """A plain-text QLabel: text() is the whole text; only the painting is shortened."""

    def __init__(self, text: str = "", parent: QWidget | None = None):
        super().__init__(text, parent)
        self.setTextFormat(Qt.PlainText)

    def minimumSizeHint(self) -> QSize:
        shown = self.text()[:MIN_CHARS] + "…" if self.text() else ""
        width = self.fontMetrics().horizontalAdvance(shown)
        return QSize(width, super().minimumSizeHint().height())

    def shown_text(self) -> str:
        """What is painted: the text, elided to the width the label has."""
        room = self.contentsRect().width()
        return self.fontMetrics().elidedText(self.text(), Qt.ElideRight, room)

    def paintEvent(self, event):
        painter = QPainter(self)
        self.style().drawItemText(
            painter,
            self.contentsRect(),
            int(self.alignment()),
            self.palette(),
            self.isEnabled(),
            self.shown_text(),
            self.foregroundRole(),
        )


def let_shrink(widget: QWidget, chars: int) -> None:
    """Let a widget (a combo box) be squeezed down to about `chars` characters when room is
    short, while it still asks for its whole contents when there is room."""
    widget.setMinimumWidth(widget.fontMetrics().averageCharWidth() * chars + 32)
