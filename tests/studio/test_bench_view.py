"""The Benchmarks window: sweeps on a tiny model run in the background, plot as they go, cancel."""
from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pyqtgraph as pg
import pytest
from PySide6.QtCore import QObject, Qt, Signal
from PySide6.QtWidgets import QApplication

import diffuse
from diffuse.studio.bench_view import KNEE_WIDTHS, SWEEPS, BenchWindow, parse_values, point_name
from diffuse.studio.knee_view import read_result
from diffuse.studio.run_controller import RunController

OPTIONS = {"gen_length": 8, "block_length": 8, "steps": 4, "threads": 1, "chat": True, "seed": None}


class IdleEngine(QObject):
    """An engine that never runs: the window runs the model itself."""
    run_finished = Signal(object)
    run_failed = Signal(object, str)

    def __init__(self, model):
        super().__init__()
        self.model, self.busy = model, False


@pytest.fixture(scope="module")
def tiny_model(tiny_gguf):
    return diffuse.load(tiny_gguf("llada", "f32"), threads=1)


@pytest.fixture
def bench(qtbot, tiny_model):
    runs = RunController(IdleEngine(tiny_model))
    w = BenchWindow(runs, lambda: dict(OPTIONS))
    qtbot.addWidget(w)
    w.show()
    yield w
    w.close()


def _sweep(qtbot, w, axis: str, values: str) -> None:
    w.axis.setCurrentText(axis)
    w.values.setText(values)
    w.start()
    assert w.running and w.job_box.isVisible()
    qtbot.waitUntil(lambda: not w.running, timeout=20000)


@pytest.mark.parametrize("axis, values, xs", [
    ("Step budget", "2,4", [2.0, 4.0]),
    ("Inter-step cache", "off,on", [0.0, 1.0]),
    ("Batch size", "1,3", [1.0, 3.0]),
])
def test_sweep_plots_every_point(qtbot, bench, axis, values, xs):
    assert bench.tps_empty.note.isVisible()          # no bare axes before the first run
    _sweep(qtbot, bench, axis, values)
    assert sorted(p["x"] for p in bench.points) == xs
    x, y = bench.tps_curve.getData()
    assert list(x) == xs and all(v > 0 for v in y)
    assert len(bench.ms_curve.getData()[0]) == len(xs)
    # the reference (the largest step budget, else the first value) ran first and agrees with itself
    reference = bench.points[0]
    assert reference["x"] == (max(xs) if axis == "Step budget" else xs[0]) and reference["agreement"] == 1.0
    x, agreement = bench.agree_curve.getData()
    assert list(x) == xs and all(0.0 <= a <= 1.0 for a in agreement)
    if axis == "Batch size":        # a batch changes no answer
        assert list(agreement) == [1.0, 1.0]
    assert bench.status.text().startswith(f"Done: {len(xs)} point(s)")
    assert not bench.job_box.isVisible() and bench.run_button.isEnabled()
    assert not bench.tps_empty.note.isVisible()


def test_cancel_stops_the_sweep(qtbot, bench):
    bench.axis.setCurrentText("Block length")
    bench.values.setText(",".join(["8"] * 40))
    bench.start()
    bench.cancel()
    qtbot.waitUntil(lambda: not bench.running, timeout=20000)
    assert bench.status.text().startswith("Cancelled") and len(bench.points) < 40


@pytest.mark.parametrize("option, text, message", [
    ("steps", "", "comma-separated"), ("steps", "4,x", "whole numbers"), ("steps", "0", "at least 1"),
    ("cache", "on,maybe", "off and on"),
])
def test_bad_values_are_refused(option, text, message):
    with pytest.raises(ValueError, match=message):
        parse_values(option, text)


def test_refused_without_a_model_or_while_another_part_runs_it(qtbot, bench):
    bench.values.setText("2,x")
    bench.start()
    assert not bench.running and "whole numbers" in bench.status.text()
    bench.values.setText("2,4")
    assert bench.runs.acquire("chat", lambda: None)
    assert not bench.run_button.isEnabled()
    assert "A chat answer is running" in bench.run_button.toolTip()
    bench.start()
    assert not bench.running and "A chat answer is running" in bench.status.text()
    bench.runs.release("chat")
    assert bench.run_button.isEnabled()
    bench.runs.engine.model = None
    bench.start()
    assert not bench.running and "Load a model" in bench.status.text()


