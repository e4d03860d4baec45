"""The question a second LocalChat on the same data directory asks: show the open window, open
read-only, or quit."""

from __future__ import annotations

from pathlib import Path

from PySide6.QtWidgets import QMessageBox

SHOW_OTHER, READ_ONLY, QUIT = "show", "read-only", "quit"


def ask_about_running_instance(data_dir: Path) -> str:
    box = QMessageBox(
        QMessageBox.Warning,
        "LocalChat is already open",
        f"Another LocalChat window is using the chats in {data_dir}.\n\n"
        "Two windows writing the same chats would overwrite each other's replies. Show the "
        "open window, or open this one read-only (nothing you do here is saved)?",
    )
    show = box.addButton("Show the open window", QMessageBox.AcceptRole)
    read_only = box.addButton("Open read-only", QMessageBox.ActionRole)
    box.addButton("Quit", QMessageBox.RejectRole)
    box.setDefaultButton(show)
    box.exec()
    clicked = box.clickedButton()
    if clicked is show:
        return SHOW_OTHER
    if clicked is read_only:
        return READ_ONLY
    return QUIT
