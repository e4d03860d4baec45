"""Projects and search in the chats list (issue 35): the wiring between the sidebar, the store
and the session.

- The sidebar shows projects with their chats, then the chats in no project; with text in the
  search box it shows the matching chats (FTS5 over titles and message text, Store.search) with
  a snippet each, and opening one opens that chat.
- New / rename / delete project, a chat dragged (or moved with its menu) into a project or out,
  and the project settings dialog all write to the store here and rebuild the list. Deleting a
  project keeps its chats: they move out of it.
- A chat in a project uses the project's system prompt, tools, default model and preset when it
  has none of its own (ChatSession, app/project_settings.py). Here the window says so: the
  system prompt field shows the project's prompt as its placeholder, naming the project, and
  the tools and preset are resolved again when the open chat's project changes.
Every refused write (a bad name, a full disk) is shown as a message; the store is unchanged.
"""

from __future__ import annotations

from collections.abc import Callable

from PySide6.QtCore import QObject
from PySide6.QtWidgets import QLineEdit, QWidget

from app.names import InvalidNameError
from app.project_settings import SOURCE_PROJECT
from app.session import ChatSession, describe_write_error
from app.settings import Settings
from app.store import Conversation, Store, StoreError, StoreWriteError
from app.views.project_dialog import ProjectDialog
from app.views.sidebar import KIND_PROJECT, Sidebar

PROMPT_PLACEHOLDER = "System prompt for this chat (optional)"


class ProjectsFeature(QObject):
    def __init__(
        self,
        store: Store,
        session: ChatSession,
        sidebar: Sidebar,
        system_prompt: QLineEdit,
        settings: Settings,
        show_error: Callable[[str, str], None],
        parent: QWidget | None = None,
    ):
        super().__init__(parent)
        self.store, self.session, self.sidebar = store, session, sidebar
        self.system_prompt, self.settings, self.show_error = system_prompt, settings, show_error
        self.dialog: ProjectDialog | None = None  # the open settings dialog (tests reach it)
        sidebar.projectCreateRequested.connect(self.create_project)
        sidebar.projectRenameRequested.connect(self.rename_project)
        sidebar.projectDeleteRequested.connect(self.delete_project)
        sidebar.projectSettingsRequested.connect(self.edit_project)
        sidebar.newChatInProjectRequested.connect(self.new_chat_in_project)
        sidebar.chatMoveRequested.connect(self.move_chat)
        session.conversationOpened.connect(lambda conv, _messages: self.show_sources(conv))
        if not store.search_uses_fts:
            # this Python's SQLite lacks FTS5 (app/store.py): say what search does instead
            sidebar.search.setPlaceholderText("Search chats (exact text)…")
            sidebar.search.setToolTip(
                "Full-text search needs SQLite's FTS5, which this Python's SQLite lacks: chats are "
                "matched on the exact text typed, accents and word order included."
            )
        system_prompt.textChanged.connect(lambda _text: self._show_open_chat_sources())

    # --- the list -------------------------------------------------------------------------------
    def refresh(self) -> None:
        """Rebuild the list from the store: the tree, or the search hits while searching."""
        current = self.session.conversation_id
        projects = self.store.projects()
        text = self.sidebar.search_text()  # the last search run, not a half-typed word
        if text.strip():
            self.sidebar.set_projects(projects)
            self.sidebar.set_search_results(self.store.search(text), current)
        else:
            self.sidebar.set_conversations(self.store.list_conversations(), current, projects)

    def _write(self, action: Callable[[], object], what: str) -> bool:
        """Run a store write; a refusal is shown (the store is unchanged) and gives False."""
        try:
            action()
        except InvalidNameError as exc:
            self.show_error(what, str(exc))
            return False
        except StoreWriteError as exc:
            self.show_error(what, describe_write_error(exc))
            return False
        except StoreError as exc:
            self.show_error(what, str(exc))
            self.refresh()  # e.g. the project was deleted meanwhile
            return False
        return True

    # --- projects -------------------------------------------------------------------------------
    def create_project(self, name: str) -> int | None:
        created: list[int] = []
        if not self._write(lambda: created.append(self.store.create_project(name)), "New project"):
            return None
        self.refresh()
        item = self.sidebar.item_for(KIND_PROJECT, created[0])
        if item is not None:
            self.sidebar.tree.setCurrentItem(item)
        return created[0]

    def rename_project(self, project_id: int, name: str) -> None:
        if self._write(lambda: self.store.rename_project(project_id, name), "Rename project"):
            self.refresh()
            self._show_open_chat_sources()

    def delete_project(self, project_id: int) -> None:
        if self._write(lambda: self.store.delete_project(project_id), "Delete project"):
            self.refresh()
            self._open_chat_defaults_changed()

    def edit_project(self, project_id: int) -> bool:
        """The settings dialog; OK writes name, prompt and settings in that order."""
        project = self.store.project(project_id)
        if project is None:
            self.refresh()
            return False
        registry = self.session.tool_registry
        tools = registry.builtin_rows() + [
            tool for server in registry.snapshot() for tool in server["tools"]
        ]
        self.dialog = ProjectDialog(
            project, list(self.settings.recent_models), tools, self.parent()
        )
        try:
            if self.dialog.exec() != ProjectDialog.Accepted:
                return False
            d = self.dialog

            def write() -> None:
                self.store.rename_project(project_id, d.result_name)
                self.store.set_project_system_prompt(project_id, d.result_prompt)
                self.store.set_project_settings(project_id, d.result_settings)

            if not self._write(write, "Project settings"):
                return False
        finally:
            self.dialog = None
        self.refresh()
        self._open_chat_defaults_changed()
        return True

    def new_chat_in_project(self, project_id: int) -> None:
        if self.store.project(project_id) is not None:
            self.session.new_conversation(project_id)

    def move_chat(self, conversation_id: int, project_id: int | None) -> None:
        conv = self.store.conversation(conversation_id)
        if conv is None or conv.project_id == project_id:
            return
        if self._write(
            lambda: self.store.move_conversation(conversation_id, project_id), "Move chat"
        ):
            self.refresh()
            if conversation_id == self.session.conversation_id:
                self._open_chat_defaults_changed()

    # --- where the open chat's values come from ---------------------------------------------------
    def _open_chat_defaults_changed(self) -> None:
        self.session.refresh_chat_defaults()
        self._show_open_chat_sources()

    def _show_open_chat_sources(self) -> None:
        cid = self.session.conversation_id
        conv = self.store.conversation(cid) if cid is not None else None
        if conv is not None:
            self.show_sources(conv)

    def show_sources(self, conversation: Conversation) -> None:
        """The system prompt field: a chat without its own prompt shows its project's as the
        placeholder, with the project's name; typing one replaces it for this chat only."""
        defaults = self.store.chat_defaults(conversation.id)
        if defaults.project is None:
            self.system_prompt.setPlaceholderText(PROMPT_PLACEHOLDER)
            self.system_prompt.setToolTip(PROMPT_PLACEHOLDER)
            return
        where = defaults.source_text(SOURCE_PROJECT)
        if defaults.system_prompt_source == SOURCE_PROJECT:
            self.system_prompt.setPlaceholderText(f"From {where}: {defaults.system_prompt}")
            self.system_prompt.setToolTip(
                f"This chat uses the system prompt of {where}:\n\n{defaults.system_prompt}\n\n"
                "Type a prompt here to give this chat its own."
            )
        else:
            self.system_prompt.setPlaceholderText(
                f"System prompt for this chat (else the one of {where})"
            )
            self.system_prompt.setToolTip(
                f"This chat is in {where}. Its own system prompt, when it has one, comes first."
            )
