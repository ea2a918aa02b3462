"""Runs are kept: closing the window during a run (the real app, its entry point, in its own
process) stops the run after the current step, writes its recording whole, links the answer to
it and exits 0; closing during the recording's write waits for it; an answer links a recording
only once it is written, and one gone since is said to be gone; recordings are named by date and
prompt and listed in the File menu; a refused prompt leaves the previous run shown."""
from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import threading
import time

import pytest
from PySide6.QtCore import QUrl

from diffuse import DiffuseError
from diffuse.recording import Recording
from diffuse.studio import storage
from diffuse.studio.main_window import MainWindow
from diffuse.studio.run_state import RunState
from test_studio_xvfb import xvfb

# Runs as the app: `diffuse-studio DEMO` with a driver that starts a long run and, once a few
# steps are done, ends the app (argv[1]): "close" as the title bar's X does, "close-twice",
# or "quit" as Ctrl+C in the terminal does.
DRIVE = r"""
import sys
from PySide6.QtCore import QTimer
from PySide6.QtWidgets import QApplication
from diffuse.studio import __main__ as studio, storage

app = QApplication(sys.argv[:1])
how = sys.argv[1]

def window():
    return next(w for w in app.topLevelWidgets() if type(w).__name__ == "MainWindow")

def start():
    w = window()
    if w.engine.model is None:                  # the demo model is loading
        return QTimer.singleShot(20, start)
    w.settings_panel.set_options(dict(gen_length=128, steps=128, block_length=128))
    w.chat.prompt.setPlainText("Tell me about Mr. Darcy.")
    w.chat.submit()
    close_mid_run()

def close_mid_run():
    w = window()
    if w.engine.run is None or w.engine.run.n_steps < 3:
        return QTimer.singleShot(5, close_mid_run)
    print("closing at step", w.engine.run.n_steps, flush=True)
    if how == "quit":
        app.quit()
    for _ in range({"close": 1, "close-twice": 2, "quit": 0}[how]):
        w.windowHandle().close()

QTimer.singleShot(0, start)
sys.exit(studio.main([str(storage.demo_model())]))
"""


def platforms():
    yield "offscreen"
    yield pytest.param("xcb", marks=pytest.mark.skipif(shutil.which("Xvfb") is None,
                                                       reason="Xvfb is not installed"))


@pytest.mark.timeout(240)
@pytest.mark.parametrize("how", ["close", "close-twice", "quit"])
@pytest.mark.parametrize("platform", platforms())
def test_the_app_closed_mid_run_exits_cleanly_with_the_run_recorded(tmp_path, platform, how):
    home = tmp_path / "home"
    env = dict(os.environ, QT_QPA_PLATFORM=platform, DIFFUSE_STUDIO_HOME=str(home))
    with xvfb() if platform == "xcb" else contextlib.nullcontext() as display:
        if display:
            env["DISPLAY"] = display
        done = subprocess.run([sys.executable, "-c", DRIVE, how], env=env, capture_output=True,
                              timeout=200)
    log = (done.stdout + done.stderr).decode(errors="replace")
    assert done.returncode == 0, log[-3000:]
    assert "closing at step" in log, log[-3000:]
    for sign in ("QThread: Destroyed", "Signal source has been deleted", "Traceback"):
        assert sign not in log, log[-3000:]
    # one recording, whole (no temporary file left), of the run stopped after the current step
    files = sorted(p.name for p in (home / "runs").iterdir())
    assert len(files) == 1 and files[0].endswith("_tell-me-about-mr-darcy.npz"), files
    rec = Recording.load(home / "runs" / files[0])
    assert rec.result.stop_reason == "cancelled" and 3 <= len(rec.events) < 128
    # the answer is saved and links to it
    (conv,) = (home / "conversations").glob("*.json")
    answer = json.loads(conv.read_text())["messages"][-1]
    assert answer["role"] == "assistant" and answer["meta"]["steps"] == len(rec.events)
    assert answer["meta"]["recording"] == str(home / "runs" / files[0])


SMALL = {"gen_length": 48, "steps": 24, "block_length": 16, "threads": 1}


def saved_answer(window) -> dict:
    """The last message of the window's conversation as it is on disk."""
    path = window.chat.store.path(window.chat.conversation.id)
    return json.loads(path.read_text())["messages"][-1]


def held_saves(monkeypatch) -> threading.Event:
    """Recordings are written only once the returned event is set."""
    release, save = threading.Event(), Recording.save
    monkeypatch.setattr(Recording, "save",
                        lambda rec, path: release.wait(20) and save(rec, path))
    return release


