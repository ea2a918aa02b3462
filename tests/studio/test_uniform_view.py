"""Uniform-state view: a real run of the tiny DiffusionGemma model (tests/fixtures/
tiny_diffusion_gemma.py), step by step, a masked-diffusion run, and its tab in the main window."""
from __future__ import annotations

import numpy as np
import pytest

import diffuse
from diffuse.convert import convert_hf
from diffuse.studio.run_state import RunState
from diffuse.studio.uniform_view import OTHER, UniformView, rule_curve

pytest.importorskip("torch")
pytest.importorskip("transformers.models.diffusion_gemma")

from fixtures.tiny_diffusion_gemma import CANVAS, write_diffusion_gemma  # noqa: E402


@pytest.fixture(scope="module")
def gemma_run(tmp_path_factory) -> RunState:
    folder = tmp_path_factory.mktemp("dg")
    path = convert_hf(write_diffusion_gemma(folder / "hf"), folder / "tiny.gguf", "f32")
    model = diffuse.load(path, threads=2)
    options = diffuse.generation.resolve_options(model.arch, model.recipe, gen_length=2 * CANVAS, steps=4,
                                                 entropy_budget=8.0, seed=2)
    run = RunState("ids", options, {"name": "tiny", "arch": model.arch}, decode=model.tokenizer.decode)
    run.finish(model.generate(list(range(10, 30)), chat=False, on_step=run.add, **options))
    return run


def test_rule_curve_is_the_sum_before_each():
    order, before = rule_curve(np.array([0.3, 0.1, 0.2]))
    assert order.tolist() == [0.1, 0.2, 0.3] and np.allclose(before, [0.0, 0.1, 0.3])


def test_bars_cut_and_rule_follow_the_step(qtbot, gemma_run):
    view = UniformView()
    qtbot.addWidget(view)
    view.set_run(gemma_run)
    for k, ev in enumerate(gemma_run.events):
        view.show_step(k)
        accepted = ev.unmasked - ev.block_start
        assert len(view.accepted_bars.opts["x"]) == len(accepted) and len(view.redrawn_bars.opts["x"]) == len(ev.redrawn)
        assert view.cut_line.value() == pytest.approx(ev.entropy_cut)
        # The rule: the accepted are the lowest entropies whose predecessors sum within the bound.
        _, before = view.before_curve.getData()
        assert (before[:len(accepted)] <= 8.0 + 1e-6).all()
        if len(accepted) < CANVAS:
            assert before[len(accepted)] > 8.0
        assert view.bound_line.value() == 8.0
        assert f"{len(accepted)} of {CANVAS} accepted" in view.summary.text
        assert "draft:" in view.summary.text


def test_a_masked_diffusion_run_says_so(qtbot):
    from conftest import recorded
    view = UniformView()
    qtbot.addWidget(view)
    view.set_run(RunState.from_recording(recorded("blocks_cache")))
    assert view.empty.empty and view.empty.note.toPlainText() == OTHER


def test_the_main_window_has_the_tab(qtbot, gemma_run):
    from diffuse.studio.main_window import MainWindow
    w = MainWindow()
    qtbot.addWidget(w)
    names = [w.views.tabText(i) for i in range(w.views.count())]
    assert "Uniform state" in names
    w.show_run(gemma_run)
    w.views.setCurrentWidget(w.uniform_view)
    w.uniform_view.show_step(1)
    assert not w.uniform_view.empty.empty


def test_the_canvas_says_canvas_and_ends_on_the_answer_decided(gemma_run):
    """The canvas's header names DiffusionGemma's canvases as this tab does, and its last frame
    shows the answer (the argmax draft) decided, not the last step's re-drawn positions masked."""
    from diffuse.studio.canvas import header_text, tooltip_html
    last = gemma_run.n_steps - 1
    ev = gemma_run.events[last]
    first = header_text(gemma_run, 0)
    assert "canvas 1/" in first and "block" not in first and "accepted" in first
    end = header_text(gemma_run, last)
    assert f"canvas {ev.block + 1}/{ev.n_blocks}" in end and "argmax draft" in end and "masked" not in end
    tokens, mask = gemma_run.shown(last)
    lo, hi = ev.block_start - gemma_run.prompt_length, ev.block_end - gemma_run.prompt_length
    assert not mask.any() and np.array_equal(tokens[lo:hi], ev.draft)
    assert np.array_equal(tokens[:lo], gemma_run.result.tokens[:lo])    # the canvases before it
    if ev.gen_mask.any():      # a position the last step re-drew: the tooltip says it is the answer's
        i = int(np.flatnonzero(ev.gen_mask)[0])
        assert "final argmax draft" in tooltip_html(gemma_run, last, i)
    # Earlier steps show the step as it was, and the canvases after the step's as not run yet.
    assert np.array_equal(gemma_run.shown(0)[1], gemma_run.events[0].gen_mask)
    if gemma_run.events[0].block_end - gemma_run.prompt_length < gemma_run.gen_length:
        assert gemma_run.not_started(0)[-1] and "later canvas" in tooltip_html(gemma_run, 0, gemma_run.gen_length - 1)


def test_a_masked_diffusion_run_after_a_uniform_one_leaves_no_bars(qtbot, gemma_run):
    """The message is drawn over the plot: the DiffusionGemma run's bars and cut line go."""
    from conftest import recorded
    view = UniformView()
    qtbot.addWidget(view)
    view.set_run(gemma_run)
    assert len(view.accepted_bars.opts["x"]) and view.cut_line.isVisible()
    view.set_run(RunState.from_recording(recorded("blocks_cache")))
    assert view.empty.empty and view.empty.note.toPlainText() == OTHER
    assert not len(view.accepted_bars.opts["x"]) and not len(view.redrawn_bars.opts["x"])
    assert not view.cut_line.isVisible() and view.before_curve.getData()[0] is None
    assert view.summary.text == ""


def test_the_plots_keep_their_room_at_1024x700(qtbot, window, gemma_run):
    """In a short tab the view scrolls: each plot keeps room for its data, the rule's legend sits
    in its title (over the plot, it covered the curves), nothing is cut."""
    from layout_checks import layout_problems
    from test_layout import _at_1024x700
    _at_1024x700(qtbot, window)
    window.show_run(gemma_run)
    window.timeline.stop()
    window.views.setCurrentWidget(window.uniform_view)
    window.show_step(1)
    window.refresh(), window.refresh()
    view = window.uniform_view
    qtbot.waitUntil(lambda: view.rule.vb.height() >= 100 and view.canvas.vb.height() >= 100, timeout=5000)
    assert view.verticalScrollBar().maximum() > 0        # the tab is shorter than the plots
    assert view.plots.width() <= view.viewport().width()     # a long title made them wider, cut at the edge
    assert layout_problems(window) == []
    title = view.rule.titleLabel
    assert "sum of the lower entropies" in title.text and view.rule.legend is None
    assert not title.sceneBoundingRect().intersects(view.rule.vb.sceneBoundingRect())
    summary, rule_axis = view.summary.sceneBoundingRect(), view.rule.getAxis("bottom").sceneBoundingRect()
    assert summary.top() >= rule_axis.bottom() - 1          # the caption under the axis, not over it
