"""Text out of a document file, kept in blocks that each carry their page number and heading path.

Libraries, and why:
- PDF: pypdf (pure Python, maintained, reads the text layer, the outline for headings, and
  handles encryption); no native build, so the app bundle stays portable.
- DOCX: python-docx (the maintained reader; headings come from paragraph styles "Heading N"/
  "Title"). A DOCX has no fixed pages; the pages Word last laid out (or hard page breaks) give
  page numbers where the file has them, else page None (_DocxPages).
- HTML: the standard library's html.parser. We need visible text and h1-h6 headings, not
  boilerplate removal; html.parser is tolerant of broken markup, streams, and adds no dependency.
- Markdown: ATX (#) and setext (=== / ---) headings, ignoring '#' inside fenced code.
- Plain text, logs and source code: decoded as UTF-8 (UTF-16/32 with a BOM; Windows-1252 as a
  fallback, noted), refused as binary when the start holds NUL bytes.
"""

from __future__ import annotations

import codecs
import os
import re
import zipfile
from dataclasses import dataclass, field
from html.parser import HTMLParser
from pathlib import Path

from engine.documents.problems import (
    BinaryFile,
    CorruptDocument,
    DocumentError,
    DocumentRemoved,
    DocumentTooLarge,
    EncryptedDocument,
    NoTextInDocument,
    UnreadableEncoding,
)

# A 2 GB log would take hours to embed and would drown a collection; past this the file is skipped
# with a message saying so (the caller may pass a larger cap).
DEFAULT_MAX_BYTES = 100 * 1024 * 1024
SNIFF_BYTES = 8192

PDF_SUFFIXES = {".pdf"}
DOCX_SUFFIXES = {".docx"}
HTML_SUFFIXES = {".html", ".htm", ".xhtml"}
MARKDOWN_SUFFIXES = {".md", ".markdown", ".mdown", ".mkd"}
TEXT_SUFFIXES = {".txt", ".text", ".log", ".csv", ".tsv", ".rst", ".org", ".tex", ".adoc"}
CODE_SUFFIXES = {
    ".py", ".pyi", ".js", ".mjs", ".cjs", ".ts", ".tsx", ".jsx", ".java", ".kt", ".kts", ".scala",
    ".c", ".h", ".cc", ".cpp", ".cxx", ".hpp", ".hh", ".cs", ".go", ".rs", ".rb", ".php", ".pl",
    ".swift", ".m", ".mm", ".r", ".jl", ".lua", ".sh", ".bash", ".zsh", ".fish", ".ps1", ".bat",
    ".sql", ".css", ".scss", ".less", ".vue", ".svelte", ".dart", ".ex", ".exs", ".erl", ".hs",
    ".ml", ".fs", ".clj", ".el", ".vim", ".toml", ".yaml", ".yml", ".json", ".ini", ".cfg",
    ".xml", ".gradle", ".cmake", ".mk", ".proto", ".graphql", ".tf", ".nix", ".zig", ".nim",
}  # fmt: skip
# What a folder contributes: documents we can read. A file named explicitly is tried whatever its
# suffix (sniffed as text), but walking a source tree should not report every .png as "binary".
FOLDER_SUFFIXES = (
    PDF_SUFFIXES | DOCX_SUFFIXES | HTML_SUFFIXES | MARKDOWN_SUFFIXES | TEXT_SUFFIXES | CODE_SUFFIXES
)


@dataclass(frozen=True)
class Block:
    """A run of text under one heading on one page. `start` is its offset in the document's text
    (the blocks' texts joined with "\\n\\n"), so a chunk's char offsets point into one string."""

    text: str
    page: int | None
    heading: tuple[str, ...]
    start: int = 0


@dataclass
class ExtractedDocument:
    path: str
    kind: str  # pdf, docx, html, markdown, text, code
    blocks: list[Block]
    pages: int  # pages in the file (1 for formats without pages)
    notes: list[str] = field(default_factory=list)  # what was skipped or assumed, for the user

    @property
    def text(self) -> str:
        return BLOCK_SEPARATOR.join(b.text for b in self.blocks)


BLOCK_SEPARATOR = "\n\n"


