"""Light / dark / system theme and font size, applied to the whole application."""

from __future__ import annotations

from PySide6.QtCore import Qt
from PySide6.QtGui import QColor, QFont, QPalette
from PySide6.QtWidgets import QApplication, QStyleFactory

from app.resources import resource


def _dark_palette() -> QPalette:
    p = QPalette()
    base, window, text = QColor(30, 32, 36), QColor(40, 43, 48), QColor(225, 228, 232)
    for role, color in (
        (QPalette.Window, window),
        (QPalette.WindowText, text),
        (QPalette.Base, base),
        (QPalette.AlternateBase, QColor(48, 52, 60)),
        (QPalette.Text, text),
        (QPalette.Button, window),
        (QPalette.ButtonText, text),
        (QPalette.ToolTipBase, base),
        (QPalette.ToolTipText, text),
        (QPalette.Highlight, QColor(47, 128, 237)),
        (QPalette.HighlightedText, QColor(255, 255, 255)),
        (QPalette.Link, QColor(120, 170, 255)),
        (QPalette.PlaceholderText, QColor(150, 155, 162)),
        (QPalette.Mid, QColor(70, 74, 80)),
        (QPalette.Midlight, QColor(60, 64, 70)),
    ):
        p.setColor(role, color)
    p.setColor(QPalette.Disabled, QPalette.Text, QColor(120, 120, 120))
    p.setColor(QPalette.Disabled, QPalette.ButtonText, QColor(120, 120, 120))
    return p


def wants_dark(theme: str) -> bool:
    if theme == "dark":
        return True
    if theme == "light":
        return False
    return QApplication.styleHints().colorScheme() == Qt.ColorScheme.Dark


def apply_theme(app: QApplication, theme: str, font_size: int) -> None:
    app.setStyle(QStyleFactory.create("Fusion"))
    app.setPalette(_dark_palette() if wants_dark(theme) else app.style().standardPalette())
    font = QFont(app.font())
    font.setPointSize(font_size)
    app.setFont(font)
    try:
        app.setStyleSheet(resource("styles/app.qss").read_text(encoding="utf-8"))
    except OSError:
        app.setStyleSheet("")  # the look degrades, the app still works
