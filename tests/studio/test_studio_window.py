"""The main window's flows: generate, stop, failures, replay, export, compare, responsiveness."""
from __future__ import annotations

import threading
import time
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from diffuse import DiffuseError
from diffuse.recording import Recording
from diffuse.studio import storage, theme
from diffuse.studio.main_window import MainWindow
from diffuse.studio.run_state import RunState

SMALL = {"gen_length": 48, "steps": 24, "block_length": 16, "threads": 1}


def generate(qtbot, window, prompt="Tell me about diffusion", timeout=20000):
    window.chat.prompt.setPlainText(prompt)
    with qtbot.waitSignal(window.engine.run_finished, timeout=timeout) as done:
        window.chat.generate_button.click()
    return done.args[0]


def test_bundled_fonts_are_registered(qapp):
    families = theme.register_fonts()
    assert theme.UI_FAMILY in families and theme.MONO_FAMILY in families
    assert qapp.font().family() == theme.UI_FAMILY


def test_generate_streams_steps_into_every_view(qtbot, window, fake_model):
    model = fake_model(step_delay=0.005)
    window.set_model(model)
    window.settings_panel.set_options(SMALL)
    steps_seen = []
    window.engine.run_stepped.connect(lambda run: steps_seen.append(run.n_steps))
    run = generate(qtbot, window)
    res = run.result
    # one step, one signal, in order; the engine ran on another thread
    assert steps_seen == list(range(1, res.steps + 1))
    assert model.threads_seen and threading.get_ident() not in model.threads_seen
    # auto options run, and are recorded, as the model's defaults: its recipe over its family's
    assert model.calls[0]["gen_length"] == 48 and model.calls[0]["scheduler"] == "low_confidence"
    assert model.calls[0]["temperature"] == 0.7 and run.options["block_length"] == 16
    qtbot.waitUntil(lambda: window.timeline.slider.maximum() == res.steps - 1)
    assert window.canvas_panel.canvas.run is run and window.heatmap.run is run
    qtbot.waitUntil(lambda: window.timeline.step() == res.steps - 1)   # paced: catches up
    # the answer is saved with its recording, which replays the same run
    answer = window.chat.conversation.messages[-1]
    assert answer.role == "assistant" and answer.text == res.text
    # written in the background, then linked
    qtbot.waitUntil(lambda: answer.meta["recording"] is not None, timeout=10000)
    assert Path(answer.meta["recording"]).exists()
    rec = Recording.load(answer.meta["recording"])
    assert len(rec.events) == res.steps and rec.prompt == "Tell me about diffusion"
    assert Path(answer.meta["recording"]).parent == storage.runs_dir()
    assert "done" in window.statusBar().currentMessage()


def test_gui_stays_responsive_during_a_run(qtbot, window, synthetic_model, gap_meter):
    window.set_model(synthetic_model(step_delay=0.015))     # larger than the demo model's runs
    window.settings_panel.set_options({"gen_length": 256, "steps": 256, "block_length": 64,
                                       "threads": 1})
    window.chat.prompt.setPlainText("a long answer please")
    for tab in (1, 2, 0):                   # every view has been shown once, as a user would
        window.views.setCurrentIndex(tab)
        qtbot.wait(50)
    with qtbot.waitSignal(window.engine.run_started, timeout=5000):
        window.chat.submit()
    gap_meter.start()
    with qtbot.waitSignal(window.engine.run_finished, timeout=60000) as done:
        for tab in (1, 2, 0):               # every view draws while steps arrive
            qtbot.wait(300)
            window.views.setCurrentIndex(tab)
        # enough ticks to measure, however late a loaded machine brings them; then the run stops
        qtbot.waitUntil(lambda: gap_meter.measured() or window.engine.run is None, timeout=60000)
        window.stop()
    gap_meter.stop()
    assert done.args[0].n_steps > 0
    gap_meter.assert_responsive()


def test_gap_meter_fails_a_wedged_gui(qtbot, gap_meter):
    gap_meter.start()
    qtbot.waitUntil(gap_meter.measured, timeout=30000)
    t0 = time.thread_time()
    while time.thread_time() - t0 < 0.3:      # the GUI thread busy for 300 ms, no event loop
        pass
    qtbot.wait(200)
    gap_meter.stop()
    with pytest.raises(AssertionError):
        gap_meter.assert_responsive()


