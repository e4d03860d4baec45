"""Chats as a PDF through Qt's own printing: the chats as Qt rich text (app/export_html.py's
ChatHtml in print mode) laid out by QTextDocument and printed to a QPdfWriter, A4, each chat
starting on a new page. No PDF library: Qt embeds the fonts and paginates.

Runs on the export's worker thread: QTextDocument and QPdfWriter are created there and painted
there (Qt paints text to a paint device outside the GUI thread); a QGuiApplication must exist,
as it does in the app."""

from __future__ import annotations

import errno
from pathlib import Path

from PySide6.QtCore import QMarginsF
from PySide6.QtGui import QPageLayout, QPageSize, QPdfWriter, QTextDocument

from app.export_html import ChatHtml
from app.export_job import ChatSnapshot, Step

PRINT_CSS = """
h2 { font-size: 16pt; }
.meta { color: #6b6b70; font-size: 9pt; }
.role { font-weight: bold; color: #2f6fdf; margin-top: 10px; }
.note { color: #6b6b70; font-weight: normal; }
pre { background-color: #f6f8fa; font-family: monospace; font-size: 9pt; }
blockquote { color: #55555a; }
"""


def chats_document_html(chats: list[ChatSnapshot], step: Step) -> str:
    """The rich text printed: every chat, a page break before each but the first."""
    renderer = ChatHtml(print_mode=True)
    total = len(chats)
    step(0, total)
    parts = [f"<html><head><style>{PRINT_CSS}</style></head><body>"]
    for done, chat in enumerate(chats, start=1):
        if done > 1:
            parts.append('<div style="page-break-before: always;"></div>')
        parts.append(renderer.chat(chat, f"chat-{done}"))
        step(done, total)
    parts.append("</body></html>")
    return "\n".join(parts)


def write_pdf(path: Path, chats: list[ChatSnapshot], step: Step) -> None:
    document = QTextDocument()
    document.setHtml(chats_document_html(chats, step))
    writer = QPdfWriter(str(path))
    writer.setCreator("LocalChat")
    writer.setTitle(chats[0].conversation.title if len(chats) == 1 else f"{len(chats)} chats")
    writer.setPageLayout(
        QPageLayout(
            QPageSize(QPageSize.PageSizeId.A4),
            QPageLayout.Orientation.Portrait,
            QMarginsF(15, 15, 15, 15),
            QPageLayout.Unit.Millimeter,
        )
    )
    document.print_(writer)  # opens, paints every page and closes the file
    del writer
    # print_ reports nothing: a file Qt could not open or finish is found by its header.
    try:
        with open(path, "rb") as f:
            written = f.read(5)
    except OSError:
        written = b""
    if written != b"%PDF-":
        raise OSError(errno.EIO, "Qt could not write the PDF (is the disk full?)")
