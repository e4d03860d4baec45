"""Indexing into a real collection file: only changes are touched, removals are dropped, problems
are reported by file, and a cancelled or failed run keeps what was indexed."""

from __future__ import annotations

import os
import sqlite3

import pytest
from documents_helpers import HashEmbedder, encrypted_pdf, write_docx, write_pdf

from engine.cancel import CancelToken
from engine.documents.collection import Collection
from engine.documents.index import index_paths
from engine.documents.problems import CollectionError
from engine.errors import ConfigValidationError


@pytest.fixture
def corpus(tmp_path):
    docs = tmp_path / "docs"
    docs.mkdir()
    write_pdf(
        docs / "manual.pdf", [["The pump needs priming before use."], ["Warranty lasts two years."]]
    )
    write_docx(
        docs / "notes.docx", [("Heading 1", "Budget"), ("p", "We spent forty euros on bolts.")]
    )
    (docs / "guide.md").write_text("# Cats\nCats purr when content.\n", encoding="utf-8")
    (docs / "page.html").write_text("<h1>Ferns</h1><p>Ferns like shade.</p>", encoding="utf-8")
    (docs / "photo.png").write_bytes(b"\x89PNG\r\n\x1a\n\x00")  # not a document: not taken
    (docs / ".hidden.md").write_text("secret", encoding="utf-8")
    return docs


@pytest.fixture
def collection(tmp_path):
    c = Collection.open("test docs", root=tmp_path / "collections")
    yield c
    c.close()


def snapshot(c: Collection) -> list[tuple]:
    return c.db.execute(
        "SELECT f.path, c.id, c.text, c.text_sha256, c.embedding FROM chunks c "
        "JOIN files f ON f.id = c.file_id ORDER BY c.id"
    ).fetchall()


def test_a_folder_is_indexed_with_pages_and_headings(corpus, collection):
    report = index_paths(collection, [corpus], HashEmbedder())
    names = sorted(os.path.basename(p) for p in report.added)
    assert names == ["guide.md", "manual.pdf", "notes.docx", "page.html"]
    assert report.problems == [] and report.pages == 5  # 2 PDF pages + 1 for each other file
    rows = collection.db.execute(
        "SELECT f.kind, c.page, c.heading, c.text FROM chunks c JOIN files f ON f.id = c.file_id "
        "ORDER BY f.path, c.ordinal"
    ).fetchall()
    assert rows == [
        ("markdown", None, '["Cats"]', "# Cats\nCats purr when content."),
        ("pdf", 1, "[]", "The pump needs priming before use."),
        ("pdf", 2, "[]", "Warranty lasts two years."),
        ("docx", None, '["Budget"]', "Budget\nWe spent forty euros on bolts."),
        ("html", None, '["Ferns"]', "Ferns\n\nFerns like shade."),
    ]
    assert collection.embed_model_id == "test-hash-bow" and collection.embed_dim == 256
    # the FTS5 index holds the same text
    (n,) = collection.db.execute(
        "SELECT count(*) FROM chunks_fts WHERE chunks_fts MATCH 'priming'"
    ).fetchone()
    assert n == 1


def test_reindexing_touches_only_changed_files(corpus, collection, monkeypatch):
    import engine.documents.index as index_module

    embedder = HashEmbedder()
    index_paths(collection, [corpus], embedder)
    before = {row[0]: row for row in snapshot(collection)}
    embedder.calls.clear()
    hashed: list = []
    real_hash = index_module.file_sha256

    def counted_hash(path):
        hashed.append(path)
        return real_hash(path)

    monkeypatch.setattr(index_module, "file_sha256", counted_hash)
    again = index_paths(collection, [corpus], embedder)
    assert again.added == [] and again.updated == [] and len(again.unchanged) == 4
    assert embedder.calls == []  # nothing re-embedded
    assert hashed == []  # same size and mtime: not even read

    (corpus / "guide.md").write_text("# Cats\nCats sleep all day.\n", encoding="utf-8")
    third = index_paths(collection, [corpus], embedder)
    assert [os.path.basename(p) for p in third.updated] == ["guide.md"]
    assert len(third.unchanged) == 3 and embedder.calls == [1]
    after = {row[0]: row for row in snapshot(collection)}
    changed = [path for path in after if after[path] != before.get(path)]
    assert [os.path.basename(p) for p in changed] == ["guide.md"]


def test_a_touched_but_unchanged_file_is_not_reembedded(corpus, collection):
    embedder = HashEmbedder()
    index_paths(collection, [corpus], embedder)
    ids_before = [row[1] for row in snapshot(collection)]
    os.utime(corpus / "guide.md", (1_000_000, 1_000_000))  # new mtime, same bytes
    embedder.calls.clear()
    report = index_paths(collection, [corpus], embedder)
    assert embedder.calls == [] and len(report.unchanged) == 4
    assert [row[1] for row in snapshot(collection)] == ids_before


