"""Chats as a PDF through Qt's own printing: the chats as Qt rich text (app/export_html.py's
ChatHtml in print mode) laid out by QTextDocument in A4 pages, each chat from a new page, and
painted page by page onto a QPdfWriter with the page number below. No PDF library: Qt embeds
the fonts and paginates.

Runs on the export's worker thread: QTextDocument and QPdfWriter are created there and painted
there (Qt paints text to a paint device outside the GUI thread); a QGuiApplication must exist,
as it does in the app."""

from __future__ import annotations

import errno
from pathlib import Path

from PySide6.QtCore import QMarginsF, QRectF, QSizeF, Qt
from PySide6.QtGui import (
    QFont,
    QPageLayout,
    QPageSize,
    QPainter,
    QPdfWriter,
    QTextCursor,
    QTextDocument,
    QTextFormat,
)

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
RESOLUTION_DPI = 300  # layout units: fine enough for print, small enough numbers
FOOTER_PT = 9  # the page number's font size; a line of it is kept free below the text


def build_document(chats: list[ChatSnapshot], step: Step) -> tuple[QTextDocument, list[int]]:
    """The chats as one QTextDocument, each from a new page, and the character position where
    each chat starts. `step(0, total)` after each chat: a cancel is noticed, nothing is printed
    yet."""
    renderer = ChatHtml(print_mode=True)
    document = QTextDocument()
    document.setDefaultStyleSheet(PRINT_CSS)  # applies to the HTML inserted below
    cursor = QTextCursor(document)
    starts = []
    for index, chat in enumerate(chats):
        if index:
            cursor.insertBlock()
            block = cursor.blockFormat()
            block.setPageBreakPolicy(QTextFormat.PageBreakFlag.PageBreak_AlwaysBefore)
            cursor.setBlockFormat(block)
        starts.append(cursor.position())
        cursor.insertHtml(renderer.chat(chat, f"chat-{index + 1}"))
        step(0, len(chats))
    return document, starts


def write_pdf(path: Path, chats: list[ChatSnapshot], step: Step) -> None:
    """Print `chats` to a PDF at `path`, page by page: `step(chats printed, total)` after each
    page, so a long export shows progress and stops at the next page when cancelled (Qt's
    QTextDocument.print_ would paint every page in one uninterruptible call)."""
    total = len(chats)
    step(0, total)
    document, starts = build_document(chats, step)
    writer = QPdfWriter(str(path))
    writer.setCreator("LocalChat")
    writer.setTitle(chats[0].conversation.title if total == 1 else f"{total} chats")
    writer.setResolution(RESOLUTION_DPI)
    writer.setPageLayout(
        QPageLayout(
            QPageSize(QPageSize.PageSizeId.A4),
            QPageLayout.Orientation.Portrait,
            QMarginsF(15, 15, 15, 15),
            QPageLayout.Unit.Millimeter,
        )
    )
    area = writer.pageLayout().paintRectPixels(RESOLUTION_DPI)
    footer = 2 * FOOTER_PT * RESOLUTION_DPI / 72
    width, height = float(area.width()), float(area.height()) - footer
    # Lay the text out in the writer's units (its DPI), in pages of the text area.
    document.documentLayout().setPaintDevice(writer)
    document.setPageSize(QSizeF(width, height))
    pages = document.pageCount()
    layout = document.documentLayout()
    first_page = [
        int(layout.blockBoundingRect(document.findBlock(pos)).top() // height) for pos in starts
    ]
    painter = QPainter()
    if not painter.begin(writer):
        raise OSError(errno.EIO, "Qt could not open the PDF for writing")
    try:
        footer_font = QFont(document.defaultFont())
        footer_font.setPointSizeF(FOOTER_PT)
        for page in range(pages):
            if page:
                writer.newPage()
            painter.save()
            painter.translate(0, -page * height)
            document.drawContents(painter, QRectF(0, page * height, width, height))
            painter.restore()
            painter.setFont(footer_font)
            painter.drawText(
                QRectF(0, height, width, footer),
                Qt.AlignmentFlag.AlignRight | Qt.AlignmentFlag.AlignBottom,
                f"{page + 1} / {pages}",
            )
            # chats whose every page is printed: those starting after this page's successor
            step(
                sum(1 for p in first_page[1:] if p <= page + 1) if page + 1 < pages else total,
                total,
            )
    finally:
        painter.end()
    del writer
    # Qt reports no write errors: a file it could not finish is found by its header.
    try:
        with open(path, "rb") as f:
            written = f.read(5)
    except OSError:
        written = b""
    if written != b"%PDF-":
        raise OSError(errno.EIO, "Qt could not write the PDF (is the disk full?)")
