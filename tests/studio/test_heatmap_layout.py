"""The heatmap's three plots side by side never draw over each other: with real fonts (a real X
window at 1024x700) the middle plot's one-line legend was wider than its column, and it drew its
axis and legend over the commits plot. Offscreen at the real column's width, and on Xvfb."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from diffuse.studio.heatmap import EntropyHeatmap
from diffuse.studio.run_state import RunState

RUN = Path(__file__).resolve().parents[1] / "fixtures" / "runs" / "blocks_cache.npz"

# Each plot's extent and its title's, bottom axis' and view box's, in scene x; then whether the
# title rows are equal (the three share the step axis).
EXTENTS = r"""
def extents(hm):
    out = {}
    for name, p in (("image", hm.plot), ("side", hm.side), ("counts", hm.counts)):
        parts = [p.titleLabel, p.getAxis("bottom"), p.vb]
        out[name] = [[r.left(), r.right()] for r in (x.sceneBoundingRect() for x in [p, *parts])]
    out["title_rows"] = sorted({round(p.layout.rowMinimumHeight(0)) for p in (hm.plot, hm.side, hm.counts)})
    return out
"""
exec(EXTENTS)


def check(found: dict) -> None:
    names = ("image", "side", "counts")
    for name in names:
        (left, right), *parts = found[name]
        for lo, hi in parts:         # the title, the axis and the data stay in their own plot
            assert left - 1 <= lo and hi <= right + 1, (name, found)
    for a, b in zip(names, names[1:]):
        assert found[a][0][1] <= found[b][0][0] + 1, (a, b, found)    # side by side, not over each other
    assert len(found["title_rows"]) == 1, found


@pytest.mark.parametrize("width", [403, 536])      # the heatmap's column at 1024x700 and 1366x768
def test_the_three_plots_keep_to_their_columns(qtbot, width):
    hm = EntropyHeatmap()
    qtbot.addWidget(hm)
    from diffuse.recording import Recording
    hm.set_run(RunState.from_recording(Recording.load(RUN)))
    hm.resize(width, 300)
    hm.show()
    qtbot.waitExposed(hm)
    qtbot.waitUntil(lambda: hm.side.vb.width() > 0, timeout=5000)
    check(extents(hm))


REAL = EXTENTS + r"""
import json, sys, time
from PySide6.QtCore import QEventLoop
from PySide6.QtWidgets import QApplication
from diffuse.studio import theme
from diffuse.studio.main_window import MainWindow
app = QApplication(sys.argv[:1])
theme.apply(app)
window = MainWindow()
window.setGeometry(app.primaryScreen().geometry())
window.show()
assert window.open_recording(sys.argv[1])
window.views.setCurrentWidget(window.heatmap)
end = time.monotonic() + 2
while time.monotonic() < end:
    app.processEvents(QEventLoop.ProcessEventsFlag.AllEvents, 20)
print(json.dumps(extents(window.heatmap)))
window.close()
"""


@pytest.mark.parametrize("size", ["1024x700", "1366x768"])
def test_in_a_real_window(tmp_path, size):
    xvfb_test = pytest.importorskip("test_studio_xvfb")
    if xvfb_test.shutil.which("Xvfb") is None:
        pytest.skip("Xvfb is not installed")
    with xvfb_test.xvfb(size) as display:
        done = subprocess.run([sys.executable, "-c", REAL, str(RUN)], env=xvfb_test.x_env(display, tmp_path),
                              capture_output=True, timeout=180)
    assert done.returncode == 0, done.stderr.decode(errors="replace")[-3000:]
    check(json.loads(done.stdout.decode().strip().splitlines()[-1]))
