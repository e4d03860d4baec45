"""Text extraction from real files made here: pages, headings, and each kind of bad input."""

from __future__ import annotations

import pytest
from documents_helpers import encrypted_pdf, pdf_with_outline, write_docx, write_pdf

from engine.documents.extract import BLOCK_SEPARATOR, extract
from engine.documents.problems import (
    BinaryFile,
    CorruptDocument,
    DocumentRemoved,
    DocumentTooLarge,
    EncryptedDocument,
    NoTextInDocument,
    UnreadableEncoding,
)


def test_pdf_text_keeps_page_numbers_and_notes_pages_without_text(tmp_path):
    pdf = write_pdf(tmp_path / "a.pdf", [["Alpha line one", "alpha two"], [], ["Gamma on three"]])
    doc = extract(pdf)
    assert doc.kind == "pdf" and doc.pages == 3
    assert [(b.page, b.text) for b in doc.blocks] == [
        (1, "Alpha line one\nalpha two"),
        (3, "Gamma on three"),
    ]
    assert doc.notes == ["no text on page(s) 2 (images?); those pages skipped"]


def test_block_offsets_point_into_the_document_text(tmp_path):
    pdf = write_pdf(tmp_path / "a.pdf", [["First page"], ["Second page here"]])
    doc = extract(pdf)
    text = doc.text
    assert text == "First page" + BLOCK_SEPARATOR + "Second page here"
    for block in doc.blocks:
        assert text[block.start : block.start + len(block.text)] == block.text


def test_pdf_headings_come_from_its_outline(tmp_path):
    pdf = pdf_with_outline(
        tmp_path / "o.pdf",
        [["Intro words"], ["Method words"], ["More method words"]],
        [("Introduction", 0), ("Method", 1)],
    )
    doc = extract(pdf)
    assert [(b.page, b.heading) for b in doc.blocks] == [
        (1, ("Introduction",)),
        (2, ("Method",)),
        (3, ("Method",)),
    ]


def test_pdf_with_a_password_is_refused_by_name(tmp_path):
    pdf = encrypted_pdf(tmp_path / "locked.pdf", [["secret words"]])
    with pytest.raises(EncryptedDocument) as info:
        extract(pdf)
    assert "locked.pdf" in str(info.value) and "password" in str(info.value)
    assert info.value.kind == "encrypted"


def test_pdf_encrypted_with_the_empty_password_opens(tmp_path):
    from pypdf import PdfReader, PdfWriter

    plain = write_pdf(tmp_path / "p.pdf", [["Readable despite encryption"]])
    writer = PdfWriter(clone_from=PdfReader(plain))
    writer.encrypt(user_password="", owner_password="owner", algorithm="AES-128")
    target = tmp_path / "restricted.pdf"
    writer.write(str(target))
    assert [b.text for b in extract(target).blocks] == ["Readable despite encryption"]


def test_corrupt_pdf_is_named_and_skipped(tmp_path):
    good = write_pdf(tmp_path / "g.pdf", [["some text"]]).read_bytes()
    bad = tmp_path / "broken.pdf"
    bad.write_bytes(good[:120])
    with pytest.raises(CorruptDocument) as info:
        extract(bad)
    assert "broken.pdf" in str(info.value) and "skipped" in str(info.value)


def test_image_only_pdf_says_there_is_no_text(tmp_path):
    pdf = write_pdf(tmp_path / "scan.pdf", [[], []])
    with pytest.raises(NoTextInDocument) as info:
        extract(pdf)
    assert "scan.pdf" in str(info.value) and "2 page(s)" in str(info.value)
    assert "OCR" in str(info.value)


