"""Compare makes the point it exists for: it fits the screen, one slider moves both runs, both
share one seed, and each pair's headline states what its runs measured (issue 28)."""
from __future__ import annotations

import numpy as np
import pytest
from PySide6.QtCore import QPoint, QRect

from diffuse.recording import Recording
from diffuse.studio import compare, compare_pairs
from diffuse.studio.compare_pairs import PRESETS, answer_diff, headline, summary_lines
from diffuse.studio.run_state import RunState
from layout_checks import layout_problems

SMALL = {"gen_length": 48, "steps": 24, "seed": 3}


def open_compare(window, model, pair: str, options=None):
    window.set_model(model)
    window.settings_panel.set_options(SMALL if options is None else options)
    window.open_compare()
    cmp = window.compare_window
    cmp.prompt.setText("Tell me about Mr. Darcy.")
    cmp.preset.setCurrentIndex(list(PRESETS).index(pair))
    return cmp


def run_pair(qtbot, cmp):
    cmp.start()
    qtbot.waitUntil(lambda: cmp.headline.isVisible(), timeout=60000)
    return cmp.runs


class _Screen:
    def __init__(self, rect: QRect):
        self.rect = rect

    def availableGeometry(self) -> QRect:
        return self.rect


@pytest.mark.parametrize("area", [QRect(0, 0, 1366, 740), QRect(0, 28, 1024, 672)])
def test_the_window_fits_the_screens_free_area_with_every_button_on_it(
        qtbot, window, demo_model, monkeypatch, area):
    # the screen's free area: 1366x768 and 1024x700 less a panel
    monkeypatch.setattr(compare.CompareWindow, "screen", lambda self: _Screen(area))
    cmp = open_compare(window, demo_model, "Entropy exit: τ off vs on")
    assert area.contains(cmp.geometry())
    assert cmp.minimumSizeHint().width() <= cmp.width()
    assert cmp.minimumSizeHint().height() <= cmp.height()
    run_pair(qtbot, cmp)
    qtbot.wait(50)
    for button in (cmp.run_button, cmp.stop_button, cmp.timeline.play_button):
        corner = button.mapTo(cmp, QPoint(button.width(), button.height()))
        assert cmp.rect().contains(corner), button.text()
    assert layout_problems(cmp) == []
    cmp.close()


