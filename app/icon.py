"""The app icon: resources/icon.svg, rendered to PNGs with QSvgRenderer.

`python -m app.icon` regenerates resources/icon.png (256 px) from the SVG; at runtime the icon is
built from the SVG at several sizes so it is sharp in the title bar and the task switcher, and
falls back to the PNG if the SVG cannot be read."""

from __future__ import annotations

from PySide6.QtCore import Qt
from PySide6.QtGui import QGuiApplication, QIcon, QImage, QPainter, QPixmap
from PySide6.QtSvg import QSvgRenderer

from app.resources import resource

ICON_SIZES = (16, 24, 32, 48, 64, 128, 256)


def render_icon(size: int) -> QImage:
    renderer = QSvgRenderer(str(resource("icon.svg")))
    image = QImage(size, size, QImage.Format_ARGB32_Premultiplied)
    image.fill(Qt.transparent)
    if renderer.isValid():
        painter = QPainter(image)
        painter.setRenderHint(QPainter.Antialiasing)
        renderer.render(painter)
        painter.end()
    return image


def app_icon() -> QIcon:
    icon = QIcon()
    for size in ICON_SIZES:
        image = render_icon(size)
        if not image.isNull() and image.pixel(size // 2, size // 2) != 0:
            icon.addPixmap(QPixmap.fromImage(image))
    if icon.isNull():
        icon = QIcon(str(resource("icon.png")))
    return icon


def main() -> None:
    app = QGuiApplication.instance() or QGuiApplication([])  # noqa: F841 - QPainter needs it
    path = resource("icon.png")
    if not render_icon(256).save(str(path)):
        raise SystemExit(f"could not write {path}")
    print(path)


if __name__ == "__main__":
    main()
