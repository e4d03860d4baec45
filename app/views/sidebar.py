"""Chats list: projects with their chats, then the chats in no project; search over titles and
message text with a snippet per hit; new, rename, delete; chats dragged between projects.

The sidebar only shows and asks: every change goes out as a signal (app/features/projects.py
and MainWindow carry it out) and the tree is rebuilt from the store afterwards, so what it shows
is always what is stored. Names typed here are checked with app.names.clean_name before they
leave: a refused name is asked for again with the reason and the text as typed.
"""

from __future__ import annotations

import html

from PySide6.QtCore import QPoint, Qt, QTimer, Signal
from PySide6.QtGui import QDropEvent
from PySide6.QtWidgets import (
    QAbstractItemView,
    QHBoxLayout,
    QInputDialog,
    QLabel,
    QLineEdit,
    QMenu,
    QMessageBox,
    QPushButton,
    QStyle,
    QToolButton,
    QTreeWidget,
    QTreeWidgetItem,
    QVBoxLayout,
    QWidget,
)

from app.names import NAME_MAX_CHARS, InvalidNameError, clean_name
from app.project_settings import Project
from app.store import SNIPPET_MARK, Conversation, SearchHit

# Item data (Qt.UserRole): ("chat", conversation id) or ("project", project id); search hits
# also hold the matching message id at HIT_ROLE.
KIND_CHAT, KIND_PROJECT = "chat", "project"
HIT_ROLE = Qt.UserRole + 1
PROJECT_ROLE = Qt.UserRole + 2  # a chat row's project id (None: in none)
NAME_ROLE = Qt.UserRole + 3  # the row's name as stored (a hit row draws it in a label)
# A search runs this long after the last keystroke (Enter: at once). One query took 0.3-0.5 s
# for a one-letter prefix on a large store, and ran for every letter typed.
SEARCH_DEBOUNCE_MS = 200


def ask_name(parent: QWidget, title: str, label: str, text: str, what: str) -> str | None:
    """Ask for a name until it is one clean_name accepts (each refusal says why and keeps the
    text as typed) or the user cancels (None)."""
    while True:
        typed, ok = QInputDialog.getText(parent, title, label, text=text)
        if not ok:
            return None
        try:
            return clean_name(typed, what)
        except InvalidNameError as exc:
            QMessageBox.warning(parent, title, str(exc))
            text = typed[: NAME_MAX_CHARS * 2]  # enough to fix it, not 10,000 chars in a line edit


def snippet_html(snippet: str) -> str:
    """A search snippet as rich text: escaped, with the matched words bold."""
    start, end = SNIPPET_MARK
    escaped = html.escape(" ".join(snippet.split()))  # one line: no line breaks from messages
    return escaped.replace(start, "<b>").replace(end, "</b>")


class ChatTree(QTreeWidget):
    """The tree; a chat dropped on a project (or on a chat in it) moves there, one dropped
    anywhere else moves out of its project. The drop only asks (chatDropped): the store moves
    it and the tree is rebuilt, so Qt's own item move is never done."""

    chatDropped = Signal(int, object)  # conversation id, project id or None

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        self.setHeaderHidden(True)
        self.setColumnCount(1)
        self.setSelectionMode(QAbstractItemView.SingleSelection)
        self.setDragEnabled(True)
        self.setAcceptDrops(True)
        self.setDropIndicatorShown(True)
        self.setDragDropMode(QAbstractItemView.InternalMove)
        self.setHorizontalScrollBarPolicy(Qt.ScrollBarAlwaysOff)
        self.setTextElideMode(Qt.ElideRight)
        self.setIndentation(14)

    def project_at(self, pos: QPoint) -> int | None:
        """The project a drop at `pos` (viewport coordinates) puts a chat in."""
        item = self.itemAt(pos)
        while item is not None:
            kind, ident = item.data(0, Qt.UserRole)
            if kind == KIND_PROJECT:
                return ident
            item = item.parent()
        return None

    def dragMoveEvent(self, event) -> None:
        super().dragMoveEvent(event)
        if event.source() is self:  # anywhere in the tree is a place to drop a chat
            event.setDropAction(Qt.MoveAction)
            event.accept()

    def dropEvent(self, event: QDropEvent) -> None:
        dragged = [i for i in self.selectedItems() if i.data(0, Qt.UserRole)[0] == KIND_CHAT]
        if event.source() is not self or not dragged:
            event.ignore()
            return
        event.setDropAction(Qt.IgnoreAction)  # the rebuild shows the move, not Qt
        event.accept()
        project = self.project_at(event.position().toPoint())
        self.chatDropped.emit(dragged[0].data(0, Qt.UserRole)[1], project)


