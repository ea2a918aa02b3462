"""Regenerate the README screenshots from the running app, with the bundled demo model
(models/diffuse-demo-3m.gguf) generating for real.

    python docs/screenshots/make_screenshots.py            # offscreen
    Xvfb :99 & DISPLAY=:99 QT_QPA_PLATFORM=xcb python docs/screenshots/make_screenshots.py

1. main-window.png: the demo model has answered a prompt in the chat; the views show its run
   part-way (canvas, entropy heatmap).
2. cache-view.png: the cache view of the same run at its last step.
3. compare.png: compare mode, inter-step cache on vs off, both runs by the engine.
"""
from __future__ import annotations

import os
import sys
import tempfile
import time
from pathlib import Path

OUT = Path(__file__).resolve().parent
os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
os.environ["DIFFUSE_STUDIO_HOME"] = tempfile.mkdtemp(prefix="studio-shots-")

from PySide6.QtCore import QEventLoop  # noqa: E402
from PySide6.QtWidgets import QApplication  # noqa: E402

PROMPT = "Tell me about Mr. Darcy."


def settle(app, seconds=0.3, until=lambda: False):
    end = time.monotonic() + seconds
    while time.monotonic() < end and not until():
        app.processEvents(QEventLoop.ProcessEventsFlag.AllEvents, 20)


def save(widget, name, scale=0.8):
    image = widget.grab().toImage()
    image = image.scaledToWidth(int(image.width() * scale))
    image.save(str(OUT / name))
    print(OUT / name, image.width(), image.height())


def main() -> int:
    from diffuse.studio import storage, theme
    from diffuse.studio.main_window import MainWindow

    app = QApplication.instance() or QApplication([])
    theme.apply(app)
    window = MainWindow()
    window.resize(1500, 900)
    window.show()
    window.model_panel.load(storage.demo_model())
    settle(app, 60, until=lambda: window.engine.model is not None)
    if window.engine.model is None:
        print("the demo model did not load", file=sys.stderr)
        return 1
    window.settings_panel.set_options({"threads": 1, "seed": 4})     # the model's recipe for the rest
    window.side_tabs.setCurrentIndex(1)

    finished = []
    window.engine.run_finished.connect(finished.append)
    window.chat.prompt.setPlainText(PROMPT)
    window.chat.submit()
    settle(app, 60, until=lambda: bool(finished))
    run = finished[0]
    window.timeline.stop()                   # no replay: hold the step chosen below
    window.show_step(run.n_steps // 2)
    settle(app, 0.8)
    save(window, "main-window.png")
    window.views.setCurrentIndex(1)
    window.show_step(run.n_steps - 1)
    settle(app, 0.6)
    save(window.views, "cache-view.png", 1.0)

    window.open_compare()
    cmp = window.compare_window
    cmp.resize(1400, 760)
    cmp.prompt.setText(PROMPT)
    cmp.start()
    settle(app, 120, until=lambda: cmp.summary.text().startswith("A:"))
    settle(app, 0.5)
    save(cmp, "compare.png")
    cmp.close()
    window.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
