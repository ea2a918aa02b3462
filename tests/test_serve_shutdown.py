"""Ctrl-C on a real `diffuse serve` with requests in flight: each is answered with the shutdown's
OpenAI error (a stream: an error event, then [DONE]), and nothing is traced on the terminal."""
from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

DEMO = Path(__file__).resolve().parents[1] / "models" / "diffuse-demo-3m.gguf"
JSON = {"Content-Type": "application/json"}
LONG = {"prompt": "It was", "max_tokens": 240, "steps": 240, "block_length": 0, "cache": False, "seed": 1}


def ask(url: str, answer: dict) -> None:
    try:
        with urllib.request.urlopen(urllib.request.Request(url + "/v1/completions", json.dumps(LONG).encode(), JSON),
                                    timeout=60) as r:
            answer.update(status=r.status)
    except urllib.error.HTTPError as e:
        with e:
            answer.update(status=e.code, body=json.loads(e.read()))


def running(url: str) -> int:
    with urllib.request.urlopen(url + "/health", timeout=30) as r:
        return json.loads(r.read())["running"]


def test_ctrl_c_answers_the_requests_in_flight():
    command = [sys.executable, "-m", "diffuse.cli", "serve", "-m", str(DEMO), "--port", "0", "--threads", "1"]
    with subprocess.Popen(command, stderr=subprocess.PIPE, text=True) as proc:
        try:
            url = re.search(r"at (http://\S+)/v1,", proc.stderr.readline()).group(1)
            with urllib.request.urlopen(urllib.request.Request(
                    url + "/v1/completions", json.dumps({**LONG, "stream": True, "diffusion_events": True}).encode(),
                    JSON), timeout=60) as stream:
                assert stream.readline().startswith(b"data: ")      # its first step: running
                plain: dict = {}
                asker = threading.Thread(target=ask, args=(url, plain))
                asker.start()
                deadline = time.monotonic() + 30
                while running(url) < 2:      # both requests in the batch
                    assert time.monotonic() < deadline
                proc.send_signal(signal.SIGINT)
                events = [line for line in stream.read().decode().split("\n") if line]
            asker.join(30)
            assert proc.wait(timeout=30) == 130
            log = proc.stderr.read()
        finally:
            proc.kill()
    assert events[-1] == "data: [DONE]"
    assert json.loads(events[-2].removeprefix("data: "))["error"]["code"] == "server_shutdown"
    assert plain["status"] == 503 and plain["body"]["error"] == {
        "message": "the server is shutting down", "type": "server_error", "param": None, "code": "server_shutdown"}
    assert "Traceback" not in log and "Error" not in log, log
    assert log.count(" POST /v1/completions 503 ") == 1 and log.count(" POST /v1/completions 200 ") == 1
