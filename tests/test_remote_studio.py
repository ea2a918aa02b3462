"""The Studio on a server: "Connect to server…" (diffuse/studio/remote_dialog.py) against a real
`diffuse serve`, and its model run by the Studio's own Engine as a local model is: every step a
StepEvent in the RunState the views draw; a text-only engine's answer streams to the chat and
Stop ends it."""
from __future__ import annotations

import json
import os
import threading

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")     # before any QApplication exists

import http.server
from pathlib import Path

import pytest

import diffuse
from diffuse.remote import RemoteModel
from diffuse.serve import Server

DEMO = Path(__file__).resolve().parents[1] / "models" / "diffuse-demo-3m.gguf"
KEY = "studio-key"
WAIT_MS = 60_000


@pytest.fixture(autouse=True)
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("DIFFUSE_STUDIO_HOME", str(tmp_path / "home"))
    for name in ("DIFFUSE_API_KEY", "OPENAI_API_KEY"):
        monkeypatch.delenv(name, raising=False)


@pytest.fixture(scope="module")
def server():
    s = Server(diffuse.load(DEMO, threads=1), port=0, api_key=KEY, max_batch=2)
    s.start()
    yield s
    s.stop()


def test_the_dialog_lists_models_connects_and_keeps_the_key_only_when_asked(qtbot, server):
    from diffuse.studio import storage
    from diffuse.studio.remote_dialog import SETTING_KEY, SETTING_URL, ConnectDialog
    dialog = ConnectDialog()
    qtbot.addWidget(dialog)
    dialog.url.setText(server.url)
    dialog.key.setText("wrong")
    dialog.test_button.click()
    qtbot.waitUntil(lambda: dialog.test_button.isEnabled() and "refused the API key" in dialog.status.text(),
                    timeout=WAIT_MS)
    assert "color" in dialog.status.styleSheet() and dialog.model is None     # said in red, still open
    dialog.key.setText(KEY)
    dialog.test_button.click()
    qtbot.waitUntil(lambda: "Connected" in dialog.status.text(), timeout=WAIT_MS)
    assert dialog.status.styleSheet() == "" and "diffuse serve" in dialog.status.text()
    assert [dialog.models.itemText(i) for i in range(dialog.models.count())] == ["diffuse-demo-3m"]
    dialog.connect_button.click()
    qtbot.waitUntil(lambda: dialog.model is not None, timeout=WAIT_MS)
    settings = storage.settings()
    assert settings.value(SETTING_URL) == server.url and settings.value(SETTING_KEY) is None   # not asked to keep it
    model = dialog.model
    assert Path(model.path).name == "diffuse-demo-3m" and model.remote and model.views_note() == ""

    again = ConnectDialog()          # opens with what was remembered: the URL, not the key
    qtbot.addWidget(again)
    assert again.url.text() == server.url and again.key.text() == "" and again.models.currentText() == "diffuse-demo-3m"
    again.key.setText(KEY)
    again.remember.setChecked(True)
    again.connect_button.click()
    qtbot.waitUntil(lambda: again.model is not None, timeout=WAIT_MS)
    assert storage.settings().value(SETTING_KEY) == KEY


def test_the_studios_engine_runs_a_served_model_step_by_step(qtbot, server):
    from diffuse.studio.remote_dialog import StudioRemoteModel
    from diffuse.studio.run_state import RunState
    from diffuse.studio.workers import Engine
    model = StudioRemoteModel(RemoteModel.connect(server.url, KEY))
    engine = Engine()
    engine.model = model
    finished = []
    engine.run_finished.connect(finished.append)
    run = RunState("Tell me a story.", {"gen_length": 32, "steps": 8, "seed": 3, "chat": True},
                   {"name": model.name}, model.tokenizer.decode)
    engine.start(run)
    qtbot.waitUntil(lambda: bool(finished), timeout=WAIT_MS)
    local = diffuse.load(DEMO, threads=1).generate("Tell me a story.", gen_length=32, steps=8, seed=3)
    assert run.result.text == local.text and run.n_steps == run.result.steps > 0
    assert run.decided_step.max() == run.n_steps - 1 and run.text_at(run.n_steps - 1)
    assert engine.shutdown(WAIT_MS)


class TextOnly(http.server.BaseHTTPRequestHandler):
    """An engine that streams text only, a word every 50 ms, until the client goes."""

    def log_message(self, *args):
        pass

    def do_GET(self):
        body = json.dumps({"data": [{"id": "ar", "owned_by": "vllm"}]}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_POST(self):
        self.rfile.read(int(self.headers["Content-Length"]))
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        try:
            for i in range(2000):
                chunk = {"choices": [{"index": 0, "delta": {"content": f" word{i}"}, "finish_reason": None}]}
                self.wfile.write(b"data: " + json.dumps(chunk).encode() + b"\n\n")
                self.wfile.flush()
                threading.Event().wait(0.05)
        except (BrokenPipeError, ConnectionResetError):
            pass


def test_a_text_only_engine_streams_to_the_chat_and_stop_ends_it(qtbot):
    from diffuse.studio.remote_dialog import StudioRemoteModel
    from diffuse.studio.run_state import RunState
    from diffuse.studio.workers import Engine
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), TextOnly)
    httpd.daemon_threads = True
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        model = StudioRemoteModel(RemoteModel.connect(f"127.0.0.1:{httpd.server_address[1]}"))
        assert "sends text only" in model.views_note() and "vllm server" in model.status_text()
        engine, texts, finished = Engine(), [], []
        engine.model = model
        model.text_arrived.connect(texts.append)
        engine.run_finished.connect(finished.append)
        run = RunState("Hi", {"gen_length": 16, "chat": True}, {"name": model.name}, model.tokenizer.decode)
        engine.start(run)
        qtbot.waitUntil(lambda: len(texts) >= 3, timeout=WAIT_MS)
        model.cancel()
        qtbot.waitUntil(lambda: bool(finished), timeout=WAIT_MS)
        assert run.result.stop_reason == "cancelled" and run.result.text.startswith("".join(texts[:3]))
        assert run.n_steps == 0
        assert engine.shutdown(WAIT_MS)
    finally:
        httpd.shutdown()
        httpd.server_close()
