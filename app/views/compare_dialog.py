"""Compare side by side: one prompt, with the chat's history, answered by two columns at once,
each with its own preset (e.g. greedy vs temperature 0.8). Each column streams with its own
usage and TTFT; every token is shaded by how confident the model was in it; when both have
ended, the first token where they differ is outlined in both and the two distributions at that
position are shown. The work runs on the engine's worker thread (EngineController.compare);
app/compare.py holds the logic."""

from __future__ import annotations

import html

from PySide6.QtWidgets import (
    QDialog,
    QGridLayout,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QPlainTextEdit,
    QPushButton,
    QTextBrowser,
    QVBoxLayout,
    QWidget,
)

from app.compare import (
    COMPARE_TOP_LOGPROBS,
    ColumnState,
    distribution_text,
    first_divergence,
    reply_html,
    usage_line,
)
from engine.types import GenerationRequest, JsonMode, Role

DEFAULT_PRESETS = ("temperature=0", "temperature=0.8 seed=1")
_BOOLS = {"true": True, "false": False}


def parse_preset(text: str) -> dict:
    """ "temperature=0.8 top_p=0.9 seed=1" -> overrides; raises ValueError naming a bad pair."""
    overrides: dict = {}
    for pair in text.replace(",", " ").split():
        name, sep, raw = pair.partition("=")
        if not sep or not name or not raw:
            raise ValueError(f"{pair!r} is not name=value (e.g. temperature=0.8)")
        value: object
        if raw.lower() in _BOOLS:
            value = _BOOLS[raw.lower()]
        else:
            try:
                value = int(raw)
            except ValueError:
                try:
                    value = float(raw)
                except ValueError:
                    raise ValueError(f"{name}={raw}: not a number or true/false") from None
        overrides[name] = value
    return overrides


class CompareColumn(QWidget):
    def __init__(self, title: str, preset: str, parent: QWidget | None = None):
        super().__init__(parent)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        head = QHBoxLayout()
        head.addWidget(QLabel(f"<b>{title}</b>"))
        self.preset = QLineEdit(preset)
        self.preset.setToolTip(
            "Sampling values for this column, name=value separated by spaces (temperature, top_k, "
            "top_p, min_p, repetition_penalty, seed, do_sample, max_new_tokens); the rest comes "
            "from the model's preset as in the chat."
        )
        head.addWidget(self.preset, 1)
        layout.addLayout(head)
        self.reply = QTextBrowser()
        layout.addWidget(self.reply, 1)
        self.usage = QLabel()
        self.usage.setWordWrap(True)
        layout.addWidget(self.usage)


