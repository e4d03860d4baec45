"""Settings > Connections: the OpenAI-compatible servers the app can chat with.

Each connection has a name, a base URL (`http://127.0.0.1:8080/v1`; a URL without a path gets
`/v1`), an optional API key and a timeout. "Test connection" lists the server's `/v1/models`
(through the window's RemoteCatalog, off the GUI thread). Keys are typed here and handed to the
window, which keeps them in the keychain; this dialog never shows a stored key, only that one
is stored."""

from __future__ import annotations

import uuid

from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import (
    QDialog,
    QDialogButtonBox,
    QDoubleSpinBox,
    QFormLayout,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QListWidget,
    QPushButton,
    QVBoxLayout,
    QWidget,
)

from app.backends.connection import DEFAULT_TIMEOUT_S, normalized_base_url

UNCHANGED = None  # key_edits value: keep the stored key


class ConnectionsDialog(QDialog):
    testRequested = Signal(object, object)  # connection dict, typed key (None: the stored one)

    def __init__(
        self,
        connections: list[dict],
        stored_keys: set[str],
        key_note: str,
        parent: QWidget | None = None,
    ):
        super().__init__(parent)
        self.setWindowTitle("Settings — Connections")
        self.resize(760, 460)
        self.entries: list[dict] = [dict(c) for c in connections]
        self.stored_keys = set(stored_keys)  # ids with a key in the keychain
        self.key_edits: dict[str, str] = {}  # id -> new key ("" removes it)
        self._current: int | None = None

        self.list = QListWidget()
        self.list.setObjectName("connections_list")
        add, remove = QPushButton("Add"), QPushButton("Remove")
        add.setObjectName("add_connection")
        remove.setObjectName("remove_connection")
        add.clicked.connect(self.add_connection)
        remove.clicked.connect(self.remove_connection)
        left = QVBoxLayout()
        left.addWidget(self.list, 1)
        row = QHBoxLayout()
        row.addWidget(add)
        row.addWidget(remove)
        left.addLayout(row)

        self.name = QLineEdit()
        self.name.setPlaceholderText("e.g. GPU box")
        self.base_url = QLineEdit()
        self.base_url.setPlaceholderText("http://127.0.0.1:8080/v1")
        self.api_key = QLineEdit()
        self.api_key.setEchoMode(QLineEdit.Password)
        self.forget_key = QPushButton("Forget stored key")
        self.forget_key.setObjectName("forget_key")
        self.forget_key.clicked.connect(self._forget_key)
        self.timeout = QDoubleSpinBox()
        self.timeout.setRange(1.0, 3600.0)
        self.timeout.setDecimals(0)
        self.timeout.setSuffix(" s")
        self.timeout.setValue(DEFAULT_TIMEOUT_S)
        self.timeout.setToolTip("How long to wait for the server's first byte and for each chunk")
        form = QFormLayout()
        form.addRow("Name", self.name)
        form.addRow("Base URL", self.base_url)
        key_row = QHBoxLayout()
        key_row.addWidget(self.api_key, 1)
        key_row.addWidget(self.forget_key)
        form.addRow("API key", key_row)
        form.addRow("Timeout", self.timeout)
        self.key_note = QLabel(key_note)
        self.key_note.setObjectName("key_note")
        self.key_note.setWordWrap(True)
        self.test_button = QPushButton("Test connection")
        self.test_button.setObjectName("test_connection")
        self.test_button.clicked.connect(self.test_connection)
        self.status = QLabel()
        self.status.setObjectName("connection_status")
        self.status.setWordWrap(True)
        self.status.setTextFormat(Qt.PlainText)
        self.models = QListWidget()
        self.models.setObjectName("connection_models")
        right = QVBoxLayout()
        right.addLayout(form)
        right.addWidget(self.key_note)
        right.addWidget(self.test_button)
        right.addWidget(self.status)
        right.addWidget(self.models, 1)
        self.editor = QWidget()
        self.editor.setLayout(right)

        buttons = QDialogButtonBox(QDialogButtonBox.Ok | QDialogButtonBox.Cancel)
        buttons.accepted.connect(self.accept)
        buttons.rejected.connect(self.reject)
        body = QHBoxLayout()
        body.addLayout(left, 1)
        body.addWidget(self.editor, 2)
        root = QVBoxLayout(self)
        root.addLayout(body, 1)
        root.addWidget(buttons)

        for entry in self.entries:
            self.list.addItem(self._label(entry))
        self.list.currentRowChanged.connect(self._select)
        for field in (self.name, self.base_url, self.api_key):
            field.textEdited.connect(self._store_fields)
        self.timeout.valueChanged.connect(self._store_fields)
        if self.entries:
            self.list.setCurrentRow(0)
        else:
            self._select(-1)

    # --- editing --------------------------------------------------------------------------------
    def add_connection(self) -> None:
        entry = {
            "id": uuid.uuid4().hex[:12],
            "name": "",
            "base_url": "",
            "timeout_s": DEFAULT_TIMEOUT_S,
        }
        self.entries.append(entry)
        self.list.addItem("(new connection)")
        self.list.setCurrentRow(len(self.entries) - 1)
        self.name.setFocus()

    def remove_connection(self) -> None:
        row = self.list.currentRow()
        if row < 0:
            return
        entry = self.entries.pop(row)
        self.key_edits[entry["id"]] = ""  # its key goes too
        self._current = None
        self.list.takeItem(row)
        self._select(self.list.currentRow())

    def _select(self, row: int) -> None:
        self._current = row if 0 <= row < len(self.entries) else None
        self.editor.setEnabled(self._current is not None)
        self.models.clear()
        self.status.setText("")
        if self._current is None:
            for field in (self.name, self.base_url, self.api_key):
                field.clear()
            return
        entry = self.entries[self._current]
        self.name.setText(entry.get("name", ""))
        self.base_url.setText(entry.get("base_url", ""))
        self.timeout.setValue(float(entry.get("timeout_s") or DEFAULT_TIMEOUT_S))
        typed = self.key_edits.get(entry["id"])
        self.api_key.setText(typed or "")
        stored = entry["id"] in self.stored_keys and typed is None
        self.api_key.setPlaceholderText(
            "a key is stored (type to replace it)" if stored else "optional"
        )
        self.forget_key.setEnabled(stored)

    def _forget_key(self) -> None:
        if self._current is None:
            return
        self.key_edits[self.entries[self._current]["id"]] = ""
        self.api_key.clear()
        self.api_key.setPlaceholderText("no key (the stored one is removed on OK)")
        self.forget_key.setEnabled(False)

    def _store_fields(self, *_args) -> None:
        if self._current is None:
            return
        entry = self.entries[self._current]
        entry["name"] = self.name.text().strip()
        entry["base_url"] = self.base_url.text().strip()
        entry["timeout_s"] = float(self.timeout.value())
        key = self.api_key.text().strip()
        if key:
            self.key_edits[entry["id"]] = key
        elif entry["id"] in self.key_edits and self.key_edits[entry["id"]] != "":
            del self.key_edits[entry["id"]]  # typed and erased again: keep the stored one
        self.list.item(self._current).setText(self._label(entry))

    @staticmethod
    def _label(entry: dict) -> str:
        return entry.get("name") or entry.get("base_url") or "(new connection)"

    # --- testing --------------------------------------------------------------------------------
    def test_connection(self) -> None:
        if self._current is None:
            return
        self._store_fields()
        entry = self._checked(self.entries[self._current])
        if entry is None:
            return
        self.models.clear()
        self.status.setText(f"Testing {entry['base_url']}…")
        self.test_button.setEnabled(False)
        # a typed key, "" for a forgotten one (test without), or UNCHANGED for the stored one
        self.testRequested.emit(entry, self.key_edits.get(entry["id"], UNCHANGED))

    def show_test_result(self, connection_id: str, models: list, error: str) -> None:
        self.test_button.setEnabled(True)
        if self._current is None or self.entries[self._current]["id"] != connection_id:
            return
        self.models.clear()
        if error:
            self.status.setText(error)
            return
        self.status.setText(f"Connected: {len(models)} model(s) on this server.")
        for model in models:
            self.models.addItem(model.id if hasattr(model, "id") else str(model))

    # --- result ---------------------------------------------------------------------------------
    def _checked(self, entry: dict) -> dict | None:
        try:
            url = normalized_base_url(entry.get("base_url", ""))
        except ValueError as exc:
            self.status.setText(f"{self._label(entry)}: {exc}")
            return None
        return {
            **entry,
            "base_url": url,
            "name": entry.get("name") or url.split("://", 1)[-1].split("/", 1)[0],
        }

    def accept(self) -> None:
        self._store_fields()
        checked = []
        for row, entry in enumerate(self.entries):
            good = self._checked(entry)
            if good is None:
                self.list.setCurrentRow(row)
                self._checked(entry)  # the status line names the problem
                return
            checked.append(good)
        self.entries = checked
        super().accept()

    def result_connections(self) -> list[dict]:
        return [dict(e) for e in self.entries]
