"""Token inspector: the selected reply's tokens as clickable chips; clicking one lists the top
alternatives the model considered at that position, with probabilities."""

from __future__ import annotations

import html
import math

from PySide6.QtCore import Qt, QUrl
from PySide6.QtWidgets import (
    QHeaderView,
    QLabel,
    QTableWidget,
    QTableWidgetItem,
    QTextBrowser,
    QVBoxLayout,
    QWidget,
)

from app.reply_recorder import MAX_RECORDED_TOKENS, token_record

# Chips drawn (a QTextBrowser with many anchors takes ~0.1 s per 1000); the recorder keeps
# the same number, so a long reply shows its first MAX_SHOWN tokens.
MAX_SHOWN = MAX_RECORDED_TOKENS


def _as_dict(token) -> dict:
    return token if isinstance(token, dict) else token_record(token)


def _visible(piece: str) -> str:
    return piece.replace("\n", "⏎").replace("\t", "⇥").replace(" ", "·") or "∅"


class TokenInspector(QWidget):
    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(4, 4, 4, 4)
        self.hint = QLabel(
            "Click a token to see the alternatives the model considered. Darker = less certain."
        )
        self.hint.setWordWrap(True)
        self.tokens_view = QTextBrowser()
        self.tokens_view.setOpenLinks(False)
        self.tokens_view.anchorClicked.connect(self._on_anchor)
        self.selected_label = QLabel("No token selected")
        self.selected_label.setTextFormat(Qt.PlainText)
        self.selected_label.setWordWrap(True)
        self.table = QTableWidget(0, 3)
        self.table.setHorizontalHeaderLabels(["Token", "Probability", "Id"])
        self.table.horizontalHeader().setSectionResizeMode(0, QHeaderView.Stretch)
        self.table.verticalHeader().setVisible(False)
        self.table.setEditTriggers(QTableWidget.NoEditTriggers)
        layout.addWidget(self.hint)
        layout.addWidget(self.tokens_view, 3)
        layout.addWidget(self.selected_label)
        layout.addWidget(self.table, 2)
        self.tokens: list[dict] = []
        self._dirty = False

    def set_tokens(self, tokens: list) -> None:
        self.tokens = [_as_dict(t) for t in tokens]
        self._dirty = True
        if self.isVisible():
            self._render()
            self._dirty = False
        self.table.setRowCount(0)
        self.selected_label.setText("No token selected")

    def add_tokens(self, tokens: list) -> None:
        """While streaming; drawn by flush() on the repaint tick."""
        room = MAX_SHOWN - len(self.tokens)
        if room > 0:
            self.tokens.extend(_as_dict(t) for t in tokens[:room])
            self._dirty = True

    def flush(self) -> None:
        # Drawn only when someone can see it, and only while the chip count is bounded.
        if self._dirty and self.isVisible():
            self._render()
            self._dirty = False

    def showEvent(self, event):
        super().showEvent(event)
        if self._dirty:
            self._render()
            self._dirty = False

    def _render(self) -> None:
        chips = []
        for i, t in enumerate(self.tokens[:MAX_SHOWN]):
            p = math.exp(t["logprob"])
            # Less certain tokens get a stronger background so they stand out.
            alpha = 0.12 + 0.6 * (1 - p)
            chips.append(
                f'<a href="token:{i}" style="text-decoration:none; color:palette(text); '
                f'background-color: rgba(220,120,40,{alpha:.2f});" '
                f'title="p={p:.3f}">{html.escape(_visible(t["text"]))}</a>'
            )
        tail = (
            f"<p><i>Only the first {MAX_SHOWN:,} tokens of a reply are kept for the "
            "inspector.</i></p>"
            if len(self.tokens) >= MAX_SHOWN
            else ""
        )
        # Hair spaces between chips: visibly separate, without looking like the text's own spaces
        # (those are drawn as "·").
        self.tokens_view.setHtml(
            "<p style='line-height:150%'>" + "\u200a".join(chips) + "</p>" + tail
            if chips
            else "<i>No tokens recorded for this reply.</i>"
        )

    def _on_anchor(self, url: QUrl) -> None:
        text = url.toString()
        if text.startswith("token:"):
            self.select(int(text.split(":", 1)[1]))

    def select(self, index: int) -> None:
        token = self.tokens[index]
        p = math.exp(token["logprob"])
        self.selected_label.setText(
            f"Token #{index}: “{_visible(token['text'])}” — chosen with p = {p:.1%}. Alternatives:"
        )
        rows = token["top"] or [
            {"token_id": token["token_id"], "text": token["text"], "logprob": token["logprob"]}
        ]
        self.table.setRowCount(len(rows))
        for r, alt in enumerate(rows):
            # A remote server names tokens by text only (id -1): match those by text.
            known = alt["token_id"] >= 0
            same = alt["token_id"] == token["token_id"] if known else alt["text"] == token["text"]
            marker = "▶ " if same else ""
            self.table.setItem(r, 0, QTableWidgetItem(marker + _visible(alt["text"])))
            self.table.setItem(r, 1, QTableWidgetItem(f"{math.exp(alt['logprob']):.1%}"))
            self.table.setItem(r, 2, QTableWidgetItem(str(alt["token_id"]) if known else "—"))
