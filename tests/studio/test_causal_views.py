"""The views of decoding over a causal cache (studio/causal_views.py): self-speculation's iterations
from a real run of a tiny Nemotron-Labs-Diffusion look-alike, WeDLM's window from made-up events
(tests/studio/causal_runs.py), both drawn the same live and replayed from a file; their tabs in the
main window; their recordings, old and hostile."""
from __future__ import annotations

import numpy as np
import pytest
from causal_runs import agreeable_nemotron, causal_run, wedlm_recording
from conftest import recorded
from test_studio_recording import assert_events_equal

from PySide6.QtGui import QTextDocumentFragment

import diffuse
from diffuse import DiffuseError
from diffuse.recording import Recording
from diffuse.studio.causal_views import SPEC_OTHER, SPEC_PREFILL, SpecView, WindowView
from diffuse.studio.run_controller import ARCost, ar_cost_of
from diffuse.studio.run_state import RunState


@pytest.fixture(scope="module")
def nemotron(tmp_path_factory):
    return diffuse.load(str(agreeable_nemotron(tmp_path_factory.mktemp("agreeable"))), threads=1)


@pytest.fixture(scope="module")
def spec_run(nemotron) -> RunState:
    return causal_run(nemotron, "self_spec", draft_length=8)


@pytest.fixture(scope="module")
def ar_run(nemotron) -> RunState:
    return causal_run(nemotron, "ar")


def shown(view) -> str:
    """The caption as the user reads it (it is rich text: a link to measure AR)."""
    return QTextDocumentFragment.fromHtml(view.caption.text()).toPlainText()


def replayed(run: RunState, tmp_path) -> RunState:
    """`run` written to a file and read back, as File > Open shows it."""
    run.recording.save(tmp_path / "run.npz")
    return RunState.from_recording(Recording.load(tmp_path / "run.npz"))


def test_each_iteration_shows_its_draft_kept_rejected_and_bonus(qtbot, spec_run):
    view = SpecView()
    qtbot.addWidget(view)
    view.set_run(spec_run)
    styles_seen = set()
    for k, ev in enumerate(spec_run.events):
        view.show_step(k)
        if ev.spec_draft is None:       # the prefill
            assert view.strip.lanes == [] and view.strip.message == SPEC_PREFILL
            continue
        (_, top), (_, bottom) = view.strip.lanes
        draft, a, s = ev.spec_draft, ev.spec_accepted, ev.block_start
        assert [c.style for c in top[:a + 1]] == ["seed"] + ["draft"] * a
        assert [c.style for c in bottom[:a + 1]] == ["seed"] + ["accepted"] * a
        assert [c.text for c in bottom[1:a + 1]] == [c.text for c in top[1:a + 1]]
        bonus = ev.tokens[s + a + 1]
        assert bottom[a + 1].style == "bonus" and f"{spec_run.piece(int(bonus))!r}" in bottom[a + 1].tip
        if a + 1 < len(draft):          # the first rejected, then drafts nobody kept
            assert top[a + 1].style == "rejected" and draft[a + 1] != bonus
            assert {c.style for c in top[a + 2:]} <= {"discarded"} and {c.style for c in bottom[a + 2:]} <= {""}
        else:                           # every draft kept: the bonus follows them, under no draft
            assert top[-1].style == "" and len(bottom) == len(draft) + 1
        styles_seen |= {c.style for c in top + bottom}
        assert f"kept {a} of {len(draft) - 1} drafts" in shown(view)
    assert {"accepted", "rejected", "bonus"} <= styles_seen       # the tiny model keeps some, not all


def test_the_figures_count_passes_and_tokens_against_ar(qtbot, spec_run, ar_run):
    view = SpecView(lambda run: ar_cost_of(ar_run))
    qtbot.addWidget(view)
    view.set_run(spec_run)
    view.show_step(-1)
    f = view.figures(spec_run, spec_run.n_steps - 1)
    # after the prefill (one pass, one token here): the run's passes and tokens less those
    assert f.passes == spec_run.result.forward_passes - 1 and f.tokens == spec_run.gen_length - 1 == 39
    saved = f.tokens - f.passes
    lines = shown(view).splitlines()
    assert "measure AR here" not in lines[2]        # measured already
    assert f"{f.tokens} tokens / {f.passes} passes" in lines[1]
    assert (f"{saved} passes fewer than AR" if saved > 0 else f"{-saved} passes more than AR") in lines[1]
    cost = ar_cost_of(ar_run)
    assert cost.steps == ar_run.n_steps - 1 == 39      # the prefill left out
    assert f"vs AR's {cost.ms_per_token:.2f}" in lines[2] and "x AR's speed" in lines[2]
    # the speed is AR's measured cost per token over this run's: iterations only, the prefill left out
    ms = sum(e.total_ms for e in spec_run.events[1:]) / f.tokens
    assert f"{ms:.2f} ms/token" in lines[2]


