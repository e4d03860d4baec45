"""Documents in the window (issue 34): attach real files (Markdown, text, a PDF, a DOCX, a binary
file) through the paperclip, a drop on the chat and the panel; indexing on its thread with
progress, problems and cancel; a reply's prompt carrying the passages within the budget; its
receipt recording them; citations that open the passage; the Sources view with what was left
out; a collection reused by another chat; replay saying when a document changed since.

The fast tier: the real index and retrieval (engine/documents) with tests/documents_helpers.py's
HashEmbedder (a hashed bag of words, so a question sharing rare words with one passage finds it).
"""

from __future__ import annotations

import dataclasses
import json
import threading
from pathlib import Path

import pytest
from app_fakes import WAIT_MS, FakeEngine, close_window, make_window
from documents_helpers import HashEmbedder, write_docx, write_pdf
from PySide6.QtCore import QMimeData, QPointF, Qt, QUrl
from PySide6.QtGui import QDropEvent

from app.chat_documents import ChatDocumentSettings, ChatDocumentsFile
from app.views.sources_view import CITE_SCHEME, SourcesDialog, link_citations
from engine.events import Finished
from engine.receipt import canonical_sha256, section_checks, with_sources
from engine.types import Role

HOURS = "The museum opens at nine in the morning and closes at five. Tickets cost twelve euros."
PARKING = "Parking is behind the station; the garage has four hundred spaces for visitors."


class ReceiptEngine(FakeEngine):
    """FakeEngine whose replies end with a receipt (holding the messages sent), as the real
    engine's do, so the session records the sources in it."""

    def generate(self, lm, request, cancel):
        for event in super().generate(lm, request, cancel):
            if isinstance(event, Finished):
                receipt = {
                    "receipt_version": 1,
                    "prompt": {"messages": [dict(m) for m in request.messages]},
                    "output": {"token_ids": [1, 2, 3]},
                }
                event = dataclasses.replace(event, receipt=receipt)
            yield event


def _docs(tmp_path: Path) -> Path:
    folder = tmp_path / "docs"
    folder.mkdir()
    (folder / "museum.md").write_text(f"# Visiting\n\n## Hours\n\n{HOURS}\n", encoding="utf-8")
    (folder / "travel.txt").write_text(PARKING + "\n", encoding="utf-8")
    write_pdf(folder / "history.pdf", [["The museum was founded in 1881."], ["Rebuilt in 1950."]])
    write_docx(folder / "staff.docx", [("Heading 1", "Staff"), ("p", "Ada runs the archive.")])
    (folder / "blob.txt").write_bytes(b"\x00\x01\x02binary\x00" * 50)
    return folder


def _window(qtbot, tmp_path, replies=("Opens at nine [1].",), engine=None):
    engine = engine or ReceiptEngine(replies=list(replies))
    window = make_window(qtbot, tmp_path, engine)
    embedder = HashEmbedder()
    window.documents.use_loader(lambda path: embedder)
    return window, engine


def _attach(qtbot, window, paths):
    documents = window.documents
    with qtbot.waitSignal(
        documents.indexingChanged, timeout=WAIT_MS, check_params_cb=lambda r: not r
    ):
        window.attach_button.filesChosen.emit([str(p) for p in paths])


def _rows(panel):
    tree = panel.files
    return {
        tree.topLevelItem(i).text(0): (
            tree.topLevelItem(i).text(1),
            tree.topLevelItem(i).child(0).text(0) if tree.topLevelItem(i).childCount() else "",
        )
        for i in range(tree.topLevelItemCount())
    }


