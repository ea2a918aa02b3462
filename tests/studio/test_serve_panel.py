"""The Serve panel: switch on and off without blocking the GUI, URL, snippet, request log; loading
another model while serving: the server keeps serving its file (no silent stop, no refused connection),
the log and the status line say so, and serving the loaded model switches the running server."""
from __future__ import annotations

import json
import socket
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from PySide6.QtGui import QGuiApplication

import diffuse
from diffuse.studio.serve_panel import ServePanel

DEMO = Path(__file__).resolve().parents[2] / "models" / "diffuse-demo-3m.gguf"


@pytest.fixture(scope="module")
def model():
    return diffuse.load(DEMO, threads=1)


@pytest.fixture
def panel(qtbot):
    p = ServePanel()
    qtbot.addWidget(p)
    p.port.setValue(0)
    yield p
    p.stop()
    qtbot.waitUntil(lambda: not p.serving(), timeout=10000)


def test_serve_switch_url_snippet_and_log(qtbot, panel, model):
    assert not panel.switch.isEnabled()
    panel.set_model(model)
    panel.api_key.setText("k")
    panel.switch.setChecked(True)
    assert panel.serving() and panel.url.text() == panel.server.url
    assert panel.server.url in panel.snippet.toPlainText() and "Bearer k" in panel.snippet.toPlainText()
    assert not panel.port.isEnabled()

    body = json.dumps({"prompt": "It was", "max_tokens": 8}).encode()
    request = urllib.request.Request(panel.server.url + "/completions", data=body,
                                     headers={"Authorization": "Bearer k", "Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=30) as r:
        assert json.loads(r.read())["choices"][0]["finish_reason"]
    qtbot.waitUntil(lambda: "completion ok" in panel.log.toPlainText(), timeout=5000)

    panel.copy_button.click()
    assert QGuiApplication.clipboard().text() == panel.snippet.toPlainText()

    panel.switch.setChecked(False)
    qtbot.waitUntil(lambda: panel.status.text() == "Not serving.", timeout=10000)
    assert not panel.serving() and panel.port.isEnabled() and not panel.url.text()


def test_a_taken_port_is_said_not_raised(panel, model):
    with socket.create_server(("127.0.0.1", 0)) as taken:
        panel.set_model(model)
        panel.port.setValue(taken.getsockname()[1])
        panel.switch.setChecked(True)
    assert not panel.serving() and not panel.switch.isChecked()
    assert "cannot listen" in panel.status.text()


def test_the_live_views_follow_a_served_request(qtbot, window, model):
    window.set_model(model)
    panel = window.serve_panel
    panel.port.setValue(0)
    assert window.serve_label.text() == ""
    panel.switch.setChecked(True)
    try:
        # the status bar says the server's state, wherever the side panel is
        assert window.serve_label.text() == f"serving diffuse-demo-3m at {panel.server.url}"
        assert window.serve_label.isVisibleTo(window)
        body = json.dumps({"prompt": "It was", "max_tokens": 16, "steps": 8}).encode()
        request = urllib.request.Request(panel.server.url + "/completions", data=body,
                                         headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=30) as r:
            text = json.loads(r.read())["choices"][0]["text"]
        qtbot.waitUntil(lambda: window.run is not None and window.run.done, timeout=10000)
        run = window.run
        assert window.served[1] is run and run.n_steps == run.result.steps > 0
        assert run.result.text.startswith(text) and "served request" in window.statusBar().currentMessage()
        # its CPU load over the run, as for the user's own runs, not the load now
        assert run.cpu_percent is not None
        window.views.setCurrentWidget(window.throughput)
        qtbot.waitUntil(lambda: "whole run" in window.throughput.cpu_plot.getAxis("bottom").labelText,
                        timeout=5000)

        panel.follow.setChecked(False)      # switched off: the next request leaves the views alone
        with urllib.request.urlopen(request, timeout=30) as r:
            r.read()
        qtbot.waitUntil(lambda: panel.log.toPlainText().count("completion ok") == 2, timeout=5000)
        assert window.run is run
    finally:
        panel.stop()
        qtbot.waitUntil(lambda: not panel.serving(), timeout=10000)
    qtbot.waitUntil(lambda: window.serve_label.text() == "", timeout=10000)    # once stopped


def test_refused_requests_are_logged_with_their_reason(qtbot, panel, model):
    panel.set_model(model)
    panel.switch.setChecked(True)
    body = json.dumps({"prompt": "It was", "n": 99}).encode()
    request = urllib.request.Request(panel.server.url + "/completions", data=body,
                                     headers={"Content-Type": "application/json"})
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(request, timeout=30)
    refused.value.close()
    assert refused.value.code == 400
    qtbot.waitUntil(lambda: "POST /v1/completions 400: n must be in [1, 8]" in panel.log.toPlainText(),
                    timeout=5000)


# ---- loading another model while serving ----

def complete(url: str) -> dict:
    body = json.dumps({"prompt": "It was", "max_tokens": 8, "steps": 8}).encode()
    request = urllib.request.Request(url + "/completions", data=body,
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=60) as r:
        return json.loads(r.read())


def test_the_server_keeps_serving_while_the_studio_switches_models(qtbot, panel, tiny_gguf):
    demo, tiny = diffuse.load(DEMO, threads=1), diffuse.load(tiny_gguf("llada", "f32"), threads=1)
    lines, followed = [], []
    panel.state_changed.connect(lines.append)
    panel.served_step.connect(lambda job, ev: followed.append(job))
    panel.set_model(demo)
    panel.switch.setChecked(True)
    url, port = panel.server.url, panel.server.port
    assert lines[-1] == f"serving diffuse-demo-3m at {url}" == panel.state_line()

    panel.set_model(tiny)                                   # the Studio loads another model
    assert panel.serving() and panel.served_model is demo
    assert complete(url)["model"] == "diffuse-demo-3m"      # still answered, by the old file
    log = panel.log.toPlainText()
    assert f"the Studio loaded {Path(tiny.path).stem}; the server keeps serving diffuse-demo-3m" in log
    assert "not the loaded model" in lines[-1] and "not the model the Studio has loaded" in panel.status.text()
    assert panel.swap_button.isVisibleTo(panel) and not followed    # the views decode with the loaded model

    panel.swap_button.click()
    qtbot.waitUntil(lambda: panel.serving() and panel.served_model is tiny, timeout=20000)
    assert panel.server.port == port and panel.server.url == url        # the same address
    assert "now serving llada-f32; requests already accepted finish on diffuse-demo-3m" in panel.log.toPlainText()
    assert complete(url)["model"] == panel.server.model_id != "diffuse-demo-3m"
    assert not panel.swap_button.isVisibleTo(panel)
    assert lines[-1].startswith(f"serving {panel.server.model_id} at")
    qtbot.waitUntil(lambda: bool(followed), timeout=5000)               # followed again

    panel.switch.setChecked(False)
    qtbot.waitUntil(lambda: not panel.serving() and panel.state_line() == "", timeout=10000)
    assert "stopped serving" in panel.log.toPlainText()


def test_a_refused_address_is_forgotten_once_changed(panel):
    import socket
    panel.set_model(diffuse.load(DEMO, threads=1))
    with socket.create_server(("127.0.0.1", 0)) as taken:
        panel.port.setValue(taken.getsockname()[1])
        panel.switch.setChecked(True)
        assert "cannot listen" in panel.status.text()
    panel.port.setValue(0)
    assert panel.status.text() == "Not serving."


def test_a_client_cut_off_is_said_in_place_of_its_runs_status(panel):
    """The server cut a client that read nothing (serve/app.py's write stall): its run's 'ok' (every
    token made) and the 200 sent before the cut are not what the client got."""
    ran = {"id": 7, "kind": "chat", "status": "ok", "prompt_tokens": 12, "completion_tokens": 64, "steps": 64,
           "batch": 1, "queued_ms": 3.0, "run_ms": 900.0, "sequences": 1, "seed": 5}
    entry = {"method": "POST", "path": "/v1/chat/completions", "status": 200, "ms": 30900.0, "client": "127.0.0.1:5",
             "request": ran, "error": "the client read nothing for 30 s", "cut_off": True}
    panel.request_logged.emit(entry)
    panel.request_logged.emit(entry | {"request": None})       # cut before its request ran
    panel.request_logged.emit(entry | {"error": "the client went away", "cut_off": False})
    cut, cut_early, went = [line.split("  ", 1)[1] for line in panel.log.toPlainText().splitlines()[-3:]]
    assert cut == ("#7 chat cut off, the client read nothing for 30 s: 12+64 tokens, 64 steps, batch of 1, "
                   "waited 3 ms, ran 900 ms")
    assert cut_early == "POST /v1/chat/completions cut off, the client read nothing for 30 s"
    assert went.startswith("#7 chat ok: 12+64 tokens") and went.endswith("ran 900 ms (the client went away)")
