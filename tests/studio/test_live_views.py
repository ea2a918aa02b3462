"""The live views explain the rule while a run goes, as its replay does: the run's options (so its
rule and tau) are known when it starts, before its first step; steps are numbered from 1 in every
view; the heatmap's tau marks have legends and follow the slider; no tooltip is cut; the canvas
header wraps rather than cuts.

A live run is fed the way the window feeds one (MainWindow.generate, Engine.start): a RunState
made with the Settings' options, those resolved as the engine starts, the views handed it before
its first step, then its events one by one, the result last.
"""
from __future__ import annotations

import html
import re

import numpy as np
import pytest
from PySide6 import QtGui
from PySide6.QtCore import QPointF, Qt
from PySide6.QtGui import QTextDocument
from PySide6.QtWidgets import QWidget

from diffuse.generation import PRESETS, resolve_options
from diffuse.studio import theme
from diffuse.studio.cache_view import CacheView
from diffuse.studio.canvas import CanvasPanel, tooltip_html
from diffuse.studio.experts_view import ExpertsView
from diffuse.studio.heatmap import EntropyHeatmap
from diffuse.studio.run_state import RunState, step_number
from diffuse.studio.throughput import ThroughputView
from diffuse.studio.timeline import Timeline
from diffuse.studio.view_base import RunView

SMALL = {"gen_length": 48, "steps": 24, "seed": 0, "temperature": 0.0}
# The two runs the issue names: the paper's entropy exit, and the Fast-dLLM threshold preset.
RUNS = {"entropy_exit": {"scheduler": "entropy_exit", "threshold": 1.5},
        "fast-dllm": PRESETS["fast-dllm-threshold"]}
VIEWS = (CanvasPanel, EntropyHeatmap, CacheView, ThroughputView, ExpertsView)


@pytest.fixture(params=list(RUNS))
def recording(request, demo_run):
    return demo_run(**SMALL, **RUNS[request.param])


def settings_options(rec) -> dict:
    """What the Settings panel hands the run: the options asked for, the rest left to the model."""
    asked = {**SMALL, **RUNS["entropy_exit" if rec.options["scheduler"] == "entropy_exit" else "fast-dllm"]}
    return {name: asked.get(name) for name in rec.options}


def live(rec, views) -> RunState:
    """A live run of `rec` shown by `views`: yields after each step has been drawn."""
    run = RunState(rec.prompt, settings_options(rec), rec.model,
                   lambda ids: "".join(rec.pieces[i] for i in ids))     # the model's tokenizer
    run.options.update(resolve_options(rec.model["arch"], {}, **{k: v for k, v in run.options.items()
                                                                  if v is not None}))
    for view in views:
        view.set_run(run)
    yield run
    for event in rec.events:
        run.add(event)
        for view in views:
            view.show_step(-1)
        yield run
    run.finish(rec.result)
    for view in views:
        view.show_step(-1)
    yield run


def make(qtbot, kind):
    view = kind()
    qtbot.addWidget(view)
    view.resize(900, 420)
    return view


def explained(view: EntropyHeatmap) -> dict:
    """What the heatmap says about the rule, as a user reads it."""
    return {"side axis": view.side.getAxis("bottom").labelText,
            "side legend": view.side.titleLabel.text, "counts legend": view.counts.titleLabel.text,
            "image legend": view.plot.titleLabel.text, "bar label": view.bar.getAxis("left").labelText,
            "tau": (shown(view.tau_line), view.tau_line.value(), view.tau_line.label.toPlainText()),
            "bar tau": shown(view.bar_tau)}


def shown(item) -> bool:
    """Shown whenever its plot is (before the first step the plots are hidden)."""
    return item.isVisibleTo(item.parentItem())


def test_the_rule_is_known_before_the_first_step(recording):
    run = RunState(recording.prompt, recording.options, recording.model)
    assert not run.events and run.rule == RunState.from_recording(recording).rule is not None


def test_a_live_heatmap_explains_the_rule_from_the_start_as_its_replay_does(qtbot, recording):
    replay = make(qtbot, EntropyHeatmap)
    replayed = RunState.from_recording(recording)
    replay.set_run(replayed)
    rule = replayed.rule
    view = make(qtbot, EntropyHeatmap)
    for run in live(recording, [view]):
        assert explained(view) == explained(replay), run.n_steps
        if run.n_steps:
            k = run.n_steps - 1
            replay.show_step(k)
            # the shown step's split, as the caption says it, is the replay's
            assert view.summary.text.split(": ", 1)[1] == replay.summary.text.split(": ", 1)[1]
            assert html.unescape(view.summary.text).endswith(replayed.commits_text(k))     # whole
            assert "by τ" in view.summary.text and "this step" not in view.counts.titleLabel.text
    # Fast-dLLM's probabilities are labelled as such, entropy exit's tau in nats on both axes
    quantity = "top-1 probability" if rule.quantity == "confidence" else "entropy (nats)"
    assert explained(view)["side axis"] == quantity
    assert ("τ 1.5" in explained(view)["image legend"]) == (rule.quantity == "entropy")


