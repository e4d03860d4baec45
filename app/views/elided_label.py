"""Labels that never make the window wider: ElidedLabel shortens its one line with "…" when it
has less room than its text, WrappingLabel wraps but only when short of room; let_shrink lets a
combo box be squeezed."""

from __future__ import annotations

from PySide6 import QtGui
from PySide6.QtCore import QSize, Qt
from PySide6.QtGui import QPainter, QTextDocument
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


class WrappingLabel(QLabel):
    """A label that wraps only when it must: it asks for its text's whole line (a wrapping
    QLabel asks for a narrow block, so a row gives it a third of the room and it wraps beside
    empty space) and still shrinks to its longest word."""

    def __init__(self, text: str = "", parent: QWidget | None = None):
        super().__init__(text, parent)
        self.setWordWrap(True)

    def sizeHint(self) -> QSize:
        document = QTextDocument()
        document.setDefaultFont(self.font())
        if self.textFormat() == Qt.PlainText or not QtGui.Qt.mightBeRichText(self.text()):
            document.setPlainText(self.text())
        else:
            document.setHtml(self.text())
        document.setDocumentMargin(0)
        margins = self.contentsMargins()
        width = int(document.idealWidth()) + 2 * self.margin() + margins.left() + margins.right()
        width += 2  # rounding in the document's layout vs QLabel's
        return QSize(width, self.heightForWidth(width))
