"""One tool call in the chat (a role "tool" message): the tool's name, its arguments pretty-printed,
how it was let run, the approval buttons while it waits (Allow once / Always for this tool in this
chat / Deny), and its result, collapsed until the user opens it. A call that repeats an earlier
one of the same turn says so: it was not run again and got that call's result (app/tool_runner.py)."""

from __future__ import annotations

import html
import json

from PySide6.QtCore import Qt, Signal
from PySide6.QtGui import QFontDatabase
from PySide6.QtWidgets import (
    QFrame,
    QHBoxLayout,
    QLabel,
    QPlainTextEdit,
    QToolButton,
    QVBoxLayout,
    QWidget,
)

from app.store import StoredMessage
from app.tool_runner import REPEATED
from app.views.elided_label import WrappingLabel
from app.views.flow_layout import FlowLayout, WrappingButton
from engine.types import MessageStatus, ToolApproval

APPROVAL_NOTES = {
    ToolApproval.AUTOMATIC: "built-in tool, ran without asking",
    ToolApproval.PENDING: "waiting for your approval",
    ToolApproval.ONCE: "allowed once",
    ToolApproval.ALWAYS: "allowed for this tool in this chat",
    ToolApproval.DENIED: "denied",
    ToolApproval.CANCELLED: "stopped",
    REPEATED: "repeated call",
}
ERROR_NAMES = {  # the named failures of app/tools/errors.py, as the user reads them
    "McpServerCrashed": "Server crashed",
    "McpTimeout": "Timed out",
    "McpErrorResult": "Tool error",
    "McpResultTooLarge": "Result too large",
    "McpConnectError": "Server not reachable",
    "ToolCancelled": "Stopped",
    "UnknownToolError": "Unknown tool",
    "ToolArgumentsError": "Bad arguments",
    "ToolError": "Tool failed",
}


def _mono_box(text: str) -> QPlainTextEdit:
    box = QPlainTextEdit(text)
    box.setReadOnly(True)
    font = QFontDatabase.systemFont(QFontDatabase.FixedFont)
    font.setPointSizeF(box.font().pointSizeF())  # the user's font size, not the system's
    box.setFont(font)
    box.setLineWrapMode(QPlainTextEdit.WidgetWidth)
    lines = max(1, min(12, text.count("\n") + 1))
    box.setFixedHeight(box.fontMetrics().lineSpacing() * lines + 14)
    return box


class ToolCallWidget(QFrame):
    approvalGiven = Signal(int, str)  # message id, ToolApproval.ONCE | ALWAYS | DENIED

    def __init__(self, message: StoredMessage, parent: QWidget | None = None):
        super().__init__(parent)
        self.setObjectName("message_tool")
        self.setProperty("role", "tool")
        self.setFrameShape(QFrame.StyledPanel)
        self.message = message
        tool = message.tool or {}
        layout = QVBoxLayout(self)
        layout.setContentsMargins(10, 6, 10, 6)
        layout.setSpacing(3)
        header = QHBoxLayout()
        where = (
            f" (MCP server {html.escape(str(tool['server']))})"
            if tool.get("server")
            else " (built-in)"
        )
        number = f" #{tool['number']}" if isinstance(tool.get("number"), int) else ""
        name = html.escape(str(tool.get("name", "?")))
        self.title = WrappingLabel(f"<b>Tool call{number}: {name}</b>{where} —")
        self.status_label = QLabel()
        self.status_label.setObjectName("tool_status")
        # Both wrap when short of room: a tool card, like every card, must fit the chat's width
        # (issue 31, defect 3).
        self.status_label.setWordWrap(True)
        header.addWidget(self.title)
        header.addWidget(self.status_label, 1)
        layout.addLayout(header)
        arguments = json.dumps(tool.get("arguments") or {}, indent=2, ensure_ascii=False)
        self.arguments_view = _mono_box(arguments)
        self.arguments_view.setObjectName("tool_arguments")
        layout.addWidget(self.arguments_view)

        # The buttons flow onto more lines, and a button's label wraps, when the chat is
        # narrower than the row: one line of them overflowed a narrow card at 16 pt.
        self.approval_row = QWidget()
        self.approval_row.setObjectName("approval_row")
        row = FlowLayout(self.approval_row)
        self.allow_once_button = WrappingButton("Allow once")
        self.allow_always_button = WrappingButton("Always for this tool in this chat")
        self.deny_button = WrappingButton("Deny")
        for button, decision in (
            (self.allow_once_button, ToolApproval.ONCE),
            (self.allow_always_button, ToolApproval.ALWAYS),
            (self.deny_button, ToolApproval.DENIED),
        ):
            button.clicked.connect(lambda _=False, d=decision: self._decide(d))
            row.addWidget(button)
        layout.addWidget(self.approval_row)

        self.result_toggle = QToolButton()
        self.result_toggle.setCheckable(True)
        self.result_toggle.setToolButtonStyle(Qt.ToolButtonTextBesideIcon)
        self.result_toggle.setArrowType(Qt.RightArrow)
        self.result_toggle.toggled.connect(self._toggle_result)
        self.result_view = _mono_box("")
        self.result_view.setObjectName("tool_result")
        self.result_view.setVisible(False)
        layout.addWidget(self.result_toggle)
        layout.addWidget(self.result_view)
        self.refresh()

    def set_message(self, message: StoredMessage) -> None:
        self.message = message
        self.refresh()

    def refresh(self, streaming: bool = False) -> None:
        m = self.message
        tool = m.tool or {}
        approval = tool.get("approval", "")
        pending = approval == ToolApproval.PENDING and m.status == MessageStatus.STREAMING
        self.approval_row.setVisible(pending)
        note = APPROVAL_NOTES.get(approval, "")
        if approval == REPEATED:
            note += f" — not run again, same result as #{tool.get('repeat_of', '?')}"
        if m.status == MessageStatus.STREAMING and not pending and approval != REPEATED:
            note += " · running…"
        error = tool.get("error")
        if error and approval != ToolApproval.DENIED:
            note += f" · ✖ {ERROR_NAMES.get(error, error)}"
        elif m.status == MessageStatus.INTERRUPTED:
            note += " · did not finish (the app was closed)"
        self.status_label.setText(note)
        self.status_label.setStyleSheet("color: #c0392b;" if tool.get("is_error") else "")
        done = m.status != MessageStatus.STREAMING
        self.result_toggle.setVisible(done)
        if done:
            self.result_toggle.setText(f"Result ({len(m.content):,} characters)")
            self.result_view.setPlainText(m.content)

    @property
    def result_shown(self) -> bool:
        return self.result_view.isVisible()

    def _decide(self, decision: str) -> None:
        self.approval_row.setVisible(False)  # one answer per call
        self.approvalGiven.emit(self.message.id, decision)

    def _toggle_result(self, shown: bool) -> None:
        self.result_toggle.setArrowType(Qt.DownArrow if shown else Qt.RightArrow)
        self.result_view.setVisible(shown)