def test_paperclip_attaches_a_folder_indexed_off_the_gui_thread(qtbot, tmp_path):
    window, _ = _window(qtbot, tmp_path)
    try:
        folder = _docs(tmp_path)
        seen = []
        window.documents.progress.connect(seen.append)
        _attach(qtbot, window, [folder])
        panel = window.documents_panel
        assert window.tabs.currentWidget() is panel  # brought forward to show the progress
        rows = _rows(panel)
        assert rows["museum.md"][0] == "indexed" and rows["travel.txt"][0] == "indexed"
        assert rows["history.pdf"] == ("indexed, 2 pages", "")
        assert rows["staff.docx"][0] == "indexed"
        status, problem = rows["blob.txt"]
        assert status == "skipped" and "blob.txt" in problem and "binary" in problem
        assert panel.report_label.text().startswith("Indexed: 4 added, 0 updated, 0 unchanged")
        assert "1 with problems" in panel.report_label.text()
        assert seen and seen[-1].files_total == 5  # progress reached the window
        assert not panel.progress_bar.isVisible()  # and went when it ended
        settings = window.documents.current()
        assert settings.collection == "docs"  # named after the folder
        assert (tmp_path / "collections" / "docs.sqlite3").is_file()
        assert panel.collection.currentData() == "docs"
    finally:
        close_window(window)


def test_send_carries_the_passages_and_the_receipt_records_them(qtbot, tmp_path):
    window, engine = _window(qtbot, tmp_path)
    try:
        _attach(qtbot, window, [_docs(tmp_path)])
        window.session.set_system_prompt("Be brief.")
        with qtbot.waitSignal(window.session.replyFinished, timeout=WAIT_MS):
            assert window.session.send("When does the museum open in the morning?")
        system = engine.requests[0].messages[0]
        assert system["role"] == Role.SYSTEM
        assert system["content"].startswith("Be brief.\n\nAnswer using the numbered sources")
        # the "# Visiting" heading starts the Hours passage (engine/documents/chunk.py)
        passage = "[1] museum.md > Visiting > Hours\n# Visiting\n\n## Hours\n\n" + HOURS
        assert passage in system["content"]
        reply = window.store.messages(window.session.conversation_id)[-1]
        section = reply.receipt["sources"]
        first = section["sources"][0]
        assert first["marker"] == 1 and Path(first["file"]).name == "museum.md"
        assert first["heading"] == ["Visiting", "Hours"] and first["text"].endswith(HOURS)
        assert first["text_sha256"] and isinstance(first["chunk_id"], int)
        assert section["settings"]["top_k"] == 8 and section["budget_tokens"] == 1500
        assert section["query"] == "When does the museum open in the morning?"
        assert reply.receipt["checks"]["sources"] == canonical_sha256(section)
    finally:
        close_window(window)


def test_a_citation_opens_its_passage_and_sources_lists_what_was_left_out(qtbot, tmp_path):
    window, _ = _window(qtbot, tmp_path, replies=("It opens at nine [1]; see also [9].",))
    try:
        _attach(qtbot, window, [_docs(tmp_path)])
        # a budget with room for one passage only: the rest is left out, and listed
        window.documents_panel.budget.setValue(64)
        window.documents_panel.budget.editingFinished.emit()
        assert window.documents.current().budget_tokens == 64
        with qtbot.waitSignal(window.session.replyFinished, timeout=WAIT_MS):
            window.session.send("museum opens nine morning")
        used = window.documents_panel.last_use.text()
        assert used.startswith("Last reply: ") and "of 64 tokens;" in used
        assert used.endswith("left out for lack of room")
        widget = window.chat_view.widgets[-1]
        html = widget.body.parts[0].toHtml()
        assert f'href="{CITE_SCHEME}:1"' in html
        assert f'href="{CITE_SCHEME}:9"' not in html  # [9] was never a source: plain text
        assert "Sources" in widget.menu_entries()
        widget._on_citation(QUrl(f"{CITE_SCHEME}:1"))
        dialog = window.documents.sources_dialog
        assert isinstance(dialog, SourcesDialog) and dialog.isVisible()
        shown = dialog.passage.toPlainText()
        assert "museum.md > Visiting > Hours" in shown and HOURS in shown
        labels = [dialog.list.item(i).text() for i in range(dialog.list.count())]
        assert labels[0] == "[1] museum.md > Visiting > Hours"
        assert "Left out for lack of room:" in labels and len(labels) > 2
        assert "left out for lack of room" in dialog.summary.text()
        dialog.close()
    finally:
        close_window(window)


