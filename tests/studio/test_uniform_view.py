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
    options = diffuse.generation.resolve_options(model.arch, model.recipe, gen_length=CANVAS, steps=4,
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
