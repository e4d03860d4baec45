"""The widgets of visible, reversible compaction (issue 35; the logic is app/features/compaction.py):

- CompactionOffer, under the chat: "This chat is near the model's context limit (N of M tokens).
  Summarise the oldest turns?" [Summarise] [Not now].
- SummaryCard, at the top of the chat: while the model writes the summary, its text as it
  streams with [Cancel]; then "Summary of N earlier messages" as an editable text ([Save edit]
  once changed), [Show originals] (the covered messages, greyed, in their place) and
  [Restore originals] (the summary stops standing in for them). A failure or a cancel is said
  on the card, in words.

Colours come from app/theme.py's banner colours for the theme in use (info for both), as the
notice banner does, so the card reads in the light and the dark theme alike.
"""

from __future__ import annotations

from PySide6.QtCore import QEvent, Signal
from PySide6.QtWidgets import (
    QApplication,
    QFrame,
    QHBoxLayout,
    QLabel,
    QPlainTextEdit,
    QPushButton,
    QVBoxLayout,
    QWidget,
)

from app.theme import banner_colors


class _Tinted(QFrame):
    """A frame in the theme's info colours, its labels and buttons' text included."""

    def __init__(self, name: str, parent: QWidget | None = None):
        super().__init__(parent)
        self.setObjectName(name)
        self.setFrameShape(QFrame.StyledPanel)
        self._restyle()

    def changeEvent(self, event):
        super().changeEvent(event)
        if event.type() == QEvent.PaletteChange:  # the theme changed (Settings)
            self._restyle()

    def _restyle(self) -> None:
        background, text, border = banner_colors(QApplication.palette(), "info")
        name = self.objectName()
        # a style sheet's colour does not pass from a frame to its children: name them too
        style = (
            f"#{name} {{ background: {background}; border: 1px solid {border};"
            f" border-radius: 6px; }}"
            f"#{name} QLabel {{ color: {text}; background: transparent; border: none; }}"
        )
        if style != self.styleSheet():  # setting it changes the palette: no loop
            self.setStyleSheet(style)


class CompactionOffer(_Tinted):
    summariseRequested = Signal()
    dismissed = Signal()

    def __init__(self, parent: QWidget | None = None):
        super().__init__("compaction_offer", parent)
        layout = QHBoxLayout(self)
        layout.setContentsMargins(10, 6, 6, 6)
        self.label = QLabel()
        self.label.setWordWrap(True)
        self.summarise_button = QPushButton("Summarise")
        self.summarise_button.setObjectName("compaction_summarise")
        self.summarise_button.setToolTip(
            "The loaded model writes a summary of the oldest turns; it stands in for them in "
            "the prompt. The messages stay in the chat and can be restored."
        )
        self.not_now_button = QPushButton("Not now")
        self.not_now_button.setObjectName("compaction_not_now")
        self.not_now_button.setToolTip(
            "Keep the chat as it is; when it no longer fits, the oldest turns are left out"
        )
        layout.addWidget(self.label, 1)
        layout.addWidget(self.summarise_button)
        layout.addWidget(self.not_now_button)
        self.summarise_button.clicked.connect(self.summariseRequested)
        self.not_now_button.clicked.connect(self.dismissed)
        self.setVisible(False)

    def show_offer(self, prompt_tokens: int, n_ctx: int) -> None:
        self.label.setText(
            f"This chat is near the model's context limit ({prompt_tokens:,} of {n_ctx:,} "
            "tokens). Summarise the oldest turns?"
        )
        self.setVisible(True)


