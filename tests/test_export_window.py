"""File > Export and share… in the window (issue 35): the dialog's scopes and formats, an export
that runs off the GUI thread with progress and lands as a file, a cancel that leaves nothing,
a read-only destination named in the error, and File > Import taking the zip back."""

import threading
import zipfile
from pathlib import Path

import pytest
from PySide6.QtCore import Qt
from PySide6.QtWidgets import QFileDialog, QMessageBox

import app.export_html as export_html
from app.export_job import ExportFormat, ExportScope
from app.views.export_dialog import ExportDialog
from tests.app_fakes import WAIT_MS, FakeEngine, close_window, make_window


@pytest.fixture
def window(qtbot, tmp_path, monkeypatch):
    errors = []
    monkeypatch.setattr(
        QMessageBox, "critical", lambda parent, title, message: errors.append((title, message))
    )
    w = make_window(qtbot, tmp_path, FakeEngine(replies=["ok"]), load=False)
    w.errors = errors
    yield w
    close_window(w)


def add_chats(window, n=3, project=None):
    store = window.store
    project_id = store.create_project(project) if project else None
    ids = []
    for i in range(n):
        cid = store.create_conversation(f"Chat {i}", project_id=project_id)
        store.add_message(cid, "user", f"question {i}")
        store.add_message(cid, "assistant", f"answer {i}")
        ids.append(cid)
    window._refresh_sidebar()
    return ids


def save_to(monkeypatch, path):
    asked = []

    def fake_dialog(parent, caption, start, filters):
        assert Path(start).is_absolute()  # a real folder (file_dialogs), not the working directory
        asked.append((Path(start).name, filters))
        return str(path), filters

    monkeypatch.setattr(QFileDialog, "getSaveFileName", fake_dialog)
    return asked


def test_the_menu_opens_the_dialog_with_the_scopes_that_apply(qtbot, window):
    ids = add_chats(window, 2, project="Garden")
    window.session.open_conversation(ids[0])
    assert window.export_share_action.shortcut().toString() == "Ctrl+Shift+E"
    qtbot.keyClick(window, Qt.Key_E, Qt.ControlModifier | Qt.ShiftModifier)
    dialog = window.export_feature.dialog
    assert isinstance(dialog, ExportDialog) and dialog.isVisible()
    assert dialog.scope() == ExportScope.CHAT and dialog.export_format() == ExportFormat.ZIP
    project = dialog.scope_buttons[ExportScope.PROJECT]
    assert project.isEnabled() and project.text() == "This project — Garden (2 chats)"
    # the window's first chat (empty, made at start) is left out of "everything"
    assert dialog.scope_buttons[ExportScope.EVERYTHING].text() == "Everything — 2 chats"
    dialog.reject()
    # a chat in no project cannot export "this project"
    loose = window.store.create_conversation("Loose")
    window.session.open_conversation(loose)
    dialog = window.export_feature.open_dialog()
    assert not dialog.scope_buttons[ExportScope.PROJECT].isEnabled()
    dialog.reject()


def test_a_project_exports_as_a_web_page_through_the_dialog(qtbot, window, tmp_path, monkeypatch):
    ids = add_chats(window, 2, project="Garden")
    add_chats(window, 1)  # not in the project: not exported
    window.session.open_conversation(ids[1])
    asked = save_to(monkeypatch, tmp_path / "garden")  # no extension typed
    dialog = window.export_feature.open_dialog()
    dialog.scope_buttons[ExportScope.PROJECT].setChecked(True)
    dialog.format_buttons[ExportFormat.HTML].setChecked(True)
    with qtbot.waitSignal(window.export_feature.runner.finished, timeout=WAIT_MS):
        qtbot.mouseClick(dialog.export_button, Qt.LeftButton)
    assert asked == [("Garden.html", "Web page (*.html)")]
    qtbot.waitUntil(lambda: not dialog.isVisible(), timeout=WAIT_MS)
    page = (tmp_path / "garden.html").read_text(encoding="utf-8")
    assert "question 0" in page and "answer 1" in page
    assert page.count('<article class="chat"') == 2
    assert window.state_label.text() == "Exported 2 chats to garden.html"
    assert window.errors == []


def gate_after_first_chat(monkeypatch):
    """Holds the export's thread after its first chat until released: a 'large' export that
    is still running when the user clicks Cancel, without timing."""
    reached, release = threading.Event(), threading.Event()
    real_chat = export_html.ChatHtml.chat
    calls = []

    def chat(self, snapshot, anchor):
        calls.append(anchor)
        if len(calls) == 2:
            reached.set()
            release.wait(10)
        return real_chat(self, snapshot, anchor)

    monkeypatch.setattr(export_html.ChatHtml, "chat", chat)
    return reached, release