def test_live_tooltips_name_the_threshold_from_the_start(qtbot, recording):
    replayed = RunState.from_recording(recording)
    panel = make(qtbot, CanvasPanel)
    marked = 0
    for run in live(recording, [panel]):
        if not run.events:
            continue
        k = run.n_steps - 1
        for i in np.flatnonzero((run.decided_step >= 0) & (run.decided_step <= k)):
            assert tooltip_html(run, k, i) == tooltip_html(replayed, k, i)
            marked += "committed by the threshold" in tooltip_html(run, k, i)
        assert panel.status.text().split(" · ", 3)[3] == replayed.commits_text(k)
    assert marked > 0


def test_every_view_numbers_the_shown_step_as_the_header_does(qtbot, recorded_run):
    """One convention: the header's "step k/n" is where every chart puts its cursor."""
    run = RunState.from_recording(recorded_run("entropy_exit"))
    panel, heat, cache, tput = (make(qtbot, kind) for kind in VIEWS[:4])
    for view in (panel, heat, cache, tput):
        view.set_run(run)
    for k in (0, 3, run.n_steps - 1):
        for view in (panel, heat, cache, tput):
            view.show_step(k)
        shown = int(re.match(r"step (\d+)/", panel.status.text()).group(1))
        assert shown == step_number(k) == k + 1
        cursors = [line.value() for line in heat.step_lines]
        cursors += [cache.step_line.value(), cache.fraction_marker.value(), tput.step_marker.value()]
        assert cursors == [shown] * len(cursors)
        assert cache.summary.text.startswith(f"step {shown}:")
        assert heat.summary.text.startswith(f"step {shown}/")
    # the data sit on the same numbers: the first step's bar, point and image row at 1
    assert tput.fwd_bars.opts["x"][0] == 1 and cache.curve.getData()[0][0] == 1
    assert heat.image.pos().y() == cache.image.pos().y() == 0.5       # row k spans k+0.5..k+1.5


def test_a_click_on_a_heatmap_row_shows_that_step(qtbot, recorded_run):
    run = RunState.from_recording(recorded_run("entropy_exit"))
    view = make(qtbot, EntropyHeatmap)
    view.show()
    view.set_run(run)
    qtbot.waitExposed(view)
    vb = view.plot.getViewBox()
    for k in (0, 4):
        point = vb.mapViewToScene(QPointF(3.0, step_number(k) + 0.3))      # within step k's row
        with qtbot.waitSignal(view.step_clicked) as clicked:
            qtbot.mouseClick(view.viewport(), Qt.MouseButton.LeftButton, pos=view.mapFromScene(point))
        assert clicked.args == [k]


def test_the_tau_marks_have_legends_and_follow_the_slider(qtbot, demo_run):
    rec = demo_run(**SMALL, **RUNS["entropy_exit"])
    run = RunState.from_recording(rec)
    view = make(qtbot, EntropyHeatmap)
    view.set_run(run)
    assert "τ" in view.counts.titleLabel.text           # the white bars
    # the white line on the colour bar
    assert theme.legend_html([("τ 1.5", theme.HIGHLIGHT)], glyph="━") in view.plot.titleLabel.text
    fired = int(np.argmax(run.n_extra[:run.n_steps]))
    quiet = int(np.flatnonzero(run.n_extra[:run.n_steps] == 0)[0])
    for k in (fired, quiet):
        view.show_step(k)
        assert all(line.value() == step_number(k) and line.isVisible() for line in view.step_lines)
        assert f"+ {run.n_extra[k]:.0f} by τ" in view.summary.text


def visible_text(tip: str) -> str:
    """The text Qt shows for a tooltip."""
    if not QtGui.Qt.mightBeRichText(tip):
        return tip
    doc = QTextDocument()
    doc.setHtml(tip)
    return doc.toPlainText()


def source_text(tip: str) -> str:
    """The text a tooltip was written to show: well-formed tags dropped, entities decoded."""
    text = re.sub(r"<br\s*/?>", "\n", tip)
    return html.unescape(re.sub(r"</?[a-zA-Z][^<>]*>", "", text)).replace("\xa0", " ")


def assert_whole(tip: str) -> None:
    shown = visible_text(tip).replace("\u2028", "\n").replace("\xa0", " ")
    assert shown.strip() == source_text(tip).strip() or not QtGui.Qt.mightBeRichText(tip), (tip, shown)
    for line in shown.splitlines():
        assert line.count("(") == line.count(")"), (tip, line)
        assert not re.search(r"[(\[,:·–\-]\s*$", line), (tip, line)       # no phrase left open


