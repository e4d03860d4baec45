"""PendingMessages: the messages queued under the chat while a reply streams (app/features/
message_queue.py owns the queue; this widget only shows it and reports what the user did).

Each row: the message (up to three lines), Edit (in place, Save / Cancel), move up, move down,
Remove. Above the rows, one line says when they will be sent, or why they wait, with "Send now"
when they wait.
"""

from __future__ import annotations

from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import (
    QFrame,
    QHBoxLayout,
    QLabel,
    QPlainTextEdit,
    QPushButton,
    QVBoxLayout,
    QWidget,
)

SHOWN_CHARS = 300  # of a long message, the row shows its start (the whole text is in the tooltip)


class PendingRow(QFrame):
    """One queued message."""

    def __init__(self, owner: PendingMessages, index: int, text: str, count: int):
        super().__init__()
        self.setObjectName("pending_row")
        self.index, self.text = index, text
        self._owner = owner
        layout = QHBoxLayout(self)
        layout.setContentsMargins(4, 2, 4, 2)
        self.label = QLabel(_shown(text))
        self.label.setObjectName("pending_text")
        self.label.setWordWrap(True)
        self.label.setTextFormat(Qt.TextFormat.PlainText)
        self.label.setToolTip(text if len(text) <= 4000 else text[:4000] + "…")
        self.editor = QPlainTextEdit(text)
        self.editor.setObjectName("pending_editor")
        self.editor.setFixedHeight(64)
        self.editor.setVisible(False)
        layout.addWidget(self.label, 1)
        layout.addWidget(self.editor, 1)
        self.edit_button = self._button("Edit", "Change this message before it is sent")
        self.edit_button.clicked.connect(self._toggle_edit)
        self.cancel_edit = self._button("Cancel", "Keep the message as it was")
        self.cancel_edit.clicked.connect(self._end_edit)
        self.cancel_edit.setVisible(False)
        self.up_button = self._button("↑", "Send this message earlier")
        self.up_button.setEnabled(index > 0)
        self.up_button.clicked.connect(lambda: owner.moveRequested.emit(self.index, -1))
        self.down_button = self._button("↓", "Send this message later")
        self.down_button.setEnabled(index < count - 1)
        self.down_button.clicked.connect(lambda: owner.moveRequested.emit(self.index, 1))
        for arrow in (self.up_button, self.down_button):  # one character: no wider than needed
            arrow.setMaximumWidth(arrow.fontMetrics().horizontalAdvance("↑") * 3 + 16)
        self.remove_button = self._button("Remove", "Do not send this message")
        self.remove_button.clicked.connect(lambda: owner.removeRequested.emit(self.index))
        for button in (
            self.edit_button,
            self.cancel_edit,
            self.up_button,
            self.down_button,
            self.remove_button,
        ):
            layout.addWidget(button)

    def _button(self, text: str, tip: str) -> QPushButton:
        button = QPushButton(text)
        button.setToolTip(tip)
        button.setAutoDefault(False)
        return button

    @property
    def editing(self) -> bool:
        return not self.editor.isHidden()

    def _toggle_edit(self) -> None:
        if not self.editing:
            self.editor.setPlainText(self.text)
            self._set_editing(True)
            self.editor.setFocus()
            return
        self._owner.editRequested.emit(self.index, self.editor.toPlainText())

    def _end_edit(self) -> None:
        self._set_editing(False)

    def _set_editing(self, on: bool) -> None:
        self.label.setVisible(not on)
        self.editor.setVisible(on)
        self.cancel_edit.setVisible(on)
        self.edit_button.setText("Save" if on else "Edit")
        self.edit_button.setToolTip(
            "Keep this text for the message" if on else "Change this message before it is sent"
        )


class PendingMessages(QFrame):
    editRequested = Signal(int, str)  # index, new text
    removeRequested = Signal(int)
    moveRequested = Signal(int, int)  # index, -1 (earlier) or +1 (later)
    sendNowRequested = Signal()

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        self.setObjectName("pending_messages")
        self.setFrameShape(QFrame.Shape.StyledPanel)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(6, 4, 6, 4)
        layout.setSpacing(2)
        header = QHBoxLayout()
        self.status = QLabel()
        self.status.setObjectName("pending_status")
        self.status.setWordWrap(True)
        self.send_now = QPushButton("Send now")
        self.send_now.setObjectName("pending_send_now")
        self.send_now.setToolTip("Send the first queued message now")
        self.send_now.setAutoDefault(False)
        self.send_now.clicked.connect(self.sendNowRequested)
        header.addWidget(self.status, 1)
        header.addWidget(self.send_now)
        layout.addLayout(header)
        self._rows_box = QVBoxLayout()
        self._rows_box.setSpacing(2)
        layout.addLayout(self._rows_box)
        self.rows: list[PendingRow] = []
        self.setVisible(False)

    def show_queue(self, texts: list[str], waiting_because: str | None) -> None:
        """The open chat's queue; `waiting_because`: why it is not sent when the reply ends (a
        Stop, an error, a restart), None while it will be."""
        for row in self.rows:
            self._rows_box.removeWidget(row)
            row.deleteLater()
        self.rows = [PendingRow(self, i, text, len(texts)) for i, text in enumerate(texts)]
        for row in self.rows:
            self._rows_box.addWidget(row)
        n = len(texts)
        noun = "message" if n == 1 else "messages"
        if waiting_because:
            self.status.setText(f"{n} queued {noun} waiting: {waiting_because}")
        else:
            self.status.setText(f"{n} queued {noun} — sent in order when the reply finishes")
        self.send_now.setVisible(bool(waiting_because))
        self.setVisible(n > 0)


def _shown(text: str) -> str:
    lines = text.strip().splitlines() or [""]
    shown = "\n".join(lines[:3])
    if len(lines) > 3 or len(shown) > SHOWN_CHARS:
        shown = shown[:SHOWN_CHARS].rstrip() + "…"
    return shown
