"""Watching the denoising: a paced live display, automatic and manual replays with their speed,
committed cells that flash, a colour scale fitted to the run, views that fit the steps used, and
the CPU load of the run itself."""
from __future__ import annotations

import time

import numpy as np
import pytest
from PySide6.QtCore import QUrl
from PySide6.QtGui import QColor, QImage, QPainter

from diffuse.studio import theme
from diffuse.studio.canvas import (FLASH_MS, CanvasPanel, CellLayout, color_scale, paint_cells,
                                   tooltip_html)
from diffuse.studio.run_state import FIT_PERCENTILES, RunState
from diffuse.studio.timeline import Timeline

SMALL = {"gen_length": 48, "steps": 24, "block_length": 16, "threads": 1}   # blocks_cache: 24 steps


def start(qtbot, window, model, pace_ms: int, prompt="watch this"):
    """Run `prompt` with the display paced at `pace_ms`; the finished run and when each step was
    first drawn (seconds after the run started)."""
    window.set_model(model)
    window.settings_panel.set_options(SMALL)
    window.timeline.pace.setValue(pace_ms)
    drawn: dict[int, float] = {}
    t0 = time.monotonic()
    window.timeline.slider.valueChanged.connect(
        lambda v: drawn.setdefault(v, time.monotonic() - t0))
    window.chat.prompt.setPlainText(prompt)
    with qtbot.waitSignal(window.engine.run_finished, timeout=10000) as done:
        window.chat.submit()
    return done.args[0], drawn


def test_a_fast_run_is_paced_then_replayed_once(qtbot, window, fake_model):
    run, drawn = start(qtbot, window, fake_model(step_delay=0), pace_ms=30)
    timeline = window.timeline
    # the engine ran at full speed: it finished long before the display showed every step
    assert run.n_steps == 24 and timeline.step() < 20
    qtbot.waitUntil(lambda: timeline.playing and window.stop_replay_action.isEnabled())  # Esc stops it
    assert not window.stop_action.isEnabled()          # a replay is not a run: nothing to cancel
    # 24 steps x 30 ms is under a second: once caught up, replayed from the start
    qtbot.waitUntil(lambda: timeline.play_button.isChecked(), timeout=5000)
    gaps = np.diff([drawn[k] for k in range(1, 24)])
    assert np.median(gaps) >= 0.025                       # paced: one step per 30 ms at most
    assert timeline._clock.interval() == 1000 // timeline.speed.currentData()
    qtbot.waitUntil(lambda: window.timeline.label.text().endswith("· replay"), timeout=2000)
    qtbot.waitUntil(lambda: not timeline.playing, timeout=5000)
    assert timeline.step() == 23 and timeline.follow and not timeline.play_button.isChecked()
    qtbot.waitUntil(lambda: not window.stop_replay_action.isEnabled())


def test_cancel_and_a_new_run_stop_the_playback(qtbot, window, fake_model):
    model = fake_model(step_delay=0)
    run, _ = start(qtbot, window, model, pace_ms=200)
    assert window.timeline.step() < 5
    qtbot.waitUntil(lambda: window.stop_replay_action.isEnabled())       # playing
    window.stop_replay_action.trigger()                   # Esc: the newest step, no playback
    assert not window.timeline.playing and window.timeline.step() == run.n_steps - 1
    window.chat.prompt.setPlainText("again")
    with qtbot.waitSignal(window.engine.run_finished, timeout=10000) as done:
        window.chat.submit()
    assert window.run is done.args[0] and window.timeline.step() < 5
    window.chat.prompt.setPlainText("and again")          # a new run ends the old playback
    with qtbot.waitSignal(window.engine.run_started, timeout=5000):
        window.chat.submit()
    assert window.timeline.step() == 0 and not window.timeline.play_button.isChecked()
    qtbot.waitUntil(lambda: not window.engine.busy, timeout=10000)


def test_pace_and_replay_speed_are_remembered(qtbot):
    timeline = Timeline()
    qtbot.addWidget(timeline)
    assert timeline.pace.value() == 60 and timeline.speed.currentData() == 10
    timeline.pace.setValue(0)
    timeline.speed.setCurrentIndex(timeline.speed.findData(50))
    again = Timeline()
    qtbot.addWidget(again)
    assert again.pace.value() == 0 and again.speed.currentData() == 50
    assert again.pace.text() == "unpaced"
    again.set_count(10)                                   # unpaced: the newest step at once
    assert again.step() == 9 and not again.playing


