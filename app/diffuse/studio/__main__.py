"""`diffuse-studio [FILE]` / `python -m diffuse.studio [FILE]`: start Diffuse Studio.

FILE may be a .gguf model (loaded at start) or a recorded run (.npz, replayed).
"""
from __future__ import annotations

import argparse
import sys


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="diffuse-studio", description=__doc__.splitlines()[0])
    parser.add_argument("file", nargs="?", help="a .gguf model to load or a recorded run (.npz)")
    args = parser.parse_args(argv)

    from PySide6.QtWidgets import QApplication

    from diffuse.studio import theme
    from diffuse.studio.main_window import MainWindow

    app = QApplication.instance() or QApplication(sys.argv[:1])
    app.setApplicationName("Diffuse Studio")
    app.setOrganizationName("diffuse")
    theme.apply(app)
    window = MainWindow()
    window.show()
    if args.file is None:
        window.restore_session()
    elif args.file.endswith(".npz"):
        window.open_recording(args.file)
    else:
        window.model_panel.load(args.file)
    return app.exec()


if __name__ == "__main__":
    sys.exit(main())