def test_docx_headings_come_from_paragraph_styles(tmp_path):
    path = write_docx(
        tmp_path / "r.docx",
        [
            ("Title", "Annual report"),
            ("p", "Opening words."),
            ("Heading 1", "Results"),
            ("p", "Revenue grew."),
            ("Heading 2", "Europe"),
            ("p", "Paris did well."),
            ("Heading 1", "Outlook"),
            ("p", "Calm."),
        ],
    )
    doc = extract(path)
    assert doc.kind == "docx"
    assert [(b.heading, b.text) for b in doc.blocks] == [
        (("Annual report",), "Annual report\nOpening words."),
        (("Annual report", "Results"), "Results\nRevenue grew."),
        (("Annual report", "Results", "Europe"), "Europe\nParis did well."),
        (("Annual report", "Outlook"), "Outlook\nCalm."),
    ]
    assert all(b.page is None for b in doc.blocks)


def test_docx_pages_from_hard_page_breaks(tmp_path):
    import docx

    document = docx.Document()
    document.add_heading("Intro", level=1)
    document.add_paragraph("On the first page.")
    document.add_page_break()
    document.add_paragraph("On the second page.")
    document.add_heading("Next", level=1)
    document.add_paragraph("Still the second.")
    document.add_page_break()
    document.add_paragraph("Third page.")
    document.save(str(tmp_path / "paged.docx"))
    doc = extract(tmp_path / "paged.docx")
    assert [(b.page, b.heading, b.text) for b in doc.blocks] == [
        (1, ("Intro",), "Intro\nOn the first page."),
        (2, ("Intro",), "On the second page."),
        (2, ("Next",), "Next\nStill the second."),
        (3, ("Next",), "Third page."),
    ]
    assert doc.pages == 3


def test_docx_pages_as_word_last_laid_them_out(tmp_path):
    """Word marks where each page began with <w:lastRenderedPageBreak/>; those win over hard
    breaks, and a paragraph running onto the next page is cited by the page it starts on."""
    import docx
    from docx.oxml import OxmlElement

    document = docx.Document()
    document.add_paragraph("Page one text.")
    long_one = document.add_paragraph("Starts on one")
    tail = long_one.add_run(" and ends on two.")
    tail._r.insert(0, OxmlElement("w:lastRenderedPageBreak"))
    document.add_paragraph("Wholly on two.")
    later = document.add_paragraph()
    run = later.add_run("Top of page three.")
    run._r.insert(0, OxmlElement("w:lastRenderedPageBreak"))
    document.save(str(tmp_path / "word.docx"))
    doc = extract(tmp_path / "word.docx")
    assert [(b.page, b.text) for b in doc.blocks] == [
        (1, "Page one text.\nStarts on one and ends on two."),
        (2, "Wholly on two."),
        (3, "Top of page three."),
    ]


def test_docx_tables_are_read(tmp_path):
    import docx

    document = docx.Document()
    document.add_paragraph("Before the table.")
    table = document.add_table(rows=2, cols=2)
    for r, row in enumerate([("Name", "Score"), ("Ada", "97")]):
        for c, value in enumerate(row):
            table.cell(r, c).text = value
    document.save(str(tmp_path / "t.docx"))
    assert (
        extract(tmp_path / "t.docx").blocks[0].text == "Before the table.\nName | Score\nAda | 97"
    )


def test_a_docx_that_is_not_a_zip_is_corrupt(tmp_path):
    bad = tmp_path / "fake.docx"
    bad.write_bytes(b"\xd0\xcf\x11\xe0 an OLE container, as an encrypted DOCX is")
    with pytest.raises(CorruptDocument) as info:
        extract(bad)
    assert "fake.docx" in str(info.value) and "encrypted or damaged" in str(info.value)


def test_html_text_and_headings_without_scripts_or_styles(tmp_path):
    page = tmp_path / "p.html"
    page.write_text(
        "<html><head><title>T</title><style>body{color:red}</style></head><body>"
        "<h1>Guide</h1><p>Intro &amp; more.</p><script>var x = 'hidden';</script>"
        "<h2>Install</h2><ul><li>Step one</li><li>Step two</li></ul>"
        "<h1>FAQ</h1><p>Ask <b>us</b>.</p><p>Or call.</p>"
        "<table><tr><th>Day</th><th>Hours</th></tr><tr><td>Mon</td><td>9-5</td></tr></table>"
        "</body></html>",
        encoding="utf-8",
    )
    doc = extract(page)
    assert [(b.heading, b.text) for b in doc.blocks] == [
        (("Guide",), "Guide\n\nIntro & more."),
        (("Guide", "Install"), "Install\n\nStep one\nStep two"),
        (("FAQ",), "FAQ\n\nAsk us.\n\nOr call.\n\nDay | Hours\nMon | 9-5"),
    ]
    assert "hidden" not in doc.text and "color" not in doc.text