def test_replay_speed_and_the_chat_replay_link(qtbot, window, fake_model):
    window.timeline.pace.setValue(0)
    window.timeline.speed.setCurrentIndex(window.timeline.speed.findData(50))
    run, _ = start(qtbot, window, fake_model(step_delay=0), pace_ms=0)
    qtbot.waitUntil(lambda: not window.timeline.playing, timeout=5000)    # its automatic replay
    answer = window.chat.conversation.messages[-1]
    qtbot.waitUntil(lambda: answer.meta["recording"] is not None, timeout=10000)   # once written
    assert "replay" in window.chat.view.toHtml()
    window.chat._link(QUrl(f"replay:{window.chat.conversation.messages[1].id}"))   # the answer's "▶ replay" link
    replayed = window.run
    assert replayed is not run and replayed.n_steps == run.n_steps and replayed.done
    assert window.timeline.play_button.isChecked() and window.timeline.step() < 5
    assert window.timeline._clock.interval() == 20        # 50 steps/s
    window.timeline.speed.setCurrentIndex(window.timeline.speed.findData(20))
    assert window.timeline._clock.interval() == 50        # changed while playing
    t0 = time.monotonic()
    qtbot.waitUntil(lambda: not window.timeline.play_button.isChecked(), timeout=60000)
    # at 50 ms a step the rest of the replay cannot take less than 0.3 s; a busy machine may make it
    # take longer, so only the floor is checked (the interval above is the speed asked for)
    assert 0.3 < time.monotonic() - t0 and window.timeline.step() == run.n_steps - 1


def test_committed_cells_flash_then_fade(qtbot, recorded_run):
    run = RunState.from_recording(recorded_run("blocks_cache"))
    layout = CellLayout(run.gen_length, 960, 60, 30)
    fresh = int(run.events[3].unmasked[0]) - run.prompt_length

    def pixel(flash: float) -> QColor:
        image = QImage(960, layout.height, QImage.Format.Format_RGB32)
        image.fill(theme.BG)
        p = QPainter(image)
        paint_cells(p, layout, run, 3, "entropy", flash=flash)
        p.end()
        r = layout.rect(fresh)
        return QColor(image.pixel(int(r.left() + 4), int(r.top() + 4)))
    lit, plain = pixel(1.0), pixel(0.0)
    assert lit.lightness() > plain.lightness() + 20
    panel = CanvasPanel()
    qtbot.addWidget(panel)
    panel.resize(900, 400)
    panel.show()
    panel.set_run(run)
    panel.show_step(3)
    assert panel.canvas.flash() > 0.8
    qtbot.wait(FLASH_MS + 150)
    assert panel.canvas.flash() == 0.0 and not panel.canvas._flash.isActive()


def test_fitted_and_absolute_colour_scales_say_which_is_on(qtbot, window, recorded_run,
                                                          tmp_path):
    recorded_run("eos").save(tmp_path / "run.npz")
    window.open_recording(tmp_path / "run.npz")
    run, panel = window.run, window.canvas_panel
    # fitted by default: most colours go to the 5th-95th percentiles of the text as committed
    # (the end-of-text padding, near 0 nats, left out), said on the legend and the colour bar
    assert panel.fit_button.isChecked() and "fitted 5–95%" in panel.legend.caption()
    text = ~np.isin(run.events[-1].gen_tokens, list(run.special_ids))
    fitted = color_scale(run, "entropy", True)
    assert fitted.band == pytest.approx(tuple(np.percentile(run.commit_entropy[text], FIT_PERCENTILES)))
    assert fitted.band[0] > 1.0
    # ... and the rest to the values either side: 0 nats and the band's low end differ
    assert (fitted.lo, fitted.hi) == (0.0, pytest.approx(run.entropy_max))
    zero, low = fitted.colors(np.array([0.0, fitted.band[0]]))
    assert zero != low
    assert panel.canvas.scale == fitted and panel.legend.scale == fitted
    assert tuple(window.heatmap.image.levels) == pytest.approx((0.0, run.entropy_max))
    assert "fitted" in window.heatmap.bar.getAxis("left").labelText
    panel.fit_button.click()
    absolute = color_scale(run, "entropy")
    assert "absolute" in panel.legend.caption() and panel.canvas.scale == absolute
    assert absolute.band is None and (absolute.lo, absolute.hi) == (0.0, run.entropy_max)
    assert "absolute" in window.heatmap.bar.getAxis("left").labelText
    assert window.heatmap.image.levels[1] == pytest.approx(run.entropy_max)
    panel.set_mode("confidence")
    assert (panel.canvas.scale.lo, panel.canvas.scale.hi) == (0.0, 1.0)
    assert panel.legend.caption() == "top-1 probability · absolute"
    again = CanvasPanel(remember=True)                    # the next start of the app
    qtbot.addWidget(again)
    assert again.canvas.mode == "confidence" and not again.fit_button.isChecked()
    assert not CanvasPanel().remember                     # compare's canvases keep no settings