class CompareDialog(QDialog):
    def __init__(self, controller, base: GenerationRequest, parent: QWidget | None = None):
        """base: the chat's request as Send would build it (history, saved preset)."""
        super().__init__(parent)
        self.setWindowTitle("Compare side by side")
        self.setModal(True)  # the worker is busy with both columns; the chat waits
        self.resize(1180, 720)
        self.controller = controller
        self.base = base
        self.states: list[ColumnState] = []
        self.divergence: int | None = None
        layout = QVBoxLayout(self)
        history = sum(1 for m in base.messages or () if m["role"] != Role.SYSTEM)
        self.history_label = QLabel(
            f"Both columns see the chat's {history} earlier messages and system prompt."
            if history
            else "Both columns answer the prompt alone (the chat is empty)."
        )
        layout.addWidget(self.history_label)
        self.prompt = QPlainTextEdit()
        self.prompt.setObjectName("compare_prompt")
        self.prompt.setPlaceholderText("A prompt for both columns…")
        self.prompt.setMaximumHeight(80)
        layout.addWidget(self.prompt)
        grid = QGridLayout()
        self.columns = [
            CompareColumn(f"{name}", preset)
            for name, preset in zip("AB", DEFAULT_PRESETS, strict=True)
        ]
        for i, column in enumerate(self.columns):
            grid.addWidget(column, 0, i)
        layout.addLayout(grid, 1)
        self.divergence_view = QTextBrowser()
        self.divergence_view.setObjectName("compare_divergence")
        self.divergence_view.setMaximumHeight(170)
        layout.addWidget(self.divergence_view)
        buttons = QHBoxLayout()
        self.status = QLabel()
        self.status.setWordWrap(True)
        buttons.addWidget(self.status, 1)
        self.run_button = QPushButton("Compare")
        self.run_button.setObjectName("compare_run")
        self.run_button.setDefault(True)
        self.run_button.clicked.connect(self.run)
        self.stop_button = QPushButton("Stop")
        self.stop_button.setEnabled(False)
        self.stop_button.clicked.connect(controller.cancel)
        buttons.addWidget(self.run_button)
        buttons.addWidget(self.stop_button)
        layout.addLayout(buttons)

        controller.compareTokens.connect(self._on_tokens)
        controller.compareText.connect(self._on_text)
        controller.compareUsage.connect(self._on_usage)
        controller.compareFinished.connect(self._on_finished)
        controller.compareErrored.connect(self._on_errored)
        controller.compareDone.connect(self._on_done)

    # --- running ----------------------------------------------------------------------------
    def requests(self) -> list[GenerationRequest]:
        prompt = self.prompt.toPlainText().strip()
        if not prompt:
            raise ValueError("Type a prompt for both columns first.")
        messages = [*(self.base.messages or ()), {"role": Role.USER, "content": prompt}]
        out = []
        for name, column in zip("AB", self.columns, strict=True):
            try:
                overrides = parse_preset(column.preset.text())
            except ValueError as exc:
                raise ValueError(f"Column {name}: {exc}") from None
            out.append(
                GenerationRequest(
                    messages=tuple(messages),
                    overrides=overrides,
                    saved_preset=self.base.saved_preset,
                    json_mode=JsonMode.OFF,
                    top_logprobs=COMPARE_TOP_LOGPROBS,
                    enable_thinking=self.base.enable_thinking,
                )
            )
        return out

    def run(self) -> None:
        if self.controller.busy or self.controller.comparing or self.controller.model is None:
            self.status.setText("The engine is busy or no model is loaded; try again in a moment.")
            return
        try:
            requests = self.requests()
        except ValueError as exc:
            self.status.setText(str(exc))
            return
        self.states = [ColumnState(dict(r.overrides)) for r in requests]
        self.divergence = None
        for column in self.columns:
            column.reply.clear()
            column.usage.clear()
        self.divergence_view.clear()
        self.status.setText("Both columns are generating…")
        self.run_button.setEnabled(False)
        self.stop_button.setEnabled(True)
        self.controller.compare(requests)

    # --- events from the controller (GUI thread) --------------------------------------------
    def _on_tokens(self, column: int, tokens: list) -> None:
        if column < len(self.states):
            self.states[column].tokens.extend(tokens)
            self._render(column)

    def _on_text(self, column: int, text: str) -> None:
        if column < len(self.states):
            self.states[column].text += text

    def _on_usage(self, column: int, usage) -> None:
        if column < len(self.states):
            self.states[column].usage = usage
            self.columns[column].usage.setText(usage_line(usage, None))

    def _on_finished(self, column: int, finished) -> None:
        if column < len(self.states):
            state = self.states[column]
            state.finished, state.usage = finished, finished.usage
            self.columns[column].usage.setText(usage_line(finished.usage, finished))

    def _on_errored(self, column: int, message: str) -> None:
        if column < len(self.states):
            self.states[column].error = message
            self.columns[column].usage.setText(html.escape(message))

    def _on_done(self) -> None:
        self.run_button.setEnabled(True)
        self.stop_button.setEnabled(False)
        if len(self.states) < 2:
            return
        a, b = self.states[0].tokens, self.states[1].tokens
        self.divergence = first_divergence(a, b)
        for column in range(len(self.columns)):
            self._render(column)
        if self.divergence is None:
            self.status.setText("Both columns chose the same tokens throughout.")
            self.divergence_view.setHtml(
                "<p>No divergence: the replies are identical token for token.</p>"
            )
            return
        self.status.setText(f"The columns first differ at generated token {self.divergence + 1}.")
        self.divergence_view.setHtml(self._divergence_html(a, b, self.divergence))

    def _render(self, column: int) -> None:
        state = self.states[column]
        view = self.columns[column].reply
        view.setHtml(
            f'<div style="white-space: pre-wrap">{reply_html(state.tokens, self.divergence)}</div>'
        )

    def _divergence_html(self, a: list, b: list, index: int) -> str:
        def table(name: str, tokens: list) -> str:
            token = tokens[index] if index < len(tokens) else None
            if token is None:
                return f"<td valign='top'><b>{name}</b>: had ended here</td>"
            rows = "".join(
                f"<tr><td>{'▶' if chosen else ''}</td><td><code>{html.escape(repr(text))}</code></td>"
                f"<td align='right'>{p:.1%}</td></tr>"
                for text, p, chosen in distribution_text(token)
            )
            return f"<td valign='top'><b>{name}</b> chose <code>{html.escape(repr(token.text))}</code><table>{rows}</table></td>"

        return (
            f"<p>First divergence at generated token {index + 1} (outlined in both replies). "
            f"Each column's top {COMPARE_TOP_LOGPROBS} choices there, after its sampling settings:</p>"
            f"<table width='100%'><tr>{table('A', a)}{table('B', b)}</tr></table>"
        )

    def done(self, result: int) -> None:
        """Closing (Esc, the title bar, accept/reject) stops the columns and lets go of the
        controller's signals."""
        if self.controller.comparing:
            self.controller.cancel()
        for signal, slot in (
            (self.controller.compareTokens, self._on_tokens),
            (self.controller.compareText, self._on_text),
            (self.controller.compareUsage, self._on_usage),
            (self.controller.compareFinished, self._on_finished),
            (self.controller.compareErrored, self._on_errored),
            (self.controller.compareDone, self._on_done),
        ):
            signal.disconnect(slot)
        super().done(result)
