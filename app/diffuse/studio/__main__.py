"""`diffuse-studio [FILE]` / `python -m diffuse.studio [FILE]`: start Diffuse Studio.

FILE may be a .gguf model (loaded at start) or a recorded run (.npz, replayed).
"""
from __future__ import annotations

import argparse
import logging
import signal
import sys


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="diffuse-studio",
        description="Diffuse Studio: watch a diffusion language model denoise, step by step.")
    parser.add_argument("file", nargs="?", help="a .gguf model to load or a recorded run (.npz)")
    args = parser.parse_args(argv)

    import shiboken6
    from PySide6.QtCore import QTimer
    from PySide6.QtWidgets import QApplication

    from diffuse.studio import storage, theme
    from diffuse.studio.main_window import MainWindow

    # The app says what goes wrong in its own window; huggingface_hub's warnings about a dropped
    # connection it retries ("Trying to resume download...") would only clutter the terminal.
    logging.getLogger("huggingface_hub").setLevel(logging.ERROR)
    app = QApplication.instance() or QApplication(sys.argv[:1])
    app.setApplicationName("Diffuse Studio")
    app.setOrganizationName("diffuse")
    theme.apply(app)
    storage.sweep_stale_parts()
    window = MainWindow()
    window.show()
    app.aboutToQuit.connect(window.close)      # quitting from outside still stops the engine
    # Ctrl+C in the terminal quits; the idle timer lets Python see the signal while Qt runs.
    signal.signal(signal.SIGINT, lambda *_: app.quit())
    wake = QTimer()
    wake.start(250)
    wake.timeout.connect(lambda: None)
    if args.file is None:
        window.restore_session()
    elif args.file.endswith(".npz"):
        # A recording that cannot be opened is reported; the app starts as it usually does.
        if not window.open_recording(args.file):
            window.restore_session()
    else:
        window.model_panel.load(args.file)
    code = app.exec()
    # Delete the window now, while Python is whole: left to the app's teardown at exit, its
    # plots' Python overrides run during interpreter shutdown, which crashes it now and then.
    shiboken6.delete(window)
    return code


if __name__ == "__main__":
    sys.exit(main())
