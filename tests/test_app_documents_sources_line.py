"""The "Sources: [1] file › heading · [2] …" line under every reply whose prompt carried document
passages (issue 34), whether or not the model wrote [n] markers (small models rarely cite): each
entry opens its passage as a [n] link does.

The window tests use the real index with HashEmbedder (tests/documents_helpers.py).
"""

from __future__ import annotations

from app_fakes import WAIT_MS, close_window
from PySide6.QtGui import QTextDocument
from test_app_documents import _attach, _docs, _window

from app.views.sources_line import sources_line_html
from app.views.sources_view import SourcesDialog


def _plain(rich: str) -> str:
    document = QTextDocument()
    document.setHtml(rich)
    return document.toPlainText()


def test_the_line_names_each_passage_as_a_link_to_it():
    section = {
        "sources": [
            # out of order on purpose: the line follows the markers
            {"marker": 2, "file": "C:\\docs\\specs & sizes.pdf", "page": 3, "heading": []},
            {
                "marker": 1,
                "file": "/docs/pump-manual.md",
                "page": None,
                "heading": ["Pump", "Warranty"],
            },
        ],
        "left_out": [{"marker": None, "file": "/docs/old.md", "heading": []}],
    }
    assert sources_line_html(section) == (
        'Sources: <a href="cite:1">[1] pump-manual.md › Warranty</a>'
        ' · <a href="cite:2">[2] specs &amp; sizes.pdf p.3</a>'
    )
    # nothing in the prompt (all left out, or no receipt): no line
    assert sources_line_html({"sources": [], "left_out": section["left_out"]}) == ""
    assert sources_line_html(None) == ""


def test_a_reply_without_markers_shows_its_sources_and_each_opens_its_passage(qtbot, tmp_path):
    window, _ = _window(qtbot, tmp_path, replies=("It opens at nine.",))  # no [n] in the reply
    try:
        _attach(qtbot, window, [_docs(tmp_path)])
        with qtbot.waitSignal(window.session.replyFinished, timeout=WAIT_MS) as finished:
            window.session.send("When does the museum open in the morning?")
        reply = finished.args[0]
        passages = reply.receipt["sources"]["sources"]
        museum = next(s["marker"] for s in passages if s["file"].endswith("museum.md"))
        widget = window.chat_view.widget_for(reply.id)
        line = widget.sources_line
        assert line.isVisible()
        text = _plain(line.text())
        assert text.startswith("Sources: [1] ")
        assert f"[{museum}] museum.md › Hours" in text
        assert text.count(" · ") == len(passages) - 1
        # an entry is a link: activating it opens the Sources dialog at that passage
        line.linkActivated.emit(f"cite:{museum}")
        dialog = window.documents.sources_dialog
        assert isinstance(dialog, SourcesDialog) and dialog.isVisible()
        assert dialog.entries[dialog.list.currentRow()]["marker"] == museum
        assert "opens at nine" in dialog.passage.toPlainText()
        dialog.close()
        # the user's question has no line
        question = window.chat_view.widgets[-2]
        assert not question.sources_line.isVisible()
    finally:
        close_window(window)


def test_the_line_comes_back_when_the_chat_is_opened_again(qtbot, tmp_path):
    window, _ = _window(qtbot, tmp_path, replies=("Nine.",))
    try:
        _attach(qtbot, window, [_docs(tmp_path)])
        with qtbot.waitSignal(window.session.replyFinished, timeout=WAIT_MS):
            window.session.send("museum opens nine morning")
        cid = window.session.conversation_id
        window.session.new_conversation()
        window.session.open_conversation(cid)  # messages come back without their receipts
        line = window.chat_view.widgets[-1].sources_line
        assert line.isVisible() and "museum.md › Hours" in _plain(line.text())
    finally:
        close_window(window)


def test_a_chat_without_documents_has_no_line(qtbot, tmp_path):
    window, _ = _window(qtbot, tmp_path, replies=("Hello.",))
    try:
        with qtbot.waitSignal(window.session.replyFinished, timeout=WAIT_MS):
            window.session.send("Hi")
        assert not window.chat_view.widgets[-1].sources_line.isVisible()
        assert window.chat_view.widgets[-1].sources_line.text() == ""
    finally:
        close_window(window)
