"""Code blocks in a rendered message: syntax colours from Pygments and a "Copy code" link above
each block that puts exactly that block's text on the clipboard.

QTextDocument.setMarkdown marks the blocks of a fenced code block with the BlockCodeFence
property (and BlockCodeLanguage when the fence names one), and an indented code block with
non-breakable lines. The blocks of one code block are consecutive; their text joined with "\\n"
is the code, and a document position is the first block's position plus the offset in that
text (a block boundary counts as one character, like the "\\n").
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

from pygments.lexers import get_lexer_by_name
from pygments.styles import get_style_by_name
from pygments.token import Token
from pygments.util import ClassNotFound
from PySide6.QtGui import (
    QBrush,
    QColor,
    QFont,
    QPalette,
    QTextBlockFormat,
    QTextCharFormat,
    QTextCursor,
    QTextDocument,
    QTextFormat,
    QTextLayout,
)

COPY_SCHEME = "localchat-copy"  # href of the copy links: localchat-copy:<block number>
# Pygments lexes ~80 KB/s on a busy 2-core machine (8 KB of Python: ~110 ms). A finished reply
# colours blocks up to HIGHLIGHT_MAX_CHARS (at most ~150 ms, once); while a reply streams, only
# blocks up to STREAMING_HIGHLIGHT_CHARS (~15 ms per frame), and a block whose text did not
# change since the last frame is not lexed again (RUNS_CACHE_SIZE blocks are remembered).
HIGHLIGHT_MAX_CHARS = 12_000
STREAMING_HIGHLIGHT_CHARS = 1_500
RUNS_CACHE_SIZE = 64
LIGHT_STYLE, DARK_STYLE = "default", "monokai"


@dataclass
class CodeBlock:
    first_block: int  # block number in the document
    n_blocks: int
    language: str
    text: str


def find_code_blocks(document: QTextDocument) -> list[CodeBlock]:
    blocks: list[CodeBlock] = []
    block = document.begin()
    current: CodeBlock | None = None
    while block.isValid():
        fmt = block.blockFormat()
        is_code = fmt.hasProperty(QTextFormat.BlockCodeFence) or fmt.nonBreakableLines()
        language = str(fmt.property(QTextFormat.BlockCodeLanguage) or "")
        if is_code and current is not None and current.language == language:
            current.n_blocks += 1
            current.text += "\n" + block.text()
        elif is_code:
            current = CodeBlock(block.blockNumber(), 1, language, block.text())
            blocks.append(current)
        else:
            current = None
        block = block.next()
    return blocks


def _lexer(language: str):
    try:
        # Offsets must match the document: no stripping, no added newline, tabs kept.
        return get_lexer_by_name(language.strip().lower(), stripnl=False, ensurenl=False)
    except ClassNotFound:
        return None


def _formats(style_name: str) -> dict:
    style = get_style_by_name(style_name)
    formats = {}
    for token_type, spec in style:
        fmt = QTextCharFormat()
        if spec["color"]:
            fmt.setForeground(QBrush(QColor("#" + spec["color"])))
        if spec["bold"]:
            fmt.setFontWeight(QFont.Bold)
        if spec["italic"]:
            fmt.setFontItalic(True)
        formats[token_type] = fmt
    return formats


_FORMAT_CACHE: dict[str, dict] = {}


def _format_for(formats: dict, token_type) -> QTextCharFormat | None:
    """The style's format for a token type, or for its nearest parent that has one."""
    while token_type is not Token and token_type not in formats:
        token_type = token_type.parent
    return formats.get(token_type)


def _runs(tokens, formats: dict) -> list[list]:
    """[begin, end, format] per run of tokens with the same format. Whitespace never breaks a
    run (colouring it changes nothing visible) and tokens the style leaves plain make none:
    merging formats token by token took ~20 us each, 180 ms for an 8 KB block."""
    runs: list[list] = []
    offset = 0
    open_run = False  # the last run may still be extended (only whitespace since)
    for token_type, value in tokens:
        end = offset + len(value)
        if value.isspace():
            offset = end
            continue
        fmt = _format_for(formats, token_type)
        if fmt is None or fmt.isEmpty():
            open_run = False
        elif open_run and runs[-1][2] is fmt:
            runs[-1][1] = end
        else:
            runs.append([offset, end, fmt])
            open_run = True
        offset = end
    return runs