def test_a_file_removed_from_disk_is_reported_and_its_chunks_dropped(corpus, collection):
    index_paths(collection, [corpus], HashEmbedder())
    (corpus / "manual.pdf").unlink()
    report = index_paths(collection, [corpus], HashEmbedder())
    assert [os.path.basename(p) for p in report.removed] == ["manual.pdf"]
    assert not any("manual.pdf" in row[0] for row in snapshot(collection))
    assert collection.keyword_search("priming", 5) == []


def test_problems_name_the_file_and_keep_the_previous_version(corpus, collection):
    embedder = HashEmbedder()
    index_paths(collection, [corpus], embedder)
    kept = [row for row in snapshot(collection) if row[0].endswith("manual.pdf")]
    # the PDF is replaced by a password-protected one: it cannot be read any more
    encrypted_pdf(corpus / "manual.pdf", [["new secret text"]])
    (corpus / "bad.txt").write_bytes(b"\x00\x01binary")
    with open(corpus / "huge.log", "wb") as f:
        f.truncate(2 * 1024**3)
    report = index_paths(collection, [corpus], embedder)
    by_name = {os.path.basename(p.path): p for p in report.problems}
    assert sorted(by_name) == ["bad.txt", "huge.log", "manual.pdf"]
    assert by_name["manual.pdf"].kind == "encrypted" and by_name["manual.pdf"].kept_previous
    assert by_name["manual.pdf"].message.endswith("the previously indexed version is kept")
    assert by_name["bad.txt"].kind == "binary" and not by_name["bad.txt"].kept_previous
    assert by_name["huge.log"].kind == "too-large" and "2.0 GB" in by_name["huge.log"].message
    assert [row for row in snapshot(collection) if row[0].endswith("manual.pdf")] == kept
    statuses = {
        os.path.basename(f.path): (f.status, f.problem is not None) for f in collection.files()
    }
    assert statuses["manual.pdf"] == ("indexed", True)
    assert statuses["bad.txt"] == ("skipped", True)


class CancelAfterBatches(CancelToken):
    def __init__(self, embedder: HashEmbedder, batches: int) -> None:
        super().__init__()
        self.embedder, self.batches = embedder, batches

    @property
    def cancelled(self) -> bool:
        return len(self.embedder.calls) >= self.batches


def test_cancel_mid_file_leaves_that_file_as_it_was(tmp_path, collection):
    docs = tmp_path / "d"
    docs.mkdir()
    for i in range(3):
        (docs / f"f{i}.txt").write_text(
            " ".join(f"word{i}x{j}" for j in range(400)), encoding="utf-8"
        )
    embedder = HashEmbedder(max_tokens=32)
    full = index_paths(collection, [docs], embedder, embed_batch=2)
    before = snapshot(collection)
    for i in range(3):
        (docs / f"f{i}.txt").write_text(
            " ".join(f"new{i}x{j}" for j in range(400)), encoding="utf-8"
        )
    # cancel after the first file is done and part of the second's batches ran
    first_file_batches = len(embedder.calls) // 3
    embedder.calls.clear()
    cancel = CancelAfterBatches(embedder, first_file_batches + 2)
    report = index_paths(collection, [docs], embedder, cancel=cancel, embed_batch=2)
    assert report.cancelled and [os.path.basename(p) for p in report.updated] == ["f0.txt"]
    assert len(embedder.calls) == first_file_batches + 2  # stopped at the next batch, not later
    after = snapshot(collection)
    assert [r for r in after if r[0].endswith(("f1.txt", "f2.txt"))] == [
        r for r in before if r[0].endswith(("f1.txt", "f2.txt"))
    ]
    assert all("new0x" in r[2] for r in after if r[0].endswith("f0.txt"))
    assert full.chunks == len(before)


def test_full_disk_stops_the_run_and_keeps_what_was_indexed(tmp_path, collection):
    docs = tmp_path / "d"
    docs.mkdir()
    (docs / "a.txt").write_text("apples " * 50, encoding="utf-8")
    index_paths(collection, [docs], HashEmbedder())
    before = snapshot(collection)
    (docs / "b.txt").write_text("bananas and more " * 4000, encoding="utf-8")
    # SQLite's own page cap gives exactly the error a full disk gives ("database or disk is full")
    (pages,) = collection.db.execute("PRAGMA page_count").fetchone()
    collection.db.execute(f"PRAGMA max_page_count={pages + 2}")
    report = index_paths(collection, [docs], HashEmbedder())
    assert report.stopped is not None and "database or disk is full" in report.stopped
    assert "b.txt" in report.stopped and "everything indexed before it is kept" in report.stopped
    assert [p.kind for p in report.problems] == ["disk-full"]
    assert snapshot(collection) == before