def test_refused_for_a_model_behind_a_server(qtbot, bench):
    """A sweep times this machine's engine: against a server it would time the network."""
    bench.runs.engine.model = SimpleNamespace(remote=True)
    bench.hide()
    bench.show()                    # the window shown again finds the model changed
    assert not bench.run_button.isEnabled() and "runs on a server" in bench.run_button.toolTip()
    bench.start()
    assert not bench.running and "runs on a server" in bench.status.text()


def test_a_sweep_holds_the_model_until_it_ends(qtbot, bench):
    held = []
    bench.runs.holder_changed.connect(held.append)
    _sweep(qtbot, bench, "Step budget", "2,4")
    assert held == ["benchmarks", None] and bench.runs.holder is None
    assert bench.run_button.isEnabled()


def test_main_window_opens_it(window):
    action = next(a for a in window.findChildren(type(window.compare_action)) if a.text() == "Benchmarks…")
    action.trigger()
    assert window.bench_window.isVisible()


def test_before_a_sweep_the_plots_say_what_they_will_show(bench):
    for axis in SWEEPS:
        bench.axis.setCurrentText(axis)       # naming the axis must not bring back bare axes
        for plot, empty in zip(bench._plots(), (bench.tps_empty, bench.ms_empty, bench.agree_empty)):
            assert empty.note.isVisible() and "no sweep yet" in empty.note.toPlainText()
            assert not plot.getAxis("bottom").isVisible() and not plot.getAxis("left").isVisible()


def test_the_fastest_point_is_named_and_esc_closes(qtbot, bench):
    _sweep(qtbot, bench, "Inter-step cache", "off,on")
    assert "; fastest with cache o" in bench.status.text() and "at 1" not in bench.status.text()
    assert point_name("cache", 0.0) == "cache off" and point_name("steps", 16.0) == "16 steps"
    bench.activateWindow()
    qtbot.waitUntil(lambda: QApplication.activeWindow() is bench, timeout=5000)
    qtbot.keyClick(bench, Qt.Key.Key_Escape)
    qtbot.waitUntil(lambda: not bench.isVisible(), timeout=5000)


def test_every_point_of_a_sweep_uses_one_seed(qtbot, bench, monkeypatch):
    seeds = []
    real = bench.runs.engine.model.generate

    def generate(prompt, **options):
        seeds.append(options["seed"])
        return real(prompt, **options)
    monkeypatch.setattr(bench.runs.engine.model, "generate", generate)
    _sweep(qtbot, bench, "Step budget", "2,4")
    assert len(seeds) == 3 and len(set(seeds)) == 1        # warm-up and both points
    assert f"Every point used seed {seeds[0]} (drawn for this sweep" in bench.status.text()



# ---- where diffusion wins: bench knee drawn ----

STUDY_KNEE = Path(__file__).resolve().parents[2] / "docs" / "study" / "knee.json"


def _drawn(plot) -> list:
    return [i for i in plot.getPlotItem().items if isinstance(i, (pg.PlotDataItem, pg.BarGraphItem))]


def test_a_saved_knee_is_drawn_with_its_sources(bench):
    bench.open_knee(str(STUDY_KNEE))
    knee = bench.knee
    assert bench.tabs.currentIndex() == 1 and "Showing knee.json" in bench.knee_status.text()
    assert not knee.cost_empty.note.isVisible() and not knee.speed_empty.note.isVisible()
    # a curve per depth (512, 2048) beside the two reference lines; a bar set per depth
    assert len(_drawn(knee.cost_plot)) == 4
    x, y = _drawn(knee.cost_plot)[2].getData()
    assert list(x) == [0, 1, 2, 3, 4, 5] and y[0] == pytest.approx(1.0)
    assert len([i for i in _drawn(knee.speed_plot) if isinstance(i, pg.BarGraphItem)]) == 2
    text = knee.source.text()
    assert "from knee.json" in text and "SDAR (JetLM) report" in text and "not yet measured" in text
    assert "1. SDAR, block 4" in text
    assert "cores" not in text          # a file older than the machine fields: nothing said of them
    bench.open_knee(str(STUDY_KNEE))          # drawn again: the same items, not twice as many
    assert len(_drawn(knee.cost_plot)) == 4


@pytest.mark.parametrize("content, message", [
    ("{", "not JSON"), ("[]", "not a bench knee result"), ('{"passes": [{"depth": 1}]}', "not a bench knee result"),
    ('{"passes": [{"depth": 512, "w": 1, "tokens": 1.0}], "families": [3]}', "families"),
])
def test_a_bad_knee_file_is_one_line_and_changes_nothing(bench, tmp_path, content, message):
    bench.open_knee(str(STUDY_KNEE))
    shown = bench.knee.result
    (tmp_path / "bad.json").write_text(content)
    bench.open_knee(str(tmp_path / "bad.json"))
    assert message in bench.knee_status.text() and "\n" not in bench.knee_status.text()
    assert bench.knee.result is shown
    bench.open_knee(str(tmp_path / "missing.json"))
    assert "cannot read it" in bench.knee_status.text()


