"""What the Studio's headers say of runs decoded over a causal cache (modes ar and self_spec) and of
WeDLM's window: no scheduler's threshold rule where none decided (RunState.rule), the mode or the
window in a chat answer's note, and the canvas's status line saying what a step of such a run is
instead of blocks it does not have."""
from __future__ import annotations

import numpy as np
import pytest
from causal_runs import agreeable_nemotron, causal_run, wedlm_recording

import diffuse
from diffuse.studio.canvas import CanvasPanel, header_text, tooltip_html
from diffuse.studio.causal_views import WindowView
from diffuse.studio.chat import ChatPanel, answer_meta
from diffuse.studio.conversations import Message
from diffuse.studio.run_state import RunState, counted, decoding_text


@pytest.fixture(scope="module")
def nemotron(tmp_path_factory):
    return diffuse.load(str(agreeable_nemotron(tmp_path_factory.mktemp("agreeable"))), threads=1)


@pytest.fixture(scope="module")
def runs(nemotron) -> dict[str, RunState]:
    """The tiny model's default scheduler is a threshold rule (confidence_threshold): its own
    diffusion keeps it, the causal modes do not use it."""
    return {mode: causal_run(nemotron, mode, draft_length=8) for mode in ("ar", "self_spec", "diffusion")}


@pytest.fixture
def wedlm() -> RunState:
    rec = wedlm_recording()
    rec.options["scheduler"] = "confidence_threshold"    # set in Settings, but WeDLM's window ignores it
    return RunState.from_recording(rec)


def note(run: RunState) -> str:
    return ChatPanel._answer_note(Message("assistant", "x", answer_meta(run)), set())


def test_no_threshold_rule_is_claimed_where_none_decided(runs, wedlm):
    assert runs["diffusion"].options["scheduler"] == "confidence_threshold"
    assert runs["diffusion"].rule is not None and runs["diffusion"].rule.condition() == "confidence ≥ 0.9"
    for run in (runs["ar"], runs["self_spec"], wedlm):
        assert run.options["scheduler"] == "confidence_threshold" and run.rule is None
        assert not run.by_threshold.any()             # no corner marks on the canvas
        for k in range(run.n_steps):
            assert "τ" not in run.commits_text(k) and "confidence ≥" not in header_text(run, k)
    # WeDLM's own rule, from its options (here the model's defaults: the recording left them out)
    assert wedlm.window_rule_text() == ("fills the masks whose entropy + 0.02 × distance to the first mask < 0.4 "
                                        "nats, at least one")
    wedlm.recording.options.update(threshold=0.7, pos_penalty=0.05)
    assert "entropy + 0.05 × distance to the first mask < 0.7 nats" in header_text(wedlm, 0)


def test_a_chat_answer_names_its_mode_or_window_not_the_scheduler(runs, wedlm):
    assert " · self-speculation, draft blocks of 8 · " in note(runs["self_spec"])
    assert " · AR decode · " in note(runs["ar"])
    assert " · confidence_threshold · " in note(runs["diffusion"])
    assert " · WeDLM, window 8<" in note(wedlm)       # the recording has no seed
    for run in (runs["ar"], runs["self_spec"], wedlm):
        assert "confidence_threshold" not in note(run)
    # answers kept before answers kept their architecture, and hostile ones, still read
    assert decoding_text({"scheduler": "low_confidence"}, None) == "low_confidence"
    assert decoding_text({"mode": ["ar"], "scheduler": "<b>"}, ["wedlm"]) == "<b>"
    hostile = Message("assistant", "x", {"options": {"scheduler": "<b>x</b>"}, "arch": {"a": 1}})
    assert "&lt;b&gt;x&lt;/b&gt;" in ChatPanel._answer_note(hostile, set())


def test_the_canvas_says_what_a_causal_step_is(qtbot, runs, wedlm):
    panel = CanvasPanel()
    qtbot.addWidget(panel)
    spec, ar = runs["self_spec"], runs["ar"]
    for run in (spec, ar, wedlm):
        panel.set_run(run)
        for k in range(run.n_steps):
            panel.show_step(k)
            said = panel.status.text()
            assert said == header_text(run, k) and "block" not in said
    assert header_text(spec, 0).startswith("step 1/") and "the prefill: the prompt's pass chose the first token" in \
        header_text(spec, 0)
    ev = spec.events[2]
    lo = ev.block_start - spec.prompt_length
    masked = int(ev.gen_mask.sum())
    assert (f"iteration 2: {counted(ev.block_end - ev.block_start - 1, 'draft')} after the seed at position {lo} · {masked} of "
            f"40 still masked · {len(ev.unmasked)} decided") in header_text(spec, 2)
    assert "AR decode: one token per pass at position 5 · 34 of 40 still masked · 1 decided" in header_text(ar, 5)
    ev = wedlm.events[3]
    lo, hi = ev.block_start - wedlm.prompt_length, ev.block_end - wedlm.prompt_length
    later = int(wedlm.not_started(3).sum())
    assert header_text(wedlm, 3).startswith(
        f"step 4/{wedlm.n_steps}, at most 31 passes (gen_length 24 + window 8 − 1) · window at positions {lo}–{hi - 1} · {int(ev.gen_mask.sum()) - later} masked in it, "
        f"{later} past it · {len(ev.unmasked)} filled, {len(ev.committed)} committed · fills the masks")
    # a cell's tooltip names no block either, and a position not reached says why
    k, i = 1, spec.gen_length - 1
    assert spec.not_started(k)[i]
    tip = tooltip_html(spec, k, i)
    assert "block" not in tip and "not reached yet: the causal pass decodes in text order" in tip
    i = int(np.flatnonzero(wedlm.not_started(0))[0])
    assert "past the window: not in a pass yet" in tooltip_html(wedlm, 0, i)


def test_a_block_diffusion_run_keeps_its_blocks(runs):
    run = runs["diffusion"]          # Nemotron's own diffusion: blocks of 32 over the causal cache
    assert header_text(run, 1).startswith(f"step 2/{run.n_steps} · block 1/2 · ")
    assert "later blocks" in header_text(run, 1) and "block 1/2" in tooltip_html(run, 1, 0)


def test_counts_agree_with_their_nouns_and_wedlm_says_its_budget(wedlm):
    """"1 drafts" was said of a one-draft iteration; WeDLM's "step k/31" had a budget nothing explained."""
    assert counted(1, "draft") == "1 draft" and counted(0, "draft") == "0 drafts" and counted(3, "pass") == "3 passes"
    assert wedlm.budget_text() == "at most 31 passes (gen_length 24 + window 8 − 1)"
    assert "at most 31 passes (gen_length 24 + window 8 − 1)" in WindowView().caption_text(wedlm, 0)
    wedlm.recording.options["window_size"] = 4      # a budget the formula does not give: the context's
    assert wedlm.budget_text() == "at most 31 passes (what the model's context leaves)"
    assert RunState().budget_text() == ""
