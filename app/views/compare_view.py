"""The compare view: one prompt answered by two or more columns side by side, each with its own
preset, streaming at once (the logic is app/compare.py's CompareRun).

Each reply is drawn token by token with a confidence shading (the probability of the chosen
token: the less sure the model was, the darker the amber behind the token); the first token
where a column differs from the first column is outlined in red, and the column shows both
columns' top alternatives at that position.
"""

from __future__ import annotations

import html
import math
from dataclasses import replace
from pathlib import Path

from PySide6.QtCore import Qt, QTimer, Signal
from PySide6.QtGui import QColor, QPalette
from PySide6.QtWidgets import (
    QDialog,
    QFrame,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QMenu,
    QPlainTextEdit,
    QPushButton,
    QScrollArea,
    QTextBrowser,
    QVBoxLayout,
    QWidget,
)

from app.compare import ColumnSpec, CompareRun, Divergence, confidence
from app.features.prefill_progress import prefill_running
from app.preset_state import format_value, parse_value
from app.views.file_dialogs import open_file
from engine.events import TokenSampled

SHADE = QColor(255, 160, 0)  # amber: uncertain tokens
# The values a column header shows with their sources (the rest are as in the preset panel).
SHOWN_FIELDS = ("do_sample", "temperature", "top_k", "top_p", "min_p", "seed")
FRAME_MS = 33  # columns repaint at most ~30 times a second while they stream

LEGEND = (
    "<b>Shading</b>: the probability the model gave each token it chose — white is sure "
    "(100%), darker amber is less sure (the darkest is 0%). "
    "<span style='border:1px solid red; color:#c00000'><b>Red</b></span>: the first token where "
    "a column differs from the first column; its top alternatives and the first column's are "
    "listed under the reply."
)


def parse_overrides(text: str, current: dict) -> dict:
    """'temperature=0.8, seed=7' -> {'temperature': 0.8, 'seed': 7}, each value typed like the
    field's current value (the preset panel's parser). Unknown fields are kept: the engine's
    resolution names them."""
    overrides: dict = {}
    for part in text.split(","):
        if not part.strip():
            continue
        name, _, value = part.partition("=")
        name = name.strip()
        overrides[name] = parse_value(value, current.get(name))
    return overrides


def format_overrides(overrides: dict) -> str:
    return ", ".join(f"{k}={format_value(v)}" for k, v in overrides.items())


def shade_color(p: float, base: QColor) -> QColor:
    """The background of a token chosen with probability p: the base colour at p=1, amber at 0."""
    t = max(0.0, min(1.0, 1.0 - p)) * 0.85
    return QColor(
        round(base.red() + (SHADE.red() - base.red()) * t),
        round(base.green() + (SHADE.green() - base.green()) * t),
        round(base.blue() + (SHADE.blue() - base.blue()) * t),
    )


def alternatives_html(title: str, token: TokenSampled | None) -> str:
    if token is None:
        return f"<b>{html.escape(title)}</b>: the reply had ended"
    rows = "".join(
        f"<tr><td>{html.escape(repr(a.text))}</td><td align='right'>"
        f"{math.exp(a.logprob):.1%}</td></tr>"
        for a in token.top
    )
    return (
        f"<b>{html.escape(title)}</b> chose {html.escape(repr(token.text))} "
        f"({confidence(token):.1%})<table cellspacing='0' cellpadding='1'>{rows}</table>"
    )