def test_without_an_ar_run_the_speed_is_not_guessed(qtbot, spec_run):
    view = SpecView(lambda run: None)
    qtbot.addWidget(view)
    view.set_run(spec_run)
    view.show_step(3)
    assert shown(view).endswith("AR's not measured on this model yet · measure AR here")


def test_ar_cost_comes_only_from_finished_ar_runs(spec_run, ar_run):
    assert ar_cost_of(spec_run) is None and isinstance(ar_cost_of(ar_run), ARCost)
    n = ar_run.n_steps       # the steps after the prefill, one token each: their mean, as the spec run's
    assert ar_cost_of(ar_run).ms_per_token == pytest.approx(ar_run.step_ms[1:n].sum() / (n - 1))


def test_a_replay_draws_what_the_live_run_drew(qtbot, spec_run, tmp_path):
    again = replayed(spec_run, tmp_path)
    assert_events_equal(spec_run.events, again.events)
    live, replay = SpecView(), SpecView()
    for view, run in ((live, spec_run), (replay, again)):
        qtbot.addWidget(view)
        view.set_run(run)
    for k in range(spec_run.n_steps):
        live.show_step(k)
        replay.show_step(k)
        assert live.strip.lanes == replay.strip.lanes and shown(live) == shown(replay)


def test_other_runs_say_what_the_view_needs(qtbot, ar_run):
    view = SpecView()
    qtbot.addWidget(view)
    view.set_run(RunState.from_recording(recorded("blocks_cache")))
    assert view.strip.message == SPEC_OTHER.format(mode="diffusion") and not view.plot.isVisible()
    view.set_run(ar_run)
    assert view.strip.message == SPEC_OTHER.format(mode="ar")
    window = WindowView()
    qtbot.addWidget(window)
    window.set_run(ar_run)
    assert "no sliding window" in window.strip.message


def test_the_window_shows_commits_fills_and_masks_in_both_orders(qtbot, tmp_path):
    run = RunState.from_recording(wedlm_recording())
    view = WindowView()
    qtbot.addWidget(view)
    view.set_run(run)
    committed_seen = 0
    for k, ev in enumerate(run.events):
        view.show_step(k)
        (_, text_order), (_, pass_order) = view.strip.lanes
        window = list(range(ev.block_start, ev.block_end))
        order = ev.window_order.tolist()
        assert len(text_order) == len(pass_order) == len(window)
        # pass order: each cell is the same position as in text order, marked with its answer position
        assert [c.mark for c in pass_order] == [f"@{pos - ev.prompt_length}" for pos in order]
        assert [c.mark for c in text_order] == [f"#{order.index(pos) + 1}" for pos in window]
        for pos, cell in zip(window, text_order):
            want = ("committed" if pos in ev.committed else "mask" if ev.mask[pos] else "filled")
            assert cell.style == want and cell.ring == (pos in ev.unmasked)
        # the committed lead the pass, then the other filled ones, then the masks (those it filled among them)
        states = ["mask" if c.ring else c.style for c in pass_order]
        assert states == sorted(states, key=["committed", "filled", "mask"].index)
        committed_seen += len(ev.committed)
        assert f"{len(ev.committed)} committed at this step" in shown(view)
    assert committed_seen == run.gen_length
    again = replayed(run, tmp_path)
    assert_events_equal(run.events, again.events)


def test_older_recordings_load_without_drafts_or_windows():
    for ev in recorded("blocks_cache").events:
        assert ev.spec_draft is None and ev.spec_accepted == -1 and ev.window_order is None and ev.committed is None


