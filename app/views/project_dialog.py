"""A project's settings: name, system prompt (persona), default model, preset and tools.

Each part says what it does for the project's chats: a chat's own system prompt, tools or model
come first, the project's stand in when it has none (app/project_settings.py). Nothing is
written until OK, and OK is refused (with the reason beside the field) while the name or the
preset is not valid, so a mistake never reaches the store.
"""

from __future__ import annotations

from PySide6.QtCore import Qt
from PySide6.QtWidgets import (
    QCheckBox,
    QComboBox,
    QDialog,
    QDialogButtonBox,
    QFormLayout,
    QGroupBox,
    QLabel,
    QLineEdit,
    QPlainTextEdit,
    QVBoxLayout,
    QWidget,
)

from app.names import NAME_MAX_CHARS, InvalidNameError, clean_name
from app.project_settings import (
    PresetParseError,
    Project,
    ProjectSettings,
    format_preset,
    parse_preset,
)
from engine.errors import EngineError

NO_MODEL = "(the model in use)"


class ProjectDialog(QDialog):
    def __init__(
        self,
        project: Project,
        models: list[str],
        tools: list[dict],
        parent: QWidget | None = None,
    ):
        """`models`: paths the user has opened (newest first); `tools`: {"key", "name",
        "description"} rows of the tools that can run now (ToolRegistry)."""
        super().__init__(parent)
        self.setWindowTitle(f"Project settings — {project.name}")
        self.setMinimumWidth(520)
        self.project = project
        layout = QVBoxLayout(self)
        form = QFormLayout()
        self.name_edit = QLineEdit(project.name)
        self.name_edit.setMaxLength(NAME_MAX_CHARS)
        self.name_error = _error_label()
        form.addRow("Name:", self.name_edit)
        form.addRow("", self.name_error)

        self.prompt_edit = QPlainTextEdit(project.system_prompt)
        self.prompt_edit.setPlaceholderText(
            "System prompt or persona for this project's chats (a chat's own prompt comes first)"
        )
        self.prompt_edit.setFixedHeight(90)
        form.addRow("System prompt:", self.prompt_edit)

        self.model_combo = QComboBox()
        self.model_combo.setEditable(False)
        self.model_combo.addItem(NO_MODEL, None)
        wanted = project.settings.model
        for path in dict.fromkeys([*([wanted] if wanted else []), *models]):
            self.model_combo.addItem(path.rsplit("/", 1)[-1], path)
            self.model_combo.setItemData(self.model_combo.count() - 1, path, Qt.ToolTipRole)
        self.model_combo.setCurrentIndex(max(0, self.model_combo.findData(wanted)))
        self.model_combo.setToolTip(
            "Opened for a chat of this project that no model has answered yet"
        )
        form.addRow("Default model:", self.model_combo)

        self.preset_edit = QPlainTextEdit(format_preset(project.settings.preset))
        self.preset_edit.setPlaceholderText("temperature = 0.3\ntop_p = 0.9")
        self.preset_edit.setFixedHeight(70)
        self.preset_edit.setToolTip(
            "Sampling values for this project's chats, one field = value per line. They sit over "
            "the model's saved preset and under what you type in the Preset panel, which shows "
            "them as coming from the project."
        )
        self.preset_error = _error_label()
        form.addRow("Preset:", self.preset_edit)
        form.addRow("", self.preset_error)
        layout.addLayout(form)

        self.tools_box = QGroupBox("Set the tools of this project's chats")
        self.tools_box.setCheckable(True)
        self.tools_box.setChecked(project.settings.tools is not None)
        self.tools_box.setToolTip(
            "Off: each chat has the tools it was given. On: a chat that has not chosen its own "
            "tools gets these."
        )
        tools_layout = QVBoxLayout(self.tools_box)
        self.tool_checks: dict[str, QCheckBox] = {}
        chosen = set(project.settings.tools or [])
        known = {row["key"] for row in tools}
        # a tool the project names whose server is not running now is kept, shown as such
        rows = tools + [
            {"key": k, "name": k, "description": "not available now"}
            for k in sorted(chosen - known)
        ]
        for row in rows:
            box = QCheckBox(row["name"])
            box.setToolTip(row.get("description") or row["key"])
            box.setChecked(row["key"] in chosen)
            tools_layout.addWidget(box)
            self.tool_checks[row["key"]] = box
        if not rows:
            tools_layout.addWidget(QLabel("No tools are available."))
        layout.addWidget(self.tools_box)

        self.buttons = QDialogButtonBox(QDialogButtonBox.Ok | QDialogButtonBox.Cancel)
        self.buttons.accepted.connect(self.accept)
        self.buttons.rejected.connect(self.reject)
        layout.addWidget(self.buttons)
        self.result_name = project.name
        self.result_prompt = project.system_prompt
        self.result_settings = project.settings

    def accept(self) -> None:
        """Check everything; show each problem beside its field and stay open, or keep the
        results (result_*) and close."""
        ok = True
        try:
            name = clean_name(self.name_edit.text(), "project name")
            self.name_error.hide()
        except InvalidNameError as exc:
            _show(self.name_error, str(exc))
            ok = False
        try:
            preset = parse_preset(self.preset_edit.toPlainText())
            self.preset_error.hide()
        except (PresetParseError, EngineError) as exc:
            _show(self.preset_error, str(exc))
            ok = False
        if not ok:
            return
        tools = (
            sorted(k for k, box in self.tool_checks.items() if box.isChecked())
            if self.tools_box.isChecked()
            else None
        )
        old = self.project.settings
        self.result_name = name
        self.result_prompt = self.prompt_edit.toPlainText().strip()
        self.result_settings = ProjectSettings(
            model=self.model_combo.currentData(),
            preset=preset,
            tools=tools,
            collections=list(old.collections),
            extra=dict(old.extra),
        )
        super().accept()


def _error_label() -> QLabel:
    label = QLabel()
    label.setWordWrap(True)
    label.setObjectName("error")
    label.setStyleSheet("color: #c62828;")
    label.hide()
    return label


def _show(label: QLabel, text: str) -> None:
    label.setText(text)
    label.show()
