"""Export and share (issue 35): File > Export and share… and the zip half of File > Import.

Export: the dialog (app/views/export_dialog.py) gives a scope and a format; this picks the
destination (a save dialog suggesting a name from the chat or project), reads the chats on the
GUI thread (app/export_job.py snapshot_chats: a consistent copy, the store's connection stays on
its thread) and hands them to an ExportRunner, whose thread renders and writes them, reporting
chats done / total to the dialog's progress bar. Cancel stops it after the chat being written;
the destination is then as it was (the export writes a temporary file and renames it).

Import: a zip export (recognised by its bytes, not its name) is read and checked whole by
app/archive_import.py, then added in one store transaction with its projects; the caller
(MainWindow.import_from) reports errors for zips and JSON files alike."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from PySide6.QtCore import QObject
from PySide6.QtWidgets import QWidget

from app.archive_import import read_archive
from app.export import export_file_name
from app.export_job import ExportFormat, ExportScope, exported, snapshot_chats
from app.export_runner import ExportRunner
from app.store import Store
from app.views.export_dialog import ExportDialog
from app.views.file_dialogs import save_file

ALL_CHATS_NAME = "LocalChat chats"


class ExportFeature(QObject):
    def __init__(
        self,
        store: Store,
        current_chat: Callable[[], int],
        show_status: Callable[[str], None],
        show_error: Callable[[str, str], None],
        parent: QWidget,
    ):
        super().__init__(parent)
        self.store, self.current_chat = store, current_chat
        self.show_status, self.show_error = show_status, show_error
        self.window = parent
        self.dialog: ExportDialog | None = None
        self.runner = ExportRunner(self)
        self.runner.progressed.connect(self._on_progress)
        self.runner.finished.connect(self._on_finished)
        self.runner.failed.connect(self._on_failed)
        self.runner.cancelled.connect(self._on_cancelled)
        self._count = 0

    # --- which chats ----------------------------------------------------------------------------
    def chats_for(self, scope: ExportScope) -> tuple[list[int], dict[int, str]]:
        """The chat ids `scope` covers, in the sidebar's order (projects in the user's order,
        newest chat first in each; then chats in no project), and each one's project name."""
        names = {p.id: p.name for p in self.store.projects()}
        conversations = self.store.list_conversations()
        projects = {c.id: names[c.project_id] for c in conversations if c.project_id in names}
        if scope == ExportScope.CHAT:
            return [self.current_chat()], projects
        if scope == ExportScope.PROJECT:
            project_id = self._current_project()
            ids = [
                c.id for c in conversations if project_id is not None and c.project_id == project_id
            ]
            return ids, projects
        # sorted() is stable: within a project the chats stay newest first
        order: dict[int | None, int] = {pid: i for i, pid in enumerate(names)}
        ranked = sorted(conversations, key=lambda c: order.get(c.project_id, len(order)))
        return [c.id for c in ranked], projects

    def _current_project(self) -> int | None:
        conversation = self.store.conversation(self.current_chat())
        return conversation.project_id if conversation is not None else None

    # --- the dialog -----------------------------------------------------------------------------
    def open_dialog(self) -> ExportDialog:
        if self.dialog is not None and self.dialog.running:
            self.dialog.raise_()
            return self.dialog
        conversation = self.store.conversation(self.current_chat())
        project_id = conversation.project_id if conversation is not None else None
        project = self.store.project(project_id) if project_id is not None else None
        self.dialog = ExportDialog(
            conversation.title if conversation is not None else "",
            project.name if project is not None else None,
            len(self.chats_for(ExportScope.PROJECT)[0]) if project is not None else 0,
            self.store.count_chats_with_messages(),  # "everything" leaves out empty chats
            self.window,
        )
        self.dialog.exportRequested.connect(self._on_export_requested)
        self.dialog.cancelRequested.connect(self.runner.cancel)
        self.dialog.show()
        return self.dialog

    def suggested_name(self, scope: ExportScope, export_format: ExportFormat) -> str:
        if scope == ExportScope.CHAT:
            conversation = self.store.conversation(self.current_chat())
            title = conversation.title if conversation is not None else "chat"
        elif scope == ExportScope.PROJECT:
            project_id = self._current_project()
            project = self.store.project(project_id) if project_id is not None else None
            title = project.name if project is not None else ALL_CHATS_NAME
        else:
            title = ALL_CHATS_NAME
        return export_file_name(title, export_format.extension)

    def _on_export_requested(self, scope_value: str, format_value: str) -> None:
        scope, export_format = ExportScope(scope_value), ExportFormat(format_value)
        path = save_file(
            self.dialog,
            "Export and share",
            self.suggested_name(scope, export_format),
            export_format.file_filter,
        )
        if path:
            self.export_to(Path(path), scope, export_format)

    # --- running ---------------------------------------------------------------------------------
    def export_to(self, path: Path, scope: ExportScope, export_format: ExportFormat) -> bool:
        """Start exporting `scope` to `path` (its extension added when missing); False when
        there is nothing to export or an export is already running."""
        if self.runner.running:
            self.show_error("Export and share", "An export is running; wait for it or cancel it.")
            return False
        if path.suffix.lower() != export_format.extension:
            path = path.with_name(path.name + export_format.extension)
        ids, projects = self.chats_for(scope)
        chats = snapshot_chats(self.store, ids, projects)
        count = len(exported(chats, scope))  # run_export leaves out empty chats of "everything"
        if not count:
            self.show_error("Export and share", "There are no chats to export.")
            return False
        self._count = count
        if self.dialog is not None:
            self.dialog.show_running(str(path), count)
        self.show_status(f"Exporting {count:,} chat{'s' if count != 1 else ''}…")
        self.runner.start(path, export_format, scope, chats)
        return True

    def _on_progress(self, done: int, total: int) -> None:
        if self.dialog is not None:
            self.dialog.show_progress(done, total)

    def _on_finished(self, path: str) -> None:
        if self.dialog is not None:
            self.dialog.show_choices()
            self.dialog.accept()
        n = self._count
        self.show_status(f"Exported {n:,} chat{'s' if n != 1 else ''} to {Path(path).name}")

    def _on_failed(self, message: str) -> None:
        if self.dialog is not None:
            self.dialog.show_choices(message)
        self.show_status("Export failed; nothing was written")
        self.show_error("Export failed", message)

    def _on_cancelled(self) -> None:
        message = "Export cancelled; nothing was written."
        if self.dialog is not None:
            self.dialog.show_choices(message)
        self.show_status(message)

    def shutdown(self) -> None:
        """The window is closing: stop a running export (its temporary file is removed)."""
        self.runner.cancel()
        self.runner.wait()

    # --- import ----------------------------------------------------------------------------------
    def import_archive(self, path: Path) -> list[int]:
        """Add every chat of the zip export at `path` (ChatImportError or StoreWriteError when it
        cannot be; then nothing was added). Returns the new chats' ids in the archive's order."""
        archive = read_archive(path)
        return self.store.import_conversations(archive.chats, archive.projects, archive.compactions)