class CompareColumn(QFrame):
    """One column: its preset, the shaded reply, usage and TTFT, the divergence, its buttons."""

    useRequested = Signal(int)
    removeRequested = Signal(int)
    presetEdited = Signal(int, str)
    modelRequested = Signal(int)

    def __init__(self, index: int, parent: QWidget | None = None):
        super().__init__(parent)
        self.index = index
        self.setFrameShape(QFrame.StyledPanel)
        self.setMinimumWidth(320)
        layout = QVBoxLayout(self)
        header = QHBoxLayout()
        self.title = QLabel()
        self.remove_button = QPushButton("Remove")
        self.remove_button.setToolTip("Remove this column")
        self.remove_button.clicked.connect(lambda: self.removeRequested.emit(self.index))
        header.addWidget(self.title, 1)
        header.addWidget(self.remove_button)
        layout.addLayout(header)
        model_row = QHBoxLayout()
        self.model_label = QLabel()
        self.model_label.setObjectName("compare_model")
        self.model_button = QPushButton("Model…")
        self.model_button.setToolTip(
            "Answer with another GGUF file (e.g. another quant of the same model); it is loaded "
            "beside the chat's model while this window is open"
        )
        self.model_button.clicked.connect(lambda: self.modelRequested.emit(self.index))
        model_row.addWidget(self.model_label, 1)
        model_row.addWidget(self.model_button)
        layout.addLayout(model_row)
        self.preset_edit = QLineEdit()
        self.preset_edit.setPlaceholderText("preset values, e.g. temperature=0.8, seed=7")
        self.preset_edit.setToolTip(
            "This column's preset values over the model's saved preset (field=value, comma "
            "separated); every other value comes from the preset panel's sources"
        )
        self.preset_edit.editingFinished.connect(
            lambda: self.presetEdited.emit(self.index, self.preset_edit.text())
        )
        layout.addWidget(self.preset_edit)
        self.sources = QLabel()
        self.sources.setObjectName("compare_sources")
        self.sources.setWordWrap(True)
        layout.addWidget(self.sources)
        self.usage = QLabel()  # above the reply: every column's numbers on one line
        self.usage.setObjectName("compare_usage")
        layout.addWidget(self.usage)
        self.reply = QTextBrowser()
        self.reply.setObjectName("compare_reply")
        layout.addWidget(self.reply, 1)
        self.error = QLabel()
        self.error.setObjectName("compare_error")
        self.error.setWordWrap(True)
        self.error.setStyleSheet("color: #c00000")
        self.error.setVisible(False)
        layout.addWidget(self.error)
        self.divergence = QLabel()
        self.divergence.setObjectName("compare_divergence")
        self.divergence.setWordWrap(True)
        self.divergence.setTextFormat(Qt.RichText)
        layout.addWidget(self.divergence)
        self.use_button = QPushButton("Use this answer")
        self.use_button.setToolTip("Add this reply to the chat as a new version of the reply")
        self.use_button.setEnabled(False)
        self.use_button.clicked.connect(lambda: self.useRequested.emit(self.index))
        layout.addWidget(self.use_button)


