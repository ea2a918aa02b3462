"""Every place that names a step agrees: the slider, the timeline's label, the canvas header,
the cell tooltips and the status bar; the view plays only when the play button says so, and a
paced live view says how far behind the engine it is."""
from __future__ import annotations

import numpy as np
from PySide6.QtCore import QPoint, Qt

from diffuse.studio import main_window
from diffuse.studio.canvas import tooltip_html
from diffuse.studio.run_state import RunState

SMALL = {"gen_length": 48, "steps": 24, "block_length": 16, "threads": 1}


def fresh_run(qtbot, window, model, pace_ms=60):
    """A run generated and watched to its end, as a user sees it afterwards."""
    window.set_model(model)
    window.settings_panel.set_options(SMALL)
    window.timeline.pace.setValue(pace_ms)
    window.chat.prompt.setPlainText("watch this")
    with qtbot.waitSignal(window.engine.run_finished, timeout=10000) as done:
        window.chat.submit()
    window.stop_replay_action.trigger()   # its automatic replay is not what these tests watch
    qtbot.waitUntil(lambda: window.timeline.step() == done.args[0].n_steps - 1)
    return done.args[0]


def test_a_click_on_the_groove_or_home_does_not_play_the_view(qtbot, window, fake_model):
    fresh_run(qtbot, window, fake_model(step_delay=0))
    timeline, slider = window.timeline, window.timeline.slider
    slider.setFocus()
    qtbot.keyClick(slider, Qt.Key.Key_Home)
    assert timeline.step() == 0
    for _ in range(4):                    # redraws: the view stays where the user put it
        window.refresh()
    assert not timeline.playing and not timeline.play_button.isChecked()
    # a click on the groove right of the handle: a page on, and no more
    qtbot.mouseClick(slider, Qt.MouseButton.LeftButton,
                     pos=QPoint(slider.width() - 4, slider.height() // 2))
    shown = timeline.step()
    assert 0 < shown
    for _ in range(4):
        window.refresh()
    assert timeline.step() == shown and not timeline.playing
    qtbot.keyClick(slider, Qt.Key.Key_End)             # back at the newest step: following it
    assert timeline.follow and timeline.step() == slider.maximum()


def test_the_label_and_the_header_show_the_slider_s_step_as_it_moves(qtbot, window, fake_model):
    run = fresh_run(qtbot, window, fake_model(step_delay=0))
    seen = []

    def check(value):
        seen.append((value, window.timeline.label.text(), window.canvas_panel.status.text()))
    window.timeline.slider.valueChanged.connect(check)    # after the window's own handler
    window.timeline.play()
    qtbot.waitUntil(lambda: not window.timeline.playing, timeout=10000)
    assert len(seen) == run.n_steps
    for value, label, header in seen:
        shown = run.step_label(value)
        assert label.startswith(shown) and header.startswith(shown + " · "), (value, label, header)


def test_tooltips_count_steps_as_the_header_does(recorded_run):
    run = RunState.from_recording(recorded_run("blocks_cache"))
    i = int(np.flatnonzero(run.decided_step == 11)[0])        # decided by the 12th step
    k = 11                                                    # the event of that step
    assert run.events[k].step == 11 and run.step_label(k).startswith("step 12/")
    assert run.events[k - 1].gen_mask[i] and not run.events[k].gen_mask[i]
    assert "will be decided at step 12" in tooltip_html(run, k - 1, i)
    assert "decided at step 12" in tooltip_html(run, k, i)
    assert "will be" not in tooltip_html(run, k, i)


def test_a_stream_of_steps_does_not_starve_the_status_bar(qtbot, window, fake_model, monkeypatch):
    run = fresh_run(qtbot, window, fake_model(step_delay=0))
    # a live run whose steps arrive faster than the redraw timer: every redraw finds the canvas
    # dirty again, and the plots and the status bar must still get their turn (here at every
    # other redraw: the plots' own interval is a matter of time, left out)
    monkeypatch.setattr(main_window, "PLOTS_INTERVAL_S", 0.0)
    live = RunState(run.prompt, run.options, run.recording.model)
    window.live = live
    window.show_run(live)
    for event in run.events[:12]:
        live.add(event)
        window._run_stepped(live)
        window.refresh()
    assert "12/" in window.run_label.text(), window.run_label.text()
    assert window.heatmap.step == window.timeline.step()


def test_a_paced_live_view_says_it_is_behind_the_engine(qtbot, window, fake_model):
    run = fresh_run(qtbot, window, fake_model(step_delay=0))
    live = RunState(run.prompt, run.options, run.recording.model)
    window.live = live
    window.show_run(live)
    window.timeline.pace.setValue(1000)            # one step a second: the engine runs ahead
    for event in run.events[:10]:
        live.add(event)
        window._run_stepped(live)
    for _ in range(2):
        window.refresh()
    assert window.timeline.step() < 9
    label = window.timeline.label.text()
    assert "live" not in label and f"{9 - window.timeline.step()} behind" in label, label
    assert "engine at step 10/" in window.run_label.text(), window.run_label.text()
    window.timeline.pace.setValue(0)               # unpaced: it shows the newest step, live
    window._mark_dirty()
    for _ in range(2):
        window.refresh()
    assert window.timeline.step() == 9 and window.timeline.label.text().endswith("· live")


def test_after_esc_the_steps_still_coming_are_shown_at_once(qtbot):
    from diffuse.studio.timeline import Timeline
    timeline = Timeline()
    qtbot.addWidget(timeline)
    timeline.pace.setValue(200)
    timeline.set_count(30)                 # paced: far behind the engine's 30 steps
    assert timeline.playing and timeline.step() < 29
    timeline.stop()                        # Esc: the newest step, no playback
    assert timeline.step() == 29 and not timeline.playing
    timeline.set_count(31)                 # the cancelled run ends its current step
    assert timeline.step() == 30 and not timeline.playing
    timeline.reset()                       # the next run is paced again
    timeline.set_count(40)
    assert timeline.playing and timeline.step() < 39
