"""A real window on a real X server (Xvfb): the app starts from its entry point, replays a
recording, and the screen shows the canvas with the right colours; the demo model generates for
real on a small and a large screen with nothing cut on any side tab (layout_checks) and the
canvas in view, and the keyboard moves from the prompt with Tab and Ctrl+Tab."""
from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from diffuse.studio import theme
from diffuse.studio.canvas import color_scale
from diffuse.studio.run_state import RunState

pytestmark = pytest.mark.skipif(shutil.which("Xvfb") is None, reason="Xvfb is not installed")

GRAB = r"""
import sys
from PySide6.QtGui import QGuiApplication
app = QGuiApplication(sys.argv[:1])
image = app.primaryScreen().grabWindow(0).toImage()
sys.exit(0 if image.save(sys.argv[1]) else 1)
"""


@contextlib.contextmanager
def xvfb(size: str = "1600x1000"):
    """Xvfb on a display it picks itself (-displayfd), so parallel runs never collide."""
    proc = subprocess.Popen(["Xvfb", "-displayfd", "1", "-screen", "0", f"{size}x24",
                             "-nolisten", "tcp"], stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL)
    display = proc.stdout.readline().decode().strip()     # written once the server is ready
    if not display:
        proc.kill()
        pytest.fail("Xvfb did not start")
    try:
        yield f":{display}"
    finally:
        proc.terminate()
        proc.wait(timeout=10)
        proc.stdout.close()


@pytest.fixture
def xserver():
    with xvfb() as display:
        yield display


def x_env(display: str, home) -> dict:
    env = dict(os.environ, DISPLAY=display, QT_QPA_PLATFORM="xcb", DIFFUSE_STUDIO_HOME=str(home))
    env.pop("WAYLAND_DISPLAY", None)
    return env


def screen_rgb(env, path) -> np.ndarray | None:
    from PySide6.QtGui import QImage
    done = subprocess.run([sys.executable, "-c", GRAB, str(path)], env=env, timeout=60,
                          capture_output=True)
    if done.returncode != 0:
        return None
    image = QImage(str(path)).convertToFormat(QImage.Format.Format_RGB888)
    data = np.frombuffer(bytes(image.constBits()), np.uint8)
    return data.reshape(image.height(), image.bytesPerLine())[:, :image.width() * 3] \
        .reshape(image.height(), image.width(), 3)