def test_citations_come_back_when_the_chat_is_opened_again(qtbot, tmp_path):
    window, _ = _window(qtbot, tmp_path)
    try:
        _attach(qtbot, window, [_docs(tmp_path)])
        with qtbot.waitSignal(window.session.replyFinished, timeout=WAIT_MS):
            window.session.send("museum opens nine morning")
        cid = window.session.conversation_id
        window.session.new_conversation()
        window.session.open_conversation(cid)  # messages come back without their receipts
        widget = window.chat_view.widgets[-1]
        assert widget.sources is not None
        assert f'href="{CITE_SCHEME}:1"' in widget.body.parts[0].toHtml()
    finally:
        close_window(window)


def test_a_tool_round_keeps_the_turns_sources(qtbot, tmp_path):
    """The request after a tool call carries the same passages, retrieved once per turn."""
    from app_fakes import ToolCallReply

    from app.tool_registry import builtin_key

    replies = (ToolCallReply(calls=(("calculator", {"expression": "12*2"}),)), "24 euros [1].")
    window, engine = _window(qtbot, tmp_path, replies=replies)
    try:
        _attach(qtbot, window, [_docs(tmp_path)])
        window.session.set_tool_enabled(builtin_key("calculator"), True)
        retrieved = []
        real = window.documents.retrieve
        window.documents.retrieve = lambda *a: retrieved.append(a) or real(*a)
        window.session.send("What do two museum tickets cost?")
        qtbot.waitUntil(
            lambda: len(engine.requests) == 2 and not window.session.busy, timeout=WAIT_MS
        )
        first, second = (r.messages[0]["content"] for r in engine.requests)
        assert "Tickets cost twelve euros." in first and second == first
        assert len(retrieved) == 1
    finally:
        close_window(window)


def test_a_collection_is_reused_by_another_chat(qtbot, tmp_path):
    window, engine = _window(qtbot, tmp_path, replies=("first", "second"))
    try:
        _attach(qtbot, window, [_docs(tmp_path)])
        window.session.new_conversation()
        panel = window.documents_panel
        assert window.documents.current() is None
        assert panel.collection.currentData() == ""  # the new chat has no documents
        index = panel.collection.findData("docs")
        assert index > 0  # but the collection is offered
        panel.collection.activated.emit(index)
        assert window.documents.current().collection == "docs"
        with qtbot.waitSignal(window.session.replyFinished, timeout=WAIT_MS):
            window.session.send("Where is the parking garage?")
        assert PARKING in engine.requests[-1].messages[0]["content"]
        # "Stop using": the chat's next reply has no sources; the collection stays
        panel.detachRequested.emit()
        assert window.documents.current() is None and "docs" in window.documents.collection_names()
    finally:
        close_window(window)


def test_a_drop_on_the_chat_attaches_files_but_leaves_model_files_to_the_window(qtbot, tmp_path):
    window, _ = _window(qtbot, tmp_path)
    try:
        folder = _docs(tmp_path)
        viewport = window.chat_view.viewport()

        def drop(paths):
            mime = QMimeData()
            mime.setUrls([QUrl.fromLocalFile(str(p)) for p in paths])
            event = QDropEvent(QPointF(10, 10), Qt.CopyAction, mime, Qt.LeftButton, Qt.NoModifier)
            return window.documents._drops.eventFilter(viewport, event)

        assert not drop([tmp_path / "model.gguf"])  # not taken: the window opens models
        assert not window.documents.indexing
        with qtbot.waitSignal(
            window.documents.indexingChanged, timeout=WAIT_MS, check_params_cb=lambda r: not r
        ):
            assert drop([folder / "museum.md"])
        assert list(_rows(window.documents_panel)) == ["museum.md"]
    finally:
        close_window(window)


