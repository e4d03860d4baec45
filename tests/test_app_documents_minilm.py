"""Documents in the window with the real default embedding model (all-MiniLM-L6-v2, GGUF, our
engine): a question that shares no word with the passage that answers it still retrieves that
passage first (by meaning, through the vectors), and the receipt records it."""

from __future__ import annotations

from pathlib import Path

from app_fakes import WAIT_MS, close_window, make_window
from test_app_documents import HOURS, ReceiptEngine, _attach, _docs


def test_real_model_finds_the_passage_by_meaning(qtbot, tmp_path, minilm_path):
    engine = ReceiptEngine(replies=["Twelve euros [1]."])
    window = make_window(qtbot, tmp_path, engine)  # the app's own loader: the default model
    try:
        _attach(qtbot, window, [_docs(tmp_path)])
        report = window.documents.last_report
        assert sorted(Path(p).name for p in report.added) == [
            "history.pdf",
            "museum.md",
            "staff.docx",
            "travel.txt",
        ]
        with qtbot.waitSignal(window.session.replyFinished, timeout=WAIT_MS):
            window.session.send("What is the price of admission?")  # no word of the passage
        section = window.store.messages(window.session.conversation_id)[-1].receipt["sources"]
        first = section["sources"][0]
        assert Path(first["file"]).name == "museum.md" and first["text"].endswith(HOURS)
        assert first["bm25_rank"] is None and first["vector_rank"] == 1
        assert section["embed_model"].startswith("all-MiniLM-L6-v2.F16.gguf@")
        assert HOURS in engine.requests[0].messages[0]["content"]
    finally:
        close_window(window)
