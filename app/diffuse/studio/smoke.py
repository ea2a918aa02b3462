"""`python -m diffuse.studio.smoke OUT.png [MODEL]` (in a bundle: `diffuse-studio --smoke-test
OUT.png`): start Diffuse Studio headless, load a model (default: the demo model in models/),
generate one answer, save a screenshot of the window (OUT) and of the first-run dialog
(OUT-first-run.png), and serve one request through the Serve tab.

Prints one JSON line of seconds since the process started: `window_s` (main window shown and
rendered), `model_s` (model loaded), `first_step_s` (first denoising step drawn), `done_s`; plus
the answer's text and step count, the real models the dialog lists, what it says about the
hub, and the served answer. Exit status 0 when all of that happened, 1 otherwise. App settings go to a temporary
folder, so the user's are never touched.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

PROMPT = "Tell me about Mr. Darcy."
TIMEOUT_S = 300


def since_start() -> float:
    import psutil
    return time.time() - psutil.Process().create_time()


def demo_model() -> Path:
    from diffuse import DiffuseError, catalog
    from diffuse.studio import storage
    found = storage.demo_model()
    if found is None:
        raise DiffuseError(f"no demo model (*.gguf) in {catalog.shipped_models_dir() or 'models/'}")
    return found


def run(out: Path, model: Path | None) -> dict:
    from PySide6.QtCore import QEventLoop, QObject, QTimer
    from PySide6.QtWidgets import QApplication

    from diffuse import DiffuseError
    from diffuse.studio import first_run, theme
    from diffuse.studio.main_window import MainWindow

    class Waiter(QObject):
        """Quits a local event loop when a signal arrives (a GUI-thread object, so signals
        from worker threads are queued to it)."""

        def __init__(self):
            super().__init__()
            self.loop = QEventLoop()
            self.timer = QTimer()
            self.timer.setSingleShot(True)
            self.timer.timeout.connect(self.loop.quit)
            self.args = None

        def hit(self, *args) -> None:
            self.args = args
            self.loop.quit()

        def wait(self, what: str, signal, failures=(), timeout_s: float = TIMEOUT_S):
            self.args = None
            signal.connect(self.hit)
            for f in failures:
                f.connect(self.hit)
            self.timer.start(int(timeout_s * 1000))
            self.loop.exec()
            self.timer.stop()
            signal.disconnect(self.hit)
            for f in failures:
                f.disconnect(self.hit)
            if self.args is None:
                raise DiffuseError(f"smoke test: no {what} within {timeout_s:.0f} s")
            if any(isinstance(a, str) for a in self.args):
                raise DiffuseError(f"smoke test: {what} failed: {self.args[-1]}")
            return self.args

    times = {}
    app = QApplication.instance() or QApplication(sys.argv[:1])
    app.setApplicationName("Diffuse Studio")
    theme.apply(app)
    window = MainWindow()
    window.show()
    app.processEvents()
    window.grab()                      # renders every widget once
    times["window_s"] = since_start()

    waiter = Waiter()
    panel = window.model_panel
    if not panel.load(model or demo_model()):
        raise DiffuseError(f"smoke test: the model was refused: {panel.message.text()}")
    waiter.wait("model", panel.model_loaded, [panel.refused])
    times["model_s"] = since_start()

    window.generate(PROMPT)
    if window.live is None:
        raise DiffuseError("smoke test: generation did not start")
    waiter.wait("first step", window.engine.run_stepped, [window.engine.run_failed])
    window.refresh()                   # draw it now rather than on the next timer tick
    times["first_step_s"] = since_start()
    run_state = window.live
    waiter.wait("finished run", window.engine.run_finished, [window.engine.run_failed])
    times["done_s"] = since_start()
    window.timeline.stop()             # the newest step, not the automatic replay's first
    window._mark_dirty()
    for _ in range(2):                 # the refresh timer draws canvas and views in turns
        window.refresh()
    app.processEvents()                # the plots lay themselves out
    if not window.grab().save(str(out)):
        raise DiffuseError(f"{out}: could not save the screenshot")
    result, used = run_state.result, window.engine.model.path
    served = serve_once(window.serve_panel)

    # The first-run dialog: the catalog and the hub client are part of the installation.
    dialog = first_run.open_for(window)
    deadline = time.monotonic() + 30
    while dialog.check is not None and time.monotonic() < deadline:
        app.processEvents(QEventLoop.ProcessEventsFlag.AllEvents, 50)
    dialog.grab().save(str(out.with_name(out.stem + "-first-run.png")))
    real_models = [c.model["name"] for c in dialog.cards]
    hub_state = dialog.online_label.text()
    dialog.shutdown()
    window.close()
    return dict(times, model=str(used), steps=result.steps, text=result.text,
                screenshot=str(out), real_models=real_models, hub=hub_state, served=served)


def serve_once(panel) -> str:
    """Switch on the Serve tab (on a free port), ask it for one completion, switch it off: the
    server's modules (uvicorn loads some by name) are part of the installation."""
    import urllib.request

    from diffuse import DiffuseError
    panel.port.setValue(0)
    if not panel.start():
        raise DiffuseError(f"smoke test: serving failed: {panel.status.text()}")
    try:
        body = json.dumps({"prompt": PROMPT, "max_tokens": 16}).encode()
        request = urllib.request.Request(panel.server.url + "/completions", data=body,
                                         headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=TIMEOUT_S) as r:
            return json.loads(r.read())["choices"][0]["text"]
    except (OSError, ValueError, KeyError) as e:
        raise DiffuseError(f"smoke test: the served request failed: {e}") from e
    finally:
        panel.stop()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="diffuse-studio --smoke-test",
                                     description="Headless start, load, generate, screenshot.")
    parser.add_argument("out", help="the screenshot to write (.png)")
    parser.add_argument("model", nargs="?", help="a .gguf model (default: the demo model)")
    args = parser.parse_args(argv)
    os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
    from diffuse import DiffuseError
    with tempfile.TemporaryDirectory(prefix="diffuse-smoke-") as home:
        os.environ["DIFFUSE_STUDIO_HOME"] = home
        try:
            report = run(Path(args.out), Path(args.model) if args.model else None)
        except DiffuseError as e:
            print(e, file=sys.stderr)
            return 1
    print(json.dumps(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
