"""`python -m engine index` and `ask`: fast tier with the hashed embedder, and the real path
(all-MiniLM-L6-v2 GGUF + SmolLM2) in the slow tier."""

from __future__ import annotations

import json

import pytest
from documents_helpers import HashEmbedder, write_docx, write_pdf
from requirements import missing

import engine.documents.cli as documents_cli
from engine.__main__ import main


@pytest.fixture
def data_home(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "data"))
    return tmp_path / "data" / "LocalChat" / "collections"


@pytest.fixture
def docs(tmp_path):
    d = tmp_path / "docs"
    d.mkdir()
    write_pdf(d / "pump.pdf", [["The pump must be primed with water."], ["Warranty: two years."]])
    write_docx(d / "budget.docx", [("Heading 1", "Costs"), ("p", "Bolts cost forty euros.")])
    (d / "cats.md").write_text("# Cats\nCats purr when content.\n", encoding="utf-8")
    return d


@pytest.fixture
def hashed(monkeypatch):
    embedder = HashEmbedder()
    monkeypatch.setattr(documents_cli, "load_embedder", lambda *a, **k: embedder)
    return embedder


def test_index_builds_a_collection_in_the_data_directory(docs, data_home, hashed, capsys):
    assert main(["index", str(docs), "--collection", "manuals", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["path"] == str(data_home / "manuals.sqlite3")
    assert sorted(p.rsplit("/", 1)[1] for p in report["added"]) == [
        "budget.docx",
        "cats.md",
        "pump.pdf",
    ]
    assert (report["pages"], report["chunks"], report["total_chunks"]) == (4, 4, 4)
    assert main(["index", str(docs), "--collection", "manuals", "--json"]) == 0
    again = json.loads(capsys.readouterr().out)
    assert (len(again["unchanged"]), again["chunks"], again["total_chunks"]) == (3, 0, 4)


def test_index_reports_problems_by_file_and_still_succeeds(docs, data_home, hashed, capsys):
    (docs / "blob.txt").write_bytes(b"\x00\x00\x00")
    assert main(["index", str(docs / "blob.txt"), str(docs / "cats.md"), "--collection", "m"]) == 0
    captured = capsys.readouterr()
    assert f"skipped: {docs / 'blob.txt'}: is binary" in captured.err
    assert captured.out.startswith("m: 1 added, 0 updated, 0 unchanged, 0 removed, 1 skipped;")


def test_bad_collection_name_is_a_usage_error(docs, data_home, hashed, capsys):
    assert main(["index", str(docs), "--collection", "../x"]) == 2
    assert "collection='../x' is invalid" in capsys.readouterr().err


def test_ask_without_the_collection_says_how_to_build_it(data_home, hashed, capsys):
    assert main(["ask", "default", "what?", "--collection", "nothing"]) == 1
    err = capsys.readouterr().err
    assert "no collection named 'nothing'" in err and "python -m engine index" in err


# --- the real embedding model and chat model ------------------------------------------------------
@pytest.fixture(scope="module")
def minilm_path():
    from engine.embedding import default_embedding_model_path
    from engine.model_files import ModelNotInstalledError

    try:
        return default_embedding_model_path()
    except ModelNotInstalledError as exc:
        missing(
            f"the default embedding model ({exc})", "run `python -m tools.make_embedding_model`"
        )


@pytest.mark.slow
def test_real_model_index_and_ask_with_citations(
    docs, data_home, minilm_path, smollm2_path, capsys
):
    assert main(["index", str(docs), "--collection", "real", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["embed_model"].startswith("all-MiniLM-L6-v2.F16.gguf@")
    assert report["total_chunks"] == 4
    question = "How long is the warranty on the pump?"
    args = ["ask", str(smollm2_path), question, "--collection", "real", "--json"]
    assert main(args + ["--max-tokens", "24", "--temperature", "0"]) == 0
    out = json.loads(capsys.readouterr().out)
    top = out["sources"][0]
    assert (top["file"], top["page"], top["marker"]) == (str(docs / "pump.pdf"), 2, 1)
    assert top["bm25_rank"] == 1 and top["vector_rank"] == 1
    assert set(top) >= {"chunk_id", "score", "text_sha256", "heading"}
    assert out["answer"].strip() and out["finish_reason"] in ("stop", "length")
    assert out["retrieval"]["embed_model"] == report["embed_model"]


@pytest.mark.slow
def test_real_model_ranks_by_meaning_not_only_words(tmp_path, minilm_path):
    """Vector search alone finds the passage with no word in common with the query."""
    from engine.documents.collection import Collection
    from engine.documents.index import index_paths
    from engine.documents.vectors import vector_search
    from engine.embedding import Embedder

    d = tmp_path / "d"
    d.mkdir()
    (d / "a.txt").write_text("The feline slept on the warm windowsill all afternoon.", "utf-8")
    (d / "b.txt").write_text("Quarterly revenue rose by eight percent in Europe.", "utf-8")
    (d / "c.txt").write_text("Turn the valve clockwise to stop the water flow.", "utf-8")
    with Embedder.load(minilm_path) as embedder, Collection.open("m", root=tmp_path) as c:
        index_paths(c, [d], embedder)
        hits = vector_search(c, embedder.embed(["a cat napping in the sun"])[0], 3)
        assert c.chunks([hits[0][0]])[hits[0][0]].file.endswith("a.txt")
        assert hits[0][1] > hits[1][1] + 0.1


def test_ctrl_c_stops_indexing_and_keeps_the_files_already_done(
    tmp_path, data_home, monkeypatch, capsys
):
    import os
    import signal

    docs = tmp_path / "many"
    docs.mkdir()
    for i in range(3):
        (docs / f"n{i}.txt").write_text(f"note number {i}", encoding="utf-8")

    class InterruptedOnSecondFile(HashEmbedder):
        def embed(self, texts, cancel=None):
            if len(self.calls) == 1:  # the second file: the user presses Ctrl-C
                os.kill(os.getpid(), signal.SIGINT)
            return super().embed(texts, cancel)

    embedder = InterruptedOnSecondFile()
    monkeypatch.setattr(documents_cli, "load_embedder", lambda *a, **k: embedder)
    assert main(["index", str(docs), "--collection", "c"]) == 130
    assert "cancelled: files indexed before Ctrl-C are kept" in capsys.readouterr().err
    from engine.documents.collection import Collection

    with Collection.open("c", root=data_home, create=False) as c:
        assert [os.path.basename(f.path) for f in c.files()] == ["n0.txt"]
        assert c.chunk_count() == 1


def test_the_progress_line_shows_files_pages_rate_and_time_left():
    from engine.documents.index import IndexProgress

    p = IndexProgress(3, 10, "/x/report.pdf", 41, 120, 12.0, 10.0, 75.4)
    assert documents_cli.progress_line(p) == (
        "3/10 files · 41 pages · 120 chunks · 10 chunks/s · 1:15 left  report.pdf"
    )
    unknown = IndexProgress(0, 10, None, 0, 0, 0.0, 0.0, None)
    assert documents_cli.progress_line(unknown).startswith("0/10 files") and "--:-- left" in (
        documents_cli.progress_line(unknown)
    )
