"""packaging/qt_trim.py drops what the app never loads and keeps what it needs."""

import importlib.util
from pathlib import Path

import pytest

QT_TRIM_FILE = Path(__file__).resolve().parent.parent / "packaging" / "qt_trim.py"
_spec = importlib.util.spec_from_file_location("qt_trim", QT_TRIM_FILE)
qt_trim = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(qt_trim)

QT = "PySide6/Qt"


@pytest.mark.parametrize(
    "path",
    [
        f"{QT}/plugins/platforms/libqxcb.so",  # X11 desktops
        f"{QT}/plugins/platforms/libqwayland.so",  # Wayland desktops
        f"{QT}/plugins/platforms/libqoffscreen.so",  # headless CI / --smoke
        f"{QT}/plugins/imageformats/libqsvg.so",  # the SVG icon
        f"{QT}/plugins/iconengines/libqsvgicon.so",
        f"{QT}/plugins/platformthemes/libqxdgdesktopportal.so",
        f"{QT}/plugins/platforminputcontexts/libibusplatforminputcontextplugin.so",
        f"{QT}/lib/libQt6Widgets.so.6",
        f"{QT}/lib/libQt6Svg.so.6",
        f"{QT}/lib/libQt6XcbQpa.so.6",
        f"{QT}/translations/qtbase_de.qm",
        "llvmlite/binding/libllvmlite.so",
    ],
)
def test_needed_files_are_kept(path):
    assert not qt_trim.is_trimmed_path(path)


@pytest.mark.parametrize(
    "path",
    [
        f"{QT}/plugins/platforms/libqeglfs.so",
        f"{QT}/plugins/platforms/libqvnc.so",
        f"{QT}/plugins/imageformats/libqpdf.so",
        f"{QT}/lib/libQt6Pdf.so.6",
        f"{QT}/lib/libQt6Quick.so.6",
        f"{QT}/lib/libQt6QmlModels.so.6",
        f"{QT}/lib/libQt6Network.so.6",
        f"{QT}/plugins/tls/libqopensslbackend.so",
        f"{QT}/plugins/platformthemes/libqgtk3.so",
        f"{QT}/translations/qt_help_de.qm",
    ],
)
def test_unused_files_are_trimmed(path):
    assert qt_trim.is_trimmed_path(path)


def test_top_level_symlink_follows_its_target():
    # PyInstaller's top-level links to libraries, as (dest_name, relative target, "SYMLINK").
    assert qt_trim.is_trimmed_entry("libQt6Network.so.6", f"{QT}/lib/libQt6Network.so.6", "SYMLINK")
    assert not qt_trim.is_trimmed_entry("libQt6Gui.so.6", f"{QT}/lib/libQt6Gui.so.6", "SYMLINK")
    # A non-link entry is judged by where it lands, not by where it comes from.
    assert not qt_trim.is_trimmed_entry(
        "libfoo.so", f"/somewhere/{QT}/lib/libQt6Pdf.so.6", "BINARY"
    )