class Sidebar(QWidget):
    conversationSelected = Signal(int)
    newRequested = Signal()
    renameRequested = Signal(int, str)
    deleteRequested = Signal(int)
    searchChanged = Signal(str)
    # projects (app/features/projects.py)
    projectCreateRequested = Signal(str)  # a clean name
    projectRenameRequested = Signal(int, str)
    projectDeleteRequested = Signal(int)
    projectSettingsRequested = Signal(int)
    newChatInProjectRequested = Signal(int)
    chatMoveRequested = Signal(int, object)  # conversation id, project id or None
    searchHitOpened = Signal(int, object)  # conversation id, message id or None (title hit)

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(6, 6, 6, 6)
        self.new_button = QPushButton("+ New chat")
        self.new_button.setToolTip("Start a new conversation (Ctrl+N)")
        self.new_button.clicked.connect(self.newRequested)
        # An icon beside the title, not a second labelled button beside "+ New chat": the list
        # must stay narrow enough for the chat at large font sizes (tests/test_app_layout.py).
        self.new_project_button = QToolButton()
        self.new_project_button.setIcon(self.style().standardIcon(QStyle.SP_FileDialogNewFolder))
        self.new_project_button.setAutoRaise(True)
        self.new_project_button.setAccessibleName("New project")
        self.new_project_button.setToolTip(
            "New project: a project groups chats and gives them its own system prompt, model, "
            "preset and tools"
        )
        self.new_project_button.clicked.connect(self.ask_new_project)
        self.search = QLineEdit()
        self.search.setPlaceholderText("Search chats and messages…")
        self.search.setClearButtonEnabled(True)
        self._searched = ""  # the text of the search last run (searchChanged), "" for none
        self._search_timer = QTimer(self)
        self._search_timer.setSingleShot(True)
        self._search_timer.setInterval(SEARCH_DEBOUNCE_MS)
        self._search_timer.timeout.connect(self.search_now)
        self.search.textChanged.connect(self._search_edited)
        self.search.returnPressed.connect(self.search_now)
        self.tree = ChatTree()
        self.tree.currentItemChanged.connect(self._on_current)
        self.tree.itemDoubleClicked.connect(lambda item, _column: self._double_clicked(item))
        self.tree.chatDropped.connect(self.chatMoveRequested)
        self.tree.setContextMenuPolicy(Qt.CustomContextMenu)
        self.tree.customContextMenuRequested.connect(self._context_menu)
        self.empty_label = QLabel()
        self.empty_label.setWordWrap(True)
        self.empty_label.setAlignment(Qt.AlignCenter)
        self.empty_label.hide()
        buttons = QHBoxLayout()
        self.rename_button = QPushButton("Rename")
        self.rename_button.clicked.connect(self.ask_rename)
        self.delete_button = QPushButton("Delete")
        self.delete_button.clicked.connect(self.ask_delete)
        buttons.addWidget(self.rename_button)
        buttons.addWidget(self.delete_button)
        title_row = QHBoxLayout()
        title_row.addWidget(QLabel("<b>Chats</b>"), 1)
        title_row.addWidget(self.new_project_button)
        layout.addLayout(title_row)
        layout.addWidget(self.new_button)
        layout.addWidget(self.search)
        layout.addWidget(self.tree, 1)
        layout.addWidget(self.empty_label)
        layout.addLayout(buttons)
        self._updating = False
        self._projects: dict[int, Project] = {}
        self._collapsed: set[int] = set()  # projects the user closed, kept across rebuilds
        self.tree.itemCollapsed.connect(lambda item: self._remember_expanded(item, False))
        self.tree.itemExpanded.connect(lambda item: self._remember_expanded(item, True))

    # --- filling ----------------------------------------------------------------------------------
    def set_conversations(
        self,
        conversations: list[Conversation],
        current_id: int | None,
        projects: list[Project] | None = None,
    ) -> None:
        """Projects (in their order, each with its chats, newest first), then the chats in no
        project. A chat whose project is not in `projects` shows among those in none."""
        self._begin()
        self.set_projects(projects or [])
        folder = self.style().standardIcon(QStyle.SP_DirIcon)
        project_items: dict[int, QTreeWidgetItem] = {}
        for project in projects or []:
            item = QTreeWidgetItem([project.name])
            item.setData(0, Qt.UserRole, (KIND_PROJECT, project.id))
            item.setData(0, NAME_ROLE, project.name)
            item.setIcon(0, folder)
            font = item.font(0)
            font.setBold(True)
            item.setFont(0, font)
            # a drop target, not draggable itself
            item.setFlags(Qt.ItemIsEnabled | Qt.ItemIsSelectable | Qt.ItemIsDropEnabled)
            self.tree.addTopLevelItem(item)
            project_items[project.id] = item
        current = None
        counts: dict[int, int] = {}
        for conv in conversations:
            parent = project_items.get(conv.project_id) if conv.project_id is not None else None
            item = self._chat_item(conv)
            if parent is not None:
                parent.addChild(item)
                counts[conv.project_id] = counts.get(conv.project_id, 0) + 1  # type: ignore[index]
            else:
                self.tree.addTopLevelItem(item)
            if conv.id == current_id:
                current = item
        for pid, item in project_items.items():
            n = counts.get(pid, 0)
            item.setToolTip(0, f"{item.text(0)}: {n} chat{'s' if n != 1 else ''}")
            item.setExpanded(pid not in self._collapsed)
        if current is not None:
            if current.parent() is not None:
                current.parent().setExpanded(True)
            self.tree.setCurrentItem(current)
        self._end("" if conversations or projects else "No chats yet: type a message to start one.")

    # --- search -------------------------------------------------------------------------------
    def _search_edited(self, text: str) -> None:
        if text.strip():
            self._search_timer.start()  # restarts: only the last keystroke's text is searched
        elif self._searched.strip():
            self.search_now()  # cleared: the whole list comes back at once (no query to wait for)
        else:
            self._search_timer.stop()  # typed and erased before a search ran: nothing to undo

    def search_now(self) -> None:
        """Search for the box's text now (Enter, or the pause after typing)."""
        self._search_timer.stop()
        self._searched = self.search.text()
        self.searchChanged.emit(self._searched)

    def search_text(self) -> str:
        """The text the list shows hits for ("" or blank: the list is not a search), which
        lags the box while a search is waiting for the typing to pause."""
        return self._searched

    def set_projects(self, projects: list[Project]) -> None:
        """The projects (for search hits' project names and the Move menu)."""
        self._projects = {p.id: p for p in projects}

    def set_search_results(self, hits: list[SearchHit], current_id: int | None) -> None:
        """The chats that match, newest first, each with its title, its project and the text
        around the match (matched words bold)."""
        self._begin()
        current = None
        for hit in hits:
            conv = hit.conversation
            item = self._chat_item(conv)
            item.setData(0, HIT_ROLE, hit.message_id)
            self.tree.addTopLevelItem(item)
            project = self._projects.get(conv.project_id) if conv.project_id else None
            where = f"in {html.escape(project.name)} · " if project else ""
            label = QLabel(
                f"<b>{html.escape(conv.title)}</b><br>"
                f"<small>{where}{snippet_html(hit.snippet)}</small>"
            )
            label.setTextFormat(Qt.RichText)
            label.setWordWrap(True)
            label.setAttribute(Qt.WA_TransparentForMouseEvents)  # clicks select the row
            label.setContentsMargins(2, 2, 2, 4)
            item.setText(0, "")  # the label draws it; the title stays in the tooltip and data
            item.setData(0, Qt.AccessibleTextRole, conv.title)
            self.tree.setItemWidget(item, 0, label)
            item.setSizeHint(0, label.sizeHint())
            if conv.id == current_id:
                current = item
        if current is not None:
            self.tree.setCurrentItem(current)
        self._end("" if hits else f"Nothing matches “{self._searched.strip()}”.")

    def _chat_item(self, conv: Conversation) -> QTreeWidgetItem:
        item = QTreeWidgetItem([conv.title])
        item.setData(0, Qt.UserRole, (KIND_CHAT, conv.id))
        item.setData(0, PROJECT_ROLE, conv.project_id)
        item.setData(0, NAME_ROLE, conv.title)
        item.setToolTip(0, conv.title)
        item.setFlags(
            Qt.ItemIsEnabled | Qt.ItemIsSelectable | Qt.ItemIsDragEnabled | Qt.ItemIsDropEnabled
        )
        return item

    def _begin(self) -> None:
        self._updating = True
        self.tree.clear()

    def _end(self, empty_text: str) -> None:
        self.empty_label.setText(empty_text)
        self.empty_label.setVisible(bool(empty_text))
        self._updating = False

    def _remember_expanded(self, item: QTreeWidgetItem, expanded: bool) -> None:
        kind, ident = item.data(0, Qt.UserRole)
        if kind == KIND_PROJECT and not self._updating:
            (self._collapsed.discard if expanded else self._collapsed.add)(ident)

    # --- reading ----------------------------------------------------------------------------------
    def chat_items(self) -> list[QTreeWidgetItem]:
        """The chat rows, top to bottom (inside projects too)."""
        items = []
        for i in range(self.tree.topLevelItemCount()):
            top = self.tree.topLevelItem(i)
            if top.data(0, Qt.UserRole)[0] == KIND_CHAT:
                items.append(top)
            items.extend(top.child(j) for j in range(top.childCount()))
        return items

    def project_items(self) -> list[QTreeWidgetItem]:
        items = [self.tree.topLevelItem(i) for i in range(self.tree.topLevelItemCount())]
        return [i for i in items if i.data(0, Qt.UserRole)[0] == KIND_PROJECT]

    def item_for(self, kind: str, ident: int) -> QTreeWidgetItem | None:
        for item in self.project_items() + self.chat_items():
            if item.data(0, Qt.UserRole) == (kind, ident):
                return item
        return None

    def current_id(self) -> int | None:
        """The selected chat's id (None when a project or nothing is selected)."""
        kind, ident = self._current()
        return ident if kind == KIND_CHAT else None

    def current_project_id(self) -> int | None:
        """The selected project, or the project of the selected chat."""
        item = self.tree.currentItem()
        while item is not None:
            kind, ident = item.data(0, Qt.UserRole)
            if kind == KIND_PROJECT:
                return ident
            item = item.parent()
        return None

    def _current(self) -> tuple[str | None, int | None]:
        item = self.tree.currentItem()
        return item.data(0, Qt.UserRole) if item is not None else (None, None)

    def _on_current(self, item, _previous) -> None:
        if item is None or self._updating:
            return
        kind, ident = item.data(0, Qt.UserRole)
        if kind != KIND_CHAT:
            return
        # read before emitting: opening the chat rebuilds the list, deleting `item`
        searching = bool(self._searched.strip())  # the rows are hits, not the whole list
        message_id = item.data(0, HIT_ROLE) if searching else None
        self.conversationSelected.emit(ident)
        if searching:
            self.searchHitOpened.emit(ident, message_id)

    def _double_clicked(self, item: QTreeWidgetItem) -> None:
        row = self._row(item)
        if row is not None and row[0] == KIND_CHAT:
            self.ask_rename(row)
        elif row is not None:
            self.projectSettingsRequested.emit(row[1])

    # --- asking -----------------------------------------------------------------------------------
    def ask_new_project(self) -> None:
        name = ask_name(self, "New project", "Project name:", "", "project name")
        if name is not None:
            self.projectCreateRequested.emit(name)

    def _row(self, item: QTreeWidgetItem | None) -> tuple[str, int, str, int] | None:
        """(kind, id, name, number of chats) of a row, read at once: opening a chat rebuilds the
        list, so an item is not to be used after anything that may open one."""
        if item is None:
            return None
        kind, ident = item.data(0, Qt.UserRole)
        return kind, ident, item.data(0, NAME_ROLE), item.childCount()

    def ask_rename(self, row: tuple[str, int, str, int] | None = None) -> None:
        """Rename `row` (default: the selected one), asking for the new name."""
        row = row or self._row(self.tree.currentItem())
        if row is None:
            return
        kind, ident, name, _n = row
        if kind == KIND_PROJECT:
            new = ask_name(self, "Rename project", "New name:", name, "project name")
            if new is not None:
                self.projectRenameRequested.emit(ident, new)
            return
        new = ask_name(self, "Rename chat", "New name:", name, "chat title")
        if new is not None:
            self.renameRequested.emit(ident, new)

    def ask_delete(self, row: tuple[str, int, str, int] | None = None) -> None:
        """Delete `row` (default: the selected one) once the user confirms."""
        row = row or self._row(self.tree.currentItem())
        if row is None:
            return
        kind, ident, name, n = row
        if kind == KIND_PROJECT:
            chats = f"Its {n} chat{'s' if n != 1 else ''} stay" if n else "It has no chats"
            answer = QMessageBox.question(
                self,
                "Delete project",
                f"Delete the project “{name}” and its settings? {chats}, outside any project.",
                QMessageBox.Yes | QMessageBox.No,
                QMessageBox.No,
            )
            if answer == QMessageBox.Yes:
                self.projectDeleteRequested.emit(ident)
            return
        answer = QMessageBox.question(
            self,
            "Delete chat",
            f"Delete “{name}” and all its messages?",
            QMessageBox.Yes | QMessageBox.No,
            QMessageBox.No,
        )
        if answer == QMessageBox.Yes:
            self.deleteRequested.emit(ident)

    def _context_menu(self, pos: QPoint) -> None:
        item = self.tree.itemAt(pos)
        menu = self.context_menu(item)
        if menu is not None:
            menu.exec(self.tree.viewport().mapToGlobal(pos))

    def context_menu(self, item: QTreeWidgetItem | None) -> QMenu | None:
        """The menu for a row: a project's (new chat in it, settings, rename, delete) or a chat's
        (move to a project or out, rename, delete)."""
        menu = QMenu(self)
        row = self._row(item)
        if row is None:
            menu.addAction("New project…", self.ask_new_project)
            return menu
        kind, ident = row[0], row[1]
        if kind == KIND_PROJECT:
            menu.addAction(
                "New chat in this project", lambda: self.newChatInProjectRequested.emit(ident)
            )
            menu.addAction("Project settings…", lambda: self.projectSettingsRequested.emit(ident))
            menu.addAction("Rename…", lambda: self.ask_rename(row))
            menu.addAction("Delete project…", lambda: self.ask_delete(row))
            return menu
        conv_project = item.data(0, PROJECT_ROLE) if item is not None else None
        move = menu.addMenu("Move to project")
        for project in self._projects.values():
            action = move.addAction(project.name)
            action.setCheckable(True)
            action.setChecked(project.id == conv_project)
            action.triggered.connect(
                lambda _checked=False, p=project.id: self.chatMoveRequested.emit(ident, p)
            )
        if self._projects:
            move.addSeparator()
        out = move.addAction("No project")
        out.setEnabled(conv_project is not None)
        out.triggered.connect(lambda: self.chatMoveRequested.emit(ident, None))
        menu.addAction("Rename…", lambda: self.ask_rename(row))
        menu.addAction("Delete…", lambda: self.ask_delete(row))
        return menu
