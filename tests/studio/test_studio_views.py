"""Entropy heatmap, cache view and throughput panel, fed a run step by step."""
from __future__ import annotations

import numpy as np
import pytest

from diffuse.generation import default_options
from diffuse.studio.cache_view import CacheView
from diffuse.studio.heatmap import EntropyHeatmap
from diffuse.studio.run_state import RunState
from diffuse.studio.throughput import ThroughputView


def live_run(rec):
    """A RunState being filled like during a live run: yields after each event."""
    run = RunState(rec.prompt, rec.options, rec.model)
    for e in rec.events:
        run.add(e)
        yield run
    run.finish(rec.result)
    yield run


def test_heatmap_fills_row_by_row_and_reuses_items(qtbot, recorded_run):
    rec = recorded_run("blocks_cache")
    view = EntropyHeatmap()
    qtbot.addWidget(view)
    items = None
    for run in live_run(rec):
        if view.run is not run:
            view.set_run(run)
            items = (view.image, view.min_curve, view.median_curve, *view.step_lines)
        view.show_step(-1)
        image = view.image.image
        assert image.shape == (run.n_steps, 48)           # the steps used, not the budget
        assert np.isfinite(image).any(axis=1).all()
        assert (view.image, view.min_curve, view.median_curve, *view.step_lines) == items
    assert view.image.levels[1] == pytest.approx(run.entropy_max)
    x, y = view.min_curve.getData()
    assert len(x) == 24 and np.allclose(x[np.isfinite(x)], run.masked_min[:24][np.isfinite(x)])
    assert len(view.block_lines) == 2                 # three blocks
    assert not view.tau_line.isVisible()              # not entropy-exit


def test_heatmap_tau_line_for_entropy_exit(qtbot, recorded_run):
    rec = recorded_run("entropy_exit")
    tau = rec.options["threshold"]
    run = RunState.from_recording(rec)
    view = EntropyHeatmap()
    qtbot.addWidget(view)
    view.set_run(run)
    assert view.tau_line.isVisible() and view.tau_line.value() == pytest.approx(tau)
    assert view.bar_tau.value() == pytest.approx(256 * tau / run.entropy_max)
    assert run.n_steps < run.steps_allowed            # entropy-exit finished early


def test_the_tau_of_an_auto_threshold_is_the_family_default(recorded_run):
    rec = recorded_run("entropy_exit")
    rec.options["threshold"] = None                   # "auto" in the settings panel
    assert RunState.from_recording(rec).rule.tau == default_options(rec.model["arch"])["threshold"]


def test_heatmap_click_selects_a_step(qtbot, recorded_run):
    view = EntropyHeatmap()
    qtbot.addWidget(view)
    view.resize(800, 400)
    view.show()
    view.set_run(RunState.from_recording(recorded_run("no_cache")))
    qtbot.wait(20)

    class Click:
        def __init__(self, pos):
            self._pos = pos

        def scenePos(self):
            return self._pos
    vb = view.plot.getViewBox()
    with qtbot.waitSignal(view.step_clicked) as clicked:
        view._clicked(Click(vb.mapToScene(vb.boundingRect().center())))
    assert 0 <= clicked.args[0] < 16


def test_cache_view(qtbot, recorded_run):
    rec = recorded_run("blocks_cache")
    assert rec.options["cache"] and rec.options["refresh_every"] == 8
    run = RunState.from_recording(rec)
    view = CacheView()
    qtbot.addWidget(view)
    view.set_run(run)
    view.show_step(5)
    image = view.image.image
    assert image.shape == (24, run.prompt_length + 48)
    assert set(np.unique(image[:run.n_steps]).tolist()) <= {1, 2}
    assert (image[0] == 2).all() and (image[8] == 2).all()      # full refresh steps
    x, y = view.curve.getData()
    assert np.allclose(y, run.active_fraction[:24]) and y[0] == 1.0 and y[5] < 1.0
    assert view.prompt_line.value() == run.prompt_length
    assert "step 6" in view.summary.text and "cache on" in view.summary.text


def test_cache_view_without_cache(qtbot, recorded_run):
    rec = recorded_run("no_cache")
    view = CacheView()
    qtbot.addWidget(view)
    view.set_run(RunState.from_recording(rec))
    assert np.allclose(view.curve.getData()[1], 1.0) and "cache off" in view.summary.text


def test_throughput(qtbot, recorded_run):
    rec = recorded_run("blocks_cache")
    view = ThroughputView(sample_ms=20)
    qtbot.addWidget(view)
    runs = live_run(rec)
    run = next(runs)
    view.set_run(run)
    for _ in range(9):
        run = next(runs)
    view.show_step(-1)
    assert view.useful_tps.text() == "…"              # unknown until the end of text is known
    assert view.steps_bar.fraction == 10 / 24
    assert view.steps_label.text() == "steps used 10 of 24 allowed"
    for run in runs:
        pass
    view.show_step(-1)
    res = rec.result
    assert view.buffer_tps.text() == f"{res.buffer_tokens_per_s:.1f}"
    assert view.useful_tps.text() == f"{res.useful_tokens_per_s:.1f}"
    assert view.ms_step.text() == f"{res.step_ms.mean():.0f}"
    heights = view.fwd_bars.opts["height"]
    assert np.allclose(heights, res.forward_ms)
    qtbot.waitUntil(lambda: len(view.cpu_bars.opts["height"]) > 0
                    and "cores" in view.memory.text(), timeout=2000)
    loads = np.asarray(view.cpu_bars.opts["height"])
    assert ((loads >= 0) & (loads <= 100)).all()
