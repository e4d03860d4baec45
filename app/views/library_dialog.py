"""The model library: every GGUF file found in the user's folders and other tools' stores, with
what its header says (architecture, size, quant, context, chat template, whether this engine runs
it), filterable, and opened with a double-click. Scanning happens in app/library (a worker
thread); this view only shows results. The Download tab (app/views/download_panel.py) fetches
more from the Hugging Face Hub into the shared cache and rescans."""

from __future__ import annotations

import html
from typing import Any

from PySide6.QtCore import Qt, Signal
from PySide6.QtGui import QBrush, QColor
from PySide6.QtWidgets import (
    QAbstractItemView,
    QDialog,
    QHBoxLayout,
    QHeaderView,
    QLabel,
    QLineEdit,
    QListWidget,
    QPushButton,
    QTableWidget,
    QTableWidgetItem,
    QTabWidget,
    QVBoxLayout,
    QWidget,
)

from app.theme import text_color
from app.views.file_dialogs import open_folder
from app.views.size_format import human_size
from engine.types import ModelFileSummary

COLUMNS = (
    "Model",
    "Arch",
    "Params",
    "Quant",
    "Size",
    "Context",
    "Chat",
    "Runs",
    "On this computer",
    "Found in",
)
PREDICTION_COLUMN = COLUMNS.index("On this computer")
PREDICTING = "estimating…"
COLUMN_TIPS = (
    "File name",
    "Architecture (general.architecture)",
    "Parameter count, from the tensor shapes",
    "Quantization (general.file_type; hover a row for the mix of tensor types)",
    "Size on disk",
    "Context length the model was trained for",
    "Has a chat template",
    "Whether this engine can run it (hover for the reason when not)",
    "Memory it will need at your context size and KV cache type, against the memory free now, "
    "and the decode speed expected on this computer (from a short measurement of its memory "
    "bandwidth; hover a row for the details)",
    "The folder or tool it was found in, and the repository",
)


def human_count(n: int | None) -> str:
    if n is None:
        return ""
    if n >= 1e9:
        return f"{n / 1e9:.1f}B"
    if n >= 1e6:
        return f"{n / 1e6:.0f}M"
    if n >= 1e3:
        return f"{n / 1e3:.0f}K"
    return str(n)


def quant_mix_text(summary: ModelFileSummary) -> str:
    total = sum(b for _, _, b in summary.quant_mix) or 1
    return ", ".join(
        f"{name} {100 * b / total:.0f}% ({n} tensors)" for name, n, b in summary.quant_mix
    )


def prediction_tip(p) -> str:
    """The prediction in full: what the memory is made of and both speeds."""
    free = (
        f" of {p.available_bytes / 1e9:.1f} GB free now"
        if p.available_bytes is not None
        else " (free memory unknown)"
    )
    verdict = {True: "fits", False: "does NOT fit in the free memory", None: ""}[p.fits]
    lines = [
        f"Will it run here? {verdict}".rstrip(),
        f"Memory: ~{p.memory_bytes / 1e9:.2f} GB{free} = weights "
        f"{p.weights_bytes / 1e6:.0f} MB + KV cache {p.kv_bytes / 1e6:.0f} MB "
        f"({p.n_ctx:,} tokens, {p.cache_type}) + engine {p.overhead_bytes / 1e6:.0f} MB",
        f"Speed: decode ~{p.decode_tok_s:.1f} tok/s, prefill ~{p.prefill_tok_s:.0f} tok/s "
        f"({p.threads} threads, {p.kernel_path} kernels, memory read "
        f"{p.bandwidth_bytes_per_s / 1e9:.1f} GB/s)",
    ]
    if p.uncalibrated:
        lines.append(f"Speed of {', '.join(p.uncalibrated)} not calibrated: a rough estimate")
    return "\n".join(lines)


class _SortKeyItem(QTableWidgetItem):
    """Sorts by the number behind the text (sizes, parameter counts), not the text."""

    def __init__(self, text: str, key: float):
        super().__init__(text)
        self.key = key

    def __lt__(self, other):
        if isinstance(other, _SortKeyItem):
            return self.key < other.key
        return super().__lt__(other)


