"""The Library dialog over real GGUF files: listing off the GUI thread, filter, broken and
unsupported rows, opening the chosen model through the window's load path, saved folders."""

from __future__ import annotations

import shutil
import threading
from pathlib import Path

import pytest
from PySide6.QtCore import Qt

from app.library.scan import ModelFolder
from app.library.scan_runner import LibraryScanRunner
from app.views.library_dialog import LibraryDialog
from tests.app_fakes import WAIT_MS, FakeEngine, close_window, make_window

FIXTURES = Path(__file__).parent / "fixtures"


@pytest.fixture
def models(tmp_path):
    folder = tmp_path / "models"
    folder.mkdir()
    for name in ("tiny_llama", "tiny_qwen3", "tiny_gemma3"):
        shutil.copy(FIXTURES / f"{name}.gguf", folder / f"{name}.gguf")
    (folder / "broken.gguf").write_bytes(b"GGUF" + b"\xff" * 60)
    return folder


def test_unsupported_file_shows_why_and_cannot_be_opened(qtbot, tmp_path):
    data = (FIXTURES / "tiny_llama.gguf").read_bytes()
    (tmp_path / "mamba.gguf").write_bytes(data.replace(b"llama", b"mamba", 1))
    dialog = make_dialog(qtbot, [tmp_path])
    scanned(qtbot, dialog)
    dialog.select_path(str(tmp_path / "mamba.gguf"))
    assert dialog.table.item(0, 7).text() == "no"
    assert "cannot run it" in dialog.detail.text() and "mamba" in dialog.detail.text()
    assert not dialog.open_button.isEnabled()
    with qtbot.assertNotEmitted(dialog.openRequested):
        dialog.open_selected()


def scanned(qtbot, dialog):
    # Not waitSignal: the scan thread may have emitted before a waiter could connect.
    qtbot.waitUntil(lambda: dialog.rescan_button.isEnabled(), timeout=WAIT_MS)


def make_dialog(qtbot, folders):
    runner = LibraryScanRunner(known=[])
    dialog = LibraryDialog(runner, [str(f) for f in folders])
    qtbot.addWidget(dialog)
    return dialog


def test_lists_files_off_the_gui_thread_with_errors(qtbot, models, monkeypatch):
    threads = []
    import app.library.scan as scan

    real = scan.summarize_model_file

    def spy(path, **kw):
        threads.append(threading.current_thread() is threading.main_thread())
        return real(path, **kw)

    monkeypatch.setattr(scan, "summarize_model_file", spy)
    dialog = make_dialog(qtbot, [models])
    scanned(qtbot, dialog)
    assert dialog.table.rowCount() == 4
    assert threads and not any(threads)  # every header was read on the scan thread
    rows = {dialog.table.item(r, 0).text(): r for r in range(4)}
    assert set(rows) == {"tiny_llama.gguf", "tiny_qwen3.gguf", "tiny_gemma3.gguf", "broken.gguf"}
    assert dialog.table.item(rows["broken.gguf"], 7).text() == "unreadable"
    assert dialog.table.item(rows["tiny_qwen3.gguf"], 1).text() == "qwen3"
    assert dialog.table.item(rows["tiny_qwen3.gguf"], 7).text() == "yes"
    assert "4 GGUF files" in dialog.status.text() and "1 unreadable" in dialog.status.text()
    dialog.select_path(str(models / "broken.gguf"))
    assert not dialog.open_button.isEnabled()
    assert "Cannot be read" in dialog.detail.text()


def test_filter_and_open(qtbot, models):
    dialog = make_dialog(qtbot, [models])
    scanned(qtbot, dialog)
    dialog.filter_edit.setText("qwen")
    assert dialog.visible_paths() == [str(models / "tiny_qwen3.gguf")]
    dialog.filter_edit.setText("llama Q")  # all words must match: name and quant
    assert dialog.visible_paths() == [str(models / "tiny_llama.gguf")]
    dialog.select_path(str(models / "tiny_llama.gguf"))
    assert dialog.open_button.isEnabled()
    with qtbot.waitSignal(dialog.openRequested, timeout=WAIT_MS) as blocker:
        qtbot.mouseClick(dialog.open_button, Qt.LeftButton)
    assert blocker.args == [str(models / "tiny_llama.gguf")]


def test_window_menu_opens_library_and_loads_the_choice(qtbot, tmp_path, models, monkeypatch):
    hf = tmp_path / "hf"
    monkeypatch.setattr(
        "app.library.scan_runner.known_model_folders",
        lambda: [ModelFolder(hf, "Hugging Face cache")],
    )
    data = tmp_path / "data"
    data.mkdir()
    window = make_window(qtbot, data, FakeEngine())
    try:
        assert window.library_action.shortcut().toString() == "Ctrl+Shift+O"
        window.library_action.trigger()
        dialog = window.library_dialog
        assert dialog is not None and dialog.isVisible()
        dialog.add_folder(str(models))  # saved in the settings, then rescanned
        assert window.settings_file.load().library_folders == [str(models)]
        qtbot.waitUntil(lambda: dialog.table.rowCount() == 4, timeout=WAIT_MS)
        dialog.select_path(str(models / "tiny_gemma3.gguf"))
        with qtbot.waitSignal(window.controller.modelLoaded, timeout=WAIT_MS) as blocker:
            dialog.open_selected()
        assert blocker.args[0].path == str(models / "tiny_gemma3.gguf")
        # Accepting deletes it; opening again makes a new one, and again brings that one back.
        qtbot.waitUntil(lambda: window.library_dialog is None, timeout=WAIT_MS)
        window.library_action.trigger()
        again = window.library_dialog
        assert again is not None and window.open_library() is again
        again.close()
    finally:
        window._library_runner.wait()
        close_window(window)