def finish_a_run(qtbot, window, model, prompt="Tell me about diffusion"):
    window.set_model(model)
    window.settings_panel.set_options(SMALL)
    window.chat.prompt.setPlainText(prompt)
    with qtbot.waitSignal(window.engine.run_finished, timeout=20000) as done:
        window.chat.submit()
    return done.args[0]


def test_an_answer_links_its_recording_only_once_written(qtbot, window, fake_model,
                                                         monkeypatch):
    release = held_saves(monkeypatch)
    run = finish_a_run(qtbot, window, fake_model(step_delay=0))
    # the answer is saved at once, without a link to a file that does not exist yet
    answer = window.chat.conversation.messages[-1]
    assert answer.text == run.result.text and saved_answer(window)["text"] == run.result.text
    assert saved_answer(window)["meta"]["recording"] is None
    assert "replay" not in window.chat.view.toPlainText()
    release.set()
    qtbot.waitUntil(lambda: saved_answer(window)["meta"]["recording"] is not None, timeout=10000)
    path = saved_answer(window)["meta"]["recording"]
    assert answer.meta["recording"] == path and Recording.load(path).prompt == run.prompt
    assert "replay" in window.chat.view.toPlainText()


def test_recordings_are_named_by_date_and_prompt_and_never_collide():
    at = 1796171289.5
    when = time.strftime("%Y-%m-%d_%H-%M-%S", time.localtime(at))     # local time
    first = storage.new_run_path("Tell me about Mr. Darcy's / ..\\ <estate>!", at)
    assert first.parent == storage.runs_dir()
    assert first.name == f"{when}_tell-me-about-mr-darcy-s-estate.npz"
    first.write_bytes(b"taken")
    second = storage.new_run_path("Tell me about Mr. Darcy's / ..\\ <estate>!", at)
    third = storage.new_run_path("Tell me about Mr. Darcy's / ..\\ <estate>!", at, {second})
    assert (second.name, third.name) == (first.stem + "-2.npz", first.stem + "-3.npz")
    assert storage.new_run_path("  ...  ", at).name == f"{when}_run.npz"
    long = storage.new_run_path("Ü" * 300, at)
    assert long.name == f"{when}_{'ü' * storage.RUN_NAME_WORDS}.npz"
    assert first.read_bytes() == b"taken"                # nothing was overwritten


def test_a_recording_that_cannot_be_written_leaves_no_link(qtbot, window, fake_model,
                                                           monkeypatch):
    def full(rec, path):
        raise DiffuseError(f"{path}: the disk is full; nothing was written")
    monkeypatch.setattr(Recording, "save", full)
    finish_a_run(qtbot, window, fake_model(step_delay=0))
    qtbot.waitUntil(lambda: "could not record" in window.statusBar().currentMessage(),
                    timeout=10000)
    assert saved_answer(window)["meta"]["recording"] is None
    assert list(storage.runs_dir().iterdir()) == [] and not window.runs.writing and not window.runs.saves


@pytest.mark.timeout(60)
def test_closing_while_the_recording_is_written_waits_for_it(qtbot, fake_model, monkeypatch):
    release = held_saves(monkeypatch)
    w = MainWindow()
    qtbot.addWidget(w)
    w.show()
    finish_a_run(qtbot, w, fake_model(step_delay=0))
    w.close()
    w.close()                                           # closed twice
    assert not w.isVisible() and w.runs.saves               # hidden; closes once it is written
    release.set()
    qtbot.waitUntil(lambda: not w.runs.saves, timeout=20000)
    path = saved_answer(w)["meta"]["recording"]
    assert path is not None and Recording.load(path).result.steps > 0


def test_a_recording_gone_since_is_said_to_be_gone(qtbot, window, fake_model, recorded_run):
    finish_a_run(qtbot, window, fake_model(step_delay=0))
    qtbot.waitUntil(lambda: saved_answer(window)["meta"]["recording"] is not None, timeout=10000)
    path = saved_answer(window)["meta"]["recording"]
    os.remove(path)
    from diffuse.studio.chat import ChatPanel
    again = ChatPanel()                                 # the next start of the app
    qtbot.addWidget(again)
    assert "recording gone" in again.view.toPlainText()
    assert "replay" not in again.view.toPlainText()
    with qtbot.assertNotEmitted(again.replay_requested):
        again._link(QUrl(f"replay:{again.conversation.messages[-1].id}"))
    assert again.conversation.messages[-1].meta["recording"] == path   # the link is kept


