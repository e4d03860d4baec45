"""Chats list: search, new, rename, delete."""

from __future__ import annotations

from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import (
    QHBoxLayout,
    QInputDialog,
    QLabel,
    QLineEdit,
    QListWidget,
    QListWidgetItem,
    QMessageBox,
    QPushButton,
    QVBoxLayout,
    QWidget,
)

from app.store import Conversation


class Sidebar(QWidget):
    conversationSelected = Signal(int)
    newRequested = Signal()
    renameRequested = Signal(int, str)
    deleteRequested = Signal(int)
    searchChanged = Signal(str)

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(6, 6, 6, 6)
        self.new_button = QPushButton("+ New chat")
        self.new_button.setToolTip("Start a new conversation (Ctrl+N)")
        self.new_button.clicked.connect(self.newRequested)
        self.search = QLineEdit()
        self.search.setPlaceholderText("Search chats…")
        self.search.setClearButtonEnabled(True)
        self.search.textChanged.connect(self.searchChanged)
        self.list = QListWidget()
        self.list.setHorizontalScrollBarPolicy(Qt.ScrollBarAlwaysOff)
        self.list.setTextElideMode(Qt.ElideRight)
        self.list.setUniformItemSizes(True)
        self.list.currentItemChanged.connect(self._on_current)
        self.list.itemDoubleClicked.connect(lambda item: self.ask_rename())
        buttons = QHBoxLayout()
        self.rename_button = QPushButton("Rename")
        self.rename_button.clicked.connect(self.ask_rename)
        self.delete_button = QPushButton("Delete")
        self.delete_button.clicked.connect(self.ask_delete)
        buttons.addWidget(self.rename_button)
        buttons.addWidget(self.delete_button)
        title = QLabel("<b>Chats</b>")
        layout.addWidget(title)
        layout.addWidget(self.new_button)
        layout.addWidget(self.search)
        layout.addWidget(self.list, 1)
        layout.addLayout(buttons)
        self._updating = False

    def set_conversations(self, conversations: list[Conversation], current_id: int | None) -> None:
        self._updating = True
        self.list.clear()
        for conv in conversations:
            item = QListWidgetItem(conv.title)
            item.setData(Qt.UserRole, conv.id)
            item.setToolTip(conv.title)
            self.list.addItem(item)
            if conv.id == current_id:
                self.list.setCurrentItem(item)
        self._updating = False

    def current_id(self) -> int | None:
        item = self.list.currentItem()
        return item.data(Qt.UserRole) if item else None

    def _on_current(self, item, _previous) -> None:
        if item is not None and not self._updating:
            self.conversationSelected.emit(item.data(Qt.UserRole))

    def ask_rename(self) -> None:
        item = self.list.currentItem()
        if item is None:
            return
        title, ok = QInputDialog.getText(self, "Rename chat", "New name:", text=item.text())
        if ok and title.strip():
            self.renameRequested.emit(item.data(Qt.UserRole), title.strip())

    def ask_delete(self) -> None:
        item = self.list.currentItem()
        if item is None:
            return
        answer = QMessageBox.question(
            self,
            "Delete chat",
            f"Delete “{item.text()}” and all its messages?",
            QMessageBox.Yes | QMessageBox.No,
            QMessageBox.No,
        )
        if answer == QMessageBox.Yes:
            self.deleteRequested.emit(item.data(Qt.UserRole))
