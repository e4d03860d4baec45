"""The conversation column. Streaming text is buffered and drawn once per frame tick (flush_stream),
so the number of re-renders per second is bounded by the tick rate, not by the model's speed."""

from __future__ import annotations

import time

from PySide6.QtCore import Qt, QTimer, Signal
from PySide6.QtWidgets import (
    QLabel,
    QPushButton,
    QScrollArea,
    QSizePolicy,
    QVBoxLayout,
    QWidget,
)

from app.store import StoredMessage
from app.views.message_widget import MessageWidget
from app.views.tool_call_widget import ToolCallWidget
from engine.types import MessageStatus, Role

RENDER_BACKOFF = 3.0


class ChatView(QScrollArea):
    editRequested = Signal(int)
    regenerateRequested = Signal(int)
    messageSelected = Signal(int)
    versionRequested = Signal(int)
    detailsRequested = Signal(int)
    branchRequested = Signal(int)
    compareRequested = Signal(int)
    sourcesRequested = Signal(int, int)  # message id, citation marker (0: the list)
    toolApproval = Signal(int, str)  # tool message id, ToolApproval decision
    earlierRequested = Signal()  # "Load earlier messages" (ChatSession.load_earlier)

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        self.setWidgetResizable(True)
        self.setHorizontalScrollBarPolicy(Qt.ScrollBarAlwaysOff)
        self._column = QWidget()
        self._column.setObjectName("chat_column")
        # The column is exactly as wide as the view (there is no horizontal scroll bar): a card
        # wider than that would be cut off at the right. Cards wrap their text to fit instead.
        self._column.setSizePolicy(QSizePolicy.Ignored, QSizePolicy.Preferred)
        self._layout = QVBoxLayout(self._column)
        self._layout.setContentsMargins(12, 12, 12, 12)
        self._layout.setSpacing(10)
        self._placeholder = QLabel(
            "<h2>LocalChat</h2><p>Type a message below and press <b>Enter</b> to send "
            "(<b>Shift+Enter</b> for a new line).<br>Everything runs on this computer.</p>"
        )
        self._placeholder.setAlignment(Qt.AlignCenter)
        self._placeholder.setWordWrap(True)
        self._placeholder.setObjectName("placeholder")
        self._layout.addWidget(self._placeholder)
        # A long chat opens with its last messages (app/session.py OPEN_MESSAGES).
        self.earlier_button = QPushButton()
        self.earlier_button.setVisible(False)
        self.earlier_button.clicked.connect(self.earlierRequested)
        self._layout.insertWidget(0, self.earlier_button, 0, Qt.AlignHCenter)
        # Above everything: the summary standing in for a compacted chat's oldest messages
        # (app/features/compaction.py puts its card here); it outlives show_messages.
        self.top_slot = QVBoxLayout()
        self.top_slot.setContentsMargins(0, 0, 0, 0)
        self._layout.insertLayout(0, self.top_slot)
        self._layout.addStretch(1)
        self.setWidget(self._column)
        self.widgets: list[MessageWidget] = []
        self._streaming: MessageWidget | None = None
        self._pending_text: list[str] = []
        self._pending_reasoning: list[str] = []
        self.frames_drawn = 0  # repaint ticks that changed the streaming message (for tests)
        self._next_render_at = 0.0

    # --- whole conversation ---------------------------------------------------------------------
    def set_earlier(self, count: int) -> None:
        """Offer to load the `count` earlier messages not shown (hidden when 0)."""
        self.earlier_button.setText(f"Load earlier messages ({count:,} more)")
        self.earlier_button.setVisible(count > 0)

    def show_messages(self, messages: list[StoredMessage]) -> None:
        for w in self.widgets:
            # Out of the layout now; deleteLater alone would leave them drawn until the event
            # loop next runs deferred deletes.
            w.hide()
            self._layout.removeWidget(w)
            w.deleteLater()
        self.widgets = []
        self._streaming = None
        self._pending_text, self._pending_reasoning = [], []
        for m in messages:
            self.add_message(m, scroll=False)
        self._placeholder.setVisible(not self.widgets)
        QTimer.singleShot(0, self._scroll_to_end)

    def add_message(self, message: StoredMessage, scroll: bool = True):
        if message.role == Role.TOOL:
            return self._add_tool_message(message, scroll)
        widget = MessageWidget(message)
        widget.editRequested.connect(self.editRequested)
        widget.regenerateRequested.connect(self.regenerateRequested)
        widget.selected.connect(self.messageSelected)
        widget.versionRequested.connect(self.versionRequested)
        widget.detailsRequested.connect(self.detailsRequested)
        widget.branchRequested.connect(self.branchRequested)
        widget.compareRequested.connect(self.compareRequested)
        widget.sourcesRequested.connect(self.sourcesRequested)
        self._layout.insertWidget(self._layout.count() - 1, widget)
        self.widgets.append(widget)
        self._placeholder.setVisible(False)
        if message.status == MessageStatus.STREAMING:
            self._streaming = widget
            widget.refresh(streaming=True)
        if scroll:
            QTimer.singleShot(0, self._scroll_to_end)
        return widget

    def _add_tool_message(self, message: StoredMessage, scroll: bool) -> ToolCallWidget:
        widget = ToolCallWidget(message)
        widget.approvalGiven.connect(self.toolApproval)
        self._layout.insertWidget(self._layout.count() - 1, widget)
        self.widgets.append(widget)
        self._placeholder.setVisible(False)
        if scroll:
            QTimer.singleShot(0, self._scroll_to_end)
        return widget

    def update_message(self, message: StoredMessage) -> None:
        """Redraw a message that changed outside streaming (a tool call's approval or result)."""
        widget = self.widget_for(message.id)
        if widget is not None:
            at_bottom = self._at_bottom()
            widget.set_message(message)
            if at_bottom:
                QTimer.singleShot(50, self._scroll_to_end)

    def show_tool_events(self, events: list) -> None:
        """The streaming reply is writing tool calls: name them while they form."""
        if self._streaming is not None:
            self._streaming.note_tool_events(events)

    def widget_for(self, message_id: int):
        return next((w for w in self.widgets if w.message.id == message_id), None)

    # --- streaming ------------------------------------------------------------------------------
    def queue_text(self, text: str) -> None:
        self._pending_text.append(text)

    def queue_reasoning(self, text: str) -> None:
        self._pending_reasoning.append(text)

    def flush_stream(self, force: bool = False) -> None:
        """Draw what arrived since the last tick (one markdown re-render at most).

        A re-render of a long markdown reply can take tens of milliseconds; after one that took
        `cost`, the next waits at least RENDER_BACKOFF * cost, so rendering never takes more than
        about a third of the GUI thread however long the reply grows."""
        if self._streaming is None or not (self._pending_text or self._pending_reasoning):
            return
        started = time.perf_counter()
        if not force and started < self._next_render_at:
            return
        at_bottom = self._at_bottom()
        self._streaming.append_stream("".join(self._pending_text), "".join(self._pending_reasoning))
        self._pending_text, self._pending_reasoning = [], []
        self.frames_drawn += 1
        if self._streaming.live_markdown:  # plain appends cost only what they add: no back-off
            self._next_render_at = started + RENDER_BACKOFF * (time.perf_counter() - started)
        if at_bottom:
            QTimer.singleShot(0, self._scroll_to_end)

    def finish_stream(self, stored: StoredMessage) -> None:
        self._pending_text, self._pending_reasoning = [], []  # set_message draws the final text
        at_bottom = self._at_bottom()
        if self._streaming is not None and self._streaming.message.id == stored.id:
            self._streaming.set_message(stored)
        else:
            widget = self.widget_for(stored.id)
            if widget is not None:
                widget.set_message(stored)
        self._streaming = None
        if at_bottom:  # the final render may be taller (markdown, JSON status, usage line)
            QTimer.singleShot(50, self._scroll_to_end)

    @property
    def streaming_widget(self) -> MessageWidget | None:
        return self._streaming

    # --- scrolling ------------------------------------------------------------------------------
    def _at_bottom(self) -> bool:
        bar = self.verticalScrollBar()
        return bar.value() >= bar.maximum() - 40

    def _scroll_to_end(self) -> None:
        bar = self.verticalScrollBar()
        bar.setValue(bar.maximum())
