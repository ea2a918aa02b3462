"""Loading another model while serving: the server keeps serving the file it has (no silent stop,
no refused connection), the log and the status line say so, and the switch to the loaded model
restarts it on the same port."""
from __future__ import annotations

import json
import urllib.request
from pathlib import Path

import pytest

import diffuse
from diffuse.studio.serve_panel import ServePanel

DEMO = Path(__file__).resolve().parents[2] / "models" / "diffuse-demo-3m.gguf"


def complete(url: str) -> dict:
    body = json.dumps({"prompt": "It was", "max_tokens": 8, "steps": 8}).encode()
    request = urllib.request.Request(url + "/completions", data=body,
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=60) as r:
        return json.loads(r.read())


@pytest.fixture
def panel(qtbot):
    p = ServePanel()
    qtbot.addWidget(p)
    p.port.setValue(0)
    yield p
    p.stop()
    qtbot.waitUntil(lambda: not p.serving(), timeout=10000)


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