def test_cancel_stops_indexing_and_keeps_what_was_finished(qtbot, tmp_path):
    gate, started = threading.Event(), threading.Event()

    class SlowEmbedder(HashEmbedder):
        def embed(self, texts, cancel=None):
            if any("nine" in t for t in texts):  # museum.md waits until the test cancels
                started.set()
                gate.wait(WAIT_MS / 1000)
            return super().embed(texts, cancel)

    engine = ReceiptEngine()
    window = make_window(qtbot, tmp_path, engine)
    try:
        embedder = SlowEmbedder()
        window.documents.use_loader(lambda path: embedder)
        folder = _docs(tmp_path)
        window.attach_button.filesChosen.emit([str(folder)])
        qtbot.waitUntil(started.is_set, timeout=WAIT_MS)
        panel = window.documents_panel
        assert panel.cancel_button.isVisible() and not panel.add_files_button.isEnabled()
        with qtbot.waitSignal(
            window.documents.indexingChanged, timeout=WAIT_MS, check_params_cb=lambda r: not r
        ):
            panel.cancel_button.click()
            gate.set()
        report = window.documents.last_report
        assert report.cancelled
        assert panel.report_label.text().startswith("Indexing cancelled")
        names = set(_rows(panel))
        # files are indexed in path order: blob.txt (skipped), history.pdf before museum.md
        assert "history.pdf" in names and "museum.md" not in names
    finally:
        gate.set()
        close_window(window)


def test_no_embedding_model_is_said_in_the_panel(qtbot, tmp_path):
    from engine.model_files import ModelNotInstalledError

    engine = ReceiptEngine()
    window = make_window(qtbot, tmp_path, engine)
    try:

        def missing(path):
            raise ModelNotInstalledError("The default embedding model is not installed (x.gguf)")

        window.documents.use_loader(missing)
        with qtbot.waitSignal(
            window.documents.indexingChanged, timeout=WAIT_MS, check_params_cb=lambda r: not r
        ):
            window.attach_button.filesChosen.emit([str(_docs(tmp_path))])
        problem = window.documents_panel.problem_label
        assert problem.isVisible() and "embedding model is not installed" in problem.text()
    finally:
        close_window(window)


def test_replay_note_names_a_document_changed_since(qtbot, tmp_path):
    window, _ = _window(qtbot, tmp_path)
    try:
        folder = _docs(tmp_path)
        _attach(qtbot, window, [folder])
        with qtbot.waitSignal(window.session.replyFinished, timeout=WAIT_MS):
            window.session.send("museum opens nine morning")
        receipt = window.store.messages(window.session.conversation_id)[-1].receipt
        assert window.documents.replay_note(receipt) is None  # nothing changed yet
        (folder / "museum.md").write_text("# Visiting\n\n## Hours\n\nClosed for works.\n")
        with qtbot.waitSignal(
            window.documents.indexingChanged, timeout=WAIT_MS, check_params_cb=lambda r: not r
        ):
            window.documents_panel.reindexRequested.emit()
        note = window.documents.replay_note(receipt)
        assert note.startswith("The replay used the ")
        assert "[1] museum.md (no longer indexed)" in note
    finally:
        close_window(window)


# --- units -------------------------------------------------------------------------------------
def test_citations_link_only_known_markers_outside_code():
    text = "See [1] and [2, 3]; not [9]. `a[1]` stays.\n```\nx[1]\n```\nAlready [1](http://x)."
    linked = link_citations(text, {1, 2, 3})
    assert linked == (
        "See [\\[1\\]](cite:1) and [\\[2\\]](cite:2), [\\[3\\]](cite:3); not [9]. `a[1]` stays."
        "\n```\nx[1]\n```\nAlready [1](http://x)."
    )
    assert link_citations(text, set()) == text


def test_chat_documents_file_does_not_give_a_reused_id_the_old_chats_documents(tmp_path):
    file = ChatDocumentsFile(tmp_path / "chat_documents.json")
    file.set(file.key(3, 100.5), ChatDocumentSettings("notes", budget_tokens=10**9, top_k=0))
    again = ChatDocumentsFile(tmp_path / "chat_documents.json")
    assert again.get(again.key(3, 100.5)) == ChatDocumentSettings("notes", 32_768, 1)  # clamped
    assert again.get(again.key(3, 200.0)) is None  # same id, another chat
    (tmp_path / "chat_documents.json").write_text("{not json")
    broken = ChatDocumentsFile(tmp_path / "chat_documents.json")
    assert broken.get(broken.key(3, 100.5)) is None and "cannot be read" in broken.problem


