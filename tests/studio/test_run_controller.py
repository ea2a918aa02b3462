"""One part of the Studio runs the model at a time: the run controller grants it or says why not,
every run button follows with the reason in its tooltip, and Cancel stops whoever holds it."""
from __future__ import annotations

from types import SimpleNamespace

import pytest

from diffuse.studio.run_controller import RunController
from diffuse.studio.run_state import RunState

# an engine's run_finished and run_failed, which the controller listens to for what AR costs: never
# emitted here
SIGNAL = SimpleNamespace(connect=lambda slot: None)


def test_one_holder_at_a_time_and_why_the_others_wait():
    runs = RunController(SimpleNamespace(model=object(), busy=False, run_finished=SIGNAL, run_failed=SIGNAL))
    seen, stopped = [], []
    runs.holder_changed.connect(seen.append)
    assert runs.refusal("chat") == "" and not runs.busy
    stop = lambda: stopped.append("benchmarks")    # noqa: E731
    assert runs.acquire("benchmarks", stop)
    assert runs.acquire("benchmarks", stop)                   # asking again changes nothing
    assert not runs.acquire("chat", lambda: None)
    assert runs.refusal("chat").startswith("A benchmark sweep is running")
    assert runs.refusal("benchmarks") == ""
    with pytest.raises(RuntimeError, match="does not hold"):
        runs.start("chat", RunState("hi", {}, {}))
    runs.release("chat")                                      # not the holder: nothing happens
    assert runs.holder == "benchmarks"
    runs.stop()
    assert stopped == ["benchmarks"]
    runs.release("benchmarks")
    assert seen == ["benchmarks", None] and runs.refusal("chat") == ""
    runs.stop()                                               # nothing holds it: nothing to stop
    with pytest.raises(ValueError):
        runs.acquire("someone", lambda: None)


def test_a_run_the_engine_is_still_ending_refuses_everyone():
    runs = RunController(SimpleNamespace(model=object(), busy=True, run_finished=SIGNAL, run_failed=SIGNAL))
    assert "Another run is going" in runs.refusal("compare") and not runs.acquire("compare", lambda: None)


def test_a_sweep_keeps_the_chat_off_and_cancel_stops_it(qtbot, window, fake_model):
    window.set_model(fake_model(step_delay=0.05))
    window.open_benchmarks()
    bench = window.bench_window
    bench.values.setText("4,8,16,32")
    bench.start()
    assert bench.running and window.runs.holder == "benchmarks"
    chat = window.chat
    assert not chat.generate_button.isEnabled() and not chat.regenerate_button.isEnabled()
    assert "A benchmark sweep is running" in chat.generate_button.toolTip()
    assert "A benchmark sweep is running" in chat.hint.text()
    assert not window.generate_action.isEnabled() and window.stop_action.isEnabled()
    assert window.model_panel.engine_busy              # no model swap under the sweep
    chat.prompt.setPlainText("Tell me about Mr. Darcy.")
    chat.submit()
    assert chat.conversation.messages == [] and not window.engine.busy
    window.generate("asked the way the smoke test asks")
    assert window.live is None and not window.engine.busy
    assert "A benchmark sweep is running" in chat.view.toPlainText()
    window.stop()                                      # Esc: the sweep ends after its step
    qtbot.waitUntil(lambda: not bench.running, timeout=20000)
    assert window.runs.holder is None and chat.generate_button.isEnabled()
    assert "Cancelled" in bench.status.text() and not window.model_panel.engine_busy


def test_a_chat_run_keeps_the_sweep_off(qtbot, window, fake_model):
    window.set_model(fake_model(step_delay=0.05))
    window.open_benchmarks()
    bench = window.bench_window
    window.chat.prompt.setPlainText("Tell me about Mr. Darcy.")
    window.chat.submit()
    assert window.runs.holder == "chat" and window.live is not None
    assert not bench.run_button.isEnabled()
    assert "A chat answer is running" in bench.run_button.toolTip()
    with qtbot.waitSignal(window.engine.run_finished, timeout=20000):
        pass
    assert window.runs.holder is None and bench.run_button.isEnabled()
