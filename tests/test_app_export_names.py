"""Export file names: a chat title longer than the file system's 255-byte name limit must still
export (issue 17), cut on a character boundary with the extension kept."""

from pathlib import Path

from PySide6.QtWidgets import QFileDialog

from app.export import export_file_name, truncate_file_name
from tests.app_fakes import FakeEngine, close_window, make_window

LONG_ACCENTED_TITLE = "é" * 300  # 600 bytes in UTF-8


def test_suggested_name_fits_255_bytes_and_keeps_the_extension():
    name = export_file_name(LONG_ACCENTED_TITLE, ".json")
    assert len(name.encode("utf-8")) <= 255
    assert name.endswith(".json") and name[:-5] == "é" * len(name[:-5])
    # Four-byte characters are never split: the result always decodes.
    emoji = truncate_file_name("😀" * 100 + ".md", 255)
    assert emoji.endswith(".md") and len(emoji.encode("utf-8")) <= 255
    assert set(emoji[:-3]) == {"😀"}
    assert export_file_name("a/b\\c", ".md") == "a_b_c.md"
    assert export_file_name("short title") == "short title.md"


def test_chat_with_a_long_title_exports_through_the_dialog(qtbot, tmp_path, monkeypatch):
    window = make_window(qtbot, tmp_path, FakeEngine(replies=["ok"]))
    cid = window.session.ensure_conversation()
    window.session.rename_conversation(cid, LONG_ACCENTED_TITLE)
    suggested = []

    def fake_dialog(parent, caption, start, filters):
        # offered in a real folder (file_dialogs.start_folder), never the working directory
        assert Path(start).is_absolute() and Path(start).parent.is_dir()
        name = Path(start).name
        suggested.append(name)
        return str(tmp_path / "exports" / name), filters

    monkeypatch.setattr(QFileDialog, "getSaveFileName", fake_dialog)
    (tmp_path / "exports").mkdir()
    window.ask_export()
    written = list((tmp_path / "exports").glob("*.md"))
    assert len(written) == 1 and written[0].name == suggested[0]
    assert written[0].read_text(encoding="utf-8").startswith("# " + LONG_ACCENTED_TITLE)
    close_window(window)


def test_export_to_a_too_long_path_name_is_truncated(qtbot, tmp_path):
    window = make_window(qtbot, tmp_path, FakeEngine(replies=["ok"]))
    out = tmp_path / "exports"
    out.mkdir()
    window.export_to(str(out / ("x" * 400 + ".json")))
    written = list(out.glob("*.json"))
    assert len(written) == 1 and len(written[0].name) == 255
    close_window(window)
