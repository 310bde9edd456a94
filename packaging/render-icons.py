"""Render resources/icons/hicolor/<size>/apps/*.png from the scalable SVG (run after editing it).

Usage: python packaging/render-icons.py
"""
from pathlib import Path

from PySide6.QtCore import Qt
from PySide6.QtGui import QGuiApplication, QImage, QPainter
from PySide6.QtSvg import QSvgRenderer

SIZES = (16, 24, 32, 48, 64, 128, 256, 512)
ICONS = Path(__file__).resolve().parent.parent / "resources" / "icons" / "hicolor"


def main() -> None:
    app = QGuiApplication([])  # noqa: F841 - QPainter on images needs a GUI application
    for svg in (ICONS / "scalable" / "apps").glob("*.svg"):
        renderer = QSvgRenderer(str(svg))
        for size in SIZES:
            image = QImage(size, size, QImage.Format.Format_ARGB32_Premultiplied)
            image.fill(Qt.GlobalColor.transparent)
            painter = QPainter(image)
            painter.setRenderHint(QPainter.RenderHint.Antialiasing)
            renderer.render(painter)
            painter.end()
            out = ICONS / f"{size}x{size}" / "apps" / f"{svg.stem}.png"
            out.parent.mkdir(parents=True, exist_ok=True)
            image.save(str(out))
            print(out)


if __name__ == "__main__":
    main()
