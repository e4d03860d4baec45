"""Markdown rendered by QTextDocument, plus what it does not do by itself: code blocks on a
tinted background so they stand apart from prose, coloured by Pygments, each with a copy link
(app/views/code_blocks.py)."""

from __future__ import annotations

from PySide6.QtGui import (
    QColor,
    QPalette,
    QTextBlockFormat,
    QTextCursor,
    QTextDocument,
    QTextFormat,
)

from app.views.code_blocks import highlight


def code_background(palette: QPalette) -> QColor:
    base = palette.color(QPalette.Base)
    # A few steps towards the text colour: visible in light and dark themes alike.
    return base.darker(108) if base.lightness() > 128 else base.lighter(135)


def set_markdown(
    document: QTextDocument, text: str, palette: QPalette, streaming: bool = False
) -> list[str]:
    """Render `text`; returns the code blocks' texts (the copy links' targets, by number).
    `streaming`: a frame of a reply still arriving (only short code blocks are coloured)."""
    document.setMarkdown(text)
    background = code_background(palette)
    block = document.begin()
    while block.isValid():
        fmt = block.blockFormat()
        if fmt.hasProperty(QTextFormat.BlockCodeFence) or fmt.nonBreakableLines():
            tinted = QTextBlockFormat(fmt)
            tinted.setBackground(background)
            cursor = QTextCursor(block)
            cursor.setBlockFormat(tinted)
        block = block.next()
    return highlight(document, palette, streaming)