def test_markdown_headings_skip_hashes_inside_code_fences(tmp_path):
    md = tmp_path / "n.md"
    md.write_text(
        "Preface.\n\n# Setup\nRun it.\n```sh\n# not a heading\n```\n## Linux\napt\n\n"
        "Usage\n=====\nCall it.\n",
        encoding="utf-8",
    )
    doc = extract(md)
    assert [b.heading for b in doc.blocks] == [(), ("Setup",), ("Setup", "Linux"), ("Usage",)]
    assert "# not a heading" in doc.blocks[1].text


def test_plain_text_utf8_utf16_and_windows_1252(tmp_path):
    (tmp_path / "u.txt").write_text("naïve café", encoding="utf-8")
    (tmp_path / "w.txt").write_text("naïve café", encoding="utf-16")
    (tmp_path / "c.txt").write_bytes("naïve café".encode("cp1252"))
    assert extract(tmp_path / "u.txt").blocks[0].text == "naïve café"
    assert extract(tmp_path / "w.txt").blocks[0].text == "naïve café"
    legacy = extract(tmp_path / "c.txt")
    assert legacy.blocks[0].text == "naïve café"
    assert legacy.notes == ["not UTF-8: read as Windows-1252 (Western European)"]


def test_source_code_is_text_of_kind_code(tmp_path):
    (tmp_path / "m.py").write_text("def f():\n    return 1\n", encoding="utf-8")
    doc = extract(tmp_path / "m.py")
    assert doc.kind == "code" and doc.blocks[0].text == "def f():\n    return 1\n"


def test_unreadable_encoding_names_the_byte(tmp_path):
    bad = tmp_path / "x.txt"
    bad.write_bytes(b"ok so far \x81\x01 then junk")  # 0x81 is undefined in cp1252 too
    with pytest.raises(UnreadableEncoding) as info:
        extract(bad)
    assert "x.txt" in str(info.value) and "0x81" in str(info.value)


def test_binary_file_is_refused(tmp_path):
    blob = tmp_path / "data.txt"
    blob.write_bytes(b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR")
    with pytest.raises(BinaryFile) as info:
        extract(blob)
    assert "data.txt" in str(info.value) and "binary" in str(info.value)


def test_a_2_gb_log_is_refused_by_size_without_reading_it(tmp_path):
    log = tmp_path / "huge.log"
    with open(log, "wb") as f:  # sparse: takes no disk
        f.truncate(2 * 1024**3)
    with pytest.raises(DocumentTooLarge) as info:
        extract(log)
    assert str(info.value) == (
        f"{log}: 2.0 GB is over the 100 MB limit for one document; the whole file was "
        "skipped (split it, or index a smaller part)"
    )


def test_missing_file_is_reported_as_removed(tmp_path):
    with pytest.raises(DocumentRemoved) as info:
        extract(tmp_path / "gone.md")
    assert "gone.md" in str(info.value)


def test_unreadable_permissions_are_named(tmp_path, monkeypatch):
    import engine.documents.extract as extract_module
    from engine.documents.problems import DocumentError

    f = tmp_path / "private.txt"
    f.write_text("x")

    def denied(path):  # what open() raises without read permission (root would read it anyway)
        raise PermissionError(13, "Permission denied", str(path))

    monkeypatch.setattr(extract_module, "_read_bytes", denied)
    with pytest.raises(DocumentError) as info:
        extract(f)
    assert str(info.value) == f"{f}: permission denied; skipped"