def test_views_fit_the_steps_used_and_agree_on_steps_and_blocks(qtbot, window, recorded_run,
                                                               tmp_path):
    recorded_run("entropy_exit").save(tmp_path / "run.npz")
    window.open_recording(tmp_path / "run.npz")
    run = window.run
    assert run.n_steps < run.steps_allowed                # stopped early: no sliver of data
    heat = window.heatmap
    assert heat.image.image.shape[0] == run.n_steps
    y_lo, y_hi = heat.plot.getViewBox().viewRange()[1]
    assert y_hi - y_lo == pytest.approx(run.n_steps, rel=0.05)
    for k in (0, run.n_steps // 2, run.n_steps - 1):
        window.show_step(k)
        qtbot.waitUntil(lambda: window.canvas_panel.canvas.step == k)
        qtbot.waitUntil(lambda: window.timeline.label.text().startswith(f"step {k + 1}/"))
        shown = f"step {k + 1}/{run.n_steps}"
        assert window.timeline.label.text() == shown
        assert window.canvas_panel.status.text().startswith(shown + " · ")
        e = run.events[k]
        header_block = f"block {e.block + 1}/{e.n_blocks}"
        assert header_block in window.canvas_panel.status.text()
        i = e.block_start - run.prompt_length + 1                 # a cell of the current block
        assert header_block in tooltip_html(run, k, i)


def test_cpu_load_is_measured_during_the_run(qtbot, window, fake_model):
    class Busy(fake_model):
        def generate(self, prompt, **kw):
            t0 = time.thread_time()
            while time.thread_time() - t0 < 0.3:          # a sub-second run that loads a core
                pass
            return super().generate(prompt, **kw)
    window.views.setCurrentWidget(window.throughput)
    run, _ = start(qtbot, window, Busy(step_delay=0), pace_ms=0)
    loads = run.cpu_percent
    assert loads is not None and len(loads) == len(window.throughput.cpu_bars.opts["height"])
    assert loads.sum() > 30 and ((loads >= 0) & (loads <= 100)).all()
    axis = window.throughput.cpu_plot.getAxis("bottom")
    qtbot.waitUntil(lambda: "whole run" in axis.labelText)
    assert np.array_equal(window.throughput.cpu_bars.opts["height"], loads)
    window.throughput.sample_cpu()                        # the timer keeps the run's figure
    assert np.array_equal(window.throughput.cpu_bars.opts["height"], loads)


def test_cancel_is_off_while_a_finished_run_replays(qtbot, window, recorded_run, tmp_path):
    """A replay is not a run: the toolbar's Cancel stays off; Esc (View > Stop the replay) stops it."""
    from PySide6.QtWidgets import QToolBar
    recorded_run("blocks_cache").save(tmp_path / "run.npz")
    window.replay(str(tmp_path / "run.npz"))
    qtbot.waitUntil(lambda: window.timeline.playing and window.stop_replay_action.isEnabled())
    button = window.findChild(QToolBar).widgetForAction(window.stop_action)
    assert not window.stop_action.isEnabled() and not button.isEnabled()
    assert window.stop_replay_action.shortcut().toString() == window.stop_action.shortcut().toString() == "Esc"
    window.stop_replay_action.trigger()
    assert not window.timeline.playing and window.timeline.step() == window.run.n_steps - 1
    qtbot.waitUntil(lambda: not window.stop_replay_action.isEnabled())
