"""The file dialogs' shared start: where a dialog opens and what the user picked.

A dialog given no folder opens in the process's working directory, which for a double-clicked
app is "/" or the bundle's own folder. These open where the user last picked something in this
session, else in their Documents folder, else their home."""

from __future__ import annotations

from pathlib import Path

from PySide6.QtCore import QStandardPaths
from PySide6.QtWidgets import QFileDialog, QWidget

_last_folder: str | None = None


def start_folder() -> str:
    if _last_folder is not None and Path(_last_folder).is_dir():
        return _last_folder
    documents = QStandardPaths.writableLocation(QStandardPaths.StandardLocation.DocumentsLocation)
    if documents and Path(documents).is_dir():
        return documents
    return str(Path.home())


def remember(path: str) -> None:
    """The next dialog opens where `path` (a file or a folder the user picked) is."""
    global _last_folder
    if path:
        chosen = Path(path)
        _last_folder = str(chosen if chosen.is_dir() else chosen.parent)


def open_files(parent: QWidget, title: str, file_filter: str = "") -> list[str]:
    paths, _ = QFileDialog.getOpenFileNames(parent, title, start_folder(), file_filter)
    if paths:
        remember(paths[0])
    return paths


def open_file(parent: QWidget, title: str, file_filter: str = "", folder: str = "") -> str:
    """`folder`: where to open instead of the shared start (e.g. beside the loaded model)."""
    path, _ = QFileDialog.getOpenFileName(parent, title, folder or start_folder(), file_filter)
    remember(path)
    return path


def open_folder(parent: QWidget, title: str) -> str:
    path = QFileDialog.getExistingDirectory(parent, title, start_folder())
    remember(path)
    return path


def save_file(parent: QWidget, title: str, name: str, file_filter: str = "") -> str:
    """`name`: the suggested file name, offered in the start folder."""
    path, _ = QFileDialog.getSaveFileName(
        parent, title, str(Path(start_folder()) / name), file_filter
    )
    remember(path)
    return path
