"""LLaDA2.1's token-to-token editing as the views show it: a replaced token is a violet corner on
the canvas (a violet ring at the step of the edit) and a tooltip line "edited at step k (was 'x')";
the heatmap marks each edit where it happened and counts them per step; recordings keep the edits
and older ones load without any. A fresh run of the tiny LLaDA2 checkpoint at settings where it edits."""
from __future__ import annotations

import numpy as np
import pytest
from PySide6.QtGui import QColor

import diffuse
from diffuse.generation import resolve_options
from diffuse.recording import Recording
from diffuse.studio import theme
from diffuse.studio.canvas import CellLayout, render_image, tooltip_html
from diffuse.studio.export import header_lines
from diffuse.studio.heatmap import EntropyHeatmap
from diffuse.studio.run_state import RunState, step_number

# The tiny model's x0 is rarely above a few percent likely: at 0.02 it edits (tests/test_llada2.py).
EDITING = dict(gen_length=48, steps=8, block_length=8, scheduler="low_confidence_dynamic",
               confidence_threshold=0.3, editing_threshold=0.02, max_post_steps=4, temperature=0.0)


@pytest.fixture(scope="module")
def editing_recording(tiny_gguf, tmp_path_factory):
    m = diffuse.load(tiny_gguf("llada2", "f32"), threads=1)
    rec = Recording(prompt="hello", options=resolve_options(m.arch, m.recipe, **EDITING),
                    model={"name": "tiny", "arch": m.arch, "eos_ids": [int(i) for i in m.tokenizer.eos_token_ids]})
    rec.finish(m.generate([5, 17, 42, 8, 99, 3, 61, 250, 13, 7, 77], chat=False, on_step=rec.add, **EDITING),
               m.tokenizer.decode)
    path = tmp_path_factory.mktemp("runs") / "editing.npz"
    rec.save(path)
    return Recording.load(path)


@pytest.fixture
def run(editing_recording):
    return RunState.from_recording(editing_recording)


def near(a: int, b: QColor) -> bool:
    c = QColor(a)
    return abs(c.red() - b.red()) + abs(c.green() - b.green()) + abs(c.blue() - b.blue()) < 60


def test_recordings_keep_the_edits_and_the_run_knows_what_they_replaced(editing_recording, run):
    ev = editing_recording.events
    assert sum(len(e.edited) for e in ev) > 0
    assert len(run.edits) == sum(len(e.edited) for e in ev) == run.n_edited.sum()
    p = run.prompt_length
    for k, g, old in run.edits:
        assert ev[k - 1].tokens[p + g] == old != ev[k].tokens[p + g]
        assert not ev[k - 1].mask[p + g]                   # a committed token, not a mask
    k = int(np.argmax(run.n_edited))
    assert f"{run.n_edited[k]:.0f} edited" in run.commits_text(k)


def test_the_canvas_marks_edited_tokens_and_says_what_they_were(run):
    k = int(np.argmax(run.n_edited))
    w, cw, ch = 960, 60, 30
    image = render_image(run, k, "entropy", w, cw, ch)
    layout = CellLayout(run.gen_length, w, cw, ch)
    edited = run.edits_until(k)
    now = set((run.events[k].edited - run.prompt_length).tolist())
    assert now and now <= set(edited)
    for i in range(run.gen_length):
        r = layout.rect(i)
        corner = image.pixel(int(r.left() + 2), int(r.bottom() - 2))
        assert near(corner, theme.EDITED) == (i in edited), i
        ring = image.pixel(int(r.center().x()), int(r.top() - 2))
        assert near(ring, theme.EDITED) == (i in now), i
        tip = tooltip_html(run, k, i)
        assert ("edited at step" in tip) == (i in edited), i
    g = min(now)
    old = edited[g][-1][1]
    assert f"edited at step {step_number(k)} (was {run.piece(old)!r}" in tooltip_html(run, k, g).replace(
        "&#x27;", "'").replace("&quot;", '"')
    assert any("violet corner" in line for line in header_lines(run))
    before = run.edits[0][0] - 1                        # before the first edit: no mark, no line
    assert not run.edits_until(before)
    assert all("edited at step" not in tooltip_html(run, before, i) for i in range(run.gen_length))


def test_the_heatmap_marks_and_counts_the_edits(qtbot, run):
    view = EntropyHeatmap()
    qtbot.addWidget(view)
    view.set_run(run)
    n = run.n_steps
    assert np.array_equal(view.edit_bars.opts["width"], run.n_edited[:n])
    assert np.array_equal(view.edit_bars.opts["x0"], run.n_committed[:n])
    x, y = view.edit_marks.getData()
    assert sorted(zip(x - 0.5, y)) == sorted((g, step_number(k)) for k, g, _ in run.edits)
    assert "edits" in view.counts.titleLabel.text
    view.set_run(None)
    assert len(view.edit_marks.getData()[0]) == 0


def test_an_older_recording_loads_without_edits(qtbot, recorded_run):
    rec = recorded_run("blocks_cache")         # made before events carried `edited`
    assert all(e.edited.size == 0 for e in rec.events)
    run = RunState.from_recording(rec)
    assert not run.edits and not run.n_edited.any()
    assert "edited" not in run.commits_text(run.n_steps - 1)
    view = EntropyHeatmap()
    qtbot.addWidget(view)
    view.set_run(run)
    assert not view.edit_bars.opts["width"].any() and "edits" not in view.counts.titleLabel.text


@pytest.mark.parametrize("name", ["llada2.1-speed", "llada2.1-quality"])
def test_the_settings_panel_offers_llada21s_modes(qtbot, tiny_gguf, name):
    from diffuse.generation import PRESET_TITLES, PRESETS
    from diffuse.studio.settings_panel import SettingsPanel
    m = diffuse.load(tiny_gguf("llada2", "f32"), threads=1)
    panel = SettingsPanel()
    qtbot.addWidget(panel)
    panel.show_defaults(m.arch, m.n_ctx_train, m.recipe)
    panel.apply_preset(panel.preset.findData(PRESET_TITLES[name]))
    opts = panel.options()
    assert {k: opts[k] for k in PRESETS[name]} == pytest.approx(PRESETS[name])
    assert panel.fields["max_post_steps"].isEnabled()
    given = {k: v for k, v in opts.items() if k not in ("threads", "chat") and v is not None}
    r = m.generate([5, 17, 42], chat=False, **{**given, "gen_length": 32})
    assert r.steps > 0
    panel.set_options({"editing_threshold": 1.0})
    panel._changed()
    assert not panel.fields["max_post_steps"].isEnabled()
