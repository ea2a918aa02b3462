"""A server's model in the Studio's window (File > Connect to server…): against a real `diffuse serve`
the chat's run fills the live views from its step events; against a text-only engine the answer
streams into the chat, the views say why they stay empty, and Stop ends it."""
from __future__ import annotations

import http.server
import threading
from pathlib import Path

import pytest
from PySide6.QtCore import QTimer
from PySide6.QtWidgets import QApplication

import diffuse
from diffuse.studio.remote_dialog import ConnectDialog
from diffuse.studio.run_state import RunState
# a served demo model with key KEY; a server that streams words until the client goes
from test_remote_studio import KEY, TextOnly, server  # noqa: F401  (server: a fixture)

DEMO = Path(__file__).resolve().parents[2] / "models" / "diffuse-demo-3m.gguf"
WAIT_MS = 60_000


@pytest.fixture
def text_only():
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), TextOnly)
    httpd.daemon_threads = True
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}/v1"
    httpd.shutdown()
    httpd.server_close()


def connect_through_the_menu(qtbot, window, url: str, key: str = "") -> None:
    """File > Connect to server…, the dialog filled in as a user does."""
    def fill():
        dialog = QApplication.activeModalWidget()
        assert isinstance(dialog, ConnectDialog)
        dialog.url.setText(url)
        dialog.key.setText(key)
        dialog.connect_button.click()
    QTimer.singleShot(0, fill)
    window.connect_action.trigger()
    qtbot.waitUntil(lambda: getattr(window.engine.model, "remote", False), timeout=WAIT_MS)


def test_a_served_model_runs_in_the_window_step_by_step(qtbot, window, server):
    connect_through_the_menu(qtbot, window, server.url, KEY)
    assert window.model_label.text() == f"diffuse-demo-3m on diffuse serve · {server.url}"
    # the server says its family and recipe: the Settings show its defaults
    assert window.settings_panel.defaults_note["steps"].text() == "model default: 64"
    assert "server applies" in window.chat.system_note.text()
    assert window.serve_panel.model is None          # the Studio serves files, not a server's model
    assert window.compare_action.isEnabled()
    # the chat's messages go as they are: the server applies its template
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
    assert window._prompt_for(RunState("Hi", {"chat": True}, {}), messages) == messages

    window.settings_panel.set_options({"gen_length": 32, "steps": 16, "seed": 5})
    window.chat.prompt.setPlainText("Tell me about Mr. Darcy.")
    window.chat.submit()
    run = window.live
    assert run is not None and window.runs.holder == "chat"
    qtbot.waitUntil(lambda: window.live is None, timeout=WAIT_MS)
    assert window.run is run and run.n_steps == run.result.steps > 0 and run.options["seed"] == 5
    local = diffuse.load(DEMO, threads=1)        # the server's answer is the model's own
    assert run.result.text == local.generate("Tell me about Mr. Darcy.", gen_length=32, steps=16, seed=5).text
    window.refresh()
    window.refresh()
    assert not window.heatmap.empty.note.isVisible()          # the live views drew its steps
    answer = window.chat.conversation.branch()[-1]
    assert answer.text == run.result.text and answer.meta["steps"] == run.n_steps


def test_a_text_only_server_streams_to_the_chat_and_the_views_say_why_they_are_empty(
        qtbot, window, text_only, demo_model):
    window.model_panel.load(str(DEMO))         # a file first: the server's model takes its place
    qtbot.waitUntil(lambda: window.engine.model is not None, timeout=WAIT_MS)
    assert window.model_panel.loaded_path == DEMO.resolve()
    connect_through_the_menu(qtbot, window, text_only)
    assert window.model_panel.loaded_path is None            # no file is marked loaded
    model = window.engine.model
    assert "vllm server" in window.model_label.text()
    note = model.views_note()
    assert "sends text only" in note and window.statusBar().currentMessage() == note
    flat = lambda text: " ".join(text.split())       # noqa: E731  (the plots wrap it)
    assert flat(window.heatmap.empty.note.toPlainText()) == note
    assert window.canvas_panel.canvas.empty_text("") == note
    assert not window.settings_panel.defaults_note["steps"].isVisible()   # the file's defaults are gone
    assert not window.compare_action.isEnabled()            # no steps: nothing to compare

    window.chat.prompt.setPlainText("Hi")
    window.chat.submit()
    qtbot.waitUntil(lambda: "word5" in window.chat.view.toPlainText(), timeout=WAIT_MS)
    assert window.live is not None and flat(window.heatmap.empty.note.toPlainText()) == note
    assert "Answering…" in window.chat.view.toPlainText() and window.timeline.label.text() == "text only, no steps"
    window.stop()                          # Esc: the server's run ends though no step comes
    qtbot.waitUntil(lambda: window.live is None, timeout=WAIT_MS)
    answer = window.chat.conversation.branch()[-1]
    assert answer.role == "assistant" and answer.text.startswith(" word0 word1 word2")
    assert answer.meta["stop_reason"] == "cancelled" and window.runs.holder is None

    window.set_model(demo_model)           # back to a file: the views say the usual again
    assert window.heatmap.empty.note.toPlainText() != note and window.compare_action.isEnabled()


def test_connecting_waits_for_the_run_going(qtbot, window, fake_model):
    window.set_model(fake_model(step_delay=0.05))
    window.chat.prompt.setPlainText("Tell me about Mr. Darcy.")
    window.chat.submit()
    assert not window.connect_action.isEnabled()
    window._connect_clicked()               # a shortcut's way in: said, no dialog
    assert "Stop the run" in window.statusBar().currentMessage()
    with qtbot.waitSignal(window.engine.run_finished, timeout=20000):
        pass
    assert window.connect_action.isEnabled()


def test_stop_cancels_a_remote_run_without_steps():
    """Engine.stop reaches a model's own cancel (a text-only server sends no step to refuse)."""
    from diffuse.studio.workers import Engine
    cancelled = []
    engine = Engine()
    engine.model = type("M", (), {"cancel": lambda self: cancelled.append(True)})()
    engine.stop()
    engine.model = object()                 # a local model has none
    engine.stop()
    assert cancelled == [True] and engine.shutdown(10000)
