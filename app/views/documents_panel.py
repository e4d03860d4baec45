"""The Documents panel: the open chat's document collection, its files, indexing progress and the
source budget.

- which collection the chat uses: a list of every collection (pick one to reuse it in this
  chat), "New collection…", and "Stop using" (the collection is kept for other chats);
- Add files… / Add folder… / Re-index (changed files only);
- the files with their status (indexed, skipped) and problem, in words, each naming the file;
- while indexing: a progress bar, "File 3 of 10 · 42 pages · 180 chunks · 35.2 chunks/s · about
  0:12 left", and Cancel;
- the source budget (tokens of the prompt the passages may take) and how many passages to
  retrieve, which the next reply uses.

A view: it shows plain records given by app/features/documents.py and reports what the user
does through signals; it never opens a collection itself.
"""

from __future__ import annotations

from pathlib import Path

from PySide6.QtCore import QEvent, QObject, Qt, Signal
from PySide6.QtGui import QColor
from PySide6.QtWidgets import (
    QComboBox,
    QInputDialog,
    QLabel,
    QMenu,
    QProgressBar,
    QPushButton,
    QSpinBox,
    QToolButton,
    QTreeWidget,
    QTreeWidgetItem,
    QVBoxLayout,
    QWidget,
)

from app.theme import text_color
from app.views.file_dialogs import open_files, open_folder
from app.views.flow_layout import FlowLayout

NO_COLLECTION = ""  # the combo's data for "no documents in this chat"
NEW_COLLECTION = "\0new"  # the combo's data for "New collection…"


