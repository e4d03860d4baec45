"""Usage: tokens, speeds, context bar and finish reason — live while streaming, per message after.

The panel fits the narrow right panel at any font size: a value moves under its title when the
row has no room for both, long values wrap, and speeds are written compactly ("24.6k tok/s",
the exact figure in the tooltip)."""

from __future__ import annotations

import os
from pathlib import Path

from PySide6.QtCore import QSize, Qt
from PySide6.QtWidgets import QGridLayout, QLabel, QProgressBar, QWidget

from app.finish_reasons import NOTE_STREAMING, finish_label
from app.views.elided_label import WrappingLabel
from app.views.panel_box import ElidingGroupBox

IDLE_TITLE = "Usage — last reply"
LIVE_TITLE = "Usage — generating…"
SELECTED_TITLE = "Usage — selected reply"
CONTEXT_TIP = "Context window used by this conversation vs the model's limit"


class UsagePanel(ElidingGroupBox):  # its title elided to its width
    def __init__(self, parent: QWidget | None = None):
        super().__init__(IDLE_TITLE, parent)
        grid = QGridLayout(self)
        grid.setContentsMargins(8, 8, 8, 8)
        grid.setColumnStretch(1, 1)
        # At 16 pt "Prefill speed  24,550.5 tok/s" was wider than the right panel, which then
        # scrolled sideways: when the panel has no room for titles and values side by side,
        # each value goes under its title (_fit_rows).
        self._grid = grid
        self._rows: list[tuple[QWidget, QWidget]] = []
        self._side_by_side: bool | None = None
        self.fields: dict[str, QLabel] = {}
        self._tips: dict[str, str] = {}
        for key, title, tip in (
            ("prompt_tokens", "Prompt tokens", "Tokens in the prompt after the chat template"),
            ("completion_tokens", "Reply tokens", "Tokens generated for the reply"),
            ("cached_tokens", "Cached tokens", "Prompt tokens reused from the prefix cache"),
            ("prompt_tok_s", "Prefill speed", "Prompt tokens processed per second"),
            ("decode_tok_s", "Decode speed", "Reply tokens generated per second"),
            (
                "predicted_tok_s",
                "Predicted",
                "Decode speed predicted for the loaded model on this computer before it was "
                "loaded (the model library's estimate), and how far off it was",
            ),
            ("finish_reason", "Finish", "Why the reply ended"),
        ):
            label = WrappingLabel("—")  # a long finish reason wraps, never widens the panel
            label.setToolTip(tip)
            self._tips[key] = tip
            label.setObjectName("usage_" + key)
            self.fields[key] = label
            # the titles wrap too ("Cached / tokens"): at 16 pt one alone was 155 px
            self._rows.append((WrappingLabel(title), label))
        self.context_bar = ContextBar()
        self.context_bar.setToolTip(CONTEXT_TIP)
        self.context_bar.setTextVisible(True)
        self.context_bar.setFormat("no reply yet")
        self.context_bar.setValue(0)
        self._rows.append((WrappingLabel("Context"), self.context_bar))
        # Remote replies: the server counts the tokens, the app times the stream.
        self.network_note = WrappingLabel("Times measured by the app over the network")
        self.network_note.setObjectName("usage_network_note")
        self.network_note.setToolTip(
            "Token counts are the server's; time to first token and speeds are measured here "
            "from the stream, so they include the network round trip"
        )
        self.network_note.setVisible(False)
        self.prediction = None  # engine.run_prediction.RunPrediction of the loaded model
        self._place_rows(side_by_side=True)

    # --- rows: titles and values side by side where they fit, else each value under its title
    def _place_rows(self, side_by_side: bool) -> None:
        """Titles in a column beside their values, or each value on the line under its title."""
        if side_by_side == self._side_by_side:
            return
        self._side_by_side = side_by_side
        grid = self._grid
        while grid.count():
            grid.takeAt(0)
        row = 0
        for title, field in self._rows:
            if side_by_side:
                grid.addWidget(title, row, 0, Qt.AlignLeft | Qt.AlignTop)
                grid.addWidget(field, row, 1)
            else:
                grid.addWidget(title, row, 0, 1, 2)
                row += 1
                grid.addWidget(field, row, 0, 1, 2)
            row += 1
        grid.addWidget(self.network_note, row, 0, 1, 2)

    def _frame_width(self) -> int:
        """The width around the rows: the grid's margins and the group box's frame."""
        grid, box = self._grid.contentsMargins(), self.contentsMargins()
        return grid.left() + grid.right() + box.left() + box.right()

    def _fit_rows(self) -> None:
        spacing = max(self._grid.horizontalSpacing(), 6)
        side_by_side = (
            max(title.sizeHint().width() for title, _ in self._rows)
            + spacing
            + max(field.sizeHint().width() for _, field in self._rows)
            + self._frame_width()
        )
        self._place_rows(self.width() >= side_by_side)

    def minimumSizeHint(self) -> QSize:
        # A row can put its value under its title: the widest single title or value is all
        # the rows need (the title is elided: ElidingGroupBox).
        widest = max(
            max(title.minimumSizeHint().width(), field.minimumSizeHint().width())
            for title, field in self._rows
        )
        return QSize(widest + self._frame_width(), super().minimumSizeHint().height())

    def resizeEvent(self, event) -> None:
        super().resizeEvent(event)
        self._fit_rows()

    def clear(self) -> None:
        """No reply to show (a new or empty chat, another model): nothing may still read as
        generating."""
        self.setTitle(IDLE_TITLE)
        self.network_note.setVisible(False)
        for key, label in self.fields.items():
            label.setText("—")
            label.setToolTip(self._tips[key])
        self.context_bar.setRange(0, 1)
        self.context_bar.setValue(0)
        self.context_bar.setFormat("no reply yet")
        self.context_bar.setToolTip(CONTEXT_TIP)
        self._fit_rows()

    def set_prediction(self, prediction) -> None:
        """The loaded model's prediction (None: none, or a remote model); later replies are
        compared with it."""
        self.prediction = prediction
        if prediction is None:
            self.fields["predicted_tok_s"].setText("—")
            self.fields["predicted_tok_s"].setToolTip(self._tips["predicted_tok_s"])

    def show_usage(
        self, usage: dict | None, finish_reason: str | None = None, live: bool = False
    ) -> None:
        self._show_usage(usage, finish_reason, live)
        self._fit_rows()  # a longer value may no longer fit beside its title

    def _show_usage(self, usage: dict | None, finish_reason: str | None, live: bool) -> None:
        if not usage or "error" in usage:
            self.clear()
            if usage and "error" in usage:  # refused before the stream (ReplyRecorder.fail)
                self.fields["finish_reason"].setText("error")
                self.setTitle(SELECTED_TITLE)
            return
        self.setTitle(LIVE_TITLE if live else SELECTED_TITLE)
        f = self.fields
        self.network_note.setVisible(bool(usage.get("measured_over_network")))
        remote = bool(usage.get("measured_over_network"))
        # A server that sends no usage leaves the prompt uncounted (no prompt has 0 tokens).
        unreported = remote and not usage.get("prompt_tokens") and not live
        f["prompt_tokens"].setText(
            "not reported by the server" if unreported else _int(usage.get("prompt_tokens"))
        )
        f["completion_tokens"].setText(_int(usage.get("completion_tokens")))
        cached = usage.get("cached_tokens")
        not_known = "not reported" if remote else "not used"
        f["cached_tokens"].setText(not_known if cached is None else str(cached))
        for key in ("prompt_tok_s", "decode_tok_s"):
            value = usage.get(key)
            f[key].setText(_rate(value))
            exact = f"{value:,.1f} tokens per second" if value else ""
            f[key].setToolTip(self._tips[key] + (f": {exact}" if exact else ""))
        self._show_prediction(usage.get("decode_tok_s"), remote)
        f["finish_reason"].setText(
            NOTE_STREAMING
            if live
            else finish_label(finish_reason or usage.get("finish_reason"), usage)
        )
        used, limit = int(usage.get("context_used") or 0), int(usage.get("context_limit") or 0)
        self.context_bar.setRange(0, max(limit, 1))
        self.context_bar.setValue(min(used, limit))
        if not limit and remote:  # most servers do not say how long their context window is
            self.context_bar.setFormat("size not reported")
            return
        approx = "≈" if live else ""
        self.context_bar.setFormat(f"{approx}{used:,} / {limit:,} tokens" if limit else "—")
        if limit:  # exact, whatever the bar has room to show
            self.context_bar.setToolTip(f"{CONTEXT_TIP}: {approx}{used:,} of {limit:,} tokens")

    def _show_prediction(self, measured: float | None, remote: bool) -> None:
        """ "~29.0 tok/s (+7%)": the prediction, and its error against this reply's speed (a
        server's reply is not this computer's speed: nothing to compare)."""
        label = self.fields["predicted_tok_s"]
        p = self.prediction
        if p is None or remote:
            label.setText("—")
            label.setToolTip(self._tips["predicted_tok_s"])
            return
        predicted = p.decode_tok_s
        if not measured:
            label.setText(f"~{_rate(predicted)}")
            label.setToolTip(f"{self._tips['predicted_tok_s']}: decode ~{predicted:.1f} tok/s")
            return
        error = 100 * (predicted - measured) / measured
        label.setText(f"~{_rate(predicted)} ({error:+.0f}%)")
        label.setToolTip(
            f"decode {measured:.1f} tok/s, predicted {predicted:.1f} ({error:+.0f}%); "
            f"prefill predicted ~{p.prefill_tok_s:.0f} tok/s for a 512-token prompt. "
            f"The prediction is for {Path(p.path).name} at {p.threads} threads, from this "
            f"computer's measured memory bandwidth ({p.bandwidth_bytes_per_s / 1e9:.1f} GB/s)"
            f"{_busy_note()}"
        )

    def text_of(self, key: str) -> str:
        return self.fields[key].text()