def kind_of(path: Path) -> str:
    suffix = path.suffix.lower()
    if suffix in PDF_SUFFIXES:
        return "pdf"
    if suffix in DOCX_SUFFIXES:
        return "docx"
    if suffix in HTML_SUFFIXES:
        return "html"
    if suffix in MARKDOWN_SUFFIXES:
        return "markdown"
    if suffix in CODE_SUFFIXES:
        return "code"
    return "text"


def extract(path: str | os.PathLike, max_bytes: int = DEFAULT_MAX_BYTES) -> ExtractedDocument:
    """Read `path` into blocks. Raises a DocumentError subclass naming the file and the problem."""
    p = Path(path)
    try:
        st = p.stat()
    except FileNotFoundError:
        raise DocumentRemoved(p, "the file is gone (removed or renamed); skipped") from None
    except OSError as exc:
        raise DocumentError(p, f"cannot be read ({exc.strerror or exc}); skipped") from None
    if not p.is_file():
        raise DocumentError(p, "is not a regular file; skipped")
    if st.st_size > max_bytes:
        raise DocumentTooLarge(
            p,
            f"{_size(st.st_size)} is over the {_size(max_bytes)} limit for one document; the "
            "whole file was skipped (split it, or index a smaller part)",
        )
    kind = kind_of(p)
    try:
        if kind == "pdf":
            doc = _extract_pdf(p)
        elif kind == "docx":
            doc = _extract_docx(p)
        else:
            text, notes = decode_text(p, _read_bytes(p))
            if kind == "html":
                blocks = html_blocks(text)
            elif kind == "markdown":
                blocks = markdown_blocks(text)
            else:
                blocks = [Block(text, None, ())] if text.strip() else []
            doc = ExtractedDocument(str(p), kind, blocks, 1, notes)
    except FileNotFoundError:
        raise DocumentRemoved(p, "the file was removed while it was being read; skipped") from None
    except PermissionError:
        raise DocumentError(p, "permission denied; skipped") from None
    if not any(b.text.strip() for b in doc.blocks):
        if kind == "pdf":
            raise NoTextInDocument(
                p,
                f"no text on any of its {doc.pages} page(s) (scanned images need OCR, which "
                "LocalChat does not do); skipped",
            )
        raise NoTextInDocument(p, "holds no text; skipped")
    doc.blocks = _with_offsets([b for b in doc.blocks if b.text.strip()])
    return doc


def _with_offsets(blocks: list[Block]) -> list[Block]:
    out, offset = [], 0
    for b in blocks:
        out.append(Block(b.text, b.page, b.heading, offset))
        offset += len(b.text) + len(BLOCK_SEPARATOR)
    return out


def _size(n: int) -> str:
    if n >= 1024**3:
        return f"{n / 1024**3:.1f} GB"
    return f"{n / 1024**2:.0f} MB"


def _read_bytes(p: Path) -> bytes:
    with open(p, "rb") as f:
        return f.read()


# --- text ----------------------------------------------------------------------------------------
_BOMS = [
    (codecs.BOM_UTF32_LE, "utf-32"),
    (codecs.BOM_UTF32_BE, "utf-32"),
    (codecs.BOM_UTF8, "utf-8-sig"),
    (codecs.BOM_UTF16_LE, "utf-16"),
    (codecs.BOM_UTF16_BE, "utf-16"),
]
# C0 controls other than tab, newline, form feed and carriage return: in a file that is not UTF-8
# they mean binary data or an encoding we would only turn into garbage.
_CONTROL = re.compile(r"[\x00-\x08\x0b\x0e-\x1f\x7f]")


