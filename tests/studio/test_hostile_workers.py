"""Hostile failures and slow work on the Studio's worker threads: whatever a model, tokenizer or
job raises reaches the user as a message and frees the engine; Stop and closing the window answer
within a second even while a step or a job takes longer."""
from __future__ import annotations

import threading
import time

import pytest

from diffuse import DiffuseError
from diffuse.studio.main_window import CLOSE_WAIT_S, MainWindow

SMALL = {"gen_length": 48, "steps": 24, "block_length": 16, "threads": 1}
SNAPPY_S = 1.0      # Stop and close must hand the GUI back within this


class Panic(BaseException):
    """Like pyo3's PanicException (the tokenizers library): not an Exception."""


class HostileStr(Exception):
    def __str__(self):
        raise ValueError("no message for you")


def raising(fake_model, exc):
    class Broken(fake_model):
        def generate(self, prompt, **kw):
            raise exc
    return Broken(step_delay=0)


def submit(qtbot, window, prompt="hello"):
    window.chat.prompt.setPlainText(prompt)
    with qtbot.waitSignal(window.engine.run_started, timeout=5000):
        window.chat.submit()


def assert_idle(window):
    assert not window.engine.busy and window.live is None
    assert window.chat.generate_button.isEnabled() and not window.stop_action.isEnabled()
    assert not window.model_panel.engine_busy


def assert_runs_again(qtbot, window, fake_model):
    window.set_model(fake_model(step_delay=0))
    window.settings_panel.set_options(SMALL)
    window.chat.prompt.setPlainText("again")
    with qtbot.waitSignal(window.engine.run_finished, timeout=10000) as done:
        window.chat.submit()
    assert done.args[0].result.stop_reason == "done"


@pytest.mark.timeout(30)
@pytest.mark.parametrize("exc, shown", [
    (Panic("called `Option::unwrap()` on a `None` value"), "Panic: called `Option::unwrap()`"),
    (MemoryError(), "MemoryError"),
    (RecursionError("maximum recursion depth exceeded"), "maximum recursion depth"),
    (HostileStr(), "HostileStr: (no message)"),
    (KeyboardInterrupt(), "KeyboardInterrupt"),   # also asks the app to quit: none runs here
])
def test_any_failure_reaches_the_user_and_frees_the_engine(qtbot, window, fake_model, exc,
                                                           shown):
    window.set_model(raising(fake_model, exc))
    with qtbot.waitSignal(window.engine.run_failed, timeout=5000) as failed:
        window.chat.prompt.setPlainText("hello")
        window.chat.submit()
    assert shown in failed.args[1]
    assert shown in window.chat.view.toPlainText()
    assert "run failed" in window.statusBar().currentMessage()
    assert_idle(window)
    assert_runs_again(qtbot, window, fake_model)


@pytest.mark.timeout(30)
def test_a_hung_then_panicking_chat_template_runs_off_the_gui_thread(qtbot, window, fake_model):
    gui = threading.get_ident()
    seen = []

    class HungTemplate(fake_model):
        def __init__(self):
            super().__init__(step_delay=0)

            def apply_chat_template(messages):
                seen.append(threading.get_ident())
                time.sleep(2.0)           # the tokenizer module gives up on a template at 2 s
                raise Panic("template engine panicked")
            self.tokenizer.apply_chat_template = apply_chat_template

    window.set_model(HungTemplate())
    window.settings_panel.set_options(SMALL)
    messages = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"},
                {"role": "user", "content": "more"}]
    with qtbot.waitSignal(window.engine.run_failed, timeout=10000) as failed:
        t0 = time.monotonic()
        window.generate("more", messages)
        assert time.monotonic() - t0 < 0.5           # the GUI did not wait for the template
    assert seen and gui not in seen
    assert "template engine panicked" in failed.args[1]
    assert "template engine panicked" in window.chat.view.toPlainText()
    assert_idle(window)
    assert_runs_again(qtbot, window, fake_model)


@pytest.mark.timeout(30)
def test_a_broken_tokenizer_on_the_gui_side_is_reported(qtbot, window, fake_model):
    class DamagedTokenizer:
        def __init__(self, tok):
            self._tok = tok

        def __getattr__(self, name):
            return getattr(self._tok, name)

        @property
        def special_tokens(self):
            raise DiffuseError("tokenizer.json: added tokens are damaged")

    model = fake_model(step_delay=0)
    model.tokenizer = DamagedTokenizer(model.tokenizer)
    window.set_model(model)
    window.chat.prompt.setPlainText("hello")
    window.chat.submit()
    assert "added tokens are damaged" in window.chat.view.toPlainText()
    assert_idle(window)
    assert_runs_again(qtbot, window, fake_model)