def test_the_knee_runs_on_the_loaded_model_and_saves(qtbot, bench, tmp_path):
    bench.knee_depths.setText("32")
    bench.knee_reps.setValue(1)
    bench.start_knee()
    assert bench.running and not bench.run_button.isEnabled() and not bench.knee_button.isEnabled()
    bench.start()                             # the sweep waits for it: one job in this window
    qtbot.waitUntil(lambda: not bench.running, timeout=60000)
    assert bench.knee_status.text().startswith("Done: bench knee measured depths 32")
    assert {p["w"] for p in bench.knee.result["passes"]} == set(KNEE_WIDTHS)
    source = bench.knee.source.text()
    assert "measured now on llada-f32.gguf" in source and "cores" in source and "load" in source
    assert bench.save_button.isEnabled() and bench.runs.holder is None
    bench.save_knee(str(tmp_path / "k.json"))
    assert read_result(tmp_path / "k.json")["passes"] == bench.knee.result["passes"]
    bench.knee_depths.setText("30")           # no multiple of the widths: the engine's refusal, said
    bench.start_knee()
    qtbot.waitUntil(lambda: not bench.running, timeout=60000)
    # the failure said once, in the knee's own line; both Run buttons usable again
    assert bench.knee_status.text().startswith("Bench knee failed:") and "multiple" in bench.knee_status.text()
    assert bench.knee_button.isEnabled() and bench.run_button.isEnabled() and not bench.job_box.isVisible()
    assert "failed" not in bench.status.text()
    bench.knee_depths.setText("x")
    bench.start_knee()
    assert not bench.running and "whole numbers" in bench.knee_status.text()


def test_closing_cancels_the_knee_without_waiting(qtbot, bench):
    bench.knee_depths.setText(",".join(["32"] * 30))
    bench.knee_reps.setValue(1)
    bench.start_knee()
    bench.close()
    assert not bench.isVisible()
    qtbot.waitUntil(lambda: not bench.running, timeout=60000)
    assert bench.knee_status.text().startswith("Cancelled") and bench.runs.holder is None


def test_each_tab_says_its_own_status(qtbot, bench):
    """The sweep's line stays under the sweep; the knee's under the knee."""
    _sweep(qtbot, bench, "Step budget", "2")
    sweep_said = bench.status.text()
    assert sweep_said.startswith("Done: 1 point(s)")
    bench.open_knee(str(STUDY_KNEE))
    assert bench.status.text() == sweep_said and "Showing knee.json" in bench.knee_status.text()
    assert bench.status.isVisibleTo(bench.tabs.widget(0)) and bench.knee_status.isVisibleTo(bench.tabs.widget(1))
    assert not bench.knee_status.isVisible() or not bench.status.isVisible()     # one tab shows at a time


def test_the_knee_on_diffusion_gemma_shows_its_canvas_step(qtbot, tmp_path):
    """No decode-token unit: the cost plot says why it is empty, the caption gives the canvas step."""
    from fixtures.tiny_diffusion_gemma import write_diffusion_gemma

    from diffuse.convert import convert_hf
    path = convert_hf(write_diffusion_gemma(tmp_path / "hf"), tmp_path / "dg.gguf", "f32")
    w = BenchWindow(RunController(IdleEngine(diffuse.load(path, threads=1))), lambda: dict(OPTIONS))
    qtbot.addWidget(w)
    w.show()
    w.tabs.setCurrentIndex(1)
    w.knee_depths.setText("8")
    w.knee_reps.setValue(1)
    w.start_knee()
    qtbot.waitUntil(lambda: not w.running, timeout=60000)
    assert w.knee_status.text().startswith("Done: bench knee measured depths 8"), w.knee_status.text()
    assert w.knee.cost_empty.note.isVisible() and "No cost in decode tokens" in w.knee.cost_empty.note.toPlainText()
    assert "No speed against AR decode" in w.knee.speed_empty.note.toPlainText()
    assert "Context 8: canvas step" in w.knee.source.text() and w.save_button.isEnabled()
    w.save_knee(str(tmp_path / "k.json"))
    assert read_result(tmp_path / "k.json")["canvas"][0]["depth"] == 8     # and it opens again
    w.close()
