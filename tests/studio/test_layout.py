"""Layout: the window fits small screens with nothing clipped, panels keep their width, spin
boxes have arrows, legends stay off the data, empty plots say so, the Run and Help menus, and
the quantise job's progress."""
from __future__ import annotations

import threading

import numpy as np
import pytest
from PySide6.QtCore import QPoint, QRect
from PySide6.QtGui import QImage
from PySide6.QtWidgets import QAbstractButton, QDoubleSpinBox, QSpinBox, QStyle, QStyleOptionSpinBox

import diffuse
from diffuse import gguf_file
from diffuse._core import GGML_VERSION
from diffuse.studio import main_window as mw
from diffuse.studio.cache_view import CacheView
from diffuse.studio.heatmap import EntropyHeatmap
from diffuse.studio.run_state import RunState
from diffuse.studio.settings_panel import SettingsPanel
from diffuse.studio.throughput import ThroughputView


def clipped_buttons(window) -> list[str]:
    """Visible buttons narrower than their text needs."""
    return [f"{b.text()!r}: {b.width()} < {b.sizeHint().width()}"
            for b in window.findChildren(QAbstractButton)
            if b.isVisible() and b.text() and b.width() < b.sizeHint().width()]


def inside(widget, window) -> bool:
    rect = QRect(widget.mapTo(window, QPoint(0, 0)), widget.size())
    return window.rect().contains(rect)


@pytest.mark.parametrize("size", [(1024, 700), (1600, 1000)])
def test_the_window_fits_with_nothing_clipped(qtbot, window, recorded_run, tmp_path, size):
    recorded_run("eos").save(tmp_path / "run.npz")
    window.open_recording(tmp_path / "run.npz")
    window.resize(*size)
    qtbot.waitUntil(lambda: window.width() == size[0], timeout=3000)
    qtbot.wait(100)
    assert window.minimumSizeHint().width() <= 1024
    assert clipped_buttons(window) == []
    assert inside(window.canvas_panel, window) and inside(window.chat, window)
    assert window.canvas_panel.width() >= window.canvas_panel.minimumSizeHint().width()
    assert window.chat.width() < window.width() / 3


def test_the_side_panel_keeps_its_width_during_a_job(qtbot, window):
    panel = window.model_panel
    qtbot.waitUntil(lambda: panel._scan is None, timeout=10000)
    width = window.side_tabs.width()
    reported = threading.Event()

    def job(progress, cancel):
        progress(1, 3, "blk.31.ffn_down.weight · " * 6)
        reported.set()
        while not cancel():
            threading.Event().wait(0.01)
    assert panel._start_job("Quantising LLaDA-8B-Instruct-a-long-file-name-f16.gguf to Q4_K_M",
                            job)
    qtbot.waitUntil(lambda: "ffn_down" in panel.job_label.text(), timeout=5000)
    qtbot.wait(50)
    assert window.side_tabs.width() == width
    with qtbot.waitSignal(panel.job_finished, timeout=5000):
        panel.cancel_job()
    panel.refuse("/home/someone/models/" + "a-very-long-folder-name/" * 8 + "model.gguf: no")
    qtbot.wait(50)
    assert window.side_tabs.width() == width


def test_spin_boxes_draw_their_arrows(qtbot):
    panel = SettingsPanel()
    qtbot.addWidget(panel)
    panel.show()
    qtbot.waitExposed(panel)
    boxes = [b for kind in (QSpinBox, QDoubleSpinBox) for b in panel.findChildren(kind)
             if b.isVisible()]
    assert boxes
    for box in boxes[:3]:
        option = QStyleOptionSpinBox()
        box.initStyleOption(option)
        image = box.grab().toImage().convertToFormat(QImage.Format.Format_RGB888)
        data = np.frombuffer(bytes(image.constBits()), np.uint8)
        rgb = data.reshape(image.height(), image.bytesPerLine())[:, :image.width() * 3] \
            .reshape(image.height(), image.width(), 3)
        for part in (QStyle.SubControl.SC_SpinBoxUp, QStyle.SubControl.SC_SpinBoxDown):
            r = box.style().subControlRect(QStyle.ComplexControl.CC_SpinBox, option, part, box)
            assert r.width() >= 12 and r.height() >= 6
            arrow = rgb[r.top():r.bottom() + 1, r.left():r.right() + 1]
            assert (np.abs(arrow.astype(int) - [0x8a, 0x90, 0xa2]).sum(axis=2) <= 30).any()


def test_legends_sit_above_the_plots(qtbot, recorded_run):
    heatmap, throughput = EntropyHeatmap(), ThroughputView()
    for widget in (heatmap, throughput):
        qtbot.addWidget(widget)
        widget.set_run(RunState.from_recording(recorded_run("blocks_cache")))
        widget.resize(700, 400)
        widget.show()
        qtbot.waitExposed(widget)
    for plot, names in ((heatmap.side, ("min", "median")),
                        (throughput.ms_plot.getPlotItem(), ("forward", "sampling + rest"))):
        assert plot.legend is None
        title = plot.titleLabel
        assert all(name in title.text for name in names)
        assert not title.sceneBoundingRect().intersects(plot.vb.sceneBoundingRect())


@pytest.mark.parametrize("view_type", [EntropyHeatmap, CacheView])
def test_an_empty_view_says_so_instead_of_showing_axes(qtbot, recorded_run, view_type):
    view = view_type()
    qtbot.addWidget(view)
    assert view.empty.note.isVisible() and view.empty.note.toPlainText() == "No run yet"
    assert not view.plot.getAxis("left").isVisible()
    assert not view.plot.getAxis("bottom").isVisible()
    view.set_run(RunState.from_recording(recorded_run("blocks_cache")))
    assert not view.empty.note.isVisible() and view.plot.getAxis("left").isVisible()
    view.set_run(None)
    assert view.empty.note.isVisible()


def test_run_menu_generates_and_cancels(qtbot, window, fake_model):
    texts = [a.text() for a in window.menuBar().actions()[1].menu().actions()]
    assert texts[:2] == ["Generate\tCtrl+Return", "Cancel"]
    assert not window.generate_action.isEnabled()            # no model yet
    window.set_model(fake_model(step_delay=0.0))
    window.generate_action.trigger()                          # no prompt: the prompt box asks
    assert not window.engine.busy and window.chat.prompt.hasFocus()
    window.chat.prompt.setPlainText("Tell me about Mr. Darcy.")
    with qtbot.waitSignal(window.engine.run_finished, timeout=20000):
        window.generate_action.trigger()
        assert window.stop_action.isEnabled()


def test_about_names_the_versions():
    assert diffuse.__version__ in mw.about_text() and f"ggml {GGML_VERSION}" in mw.about_text()


def test_quantise_progress_follows_the_bytes_written(qtbot, window, tiny_gguf, tmp_path):
    panel = window.model_panel
    out = tmp_path / "tiny-q8_0.gguf"
    reports = []
    with qtbot.waitSignal(panel.job_finished, timeout=30000):
        assert panel.quantise(tiny_gguf("llada", "f32"), "Q8_0", out)
        panel.job.progressed.connect(lambda done, total, what: reports.append((done, total)))
    written = sum(t.nbytes for t in gguf_file.read(out).tensors)
    assert reports[-1] == (written, written)
    assert all(a[0] <= b[0] for a, b in zip(reports, reports[1:])) and len(reports) > 2