class DocumentsPanel(QWidget):
    filesChosen = Signal(list)  # paths to index into the chat's collection
    collectionChosen = Signal(str)  # an existing collection, or a new one's name
    detachRequested = Signal()
    reindexRequested = Signal()
    cancelRequested = Signal()
    budgetChanged = Signal(int)
    topKChanged = Signal(int)

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        self.setObjectName("documents_panel")
        layout = QVBoxLayout(self)
        layout.setContentsMargins(4, 4, 4, 4)

        self.hint = QLabel(
            "Attach files or folders to ask about them: Attach… by the message box, drag "
            "and drop onto the chat, or Add files… below. PDF, Word (.docx), HTML, Markdown, "
            "text and source code."
        )
        self.hint.setObjectName("placeholder")
        self.hint.setWordWrap(True)
        layout.addWidget(self.hint)

        layout.addWidget(QLabel("Collection"))  # above its list: the side panel is narrow
        self.collection = QComboBox()
        self.collection.setObjectName("collection_picker")
        self.collection.setToolTip(
            "The documents this chat answers from. A collection can serve several chats: pick "
            "one to use it here too."
        )
        # as narrow as the side panel: long names are cut, the list shows them whole
        self.collection.setSizeAdjustPolicy(
            QComboBox.SizeAdjustPolicy.AdjustToMinimumContentsLengthWithIcon
        )
        self.collection.setMinimumContentsLength(4)
        self.collection.activated.connect(self._on_collection)
        layout.addWidget(self.collection)
        self.detach_button = QPushButton("Stop using")
        self.detach_button.setToolTip(
            "This chat stops using the collection; the collection is kept for other chats"
        )
        self.detach_button.clicked.connect(self.detachRequested)

        # as many buttons a line as the width holds (at 16 pt the side panel is ~170 px)
        buttons = FlowLayout()
        self.add_files_button = QPushButton("Add files…")
        self.add_files_button.clicked.connect(self._choose_files)
        self.add_folder_button = QPushButton("Add folder…")
        self.add_folder_button.clicked.connect(self._choose_folder)
        self.reindex_button = QPushButton("Re-index")
        self.reindex_button.setToolTip(
            "Read the collection's files again: only changed files are indexed again, and "
            "files removed from disk are dropped"
        )
        self.reindex_button.clicked.connect(self.reindexRequested)
        for button in (
            self.add_files_button,
            self.add_folder_button,
            self.reindex_button,
            self.detach_button,
        ):
            buttons.addWidget(button)
        layout.addLayout(buttons)

        self.progress_bar = QProgressBar()
        self.progress_bar.setObjectName("index_progress")
        self.progress_label = QLabel()
        self.progress_label.setObjectName("index_progress_label")
        self.progress_label.setWordWrap(True)
        self.cancel_button = QPushButton("Cancel")
        self.cancel_button.setToolTip(
            "Stop indexing: files finished so far are kept, the one in progress is left as it was"
        )
        self.cancel_button.clicked.connect(self.cancelRequested)
        progress_row = FlowLayout()
        progress_row.addWidget(self.progress_bar)
        progress_row.addWidget(self.cancel_button)
        layout.addLayout(progress_row)
        layout.addWidget(self.progress_label)

        self.report_label = QLabel()
        self.report_label.setObjectName("index_report")
        self.report_label.setWordWrap(True)
        self.report_label.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        layout.addWidget(self.report_label)
        self.problem_label = QLabel()
        self.problem_label.setObjectName("documents_problem")
        self.problem_label.setWordWrap(True)
        self.problem_label.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        layout.addWidget(self.problem_label)

        self.files = QTreeWidget()
        self.files.setObjectName("documents_files")
        self.files.setHeaderLabels(["File", "Status", "Chunks"])
        self.files.setRootIsDecorated(False)
        self.files.setWordWrap(True)
        layout.addWidget(self.files, 1)

        self.budget = QSpinBox()
        self.budget.setObjectName("source_budget")
        self.budget.setSingleStep(250)
        self.budget.setToolTip(
            "How much of the prompt the passages may take (counted with the embedding model's "
            "tokenizer, so about the chat model's count). Passages that do not fit are left out "
            "and listed in the reply's Sources."
        )
        self.budget.editingFinished.connect(lambda: self.budgetChanged.emit(self.budget.value()))
        self.top_k = QSpinBox()
        self.top_k.setObjectName("source_top_k")
        self.top_k.setToolTip("How many passages to retrieve for each question")
        self.top_k.editingFinished.connect(lambda: self.topKChanged.emit(self.top_k.value()))
        # each label above its box and wrapping: a form's labels never wrap, and at 16 pt
        # "Source budget (tokens)" alone is wider than the side panel
        for text, box in (("Source budget (tokens)", self.budget), ("Passages", self.top_k)):
            label = QLabel(text)
            label.setWordWrap(True)
            label.setBuddy(box)
            layout.addWidget(label)
            layout.addWidget(box)
        self.last_use = QLabel()  # what the last reply's sources took of the budget
        self.last_use.setObjectName("sources_last_use")
        self.last_use.setWordWrap(True)
        layout.addWidget(self.last_use)
        self._current = NO_COLLECTION
        self.show_progress(None)
        self.show_report("", [])
        self.show_last_use(None)
        self.show_state(None, [], [])

    # --- what to show ----------------------------------------------------------------------------
    def set_ranges(self, budget: tuple[int, int], top_k: tuple[int, int]) -> None:
        self.budget.setRange(*budget)
        self.top_k.setRange(*top_k)

    def show_state(self, settings, names: list[str], files: list, indexing: bool = False) -> None:
        """settings: the chat's ChatDocumentSettings or None; names: every collection; files:
        the collection's FileRecords."""
        current = settings.collection if settings is not None else NO_COLLECTION
        self._current = current
        self.collection.blockSignals(True)
        self.collection.clear()
        self.collection.addItem("No documents in this chat", NO_COLLECTION)
        for name in sorted(set(names) | ({current} - {NO_COLLECTION})):
            self.collection.addItem(name, name)
        self.collection.addItem("New collection…", NEW_COLLECTION)
        self.collection.setCurrentIndex(max(0, self.collection.findData(current)))
        self.collection.blockSignals(False)
        has = settings is not None
        self.detach_button.setEnabled(has and not indexing)
        self.reindex_button.setEnabled(has and bool(files) and not indexing)
        for button in (self.add_files_button, self.add_folder_button):
            button.setEnabled(not indexing)
        self.collection.setEnabled(not indexing)
        self.hint.setVisible(not files)
        for box, value in ((self.budget, "budget_tokens"), (self.top_k, "top_k")):
            box.blockSignals(True)
            if has:
                box.setValue(getattr(settings, value))
            box.setEnabled(has)
            box.blockSignals(False)
        self.files.clear()
        bad = QColor(text_color(self.palette(), "bad"))
        for record in files:
            status = record.status
            if record.pages and record.pages > 1:
                status += f", {record.pages} pages"
            item = QTreeWidgetItem([Path(record.path).name, status, str(record.n_chunks)])
            item.setToolTip(0, record.path)
            if record.problem:
                item.setToolTip(1, record.problem)
                item.setForeground(1, bad)
                # the row names the file already: its path in the message would only wrap
                problem = QTreeWidgetItem([_short(record.problem, [record.path]), "", ""])
                problem.setToolTip(0, record.problem)
                problem.setFirstColumnSpanned(True)
                problem.setForeground(0, bad)
                item.addChild(problem)
                item.setExpanded(True)
            self.files.addTopLevelItem(item)
        self.files.expandAll()
        self.files.resizeColumnToContents(1)

    def show_progress(self, progress, text: str = "") -> None:
        """An IndexProgress while indexing, None when idle."""
        running = progress is not None
        for widget in (self.progress_bar, self.progress_label, self.cancel_button):
            widget.setVisible(running)
        if running:
            self.progress_bar.setRange(0, max(1, progress.files_total))
            self.progress_bar.setValue(progress.files_done)
            self.progress_label.setText(text)

    def show_starting(self) -> None:
        """Indexing started: busy until the first progress (the model may be loading)."""
        for widget in (self.progress_bar, self.progress_label, self.cancel_button):
            widget.setVisible(True)
        self.progress_bar.setRange(0, 0)
        self.progress_label.setText("Loading the embedding model and reading the files…")

    def show_report(
        self, summary: str, problems: list[str], paths: list[str] | None = None
    ) -> None:
        """After a run: its summary and each problem (file paths shortened to their names, the
        whole message in the tooltip)."""
        self.report_label.setText(summary)
        self.report_label.setVisible(bool(summary))
        self.show_problem("\n".join(_short(p, paths or []) for p in problems))
        self.problem_label.setToolTip("\n".join(problems))

    def show_last_use(self, section: dict | None) -> None:
        """The last reply's sources (its receipt's section): passages in, tokens of the budget
        used, passages left out for lack of room."""
        if not section:
            self.last_use.setText("")
            self.last_use.setVisible(False)
            return
        n, out = len(section.get("sources") or []), len(section.get("left_out") or [])
        text = (
            f"Last reply: {n} passage{'s' if n != 1 else ''}, {section.get('used_tokens', 0):,} "
            f"of {section.get('budget_tokens', 0):,} tokens"
        )
        if out:
            text += f"; {out} left out for lack of room"
        self.last_use.setText(text)
        self.last_use.setVisible(True)

    def show_problem(self, message: str) -> None:
        self.problem_label.setText(message)
        self.problem_label.setStyleSheet(f"color: {text_color(self.palette(), 'bad')};")
        self.problem_label.setVisible(bool(message))

    # --- what the user does ----------------------------------------------------------------------
    def _on_collection(self, index: int) -> None:
        data = self.collection.itemData(index)
        if data == NO_COLLECTION:
            self.detachRequested.emit()
        elif data == NEW_COLLECTION:
            name, ok = QInputDialog.getText(self, "New collection", "Name of the collection:")
            if ok and name.strip():
                self.collectionChosen.emit(name.strip())
            else:  # cancelled: show the chat's collection again
                self.collection.setCurrentIndex(max(0, self.collection.findData(self._current)))
        else:
            self.collectionChosen.emit(str(data))

    def _choose_files(self) -> None:
        paths = open_files(self, "Attach files to this chat")
        if paths:
            self.filesChosen.emit(paths)

    def _choose_folder(self) -> None:
        path = open_folder(self, "Attach a folder to this chat")
        if path:
            self.filesChosen.emit([path])