def test_a_refused_prompt_leaves_the_previous_run_shown_and_usable(qtbot, window, fake_model,
                                                                  recorded_run, tmp_path):
    recorded_run("eos").save(tmp_path / "run.npz")
    window.set_model(fake_model(step_delay=0))
    window.open_recording(tmp_path / "run.npz")
    shown = window.run
    last = shown.n_steps - 1
    window.chat.prompt.setPlainText("far too long " * 400)     # past the model's context
    with qtbot.waitSignal(window.engine.run_failed, timeout=10000) as failed:
        window.chat.submit()
    assert "exceeds the model's context" in failed.args[1]
    assert window.run is shown and window.canvas_panel.canvas.run is shown
    assert window.heatmap.run is shown
    assert window.timeline.slider.maximum() == last and window.timeline.step() == last
    qtbot.waitUntil(lambda: window.timeline.label.text().startswith(shown.step_label(last)))
    assert window.canvas_panel.status.text().startswith(shown.step_label(last))
    assert all(a.isEnabled() for a in (window.save_action, window.png_action, window.gif_action))
    window.save_recording(tmp_path / "again.npz")
    assert len(Recording.load(tmp_path / "again.npz").events) == shown.n_steps


def test_a_run_starting_does_not_show_the_last_run_s_step(qtbot, window, fake_model,
                                                          recorded_run, tmp_path):
    recorded_run("eos").save(tmp_path / "run.npz")
    window.open_recording(tmp_path / "run.npz")
    assert window.timeline.label.text().startswith("step ")
    window.show_run(RunState("a new prompt"))           # started; its first step not yet come
    assert window.timeline.label.text() == "starting…"
    window.show_run(None)
    assert window.timeline.label.text() == "no run"


def test_recorded_runs_are_listed_newest_first_and_open(qtbot, window, recorded_run):
    menu = window.recent_menu
    menu.aboutToShow.emit()
    assert [a.text() for a in menu.actions() if not a.isSeparator()] == [
        "No runs recorded yet", "All recorded runs…"]
    paths = []
    for k, prompt in enumerate(("first question", "second question")):
        rec = recorded_run("eos")
        rec.prompt = prompt
        paths.append(storage.new_run_path(prompt, rec.created))
        rec.save(paths[-1])
        os.utime(paths[-1], (1e9 + k, 1e9 + k))          # the second is the newer
    menu.aboutToShow.emit()
    listed = [a for a in menu.actions() if a.toolTip().endswith(".npz")]
    assert [a.text() for a in listed] == [paths[1].stem, paths[0].stem]
    assert listed[0].text().endswith("_second-question")
    listed[1].trigger()
    assert window.run.prompt == "first question" and window.run.done


@pytest.mark.timeout(60)
def test_a_window_deleted_while_its_recording_is_written_is_not_called_back(qtbot, fake_model,
                                                                            monkeypatch):
    import shiboken6
    release = held_saves(monkeypatch)
    w = MainWindow()
    w.show()
    finish_a_run(qtbot, w, fake_model(step_delay=0))
    (job,) = w.runs.saves
    w.close()
    shiboken6.delete(w)                     # gone before the recording is written
    release.set()
    qtbot.waitUntil(lambda: not job.running, timeout=20000)
    qtbot.wait(50)                          # its signals delivered: to nobody, and no error
    assert len(list(storage.runs_dir().glob("*.npz"))) == 1


def test_a_killed_writers_temporary_file_is_swept_and_nothing_else():
    """A recording or conversation written when the process was killed (-9) leaves write_atomic's
    hidden .part file; the next start removes those over an hour old, never a fresh one (another
    window may be writing it) nor anything else."""
    hour_ago = time.time() - storage.STALE_PART_S - 60
    for name in ("runs", "conversations"):
        folder = storage.home_dir() / name
        folder.mkdir(exist_ok=True)
        stale, fresh = folder / ".a.npz.k2j4h1x0.part", folder / ".b.npz.p9q8r7s6.part"
        kept = [fresh, folder / "old.npz", folder / ".hidden-note"]
        for path in (stale, *kept):
            path.write_bytes(b"x")
        for path in (stale, folder / "old.npz", folder / ".hidden-note"):
            os.utime(path, (hour_ago, hour_ago))
        storage.sweep_stale_parts()
        assert (storage.runs_dir() if name == "runs" else storage.conversations_dir()) == folder
        assert not stale.exists() and all(p.exists() for p in kept)