def decode_text(path: Path, data: bytes) -> tuple[str, list[str]]:
    """(text, notes). UTF-8 first; a BOM names UTF-16/32; Windows-1252 (a superset of Latin-1 in
    its printable range) when the bytes decode cleanly in it, noted; otherwise a clear refusal."""
    for bom, encoding in _BOMS:
        if data.startswith(bom):
            try:
                return data.decode(encoding), []
            except UnicodeDecodeError as exc:
                raise UnreadableEncoding(
                    path,
                    f"starts with a {encoding} byte order mark but is not {encoding} "
                    f"(byte {exc.start}); skipped",
                ) from None
    if b"\x00" in data[:SNIFF_BYTES]:
        raise BinaryFile(path, "is binary (NUL bytes in its first 8 KB), not text; skipped")
    try:
        return data.decode("utf-8"), []
    except UnicodeDecodeError as exc:
        utf8_error = exc
    try:
        text = data.decode("cp1252")
    except UnicodeDecodeError:
        text = None
    if text is not None and not _CONTROL.search(text):
        return text, ["not UTF-8: read as Windows-1252 (Western European)"]
    bad = data[utf8_error.start : utf8_error.start + 1].hex()
    raise UnreadableEncoding(
        path,
        f"is not UTF-8 text (byte 0x{bad} at offset {utf8_error.start}) nor Windows-1252; "
        "skipped (save it as UTF-8 to index it)",
    )


# --- markdown ------------------------------------------------------------------------------------
_ATX = re.compile(r"^ {0,3}(#{1,6})[ \t]+(.*?)[ \t]*#*[ \t]*$")
_FENCE = re.compile(r"^ {0,3}(`{3,}|~{3,})")
_SETEXT = re.compile(r"^ {0,3}(=+|-+)[ \t]*$")


def markdown_blocks(text: str) -> list[Block]:
    lines = text.splitlines(keepends=True)
    blocks: list[Block] = []
    stack: list[tuple[int, str]] = []
    current: list[str] = []
    fence: str | None = None

    def flush() -> None:
        body = "".join(current).strip("\n")
        if body.strip():
            blocks.append(Block(body, None, tuple(t for _, t in stack)))
        current.clear()

    def open_heading(level: int, title: str, line: str) -> None:
        flush()
        while stack and stack[-1][0] >= level:
            stack.pop()
        stack.append((level, title))
        current.append(line)

    i = 0
    while i < len(lines):
        line = lines[i]
        m = _FENCE.match(line)
        if fence is None and m:
            fence = m.group(1)[0] * 3
        elif fence is not None and line.lstrip().startswith(fence):
            fence = None
        elif fence is None:
            atx = _ATX.match(line.rstrip("\n"))
            if atx and atx.group(2):
                open_heading(len(atx.group(1)), atx.group(2).strip(), line)
                i += 1
                continue
            nxt = lines[i + 1] if i + 1 < len(lines) else ""
            setext = _SETEXT.match(nxt.rstrip("\n"))
            if setext and line.strip() and not (current and current[-1].strip()):
                open_heading(1 if setext.group(1)[0] == "=" else 2, line.strip(), line + nxt)
                i += 2
                continue
        current.append(line)
        i += 1
    flush()
    return blocks


# --- html ----------------------------------------------------------------------------------------
_HIDDEN = {"script", "style", "noscript", "template", "head", "svg", "iframe", "object"}
# Blocks get a line break before and after (paragraphs come out separated by a blank line);
# lines (list items, rows, definitions) one before, so a list reads as one line per item; the
# cells of a row are joined with " | ", as DOCX tables are.
_BREAKS = {
    "p", "div", "ul", "ol", "table", "section", "article", "header", "footer", "blockquote",
    "pre", "dl", "hr", "main", "nav", "aside", "figure", "figcaption", "form", "h1", "h2", "h3",
    "h4", "h5", "h6",
}  # fmt: skip
_LINES = {"li", "tr", "dt", "dd", "br"}
_CELLS = {"td", "th"}