@pytest.mark.parametrize("edit, message", [
    (lambda a: a.__setitem__("step_spec_accepted", np.full_like(a["step_spec_accepted"], 8)), "more drafts kept"),
    (lambda a: a.pop("spec_draft_offsets"), "expected both"),
    (lambda a: a["spec_draft_values"].__setitem__(0, -5), "out of range"),
])
def test_a_damaged_self_speculation_recording_is_refused(spec_run, tmp_path, edit, message):
    spec_run.recording.save(tmp_path / "run.npz")
    arrays = dict(np.load(tmp_path / "run.npz"))
    edit(arrays)
    np.savez(tmp_path / "bad.npz", **arrays)
    with pytest.raises(DiffuseError, match=message):
        Recording.load(tmp_path / "bad.npz")


@pytest.mark.parametrize("edit, message", [
    (lambda a: a["window_order_values"].__setitem__(0, 10_000), "out of range"),
    (lambda a: a.pop("committed_values"), "expected both"),
    (lambda a: a.__setitem__("window_order_offsets", np.zeros_like(a["window_order_offsets"])),
     "do not split"),
])
def test_a_damaged_window_recording_is_refused(tmp_path, edit, message):
    wedlm_recording().save(tmp_path / "run.npz")
    arrays = dict(np.load(tmp_path / "run.npz"))
    edit(arrays)
    np.savez(tmp_path / "bad.npz", **arrays)
    with pytest.raises(DiffuseError, match=message):
        Recording.load(tmp_path / "bad.npz")


def test_the_main_window_has_both_tabs_and_holds_spec_against_its_ar_run(qtbot, window, spec_run, ar_run):
    names = [window.views.tabText(i) for i in range(window.views.count())]
    assert "Self-speculation" in names and "WeDLM window" in names
    window.engine.run_finished.emit(ar_run)         # as the engine says a run ended: the controller notes AR's cost
    assert window.runs.ar_cost(spec_run) == ar_cost_of(ar_run)
    window.show_run(spec_run)
    window.views.setCurrentWidget(window.spec_view)
    window.show_step(2)
    qtbot.waitUntil(lambda: bool(window.spec_view.strip.lanes))
    assert "x AR's speed" in shown(window.spec_view)
    window.show_run(RunState.from_recording(wedlm_recording()))
    window.views.setCurrentWidget(window.window_view)
    window.show_step(3)
    qtbot.waitUntil(lambda: bool(window.window_view.strip.lanes))


def test_a_draft_of_one_row_is_the_seed_and_its_bonus(qtbot, nemotron):
    run = causal_run(nemotron, "self_spec", draft_length=1, gen_length=12)
    view = SpecView()
    qtbot.addWidget(view)
    view.set_run(run)
    view.show_step(2)
    (_, top), (_, bottom) = view.strip.lanes
    assert [c.style for c in top] == ["seed", ""] and [c.style for c in bottom] == ["seed", "bonus"]
    f = view.figures(run, run.n_steps - 1)
    assert f.passes == run.result.forward_passes - 1 == f.tokens == 11     # a verify pass per token, no draft pass
    assert "1 pass of 1 row," in shown(view)


def test_steps_of_a_server_that_sends_no_drafts_say_so(qtbot, spec_run):
    from diffuse.studio.causal_views import SPEC_UNSENT
    events = [ev.__class__(**{**ev.__dict__, "spec_draft": None, "spec_accepted": -1}) for ev in spec_run.events]
    run = RunState.from_recording(Recording(prompt="x", options=dict(spec_run.options), events=events,
                                            result=spec_run.result, model=spec_run.recording.model))
    view = SpecView()
    qtbot.addWidget(view)
    view.set_run(run)
    view.show_step(0)
    assert view.strip.message == SPEC_PREFILL
    view.show_step(3)
    assert view.strip.message == SPEC_UNSENT and not view.plot.isVisible()


