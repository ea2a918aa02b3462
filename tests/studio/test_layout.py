"""Layout: the window fits small screens with nothing clipped or cut (every tab at 1024x700, the
first-run dialog), panels keep their width and collapse, the keyboard leaves the prompt and the
focus shows, spin boxes have arrows, legends stay off the data, empty plots say so, the Run and
Help menus, the quantise job's progress, and sizes in a unit that fits."""
from __future__ import annotations

import platform
import shutil
import threading

import numpy as np
import pytest
from PySide6.QtCore import QPoint, QRect, Qt, qVersion
from PySide6.QtGui import QImage
from PySide6.QtWidgets import (QAbstractButton, QApplication, QDoubleSpinBox, QPushButton, QSpinBox,
                               QStyle, QStyleOptionSpinBox)

import diffuse
from diffuse import gguf_file
from diffuse._core import GGML_VERSION
from diffuse.studio import first_run, theme
from diffuse.studio import main_window as mw
from diffuse.studio.cache_view import CacheView
from diffuse.studio.heatmap import EntropyHeatmap
from diffuse.studio.run_state import RunState
from diffuse.studio.settings_panel import SettingsPanel
from diffuse.studio.throughput import ThroughputView

from layout_checks import layout_problems


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
    text = mw.about_text()
    assert diffuse.__version__ in text and f"ggml {GGML_VERSION}" in text
    assert f"Qt {qVersion()}" in text and f"Python {platform.python_version()}" in text


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


def test_sizes_take_the_unit_that_fits():
    assert [theme.size_text(n) for n in (0, 512, 7_091_168, 284_039_936, 25 * 10**9, 3 * 2**40)] == \
        ["0 B", "512 B", "6.8 MiB", "271 MiB", "23.3 GiB", "3.0 TiB"]


def _at_1024x700(qtbot, window):
    window.resize(1024, 700)
    qtbot.waitUntil(lambda: (window.width(), window.height()) == (1024, 700), timeout=5000)


def test_nothing_is_cut_on_any_tab_at_1024x700(qtbot, window, fake_model, tiny_gguf, tmp_path):
    """Every side tab and every view, with a model loaded (its defaults under the fields), a
    long file name in the model list and a run on screen."""
    long_name = tmp_path / "LLaDA-8B-Instruct-with-a-rather-long-file-name-q4_k_m.gguf"
    shutil.copy(tiny_gguf("llada", "q8_0"), long_name)
    window.model_panel.add_file(long_name)
    qtbot.waitUntil(lambda: any(e.path.name == long_name.name for e in window.model_panel.entries),
                    timeout=30000)
    window.set_model(fake_model(step_delay=0.0))
    window.chat.prompt.setPlainText("Tell me about Mr. Darcy.")
    with qtbot.waitSignal(window.engine.run_finished, timeout=20000):    # a run of its own: CPU
        window.chat.submit()                                             # load over the run too
    window.timeline.stop()
    _at_1024x700(qtbot, window)
    for side in range(window.side_tabs.count()):
        window.side_tabs.setCurrentIndex(side)
        for view in range(window.views.count()):
            window.views.setCurrentIndex(view)
            window.refresh(), window.refresh()        # the canvas, then the view
            qtbot.wait(20)                             # layouts settle
            where = f"{window.side_tabs.tabText(side)} + {window.views.tabText(view)}"
            assert layout_problems(window) == [], where
    table = window.model_panel.table
    row = next(r for r, e in enumerate(window.model_panel.entries) if e.path.name == long_name.name)
    assert "…" not in table.item(row, 0).text() and str(long_name) in table.item(row, 0).toolTip()


def test_the_first_run_dialog_wraps_at_its_default_size(qtbot, window):
    dialog = first_run.open_for(window)
    qtbot.waitExposed(dialog)
    qtbot.wait(50)
    assert layout_problems(dialog) == []


def test_a_long_name_is_elided_with_its_whole_text_in_the_tooltip(qtbot, window):
    _at_1024x700(qtbot, window)
    name = "LLaDA-8B-Instruct-with-a-rather-long-file-name-q4_k_m.gguf"
    window.chat.set_model_ready(True, name)
    qtbot.waitUntil(lambda: window.chat.hint.toolTip() == f"Model: {name}", timeout=3000)
    assert window.chat.width() < window.width() / 3       # the name did not widen the chat
    window.chat.conversation.title = "Tell me, at some length, about Mr. Darcy and Elizabeth"
    window.chat._refresh_picker()
    assert window.chat.picker.toolTip() == window.chat.conversation.title
    assert layout_problems(window) == []