def _short(message: str, paths: list[str]) -> str:
    """`message` with each of `paths` written as its file name."""
    for path in sorted(paths, key=len, reverse=True):
        message = message.replace(path, Path(path).name)
    return message


class AttachButton(QToolButton):
    """The paperclip by the message box: attach files or a folder to the open chat."""

    filesChosen = Signal(list)

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        self.setObjectName("attach_button")
        self.setText("Attach…")  # words: an emoji needs a font many systems lack
        self.setToolTip("Attach files or a folder to this chat, to ask about them (documents)")
        self.setPopupMode(QToolButton.ToolButtonPopupMode.InstantPopup)
        menu = QMenu(self)
        menu.addAction("Attach files…", self._files)
        menu.addAction("Attach a folder…", self._folder)
        self.setMenu(menu)

    def _files(self) -> None:
        paths = open_files(self, "Attach files to this chat")
        if paths:
            self.filesChosen.emit(paths)

    def _folder(self) -> None:
        path = open_folder(self, "Attach a folder to this chat")
        if path:
            self.filesChosen.emit([path])


class FileDropFilter(QObject):
    """Files and folders dropped on the chat become documents of the chat. A model file (.gguf)
    is left to the window, which opens it."""

    dropped = Signal(list)

    def watch(self, widget: QWidget) -> None:
        widget.setAcceptDrops(True)
        widget.installEventFilter(self)

    @staticmethod
    def document_paths(mime) -> list[str]:
        if not mime.hasUrls():
            return []
        paths = [u.toLocalFile() for u in mime.urls() if u.isLocalFile()]
        if not paths or any(p.lower().endswith(".gguf") for p in paths):
            return []
        return paths

    def eventFilter(self, obj, event) -> bool:
        kind = event.type()
        if kind in (QEvent.Type.DragEnter, QEvent.Type.DragMove):
            if self.document_paths(event.mimeData()):
                event.acceptProposedAction()
                return True
        elif kind == QEvent.Type.Drop:
            paths = self.document_paths(event.mimeData())
            if paths:
                event.acceptProposedAction()
                self.dropped.emit(paths)
                return True
        return False