def test_no_tooltip_of_the_views_is_cut(qtbot, demo_run):
    runs = [RunState.from_recording(demo_run(**SMALL, **opts)) for opts in
            ({"scheduler": "entropy_exit", "threshold": 1.5},
             {"scheduler": "confidence_threshold", "confidence_threshold": 0.5},
             {"scheduler": "entropy_bounded", "entropy_budget": 4.0},
             {"scheduler": "low_confidence_dynamic", "confidence_threshold": 0.5}, {})]
    # the cells, at every step, of every rule
    for run in runs:
        for k in range(run.n_steps):
            for i in range(run.gen_length):
                assert_whole(tooltip_html(run, k, i))
    tips = 0
    for kind in (*VIEWS, Timeline):
        view = make(qtbot, kind)
        if isinstance(view, RunView):
            view.set_run(runs[0])
        for w in [view, *view.findChildren(QWidget)]:
            if w.toolTip():
                assert_whole(w.toolTip())
                tips += 1
    assert tips >= 10
    assert_whole("committed by the threshold (entropy < 1.5 nats)")      # plain text stays plain
    with pytest.raises(AssertionError):                                  # the cut the user saw
        assert_whole("<b>x</b><br>committed by the threshold (entropy < 1.5 nats)")


@pytest.mark.parametrize("size", [(1366, 768), (1024, 700)])
def test_the_canvas_header_wraps_instead_of_cutting(qtbot, window, demo_run, tmp_path, size):
    """A threshold rule's status line in the window on a 1366- and a 1024-pixel screen: wrapped,
    whole, and the header no wider than the canvas."""
    rec = demo_run(**SMALL, **RUNS["entropy_exit"])
    rec.save(tmp_path / "run.npz")
    window.resize(*size)
    assert window.open_recording(tmp_path / "run.npz")
    run, panel = window.run, window.canvas_panel
    k = int(np.argmax(run.n_extra[:run.n_steps]))
    window.timeline.stop()
    window.show_step(k)
    status = panel.status
    qtbot.waitUntil(lambda: status.text().startswith(f"step {step_number(k)}/"))
    qtbot.waitUntil(lambda: status.height() >= status.heightForWidth(status.width()))
    assert status.wordWrap() and status.text().endswith(run.commits_text(k))
    assert status.fontMetrics().horizontalAdvance(status.text()) > status.width()   # it did wrap
    assert panel.layout().minimumSize().width() <= panel.width()


def test_the_views_share_one_guard(qtbot, recorded_run):
    """set_run and show_step live in RunView alone; every view shows nothing for no run or a run
    without steps, and the newest step for -1."""
    from diffuse.studio.canvas import DenoisingCanvas
    for kind in (*VIEWS, DenoisingCanvas):
        assert issubclass(kind, RunView)
        assert not {"set_run", "show_step"} & set(vars(kind)), kind
        view = make(qtbot, kind)
        run = RunState.from_recording(recorded_run("entropy_exit"))
        for shown in (None, RunState(run.prompt, run.options, run.recording.model), run):
            view.set_run(shown)
            view.show_step(-1)
            view.show_step(10**6)
            assert view.run is shown and view.step == 10**6


def test_a_live_run_before_its_first_step_is_starting_not_missing(qtbot, demo_run):
    """Between Generate and the first step (a long prompt's prefill takes seconds on a real model)
    the views say the run is starting; "No run yet" is for no run."""
    from diffuse.studio.canvas import DenoisingCanvas
    rec = demo_run(**SMALL, **RUNS["entropy_exit"])
    heatmap, cache, experts, panel = (make(qtbot, kind) for kind in (EntropyHeatmap, CacheView, ExpertsView,
                                                                      CanvasPanel))
    notes = lambda: [v.empty.note.toPlainText() for v in (heatmap, cache, experts)]   # noqa: E731
    painted = lambda: panel.canvas.empty_text("idle")                                   # noqa: E731
    assert notes()[:2] == ["No run yet", "No run yet"] and "mixture-of-experts" in notes()[2]
    views = live(rec, [heatmap, cache, experts, panel])
    run = next(views)
    assert not run.events and notes() == ["starting…"] * 3 and painted() == "starting…"
    assert all(v.empty.note.isVisible() for v in (heatmap, cache, experts))
    next(views)                                          # the first step: drawn, no note
    assert not heatmap.empty.note.isVisible() and not cache.empty.note.isVisible()
    assert "dense" in experts.empty.note.toPlainText()   # the demo model has no experts
    for view in (heatmap, cache, experts, panel):
        view.set_run(None)
    assert notes()[:2] == ["No run yet", "No run yet"] and "mixture-of-experts" in notes()[2]
    assert painted() == "idle" and isinstance(panel.canvas, DenoisingCanvas)
