"""Helpers for the documents tests: a small deterministic embedder and real files made here.

HashEmbedder is a hashed bag of words: texts sharing words get close vectors. It is not what a
real model gives, so tests using it check ranking only on hand-made cases whose answer is
obvious (a query sharing rare words with exactly one chunk).
"""

from __future__ import annotations

import re
import zlib
from pathlib import Path

import numpy as np

WORD = re.compile(r"\w+")


class HashEmbedder:
    def __init__(
        self, dim: int = 256, max_tokens: int = 128, model_id: str = "test-hash-bow"
    ) -> None:
        self.dim, self.max_tokens, self.model_id = dim, max_tokens, model_id
        self.calls: list[int] = []  # batch sizes, to see batching and cancel points

    def count_tokens(self, text: str) -> int:
        return len(WORD.findall(text)) + 2  # + [CLS] and [SEP], as a BERT tokenizer counts

    def embed(self, texts: list[str], cancel=None) -> np.ndarray:
        self.calls.append(len(texts))
        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        for i, text in enumerate(texts):
            for word in WORD.findall(text.lower()):
                out[i, zlib.crc32(word.encode()) % self.dim] += 1.0
            if not out[i].any():
                out[i, 0] = 1.0
        return out / np.linalg.norm(out, axis=1, keepdims=True)


def _pdf_string(text: str) -> str:
    return "(" + text.replace("\\", "\\\\").replace("(", "\\(").replace(")", "\\)") + ")"


def write_pdf(path: Path, pages: list[list[str]]) -> Path:
    """A minimal real PDF: one page per list, each line a Helvetica text line. Offsets in the
    xref table are computed, so pypdf reads it without repairs."""
    objects: list[bytes] = []
    n = len(pages)
    # 1: catalog, 2: pages, 3: font, then per page: page object, content stream
    kids = " ".join(f"{4 + 2 * i} 0 R" for i in range(n))
    objects.append(b"<< /Type /Catalog /Pages 2 0 R >>")
    objects.append(f"<< /Type /Pages /Kids [{kids}] /Count {n} >>".encode())
    objects.append(b"<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica >>")
    for i, lines in enumerate(pages):
        ops = ["BT", "/F1 11 Tf", "14 TL", "72 720 Td"]
        for line in lines:
            ops.append(f"{_pdf_string(line)} Tj T*")
        ops.append("ET")
        stream = "\n".join(ops).encode("latin-1") if lines else b""
        objects.append(
            f"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] "
            f"/Resources << /Font << /F1 3 0 R >> >> /Contents {5 + 2 * i} 0 R >>".encode()
        )
        objects.append(f"<< /Length {len(stream)} >>\nstream\n".encode() + stream + b"\nendstream")
    out = bytearray(b"%PDF-1.4\n")
    offsets = []
    for number, body in enumerate(objects, start=1):
        offsets.append(len(out))
        out += f"{number} 0 obj\n".encode() + body + b"\nendobj\n"
    xref = len(out)
    out += f"xref\n0 {len(objects) + 1}\n0000000000 65535 f \n".encode()
    for offset in offsets:
        out += f"{offset:010d} 00000 n \n".encode()
    out += (
        f"trailer\n<< /Size {len(objects) + 1} /Root 1 0 R >>\nstartxref\n{xref}\n%%EOF\n".encode()
    )
    path.write_bytes(bytes(out))
    return path


def pdf_with_outline(path: Path, pages: list[list[str]], outline: list[tuple[str, int]]) -> Path:
    """The same PDF with bookmarks (title, 0-based page), added by pypdf."""
    from pypdf import PdfReader, PdfWriter

    plain = write_pdf(path.with_suffix(".plain.pdf"), pages)
    writer = PdfWriter(clone_from=PdfReader(plain))
    for title, page in outline:
        writer.add_outline_item(title, page)
    with open(path, "wb") as f:
        writer.write(f)
    plain.unlink()
    return path


def encrypted_pdf(path: Path, pages: list[list[str]], password: str = "secret") -> Path:
    from pypdf import PdfReader, PdfWriter

    plain = write_pdf(path.with_suffix(".plain.pdf"), pages)
    writer = PdfWriter(clone_from=PdfReader(plain))
    writer.encrypt(user_password=password, owner_password=password + "-owner", algorithm="AES-128")
    with open(path, "wb") as f:
        writer.write(f)
    plain.unlink()
    return path


def write_docx(path: Path, parts: list[tuple[str, str]]) -> Path:
    """parts: (style, text) with style 'Title', 'Heading 1', 'Heading 2', ... or 'p'."""
    import docx

    document = docx.Document()
    for style, text in parts:
        if style == "p":
            document.add_paragraph(text)
        elif style == "Title":
            document.add_heading(text, level=0)
        else:
            document.add_heading(text, level=int(style.split()[-1]))
    document.save(str(path))
    return path