class _HTMLText(HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.blocks: list[Block] = []
        self.stack: list[tuple[int, str]] = []
        self.parts: list[str] = []
        self.hidden = 0
        self.heading_level = 0
        self.heading_parts: list[str] = []
        self.pre = 0
        self.cells = 0  # cells seen in the current table row

    def handle_starttag(self, tag, attrs) -> None:
        if tag in _HIDDEN:
            self.hidden += 1
        elif re.fullmatch(r"h[1-6]", tag) and not self.hidden:
            self._flush()
            self.heading_level = int(tag[1])
            self.heading_parts = []
        elif tag in _BREAKS or tag in _LINES:
            self.parts.append("\n")
            self.cells = 0
        elif tag in _CELLS:
            if self.cells:
                self.parts.append(" | ")
            self.cells += 1
        if tag == "pre":
            self.pre += 1

    def handle_startendtag(self, tag, attrs) -> None:
        if tag in ("br", "hr"):
            self.parts.append("\n")

    def handle_endtag(self, tag) -> None:
        if tag in _HIDDEN:
            self.hidden = max(0, self.hidden - 1)
        elif re.fullmatch(r"h[1-6]", tag) and self.heading_level:
            title = " ".join("".join(self.heading_parts).split())
            level = self.heading_level
            self.heading_level = 0
            if title:
                while self.stack and self.stack[-1][0] >= level:
                    self.stack.pop()
                self.stack.append((level, title))
                self.parts.append(title + "\n")
        elif tag in _BREAKS:
            self.parts.append("\n")
        if tag == "pre":
            self.pre = max(0, self.pre - 1)

    def handle_data(self, data) -> None:
        if self.hidden:
            return
        if self.heading_level:
            self.heading_parts.append(data)
        elif self.pre:
            self.parts.append(data)
        else:
            self.parts.append(re.sub(r"\s+", " ", data))

    def _flush(self) -> None:
        lines = [line.strip() for line in "".join(self.parts).split("\n")]
        body = re.sub(r"\n{3,}", "\n\n", "\n".join(lines)).strip()
        if body:
            self.blocks.append(Block(body, None, tuple(t for _, t in self.stack)))
        self.parts = []

    def close(self) -> None:
        super().close()
        self._flush()


def html_blocks(text: str) -> list[Block]:
    parser = _HTMLText()
    parser.feed(text)
    parser.close()
    return parser.blocks


# --- docx ----------------------------------------------------------------------------------------
_HEADING_STYLE = re.compile(r"^heading\s*(\d)$", re.IGNORECASE)


def _extract_docx(p: Path) -> ExtractedDocument:
    import docx  # python-docx; imported here so plain-text indexing does not pay for lxml
    from docx.opc.exceptions import PackageNotFoundError
    from docx.table import Table
    from docx.text.paragraph import Paragraph

    if not zipfile.is_zipfile(p):
        # an encrypted DOCX is an OLE container, not a zip
        raise CorruptDocument(
            p, "is not a readable DOCX (not a zip package: encrypted or damaged); skipped"
        )
    try:
        document = docx.Document(str(p))
    except (PackageNotFoundError, zipfile.BadZipFile, KeyError, ValueError) as exc:
        raise CorruptDocument(p, f"is not a readable DOCX ({exc}); skipped") from None
    except Exception as exc:  # lxml parse errors and the like: the package is damaged
        raise CorruptDocument(
            p, f"is not a readable DOCX ({type(exc).__name__}); skipped"
        ) from None
    pages = _DocxPages(document.element.body)
    blocks: list[Block] = []
    stack: list[tuple[int, str]] = []
    current: list[str] = []
    block_page = pages.page

    def flush() -> None:
        body = "\n".join(current).strip()
        if body:
            blocks.append(Block(body, block_page, tuple(t for _, t in stack)))
        current.clear()

    for item in document.iter_inner_content():
        before, after = pages.breaks(item._element)
        if before or pages.page != block_page:
            pages.advance(before)
            flush()
            block_page = pages.page
        if isinstance(item, Paragraph):
            text = item.text
            style = (item.style.name if item.style is not None else "") or ""
            m = _HEADING_STYLE.match(style)
            level = int(m.group(1)) if m else (0 if style.lower() == "title" else None)
            if level is not None and text.strip():
                flush()
                while stack and stack[-1][0] >= level:
                    stack.pop()
                stack.append((level, text.strip()))
            current.append(text)
        elif isinstance(item, Table):
            for row in item.rows:
                current.append(" | ".join(cell.text.strip() for cell in row.cells))
        pages.advance(after)  # a paragraph that runs onto the next page is cited by its start
    flush()
    return ExtractedDocument(str(p), "docx", blocks, pages.page or 1)


_W = "{http://schemas.openxmlformats.org/wordprocessingml/2006/main}"


class _DocxPages:
    """Page numbers for a DOCX, where the file has them. A DOCX has no fixed pages, but Word
    writes <w:lastRenderedPageBreak/> where each page began when it last laid the document out;
    those give the pages a reader saw in Word. A file without them (written by other tools) may
    still have hard page breaks (<w:br w:type="page"/>); one with neither has page None."""

    def __init__(self, body) -> None:
        self.rendered = next(body.iter(f"{_W}lastRenderedPageBreak"), None) is not None
        hard = any(br.get(f"{_W}type") == "page" for br in body.iter(f"{_W}br"))
        self.page: int | None = 1 if (self.rendered or hard) else None

    def _is_break(self, element) -> bool:
        if self.rendered:
            return element.tag == f"{_W}lastRenderedPageBreak"
        return element.tag == f"{_W}br" and element.get(f"{_W}type") == "page"

    def breaks(self, element) -> tuple[int, int]:
        """(breaks before the element's first text, breaks after it)."""
        if self.page is None:
            return 0, 0
        before = after = 0
        seen_text = False
        for node in element.iter(f"{_W}t", f"{_W}br", f"{_W}lastRenderedPageBreak"):
            if node.tag == f"{_W}t":
                seen_text = seen_text or bool((node.text or "").strip())
            elif self._is_break(node):
                if seen_text:
                    after += 1
                else:
                    before += 1
        return before, after

    def advance(self, n: int) -> None:
        if self.page is not None:
            self.page += n


# --- pdf -----------------------------------------------------------------------------------------
def _extract_pdf(p: Path) -> ExtractedDocument:
    import logging

    from pypdf import PdfReader
    from pypdf.errors import FileNotDecryptedError, PdfReadError

    # pypdf logs every repaired cross-reference as a warning; the user sees our notes instead
    logging.getLogger("pypdf").setLevel(logging.ERROR)
    try:
        reader = PdfReader(str(p))
        if reader.is_encrypted:
            try:
                # many PDFs only restrict printing and open with the empty password
                opened = bool(reader.decrypt(""))
            except Exception:
                opened = False
            if not opened:
                raise EncryptedDocument(
                    p, "is encrypted with a password; skipped (save an unprotected copy)"
                )
        n_pages = len(reader.pages)
    except DocumentError:
        raise
    except FileNotDecryptedError:
        raise EncryptedDocument(p, "is encrypted with a password; skipped") from None
    except (PdfReadError, OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        if isinstance(exc, FileNotFoundError):
            raise
        raise CorruptDocument(p, f"is not a readable PDF ({exc}); skipped") from None
    headings = _pdf_outline(reader)
    blocks: list[Block] = []
    empty: list[int] = []
    failed: list[int] = []
    for index in range(n_pages):
        page_no = index + 1
        try:
            text = reader.pages[index].extract_text() or ""
        except Exception:  # one damaged page must not lose the others
            failed.append(page_no)
            continue
        if not text.strip():
            empty.append(page_no)
            continue
        heading: tuple[str, ...] = ()
        for start_page, path in headings:
            if start_page <= page_no:
                heading = path
        blocks.append(Block(text.strip(), page_no, heading))
    notes = []
    if empty and blocks:
        notes.append(f"no text on page(s) {_page_list(empty)} (images?); those pages skipped")
    if failed:
        notes.append(f"page(s) {_page_list(failed)} could not be read (damaged); skipped")
    return ExtractedDocument(str(p), "pdf", blocks, n_pages, notes)


def _pdf_outline(reader) -> list[tuple[int, tuple[str, ...]]]:
    """(first page, heading path) from the PDF's bookmarks, sorted by page; [] when it has none
    or the outline is damaged (headings are a nicety, the text is what matters)."""
    out: list[tuple[int, tuple[str, ...]]] = []

    def walk(items, parents: tuple[str, ...]) -> None:
        last: tuple[str, ...] = parents
        for item in items:
            if isinstance(item, list):
                walk(item, last)
                continue
            try:
                page = reader.get_destination_page_number(item) + 1
                title = " ".join(str(item.title).split())
            except Exception:
                continue
            last = parents + (title,)
            out.append((page, last))

    try:
        walk(reader.outline, ())
    except Exception:
        return []
    out.sort(key=lambda x: x[0])
    return out


def _page_list(pages: list[int]) -> str:
    if len(pages) > 8:
        return ", ".join(map(str, pages[:8])) + f" and {len(pages) - 8} more"
    return ", ".join(map(str, pages))