def _apply(document: QTextDocument, code: CodeBlock, runs: list[list]) -> None:
    """The runs as each block's layout formats, the way QSyntaxHighlighter colours text: the
    document's own character formats stay as they are, and nothing is re-laid out per token."""
    block = document.findBlockByNumber(code.first_block)
    start = block.position()
    i = 0
    for _ in range(code.n_blocks):
        begin, end = block.position() - start, block.position() - start + block.length()
        ranges = []
        while i < len(runs) and runs[i][0] < end:
            run_begin, run_end, fmt = runs[i]
            piece = QTextLayout.FormatRange()
            piece.start = max(run_begin, begin) - begin
            piece.length = min(run_end, end - 1) - max(run_begin, begin)
            piece.format = fmt
            if piece.length > 0:
                ranges.append(piece)
            if run_end > end - 1:
                break  # the run goes on in the next block
            i += 1
        block.layout().setFormats(ranges)
        block = block.next()
    first = document.findBlockByNumber(code.first_block)
    document.markContentsDirty(
        first.position(),
        block.position() - first.position()
        if block.isValid()
        else document.characterCount() - first.position(),
    )


_RUNS_CACHE: OrderedDict[tuple[str, str, str], list[list]] = OrderedDict()


def _cached_runs(style_name: str, language: str, text: str, lexer, formats: dict) -> list[list]:
    key = (style_name, language, text)
    runs = _RUNS_CACHE.get(key)
    if runs is None:
        runs = _runs(lexer.get_tokens(text), formats)
        _RUNS_CACHE[key] = runs
        if len(_RUNS_CACHE) > RUNS_CACHE_SIZE:
            _RUNS_CACHE.popitem(last=False)
    else:
        _RUNS_CACHE.move_to_end(key)
    return runs


def highlight(document: QTextDocument, palette: QPalette, streaming: bool = False) -> list[str]:
    """Colour every code block whose language Pygments knows and put a copy link above every
    code block. Returns the blocks' texts, indexed by the number in their copy link."""
    blocks = find_code_blocks(document)
    dark = palette.color(QPalette.Base).lightness() < 128
    style_name = DARK_STYLE if dark else LIGHT_STYLE
    formats = _FORMAT_CACHE.setdefault(style_name, _formats(style_name))
    # Copy links first, from the end backwards (inserting moves everything after it); colours
    # after, since they live in the blocks' layouts and a split block gets a new layout.
    link_color = palette.color(QPalette.Link)
    for number in range(len(blocks) - 1, -1, -1):
        code = blocks[number]
        cursor = QTextCursor(document.findBlockByNumber(code.first_block))
        code_format = cursor.blockFormat()
        cursor.insertBlock(code_format)  # the code moves down; an empty block stays above it
        cursor.movePosition(QTextCursor.PreviousBlock)
        cursor.setBlockFormat(QTextBlockFormat())
        link = QTextCharFormat()
        link.setAnchor(True)
        link.setAnchorHref(f"{COPY_SCHEME}:{number}")
        link.setForeground(QBrush(link_color))
        link.setFontPointSize(max(6.0, document.defaultFont().pointSizeF() * 0.85))
        label = f"Copy {code.language} code" if code.language else "Copy code"
        cursor.insertText(label, link)
    blocks = find_code_blocks(document)
    for code in blocks:
        limit = STREAMING_HIGHLIGHT_CHARS if streaming else HIGHLIGHT_MAX_CHARS
        lexer = _lexer(code.language) if code.language and len(code.text) <= limit else None
        if lexer is None:
            continue
        _apply(document, code, _cached_runs(style_name, code.language, code.text, lexer, formats))
    return [code.text for code in blocks]


def renumber_copy_links(document: QTextDocument, first: int) -> None:
    """Number the copy links of `document` from `first` on (a message shows its text as several
    documents, and its copy links count its code blocks across all of them)."""
    if first == 0:
        return
    block = document.begin()
    while block.isValid():
        it = block.begin()
        while not it.atEnd():
            fragment = it.fragment()
            fmt = fragment.charFormat()
            scheme, _, number = fmt.anchorHref().partition(":")
            if scheme == COPY_SCHEME and number.isdigit():
                fmt.setAnchorHref(f"{COPY_SCHEME}:{first + int(number)}")
                cursor = QTextCursor(document)
                cursor.setPosition(fragment.position())
                cursor.setPosition(fragment.position() + fragment.length(), QTextCursor.KeepAnchor)
                cursor.setCharFormat(fmt)
            it += 1
        block = block.next()