@pytest.mark.timeout(30)
def test_stop_answers_within_a_second_during_slow_steps(qtbot, window, fake_model):
    window.set_model(fake_model(step_delay=0.4))
    window.settings_panel.set_options(SMALL)
    submit(qtbot, window, "slow")
    qtbot.waitUntil(lambda: window.engine.run.n_steps >= 2, timeout=5000)
    t0 = time.monotonic()
    window.chat.stop_button.click()
    assert time.monotonic() - t0 < 0.1
    qtbot.waitUntil(lambda: not window.engine.busy, timeout=int(SNAPPY_S * 1000))
    assert time.monotonic() - t0 < SNAPPY_S
    assert window.run.result.stop_reason == "cancelled"
    assert_idle(window)
    assert_runs_again(qtbot, window, fake_model)


@pytest.mark.timeout(30)
def test_closing_during_a_long_step_hides_at_once_and_ends_after_it(qtbot, fake_model):
    w = MainWindow()
    qtbot.addWidget(w)
    w.show()
    w.set_model(fake_model(step_delay=3.0))         # one step of a large model
    w.settings_panel.set_options(SMALL)
    submit(qtbot, w, "slow")
    qtbot.wait(100)                                  # inside the first long step now
    t0 = time.monotonic()
    w.close()
    assert time.monotonic() - t0 < CLOSE_WAIT_S + 0.3
    assert not w.isVisible() and w.engine._thread.isRunning()
    # the engine ends when the step returns, cancelled, and the window closes for real
    qtbot.waitUntil(lambda: not w.engine._thread.isRunning(), timeout=6000)
    qtbot.waitUntil(lambda: not w.engine.busy, timeout=2000)
    assert w.run.result.stop_reason == "cancelled" and w.run.n_steps <= 2


@pytest.mark.timeout(30)
def test_closing_during_a_run_with_fast_steps_is_immediate(qtbot, fake_model):
    w = MainWindow()
    qtbot.addWidget(w)
    w.show()
    w.set_model(fake_model(step_delay=0.05))
    w.settings_panel.set_options(SMALL)
    submit(qtbot, w, "fast")
    qtbot.waitUntil(lambda: w.engine.run.n_steps >= 2, timeout=5000)
    t0 = time.monotonic()
    w.close()
    assert time.monotonic() - t0 < SNAPPY_S
    assert not w.isVisible() and not w.engine._thread.isRunning()


def slow_job(seconds: float, started: threading.Event, honours_cancel: bool):
    def fn(progress, cancel):
        started.set()
        end = time.monotonic() + seconds
        while time.monotonic() < end and not (honours_cancel and cancel()):
            progress(1, 10, "converting")
            time.sleep(0.02)
    return fn


@pytest.mark.timeout(30)
@pytest.mark.parametrize("honours_cancel", [True, False])
def test_closing_during_a_job(qtbot, honours_cancel):
    w = MainWindow()
    qtbot.addWidget(w)
    w.show()
    panel = w.model_panel
    qtbot.waitUntil(lambda: panel._scan is None, timeout=10000)
    started = threading.Event()
    assert panel._start_job("converting x", slow_job(3.0, started, honours_cancel))
    qtbot.waitUntil(started.is_set, timeout=5000)
    job = panel.job
    t0 = time.monotonic()
    w.close()
    assert time.monotonic() - t0 < CLOSE_WAIT_S + 0.3
    assert not w.isVisible()
    if honours_cancel:
        assert not job.running
    else:                                # a job that will not stop: closed once it returns
        assert job.running
        qtbot.waitUntil(lambda: not job.running, timeout=6000)
    assert job.cancelled


@pytest.mark.timeout(30)
@pytest.mark.parametrize("exc", [Panic("panicked in convert"), MemoryError("no room")])
def test_a_failing_job_is_reported_and_frees_the_panel(qtbot, window, exc):
    panel = window.model_panel
    qtbot.waitUntil(lambda: panel._scan is None, timeout=10000)

    def fn(progress, cancel):
        raise exc
    with qtbot.waitSignal(panel.job_finished, timeout=5000) as done:
        assert panel._start_job("quantising x", fn)
    assert done.args == ["quantising x", None]
    assert panel.job is None and all(b.isEnabled() for b in panel.buttons)
    assert type(exc).__name__ in panel.message.text()


@pytest.mark.timeout(30)
def test_compare_reports_a_panic_and_can_run_again(qtbot, window, fake_model):
    window.set_model(raising(fake_model, Panic("panicked in compare")))
    window.open_compare()
    cmp = window.compare_window
    cmp.prompt.setText("same prompt")
    with qtbot.waitSignal(window.engine.run_failed, timeout=5000):
        cmp.start()
    assert "panicked in compare" in cmp.summary.text()
    assert cmp.run_button.isEnabled() and not cmp.stop_button.isEnabled()
    window.set_model(fake_model(step_delay=0.3))
    window.settings_panel.set_options(SMALL)
    with qtbot.waitSignal(window.engine.run_started, timeout=5000):
        cmp.start()
    qtbot.waitUntil(lambda: window.engine.run.n_steps >= 2, timeout=5000)
    t0 = time.monotonic()
    cmp.stop_button.click()
    qtbot.waitUntil(lambda: not window.engine.busy, timeout=int(SNAPPY_S * 1000))
    assert time.monotonic() - t0 < SNAPPY_S
    assert "Stopped before both runs finished" in cmp.summary.text()
    cmp.close()
