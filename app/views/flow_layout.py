"""A row of buttons that never makes its parent wider than it is: FlowLayout puts the items on
as many lines as the width needs (like words in a paragraph), and WrappingButton is a push
button whose label wraps when the button has less room than its text (the tool-approval row's
"Always for this tool in this chat" is wider than a narrow chat at 16 pt)."""

from __future__ import annotations

from PySide6.QtCore import QPoint, QRect, QSize, Qt
from PySide6.QtWidgets import (
    QHBoxLayout,
    QLayout,
    QLayoutItem,
    QPushButton,
    QSizePolicy,
    QStyle,
    QStyleOptionButton,
    QWidget,
)

from app.views.elided_label import WrappingLabel


class FlowLayout(QLayout):
    """Items left to right, a new line when the next one does not fit; an item wider than the
    whole width gets the whole width (and, if it can, wraps its own text)."""

    def __init__(self, parent: QWidget | None = None, spacing: int = 6):
        super().__init__(parent)
        self._items: list[QLayoutItem] = []
        self._spacing = spacing
        self.setContentsMargins(0, 0, 0, 0)

    def addItem(self, item: QLayoutItem) -> None:
        self._items.append(item)

    def count(self) -> int:
        return len(self._items)

    def itemAt(self, index: int) -> QLayoutItem | None:
        return self._items[index] if 0 <= index < len(self._items) else None

    def takeAt(self, index: int) -> QLayoutItem | None:
        return self._items.pop(index) if 0 <= index < len(self._items) else None

    def expandingDirections(self) -> Qt.Orientation:
        return Qt.Orientation(0)

    def hasHeightForWidth(self) -> bool:
        return True

    def heightForWidth(self, width: int) -> int:
        return self._arrange(QRect(0, 0, width, 0), move=False)

    def setGeometry(self, rect: QRect) -> None:
        super().setGeometry(rect)
        self._arrange(rect, move=True)

    def sizeHint(self) -> QSize:
        # everything on one line, when there is room for it
        visible = [item for item in self._items if not item.isEmpty()]
        width = sum(item.sizeHint().width() for item in visible)
        width += self._spacing * max(0, len(visible) - 1)
        height = max((item.sizeHint().height() for item in visible), default=0)
        margins = self.contentsMargins()
        return QSize(
            width + margins.left() + margins.right(), height + margins.top() + margins.bottom()
        )

    def minimumSize(self) -> QSize:
        # the widest single item at its own minimum: every other one goes on a line of its own
        size = QSize()
        for item in self._items:
            if not item.isEmpty():
                size = size.expandedTo(item.minimumSize())
        margins = self.contentsMargins()
        return size + QSize(margins.left() + margins.right(), margins.top() + margins.bottom())

    def _arrange(self, rect: QRect, move: bool) -> int:
        """Place (or only measure) the items in `rect`; returns the height they take."""
        margins = self.contentsMargins()
        area = rect.adjusted(margins.left(), margins.top(), -margins.right(), -margins.bottom())
        x, y, line_height = area.x(), area.y(), 0
        for item in self._items:
            if item.isEmpty():
                continue
            width = max(item.minimumSize().width(), min(item.sizeHint().width(), area.width()))
            if x > area.x() and x + width > area.right() + 1:  # no room left on this line
                x, y, line_height = area.x(), y + line_height + self._spacing, 0
            height = (
                item.heightForWidth(width) if item.hasHeightForWidth() else item.sizeHint().height()
            )
            height = max(height, item.minimumSize().height())
            if move:
                item.setGeometry(QRect(QPoint(x, y), QSize(width, height)))
            x += width + self._spacing
            line_height = max(line_height, height)
        return y + line_height - rect.y() + margins.bottom()


class WrappingButton(QPushButton):
    """A push button whose label wraps when the button is narrower than its text. The label is
    drawn by a WrappingLabel inside the button; the button's own text stays empty (it would be
    drawn as well), the words are its accessible name."""

    def __init__(self, text: str, parent: QWidget | None = None):
        super().__init__(parent)
        self.label = WrappingLabel(text)
        self.label.setAlignment(Qt.AlignCenter)
        self.label.setAttribute(Qt.WA_TransparentForMouseEvents)  # the click is the button's
        self.setAccessibleName(text)
        layout = QHBoxLayout(self)
        margin = self.style().pixelMetric(QStyle.PM_ButtonMargin)
        layout.setContentsMargins(margin, 2, margin, 2)
        layout.addWidget(self.label)
        policy = QSizePolicy(QSizePolicy.Preferred, QSizePolicy.Preferred)
        policy.setHeightForWidth(True)
        self.setSizePolicy(policy)

    def label_text(self) -> str:
        return self.label.text()

    def _base_height(self) -> int:
        """A one-line push button's height in this style and font."""
        option = QStyleOptionButton()
        self.initStyleOption(option)
        line = QSize(0, self.fontMetrics().height())
        return self.style().sizeFromContents(QStyle.CT_PushButton, option, line, self).height()

    def sizeHint(self) -> QSize:
        hint = self.layout().sizeHint()
        return QSize(hint.width(), max(hint.height(), self._base_height()))

    def minimumSizeHint(self) -> QSize:
        hint = self.layout().minimumSize()
        return QSize(hint.width(), max(hint.height(), self._base_height()))

    def hasHeightForWidth(self) -> bool:
        return True

    def heightForWidth(self, width: int) -> int:
        return max(self.layout().totalHeightForWidth(width), self._base_height())
