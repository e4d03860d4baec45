"""Where the file dialogs open: a double-clicked app's working directory is "/" or the bundle's
folder, so a dialog given no folder opened there. They open in the folder the user last picked
something in this session, else Documents, else home."""

import os
from pathlib import Path

import pytest
from PySide6.QtWidgets import QFileDialog, QWidget

from app.views import file_dialogs


@pytest.fixture
def dialogs(monkeypatch, tmp_path):
    monkeypatch.setattr(file_dialogs, "_last_folder", None)
    monkeypatch.chdir("/")  # as a launcher starts the app
    asked: list[str] = []
    picked: dict[str, object] = {}

    def remember_start(result):
        def fake(parent, title, start, *rest):
            asked.append(start)
            return result()

        return fake

    monkeypatch.setattr(
        QFileDialog, "getOpenFileNames", remember_start(lambda: (picked["files"], ""))
    )
    monkeypatch.setattr(QFileDialog, "getExistingDirectory", remember_start(lambda: picked["dir"]))
    monkeypatch.setattr(
        QFileDialog, "getSaveFileName", remember_start(lambda: (picked["save"], ""))
    )
    return asked, picked


def test_the_first_dialog_opens_in_documents_or_home_never_the_working_directory(qtbot, dialogs):
    asked, picked = dialogs
    parent = QWidget()
    qtbot.addWidget(parent)
    picked["dir"] = ""
    file_dialogs.open_folder(parent, "Attach a folder")
    assert asked[0] != os.getcwd()
    assert Path(asked[0]).is_dir() and Path(asked[0]).is_relative_to(Path.home())


def test_the_next_dialog_opens_where_the_user_last_picked(qtbot, dialogs, tmp_path):
    asked, picked = dialogs
    parent = QWidget()
    qtbot.addWidget(parent)
    (tmp_path / "papers").mkdir()
    (tmp_path / "papers" / "a.pdf").write_bytes(b"%PDF-1.4")
    picked["files"] = [str(tmp_path / "papers" / "a.pdf")]
    file_dialogs.open_files(parent, "Attach files")
    picked["save"] = ""
    file_dialogs.save_file(parent, "Export", "chat.html")
    assert asked[1] == str(tmp_path / "papers" / "chat.html")  # the folder of the file picked
    picked["dir"] = str(tmp_path)
    file_dialogs.open_folder(parent, "Attach a folder")
    picked["files"] = []
    file_dialogs.open_files(parent, "Attach files")
    assert asked[3] == str(tmp_path)  # a picked folder is itself the next start