def test_stop_cancels_within_a_step(qtbot, window, fake_model):
    window.set_model(fake_model(step_delay=0.05))
    window.settings_panel.set_options(SMALL)
    window.chat.prompt.setPlainText("stop me")
    with qtbot.waitSignal(window.engine.run_finished, timeout=20000) as done:
        window.chat.submit()
        qtbot.waitUntil(lambda: window.engine.run is not None and window.engine.run.n_steps >= 3)
        assert window.chat.stop_button.isEnabled() and window.stop_action.isEnabled()
        n_at_stop = window.engine.run.n_steps
        window.chat.stop_button.click()
    run = done.args[0]
    assert run.result.stop_reason == "cancelled"
    # the engine may be a step or two ahead of what the GUI had drawn when Stop was clicked
    assert run.result.steps <= n_at_stop + 3 < 24
    # the worker answers the very next step with False
    worker = window.engine._worker
    worker.stop_flag.set()
    assert worker._on_step(run.events[0]) is False
    assert not window.engine.busy and window.chat.generate_button.isEnabled()
    assert "stopped" in window.chat.view.toPlainText()


def test_a_failing_run_is_reported_not_fatal(qtbot, window, fake_model):
    class Broken(fake_model):
        def generate(self, prompt, **kw):
            raise DiffuseError("the prompt is too long for this model (4096 positions)")
    window.set_model(Broken())
    window.chat.prompt.setPlainText("hello")
    with qtbot.waitSignal(window.engine.run_failed, timeout=5000):
        window.chat.submit()
    assert "too long" in window.chat.view.toPlainText()
    assert not window.engine.busy and window.chat.generate_button.isEnabled()
    window.set_model(fake_model(step_delay=0))
    window.settings_panel.set_options(SMALL)
    assert generate(qtbot, window, "again").result.stop_reason == "done"


def test_multi_turn_prompts_go_in_as_the_templated_conversation(qtbot, window, fake_model):
    model = fake_model(step_delay=0)
    window.set_model(model)
    window.settings_panel.set_options(SMALL)
    generate(qtbot, window, "first")
    generate(qtbot, window, "second")
    tok = model.tokenizer
    assert model.calls[0]["prompt"] == tok.encode(tok.apply_chat_template(
        [{"role": "user", "content": "first"}])) and model.calls[0]["chat"] is True
    expected = tok.encode(tok.apply_chat_template(window.chat.conversation.chat_messages()[:3]))
    assert model.calls[1]["prompt"] == expected


def test_replay_scrub_and_play(qtbot, window, recorded_run, tmp_path):
    rec = recorded_run("blocks_cache")
    rec.save(tmp_path / "run.npz")
    assert window.open_recording(tmp_path / "run.npz")
    run = window.run
    assert run.n_steps == 24 and run.done and window.canvas_panel.canvas.run is run
    window.show_step(5)
    qtbot.waitUntil(lambda: window.canvas_panel.canvas.step == 5)
    window.timeline.forward()
    window.timeline.back()
    window.timeline.back()
    qtbot.waitUntil(lambda: window.canvas_panel.canvas.step == 4)
    window.show_step(5)
    qtbot.waitUntil(lambda: window.canvas_panel.canvas.step == 5)
    assert window.timeline.label.text() == "step 6/24"
    assert "step 6/24" in window.canvas_panel.status.text()
    window.timeline.play_button.setChecked(True)
    qtbot.waitUntil(lambda: not window.timeline.play_button.isChecked(), timeout=10000)
    assert window.timeline.step() == 23
    assert window.save_action.isEnabled()
    window.save_recording(tmp_path / "copy.npz")
    assert len(Recording.load(tmp_path / "copy.npz").events) == 24


def test_bad_recording_is_refused_politely(window, tmp_path):
    (tmp_path / "bad.npz").write_bytes(b"nope")
    assert not window.open_recording(tmp_path / "bad.npz")
    assert "bad.npz" in window.statusBar().currentMessage()
    assert window.run is None