class CompareDialog(QDialog):
    def __init__(self, run: CompareRun, parent: QWidget | None = None):
        super().__init__(parent)
        self.run = run
        self.setWindowTitle("Compare side by side")
        self.resize(1180, 720)
        layout = QVBoxLayout(self)
        self.prompt = QPlainTextEdit(run.prompt)
        self.prompt.setPlaceholderText("The prompt every column answers (after the chat's history)")
        self.prompt.setMaximumHeight(80)
        layout.addWidget(self.prompt)
        buttons = QHBoxLayout()
        self.history_label = QLabel()
        self.compare_button = QPushButton("Compare")
        self.compare_button.setDefault(True)
        self.compare_button.clicked.connect(self.start)
        self.stop_button = QPushButton("Stop")
        self.stop_button.clicked.connect(run.stop)
        self.add_button = QPushButton("Add column")
        self.add_button.clicked.connect(self.add_column)
        buttons.addWidget(self.history_label, 1)
        for button in (self.add_button, self.compare_button, self.stop_button):
            buttons.addWidget(button)
        layout.addLayout(buttons)
        self.problem = QLabel()
        self.problem.setStyleSheet("color: #c00000")
        self.problem.setVisible(False)
        layout.addWidget(self.problem)
        scroll = QScrollArea()
        scroll.setWidgetResizable(True)
        self._columns_host = QWidget()
        self._columns_layout = QHBoxLayout(self._columns_host)
        scroll.setWidget(self._columns_host)
        layout.addWidget(scroll, 1)
        self.legend = QLabel(LEGEND)
        self.legend.setObjectName("compare_legend")
        self.legend.setWordWrap(True)
        layout.addWidget(self.legend)
        self.column_widgets: list[CompareColumn] = []
        self._dirty: set[int] = set()
        self._frame = QTimer(self)
        self._frame.setSingleShot(True)
        self._frame.timeout.connect(self._repaint)
        run.columnChanged.connect(self._on_column_changed)
        run.finished.connect(self._on_finished)
        self._rebuild_columns()
        self._update_buttons()

    # --- columns --------------------------------------------------------------------------------
    def _rebuild_columns(self) -> None:
        for widget in self.column_widgets:
            widget.setParent(None)
            widget.deleteLater()
        self.column_widgets = []
        for i, column in enumerate(self.run.columns):
            widget = CompareColumn(i)
            widget.preset_edit.setText(format_overrides(column.spec.overrides))
            widget.presetEdited.connect(self.set_column_preset)
            widget.useRequested.connect(self.use_answer)
            widget.removeRequested.connect(self.remove_column)
            widget.modelRequested.connect(self.ask_model)
            self._columns_layout.addWidget(widget)
            self.column_widgets.append(widget)
        self._repaint(all_columns=True)

    def _defaults(self) -> dict:
        try:
            return dict(self.run.controller.resolve_preset(None, None).values)
        except Exception:  # no model: values parse as typed
            return {}

    def set_column_preset(self, index: int, text: str) -> None:
        if self.run.running or index >= len(self.run.columns):
            return
        specs = [c.spec for c in self.run.columns]
        specs[index] = replace(specs[index], overrides=parse_overrides(text, self._defaults()))
        self.run.set_columns(specs)
        self._rebuild_columns()

    def model_menu(self, index: int) -> QMenu:
        """What column `index` can answer with: the loaded model, the picked remote model (once
        one was picked in the Remote menu), another GGUF file."""
        menu = QMenu(self)
        loaded = self.run.controller.model
        name = loaded.name if loaded is not None else "no model open"
        menu.addAction(f"The loaded model ({name})", lambda: self.set_column_model(index, None))
        remote = self.run.remote_model()
        if remote is not None:
            menu.addAction(
                f"Remote: {remote.name}", lambda: self.set_column_model(index, remote.path)
            )
        menu.addAction("Another GGUF file…", lambda: self._ask_file(index))
        return menu

    def ask_model(self, index: int) -> None:
        if self.run.running:
            return
        button = self.column_widgets[index].model_button
        self.model_menu(index).exec(button.mapToGlobal(button.rect().bottomLeft()))

    def _ask_file(self, index: int) -> None:
        loaded = self.run.controller.model
        start = str(Path(loaded.path).parent) if loaded is not None else ""
        path = open_file(self, "Answer with another model file", "GGUF models (*.gguf)", start)
        if path:
            self.set_column_model(index, path)

    def set_column_model(self, index: int, path: str | None) -> None:
        """Column `index` answers with the GGUF file `path` (None: the loaded model)."""
        if self.run.running or index >= len(self.run.columns):
            return
        loaded = self.run.controller.model
        if loaded is not None and path == loaded.path:
            path = None
        specs = [c.spec for c in self.run.columns]
        specs[index] = replace(specs[index], model_path=path)
        self.run.set_columns(specs)
        self._rebuild_columns()

    def done(self, result: int) -> None:
        self.run.close()  # stop the columns, unload a second model file
        super().done(result)

    def add_column(self) -> None:
        if self.run.running:
            return
        specs = [c.spec for c in self.run.columns]
        n = len(specs) + 1
        specs.append(ColumnSpec(f"Column {n}", {"do_sample": True, "temperature": 1.0}))
        self.run.set_columns(specs)
        self._rebuild_columns()
        self._update_buttons()

    def remove_column(self, index: int) -> None:
        if self.run.running or len(self.run.columns) <= 2:
            return
        specs = [c.spec for i, c in enumerate(self.run.columns) if i != index]
        self.run.set_columns(specs)
        self._rebuild_columns()
        self._update_buttons()

    # --- running --------------------------------------------------------------------------------
    def start(self) -> None:
        for widget in self.column_widgets:  # an edit not yet committed with Enter counts
            spec = self.run.columns[widget.index].spec
            if widget.preset_edit.text() != format_overrides(spec.overrides):
                self.set_column_preset(widget.index, widget.preset_edit.text())
        problem = self.run.start(self.prompt.toPlainText())
        self.problem.setText(problem or "")
        self.problem.setVisible(problem is not None)
        self._repaint(all_columns=True)
        self._update_buttons()

    def use_answer(self, index: int) -> None:
        if self.run.use_answer(index) is not None:
            self.column_widgets[index].use_button.setEnabled(False)
            self.column_widgets[index].use_button.setText("Added to the chat")

    def _on_column_changed(self, index: int) -> None:
        self._dirty.add(index)
        if not self._frame.isActive():
            self._frame.start(FRAME_MS)

    def _on_finished(self) -> None:
        self._frame.stop()
        self._repaint(all_columns=True)
        self._update_buttons()

    def _update_buttons(self) -> None:
        running = self.run.running
        self.compare_button.setEnabled(not running)
        self.stop_button.setEnabled(running)
        self.add_button.setEnabled(not running)
        self.prompt.setReadOnly(running)
        n = sum(1 for m in self.run.messages()[:-1] if m["role"] != "system")
        self.history_label.setText(f"With the chat's history: {n} messages before the prompt")
        for widget in self.column_widgets:
            widget.preset_edit.setReadOnly(running)
            widget.remove_button.setEnabled(not running and len(self.column_widgets) > 2)
            widget.model_button.setEnabled(not running)

    # --- painting -------------------------------------------------------------------------------
    def _repaint(self, all_columns: bool = False) -> None:
        indexes = range(len(self.column_widgets)) if all_columns else sorted(self._dirty)
        self._dirty.clear()
        divergences = {
            i: self.run.divergence(i) for i in range(1, len(self.run.columns))
        }  # cheap: a zip over two id lists
        for i in indexes:
            if i < len(self.column_widgets):
                self._paint_column(i, divergences)

    def _paint_column(self, i: int, divergences: dict[int, Divergence | None]) -> None:
        column, widget = self.run.columns[i], self.column_widgets[i]
        widget.title.setText(f"<b>{html.escape(column.spec.label)}</b>")
        model = column.model_name or (
            column.spec.model_path.rsplit("/", 1)[-1]
            if column.spec.model_path
            else "the loaded model"
        )
        widget.model_label.setText(f"Model: {html.escape(model)}")
        try:
            view = self.run.resolve(i)
            if view is not None:
                values, sources = view.values, view.sources
            elif column.finished is not None and column.finished.preset:
                values = column.finished.preset.get("values", {})
                sources = column.finished.preset.get("sources", {})
            else:
                values, sources = {}, {}
            widget.sources.setText(
                "; ".join(
                    f"{name} {format_value(values.get(name))} ({sources.get(name, '')})"
                    for name in SHOWN_FIELDS
                    if name in values
                )
                or "Its values are resolved from that file when the column starts."
            )
        except Exception as exc:  # the engine's message, as the column's error will say
            widget.sources.setText(f"Invalid preset: {exc}")
        marks = {d.index for d in divergences.values() if d is not None} if i == 0 else set()
        mine = divergences.get(i)
        if mine is not None:
            marks.add(mine.index)
        widget.reply.setHtml(self._reply_html(i, marks))
        widget.error.setText(column.error or "")
        widget.error.setVisible(column.error is not None)
        widget.usage.setText(self._usage_text(i, column))
        if i > 0 and mine is not None:
            reference = self.run.columns[mine.reference].spec.label
            widget.divergence.setText(
                f"Differs from <b>{html.escape(reference)}</b> at token {mine.index + 1}:<br>"
                + alternatives_html(column.spec.label, mine.other_token)
                + "<br>"
                + alternatives_html(reference, mine.reference_token)
            )
        elif i > 0 and not self.run.shares_tokenizer(i):
            widget.divergence.setText(
                "Another tokenizer than the first column's: its tokens cannot be compared one "
                "by one."
            )
        elif i > 0 and column.finished is not None and self.run.columns[0].finished is not None:
            widget.divergence.setText("Same tokens as the first column.")
        else:
            widget.divergence.setText("")
        widget.use_button.setEnabled(
            column.finished is not None
            and column.error is None
            and widget.use_button.text() == "Use this answer"
        )

    def shading(self, index: int) -> list[tuple[TokenSampled, float]]:
        """Column `index`'s reply tokens with the probability its shading shows for each."""
        column = self.run.columns[index]
        tokens = column.tokens
        if column.finished is not None:
            # the end-of-generation token is sampled but not part of the answer
            tokens = tokens[: len(column.finished.token_ids)]
        return [(t, confidence(t)) for t in tokens]

    def _reply_html(self, index: int, marks: set[int]) -> str:
        column = self.run.columns[index]
        base = self.palette().color(QPalette.Base)
        parts = []
        for t, p in self.shading(index):
            style = f"background-color:{shade_color(p, base).name()}"
            if t.index in marks:
                style += "; border:1px solid red; color:#c00000; font-weight:bold"
            piece = html.escape(t.text).replace("\n", "<br>")
            parts.append(f"<span style='{style}' title='{p:.1%}'>{piece}</span>")
        if not parts and column.text:
            return html.escape(column.text).replace("\n", "<br>")
        return "".join(parts)

    def _usage_text(self, index: int, column) -> str:
        if column.running and not column.tokens and prefill_running(column.prefill):
            return self.run.progress_text(index)  # its prompt is being read, or waits its turn
        u = column.usage
        ttft = column.ttft_ms
        bits = []
        if u is not None:
            bits.append(f"{u.completion_tokens} tokens")
            if u.decode_tok_s:
                bits.append(f"{u.decode_tok_s:.1f} tok/s")
            bits.append(f"prompt {u.prompt_tokens}")
            if u.cached_tokens:
                bits.append(f"{u.cached_tokens} cached")
        elif column.tokens:
            bits.append(f"{len(column.tokens)} tokens")
        if ttft is not None:
            bits.append(f"TTFT {ttft:.0f} ms")
        if column.finished is not None:
            bits.append(str(column.finished.finish_reason))
        elif column.running:
            bits.append("streaming…")
        return " · ".join(bits)
