"""The Tools panel: which tools the open chat offers the model, and the MCP servers the user added.

Built-in tools (date and time, calculator) run without asking; fetch_url (web pages) and a
server's tools run after the user approves each call in the chat. Each tool has a checkbox for the open chat. Servers are
listed with their state (starting, ready, error with its message) and can be added (a command for
stdio, or an http(s):// URL for streamable HTTP), restarted and removed.

The panel shows plain records (ToolRegistry.snapshot / builtin_rows) and reports what the user
does through signals; it never touches a server itself. A line under the intro says where the
open chat's choice of tools comes from: its project's list (until a box is ticked here, which
gives the chat its own) or the chat's own, as the preset panel says for the sampling values.
"""

from __future__ import annotations

from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import (
    QApplication,
    QCheckBox,
    QFormLayout,
    QGroupBox,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QPushButton,
    QScrollArea,
    QVBoxLayout,
    QWidget,
)

from app.project_settings import SOURCE_PROJECT
from app.theme import text_color

STATUS_TEXT = {"starting": "starting…", "ready": "ready", "error": "error"}


class ToolsPanel(QWidget):
    toolToggled = Signal(str, bool)  # tool key, enabled in the open chat
    addServerRequested = Signal(str, str)  # name, command line or URL
    removeServerRequested = Signal(str)
    restartServerRequested = Signal(str)

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        self.boxes: dict[str, QCheckBox] = {}  # tool key -> its checkbox
        self.server_labels: dict[str, QLabel] = {}  # server name -> its status line
        self._enabled: set[str] = set()
        self._builtins: list[dict] = []
        self._servers: list[dict] = []

        # One scroll area holds it all (intro, tools, servers, the add form): with a large font
        # or a short window the panel scrolls, where it once squeezed the add form until its
        # fields were a few pixels tall and could not be used.
        outer = QVBoxLayout(self)
        outer.setContentsMargins(0, 0, 0, 0)
        self.scroll_area = QScrollArea()
        self.scroll_area.setWidgetResizable(True)
        self.scroll_area.setFrameShape(QScrollArea.NoFrame)
        outer.addWidget(self.scroll_area)
        content = QWidget()
        content_layout = QVBoxLayout(content)
        content_layout.setContentsMargins(4, 4, 4, 4)
        intro = QLabel(
            "Tools the model may call in this chat. Built-in tools run without asking; "
            "MCP server tools run only after you allow each call."
        )
        intro.setWordWrap(True)
        content_layout.addWidget(intro)
        self.source_label = QLabel()
        self.source_label.setObjectName("tools_source")
        self.source_label.setWordWrap(True)
        self.source_label.setVisible(False)
        content_layout.addWidget(self.source_label)
        self._list = QWidget()
        self._list_layout = QVBoxLayout(self._list)
        self._list_layout.setContentsMargins(0, 0, 0, 0)
        content_layout.addWidget(self._list)

        self.add_group = add = QGroupBox("Add an MCP server")
        form = QFormLayout(add)
        # Labels above their fields: beside them, "Command or URL" at 14 pt left the field a
        # sliver of the panel.
        form.setRowWrapPolicy(QFormLayout.WrapAllRows)
        form.setFieldGrowthPolicy(QFormLayout.AllNonFixedFieldsGrow)
        self.name_edit = QLineEdit()
        self.name_edit.setPlaceholderText("files")
        self.target_edit = QLineEdit()
        self.target_edit.setPlaceholderText("uvx mcp-server-fetch   or   http://127.0.0.1:8000/mcp")
        self.target_edit.setToolTip(
            "A command that starts a stdio MCP server, or the http(s):// URL of one"
        )
        self.add_button = QPushButton("Add server")
        self.add_error = QLabel()
        self.add_error.setObjectName("tools_add_error")
        self.add_error.setWordWrap(True)
        self.add_error.setStyleSheet(f"color: {text_color(QApplication.palette(), 'bad')};")
        self.add_error.setVisible(False)
        form.addRow("Name", self.name_edit)
        form.addRow("Command or URL", self.target_edit)
        form.addRow(self.add_button)
        form.addRow(self.add_error)
        self.add_button.clicked.connect(self._add)
        self.target_edit.returnPressed.connect(self._add)
        content_layout.addWidget(add)
        content_layout.addStretch(1)
        self.scroll_area.setWidget(content)

    # --- what to show ------------------------------------------------------------------------
    def show_tools(self, builtins: list[dict], servers: list[dict]) -> None:
        self._builtins, self._servers = builtins, servers
        self._rebuild()

    def show_chat_tools(self, chat: dict) -> None:
        """The open chat's record (ChatSession.chat_tools): "enabled" keys, "source" ("chat",
        "project" or ""), "project" (its project's name, None for none)."""
        self._enabled = set(chat.get("enabled") or [])
        self._show_source(chat.get("source") or "", chat.get("project"))
        for key, box in self.boxes.items():
            box.blockSignals(True)
            box.setChecked(key in self._enabled)
            box.blockSignals(False)

    def _show_source(self, source: str, project: str | None) -> None:
        if project is None:
            text, tip = "", ""
        elif source == SOURCE_PROJECT:
            text = f"From project “{project}”"
            tip = (
                f"This chat uses the tools chosen for project “{project}”. Ticking or clearing "
                "a box gives this chat its own choice; the project's stays as it is."
            )
        else:
            text = "This chat's own choice"
            tip = f"This chat has its own choice of tools; project “{project}” has its own."
        self.source_label.setText(text)
        self.source_label.setToolTip(tip)
        self.source_label.setVisible(bool(text))

    def show_add_error(self, message: str) -> None:
        self.add_error.setText(message)
        self.add_error.setVisible(bool(message))
        if not message:
            self.name_edit.clear()
            self.target_edit.clear()

    def _rebuild(self) -> None:
        while self._list_layout.count():
            item = self._list_layout.takeAt(0)
            if item.widget() is not None:
                item.widget().hide()  # deleteLater alone leaves it drawn until the loop runs
                item.widget().deleteLater()
        self.boxes, self.server_labels = {}, {}
        builtin = QGroupBox("Built-in")
        builtin.setToolTip(
            "Built-in tools run without asking, except fetch_url, which reaches the network "
            "and asks before each call"
        )
        layout = QVBoxLayout(builtin)
        for tool in self._builtins:
            layout.addWidget(self._box(tool))
        self._list_layout.addWidget(builtin)
        for server in self._servers:
            self._list_layout.addWidget(self._server_group(server))
        if not self._servers:
            hint = QLabel("No MCP servers yet: add one below.")
            hint.setObjectName("placeholder")
            hint.setWordWrap(True)
            self._list_layout.addWidget(hint)

    def _box(self, tool: dict) -> QCheckBox:
        box = QCheckBox(tool["name"])
        box.setToolTip(tool.get("description", ""))
        box.setChecked(tool["key"] in self._enabled)
        box.toggled.connect(lambda on, key=tool["key"]: self.toolToggled.emit(key, on))
        self.boxes[tool["key"]] = box
        return box

    def _server_group(self, server: dict) -> QGroupBox:
        group = QGroupBox(f"{server['name']} (MCP)")
        group.setToolTip("An MCP server: LocalChat asks you before each call to its tools")
        layout = QVBoxLayout(group)
        target = QLabel(server["target"])
        target.setObjectName("tools_server_target")
        target.setTextInteractionFlags(Qt.TextSelectableByMouse)
        target.setWordWrap(True)
        layout.addWidget(target)
        status = STATUS_TEXT.get(server["status"], server["status"])
        if server.get("message"):
            status += f": {server['message']}"
        label = QLabel(status)
        label.setWordWrap(True)
        label.setObjectName("tools_server_status")
        if server["status"] == "error":
            label.setStyleSheet(f"color: {text_color(QApplication.palette(), 'bad')};")
        self.server_labels[server["name"]] = label
        layout.addWidget(label)
        for tool in server.get("tools") or []:
            layout.addWidget(self._box(tool))
        buttons = QHBoxLayout()
        restart = QPushButton("Restart")
        restart.setEnabled(server["status"] != "starting")
        restart.clicked.connect(lambda: self.restartServerRequested.emit(server["name"]))
        remove = QPushButton("Remove")
        remove.clicked.connect(lambda: self.removeServerRequested.emit(server["name"]))
        buttons.addWidget(restart)
        buttons.addWidget(remove)
        buttons.addStretch(1)
        layout.addLayout(buttons)
        return group

    def _add(self) -> None:
        self.addServerRequested.emit(self.name_edit.text(), self.target_edit.text())
