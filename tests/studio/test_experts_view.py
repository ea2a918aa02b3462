"""Experts view: a real run of the tiny LLaDA-MoE model (8 experts, top 2, 2 layers) step by step,
a dense run, and its tab in the main window."""
from __future__ import annotations

import numpy as np
import pytest

import diffuse
from diffuse.studio.experts_view import ExpertsView, top1_map, touched_per_layer, touched_text, usage_counts
from diffuse.studio.run_state import RunState


def _recorded_run(path, name: str, **options) -> RunState:
    """A cached run of the model at `path` on a fixed prompt, recorded as the Studio records it."""
    model = diffuse.load(path, threads=1)
    run = RunState(name, {"cache": True}, {"name": name, "arch": model.arch, "n_expert": model.n_expert})
    run.finish(model.generate([5, 17, 42, 8], on_step=run.add, **options))
    return run


@pytest.fixture(scope="module")
def moe_run(tiny_gguf) -> RunState:
    return _recorded_run(tiny_gguf("llada-moe", "f32"), "moe", gen_length=16, steps=8, block_length=8)


def test_usage_and_top1_follow_the_step(qtbot, moe_run):
    view = ExpertsView()
    qtbot.addWidget(view)
    view.set_run(moe_run)
    first, later = moe_run.events[0], moe_run.events[3]
    for k, ev in ((0, first), (3, later)):
        view.show_step(k)
        counts = view.usage_image.image
        assert counts.shape == (2, 8)
        # layer 0: every recomputed position used k = 2 experts; the last layer only the rows
        # whose logits the step needed
        assert counts[0].sum() == 2 * len(ev.active)
        assert counts[1].sum() == 2 * int((ev.experts[1, :, 0] >= 0).sum())
        top = view.top1_image.image
        assert top.shape == (2, len(ev.tokens))
        np.testing.assert_array_equal(top[0, ev.active], ev.experts[0, :, 0] + 1)
        assert (top[:, ev.cached] == 0).all()          # served from the cache: background
        assert f"step {k + 1}: {len(ev.active)} positions recomputed" in view.summary.text
    assert len(later.cached) > 0 and not view.empty.note.isVisible()


def test_dense_run_shows_the_empty_state(qtbot, recorded_run):
    view = ExpertsView()
    qtbot.addWidget(view)
    view.set_run(RunState.from_recording(recorded_run("blocks_cache")))
    view.show_step(2)
    assert view.empty.note.isVisible() and "dense" in view.empty.note.toPlainText()
    assert not view.top1.isVisible() and not view.usage.getAxis("bottom").isVisible()


def test_helpers():
    experts = np.array([[[1, 0], [1, 2]], [[3, 1], [-1, -1]]])     # (layer, active, k)
    np.testing.assert_array_equal(usage_counts(experts, 4), [[1, 2, 1, 0], [0, 1, 0, 1]])
    np.testing.assert_array_equal(top1_map(experts, np.array([0, 2]), 3), [[1, -1, 1], [3, -1, -1]])


def test_main_window_has_the_experts_tab(window):
    tabs = [window.views.tabText(i) for i in range(window.views.count())]
    assert "Experts" in tabs
    window.show_run(None)
    assert window.experts_view.run is None


@pytest.fixture(scope="module")
def llada2_run(tiny_gguf) -> RunState:
    """A block-diffusion MoE run: tiny LLaDA2 (dense first layer, 16 experts in 4 groups, top 4)."""
    return _recorded_run(tiny_gguf("llada2", "f32"), "llada2", gen_length=32, steps=4)


def test_block_step_shows_the_experts_it_touches_per_layer(qtbot, llada2_run):
    view = ExpertsView()
    qtbot.addWidget(view)
    view.set_run(llada2_run)
    n_expert = llada2_run.recording.model["n_expert"]
    for k, ev in enumerate(llada2_run.events):
        view.show_step(k)
        experts = np.asarray(ev.experts)
        touched = view.touched_values
        assert touched is not None and touched.shape == (experts.shape[0],)
        # the dense first layer routes nothing: said as dense, not counted as 0 experts
        assert touched[0] == -1 and (experts[0] == -1).all()
        for layer in range(1, experts.shape[0]):
            assert touched[layer] == len(set(experts[layer].ravel()) - {-1})
            assert 4 <= touched[layer] <= n_expert      # top 4 of 16: at least one row's 4
        # the bars are the counts; the dense layer's bar is empty
        np.testing.assert_array_equal(view.touched_bars.opts["width"], np.maximum(touched, 0))
        assert [label.textItem.toPlainText() for label in view.dense_labels] == ["dense"]
        text = view.summary.text
        assert f"of {n_expert} on average" in text and "dense layer 0" in text
        assert f"{len(ev.active)} positions recomputed" in text
    # a block step recomputes the whole block of 32: more rows than one expert set serves
    assert max(len(ev.active) for ev in llada2_run.events) >= 32
    assert view.touched.isVisible() and not view.empty.note.isVisible()
    view.set_run(None)                                  # a new run: nothing of the old one stays
    assert view.touched_values is None and view.dense_labels == []


def test_touched_helpers():
    experts = np.array([[[-1, -1], [-1, -1]], [[3, 1], [1, 2]], [[0, 1], [-1, -1]]])   # dense, MoE, last
    np.testing.assert_array_equal(touched_per_layer(experts), [-1, 3, 2])
    assert touched_text(touched_per_layer(experts), 4) == \
        "experts touched per MoE layer: 2.5 of 4 on average (2-3, 2 layers) · dense layer 0"
    assert touched_text(np.array([-1, -1]), 4) == "no layer routed at this step"