def test_a_file_removed_during_indexing_is_reported(tmp_path, collection):
    docs = tmp_path / "d"
    docs.mkdir()
    for name in ("a.txt", "b.txt"):
        (docs / name).write_text(f"{name} text", encoding="utf-8")
    seen = []

    def remove_b_when_a_starts(progress):
        seen.append(progress)
        if progress.current and progress.current.endswith("a.txt"):
            (docs / "b.txt").unlink(missing_ok=True)

    report = index_paths(collection, [docs], HashEmbedder(), progress=remove_b_when_a_starts)
    assert [os.path.basename(p) for p in report.added] == ["a.txt"]
    assert [(os.path.basename(p.path), p.kind) for p in report.problems] == [("b.txt", "removed")]
    assert "removed during indexing" in report.problems[0].message


def test_progress_counts_files_pages_and_chunks(corpus, collection):
    seen: list = []
    index_paths(collection, [corpus], HashEmbedder(), progress=seen.append)
    last = seen[-1]
    assert (last.files_done, last.files_total, last.pages, last.chunks) == (4, 4, 5, 5)
    assert last.current is None and last.eta_s == 0.0
    assert [p.files_done for p in seen] == sorted(p.files_done for p in seen)


def test_another_embedding_model_is_refused(corpus, collection):
    index_paths(collection, [corpus], HashEmbedder())
    with pytest.raises(CollectionError, match="test-hash-bow"):
        index_paths(collection, [corpus], HashEmbedder(model_id="other-model"))


def test_missing_paths_are_problems_not_crashes(tmp_path, collection):
    report = index_paths(collection, [tmp_path / "nope"], HashEmbedder())
    assert [(p.kind, p.message) for p in report.problems] == [
        ("removed", f"{tmp_path / 'nope'}: no such file or folder; skipped")
    ]


def test_bad_collection_names_are_refused(tmp_path):
    with pytest.raises(ConfigValidationError, match="collection"):
        Collection.open("../escape", root=tmp_path)


def test_a_file_that_is_not_a_collection_is_a_clear_error(tmp_path):
    (tmp_path / "junk.sqlite3").write_bytes(b"not sqlite at all" * 100)
    with pytest.raises(CollectionError, match="cannot be opened"):
        Collection.open("junk", root=tmp_path)


def test_writes_are_one_transaction_per_file(tmp_path, collection):
    docs = tmp_path / "d"
    docs.mkdir()
    (docs / "a.txt").write_text("one two three", encoding="utf-8")
    index_paths(collection, [docs], HashEmbedder())
    other = sqlite3.connect(str(collection.path))
    (n,) = other.execute("SELECT count(*) FROM chunks").fetchone()
    other.close()
    assert n == 1  # committed and visible to another connection


def test_full_disk_while_replacing_a_file_keeps_its_previous_chunks(tmp_path, collection):
    docs = tmp_path / "d"
    docs.mkdir()
    (docs / "a.txt").write_text("apples " * 50, encoding="utf-8")
    index_paths(collection, [docs], HashEmbedder())
    before = snapshot(collection)
    (docs / "a.txt").write_text("avocados and more " * 4000, encoding="utf-8")
    (pages,) = collection.db.execute("PRAGMA page_count").fetchone()
    collection.db.execute(f"PRAGMA max_page_count={pages + 2}")
    report = index_paths(collection, [docs], HashEmbedder())
    assert report.stopped is not None and report.updated == []
    assert snapshot(collection) == before  # the delete of the old chunks was rolled back too
    assert collection.keyword_search("apples", 5) != []


def test_a_single_large_file_gets_a_time_left_before_it_ends(tmp_path, collection):
    docs = tmp_path / "d"
    docs.mkdir()
    (docs / "big.txt").write_text(" ".join(f"w{i}" for i in range(2000)), encoding="utf-8")
    seen: list = []
    index_paths(
        collection, [docs], HashEmbedder(max_tokens=64), embed_batch=4, progress=seen.append
    )
    during = [p for p in seen if p.current is not None and p.files_done == 0]
    assert len(during) > 3  # one report per embedding batch
    assert during[0].eta_s is None  # nothing done yet: no rate to go by
    assert all(p.eta_s is not None for p in during[1:])
    # the chunks embedded so far, one batch of 4 at a time (the last batch may be shorter)
    counts = [p.chunks for p in during]
    assert counts[:3] == [0, 4, 8] and counts == sorted(counts)
    assert seen[-1].chunks == counts[-1] == collection.chunk_count()