def test_one_slider_moves_both_runs_and_a_shorter_run_says_where_it_ended(qtbot, window, demo_model):
    # dInfer's stop ends B at the first block holding end-of-text; A takes every step
    cmp = open_compare(window, demo_model, "Early end-of-text: none vs dInfer's",
                       {"gen_length": 64, "steps": 64, "seed": 4})   # a seed whose answer ends early
    a, b = run_pair(qtbot, cmp)
    assert b.n_steps < a.n_steps
    cmp.timeline.slider.setValue(b.n_steps // 2)
    canvases = [side.canvas.canvas for side in cmp.sides]
    assert [c.step for c in canvases] == [b.n_steps // 2] * 2
    assert cmp.sides[1].step_info.text().startswith(f"step {b.n_steps // 2 + 1}/{b.n_steps}:")
    assert " ms · " in cmp.sides[0].step_info.text() and "rows computed" in cmp.sides[0].step_info.text()
    assert cmp.timeline.label.text() == f"step {b.n_steps // 2 + 1}/{a.n_steps}"
    cmp.timeline.slider.setValue(2)      # the answer text follows the slider: masks still open
    assert all("░" in side.text.toPlainText() for side in cmp.sides)
    cmp.timeline.slider.setValue(a.n_steps - 1)         # past B's end
    assert canvases[0].step == a.n_steps - 1 and canvases[1].step == b.n_steps - 1
    assert cmp.sides[1].step_info.text() == (f"B ended after {b.n_steps} steps: past its end, "
                                             f"its final state")
    assert cmp.sides[0].step_info.text().startswith(f"step {a.n_steps}/{a.n_steps}:")
    cmp.close()


@pytest.mark.parametrize("settings_seed", [None, 11])
def test_both_runs_take_one_seed_and_the_window_shows_it(qtbot, window, demo_model, settings_seed):
    cmp = open_compare(window, demo_model, "Temperature: 0 vs 0.8", {**SMALL, "seed": settings_seed})
    a, b = run_pair(qtbot, cmp)
    assert a.options["seed"] == b.options["seed"] == cmp.seed
    assert f"seed {cmp.seed}" in cmp.context.text()
    if settings_seed is None:
        assert "drawn for this pair" in cmp.context.text()
        first = cmp.seed
        run_pair(qtbot, cmp)           # another pair, another seed, again one for both
        assert cmp.runs[0].options["seed"] == cmp.runs[1].options["seed"] == cmp.seed != first
    else:
        assert cmp.seed == 11 and "(the Settings')" in cmp.context.text()
    cmp.close()


def test_tau_that_never_fires_says_why_and_the_answers_agree(qtbot, window, demo_model):
    # greedy, the demo model is never that sure (at 1.5 nats): B decides what A decides
    cmp = open_compare(window, demo_model, "Entropy exit: τ off vs on",
                       {"gen_length": 64, "steps": 64, "seed": 3, "temperature": 0.0})
    a, b = run_pair(qtbot, cmp)
    point = cmp.headline.text()
    assert point.startswith("B's τ (entropy < 1.5 nats) never fired on this model")
    assert "nats at the lowest" in point
    lines = cmp.summary.text().splitlines()
    assert lines[-1].startswith("Answers: identical")
    assert a.result.steps == b.result.steps
    # A's tau is off by design: no line says it "never fired"
    assert not any(line.startswith("A (") for line in lines)
    cmp.close()


def test_tau_that_fires_is_the_headline_and_the_answers_line_says_where_they_parted(
        qtbot, window, demo_model):
    cmp = open_compare(window, demo_model, "Confidence threshold (low_confidence_dynamic): τ off vs on",
                       {"gen_length": 48, "steps": 24, "seed": 3, "temperature": 0.0})
    a, b = run_pair(qtbot, cmp)
    saved = a.result.steps - b.result.steps
    assert saved > 0 and np.nansum(b.n_extra) > 0
    assert cmp.headline.text().startswith(f"B (τ on) took {saved} fewer steps than A (τ off)")
    answers = cmp.summary.text().splitlines()[-1]
    diff = answer_diff(a, b)
    if diff.any():
        assert answers.startswith(f"Answers: differ at {int(diff.sum())} of")
        assert "the runs parted" in answers and "B's τ decided positions" in answers
        assert "temperature" not in answers                 # greedy: no noise to blame
    else:
        assert answers.startswith("Answers: identical")
    cmp.close()


def test_the_cache_pair_is_about_time_per_step_over_the_same_steps(qtbot, window, demo_model):
    cmp = open_compare(window, demo_model, "Inter-step cache: on vs off")
    a, b = run_pair(qtbot, cmp)
    # both run the whole schedule: an answer that ends sooner cannot make the cache look slower
    assert a.options["eos_stop"] == b.options["eos_stop"] == "none"
    assert "eos_stop none" in cmp.context.text()
    assert a.result.steps == b.result.steps == a.result.steps_allowed
    assert "fewer" not in cmp.summary.text().splitlines()[0]
    point = cmp.headline.text()
    assert "per step" in point and "Steps" not in point
    n = len(a.events[0].tokens)
    # the rows each step computed, whichever way the timing came out (one run may have been slowed)
    if point.startswith("No clear difference"):
        assert "computed" in point and f"and B's {n}" in point
    else:
        assert f"B {n} of {n} computed" in point and f"of {n} computed, " in point   # A: some from the cache
    assert {k: v for k, v in a.options.items() if k != "cache"} == \
        {k: v for k, v in b.options.items() if k != "cache"}
    cmp.close()


def test_a_pair_holds_the_model_from_a_to_b_so_no_chat_starts_between(qtbot, window, fake_model):
    # the engine is free between A's end and B's start: the run controller is not
    window.set_model(fake_model(step_delay=0.02))
    window.open_compare()
    cmp = window.compare_window
    cmp.prompt.setText("Tell me about Mr. Darcy.")
    between = []

    def try_a_chat(busy: bool) -> None:
        a = cmp.runs[0]
        if not busy and a.done and cmp.runs[1].result is None and not between:
            between.append(window.runs.refusal("chat"))
            window.generate("asked between A and B")
            between.append(window.live)
    window.engine.busy_changed.connect(try_a_chat)
    cmp.start()
    assert window.runs.holder == "compare" and cmp.stop_button.isEnabled()
    assert not window.chat.generate_button.isEnabled()
    assert "A comparison is running" in window.chat.generate_button.toolTip()
    assert not window.generate_action.isEnabled()
    qtbot.waitUntil(lambda: cmp.headline.isVisible(), timeout=60000)
    assert between[0].startswith("A comparison is running") and between[1] is None
    assert "A comparison is running" in window.chat.view.toPlainText()
    assert window.chat.conversation.messages == []
    a, b = cmp.runs
    assert a.result is not None and b.result is not None
    assert window.runs.holder is None and window.chat.generate_button.isEnabled()
    assert not cmp.stop_button.isEnabled() and cmp.run_button.isEnabled()
    cmp.close()


def test_compare_waits_for_a_chat_run_and_says_why(qtbot, window, fake_model):
    window.set_model(fake_model(step_delay=0.05))
    window.open_compare()
    cmp = window.compare_window
    cmp.prompt.setText("Tell me about Mr. Darcy.")
    window.chat.prompt.setPlainText("Tell me about Mr. Darcy.")
    window.chat.submit()
    assert window.runs.holder == "chat"
    assert not cmp.run_button.isEnabled() and "A chat answer is running" in cmp.run_button.toolTip()
    cmp.start()                        # Enter in the prompt box: refused, nothing queued
    assert cmp.runs == [] and window.runs.holder == "chat"
    with qtbot.waitSignal(window.engine.run_finished, timeout=20000):
        pass
    assert cmp.run_button.isEnabled() and cmp.run_button.toolTip() == "Run A, then B"
    cmp.close()


def test_the_titles_keep_the_pair_that_ran_when_the_menu_moves_on(qtbot, window, demo_model):
    cmp = open_compare(window, demo_model, "Inter-step cache: on vs off")
    run_pair(qtbot, cmp)
    cmp.preset.setCurrentIndex(list(PRESETS).index("Temperature: 0 vs 0.8"))
    assert cmp.sides[0].title.text() == "A · cache on"
    assert cmp.sides[1].title.text() == "B · cache off"
    cmp.close()


# -- the headlines, from runs whose timings are set -------------------------------------------

def _pair_of_runs(demo_run, a_options, b_options):
    return (RunState.from_recording(demo_run(**a_options)),
            RunState.from_recording(demo_run(**b_options)))


def _timed(run, ms):
    run.step_ms[:run.n_steps] = ms
    return run


def test_a_time_headline_says_which_is_faster_only_when_the_times_tell(demo_run):
    base = {"gen_length": 48, "steps": 24, "seed": 3, "eos_stop": "none"}
    pair = PRESETS["Inter-step cache: on vs off"]
    a, b = _pair_of_runs(demo_run, {**base, "cache": True}, {**base, "cache": False})
    said = headline(_timed(a, 2.0), _timed(b, 5.0), pair)
    assert said.startswith("A (cache on) is 2.5x faster per step: 2.0 ms against 5.0 ms")
    assert "likely slowed" not in said
    # A did less work and yet was slower: the machine, not the cache
    said = headline(_timed(a, 5.0), _timed(b, 2.0), pair)
    assert said.startswith("B (cache off) is 2.5x faster") and "run the pair again" in said
    # the same time for far fewer rows: the model is too small for the saving to show
    said = headline(_timed(a, 2.0), _timed(b, 2.1), pair)
    assert said.startswith("No clear difference per step (2.0 ms against 2.1 ms")
    assert "A's steps computed" in said and "a larger model shows it" in said
    # the same work and the same time
    c, d = _pair_of_runs(demo_run, {**base, "cache": True}, {**base, "cache": True})
    said = headline(_timed(c, 2.0), _timed(d, 2.1), pair)
    assert "about the same work" in said and "larger model" not in said


def test_answers_are_compared_up_to_the_end_of_text(demo_run):
    base = {"gen_length": 64, "steps": 64, "seed": 4}   # a seed whose answer ends early
    pair = PRESETS["Early end-of-text: none vs dInfer's"]
    a, b = _pair_of_runs(demo_run, {**base, "eos_stop": "none"}, {**base, "eos_stop": "holds_eos"})
    assert b.result.steps < a.result.steps
    assert a.differs_from(b).any()              # past the end: A's padding, B's masks
    assert not answer_diff(a, b).any()
    lines = summary_lines(a, b, pair)
    assert lines[-1].startswith("Answers: identical")
    assert headline(a, b, pair).startswith(f"B (dInfer's stop) took {a.result.steps - b.result.steps} "
                                           f"fewer steps")


def test_every_pair_names_its_effect_and_what_both_runs_share():
    for name, pair in PRESETS.items():
        assert pair.effect in (compare_pairs.STEPS, compare_pairs.TIME, compare_pairs.ANSWER,
                               compare_pairs.SPEC), name
        assert len(pair.names) == 2 and pair.cause, name
        if pair.effect == compare_pairs.TIME:      # every step in both: whole runs compare
            assert pair.shared == {"eos_stop": "none"} and "whole times compare" in pair.shared_text()


def test_compare_takes_the_users_prompt_not_a_served_requests_template(qtbot, window, fake_model, recorded_run,
                                                                       tmp_path):
    """A served request's prompt is its templated text: Compare's Run would wrap it in the chat
    template again, also when the request is reopened from its recording. A run of the user's gives
    its message as asked."""
    window.set_model(fake_model())
    templated = "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    served = RunState(templated, {"seed": 1}, window.model_info(), window.engine.model.tokenizer.decode,
                      templated=True)
    window.runs.served = (object(), served)          # as _served_step follows a request
    for run in (served, None):
        if run is None:                               # saved, then reopened as a recording
            path = tmp_path / "served.npz"
            rec = recorded_run("eos")
            rec.prompt, rec.templated = templated, True
            rec.save(path)
            run = RunState.from_recording(Recording.load(path))
            assert run.recording.templated
        window.show_run(run)
        window.open_compare()
        assert window.compare_window.prompt.text() == ""
        window.compare_window.close()
    window.show_run(RunState.from_recording(recorded_run("eos")))
    window.open_compare()
    assert window.compare_window.prompt.text() == window.run.prompt != ""


def test_a_sides_speed_counts_the_answers_tokens_not_the_end_of_text_padding(qtbot, recorded_run):
    """A run that ended its answer early (self-speculation stops at end-of-text in a long buffer) read
    as thousands of tokens per second when the padding counted."""
    run = RunState.from_recording(recorded_run("eos"))
    res = run.result
    assert 0 < res.useful_length < res.gen_length
    side = compare._Side("A")
    qtbot.addWidget(side)
    side.set_run(run)
    side.show_step(run.n_steps - 1)
    assert f" · {res.useful_tokens_per_s:.1f} answer tok/s · " in side.stats.text()
    assert f"{res.buffer_tokens_per_s:.1f}" not in side.stats.text()