def test_nothing_is_cut_in_either_view_at_1024x700(qtbot, window, spec_run):
    """Nothing cut, the plot tall enough to read (it was a 40-pixel sliver: the view scrolls
    instead), and every cell of a 20-position window shown whole, its "@n" marks too."""
    from layout_checks import layout_problems
    from test_layout import _at_1024x700
    from diffuse.studio.causal_views import PLOT_HEIGHT
    _at_1024x700(qtbot, window)
    wedlm = RunState.from_recording(wedlm_recording(gen_length=130, window=20))
    # the last whole window of 20, at answer positions past 100 ("@126" was cut)
    late = max(k for k, e in enumerate(wedlm.events) if e.block_end - e.block_start == 20)
    assert wedlm.events[late].block_end - wedlm.prompt_length > 110
    for run, view, steps in ((spec_run, window.spec_view, (0, 2, spec_run.n_steps - 1)),
                             (wedlm, window.window_view, (0, 2, wedlm.n_steps - 1, late))):
        window.show_run(run)
        window.timeline.stop()
        window.views.setCurrentWidget(view)
        for k in steps:
            window.show_step(k)
            window.refresh(), window.refresh()        # the canvas, then the view
            qtbot.wait(20)                             # layouts settle
            assert layout_problems(window) == [], (view, k)
            assert view.plot.height() >= PLOT_HEIGHT, (view, k)
            assert view.caption.geometry().top() > view.plot.geometry().bottom(), (view, k)   # not over the plot
            strip, seen = view.strip, view.scroll.viewport().rect()
            cells = sum(len([c for c in cells if c.style]) for _, cells in strip.lanes)
            assert len(strip._rects) == cells, (view, k)
            for r, cell in strip._rects:
                assert seen.contains(strip.mapTo(view.scroll.viewport(), r.bottomRight().toPoint())), (view, k, cell)
                assert strip._metrics()[1].horizontalAdvance(cell.mark) <= r.width() - 4, cell.mark
    assert sum(len(cells) for _, cells in view.strip.lanes) == 40       # the late window, both lanes whole


def test_a_replay_names_drafts_that_occur_nowhere_else(qtbot, spec_run, tmp_path):
    """A rejected draft's token may never be committed: its text is recorded all the same."""
    events = list(spec_run.events)
    k = next(i for i, e in enumerate(events) if e.spec_draft is not None and e.spec_accepted + 1 < len(e.spec_draft))
    a = events[k].spec_accepted
    draft = events[k].spec_draft.copy()
    draft[a + 1] = 250                      # a token the run never commits
    events[k] = events[k].__class__(**{**events[k].__dict__, "spec_draft": draft})
    assert 250 not in np.concatenate([e.tokens for e in events])
    run = RunState(spec_run.prompt, spec_run.options, spec_run.recording.model, decode=spec_run._decode)
    for e in events:
        run.add(e)
    run.finish(spec_run.result)
    view = SpecView()
    qtbot.addWidget(view)
    view.set_run(replayed(run, tmp_path))
    view.show_step(k)
    rejected = view.strip.lanes[0][1][a + 1]
    assert rejected.style == "rejected" and repr(spec_run.piece(250)) in rejected.tip and "<250>" not in rejected.tip


def test_measure_ar_here_runs_a_short_ar_run_and_the_view_holds_spec_against_it(qtbot, window, nemotron, spec_run):
    from diffuse.studio.run_controller import AR_MEASURE_TOKENS
    window.set_model(nemotron)
    window.show_run(spec_run)
    window.timeline.stop()
    window.views.setCurrentWidget(window.spec_view)
    qtbot.waitUntil(lambda: shown(window.spec_view).endswith("measure AR here"))
    with qtbot.waitSignal(window.engine.run_finished, timeout=30000) as done:
        window.spec_view.caption.linkActivated.emit("measure")
        assert window.runs.holder == "measure" and not window.generate_action.isEnabled()
    measured = done.args[0]
    assert measured.options["mode"] == "ar" and measured.n_steps == AR_MEASURE_TOKENS
    assert measured.events[0].tokens[:measured.prompt_length].tolist() == \
        spec_run.events[0].tokens[:spec_run.prompt_length].tolist()     # after the run's own prompt
    assert window.runs.holder is None and window.runs.ar_cost(spec_run) == ar_cost_of(measured)
    qtbot.waitUntil(lambda: "x AR's speed" in shown(window.spec_view))
    assert window.run is spec_run            # the measurement is not shown in place of the run
    assert window.statusBar().currentMessage().startswith("AR on this model: ")


def test_a_stopped_measurement_says_so_and_measures_nothing(qtbot, window, nemotron, spec_run):
    window.set_model(nemotron)
    with qtbot.waitSignal(window.runs.ar_measured, timeout=30000) as done:
        window.measure_ar(spec_run)
        window.stop_action.trigger()          # Cancel, as for any run
    assert done.args == [None] and window.runs.holder is None and window.runs.ar_cost(spec_run) is None
    assert window.statusBar().currentMessage() == "the measurement of AR decoding was stopped"


def test_measure_ar_needs_the_runs_own_model(qtbot, window, fake_model, spec_run):
    window.set_model(fake_model())
    window.measure_ar(spec_run)
    assert window.runs.holder is None and not window.engine.busy
    assert "load it first" in window.statusBar().currentMessage()