# --- the Download tab, against the loopback Hub mirror ------------------------------------------
@pytest.fixture
def hub_mirror():
    from tests.hub_mirror import HubMirror

    with HubMirror() as hub:
        hub.state.repos["tiny-org/Tiny-Qwen3-GGUF"] = {
            "tiny-qwen3-Q8_0.gguf": (FIXTURES / "tiny_qwen3.gguf").read_bytes()
        }
        yield hub


def test_download_tab_searches_downloads_and_lists_the_file(qtbot, tmp_path, hub_mirror):
    from app.library.download_runner import DownloadRunner
    from app.library.hub import HubClient
    from app.library.scan import FolderKind
    from app.views.download_panel import DownloadPanel

    cache = tmp_path / "hub"
    env = {"HF_ENDPOINT": hub_mirror.url, "HF_HUB_CACHE": str(cache)}
    runner = DownloadRunner(client_factory=lambda: HubClient(env=env))
    panel = DownloadPanel(runner)
    scan = LibraryScanRunner(known=[ModelFolder(cache, "Hugging Face cache", FolderKind.HF_CACHE)])
    dialog = LibraryDialog(scan, [], panel)
    qtbot.addWidget(dialog)
    assert hub_mirror.url in panel.status.text()
    panel.query.setText("qwen3")
    with qtbot.waitSignal(runner.searched, timeout=WAIT_MS):
        panel.search()
    assert panel.repos.count() == 1
    with qtbot.waitSignal(runner.listed, timeout=WAIT_MS):
        panel.repos.setCurrentRow(0)
    assert panel.table.item(0, 0).text() == "tiny-qwen3-Q8_0.gguf"
    assert panel.table.item(0, 1).text() == "Q8_0" and panel.table.item(0, 3).text() == ""
    panel.select_file("tiny-qwen3-Q8_0.gguf")
    with (
        qtbot.waitSignal(dialog.runner.finished, timeout=WAIT_MS),  # the rescan after download
        qtbot.waitSignal(runner.downloaded, timeout=WAIT_MS) as done,
    ):
        qtbot.mouseClick(panel.download_button, Qt.LeftButton)
    path = done.args[0]
    assert "Downloaded and verified" in panel.status.text()
    qtbot.waitUntil(lambda: dialog.selected_summary() is not None, timeout=WAIT_MS)
    chosen = dialog.selected_summary()
    assert chosen.path == path and chosen.supported and chosen.architecture == "qwen3"
    assert dialog.tabs.currentIndex() == 0
    qtbot.waitUntil(
        lambda: panel.table.item(0, 3) is not None and panel.table.item(0, 3).text() == "yes",
        timeout=WAIT_MS,
    )
    runner.wait()
    scan.wait()


def test_download_tab_reports_a_damaged_download(qtbot, tmp_path, hub_mirror):
    from app.library.download_runner import DownloadRunner
    from app.library.hub import HubClient
    from app.views.download_panel import DownloadPanel

    hub_mirror.state.corrupt = True
    env = {"HF_ENDPOINT": hub_mirror.url, "HF_HUB_CACHE": str(tmp_path)}
    runner = DownloadRunner(client_factory=lambda: HubClient(env=env))
    panel = DownloadPanel(runner)
    qtbot.addWidget(panel)
    with qtbot.waitSignal(runner.searched, timeout=WAIT_MS):
        panel.search()
    with qtbot.waitSignal(runner.listed, timeout=WAIT_MS):
        panel.repos.setCurrentRow(0)
    panel.select_file("tiny-qwen3-Q8_0.gguf")
    with qtbot.waitSignal(runner.failed, timeout=WAIT_MS):
        panel.download_selected()
    assert "arrived damaged" in panel.status.text() and not panel.progress.isVisible()
    qtbot.waitUntil(lambda: panel.download_button.isEnabled(), timeout=WAIT_MS)
    runner.wait()


def test_download_tab_says_when_the_hub_is_unreachable(qtbot, tmp_path):
    import socket

    from app.library.download_runner import DownloadRunner
    from app.library.hub import HubClient
    from app.views.download_panel import DownloadPanel

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {"HF_ENDPOINT": f"http://127.0.0.1:{port}", "HF_HUB_CACHE": str(tmp_path)}
    runner = DownloadRunner(client_factory=lambda: HubClient(env=env))
    panel = DownloadPanel(runner)
    qtbot.addWidget(panel)
    with qtbot.waitSignal(runner.failed, timeout=WAIT_MS):
        panel.search()
    assert "Cannot reach" in panel.status.text() and panel.search_button.isEnabled()
    runner.wait()