def test_receipt_sources_section_is_checked():
    receipt = {"prompt": {"token_ids": [1]}, "preset": {}, "output": {"token_ids": [2]}}
    receipt["checks"] = section_checks(receipt)
    section = {"collection": "c", "sources": [{"chunk_id": 4, "text_sha256": "ab"}]}
    recorded = with_sources(receipt, section)
    assert recorded["checks"]["sources"] == section_checks(recorded)["sources"]
    assert recorded["checks"]["prompt"] == receipt["checks"]["prompt"]
    edited = json.loads(json.dumps(recorded))
    edited["sources"]["sources"][0]["chunk_id"] = 5  # changed behind the receipt's back
    assert section_checks(edited)["sources"] != edited["checks"]["sources"]


@pytest.fixture(autouse=True)
def _no_real_embedding_model(monkeypatch):
    """The fast tier never loads the real embedding model (each test gives its own loader)."""
    import app.features.index_runner as runner

    def refuse(path):
        raise AssertionError("a fast test tried to load the real embedding model")

    monkeypatch.setattr(runner, "default_loader", refuse)


def test_replay_from_the_receipt_says_which_document_changed(qtbot, tmp_path, monkeypatch):
    """The receipt round trip on the app's own engine bridge (RealEngine over the scripted
    model): the reply's receipt holds the sources, the replay runs the recorded prompt (the
    passages as they were) and reproduces the reply, and names the document changed since."""
    from test_app_replay import ScriptedModelEngine

    from tests.fake_model import BOS, EOS, FakeTokenizer, fake_lm, one_hot, use_fake_detokenizer

    hello, world = 4, 5  # "Hello", " world" in the fake vocabulary

    class AnyText(FakeTokenizer):
        """The fake vocabulary cannot spell documents: other text reads as x, y, z by
        character (the scripted model never looks at it; the receipt keeps the ids)."""

        def encode(self, text, add_special=True, *, literal_spans=()):
            try:
                return super().encode(text, add_special, literal_spans=literal_spans)
            except ValueError:
                return [BOS] * add_special + [26 + ord(c) % 3 for c in text]

    class DocumentsEngine(ScriptedModelEngine):
        def load(self, path, *, n_ctx, n_threads, progress, cache_type="f16"):
            progress("ready", 1.0)
            script = {hello: world, world: EOS}  # "Hello world", then the end
            lm = fake_lm(
                lambda prefix: one_hot(script.get(prefix[-1], hello)),
                n_ctx=n_ctx or 4096,
                tokenizer=AnyText(),
                path=Path(path),
            )
            self._model_digests().start(lm.path)
            self.lm = lm
            return lm

    use_fake_detokenizer(monkeypatch)
    model = tmp_path / "scripted.gguf"
    model.write_bytes(b"GGUF scripted model")
    engine = DocumentsEngine(digest_cache=tmp_path / "digests.json")
    window = make_window(qtbot, tmp_path, engine, model_path=str(model))
    try:
        embedder = HashEmbedder()
        window.documents.use_loader(lambda path: embedder)
        folder = _docs(tmp_path)
        _attach(qtbot, window, [folder])
        with qtbot.waitSignal(window.session.replyFinished, timeout=WAIT_MS):
            window.session.send("museum opens nine morning")
        reply = window.store.messages(window.session.conversation_id)[-1]
        section = reply.receipt["sources"]
        assert reply.receipt["checks"]["sources"] == canonical_sha256(section)
        assert HOURS in reply.receipt["prompt"]["messages"][0]["content"]
        (folder / "museum.md").write_text("# Visiting\n\n## Hours\n\nClosed for works.\n")
        with qtbot.waitSignal(
            window.documents.indexingChanged, timeout=WAIT_MS, check_params_cb=lambda r: not r
        ):
            window.documents.reindex()
        outcome = []
        window.session.replayFinished.connect(lambda _id, report: outcome.append(report))
        window.session.replayFailed.connect(lambda _id, text: outcome.append(text))
        assert window.session.replay(reply.id)
        qtbot.waitUntil(lambda: bool(outcome), timeout=WAIT_MS)
        report = outcome[0]
        assert not isinstance(report, str), report
        assert reply.content == "Hello world"
        assert report.identical and report.replay_text == "Hello world"  # the recorded passages
        (note,) = [d for d in report.differences if "passage" in d]
        assert "[1] museum.md (no longer indexed)" in note
    finally:
        close_window(window)
