"""Render resources/icons/diffuse.svg to a PNG (the bundles' icon; PyInstaller converts it to
.ico/.icns on Windows/macOS). Usage: python make_icon.py OUT.png [SIZE]"""
import os
import sys
from pathlib import Path

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

from PySide6.QtCore import Qt  # noqa: E402
from PySide6.QtGui import QGuiApplication, QImage, QPainter  # noqa: E402
from PySide6.QtSvg import QSvgRenderer  # noqa: E402

SVG = Path(__file__).resolve().parents[1] / "resources" / "icons" / "diffuse.svg"


def main() -> int:
    out, size = Path(sys.argv[1]), int(sys.argv[2]) if len(sys.argv) > 2 else 512
    app = QGuiApplication(sys.argv[:1])  # noqa: F841 (Qt needs one for painting)
    image = QImage(size, size, QImage.Format.Format_ARGB32)
    image.fill(Qt.GlobalColor.transparent)
    painter = QPainter(image)
    QSvgRenderer(str(SVG)).render(painter)
    painter.end()
    out.parent.mkdir(parents=True, exist_ok=True)
    return 0 if image.save(str(out)) else 1


if __name__ == "__main__":
    sys.exit(main())