def test_panels_collapse_and_come_back(qtbot, window):
    _at_1024x700(qtbot, window)
    side, plots, chat = window.pane_toggles
    assert [t.action.text() for t in window.pane_toggles] == [
        "Models and settings panel", "Plots under the canvas", "Chat panel"]
    assert all(t.action.isChecked() for t in window.pane_toggles)
    width, centre = window.side_tabs.width(), window.centre.width()
    side.action.trigger()
    qtbot.waitUntil(lambda: window.splitter.sizes()[0] == 0, timeout=3000)
    assert not side.action.isChecked() and window.centre.width() > centre
    side.action.trigger()
    qtbot.waitUntil(lambda: window.splitter.sizes()[0] > 0, timeout=3000)
    assert side.action.isChecked() and abs(window.side_tabs.width() - width) <= 2
    plots.action.trigger()
    qtbot.waitUntil(lambda: window.centre.sizes()[1] == 0, timeout=3000)
    # dragging a handle to the edge collapses a panel too, and its menu entry follows
    window.splitter.moveSplitter(window.splitter.width(), 2)
    qtbot.waitUntil(lambda: window.splitter.sizes()[2] == 0, timeout=3000)
    assert not chat.action.isChecked()
    chat.action.trigger()
    plots.action.trigger()
    qtbot.waitUntil(lambda: window.splitter.sizes()[2] > 0 and window.centre.sizes()[1] > 0,
                    timeout=3000)
    qtbot.waitUntil(lambda: layout_problems(window) == [], timeout=5000)    # once laid out again


def _focus(qtbot, widget) -> None:
    widget.window().activateWindow()
    qtbot.waitUntil(lambda: QApplication.activeWindow() is widget.window(), timeout=5000)
    widget.setFocus()
    qtbot.waitUntil(widget.hasFocus, timeout=5000)


def test_tab_and_ctrl_tab_leave_the_prompt(qtbot, window):
    prompt = window.chat.prompt
    prompt.setPlainText("Tell me about Mr. Darcy.")
    _focus(qtbot, prompt)
    view = window.views.currentIndex()
    qtbot.keyClick(prompt, Qt.Key.Key_Tab, Qt.KeyboardModifier.ControlModifier)
    assert window.views.currentIndex() == (view + 1) % window.views.count()
    qtbot.keyClick(prompt, Qt.Key.Key_Tab, Qt.KeyboardModifier.ControlModifier | Qt.KeyboardModifier.ShiftModifier)
    assert window.views.currentIndex() == view
    qtbot.keyClick(prompt, Qt.Key.Key_Tab)
    assert not prompt.hasFocus() and prompt.toPlainText() == "Tell me about Mr. Darcy."
    # with the focus in the side panel, Ctrl+Tab goes through its tabs
    _focus(qtbot, window.model_panel.table)
    qtbot.keyClick(window.model_panel.table, Qt.Key.Key_Tab, Qt.KeyboardModifier.ControlModifier)
    assert window.side_tabs.currentIndex() == 1 and window.views.currentIndex() == view


def test_the_focus_ring_shows(qtbot, window):
    """A focused button is outlined in the accent colour, which an unfocused one is not."""
    button = next(b for b in window.chat.findChildren(QPushButton) if b.text() == "Copy")

    def accent_pixels() -> int:
        image = button.grab().toImage().convertToFormat(QImage.Format.Format_RGB888)
        data = np.frombuffer(bytes(image.constBits()), np.uint8)
        rgb = data.reshape(image.height(), image.bytesPerLine())[:, :image.width() * 3] \
            .reshape(image.height(), image.width(), 3)
        accent = [theme.ACCENT.red(), theme.ACCENT.green(), theme.ACCENT.blue()]
        return int((np.abs(rgb.astype(int) - accent).sum(axis=2) <= 30).sum())
    _focus(qtbot, window.chat.prompt)
    before = accent_pixels()
    _focus(qtbot, button)
    assert accent_pixels() >= before + 2 * (button.width() + button.height())


def test_a_steady_label_changes_text_without_relaying_out_its_window(qtbot):
    """The step counters change text at every step: a QLabel's size hint follows its text, and each
    change re-ran the main window's layout (99 layout requests a second during a run). A
    SteadyLabel keeps its size, widens once for a longer text, and is measured anew under a style."""
    from PySide6.QtCore import QEvent, QObject
    from PySide6.QtWidgets import QHBoxLayout, QWidget

    class Requests(QObject):
        n = 0

        def eventFilter(self, obj, event):
            self.n += event.type() == QEvent.Type.LayoutRequest
            return False

    box = QWidget()
    qtbot.addWidget(box)
    label = theme.SteadyLabel("step 1/256", min_width=90)
    QHBoxLayout(box).addWidget(label)
    box.show()
    qtbot.waitExposed(box)
    requests = Requests()
    box.installEventFilter(requests)
    for step in range(2, 60):
        label.setText(f"step {step}/256 · {step % 7} ms")
        QApplication.processEvents()
    assert requests.n <= 2          # the first longer text widens it, once
    width = label.width()
    label.setText("step 59/256 · live · 12 behind and a good deal longer than before")
    QApplication.processEvents()
    assert label.width() > width and label.width() >= label.fontMetrics().horizontalAdvance(label.text())
    label.setStyleSheet("font-size: 30px")
    assert label.height() >= label.fontMetrics().height()
    capped = theme.SteadyLabel("step 1/256", max_chars=12)     # it leaves its row's slider room
    capped.setText("step 224/224 · 112 behind · replay")
    assert capped.width() <= capped.fontMetrics().horizontalAdvance("0" * 12)


def test_the_timeline_slider_keeps_its_travel_at_1024(qtbot, window, fake_model):
    """At 1024x700 a long step label ("step 9/224 · 112 behind") took the slider's whole width."""
    window.resize(1024, 700)
    window.set_model(fake_model())
    window.timeline.label.setText("step 9/224 · 112 behind · and then some more words")
    qtbot.wait(50)
    assert window.timeline.slider.width() >= 60