class LibraryDialog(QDialog):
    openRequested = Signal(str)  # a model file path
    foldersChanged = Signal(list)  # the user's folders, to save in the settings

    def __init__(
        self,
        runner,
        folders: list[str],
        download_panel: QWidget | None = None,
        parent=None,
        *,
        predictor=None,
        load_options: tuple[int, str, int] = (4096, "f16", 0),
    ):
        """runner: app.library.scan_runner.LibraryScanRunner (injected: views do not import the
        scanner, which reads GGUF headers through the engine). predictor: an
        app.library.prediction_runner.PredictionRunner, asked after each scan whether each
        runnable file fits and how fast it will be for a load with load_options (context
        size, KV cache type, threads; the app's settings); without one the column is hidden."""
        super().__init__(parent)
        self.predictor = predictor
        self.load_options = load_options
        self.predictions: dict[str, Any] = {}  # path -> RunPrediction, or why there is none
        self.setWindowTitle("Model library")
        # wide enough for the file name, the facts, "On this computer" and where it was found
        # side by side, within the screen
        screen = self.screen().availableGeometry() if self.screen() is not None else None
        self.resize(min(1400, screen.width() - 40) if screen else 1400, 640)
        self.runner = runner
        self.user_folders = list(folders)
        self.summaries: list[ModelFileSummary] = []
        self.tabs = QTabWidget()
        self.tabs.addTab(self._build_library(), "Models on this computer")
        self.download_panel = download_panel
        self._select_after_scan: str | None = None
        if download_panel is not None:
            self.tabs.addTab(download_panel, "Download from Hugging Face")
            download_panel.downloaded.connect(self._on_downloaded)
        layout = QVBoxLayout(self)
        layout.addWidget(self.tabs)
        runner.finished.connect(self._on_scanned)
        runner.failed.connect(self._on_failed)
        if predictor is not None:
            predictor.predicted.connect(self._on_predicted)
            predictor.failed.connect(self._on_prediction_failed)
        else:
            self.table.setColumnHidden(PREDICTION_COLUMN, True)
        self.rescan()

    def _build_library(self) -> QWidget:
        page = QWidget()
        layout = QVBoxLayout(page)
        top = QHBoxLayout()
        self.filter_edit = QLineEdit()
        self.filter_edit.setObjectName("library_filter")
        self.filter_edit.setPlaceholderText("Filter by name, architecture, quant or folder…")
        self.filter_edit.setClearButtonEnabled(True)
        self.filter_edit.textChanged.connect(self._apply_filter)
        top.addWidget(self.filter_edit, 1)
        self.rescan_button = QPushButton("Rescan")
        self.rescan_button.clicked.connect(self.rescan)
        top.addWidget(self.rescan_button)
        layout.addLayout(top)

        self.table = QTableWidget(0, len(COLUMNS))
        self.table.setObjectName("library_table")
        self.table.setHorizontalHeaderLabels(COLUMNS)
        for col, tip in enumerate(COLUMN_TIPS):
            self.table.horizontalHeaderItem(col).setToolTip(tip)
        self.table.setSelectionBehavior(QAbstractItemView.SelectRows)
        self.table.setSelectionMode(QAbstractItemView.SingleSelection)
        self.table.setEditTriggers(QAbstractItemView.NoEditTriggers)
        self.table.verticalHeader().setVisible(False)
        header = self.table.horizontalHeader()
        for col in range(len(COLUMNS) - 1):
            header.setSectionResizeMode(col, QHeaderView.ResizeToContents)
        header.setSectionResizeMode(len(COLUMNS) - 1, QHeaderView.Stretch)  # where: repo, folder
        self.table.itemDoubleClicked.connect(lambda _item: self.open_selected())
        self.table.itemSelectionChanged.connect(self._on_selection)
        layout.addWidget(self.table, 1)

        self.detail = QLabel()
        self.detail.setObjectName("library_detail")
        self.detail.setWordWrap(True)
        self.detail.setTextFormat(Qt.RichText)
        self.detail.setTextInteractionFlags(Qt.TextSelectableByMouse)
        layout.addWidget(self.detail)

        bottom = QHBoxLayout()
        folders_box = QVBoxLayout()
        folders_box.addWidget(
            QLabel("Also scanned: your folders (below) and " + self._known_text())
        )
        self.folder_list = QListWidget()
        self.folder_list.setObjectName("library_folders")
        self.folder_list.setMaximumHeight(70)
        self.folder_list.addItems(self.user_folders)
        folders_box.addWidget(self.folder_list)
        bottom.addLayout(folders_box, 1)
        buttons = QVBoxLayout()
        add = QPushButton("Add folder…")
        add.clicked.connect(self.ask_add_folder)
        self.remove_button = QPushButton("Remove folder")
        self.remove_button.clicked.connect(self.remove_selected_folder)
        buttons.addWidget(add)
        buttons.addWidget(self.remove_button)
        bottom.addLayout(buttons)
        layout.addLayout(bottom)

        status = QHBoxLayout()
        self.status = QLabel()
        self.status.setObjectName("library_status")
        status.addWidget(self.status, 1)
        self.open_button = QPushButton("Open model")
        self.open_button.setObjectName("library_open")
        self.open_button.setDefault(True)
        self.open_button.setEnabled(False)
        self.open_button.clicked.connect(self.open_selected)
        status.addWidget(self.open_button)
        layout.addLayout(status)
        return page

    def _known_text(self) -> str:
        existing = sorted({f.source for f in self.runner.known if f.path.is_dir()})
        return ", ".join(existing) if existing else "(no other tool's model folder found)"

    # --- folders ----------------------------------------------------------------------------
    def ask_add_folder(self) -> None:
        path = open_folder(self, "Add a folder of GGUF models")
        if path:
            self.add_folder(path)

    def add_folder(self, path: str) -> None:
        if path in self.user_folders:
            return
        self.user_folders.append(path)
        self.folder_list.addItem(path)
        self.foldersChanged.emit(list(self.user_folders))
        self.rescan()

    def remove_selected_folder(self) -> None:
        row = self.folder_list.currentRow()
        if row < 0:
            return
        self.folder_list.takeItem(row)
        del self.user_folders[row]
        self.foldersChanged.emit(list(self.user_folders))
        self.rescan()

    # --- scanning ---------------------------------------------------------------------------
    def rescan(self) -> None:
        self.status.setText("Scanning…")
        self.rescan_button.setEnabled(False)
        self.runner.scan(self.user_folders)

    def _on_scanned(self, summaries: list, seconds: float) -> None:
        self.rescan_button.setEnabled(True)
        self.summaries = summaries
        self.predictions = {}  # free memory changes between scans: predict again
        self._fill()
        runnable = [s.path for s in summaries if s.supported and not s.error]
        if self.predictor is not None and runnable:
            n_ctx, cache_type, threads = self.load_options
            self.predictor.request(runnable, n_ctx, cache_type, threads)
        broken = sum(1 for s in summaries if s.error)
        unsupported = sum(1 for s in summaries if not s.error and not s.supported)
        parts = [f"{len(summaries)} GGUF files ({seconds * 1000:.0f} ms)"]
        if unsupported:
            parts.append(f"{unsupported} not runnable by this engine")
        if broken:
            parts.append(f"{broken} unreadable")
        self.status.setText(", ".join(parts))
        if self._select_after_scan is not None:
            self.select_path(self._select_after_scan)
            self._select_after_scan = None
            self.tabs.setCurrentIndex(0)

    def _on_downloaded(self, path: str) -> None:
        """A new file in the HF cache: rescan, show the library with it selected."""
        self._select_after_scan = path
        self.rescan()

    def _on_failed(self, message: str) -> None:
        self.rescan_button.setEnabled(True)
        self.status.setText(message)

    def _fill(self) -> None:
        self.table.setSortingEnabled(False)
        self.table.setRowCount(len(self.summaries))
        for row, s in enumerate(self.summaries):
            runs = "yes" if s.supported else ("unreadable" if s.error else "no")
            # "org/repo/file.gguf" (HF cache, LM Studio) -> the file, and the repo under "Found in"
            where, _, file_name = s.display_name.rpartition("/")
            cells = [
                QTableWidgetItem(file_name),
                QTableWidgetItem(s.architecture or ""),
                _SortKeyItem(human_count(s.parameters), s.parameters or 0),
                QTableWidgetItem(s.quant or ""),
                _SortKeyItem(human_size(s.size), s.size),
                _SortKeyItem(
                    f"{s.context_length:,}" if s.context_length else "", s.context_length or 0
                ),
                QTableWidgetItem("yes" if s.has_chat_template else ("" if s.error else "no")),
                QTableWidgetItem(runs),
                _SortKeyItem(PREDICTING if s.supported and not s.error else "", 0),
                QTableWidgetItem(f"{s.source}: {where}" if where else s.source),
            ]
            tip = "\n".join(
                filter(
                    None,
                    [
                        s.path,
                        s.name and f"name: {s.name}",
                        s.quant_mix and f"tensor types: {quant_mix_text(s)}",
                        s.unsupported_reason and f"not runnable: {s.unsupported_reason}",
                        s.error and f"unreadable: {s.error}",
                    ],
                )
            )
            for col, item in enumerate(cells):
                item.setToolTip(tip)
                item.setData(Qt.UserRole, s.path)
                if not s.supported:
                    item.setForeground(Qt.gray)
                self.table.setItem(row, col, item)
        self.table.setSortingEnabled(True)
        self._apply_filter(self.filter_edit.text())

    # --- will it run here? ------------------------------------------------------------------
    def _prediction_item(self, path: str) -> QTableWidgetItem | None:
        for row in range(self.table.rowCount()):
            if self.table.item(row, 0).data(Qt.UserRole) == path:
                return self.table.item(row, PREDICTION_COLUMN)
        return None

    def _on_predicted(self, path: str, prediction) -> None:
        self.predictions[path] = prediction
        item = self._prediction_item(path)
        if item is None:  # a file of an older scan
            return
        sorting = self.table.isSortingEnabled()
        self.table.setSortingEnabled(False)  # a changed key must not move rows under us
        if isinstance(item, _SortKeyItem):
            item.key = prediction.memory_bytes
        item.setToolTip(prediction_tip(prediction))
        if prediction.fits is False:  # the colour alone would not reach every reader
            item.setText(f"⚠ {prediction.summary()}: too big")
            item.setForeground(QBrush(QColor(text_color(self.palette(), "bad"))))
        else:
            item.setText(prediction.summary())
        self.table.setSortingEnabled(sorting)
        selected = self.selected_summary()
        if selected is not None and selected.path == path:
            self._on_selection()

    def _on_prediction_failed(self, path: str, message: str) -> None:
        self.predictions[path] = message
        item = self._prediction_item(path)
        if item is not None:
            item.setText("no estimate")
            item.setToolTip(f"No estimate: {message}")

    def _apply_filter(self, text: str) -> None:
        words = text.lower().split()
        for row in range(self.table.rowCount()):
            haystack = " ".join(
                (self.table.item(row, c).text() if self.table.item(row, c) else "")
                for c in range(self.table.columnCount())
            ).lower()
            self.table.setRowHidden(row, not all(w in haystack for w in words))

    def visible_paths(self) -> list[str]:
        return [
            self.table.item(row, 0).data(Qt.UserRole)
            for row in range(self.table.rowCount())
            if not self.table.isRowHidden(row)
        ]

    # --- choosing ---------------------------------------------------------------------------
    def selected_summary(self) -> ModelFileSummary | None:
        rows = self.table.selectionModel().selectedRows()
        if not rows:
            return None
        path = self.table.item(rows[0].row(), 0).data(Qt.UserRole)
        return next((s for s in self.summaries if s.path == path), None)

    def select_path(self, path: str) -> None:
        for row in range(self.table.rowCount()):
            if self.table.item(row, 0).data(Qt.UserRole) == path:
                self.table.selectRow(row)
                return

    def _on_selection(self) -> None:
        s = self.selected_summary()
        self.open_button.setEnabled(bool(s and s.supported))
        if s is None:
            self.detail.setText("")
        elif s.error:
            self.detail.setText(
                f"<b>Cannot be read:</b> {html.escape(s.error)}<br>{html.escape(s.path)}"
            )
        elif not s.supported:
            reason = html.escape(s.unsupported_reason or "")
            self.detail.setText(
                f"<b>This engine cannot run it:</b> {reason}<br>{html.escape(s.path)}"
            )
        else:
            predicted = self.predictions.get(s.path)
            line = ""
            if predicted is not None and not isinstance(predicted, str):
                warn = text_color(self.palette(), "bad")
                text = html.escape(prediction_tip(predicted)).replace("\n", "<br>")
                line = (
                    f"<br><span style='color:{warn}'>{text}</span>"
                    if predicted.fits is False
                    else f"<br>{text}"
                )
            self.detail.setText(
                f"{html.escape(s.path)}<br>Tensor types: {html.escape(quant_mix_text(s))}{line}"
            )

    def open_selected(self) -> None:
        s = self.selected_summary()
        if s is not None and s.supported:
            self.openRequested.emit(s.path)
            self.accept()
