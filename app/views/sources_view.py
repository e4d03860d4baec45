"""A reply's sources: what the prompt carried from the chat's documents and what was left out.

The dialog reads the receipt's "sources" section (app/features/documents.py records it: each
passage's marker, file, page, heading path, chunk id, scores and the text the model saw), so it
shows the passages as they were sent even after a document changed. The list on the left has
the passages in the prompt ([1], [2]...) and then those left out for lack of room; the right
side shows the selected one: where it is (file, page, heading), its scores and its text.

`link_citations` turns the markers a reply wrote ([1], [2, 3]) into links (cite:N) that open
this dialog on that passage.
"""

from __future__ import annotations

import html
import re
from pathlib import Path

from PySide6.QtCore import Qt
from PySide6.QtWidgets import (
    QDialog,
    QDialogButtonBox,
    QLabel,
    QListWidget,
    QListWidgetItem,
    QSplitter,
    QTextBrowser,
    QVBoxLayout,
    QWidget,
)

CITE_SCHEME = "cite"
_CODE = re.compile(r"(```.*?(?:```|$)|`[^`\n]*`)", re.DOTALL)
# [1] or [1, 2]; not an escaped \[1] and not already a link [1](...)
_MARKERS = re.compile(r"(?<!\\)\[(\d{1,3}(?:\s*,\s*\d{1,3})*)\](?!\()")


def reply_sources(receipt: dict | None) -> dict | None:
    """The receipt's sources section when the reply had passages in its prompt, else None."""
    section = (receipt or {}).get("sources")
    if isinstance(section, dict) and (section.get("sources") or section.get("left_out")):
        return section
    return None


def link_citations(text: str, markers: set[int]) -> str:
    """Markdown with each citation of a known marker as a cite:N link; code is left alone."""
    if not markers:
        return text

    def linked(match: re.Match) -> str:
        numbers = [int(n) for n in re.split(r"\s*,\s*", match.group(1))]
        if not all(n in markers for n in numbers):
            return match.group(0)  # "[3]" in prose that is no citation of ours stays text
        return ", ".join(f"[\\[{n}\\]]({CITE_SCHEME}:{n})" for n in numbers)

    pieces = _CODE.split(text)
    return "".join(
        piece if i % 2 else _MARKERS.sub(linked, piece) for i, piece in enumerate(pieces)
    )


def place(entry: dict) -> str:
    """'report.pdf p.3 > Results > Table 2'"""
    head = Path(str(entry.get("file", "?"))).name
    if entry.get("page") is not None:
        head += f" p.{entry['page']}"
    return " > ".join([head, *[str(h) for h in entry.get("heading") or []]])


class SourcesDialog(QDialog):
    def __init__(self, section: dict, marker: int | None = None, parent: QWidget | None = None):
        super().__init__(parent)
        self.setWindowTitle("Sources of this reply")
        self.resize(860, 520)
        self.section = section
        included = list(section.get("sources") or [])
        left_out = list(section.get("left_out") or [])
        layout = QVBoxLayout(self)
        self.summary = QLabel(self._summary(included, left_out))
        self.summary.setObjectName("sources_summary")
        self.summary.setWordWrap(True)
        self.summary.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        layout.addWidget(self.summary)
        splitter = QSplitter()
        self.list = QListWidget()
        self.list.setObjectName("sources_list")
        self.entries: list[dict] = []
        for entry in included:
            self._add(f"[{entry.get('marker')}] {place(entry)}", entry)
        if left_out:
            header = QListWidgetItem("Left out for lack of room:")
            header.setFlags(Qt.ItemFlag.NoItemFlags)
            self.list.addItem(header)
            self.entries.append({})
            for entry in left_out:
                self._add(f"— {place(entry)} ({entry.get('tokens')} tokens)", entry)
        self.passage = QTextBrowser()
        self.passage.setObjectName("passage")
        self.passage.setOpenLinks(False)
        splitter.addWidget(self.list)
        splitter.addWidget(self.passage)
        splitter.setStretchFactor(1, 2)
        splitter.setSizes([320, 540])
        layout.addWidget(splitter, 1)
        buttons = QDialogButtonBox(QDialogButtonBox.StandardButton.Close)
        buttons.rejected.connect(self.reject)
        layout.addWidget(buttons)
        self.list.currentRowChanged.connect(self._show)
        self.select_marker(marker if marker is not None else 1)

    def _add(self, label: str, entry: dict) -> None:
        item = QListWidgetItem(label)
        item.setToolTip(str(entry.get("file", "")))
        self.list.addItem(item)
        self.entries.append(entry)

    @staticmethod
    def _summary(included: list[dict], left_out: list[dict]) -> str:
        section_text = f"{len(included)} passage{'s' if len(included) != 1 else ''} in the prompt"
        if left_out:
            section_text += f", {len(left_out)} left out for lack of room"
        return section_text

    def select_marker(self, marker: int) -> None:
        for row, entry in enumerate(self.entries):
            if entry.get("marker") == marker:
                self.list.setCurrentRow(row)
                return
        if self.entries:
            self.list.setCurrentRow(0)

    def _show(self, row: int) -> None:
        entry = self.entries[row] if 0 <= row < len(self.entries) else {}
        if not entry:
            self.passage.clear()
            return
        s = self.section
        marker = entry.get("marker")
        facts = [
            ("File", entry.get("file")),
            ("Page", entry.get("page") if entry.get("page") is not None else "—"),
            ("Heading", " > ".join(entry.get("heading") or []) or "—"),
            ("In the prompt", f"as [{marker}]" if marker is not None else "no: no room left"),
            ("Tokens", entry.get("tokens")),
            ("Fused score (RRF)", entry.get("score")),
            ("Keyword rank (BM25)", entry.get("bm25_rank") or "not in the keyword list"),
            ("Meaning rank (vectors)", entry.get("vector_rank") or "not in the vector list"),
            ("Chunk id", entry.get("chunk_id")),
        ]
        rows = "".join(
            f"<tr><td><b>{html.escape(k)}</b></td><td>{html.escape(str(v))}</td></tr>"
            for k, v in facts
        )
        settings = s.get("settings") or {}
        footer = (
            f"Collection {s.get('collection')!s} · top {settings.get('top_k')} of "
            f"{settings.get('candidates')} candidates per list · {s.get('used_tokens')} of "
            f"{s.get('budget_tokens')} source tokens used · query: {s.get('query')!s}"
        )
        text = entry.get("text")
        body = (
            f"<pre style='white-space: pre-wrap'>{html.escape(text)}</pre>"
            if text
            else "<p><i>The passage's text is not in this receipt.</i></p>"
        )
        self.passage.setHtml(
            f"<h3>{html.escape(place(entry))}</h3><table>{rows}</table>{body}"
            f"<p style='color: gray'>{html.escape(footer)}</p>"
        )