@pytest.mark.parametrize("export_format", [ExportFormat.HTML, ExportFormat.PDF])
def test_cancel_stops_the_export_and_leaves_no_file(
    qtbot, window, tmp_path, monkeypatch, export_format
):
    add_chats(window, 4)
    out = tmp_path / "out"
    out.mkdir()
    save_to(monkeypatch, out / f"all{export_format.extension}")
    reached, release = gate_after_first_chat(monkeypatch)
    dialog = window.export_feature.open_dialog()
    dialog.scope_buttons[ExportScope.EVERYTHING].setChecked(True)
    dialog.format_buttons[export_format].setChecked(True)
    qtbot.mouseClick(dialog.export_button, Qt.LeftButton)
    assert reached.wait(10)
    # the GUI thread is free while the export runs: progress shows the first chat done (a PDF
    # counts chats as their pages are printed, after all are laid out: none yet)
    done = 1 if export_format == ExportFormat.HTML else 0
    # 4 chats: the window's first chat (empty) is left out
    qtbot.waitUntil(lambda: dialog.progress.maximum() == 4, timeout=WAIT_MS)
    qtbot.waitUntil(lambda: dialog.progress.value() == done, timeout=WAIT_MS)
    assert dialog.progress.text() == f"{done} of 4 chats"
    assert dialog.cancel_button.isVisible() and not dialog.export_button.isVisible()
    with qtbot.waitSignal(window.export_feature.runner.cancelled, timeout=WAIT_MS):
        qtbot.mouseClick(dialog.cancel_button, Qt.LeftButton)
        release.set()
    assert list(out.iterdir()) == []
    assert dialog.isVisible() and dialog.export_button.isVisible()
    assert dialog.progress_label.text() == "Export cancelled; nothing was written."
    assert window.state_label.text() == "Export cancelled; nothing was written."


def test_closing_the_dialog_while_exporting_cancels(qtbot, window, tmp_path, monkeypatch):
    add_chats(window, 3)
    save_to(monkeypatch, tmp_path / "all.html")
    reached, release = gate_after_first_chat(monkeypatch)
    dialog = window.export_feature.open_dialog()
    dialog.scope_buttons[ExportScope.EVERYTHING].setChecked(True)
    dialog.format_buttons[ExportFormat.HTML].setChecked(True)
    qtbot.mouseClick(dialog.export_button, Qt.LeftButton)
    assert reached.wait(10)
    with qtbot.waitSignal(window.export_feature.runner.cancelled, timeout=WAIT_MS):
        dialog.close()  # the title bar's close button (QDialog turns it into reject, as Esc)
        release.set()
    assert not (tmp_path / "all.html").exists()
    assert dialog.isVisible()  # it stays, showing that the export was cancelled


@pytest.mark.skipif(not Path("/sys/kernel").is_dir(), reason="needs Linux's read-only /sys")
def test_a_read_only_folder_is_named_in_the_error(qtbot, window, monkeypatch):
    folder = Path("/sys")  # refuses new files to everyone, root included (these tests run as root)
    save_to(monkeypatch, folder / "chat.zip")
    dialog = window.export_feature.open_dialog()
    with qtbot.waitSignal(window.export_feature.runner.failed, timeout=WAIT_MS):
        qtbot.mouseClick(dialog.export_button, Qt.LeftButton)
    assert window.errors == [
        (
            "Export failed",
            "Could not write /sys: the folder cannot be written to (no permission, or it is "
            "read-only).",
        )
    ]
    assert dialog.isVisible() and dialog.progress_label.text() == window.errors[0][1]
    assert window.state_label.text() == "Export failed; nothing was written"


def test_import_takes_a_zip_export_back_with_its_projects(qtbot, window, tmp_path, monkeypatch):
    ids = add_chats(window, 2, project="Garden")
    save_to(monkeypatch, tmp_path / "all.zip")
    window.session.open_conversation(ids[0])
    with qtbot.waitSignal(window.export_feature.runner.finished, timeout=WAIT_MS):
        window.export_feature.export_to(tmp_path / "all.zip", ExportScope.PROJECT, ExportFormat.ZIP)
    with zipfile.ZipFile(tmp_path / "all.zip") as z:
        assert sorted(z.namelist()) == sorted(
            ["manifest.json"] + [f"Garden/Chat {i}.{ext}" for i in (0, 1) for ext in ("md", "json")]
        )
    before = len(window.store.list_conversations())
    monkeypatch.setattr(
        QFileDialog, "getOpenFileName", lambda *a, **k: (str(tmp_path / "all.zip"), "")
    )
    window.ask_import()
    after = window.store.list_conversations()
    assert len(after) == before + 2 and window.errors == []
    opened = window.store.conversation(window.session.conversation_id)
    assert opened.title == "Chat 1"  # the archive's first chat (newest first, as exported)
    garden = [p for p in window.store.projects() if p.name == "Garden"]
    assert len(garden) == 1 and opened.project_id == garden[0].id
    assert [m.content for m in window.store.messages(opened.id)] == ["question 1", "answer 1"]
    assert window.state_label.text() == "Imported all.zip (2 chats)"


def test_a_hostile_zip_is_refused_in_the_window_and_nothing_added(qtbot, window, tmp_path):
    path = tmp_path / "evil.zip"
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("../../outside.json", "{}")
    before = len(window.store.list_conversations())
    assert window.import_from(str(path)) is None
    assert window.errors == [
        (
            "Could not import the chat",
            "evil.zip\n\nmember '../../outside.json' climbs out of the archive with \"..\"",
        )
    ]
    assert len(window.store.list_conversations()) == before
