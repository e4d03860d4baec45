"""The main window: composes the widgets and connects them to the ChatSession.

Layout: model bar on top; chats on the left; the conversation, the input box and the JSON mode
switch in the middle; usage, time to first token, sampling preset and token inspector on the
right. Streaming text is drawn by a frame timer (FRAME_MS), never per token.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from PySide6.QtCore import Qt, QTimer, Signal
from PySide6.QtGui import QAction, QKeySequence
from PySide6.QtWidgets import (
    QApplication,
    QCheckBox,
    QHBoxLayout,
    QInputDialog,
    QLabel,
    QLineEdit,
    QMainWindow,
    QMessageBox,
    QPlainTextEdit,
    QPushButton,
    QScrollArea,
    QSplitter,
    QTabWidget,
    QVBoxLayout,
    QWidget,
)

from app.archive_import import is_archive
from app.backends.catalog import RemoteCatalog
from app.backends.connection import Connection
from app.backends.keys import KeyStore
from app.backends.remote import (
    REMOTE_ARCHITECTURE,
    ConnectionBook,
    RemoteEngine,
    parse_remote_path,
    remote_model_path,
)
from app.backends.router import BackendRouter
from app.chat_import import read_chat_export
from app.controller import EngineController
from app.export import export_file_name, render_export, safe_export_path, write_export
from app.features.compaction import CompactionController
from app.features.documents import DocumentsController
from app.features.export import ExportFeature
from app.features.message_queue import MessageQueue
from app.features.prefill_progress import PrefillStatus, describe_progress
from app.features.projects import ProjectsFeature
from app.features.run_prediction import RunPredictionController
from app.icon import app_icon
from app.preset_state import parse_value
from app.schema_check import check_schema
from app.session import ChatSession
from app.settings import Settings, SettingsFile
from app.store import Store, StoredMessage, StoreWriteError
from app.theme import apply_theme
from app.views.chat_view import ChatView
from app.views.compaction_widgets import CompactionOffer
from app.views.compare_view import CompareDialog, CompareRun
from app.views.connections_dialog import ConnectionsDialog
from app.views.documents_panel import AttachButton, DocumentsPanel
from app.views.download_panel import DownloadPanel
from app.views.elided_label import ElidedLabel
from app.views.file_dialogs import open_file, save_file
from app.views.json_mode_bar import JsonModeBar
from app.views.library_dialog import LibraryDialog
from app.views.model_bar import ModelBar
from app.views.notice_banner import NoticeBanner
from app.views.pending_messages import PendingMessages
from app.views.persona_picker import PersonaPicker
from app.views.preset_panel import PresetPanel
from app.views.receipt_dialog import ReceiptDialog
from app.views.settings_dialog import OPEN_CONNECTIONS, SettingsDialog
from app.views.sidebar import Sidebar
from app.views.token_inspector import TokenInspector
from app.views.tools_panel import ToolsPanel
from app.views.ttft_panel import TtftPanel
from app.views.usage_panel import UsagePanel
from engine.errors import ChatImportError, EngineError
from engine.types import MessageStatus, ModelInfo, ResolvedPreset, Role

LOCAL_TOKENS_HINT = (
    "Click a token to see the alternatives the model considered. Darker = less certain."
)
REMOTE_TOKENS_HINT = "Remote model: tokens and their alternatives as the server reports them."
REMOTE_NO_TOKENS_HINT = (
    "This server does not report token probabilities (logprobs), so there is nothing to inspect."
)
FRAME_MS = 33  # ~30 Hz: smooth enough for text, cheap enough for markdown re-rendering
SAVE_RETRY_MS = 5000  # while a save fails (disk full): how often to try again
SERVE_PORT = 8080  # "Serve this model": 127.0.0.1 only, the port `python -m engine serve` uses
SERVER_STATUS_MS = 500  # how often the status bar reads the server's request counts
# The smallest the window's contents ask for, whatever the font and whatever they show: the
# window's minimum size is otherwise the sum of its widgets' (a JSON schema's fields, a long
# model name, a 14 pt font), and Qt grows the window, even past the screen, to meet it.
MIN_CONTENT_WIDTH, MIN_CONTENT_HEIGHT = 640, 420
# The side panels' share of a new window's width; the conversation takes the rest.
CHATS_SHARE, SIDE_SHARE = 0.16, 0.30


class InputBox(QPlainTextEdit):
    """Enter sends, Shift+Enter inserts a newline."""

    submitted = Signal()

    def keyPressEvent(self, event):
        if (
            event.key() in (Qt.Key_Return, Qt.Key_Enter)
            and not event.modifiers() & Qt.ShiftModifier
        ):
            self.submitted.emit()
            return
        super().keyPressEvent(event)


class MainWindow(QMainWindow):
    def __init__(
        self,
        controller: EngineController,
        store: Store,
        settings: Settings,
        settings_file: SettingsFile,
    ):
        super().__init__()
        self.controller, self.store = controller, store
        self.settings, self.settings_file = settings, settings_file
        # Remote models (issue 12): the user's servers, their keys, their model lists, and the
        # router that hands ChatSession whichever backend the chat uses.
        self.keys = KeyStore(settings_file.path.parent / "api-keys.json")
        self.book = ConnectionBook(self._connections_from_settings(), self.keys)
        self.catalog = RemoteCatalog(self)
        self.backends = BackendRouter(
            controller, lambda: EngineController(RemoteEngine(self.book)), self
        )
        self.session = ChatSession(self.backends, store, settings, settings_file, self)
        self.selected_message_id: int | None = None
        self.details_dialog: ReceiptDialog | None = None  # the open "Details" of a reply
        self.compare_dialog: CompareDialog | None = None  # the latest compare view
        self.notice = ""  # the last notice about the current reply (e.g. context trimming)
        self._export_tasks: set = set()
        # app.library's scan and download runners, made when the library is first opened.
        self._library_runner = None
        self._download_runner = None
        self.library_dialog: LibraryDialog | None = None

        self.setWindowTitle("LocalChat")
        self.setWindowIcon(app_icon())
        self.setAcceptDrops(True)
        self.resize(1280, 800)
        self._build()
        self._connect()
        self.prefill_status = PrefillStatus(self.session, self.state_label, self)
        # Send while a reply streams queues the message under the chat (issue 35)
        self.message_queue = MessageQueue(
            self.session, self.settings, self.settings_file, self.pending_messages, self
        )
        self.message_queue.refused.connect(lambda why: self.show_error("Not queued", why))
        # issue 35: visible, reversible compaction of long chats
        self.compaction = CompactionController(self.session, self.chat_view, self.compaction_offer)
        # issue 34: documents with citations (collections live beside the chat database)
        self.documents = DocumentsController(self.session, Path(store.path).parent, parent=self)
        self.documents.attach_views(self.documents_panel, self.chat_view, self.attach_button, self)
        self.documents.statusText.connect(self.state_label.setText)  # "Finding sources…"
        # issue 35: will it run here? (library estimates; the loaded model's prediction error)
        self.run_prediction = RunPredictionController(
            self.usage_panel, self.model_bar, self.settings_file.path.parent, self
        )
        # issue 35: projects and search in the chats list
        self.projects = ProjectsFeature(
            store, self.session, self.sidebar, self.system_prompt, settings, self.show_error, self
        )
        # issue 35: export and share (zip / HTML / PDF) and the zip half of File > Import
        self.export_feature = ExportFeature(
            store, self.session.ensure_conversation, self.state_label.setText, self.show_error, self
        )
        self._make_actions()
        self._fit_to_screen()
        self._share_width()
        self._apply_panels()
        self.frame_timer = QTimer(self)
        self.frame_timer.setInterval(FRAME_MS)
        self.frame_timer.timeout.connect(self._on_frame)
        self.save_retry_timer = QTimer(self)
        self.save_retry_timer.setInterval(SAVE_RETRY_MS)
        self.save_retry_timer.timeout.connect(self.session.retry_saves)
        self.serve_port = SERVE_PORT
        self.server_timer = QTimer(self)
        self.server_timer.setInterval(SERVER_STATUS_MS)
        self.server_timer.timeout.connect(self._refresh_server_status)
        self.model_bar.set_recent(settings.recent_models)
        self.refresh_remote_models()
        self._refresh_sidebar()
        self.session.ensure_conversation()
        self._set_busy(False)

    # --- layout ---------------------------------------------------------------------------------
    def _build(self) -> None:
        self.model_bar = ModelBar()
        self.sidebar = Sidebar()
        self.chat_view = ChatView()
        self.system_prompt = QLineEdit()
        self.system_prompt.setPlaceholderText("System prompt for this chat (optional)")
        self.system_prompt.setToolTip(
            "Instructions the model sees before every message of this chat"
        )
        self.persona_picker = PersonaPicker()
        self.input = InputBox()
        self.input.setPlaceholderText(
            "Message the model — Enter to send, Shift+Enter for a new line"
        )
        self.input.setFixedHeight(78)
        self.send_button = QPushButton("Send")
        self.send_button.setObjectName("send_button")
        self.send_button.setToolTip("Send (Enter)")
        self.cancel_button = QPushButton("Stop")
        self.cancel_button.setObjectName("cancel_button")
        self.cancel_button.setToolTip("Stop generating and keep the partial reply (Esc)")
        self.json_bar = JsonModeBar()
        if self.settings.json_schema:  # the last schema used, if it is still valid
            schema, _problem = check_schema(self.settings.json_schema)
            if schema is not None:
                self.json_bar.set_schema(self.settings.json_schema, schema)
        self.state_label = ElidedLabel()  # shortened with "…", never widening the window
        self.state_label.setObjectName("state_label")
        self.thinking_box = QCheckBox("Thinking")
        self.thinking_box.setChecked(True)
        self.thinking_box.setToolTip(
            "Let the model reason before it answers (its chat template has a thinking switch); "
            "off answers directly"
        )
        self.thinking_box.setVisible(False)

        self.attach_button = AttachButton()  # issue 34: attach documents to the chat
        buttons = QVBoxLayout()
        buttons.addWidget(self.send_button)
        buttons.addWidget(self.cancel_button)
        buttons.addWidget(self.attach_button)
        buttons.addStretch(1)
        input_row = QHBoxLayout()
        input_row.addWidget(self.input, 1)
        input_row.addLayout(buttons)
        footer = QHBoxLayout()
        footer.addWidget(self.json_bar, 1)
        footer.addWidget(self.thinking_box)
        footer.addWidget(self.state_label)

        center = QWidget()
        center_layout = QVBoxLayout(center)
        center_layout.setContentsMargins(4, 4, 4, 4)
        self.notice_banner = NoticeBanner()
        center_layout.addWidget(self.notice_banner)
        prompt_row = QHBoxLayout()
        prompt_row.addWidget(ElidedLabel("System prompt:"))
        prompt_row.addWidget(self.system_prompt, 1)
        prompt_row.addWidget(self.persona_picker)
        center_layout.addLayout(prompt_row)
        center_layout.addWidget(self.chat_view, 1)
        self.pending_messages = PendingMessages()  # queued while a reply streams
        center_layout.addWidget(self.pending_messages)
        self.compaction_offer = CompactionOffer()  # issue 35: near the context limit
        center_layout.addWidget(self.compaction_offer)
        center_layout.addLayout(input_row)
        center_layout.addLayout(footer)

        self.usage_panel = UsagePanel()
        self.ttft_panel = TtftPanel()
        self.preset_panel = PresetPanel()
        self.token_inspector = TokenInspector()
        self.tabs = QTabWidget()
        self.tabs.addTab(self.preset_panel, "Sampling")
        self.tabs.addTab(self.token_inspector, "Tokens")
        self.tools_panel = ToolsPanel()
        self.tabs.addTab(self.tools_panel, "Tools")
        self.documents_panel = DocumentsPanel()  # issue 34: the chat's documents
        self.tabs.addTab(self.documents_panel, "Documents")
        right = QWidget()
        right_layout = QVBoxLayout(right)
        right_layout.setContentsMargins(4, 4, 4, 4)
        right_layout.addWidget(self.usage_panel)
        right_layout.addWidget(self.ttft_panel)
        right_layout.addWidget(self.tabs, 1)
        # The right panel scrolls when it has less room than its contents (a large font, a
        # short window) instead of squeezing its forms until they cannot be used.
        self.side_panel = QScrollArea()
        self.side_panel.setObjectName("side_panel")
        self.side_panel.setWidget(right)
        self.side_panel.setWidgetResizable(True)
        self.side_panel.setFrameShape(QScrollArea.NoFrame)
        self.side_panel.setMinimumWidth(180)

        splitter = QSplitter()
        splitter.addWidget(self.sidebar)
        splitter.addWidget(center)
        splitter.addWidget(self.side_panel)
        splitter.setStretchFactor(1, 1)
        splitter.setCollapsible(1, False)  # the conversation never disappears
        self.splitter = splitter
        splitter.splitterMoved.connect(self._on_splitter_moved)
        root = QWidget()
        root.setMinimumSize(MIN_CONTENT_WIDTH, MIN_CONTENT_HEIGHT)
        root_layout = QVBoxLayout(root)
        root_layout.setContentsMargins(0, 0, 0, 0)
        root_layout.setSpacing(0)
        root_layout.addWidget(self.model_bar)
        root_layout.addWidget(splitter, 1)
        self.setCentralWidget(root)
        self.server_label = QLabel()
        self.server_label.setObjectName("server_label")
        self.server_label.setTextInteractionFlags(Qt.TextSelectableByMouse)
        self.statusBar().addPermanentWidget(self.server_label)

    def _connect(self) -> None:
        s, c = self.session, self.backends
        self.model_bar.openRequested.connect(self.open_model)
        self.model_bar.settingsRequested.connect(self.open_settings)
        self.model_bar.connectionsRequested.connect(self.open_connections)
        self.catalog.listed.connect(self._on_models_listed)
        s.backendRequested.connect(self.open_model)
        c.loadProgress.connect(self.model_bar.show_progress)
        c.modelLoaded.connect(self._on_model_loaded)
        c.loadFailed.connect(self._on_load_failed)
        # serving is the local engine's (the router has no server signals)
        self.controller.serverStarted.connect(self._on_server_started)
        self.controller.serverStopped.connect(self._on_server_stopped)
        self.controller.serverFailed.connect(self._on_server_failed)

        self.sidebar.newRequested.connect(self.new_chat)
        self.sidebar.conversationSelected.connect(self._open_conversation)
        self.sidebar.renameRequested.connect(s.rename_conversation)
        self.sidebar.deleteRequested.connect(s.delete_conversation)
        self.sidebar.searchChanged.connect(lambda _text: self._refresh_sidebar())
        s.conversationsChanged.connect(self._refresh_sidebar)
        s.conversationOpened.connect(self._on_conversation_opened)
        self.chat_view.earlierRequested.connect(s.load_earlier)

        self.input.submitted.connect(self.send)
        self.send_button.clicked.connect(self.send)
        self.cancel_button.clicked.connect(self.cancel)
        self.system_prompt.editingFinished.connect(
            lambda: s.set_system_prompt(self.system_prompt.text())
        )
        self.system_prompt.textChanged.connect(self.persona_picker.show_prompt)
        self.persona_picker.personaChosen.connect(self.use_persona)
        self.persona_picker.saveRequested.connect(self.save_persona)
        self.persona_picker.deleteRequested.connect(self.delete_persona)
        self.json_bar.modeChanged.connect(self.session.set_json_mode)
        self.thinking_box.toggled.connect(self.session.set_thinking)

        s.messageAdded.connect(self._on_message_added)
        s.replyText.connect(self.chat_view.queue_text)
        s.replyReasoning.connect(self.chat_view.queue_reasoning)
        s.replyTokens.connect(self.token_inspector.add_tokens)
        s.liveUsage.connect(self._on_live_usage)
        s.replyNotice.connect(self._on_notice)
        s.replyFinished.connect(self._on_reply_finished)
        s.replyFailed.connect(self._on_reply_failed)
        s.busyChanged.connect(self._set_busy)
        s.presetChanged.connect(self._on_preset_changed)
        s.presetProblem.connect(self._on_preset_problem)
        s.storageProblem.connect(self._on_storage_problem)

        self.chat_view.editRequested.connect(self.edit_message)
        self.chat_view.regenerateRequested.connect(self.session.regenerate_reply)
        self.chat_view.messageSelected.connect(self.select_message)
        self.chat_view.versionRequested.connect(self.session.select_version)
        self.chat_view.branchRequested.connect(self.session.branch_from)
        self.chat_view.detailsRequested.connect(self.show_details)
        self.chat_view.compareRequested.connect(self.open_compare)
        s.replayStarted.connect(self._on_replay_started)
        s.replayFinished.connect(self._on_replay_finished)
        s.replayFailed.connect(self._on_replay_failed)

        self._connect_tools()
        self.preset_panel.valueEdited.connect(self._on_preset_edit)
        self.preset_panel.saveRequested.connect(self._on_preset_save)
        self.preset_panel.resetRequested.connect(self._on_preset_reset)

    def _connect_tools(self) -> None:
        """The Tools tab and the tool calls in the chat (app/tool_runner.py runs them)."""
        s, registry, panel = self.session, self.session.tool_registry, self.tools_panel

        def show_tools() -> None:
            panel.show_tools(registry.builtin_rows(), registry.snapshot())
            panel.show_chat_tools(s.chat_tools())

        def add_server(name: str, target: str) -> None:
            try:
                registry.add_server(name, target)
            except ValueError as exc:  # ServerConfigError
                panel.show_add_error(str(exc))
                return
            panel.show_add_error("")

        registry.changed.connect(show_tools)
        registry.serverFailed.connect(
            lambda name, message: self.notice_banner.show_notice(f"mcp:{name}", message)
        )
        panel.toolToggled.connect(s.set_tool_enabled)
        panel.addServerRequested.connect(add_server)
        panel.removeServerRequested.connect(registry.remove_server)
        panel.restartServerRequested.connect(registry.restart_server)
        s.chatToolsChanged.connect(panel.show_chat_tools)
        s.toolMessageAdded.connect(self.chat_view.add_message)
        s.toolMessageChanged.connect(self.chat_view.update_message)
        s.replyToolEvents.connect(self.chat_view.show_tool_events)
        s.toolNotice.connect(lambda text: self.notice_banner.show_notice("tools", text, "info"))
        self.chat_view.toolApproval.connect(s.answer_tool)
        show_tools()

    def _make_actions(self) -> None:
        file_menu = self.menuBar().addMenu("&File")
        chat_menu = self.menuBar().addMenu("&Chat")
        view_menu = self.menuBar().addMenu("&View")

        def action(menu, text, shortcut, slot, name):
            act = QAction(text, self)
            if shortcut:
                act.setShortcut(QKeySequence(shortcut))
            act.setShortcutContext(Qt.WindowShortcut)
            act.triggered.connect(slot)
            menu.addAction(act)
            setattr(self, name, act)
            return act

        action(file_menu, "Open model…", "Ctrl+O", self.model_bar.ask_open, "open_action")
        action(file_menu, "Model library…", "Ctrl+Shift+O", self.open_library, "library_action")
        action(file_menu, "Export chat…", "Ctrl+E", self.ask_export, "export_action")
        action(
            file_menu,
            "Export and share…",
            "Ctrl+Shift+E",
            self.export_feature.open_dialog,
            "export_share_action",
        )
        action(file_menu, "Import chat…", "Ctrl+Shift+I", self.ask_import, "import_action")
        action(file_menu, "Settings…", "Ctrl+,", self.open_settings, "settings_action")
        action(file_menu, "Connections…", "", self.open_connections, "connections_action")
        serve = action(file_menu, "Serve this model", None, lambda: None, "serve_action")
        serve.setCheckable(True)
        serve.setToolTip(
            "Let other programs use the loaded model through an OpenAI-compatible API on "
            f"http://127.0.0.1:{SERVE_PORT}/v1 (this computer only); the chat keeps working"
        )
        serve.toggled.connect(self._on_serve_toggled)
        file_menu.addSeparator()
        action(file_menu, "Quit", "Ctrl+Q", self.close, "quit_action")
        action(chat_menu, "New chat", "Ctrl+N", self.new_chat, "new_chat_action")
        action(chat_menu, "Stop generating", "Esc", self.cancel, "cancel_action")
        action(chat_menu, "Regenerate reply", "Ctrl+R", self.regenerate, "regenerate_action")
        action(chat_menu, "Focus input", "Ctrl+L", self.input.setFocus, "focus_action")
        action(chat_menu, "Compare…", "Ctrl+K", lambda: self.open_compare(), "compare_action")
        for text, shortcut, panel, name in (
            ("Chats list", "Ctrl+B", "chats", "chats_panel_action"),
            ("Side panel", "Ctrl+Alt+B", "side", "side_panel_action"),
        ):
            act = action(
                view_menu, text, shortcut, lambda on, p=panel: self.show_panel(p, on), name
            )
            act.setCheckable(True)
            act.setToolTip(f"Show or hide the {text.lower()} (remembered)")
        self.model_bar.set_panel_actions(self.chats_panel_action, self.side_panel_action)

    # --- the window's size and its side panels -------------------------------------------------
    def _fit_to_screen(self) -> None:
        """Never open larger than the screen's free area (a large font once opened the window
        wider than the screen, with Settings off its edge)."""
        screen = self.screen() or QApplication.primaryScreen()
        if screen is None:
            return
        free = screen.availableGeometry()
        size = self.size().boundedTo(free.size())
        if size != self.size():
            self.resize(size)
            self.move(free.topLeft())

    def _share_width(self) -> None:
        """The side panels get their share of the width but the conversation gets at least
        what it needs; the side panel gives way first (it scrolls), then the chats list."""
        width = self.width()
        chats_min = self.sidebar.minimumSizeHint().width()
        side_min = self.side_panel.minimumWidth()
        center_min = self.splitter.widget(1).minimumSizeHint().width()
        chats = max(chats_min, int(width * CHATS_SHARE))
        side = max(side_min, int(width * SIDE_SHARE))
        side = max(side_min, min(side, width - chats - center_min))
        chats = max(chats_min, min(chats, width - side - center_min))
        self.splitter.setSizes([chats, max(center_min, width - chats - side), side])

    def _panel_widget(self, panel: str) -> QWidget:
        return self.sidebar if panel == "chats" else self.side_panel

    def _apply_panels(self) -> None:
        """Show the side panels as the settings remember them."""
        for panel, act in (("chats", self.chats_panel_action), ("side", self.side_panel_action)):
            shown = panel not in self.settings.collapsed_panels
            self._panel_widget(panel).setVisible(shown)
            index = 0 if panel == "chats" else 2
            sizes = self.splitter.sizes()
            if shown and sizes[index] == 0:  # dragged shut earlier: open it at its share again
                share = CHATS_SHARE if panel == "chats" else SIDE_SHARE
                sizes[index] = int(self.width() * share)
                sizes[1] = max(0, sizes[1] - sizes[index])
                self.splitter.setSizes(sizes)
            act.setChecked(shown)  # emits toggled (the bar's button follows), not triggered

    def show_panel(self, panel: str, shown: bool) -> None:
        """Show or hide a side panel ("chats" or "side"); the choice is saved."""
        collapsed = [p for p in self.settings.collapsed_panels if p != panel]
        if not shown:
            collapsed.append(panel)
        if collapsed != self.settings.collapsed_panels:
            self.settings.collapsed_panels = collapsed
            self.settings_file.save(self.settings)
        self._apply_panels()

    def _on_splitter_moved(self, _pos: int, _index: int) -> None:
        """A panel dragged shut with the splitter handle counts as hidden."""
        sizes = self.splitter.sizes()
        for panel, index in (("chats", 0), ("side", 2)):
            if sizes[index] == 0 and self._panel_widget(panel).isVisible():
                self.show_panel(panel, False)

    # --- model ----------------------------------------------------------------------------------
    def start(self, model_path: str | None = None) -> None:
        """Load the requested model, else the last one, else the embedded default. A chat bound
        to a remote model has already asked for it (ChatSession.backendRequested)."""
        if model_path is None and self._open_chat_is_remote():
            return
        path = model_path or self.settings.last_model
        if not path or not Path(path).is_file():
            from engine.model_files import ModelNotInstalledError, default_model_path

            try:
                path = str(default_model_path())
            except ModelNotInstalledError as exc:
                self.show_error("No model", str(exc))
                return
        self.open_model(path)

    def open_library(self) -> LibraryDialog:
        """The model library (app/library scans off the GUI thread; imported here so the window
        opens before the engine's GGUF reader is loaded)."""
        from app.library.download_runner import DownloadRunner
        from app.library.scan_runner import LibraryScanRunner

        if self.library_dialog is not None and self.library_dialog.isVisible():  # bring it forward
            self.library_dialog.raise_()
            self.library_dialog.activateWindow()
            return self.library_dialog
        if self._library_runner is None:
            self._library_runner = LibraryScanRunner(self)
            self._download_runner = DownloadRunner(self)
        panel = DownloadPanel(self._download_runner)
        dialog = LibraryDialog(
            self._library_runner,
            self.settings.library_folders,
            panel,
            self,
            predictor=self.run_prediction.library_runner,
            load_options=(
                self.settings.context_size,
                self.settings.kv_cache_type,
                self.settings.threads,
            ),
        )
        dialog.openRequested.connect(self.open_model)
        dialog.foldersChanged.connect(self._on_library_folders)
        dialog.setAttribute(Qt.WA_DeleteOnClose)
        dialog.destroyed.connect(self._on_library_closed)
        dialog.show()
        self.library_dialog = dialog
        return dialog

    def _on_library_closed(self) -> None:
        self.library_dialog = None

    def _on_library_folders(self, folders: list[str]) -> None:
        self.settings.library_folders = folders
        self.settings_file.save(self.settings)

    def open_model(self, path: str) -> None:
        remote = parse_remote_path(path)
        if remote is not None:
            connection = self.book.get(remote[0])
            host = connection.host if connection else "a removed connection"
            self.model_bar.show_loading(f"{remote[1]} (remote · {host})")
        else:
            self.model_bar.show_loading(path)
        self._set_busy(self.session.busy)
        self.backends.load_model(
            path, self.settings.context_size, self.settings.threads, self.settings.kv_cache_type
        )

    def _on_model_loaded(self, info: ModelInfo) -> None:
        if info.architecture == REMOTE_ARCHITECTURE:
            # A server's model is not a file: it is in the Remote menu, not the recent files.
            context = f" · context {info.n_ctx:,}" if info.n_ctx else ""
            self.model_bar.show_loaded(info.name, f"{info.template}{context}")
            self.model_bar.setToolTip(info.summary)
            self.token_inspector.hint.setText(REMOTE_TOKENS_HINT)
            self.run_prediction.remote_loaded()
        else:
            self.settings.remember_model(info.path)
            self.settings_file.save(self.settings)
            self.model_bar.set_recent(self.settings.recent_models)
            self.model_bar.show_loaded(
                info.name, f"{info.architecture} · context {info.n_ctx:,} · {info.template}"
            )
            self.token_inspector.hint.setText(LOCAL_TOKENS_HINT)
            self.run_prediction.model_loaded(info, self.settings.threads)
        self.thinking_box.setVisible(info.thinking_switch)
        self._show_base_model_notice(info)
        self._set_busy(self.session.busy)
        self.input.setFocus()

    def _show_base_model_notice(self, info: ModelInfo) -> None:
        """A base model (no chat template of its own) continues text instead of answering, and
        in a chat it tends to repeat the question: say so, and offer plain completion."""
        chat_hint = "Message the model — Enter to send, Shift+Enter for a new line"
        if not info.base_model:
            self.notice_banner.clear_notice("base-model")
            self.input.setPlaceholderText(chat_hint)
            return
        said = f"{info.name} is a base model without a chat template: it continues text"
        if self.session.plain_completion:
            text = (
                f"{said}. Plain completion: what you send is continued as it is (no chat "
                "template, no system prompt, no earlier turns)."
            )
            action = ("Chat instead", lambda: self._set_plain_completion(info, False))
            self.input.setPlaceholderText("Text for the model to continue — Enter to send")
        else:
            text = (
                f"{said} rather than answering, and in a chat it tends to repeat the question. "
                "Plain completion continues what you type as it is."
            )
            action = ("Use plain completion", lambda: self._set_plain_completion(info, True))
            self.input.setPlaceholderText(chat_hint)
        self.notice_banner.show_notice("base-model", text, "info", action)

    def _set_plain_completion(self, info: ModelInfo, on: bool) -> None:
        self.session.set_plain_completion(on)
        self._show_base_model_notice(info)

    def _on_load_failed(self, path: str, message: str) -> None:
        previous = self.backends.model
        self.model_bar.show_failed(f"<b>{previous.name}</b>" if previous else None)
        self._set_busy(self.session.busy)
        self.show_error("Could not open the model", f"{Path(path).name}\n\n{message}")

    # --- chats ----------------------------------------------------------------------------------
    def _refresh_sidebar(self) -> None:
        self.projects.refresh()  # projects with their chats, or the search hits

    def _open_conversation(self, conversation_id: int) -> None:
        self.session.open_conversation(conversation_id)

    def _on_conversation_opened(self, conversation, messages: list[StoredMessage]) -> None:
        self.chat_view.show_messages(messages)
        self.chat_view.set_earlier(self.session.earlier)
        self.system_prompt.setText(conversation.system_prompt)
        self.persona_picker.set_personas(self.settings.personas, conversation.system_prompt)
        self._refresh_sidebar()
        replies = [
            m for m in messages if m.role == Role.ASSISTANT and m.status != MessageStatus.STREAMING
        ]
        self.ttft_panel.set_history(
            [m.usage["ttft_ms"] for m in replies if m.usage and m.usage.get("ttft_ms") is not None]
        )
        if replies:
            self.select_message(replies[-1].id)
        else:
            self.selected_message_id = None
            self.usage_panel.clear()
            self.token_inspector.set_tokens([])

    def new_chat(self) -> None:
        self.session.new_conversation()
        self.input.setFocus()

    # --- sending --------------------------------------------------------------------------------
    def send(self) -> None:
        text = self.input.toPlainText()
        if not text.strip():
            return
        if self.backends.model is None:
            self.state_label.setText(
                "The model is still loading…" if self.backends.loading else "Open a model first"
            )
            return
        if self.session.busy:  # a reply streams: queue it (app/features/message_queue.py)
            if self.message_queue.add(text):
                self.input.clear()
            return
        self.session.set_system_prompt(self.system_prompt.text())
        if self.session.send(text):
            self.input.clear()

    def cancel(self) -> None:
        self.session.cancel()

    def regenerate(self) -> None:
        self.session.regenerate_last()

    def edit_message(self, message_id: int) -> None:
        message = self.store.message(message_id)
        if message is None or self.session.busy:
            return
        text, ok = QInputDialog.getMultiLineText(
            self,
            "Edit message",
            "Edit your message; the reply is generated again from here:",
            message.content,
        )
        if ok and text.strip():
            self.session.edit_and_regenerate(message_id, text)

    def _on_message_added(self, message: StoredMessage) -> None:
        self.chat_view.add_message(message)
        if message.role == Role.ASSISTANT:
            self.selected_message_id = message.id
            self.token_inspector.set_tokens([])
            self.usage_panel.show_usage(self.session.live_usage(), live=True)
            self.ttft_panel.show_live(None)
            self.frame_timer.start()

    def _on_frame(self) -> None:
        self.chat_view.flush_stream()
        self.token_inspector.flush()
        self.session.tick()

    def _on_live_usage(self, usage: dict) -> None:
        streaming = self.chat_view.streaming_widget
        if streaming is not None and streaming.message.id == self.selected_message_id:
            self.usage_panel.show_usage(usage, live=True)
            self.ttft_panel.show_live(usage.get("ttft_ms"))

    def _on_notice(self, message: str) -> None:
        self.notice = message
        if self.backends.kind == "remote":
            # A remote server's notice (a refused field, a JSON format it ignored): in words.
            self.notice_banner.show_notice("remote", message)
            return
        self.state_label.setText("Older turns left out to fit the context")
        self.state_label.setToolTip(message)

    def _on_reply_finished(self, stored: StoredMessage) -> None:
        self.frame_timer.stop()
        if stored.conversation_id != self.session.conversation_id:
            return  # the user moved to another chat while it streamed (and so stopped it)
        self.chat_view.finish_stream(stored)
        self.token_inspector.flush()
        self._note_remote_tokens(stored)
        usage = stored.usage or {}
        self.ttft_panel.add_reply(usage.get("ttft_ms"), usage.get("prefill_ms"))
        self.selected_message_id = stored.id
        self.usage_panel.show_usage(stored.usage, stored.finish_reason)
        if stored.status == MessageStatus.CANCELLED:
            self.state_label.setText("Stopped — partial reply kept")
        elif not self.state_label.text().startswith("Older turns"):
            self.state_label.setText("")

    def _on_reply_failed(self, message: str, stored: StoredMessage | None) -> None:
        self.frame_timer.stop()
        if stored is not None and stored.conversation_id == self.session.conversation_id:
            self.chat_view.finish_stream(stored)
            # the failed reply's usage and how it ended, not "generating…" (issue 31, defect 6)
            self.selected_message_id = stored.id
            self.usage_panel.show_usage(stored.usage, stored.finish_reason)
        if self.backends.kind == "remote" and "refused the request" in message:
            # The server refused a value of the request: its own words, where the values are.
            self.preset_panel.show_error(message, prefix="")
            self.tabs.setCurrentWidget(self.preset_panel)
        self.show_error("Generation failed", message)

    def select_message(self, message_id: int) -> None:
        message = self.store.message(message_id)
        if message is None or message.role != Role.ASSISTANT:
            return
        self.selected_message_id = message_id
        if message.status == MessageStatus.STREAMING and self.session.busy:
            return
        self.usage_panel.show_usage(message.usage, message.finish_reason)
        if message.usage and "ttft_ms" in message.usage:
            self.ttft_panel.show_reply(message.usage["ttft_ms"], message.usage.get("prefill_ms"))
        self.token_inspector.set_tokens(message.tokens)
        self._note_remote_tokens(message)

    def _note_remote_tokens(self, message: StoredMessage) -> None:
        """A server that sends no logprobs leaves nothing to inspect: say so, not just 'none'."""
        if self.backends.kind == "remote":
            hint = REMOTE_TOKENS_HINT if message.tokens else REMOTE_NO_TOKENS_HINT
            self.token_inspector.hint.setText(hint)

    # --- personas -------------------------------------------------------------------------------
    def use_persona(self, name: str) -> None:
        self.system_prompt.setText(self.session.use_persona(name))

    def save_persona(self) -> None:
        prompt = self.system_prompt.text().strip()
        if not prompt:
            self.state_label.setText("Write a system prompt first, then save it as a persona")
            return
        suggested = self.persona_picker.current or " ".join(prompt.split()[:3])
        name, ok = QInputDialog.getText(
            self, "Save persona", "Name for this system prompt:", text=suggested
        )
        if ok and self.session.save_persona(name, prompt):
            self.persona_picker.set_personas(self.settings.personas, prompt)

    def delete_persona(self, name: str) -> None:
        if not name:
            return
        self.session.delete_persona(name)
        self.persona_picker.set_personas(self.settings.personas, self.system_prompt.text())

    # --- receipts and replay --------------------------------------------------------------------
    def show_details(self, message_id: int) -> ReceiptDialog:
        """The reply's receipt in a window of its own (not modal: the chat stays usable)."""
        if self.details_dialog is not None:
            self.details_dialog.close()
        dialog = ReceiptDialog(message_id, self.session.receipt(message_id), self)
        dialog.replayRequested.connect(self.session.replay)
        if isinstance((dialog.receipt or {}).get("sources"), dict):  # issue 34: unchanged now?
            self.documents.check_passages(dialog.receipt["sources"], dialog.show_passage_states)
        self.details_dialog = dialog
        dialog.show()
        return dialog

    def open_compare(self, user_message_id: int | None = None) -> CompareDialog:
        """The compare view (app/views/compare_view.py), modal: the chat waits while it runs.
        On a user message it answers that message; from the menu, the text being typed, else
        the chat's last question."""
        self.session.set_system_prompt(self.system_prompt.text())
        run = CompareRun(self.session)
        typed = self.input.toPlainText().strip()
        if user_message_id is None and not typed:
            users = [m for m in self.session.branch if m.role == Role.USER]
            user_message_id = users[-1].id if users else None
        if user_message_id is not None:
            run.answer_again(user_message_id)
        else:
            run.prompt = typed
        dialog = CompareDialog(run, self)
        dialog.setModal(True)
        self.compare_dialog = dialog
        dialog.show()
        return dialog

    def _dialog_for(self, message_id: int) -> ReceiptDialog | None:
        dialog = self.details_dialog
        return dialog if dialog is not None and dialog.message_id == message_id else None

    def _on_replay_started(self, message_id: int) -> None:
        self.send_button.setEnabled(False)
        self.regenerate_action.setEnabled(False)
        self.cancel_button.setEnabled(True)
        self.state_label.setText("Replaying a reply from its receipt… (Esc to stop)")
        if (dialog := self._dialog_for(message_id)) is not None:
            dialog.show_replay_started()

    def _on_replay_finished(self, message_id: int, report) -> None:
        self._set_busy(False)
        self.state_label.setText(
            "Replay stopped"
            if report.stopped
            else "Replay reproduced the reply exactly"
            if report.identical
            else "Replay diverged"
        )
        if (dialog := self._dialog_for(message_id)) is not None:
            dialog.show_replay(report)

    def _on_replay_failed(self, message_id: int, message: str) -> None:
        self._set_busy(False)
        self.state_label.setText("Replay failed")
        if (dialog := self._dialog_for(message_id)) is not None:
            dialog.show_replay_failed(message)

    def _set_busy(self, busy: bool) -> None:
        ready = self.backends.model is not None and not self.backends.loading
        # Serving is the local engine's: its model, whichever backend the chat is using.
        local_ready = self.controller.model is not None and not self.controller.loading
        self.serve_action.setEnabled(local_ready or self.serve_action.isChecked())
        self.send_button.setEnabled(ready)  # while busy it queues the message
        self.send_button.setText("Queue" if busy else "Send")
        self.send_button.setToolTip(
            "Queue this message: it is sent when the reply finishes (Enter)"
            if busy
            else "Send (Enter)"
        )
        self.cancel_button.setEnabled(busy)
        self.regenerate_action.setEnabled(ready and not busy)
        self.compare_action.setEnabled(local_ready and not busy)  # columns run locally first
        if busy:
            self.state_label.setText("Generating… (Esc to stop)")
            self.state_label.setToolTip("")
        elif self.state_label.text().startswith("Generating"):
            self.state_label.setText("")

    # --- serving the model ----------------------------------------------------------------------
    def _on_serve_toggled(self, checked: bool) -> None:
        if checked:
            self.server_label.setText("Starting the server…")
            self.controller.start_serving(self.serve_port)
        else:
            self.controller.stop_serving()

    def _set_serve_checked(self, checked: bool) -> None:
        self.serve_action.blockSignals(True)  # reflect the state without asking for it again
        self.serve_action.setChecked(checked)
        self.serve_action.blockSignals(False)

    def _on_server_started(self, url: str) -> None:
        self._set_serve_checked(True)
        self.server_timer.start()
        self._refresh_server_status()

    def _on_server_stopped(self) -> None:
        self._set_serve_checked(False)
        self.server_timer.stop()
        self.server_label.setText("")
        self.server_label.setToolTip("")

    def _on_server_failed(self, message: str) -> None:
        self._on_server_stopped()
        self.show_error("Could not serve the model", message)

    def _refresh_server_status(self) -> None:
        status = self.controller.server_status()
        if status is None:
            return
        text = f"Serving at {status.url} · {status.running} running"
        if status.queued:
            text += f" · {status.queued} queued"
        for progress in status.prefills:  # requests whose prompt is being read now
            text += f" · {describe_progress(progress)}"
        self.server_label.setText(text)
        self.server_label.setToolTip(
            "OpenAI-compatible API for programs on this computer: use this URL as the base URL. "
            f"{status.http_requests} HTTP requests in flight; 'running' counts this window's "
            "reply too."
        )

    # --- presets --------------------------------------------------------------------------------
    def _on_preset_changed(self, view: ResolvedPreset) -> None:
        self.preset_panel.show_preset(view)

    def _on_preset_problem(self, message: str) -> None:
        self.preset_panel.show_error(message, prefix="")
        self.tabs.setCurrentWidget(self.preset_panel)

    def _on_preset_edit(self, field: str, text: str) -> None:
        current = self.preset_panel.view.values.get(field) if self.preset_panel.view else None
        error = self.session.set_preset_value(field, parse_value(text, current))
        if error is None:
            self.preset_panel.clear_error()
        else:
            self.preset_panel.show_error(error)

    def _on_preset_save(self) -> None:
        self.session.save_preset()
        self.preset_panel.clear_error()

    def _on_preset_reset(self) -> None:
        self.session.reset_preset()
        self.preset_panel.clear_error()

    # --- export ---------------------------------------------------------------------------------
    def ask_export(self) -> None:
        conv = self.store.conversation(self.session.ensure_conversation())
        path = save_file(
            self, "Export chat", export_file_name(conv.title), "Markdown (*.md);;JSON (*.json)"
        )
        if path:
            self.export_to(path)

    def export_to(self, path: str) -> None:
        """Write the current chat; .json gives JSON, anything else Markdown.

        With the qasync loop running (the real app) the write happens in a worker thread via
        asyncio; without one (some tests) it is written directly."""
        path = str(safe_export_path(Path(path)))
        conv = self.store.conversation(self.session.ensure_conversation())
        # Markdown holds the visible branch; JSON every version too (render_export picks).
        messages = self.store.messages(conv.id, with_tokens=False)
        tree = self.store.tree(conv.id) if Path(path).suffix.lower() == ".json" else None
        # get_running_loop, not get_event_loop: with no loop running the latter creates one that
        # nobody closes (a ResourceWarning when it is collected).
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            loop = None
        if loop is not None:
            task = loop.create_task(write_export(Path(path), conv, messages, tree))
            self._export_tasks.add(task)
            task.add_done_callback(lambda t: self._export_done(t, path))
        else:
            Path(path).write_text(render_export(Path(path), conv, messages, tree), encoding="utf-8")
            self.state_label.setText(f"Exported to {Path(path).name}")

    def ask_import(self) -> None:
        path = open_file(self, "Import chat", "LocalChat export (*.json *.zip);;All files (*)")
        if path:
            self.import_from(path)

    def import_from(self, path: str) -> int | None:
        """Add a LocalChat JSON export as a new chat (its whole tree and receipts), or every
        chat of a zip export (with their projects), and open the (first) new chat; a file that
        cannot be imported is named in an error dialog and nothing is added."""
        if self.session.busy:
            self.show_error("Import chat", "Wait for the reply to finish, then import.")
            return None
        try:
            if is_archive(path):
                new_ids = self.export_feature.import_archive(Path(path))
                new_id, count = new_ids[0], len(new_ids)
            else:
                new_id, count = self.store.import_conversation(read_chat_export(Path(path))), 1
        except ChatImportError as exc:
            self.show_error("Could not import the chat", f"{Path(path).name}\n\n{exc.problem}")
            return None
        except StoreWriteError as exc:
            full = "the disk is full" if exc.disk_full else str(exc)
            self.show_error("Could not import the chat", f"It cannot be saved ({full}).")
            return None
        self._refresh_sidebar()
        self.session.open_conversation(new_id)
        chats = f" ({count:,} chats)" if count > 1 else ""
        self.state_label.setText(f"Imported {Path(path).name}{chats}")
        return new_id

    def _export_done(self, task, path: str) -> None:
        self._export_tasks.discard(task)
        if task.exception() is not None:
            self.show_error("Export failed", str(task.exception()))
        else:
            self.state_label.setText(f"Exported to {Path(path).name}")

    # --- settings -------------------------------------------------------------------------------
    def open_settings(self) -> None:
        dialog = SettingsDialog(self.settings, self)
        result = dialog.exec()
        if result:
            new = dialog.result_settings()
            for name in (
                "threads",
                "context_size",
                "kv_cache_type",
                "theme",
                "font_size",
                "fetch_allow_private",
                "long_chat",
            ):
                setattr(self.settings, name, getattr(new, name))
            self.settings_file.save(self.settings)
            apply_theme(QApplication.instance(), self.settings.theme, self.settings.font_size)
        if result == OPEN_CONNECTIONS:
            self.open_connections()

    # --- remote connections (Settings > Connections) ---------------------------------------------
    def _open_chat_is_remote(self) -> bool:
        cid = self.session.conversation_id
        binding = self.store.chat_backend(cid) if cid is not None else None
        return binding is not None and binding.kind == "remote"

    def _connections_from_settings(self) -> list[Connection]:
        connections = []
        for raw in self.settings.connections:
            try:
                connections.append(Connection.from_dict(raw))
            except (KeyError, TypeError, ValueError):
                continue  # a hand-edited entry that is not a connection
        return connections

    def _key_for(self, connection_id: str) -> str | None:
        try:
            return self.keys.get(connection_id)
        except EngineError as exc:
            self.notice_banner.show_notice("keys", str(exc), "error")
            return None

    def refresh_remote_models(self) -> None:
        """List every connection's models (off the GUI thread); the Remote menu fills in."""
        self._show_remote_models()
        for connection in self.book.connections:
            self.catalog.refresh(connection, lambda c=connection.id: self.keys.get(c))

    def _on_models_listed(self, connection_id: str, models: list, error: str) -> None:
        self._show_remote_models()

    def _show_remote_models(self) -> None:
        entries, problems = [], {}
        for connection in self.book.connections:
            for model in self.catalog.models.get(connection.id, []):
                entries.append(
                    (remote_model_path(connection.id, model.id), model.id, connection.host)
                )
            if connection.id in self.catalog.errors and connection.id not in self.catalog.models:
                problems[connection.label] = self.catalog.errors[connection.id]
        self.model_bar.set_remote_models(entries, problems)

    def open_connections(self) -> ConnectionsDialog:
        stored = {c.id for c in self.book.connections if self._key_for(c.id)}
        dialog = ConnectionsDialog(
            [c.to_dict() for c in self.book.connections], stored, self.keys.where, self
        )

        def test(entry: dict, typed_key) -> None:
            key = typed_key if typed_key is not None else self._key_for(entry["id"])
            self.catalog.refresh(Connection.from_dict(entry), key)

        dialog.testRequested.connect(test)
        self.catalog.listed.connect(dialog.show_test_result)
        dialog.finished.connect(lambda result: self._connections_closed(dialog, result))
        self.connections_dialog = dialog
        dialog.open()  # window-modal, not exec(): the window keeps streaming meanwhile
        return dialog

    def _connections_closed(self, dialog: ConnectionsDialog, result: int) -> None:
        self.catalog.listed.disconnect(dialog.show_test_result)
        if not result:
            return
        try:
            for connection_id, key in dialog.key_edits.items():
                self.keys.set(connection_id, key or None)
        except EngineError as exc:
            self.show_error("The API key was not saved", str(exc))
        before = {c.id: c for c in self.book.connections}
        self.settings.connections = dialog.result_connections()
        self.settings_file.save(self.settings)
        self.book.connections = self._connections_from_settings()
        active = self.backends.model
        remote = parse_remote_path(active.path) if active is not None else None
        if remote is not None and self.backends.kind == "remote":
            connection = self.book.get(remote[0])
            if connection != before.get(remote[0]) or remote[0] in dialog.key_edits:
                # its address, timeout or key changed: connect again with the new ones
                self.model_bar.show_loading(f"{remote[1]} (remote)")
                self.backends.remote.load_model(active.path)
        self.catalog.models = {
            k: v for k, v in self.catalog.models.items() if self.book.get(k) is not None
        }
        self.refresh_remote_models()

    # --- errors, drag and drop, close -----------------------------------------------------------
    def show_startup_notices(self, notices: list[str]) -> None:
        """What happened to the app's own data at start-up (recovered database, read-only data
        directory, settings reset), shown until the user hides it."""
        for i, text in enumerate(notices):
            self.notice_banner.show_notice(f"startup-{i}", text)

    def _on_storage_problem(self, message: str) -> None:
        """A failed save (disk full): a banner, not a dialog per token; retried on a timer."""
        if message:
            self.notice_banner.show_notice("storage", message, "error")
            self.save_retry_timer.start()
        else:
            self.notice_banner.clear_notice("storage")
            self.save_retry_timer.stop()

    def bring_forward(self) -> None:
        """Another LocalChat started on this data directory and asked for this window."""
        if self.isMinimized():
            self.showNormal()
        self.show()
        self.raise_()
        self.activateWindow()

    def show_error(self, title: str, message: str) -> None:
        QMessageBox.critical(self, title, message)

    def dragEnterEvent(self, event):
        if any(u.toLocalFile().lower().endswith(".gguf") for u in event.mimeData().urls()):
            event.acceptProposedAction()

    def dropEvent(self, event):
        for url in event.mimeData().urls():
            if url.toLocalFile().lower().endswith(".gguf"):
                self.open_model(url.toLocalFile())
                event.acceptProposedAction()
                return

    def show_documents_panel(self) -> None:
        self.tabs.setCurrentWidget(self.documents_panel)

    def closeEvent(self, event):
        self.frame_timer.stop()
        self.documents.shutdown()  # a running index stops; finished files are kept
        self.session.tick()  # last partial save before the thread goes away
        self.session.retry_saves()  # and a last try for replies a full disk kept in memory
        self.save_retry_timer.stop()
        if self._download_runner is not None:
            self._download_runner.stop()  # the partial file is kept; the next download continues it
        self.session.tools.cancel()  # a call waiting or running ends, answered as stopped
        self.session.tool_registry.close()
        self.export_feature.shutdown()  # a running export stops and leaves no partial file
        self.backends.shutdown()
        self.settings_file.save(self.settings)
        super().closeEvent(event)
