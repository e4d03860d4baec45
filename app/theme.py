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


# Banner colours per kind: (background, text, border) for a light and for a dark window. Each
# pair has a contrast ratio of at least 7:1 (WCAG AAA for normal text).
BANNER_COLORS = {
    "light": {
        "warning": ("#fff4d6", "#3d2c00", "#e0c470"),
        "error": ("#fde2e1", "#5c0b0b", "#e6a19c"),
        "info": ("#e4f0fb", "#0d2a45", "#9cc3e6"),
    },
    "dark": {
        "warning": ("#3d3113", "#ffe8a8", "#8a6d1f"),
        "error": ("#4a1c1c", "#ffd6d3", "#9b3b35"),
        "info": ("#16324d", "#d6ebff", "#3b6e9e"),
    },
}


def is_dark(palette: QPalette) -> bool:
    """Whether a palette is a dark one (light text on a dark window)."""
    return palette.color(QPalette.Window).lightness() < 128


def banner_colors(palette: QPalette, kind: str) -> tuple[str, str, str]:
    """(background, text, border) of a notice banner of `kind` under `palette`."""
    colors = BANNER_COLORS["dark" if is_dark(palette) else "light"]
    return colors.get(kind, colors["warning"])


# Coloured text (a reply's status, a JSON check): darker shades on a light window, lighter ones on
# a dark window, each at least 4.5:1 against the message background (WCAG AA).
TEXT_COLORS = {
    "light": {"good": "#2e7d4f", "bad": "#b03021", "warn": "#a35400"},
    "dark": {"good": "#6fd19b", "bad": "#ff8a80", "warn": "#f0a35e"},
}
DARK_STYLE = "QLabel#status {{ color: {warn}; }}\n"
# Fusion draws a checkbox's box in the window colour darkened: on the dark window an unchecked
# box was all but invisible (1.2:1), on the light one faint (1.7:1). Both themes get a border
# of at least 3:1 against the window (WCAG 2.1 1.4.11, a control's edge), and a ticked box the
# accent colour with a white check mark. The size follows the font.
INDICATOR_STYLE = """
QCheckBox::indicator, QGroupBox::indicator, QAbstractItemView::indicator {{
    width: 0.8em; height: 0.8em;
    border: 1px solid {border}; border-radius: 2px; background: palette(base);
}}
QCheckBox::indicator:checked, QGroupBox::indicator:checked,
QAbstractItemView::indicator:checked {{
    background: palette(highlight); border-color: palette(highlight); image: url({check});
}}
QCheckBox::indicator:indeterminate, QAbstractItemView::indicator:indeterminate {{
    background: palette(mid); border-color: palette(highlight);
}}
QCheckBox::indicator:disabled, QAbstractItemView::indicator:disabled {{ border-color: {off}; }}
"""
# (border, disabled border): 4.0:1 on the light window, 5.6:1 on the dark one
INDICATOR_BORDERS = {"light": ("#767676", "#b4b4b4"), "dark": ("#a0a6ae", "#6b7078")}


def text_color(palette: QPalette, meaning: str) -> str:
    """The colour of "good", "bad" or "warn" text under `palette`."""
    return TEXT_COLORS["dark" if is_dark(palette) else "light"][meaning]


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
        style = resource("styles/app.qss").read_text(encoding="utf-8")
    except OSError:
        style = ""  # the look degrades, the app still works
    if wants_dark(theme):  # app.qss holds the light theme's text colours
        style += DARK_STYLE.format(**TEXT_COLORS["dark"])
    border, off = INDICATOR_BORDERS["dark" if wants_dark(theme) else "light"]
    check = resource("styles/check.svg").as_posix()
    style += INDICATOR_STYLE.format(border=border, off=off, check=check)
    app.setStyleSheet(style)
