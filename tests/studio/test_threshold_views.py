"""The threshold rules as the views explain them: each step's commits split into the rule's floor
and tau's extras, committed values against tau, tau commits marked, compare isolating tau on one
colour scale; exports that say what they show. Fresh demo-model runs (the recorded ones predate
StepEvent.scheduled, and load without the split)."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from PySide6.QtGui import QColor, QImage
from PySide6.QtWidgets import QFileDialog

from diffuse.studio import theme
from diffuse.studio.canvas import CellLayout, render_image, tooltip_html
from diffuse.studio.heatmap import EntropyHeatmap
from diffuse.studio.run_state import RunState, step_number

# Each rule with a tau at which the demo model commits past the rule's floor at some step.
RULES = {"entropy_exit": {"threshold": 1.5},
         "low_confidence_dynamic": {"confidence_threshold": 0.5},
         "confidence_threshold": {"confidence_threshold": 0.5},
         "entropy_bounded": {"entropy_budget": 4.0}}


@pytest.fixture(params=list(RULES))
def rule_run(request, demo_run):
    # temperature 0: the confidence the events carry is the one the rules compare
    rec = demo_run(scheduler=request.param, seed=0, gen_length=48, steps=24, temperature=0.0,
                   **RULES[request.param])
    return RunState.from_recording(rec)


def test_each_steps_commits_split_into_the_rules_floor_and_taus_extras(rule_run):
    run, n = rule_run, rule_run.n_steps
    rule = run.rule
    assert rule is not None and rule.tau == next(iter(RULES[rule.scheduler].values()))
    committed = np.array([len(e.unmasked) for e in run.events])
    assert np.array_equal(run.n_floor[:n] + run.n_extra[:n], committed)
    assert run.n_extra[:n].max() > 0                      # tau added commits at some step
    if rule.floor == "schedule":
        scheduled = np.array([e.scheduled for e in run.events])
        assert np.array_equal(run.n_extra[:n], np.maximum(committed - scheduled, 0))
    else:
        assert (run.n_floor[:n] == 1).all()
    assert run.by_threshold.sum() == run.n_extra[:n].sum()
    # what tau added passes it (the budget rule: each step's sum less the largest is in budget)
    values = run.commit_entropy if rule.quantity == "entropy" else run.commit_confidence
    if rule.budget:
        assert (run.budget_used[:n] <= rule.tau + 1e-6).all()
    else:
        assert rule.passes(values[run.by_threshold]).all()
    k = int(np.argmax(run.n_extra[:n]))
    text = run.commits_text(k)
    assert f"{committed[k]} decided: {run.n_floor[k]:.0f}" in text
    assert f"+ {run.n_extra[k]:.0f} by τ ({rule.condition()})" in text


def test_entropy_exit_leaves_nothing_masked_below_tau(demo_run):
    run = RunState.from_recording(demo_run(scheduler="entropy_exit", threshold=1.5, seed=0,
                                           gen_length=48, steps=24))
    n = run.n_steps
    assert run.n_extra[:n].max() > 0 and n < run.steps_allowed
    # every position left masked after a step is at or above tau; the committed ones that tau
    # added are below it: the plot's dots and curve sit on either side of the tau line
    assert (run.masked_min[:n][np.isfinite(run.masked_min[:n])] >= 1.5).all()
    assert (run.commit_entropy[run.by_threshold] < 1.5).all()


def test_the_heatmap_plots_committed_values_against_tau_and_the_split(qtbot, rule_run):
    run, rule = rule_run, rule_run.rule
    view = EntropyHeatmap()
    qtbot.addWidget(view)
    view.set_run(run)
    assert view.tau_line.value() == pytest.approx(rule.tau)
    assert view.tau_line.label.toPlainText() == f"{'budget' if rule.budget else 'τ'}={rule.tau:.2f}"
    axis = "top-1 probability" if rule.quantity == "confidence" else "entropy (nats)"
    assert view.side.getAxis("bottom").labelText == axis
    values = run.commit_entropy if rule.quantity == "entropy" else run.commit_confidence
    x, y = view.by_tau.getData()
    assert np.array_equal(np.sort(x), np.sort(values[run.by_threshold]))
    assert np.array_equal(np.sort(y), np.sort(step_number(run.decided_step[run.by_threshold])))
    x, _ = view.committed.getData()
    assert len(x) == int(((run.decided_step >= 0) & ~run.by_threshold).sum())
    n = run.n_steps
    assert np.array_equal(view.tau_bars.opts["width"], run.n_extra[:n])
    assert np.array_equal(view.floor_bars.opts["width"], run.n_floor[:n])
    assert "τ" in view.counts.titleLabel.text
    assert ("Σ−max" in view.side.titleLabel.text) == rule.budget


def test_tau_commits_are_marked_on_the_canvas(rule_run):
    run = rule_run
    last = run.n_steps - 1
    w, cw, ch = 960, 60, 30
    image = render_image(run, last, "entropy", w, cw, ch)
    layout = CellLayout(run.gen_length, w, cw, ch)
    white = QColor(theme.HIGHLIGHT).rgb()
    for i in range(run.gen_length):
        r = layout.rect(i)
        corner = image.pixel(int(r.right() - 2), int(r.top() + 2))
        assert (corner == white) == bool(run.by_threshold[i]), i
        said = "committed by the threshold" in tooltip_html(run, last, i)
        assert said == bool(run.by_threshold[i]), i


def test_an_older_recording_says_the_split_is_unknown(qtbot, recorded_run):
    run = RunState.from_recording(recorded_run("entropy_exit"))    # made before `scheduled`
    n = run.n_steps
    assert np.isnan(run.n_extra[:n]).all() and not run.by_threshold.any()
    k = int(np.nanargmax(run.n_passed[:n]))
    assert run.n_passed[k] > 0
    assert "the schedule's count was not recorded" in run.commits_text(k)
    view = EntropyHeatmap()
    qtbot.addWidget(view)
    view.set_run(run)
    assert np.array_equal(view.floor_bars.opts["width"], [len(e.unmasked) for e in run.events])
    assert not view.tau_bars.opts["width"].any()


def test_schedulers_without_a_threshold_have_no_rule(recorded_run):
    run = RunState.from_recording(recorded_run("blocks_cache"))
    assert run.rule is None and run.commits_text(0) == f"{len(run.events[0].unmasked)} decided"


@pytest.mark.parametrize("preset, option", [(1, "threshold"), (2, "confidence_threshold")])
def test_compare_isolates_a_thresholds_effect_on_one_shared_scale(qtbot, window, demo_model,
                                                                   preset, option):
    window.set_model(demo_model)
    window.settings_panel.set_options({"gen_length": 48, "steps": 24, "seed": 3})
    window.open_compare()
    cmp = window.compare_window
    cmp.prompt.setText("Tell me about Mr. Darcy.")
    cmp.preset.setCurrentIndex(preset)
    finished = []
    window.engine.run_finished.connect(finished.append)
    cmp.start()
    qtbot.waitUntil(lambda: len(finished) == 2 and cmp.summary.text().startswith("Steps"),
                    timeout=60000)
    a, b = cmp.runs
    # the same rule, seed and options; only tau differs, and A's never fires
    assert a.options == {**b.options, option: a.options[option]} and a.options["seed"] == 3
    assert a.rule.scheduler == b.rule.scheduler and a.rule.tau != b.rule.tau
    assert np.nansum(a.n_extra) == 0
    assert b.rule.condition() in cmp.sides[1].title.text()
    lines = cmp.summary.text().splitlines()
    saved = a.result.steps - b.result.steps
    assert saved > 0 and f"B needed {saved} fewer" in lines[0]
    assert any(line.startswith(f"B ({b.rule.scheduler}") for line in lines)
    diff = a.differs_from(b)
    assert lines[-1].startswith(f"Answers: differ at {int(diff.sum())} of" if diff.any() else
                                "Answers: identical")
    assert "differ" in cmp.diff_legend.text() and "committed by τ" in cmp.diff_legend.text()
    # one colour scale for both panes, whichever side changes it
    canvases = [side.canvas.canvas for side in cmp.sides]
    assert canvases[0].scale == canvases[1].scale
    assert canvases[0].scale.hi == pytest.approx(max(a.entropy_max, b.entropy_max))
    cmp.sides[1].canvas.fit_button.click()
    assert canvases[0].fitted and canvases[0].scale == canvases[1].scale
    assert canvases[0].scale.band is not None
    cmp.sides[0].canvas.set_mode("confidence")
    assert canvases[1].mode == "confidence" and canvases[0].scale == canvases[1].scale
    cmp.close()


def test_exports_say_what_they_show(demo_run, tmp_path):
    from PIL import Image

    from diffuse.studio import export
    from diffuse.studio.canvas import color_scale
    run = RunState.from_recording(demo_run(scheduler="entropy_exit", threshold=1.5, seed=7,
                                           gen_length=48, steps=24))
    lines = export.header_lines(run)
    assert lines[0] == "prompt: Tell me about Mr. Darcy."
    assert lines[1] == "model: diffuse-demo-3m.gguf (llada)"
    assert "scheduler entropy_exit" in lines[2] and "threshold 1.5" in lines[2]
    assert "seed 7" in lines[2].split(", ")
    assert "committed by τ (entropy < 1.5 nats)" in lines[3]
    # the header, with the colour scale's numbers, tops the strip and every GIF frame
    fitted = color_scale(run, "entropy", True)
    top = export.header(run, fitted, 960)
    assert fitted.numbers() == f"0 · {fitted.band[0]:.2g}–{fitted.band[1]:.2g} · {fitted.hi:.2g}"
    export.png_strip(run, tmp_path / "strip.png", fitted=True)
    with Image.open(tmp_path / "strip.png") as png:
        strip = np.asarray(png.convert("RGB"))
    rgb = top.convertToFormat(QImage.Format.Format_RGB888)
    head = np.frombuffer(bytes(rgb.constBits()), np.uint8).reshape(
        rgb.height(), rgb.bytesPerLine())[:, :rgb.width() * 3].reshape(rgb.height(), rgb.width(), 3)
    assert np.array_equal(strip[:top.height()], head)
    export.gif(run, tmp_path / "run.gif", width=720)
    with Image.open(tmp_path / "run.gif") as gif:
        assert gif.n_frames == run.n_steps
        assert gif.height > export.header(run, color_scale(run, "entropy"), 720).height()
    name = export.suggested_name(run, "png")
    assert name.endswith("_tell-me-about-mr-darcy_entropy_exit.png") and name[:4].isdigit()
    assert export.suggested_name(None, "gif") == ""


def test_save_dialogs_suggest_a_name(qtbot, window, recorded_run, tmp_path, monkeypatch):
    recorded_run("entropy_exit").save(tmp_path / "run.npz")
    window.open_recording(tmp_path / "run.npz")
    offered = []
    monkeypatch.setattr(QFileDialog, "getSaveFileName",
                        staticmethod(lambda parent, title, start, *a: offered.append(start) or ("", "")))
    window._png_clicked()
    window._gif_clicked()
    window._save_clicked()
    names = [Path(p).name for p in offered]
    assert [n.rsplit(".", 1)[1] for n in names] == ["png", "gif", "npz"]
    assert all("_tell-me-about-mr-darcy_entropy_exit." in n for n in names)
