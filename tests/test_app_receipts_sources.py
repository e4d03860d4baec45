"""A reply's Details (app/views/receipt_dialog.py) show what its receipt records beyond the
model and preset: the document passages its prompt carried (file, page, heading, chunk id) and
whether each is unchanged in the collection now, and the summary of earlier messages the prompt
was built on (issues 34 and 35).

The window test uses the real index with HashEmbedder (tests/documents_helpers.py); the others
give the dialog hand-written receipts.
"""

from __future__ import annotations

from app_fakes import WAIT_MS, close_window
from test_app_documents import _attach, _docs, _window

from app.views.receipt_dialog import CHANGED, REMOVED, UNCHANGED, ReceiptDialog

BASE = {
    "receipt_version": 1,
    "model": {"file_name": "m.gguf"},
    "prompt": {"messages": [], "n_tokens": 40},
    "output": {"finish_reason": "stop", "n_tokens": 3},
}


def _passage(marker, chunk_id, file, heading, page=None):
    return {
        "marker": marker,
        "chunk_id": chunk_id,
        "file": file,
        "page": page,
        "heading": heading,
        "text_sha256": "ab" * 32,
    }


SOURCES = {
    "collection": "pump",
    "embed_model": "all-MiniLM-L6-v2",
    "query": "How long is the warranty?",
    "settings": {"top_k": 8},
    "budget_tokens": 1500,
    "used_tokens": 212,
    "sources": [
        _passage(1, 17, "/docs/pump-manual.md", ["Pump", "Warranty"]),
        _passage(2, 40, "C:\\docs\\specs.pdf", [], page=3),
        _passage(3, 41, "/docs/notes.txt", []),
    ],
    "left_out": [_passage(None, 90, "/docs/old.md", [])],
}


def _lines(dialog):
    return dialog.body.toPlainText().splitlines()


def _row(dialog, marker):
    """The cells of a passage's row: the marker's line and the lines up to the next marker
    (QTextBrowser's plain text puts each table cell on a line of its own)."""
    lines = _lines(dialog)
    assert lines.count(marker) == 1, (marker, lines)
    start = lines.index(marker)
    end = next((i for i in range(start + 1, len(lines)) if lines[i].startswith("[")), len(lines))
    return [line for line in lines[start:end] if line]


def test_details_list_each_passage_and_its_state_now(qtbot):
    dialog = ReceiptDialog(7, {**BASE, "sources": SOURCES})
    qtbot.addWidget(dialog)
    text = dialog.body.toPlainText()
    assert "Sources" in _lines(dialog)
    assert "How long is the warranty?" in text and "pump" in text
    assert "3 in the prompt, 212 of 1500 tokens; 1 more found but left out" in text
    # until the collection is read, each passage says so
    assert _row(dialog, "[1]") == [
        "[1]",
        "pump-manual.md › Pump › Warranty",
        "chunk 17",
        "checking…",
    ]
    dialog.show_passage_states({17: UNCHANGED, 40: CHANGED, 41: REMOVED})
    assert _row(dialog, "[1]")[2:] == ["chunk 17", "unchanged now"]
    assert _row(dialog, "[2]")[1:] == [
        "specs.pdf p.3",  # a Windows path's file name, and its page
        "chunk 40",
        "changed since (its document was edited)",
    ]
    assert _row(dialog, "[3]")[2:] == ["chunk 41", "no longer indexed"]


def test_details_say_when_the_passages_cannot_be_checked(qtbot):
    dialog = ReceiptDialog(7, {**BASE, "sources": SOURCES})
    qtbot.addWidget(dialog)
    dialog.show_passage_states(None, "The passages could not be checked: the collection is gone.")
    text = dialog.body.toPlainText()
    assert "The passages could not be checked: the collection is gone." in text
    assert "checking…" not in text and "unchanged now" not in text
    assert _row(dialog, "[1]") == ["[1]", "pump-manual.md › Pump › Warranty", "chunk 17"]


def test_details_say_the_reply_was_built_on_a_summary(qtbot):
    compaction = {
        "compaction_id": 4,
        "covered_message_ids": [11, 12, 13, 14, 15],
        "summary": "The user asked about pumps; we agreed on the P-20.",
        "summary_sha256": "cd" * 32,
    }
    dialog = ReceiptDialog(7, {**BASE, "compaction": compaction})
    qtbot.addWidget(dialog)
    text = dialog.body.toPlainText()
    assert "Compaction" in _lines(dialog)
    assert "a summary of 5 earlier messages" in text
    assert "The user asked about pumps; we agreed on the P-20." in text
    assert "cd" * 32 in text
    assert "Sources" not in _lines(dialog)  # no passages: no section


def test_a_receipt_without_those_sections_shows_neither(qtbot):
    dialog = ReceiptDialog(7, dict(BASE))
    qtbot.addWidget(dialog)
    assert "Sources" not in _lines(dialog) and "Compaction" not in _lines(dialog)


def test_details_of_a_reply_check_its_passages_against_the_collection_now(qtbot, tmp_path):
    window, _ = _window(qtbot, tmp_path)
    try:
        folder = _docs(tmp_path)
        _attach(qtbot, window, [folder])
        with qtbot.waitSignal(window.session.replyFinished, timeout=WAIT_MS) as finished:
            window.session.send("When does the museum open in the morning?")
        reply = finished.args[0]
        markers = {
            s["marker"]: s["file"].rsplit("/", 1)[-1] for s in reply.receipt["sources"]["sources"]
        }
        museum = next(m for m, name in markers.items() if name == "museum.md")
        dialog = window.show_details(reply.id)
        qtbot.waitUntil(lambda: dialog.passage_states is not None, timeout=WAIT_MS)
        for marker in markers:
            assert _row(dialog, f"[{marker}]")[-1] == "unchanged now"
        assert _row(dialog, f"[{museum}]")[1] == "museum.md › Visiting › Hours"
        # the museum's hours are edited and indexed again: its passage is gone, the rest stay
        (folder / "museum.md").write_text("# Visiting\n\n## Hours\n\nClosed for works.\n")
        _attach(qtbot, window, [folder])
        dialog = window.show_details(reply.id)
        qtbot.waitUntil(lambda: dialog.passage_states is not None, timeout=WAIT_MS)
        for marker in markers:
            expected = "no longer indexed" if marker == museum else "unchanged now"
            assert _row(dialog, f"[{marker}]")[-1] == expected
    finally:
        close_window(window)