class SummaryCard(_Tinted):
    cancelRequested = Signal()
    saveRequested = Signal(str)  # the edited summary
    originalsToggled = Signal(bool)  # show the covered messages (greyed)
    restoreRequested = Signal()
    closeRequested = Signal()  # a failure's message was read (no summary to show)

    def __init__(self, parent: QWidget | None = None):
        super().__init__("summary_card", parent)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(10, 8, 10, 8)
        self.title = QLabel()
        self.title.setObjectName("summary_title")
        font = self.title.font()
        font.setBold(True)
        self.title.setFont(font)
        self.status = QLabel()
        self.status.setObjectName("summary_status")
        self.status.setWordWrap(True)
        self.status.setVisible(False)
        self.text = QPlainTextEdit()
        self.text.setObjectName("summary_text")
        # a few lines: the summary is short, and the chat below it is what the user reads
        self.text.setMinimumHeight(60)
        self.text.setMaximumHeight(130)
        self.text.textChanged.connect(self._on_edited)
        buttons = QHBoxLayout()
        self.cancel_button = QPushButton("Cancel")
        self.cancel_button.setToolTip("Stop writing the summary; the chat stays as it was")
        self.save_button = QPushButton("Save edit")
        self.save_button.setToolTip("Use this text as the summary from the next reply on")
        self.originals_button = QPushButton("Show originals")
        self.originals_button.setCheckable(True)
        self.originals_button.setToolTip("Show the summarised messages in place, greyed")
        self.restore_button = QPushButton("Restore originals")
        self.restore_button.setToolTip(
            "Stop using the summary: the model sees the original messages again (those that "
            "fit the context)"
        )
        self.close_button = QPushButton("Close")
        for button in (
            self.cancel_button,
            self.save_button,
            self.originals_button,
            self.restore_button,
            self.close_button,
        ):
            buttons.addWidget(button)
        buttons.addStretch(1)
        layout.addWidget(self.title)
        layout.addWidget(self.status)
        layout.addWidget(self.text)
        layout.addLayout(buttons)
        self.cancel_button.clicked.connect(self.cancelRequested)
        self.save_button.clicked.connect(lambda: self.saveRequested.emit(self.summary_text))
        self.originals_button.toggled.connect(self._on_originals)
        self.restore_button.clicked.connect(self.restoreRequested)
        self.close_button.clicked.connect(self.closeRequested)
        self._saved = ""
        self.running = False
        self.setVisible(False)

    @property
    def summary_text(self) -> str:
        return self.text.toPlainText()

    def show_running(self, n_messages: int) -> None:
        """The model is writing the summary of `n_messages` messages."""
        self.running = True
        self.title.setText(f"Summarising {n_messages} earlier messages…")
        self._say("")
        self.text.setReadOnly(True)
        self.text.setPlainText("")
        self._buttons(cancel=True)
        self.setVisible(True)

    def append(self, text: str) -> None:
        self.text.moveCursor(self.text.textCursor().MoveOperation.End)
        self.text.insertPlainText(text)

    def show_summary(self, n_messages: int, summary: str, note: str = "") -> None:
        """The active summary, editable; `note` says something about it (e.g. a failed retry)."""
        self.running = False
        noun = "message" if n_messages == 1 else "messages"
        self.title.setText(f"Summary of {n_messages} earlier {noun}")
        self._say(note)
        self._saved = summary
        self.text.setReadOnly(False)
        self.text.setPlainText(summary)
        self._buttons(originals=True, restore=True)
        self.setVisible(True)

    def show_problem(self, message: str) -> None:
        """The summary was not made (cancelled, failed): say why; the chat is as it was."""
        self.running = False
        self.title.setText("No summary was made")
        self._say(message)
        self.text.setVisible(False)
        self._buttons(close=True)
        self.setVisible(True)

    def saved(self, summary: str) -> None:
        self._saved = summary
        if self.summary_text != summary:  # stored trimmed
            self.text.setPlainText(summary)
        self._say("")
        self._on_edited()

    def _say(self, message: str) -> None:
        self.status.setText(message)
        self.status.setVisible(bool(message))

    def _buttons(self, cancel=False, originals=False, restore=False, close=False) -> None:
        self.text.setVisible(not close)
        self.cancel_button.setVisible(cancel)
        self.save_button.setVisible(False)  # shown once the text differs from the saved one
        self.originals_button.setVisible(originals)
        self.restore_button.setVisible(restore)
        self.close_button.setVisible(close)
        if not originals:
            self.originals_button.setChecked(False)

    def _on_edited(self) -> None:
        editable = not self.running and not self.text.isReadOnly()
        self.save_button.setVisible(editable and self.summary_text != self._saved)
        self.save_button.setEnabled(bool(self.summary_text.strip()))

    def _on_originals(self, shown: bool) -> None:
        self.originals_button.setText("Hide originals" if shown else "Show originals")
        self.originalsToggled.emit(shown)
