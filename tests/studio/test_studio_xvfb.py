"""A real window on a real X server (Xvfb): the app starts from its entry point, replays a
recording, and the screen shows the canvas with the right colours."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time

import numpy as np
import pytest

from diffuse.studio import theme
from diffuse.studio.canvas import value_colors, value_range
from diffuse.studio.run_state import RunState

pytestmark = pytest.mark.skipif(shutil.which("Xvfb") is None, reason="Xvfb is not installed")

GRAB = r"""
import sys
from PySide6.QtGui import QGuiApplication
app = QGuiApplication(sys.argv[:1])
image = app.primaryScreen().grabWindow(0).toImage()
sys.exit(0 if image.save(sys.argv[1]) else 1)
"""


@pytest.fixture
def xserver():
    """Xvfb on a display it picks itself (-displayfd), so parallel runs never collide."""
    proc = subprocess.Popen(["Xvfb", "-displayfd", "1", "-screen", "0", "1600x1000x24",
                             "-nolisten", "tcp"], stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL)
    display = proc.stdout.readline().decode().strip()     # written once the server is ready
    if not display:
        proc.kill()
        pytest.fail("Xvfb did not start")
    yield f":{display}"
    proc.terminate()
    proc.wait(timeout=10)
    proc.stdout.close()


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
    colors = value_colors(run.cell_values(run.n_steps - 1, "entropy"), "entropy",
                          value_range(run, "entropy"))
    expected = {(c.red(), c.green(), c.blue()) for c in colors if c is not None}

    env = dict(os.environ, DISPLAY=xserver, QT_QPA_PLATFORM="xcb",
               DIFFUSE_STUDIO_HOME=str(tmp_path / "home"))
    env.pop("WAYLAND_DISPLAY", None)
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