def test_export_png_strip_and_gif(qtbot, window, recorded_run, tmp_path):
    rec = recorded_run("blocks_cache")
    rec.save(tmp_path / "run.npz")
    window.open_recording(tmp_path / "run.npz")
    done = []
    window.exported.connect(done.append)
    window.export_png(tmp_path / "strip.png")
    window.export_gif(tmp_path / "run.gif")
    qtbot.waitUntil(lambda: len(done) == 2, timeout=30000)      # drawn on worker threads
    assert sorted(done) == sorted([str(tmp_path / "strip.png"), str(tmp_path / "run.gif")])
    with Image.open(tmp_path / "strip.png") as png:
        assert png.width == 960 and png.height > 8 * 60
        pixels = np.asarray(png.convert("RGB"))
    assert len(np.unique(pixels.reshape(-1, 3), axis=0)) > 20       # colours, not a blank page
    with Image.open(tmp_path / "run.gif") as gif:
        assert gif.n_frames == 24 and gif.info["loop"] == 0
    assert not list(tmp_path.glob("*.part"))


def test_exports_use_the_colour_scale_on_screen(recorded_run):
    from diffuse.studio import export
    run = RunState.from_recording(recorded_run("blocks_cache"))
    last = run.n_steps - 1
    absolute, fitted = export.frame(run, last), export.frame(run, last, fitted=True)
    assert absolute.size() == fitted.size() and absolute != fitted


def test_compare_mode(qtbot, window, fake_model):
    model = fake_model(step_delay=0.002)
    window.set_model(model)
    window.settings_panel.set_options(SMALL)
    window.open_compare()
    cmp = window.compare_window
    cmp.prompt.setText("same prompt")
    cmp.preset.setCurrentIndex(1)                        # entropy_exit: tau off vs on
    assert "entropy_exit" in cmp.sides[1].title.toolTip()     # the title names it: "τ on"
    finished = []
    window.engine.run_finished.connect(finished.append)
    cmp.start()
    qtbot.waitUntil(lambda: len(finished) == 2, timeout=20000)
    a, b = cmp.runs
    assert [c["scheduler"] for c in model.calls] == ["entropy_exit", "entropy_exit"]
    assert model.calls[0]["threshold"] == 0.0             # A: a tau that never fires
    assert model.calls[1]["threshold"] == b.rule.tau > 0  # B: the Settings' (here the model's)
    assert "Steps: A" in cmp.summary.text() and "Time per step: A" in cmp.summary.text()
    diff = a.differs_from(b)
    assert cmp.sides[0].canvas.canvas.diff is not None
    assert np.array_equal(cmp.sides[1].canvas.canvas.diff, diff)
    assert "/" in cmp.sides[0].stats.text()
    assert window.chat.conversation.messages == []        # compare runs stay out of the chat
    cmp.close()


def test_entry_point_replays_a_file_and_quits_cleanly(qapp, recorded_run, tmp_path,
                                                      monkeypatch):
    import signal

    from PySide6.QtCore import QCoreApplication, QEvent, QTimer

    from diffuse.studio.__main__ import main
    monkeypatch.setattr(signal, "signal", lambda *a: None)    # keep pytest's Ctrl+C handler
    recorded_run("no_cache").save(tmp_path / "run.npz")
    threads = []        # the engine's thread, which outlives the window

    def look_then_quit():
        try:
            threads.extend(w.engine._thread for w in qapp.topLevelWidgets()
                           if isinstance(w, MainWindow) and w.run is not None and w.run.n_steps == 16)
        finally:
            qapp.quit()
    QTimer.singleShot(1500, look_then_quit)
    assert main([str(tmp_path / "run.npz")]) == 0
    # Closing the window while quitting posted a second Quit: handled after exec() returned, it
    # would end every later event loop at once (qtbot.wait, waitSignal) for the tests that follow.
    QCoreApplication.removePostedEvents(qapp, QEvent.Type.Quit)
    assert len(threads) == 1 and not threads[0].isRunning()    # quitting stopped the engine
    # the window is deleted before main returns, not left to the interpreter's exit
    assert not any(isinstance(w, MainWindow) for w in qapp.topLevelWidgets())
