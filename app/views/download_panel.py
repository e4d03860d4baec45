"""The Library's "Download from Hugging Face" tab: search GGUF repos by name, see a repo's GGUF
files with quant and size (and which are already in the cache), download one with progress and a
Stop that keeps the partial file. The network work is app/library/download_runner.py (injected:
this view only shows and asks)."""

from __future__ import annotations

from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import (
    QAbstractItemView,
    QHBoxLayout,
    QHeaderView,
    QLabel,
    QLineEdit,
    QListWidget,
    QListWidgetItem,
    QProgressBar,
    QPushButton,
    QSplitter,
    QTableWidget,
    QTableWidgetItem,
    QVBoxLayout,
    QWidget,
)

from app.views.size_format import human_size


class DownloadPanel(QWidget):
    downloaded = Signal(str)  # path of the new file in the HF cache

    def __init__(self, runner, parent: QWidget | None = None):
        super().__init__(parent)
        self.runner = runner
        self.files: list = []  # RemoteFile of the chosen repo
        self.cached: dict[str, str] = {}
        self._done_note: str | None = None  # kept in the status over the relisting that follows
        layout = QVBoxLayout(self)
        top = QHBoxLayout()
        self.query = QLineEdit()
        self.query.setObjectName("hub_query")
        self.query.setPlaceholderText("Search Hugging Face for GGUF models (e.g. SmolLM2, Qwen3)…")
        self.query.returnPressed.connect(self.search)
        top.addWidget(self.query, 1)
        self.search_button = QPushButton("Search")
        self.search_button.clicked.connect(self.search)
        top.addWidget(self.search_button)
        layout.addLayout(top)

        split = QSplitter()
        self.repos = QListWidget()
        self.repos.setObjectName("hub_repos")
        self.repos.currentItemChanged.connect(self._on_repo)
        split.addWidget(self.repos)
        self.table = QTableWidget(0, 4)
        self.table.setObjectName("hub_files")
        self.table.setHorizontalHeaderLabels(("File", "Quant", "Size", "On this computer"))
        self.table.setSelectionBehavior(QAbstractItemView.SelectRows)
        self.table.setSelectionMode(QAbstractItemView.SingleSelection)
        self.table.setEditTriggers(QAbstractItemView.NoEditTriggers)
        self.table.verticalHeader().setVisible(False)
        self.table.horizontalHeader().setSectionResizeMode(0, QHeaderView.Stretch)
        for col in (1, 2, 3):
            self.table.horizontalHeader().setSectionResizeMode(col, QHeaderView.ResizeToContents)
        self.table.itemSelectionChanged.connect(self._update_buttons)
        self.table.itemDoubleClicked.connect(lambda _item: self.download_selected())
        split.addWidget(self.table)
        split.setSizes([320, 680])
        layout.addWidget(split, 1)

        bottom = QHBoxLayout()
        self.progress = QProgressBar()
        self.progress.setObjectName("hub_progress")
        self.progress.setVisible(False)
        bottom.addWidget(self.progress, 1)
        self.download_button = QPushButton("Download")
        self.download_button.setObjectName("hub_download")
        self.download_button.setEnabled(False)
        self.download_button.clicked.connect(self.download_selected)
        bottom.addWidget(self.download_button)
        self.stop_button = QPushButton("Stop")
        self.stop_button.setEnabled(False)
        self.stop_button.clicked.connect(runner.stop)
        bottom.addWidget(self.stop_button)
        layout.addLayout(bottom)
        self.status = QLabel(
            f"From {runner.endpoint} (set HF_ENDPOINT for a mirror). Files go to the Hugging Face "
            "cache, shared with other tools."
        )
        self.status.setObjectName("hub_status")
        self.status.setWordWrap(True)
        layout.addWidget(self.status)

        runner.searched.connect(self._on_searched)
        runner.listed.connect(self._on_listed)
        runner.progress.connect(self._on_progress)
        runner.downloaded.connect(self._on_downloaded)
        runner.stopped.connect(self._on_stopped)
        runner.failed.connect(self._on_failed)

    # --- search and listing -----------------------------------------------------------------
    def search(self) -> None:
        self.status.setText(f"Searching {self.runner.endpoint}…")
        self.search_button.setEnabled(False)
        self.runner.search(self.query.text())

    def _on_searched(self, query: str, hits: list) -> None:
        self.search_button.setEnabled(True)
        self.repos.clear()
        for hit in hits:
            item = QListWidgetItem(f"{hit.repo_id}   ↓{hit.downloads or 0:,}")
            item.setData(Qt.UserRole, hit.repo_id)
            self.repos.addItem(item)
        self.status.setText(
            f"{len(hits)} GGUF repositories match {query!r}."
            if hits
            else f"No GGUF repository matches {query!r}."
        )

    def _on_repo(self, item: QListWidgetItem | None, _previous=None) -> None:
        if item is None:
            return
        repo = item.data(Qt.UserRole)
        self.status.setText(f"Listing the GGUF files of {repo}…")
        self.table.setRowCount(0)
        self.runner.list_files(repo)

    def _on_listed(self, repo: str, files: list, cached: dict) -> None:
        current = self.repos.currentItem()
        if current is None or current.data(Qt.UserRole) != repo:
            return  # the user has moved on to another repo
        self.files, self.cached = files, cached
        self.table.setRowCount(len(files))
        for row, f in enumerate(files):
            cells = (
                f.filename,
                f.quant,
                human_size(f.size) if f.size is not None else "?",
                "yes" if f.filename in cached else "",
            )
            for col, text in enumerate(cells):
                item = QTableWidgetItem(text)
                item.setToolTip(f"sha256 {f.sha256}" if f.sha256 else f.filename)
                self.table.setItem(row, col, item)
        note, self._done_note = self._done_note, None
        self.status.setText(
            note or f"{repo}: {len(files)} GGUF files. Pick a quant and press Download."
        )
        self._update_buttons()

    def select_file(self, filename: str) -> None:
        for row, f in enumerate(self.files):
            if f.filename == filename:
                self.table.selectRow(row)

    def selected_file(self):
        rows = self.table.selectionModel().selectedRows()
        return self.files[rows[0].row()] if rows else None

    def _update_buttons(self) -> None:
        busy = self.runner.downloading
        self.download_button.setEnabled(self.selected_file() is not None and not busy)
        self.stop_button.setEnabled(busy)

    # --- downloading ------------------------------------------------------------------------
    def download_selected(self) -> None:
        remote = self.selected_file()
        if remote is None or self.runner.downloading:
            return
        self.progress.setVisible(True)
        self.progress.setRange(0, 0)  # busy until the size is known
        self.status.setText(f"Downloading {remote.filename}…")
        self.runner.download(remote)
        self._update_buttons()

    def _on_progress(self, done: int, total: int | None) -> None:
        if total:
            self.progress.setRange(0, 1000)
            self.progress.setValue(int(1000 * done / total))
            self.progress.setFormat(f"{human_size(done)} of {human_size(total)}")
        self._update_buttons()

    def _on_downloaded(self, path: str) -> None:
        self.progress.setVisible(False)
        self._done_note = f"Downloaded and verified (sha256): {path}"
        self.status.setText(self._done_note)
        self._update_buttons()
        current = self.repos.currentItem()
        if current is not None:
            self.runner.list_files(current.data(Qt.UserRole))
        self.downloaded.emit(path)

    def _on_stopped(self, message: str) -> None:
        self.progress.setVisible(False)
        self.status.setText(message)
        self._update_buttons()

    def _on_failed(self, message: str) -> None:
        self.search_button.setEnabled(True)
        self.progress.setVisible(False)
        self.status.setText(message)
        self._update_buttons()
