"""Server.switch_model on a real server: the Studio's "Serve the loaded model instead" without a
restart. Requests accepted before the switch finish on the old model, later ones get the new one,
/v1/models says which, and no connection is refused meanwhile."""
from __future__ import annotations

import concurrent.futures
import json
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

import diffuse
from diffuse import DiffuseError
from diffuse.serve import Server

DEMO = Path(__file__).resolve().parents[1] / "models" / "diffuse-demo-3m.gguf"
ASK = {"prompt": "It was", "max_tokens": 32, "steps": 16, "seed": 3}


def post(url: str, body: dict) -> dict:
    request = urllib.request.Request(url + "/completions", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=120) as r:
        return json.loads(r.read())


def get(url: str, path: str) -> dict:
    with urllib.request.urlopen(url + path, timeout=60) as r:
        return json.loads(r.read())


def wait_until(condition, what: str) -> None:
    deadline = time.monotonic() + 60
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.01)


def new_id(model) -> str:
    return Path(model.path).stem


def test_requests_in_flight_finish_on_the_old_model_and_new_ones_get_the_new(tiny_gguf):
    old, new = diffuse.load(DEMO, threads=1), diffuse.load(tiny_gguf("llada", "f32"), threads=1)
    server = Server(old, port=0, max_batch=1)     # one at a time: the second request waits in the queue
    release, held = threading.Event(), threading.Event()
    first = [old.encode_prompt("It was", chat=False)]

    def hold_the_first(job, index, event):     # the first request stays in flight until released
        if job.request.prompts == first:
            held.set()
            release.wait(60)
    server.batcher.step_listeners.append(hold_the_first)
    server.start()
    polls, refused = [0], []
    stop_polling = threading.Event()

    def poll():        # a client that keeps asking all along: never refused
        while not stop_polling.is_set():
            try:
                get(server.url, "/models")
                polls[0] += 1
            except (urllib.error.URLError, ConnectionError) as e:
                refused.append(e)
            stop_polling.wait(0.02)
    try:
        poller = threading.Thread(target=poll)
        poller.start()
        with concurrent.futures.ThreadPoolExecutor(3) as pool:
            in_flight = pool.submit(post, server.url, ASK)
            assert held.wait(60)
            queued = pool.submit(post, server.url, {**ASK, "prompt": "Long ago"})
            wait_until(lambda: server.batcher.load() == (1, 1), "the second request to queue")
            server.switch_model(new)
            assert server.model is new and server.model_id == new_id(new)
            entry = get(server.url, "/models")["data"][0]
            assert entry["id"] == new_id(new) and entry["diffuse"]["arch"] == new.arch
            assert entry["diffuse"]["n_ctx_train"] == new.n_ctx_train
            after = pool.submit(post, server.url, {**ASK, "prompt": "Hello there"})
            wait_until(lambda: server.batcher.load() == (2, 1), "the new model's request to queue")
            release.set()
            answers = [f.result() for f in (in_flight, queued, after)]
        assert [a["model"] for a in answers] == ["diffuse-demo-3m", "diffuse-demo-3m", new_id(new)]
        for a, (model, prompt) in zip(answers, [(old, "It was"), (old, "Long ago"), (new, "Hello there")]):
            local = model.generate(prompt, chat=False, gen_length=32, steps=16, seed=3)
            assert a["choices"][0]["text"] == local.text
        assert [e["status"] for e in server.batcher.log] == ["ok"] * 3
    finally:
        release.set()
        stop_polling.set()
        poller.join(60)
        server.stop()
    assert polls[0] > 0 and refused == []


def test_a_model_without_a_tokenizer_is_refused_and_the_old_one_serves_on(tmp_path):
    server = Server(diffuse.load(DEMO, threads=1), port=0, max_batch=2)
    server.start()
    try:
        broken = diffuse.load(DEMO, threads=1, tokenizer=tmp_path / "missing.json")
        with pytest.raises(DiffuseError, match="missing.json"):
            server.switch_model(broken)
        assert get(server.url, "/models")["data"][0]["id"] == "diffuse-demo-3m"
        assert post(server.url, ASK)["model"] == "diffuse-demo-3m"
    finally:
        server.stop()