class ContextBar(QProgressBar):
    """The context bar; its text drops " tokens", then writes the counts compactly ("13.0k /
    32.8k"), then is elided, when the bar is narrower than it (Fusion clips a progress bar's
    text: at 16 pt "155 / 4,096 tokens" was cut in two). The tooltip has the exact counts."""

    PADDING = 6  # px the style keeps around the text

    def text(self) -> str:
        full = super().text()
        room = self.width() - self.PADDING
        metrics = self.fontMetrics()
        if metrics.horizontalAdvance(full) <= room:
            return full
        shorter = [full.removesuffix(" tokens")]
        if " / " in full:  # "13.0k / 32.8k"
            approx = "≈" if full.startswith("≈") else ""
            shorter.append(f"{approx}{_compact(self.value())} / {_compact(self.maximum())}")
        for short in shorter:
            if metrics.horizontalAdvance(short) <= room:
                return short
        return metrics.elidedText(shorter[-1], Qt.ElideRight, max(room, 0))

    def minimumSizeHint(self) -> QSize:
        # QProgressBar's minimum is its size hint, the whole text; it elides instead
        hint = super().minimumSizeHint()
        return QSize(self.fontMetrics().averageCharWidth() * 6 + self.PADDING, hint.height())

    def sizeHint(self) -> QSize:
        # room for the whole text: the usage rows stack when it does not fit beside its title
        hint = super().sizeHint()
        width = self.fontMetrics().horizontalAdvance(super().text()) + self.PADDING
        return QSize(max(hint.width(), width), hint.height())


def _compact(count: int) -> str:
    """A token count in a few characters: 812, 13.0k, 1.2M."""
    for limit, unit in ((1e6, "M"), (1e3, "k")):
        if count >= limit * 0.99995:
            return f"{count / limit:.1f}{unit}"
    return str(count)


def _int(value) -> str:
    return "—" if value is None else f"{int(value):,}"


def _busy_note() -> str:
    """Why a reply can be much slower than predicted: other programs want the cores too (the
    prediction is for a machine that runs only this model)."""
    try:
        load = os.getloadavg()[0]
    except (OSError, AttributeError):  # not on every platform
        return ""
    cores = os.cpu_count() or 1
    if load <= cores / 2:
        return ""
    return (
        f". Other programs are busy too (load average {load:.1f} on {cores} CPUs), which "
        "slows every reply"
    )


def _rate(value) -> str:
    """A speed in at most about six characters: 812.4, 24.6k, 1.2M tok/s."""
    if not value:
        return "—"
    for limit, unit in ((1e6, "M"), (1e3, "k")):
        if value >= limit * 0.99995:  # 999.96 is "1.0k", not "1000.0"
            return f"{value / limit:.1f}{unit} tok/s"
    return f"{value:.1f} tok/s"
