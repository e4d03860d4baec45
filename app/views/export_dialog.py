"""File > Export and share…: what to export (this chat, this project, everything) and how
(a Markdown + JSON zip, one web page, a PDF), then the export's progress with a Cancel button.

A view only: it says what the user chose (`exportRequested(scope, format)`) and that they want
the running export stopped (`cancelRequested`); app/features/export.py picks the file, runs the
export and calls show_running / show_progress / show_choices."""

from __future__ import annotations

from PySide6.QtCore import Qt, Signal
from PySide6.QtGui import QPalette
from PySide6.QtWidgets import (
    QButtonGroup,
    QDialog,
    QGroupBox,
    QHBoxLayout,
    QLabel,
    QProgressBar,
    QPushButton,
    QRadioButton,
    QVBoxLayout,
    QWidget,
)

from app.export_job import ExportFormat, ExportScope

FORMAT_TEXTS = {
    ExportFormat.ZIP: (
        "Markdown + JSON (.zip)",
        "One .md to read and one .json per chat, a folder per project; File > Import reads it "
        "back with every version and receipt",
    ),
    ExportFormat.HTML: (
        "Web page (.html)",
        "One file that opens in any browser, offline: code coloured, reasoning and tool calls "
        "folded, light and dark",
    ),
    ExportFormat.PDF: ("PDF (.pdf)", "For printing or sending; each chat starts on a new page"),
}


def _plural(n: int, word: str) -> str:
    return f"{n:,} {word}{'' if n == 1 else 's'}"


class ExportDialog(QDialog):
    exportRequested = Signal(str, str)  # ExportScope, ExportFormat values
    cancelRequested = Signal()

    def __init__(
        self,
        chat_title: str,
        project_name: str | None,
        project_chats: int,
        all_chats: int,
        parent: QWidget | None = None,
    ):
        super().__init__(parent)
        self.setWindowTitle("Export and share")
        self.setMinimumWidth(460)
        self.scope_buttons: dict[ExportScope, QRadioButton] = {}
        self.format_buttons: dict[ExportFormat, QRadioButton] = {}

        scope_box = QGroupBox("What")
        scope_layout = QVBoxLayout(scope_box)
        self._scope_group = QButtonGroup(self)
        chat_text = f"This chat — {chat_title}"
        if project_name is None:
            project_text = "This project — the chat is in no project"
        else:
            project_text = f"This project — {project_name} ({_plural(project_chats, 'chat')})"
        for scope, text in (
            (ExportScope.CHAT, chat_text),
            (ExportScope.PROJECT, project_text),
            (ExportScope.EVERYTHING, f"Everything — {_plural(all_chats, 'chat')}"),
        ):
            button = QRadioButton(text)
            button.setObjectName(f"scope_{scope.value}")
            self._scope_group.addButton(button)
            scope_layout.addWidget(button)
            self.scope_buttons[scope] = button
        self.scope_buttons[ExportScope.PROJECT].setEnabled(project_name is not None)
        self.scope_buttons[ExportScope.EVERYTHING].setEnabled(all_chats > 0)
        self.scope_buttons[ExportScope.CHAT].setChecked(True)

        format_box = QGroupBox("As")
        format_layout = QVBoxLayout(format_box)
        self._format_group = QButtonGroup(self)
        for export_format, (text, tip) in FORMAT_TEXTS.items():
            button = QRadioButton(text)
            button.setObjectName(f"format_{export_format.value}")
            button.setToolTip(tip)
            self._format_group.addButton(button)
            format_layout.addWidget(button)
            hint = QLabel(tip)
            hint.setWordWrap(True)
            hint.setObjectName("export_hint")
            hint.setContentsMargins(22, 0, 0, 4)
            hint.setForegroundRole(QPalette.ColorRole.PlaceholderText)  # muted, both themes
            format_layout.addWidget(hint)
            self.format_buttons[export_format] = button
        self.format_buttons[ExportFormat.ZIP].setChecked(True)

        self.progress = QProgressBar()
        self.progress.setObjectName("export_progress")
        self.progress.setFormat("%v of %m chats")
        self.progress_label = QLabel()
        self.progress_label.setObjectName("export_progress_label")
        self.progress_label.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.progress_label.setWordWrap(True)

        self.export_button = QPushButton("Export…")
        self.export_button.setObjectName("export_button")
        self.export_button.setDefault(True)
        self.export_button.setToolTip("Choose where to save, then export")
        self.close_button = QPushButton("Close")
        self.cancel_button = QPushButton("Cancel export")
        self.cancel_button.setObjectName("cancel_export_button")
        self.cancel_button.setToolTip("Stop; nothing is left at the destination")
        self.export_button.clicked.connect(self._request)
        self.close_button.clicked.connect(self.reject)
        self.cancel_button.clicked.connect(self._cancel)

        buttons = QHBoxLayout()
        buttons.addStretch(1)
        buttons.addWidget(self.cancel_button)
        buttons.addWidget(self.close_button)
        buttons.addWidget(self.export_button)
        self._boxes = (scope_box, format_box)
        layout = QVBoxLayout(self)
        layout.addWidget(scope_box)
        layout.addWidget(format_box)
        layout.addWidget(self.progress_label)
        layout.addWidget(self.progress)
        layout.addLayout(buttons)
        self.show_choices()

    # --- what the user chose --------------------------------------------------------------------
    def scope(self) -> ExportScope:
        return next(s for s, b in self.scope_buttons.items() if b.isChecked())

    def export_format(self) -> ExportFormat:
        return next(f for f, b in self.format_buttons.items() if b.isChecked())

    def _request(self) -> None:
        self.exportRequested.emit(self.scope().value, self.export_format().value)

    def _cancel(self) -> None:
        self.cancel_button.setEnabled(False)
        self.progress_label.setText("Cancelling…")
        self.cancelRequested.emit()

    # --- states ---------------------------------------------------------------------------------
    @property
    def running(self) -> bool:
        return self._running

    def show_choices(self, message: str = "") -> None:
        """Back to choosing (at the start, after a cancel or a failure, with `message`)."""
        self._running = False
        for box in self._boxes:
            box.setEnabled(True)
        self.progress.hide()
        self.cancel_button.hide()
        self.export_button.show()
        self.close_button.show()
        self.progress_label.setText(message)
        self.progress_label.setVisible(bool(message))
        self.adjustSize()  # room for the message, or back to the choices' size

    def show_running(self, destination: str, total: int) -> None:
        self._running = True
        for box in self._boxes:
            box.setEnabled(False)
        self.export_button.hide()
        self.close_button.hide()
        self.cancel_button.setEnabled(True)
        self.cancel_button.show()
        self.progress.setRange(0, max(total, 1))
        self.progress.setValue(0)
        self.progress.show()
        self.progress_label.setText(f"Exporting to {destination}")
        self.progress_label.show()
        self.adjustSize()  # the progress rows below the choices, nothing squeezed

    def show_progress(self, done: int, total: int) -> None:
        self.progress.setRange(0, max(total, 1))
        self.progress.setValue(done)

    def reject(self) -> None:
        """Esc or the window's close button while exporting cancels the export first."""
        if self.running:
            self._cancel()
            return
        super().reject()
