"""Time to first token: the current reply's TTFT and prefill time, and a strip of recent replies
painted with QPainter (one bar per reply, newest on the right, the current one highlighted)."""

from __future__ import annotations

from PySide6.QtCore import QRectF, Qt
from PySide6.QtGui import QColor, QPainter, QPalette
from PySide6.QtWidgets import QLabel, QVBoxLayout, QWidget

from app.views.panel_box import ElidingGroupBox

MAX_BARS = 20


class TtftStrip(QWidget):
    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        self.values_ms: list[float] = []
        self.setMinimumHeight(54)
        self.setToolTip("Time to first token of recent replies (newest on the right)")

    def set_values(self, values_ms: list[float]) -> None:
        self.values_ms = list(values_ms)[-MAX_BARS:]
        self.update()

    def paintEvent(self, _event) -> None:
        painter = QPainter(self)
        painter.setRenderHint(QPainter.Antialiasing)
        palette = self.palette()
        rect = self.rect().adjusted(2, 2, -2, -14)
        painter.setPen(palette.color(QPalette.Mid))
        painter.drawLine(rect.bottomLeft(), rect.bottomRight())
        if not self.values_ms:
            painter.setPen(palette.color(QPalette.PlaceholderText))
            painter.drawText(self.rect(), Qt.AlignCenter, "no replies yet")
            return
        top = max(self.values_ms) or 1.0
        slot = rect.width() / MAX_BARS
        accent = palette.color(QPalette.Highlight)
        older = QColor(accent)
        older.setAlpha(110)
        start = MAX_BARS - len(self.values_ms)
        for i, value in enumerate(self.values_ms):
            height = max(2.0, rect.height() * value / top)
            x = rect.left() + (start + i) * slot + slot * 0.15
            bar = QRectF(x, rect.bottom() - height, slot * 0.7, height)
            painter.fillRect(bar, accent if i == len(self.values_ms) - 1 else older)
        painter.setPen(palette.color(QPalette.WindowText))
        painter.drawText(
            self.rect().adjusted(2, 0, -2, 0), Qt.AlignBottom | Qt.AlignLeft, f"max {top:,.0f} ms"
        )


class TtftPanel(ElidingGroupBox):  # its title elided to the narrow right panel's width
    def __init__(self, parent: QWidget | None = None):
        super().__init__("Time to first token", parent)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(8, 8, 8, 8)
        self.current = QLabel("—")
        self.current.setObjectName("ttft_current")
        self.current.setWordWrap(True)  # "<b>1,234 ms</b> · prefill 987 ms" fits at 16 pt
        self.current.setToolTip(
            "From sending to the first generated token; prefill is the part "
            "spent reading the prompt"
        )
        self.strip = TtftStrip()
        layout.addWidget(self.current)
        layout.addWidget(self.strip)
        self.history: list[float] = []

    def show_live(self, ttft_ms: float | None) -> None:
        if ttft_ms is None:
            self.current.setText("waiting for the first token…")
        else:
            self.current.setText(f"<b>{ttft_ms:,.0f} ms</b> (measured in the window)")

    def show_reply(self, ttft_ms: float | None, prefill_ms: float | None) -> None:
        if ttft_ms is None:
            self.current.setText("—")
            return
        prefill = f" · prefill {prefill_ms:,.0f} ms" if prefill_ms is not None else ""
        self.current.setText(f"<b>{ttft_ms:,.0f} ms</b>{prefill}")

    def set_history(self, values_ms: list[float]) -> None:
        """The TTFTs of the open chat's replies, oldest first (so the strip survives a restart)."""
        self.history = [float(v) for v in values_ms][-MAX_BARS:]
        self.strip.set_values(self.history)

    def add_reply(self, ttft_ms: float | None, prefill_ms: float | None) -> None:
        if ttft_ms is not None:
            self.history.append(float(ttft_ms))
            self.history = self.history[-MAX_BARS:]
            self.strip.set_values(self.history)
        self.show_reply(ttft_ms, prefill_ms)