def test_real_window_shows_the_replayed_run(xserver, recorded_run, tmp_path):
    rec = recorded_run("eos")
    rec.save(tmp_path / "run.npz")
    run = RunState.from_recording(rec)
    colors = color_scale(run, "entropy", fitted=True).colors(    # the window's default scale
        run.cell_values(run.n_steps - 1, "entropy"))
    expected = {(c.red(), c.green(), c.blue()) for c in colors if c is not None}

    env = x_env(xserver, tmp_path / "home")
    app = subprocess.Popen([sys.executable, "-m", "diffuse.studio", str(tmp_path / "run.npz")],
                           env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        found, pixels = set(), None
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and app.poll() is None:
            pixels = screen_rgb(env, tmp_path / "screen.png")
            if pixels is not None:
                present = {tuple(p) for p in np.unique(pixels.reshape(-1, 3), axis=0).tolist()}
                found = expected & present
                if len(found) >= 0.9 * len(expected):
                    break
            time.sleep(0.5)
        assert app.poll() is None, app.stdout.read().decode(errors="replace")[-3000:]
    finally:
        app.terminate()
        app.wait(timeout=20)
        app.stdout.close()
    assert pixels is not None, "could not grab the screen"
    # the canvas: (nearly) every decided cell's colour is on screen
    assert len(found) >= 0.9 * len(expected), (len(found), len(expected))
    # the dark theme (background and panel colours) fills much of the window; the screen is
    # far from blank
    theme_colours = [theme.BG, theme.PANEL]
    dark = np.zeros(pixels.shape[:2], bool)
    for c in theme_colours:
        dark |= np.all(np.abs(pixels.astype(int) - [c.red(), c.green(), c.blue()]) <= 2, axis=2)
    assert 0.25 < dark.mean() < 0.95, dark.mean()
    assert len(np.unique(pixels.reshape(-1, 3), axis=0)) > 500


# Runs in the app's process on the X server: the demo model generates a short answer, the window
# fills the screen (no window manager here), then it reports what a user could not read or see.
GENERATE = r"""
import json, sys, time
from PySide6.QtCore import QEventLoop, QPoint, QRect, Qt
from PySide6.QtTest import QTest
from PySide6.QtWidgets import QApplication
from diffuse.studio import storage, theme
from diffuse.studio.main_window import MainWindow
sys.path.insert(0, sys.argv[1])
from layout_checks import layout_problems

app = QApplication(sys.argv[:1])
theme.apply(app)
window = MainWindow()
window.setGeometry(app.primaryScreen().geometry())
window.show()

def wait_for(done, seconds):
    end = time.monotonic() + seconds
    while not done() and time.monotonic() < end:
        app.processEvents(QEventLoop.ProcessEventsFlag.AllEvents, 20)
    return done()

window.model_panel.load(storage.demo_model())
assert wait_for(lambda: window.engine.model is not None, 60), "the demo model did not load"
window.settings_panel.set_options(dict(gen_length=32, steps=16))   # the rest: the model's recipe
finished = []
window.engine.run_finished.connect(finished.append)
window.chat.prompt.setPlainText("Tell me about Mr. Darcy.")
window.chat.submit()
assert wait_for(lambda: finished, 60), "the run did not finish"
wait_for(lambda: False, 1.0)           # the views catch up, the window settles
canvas = window.canvas_panel
at = canvas.mapTo(window, QPoint(0, 0))
problems = {}
for i in range(window.side_tabs.count()):
    window.side_tabs.setCurrentIndex(i)
    wait_for(lambda: False, 0.3)
    problems[window.side_tabs.tabText(i)] = layout_problems(window)
# the keyboard: Ctrl+Tab changes the plots' tab from the prompt, Tab leaves it, no tab typed
prompt = window.chat.prompt
window.activateWindow()
prompt.setFocus()
focused = wait_for(prompt.hasFocus, 10)
view = window.views.currentIndex()
QTest.keyClick(prompt, Qt.Key.Key_Tab, Qt.KeyboardModifier.ControlModifier)
wait_for(lambda: False, 0.2)
ctrl_tab = window.views.currentIndex() != view
QTest.keyClick(prompt, Qt.Key.Key_Tab)
wait_for(lambda: False, 0.2)
print(json.dumps({
    "problems": problems,
    "keys": {"focused": focused, "ctrl_tab": ctrl_tab, "tab_leaves": not prompt.hasFocus(),
             "typed": prompt.toPlainText()},
    "steps": finished[0].n_steps,
    "window": [window.width(), window.height()],
    "screen": [app.primaryScreen().geometry().width(), app.primaryScreen().geometry().height()],
    "canvas_in_window": window.rect().contains(QRect(at, canvas.size())),
    "canvas_min_met": canvas.width() >= canvas.minimumSizeHint().width()
                      and canvas.height() >= canvas.minimumSizeHint().height(),
}))
window.close()
"""


@pytest.mark.parametrize("size", ["1024x700", "1600x1000"])
def test_demo_model_generates_with_nothing_clipped(tmp_path, size):
    with xvfb(size) as display:
        done = subprocess.run([sys.executable, "-c", GENERATE, str(Path(__file__).parent)],
                              env=x_env(display, tmp_path), capture_output=True, timeout=180)
    assert done.returncode == 0, done.stderr.decode(errors="replace")[-3000:]
    report = json.loads(done.stdout.decode().strip().splitlines()[-1])
    width, height = map(int, size.split("x"))
    assert report["steps"] > 0
    assert report["window"] == report["screen"] == [width, height], report
    assert all(found == [] for found in report["problems"].values()), report["problems"]
    assert report["keys"] == {"focused": True, "ctrl_tab": True, "tab_leaves": True, "typed": ""}, report
    assert report["canvas_in_window"] and report["canvas_min_met"], report
