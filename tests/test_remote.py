"""diffuse.remote: a model behind an OpenAI-compatible server. Against our own `diffuse serve` (step
events rebuilt into the local run's StepEvents), and against hostile or broken servers, each a few
lines of http.server: every failure is one clear line, and no answer can take the client's memory
or hang it. (llama.cpp's llama-server: test_remote_llama.py.)"""
from __future__ import annotations

import http.server
import json
import socket
import threading
import time
from pathlib import Path

import numpy as np
import pytest

import diffuse
from diffuse import DiffuseError, remote
from diffuse.remote import Endpoint, RemoteModel
from diffuse.serve import Server

DEMO = Path(__file__).resolve().parents[1] / "models" / "diffuse-demo-3m.gguf"
KEY = "remote-test-key"


@pytest.fixture(scope="module")
def model():
    return diffuse.load(DEMO, threads=1)


@pytest.fixture(scope="module")
def server(model):
    s = Server(model, port=0, api_key=KEY, max_batch=4)
    s.start()
    yield s
    s.stop()


@pytest.fixture(scope="module")
def remote_model(server):
    return RemoteModel.connect(server.url, KEY, timeout=60)


# ---- diffuse serve ---------------------------------------------------------------------------

def assert_same_steps(model, remote_model, remote_events: list, local_events: list) -> None:
    """The server's step events, rebuilt by the client, are the local run's with the prompt left
    out: every field a live view reads, token texts and end-of-text ids included."""
    assert remote_events
    for r, e in zip(remote_events, local_events, strict=False):
        p = e.prompt_length            # the remote event is the answer alone
        assert (r.step, r.block, r.n_blocks, r.steps_allowed, r.prompt_length, r.scheduled) == \
               (e.step, e.block, e.n_blocks, e.steps_allowed, 0, e.scheduled)
        assert (r.block_start, r.block_end) == (max(e.block_start - p, 0), e.block_end - p)
        np.testing.assert_array_equal(r.tokens, e.gen_tokens)
        np.testing.assert_array_equal(r.mask, e.gen_mask)
        np.testing.assert_array_equal(r.unmasked, np.asarray(e.unmasked) - p)
        np.testing.assert_array_equal(r.edited, np.asarray(e.edited) - p)
        np.testing.assert_allclose(r.entropy, e.entropy[p:], atol=1e-4)    # rounded to 4 places on the wire
        np.testing.assert_allclose(r.confidence, e.confidence[p:], atol=1e-4)
        answer = np.asarray(e.active) >= p      # the prompt's positions stay on the server
        np.testing.assert_array_equal(r.active, np.asarray(e.active)[answer] - p)
        np.testing.assert_array_equal(r.cached, np.asarray(e.cached)[np.asarray(e.cached) >= p] - p)
        if e.experts is None:
            assert r.experts is None
        else:
            np.testing.assert_array_equal(r.experts, np.asarray(e.experts)[:, answer])
    decided = {int(t) for r in remote_events for t in r.tokens[~r.mask]}
    assert decided and all(remote_model.tokenizer.decode([t]) == model.tokenizer.decode([t]) for t in decided)
    assert remote_model.tokenizer.eos_token_ids == set(model.tokenizer.eos_token_ids)
    assert remote_model.views_note() == ""       # nothing the views read is missing


@pytest.mark.parametrize("options", [
    dict(gen_length=32, steps=8, seed=5),
    # tau commits past the schedule's count, the cache serves most positions, blocks of 16
    dict(gen_length=64, steps=32, block_length=16, scheduler="entropy_exit", cache=True, seed=1, temperature=0.0),
    dict(gen_length=64, steps=32, preset="fast-dllm-threshold-dual-cache", seed=2),
])
def test_steps_from_diffuse_serve_are_the_local_runs_steps(model, remote_model, options):
    assert remote_model.steps_sent and remote_model.id == "diffuse-demo-3m"
    local_events, remote_events = [], []
    preset = diffuse.generation.preset(options.pop("preset")) if "preset" in options else {}
    local = model.generate("Tell me a story.", on_step=local_events.append, **preset, **options)
    result = remote_model.generate("Tell me a story.", on_step=remote_events.append, **preset, **options)
    assert result.text == local.text and result.useful_length == local.useful_length
    # The server ends an answer once its text is final (end-of-text decided and all before it),
    # which may be before the last step: the steps it ran are the local run's first ones.
    assert 0 < len(remote_events) == result.steps <= local.steps and result.steps_allowed == local.steps_allowed
    assert result.stop_reason == ("eos" if result.steps < local.steps else local.stop_reason)
    np.testing.assert_array_equal(result.tokens, local_events[result.steps - 1].gen_tokens)
    assert_same_steps(model, remote_model, remote_events, local_events)
    if {**preset, **options}.get("cache"):
        assert any(len(e.cached) for e in remote_events)


def test_the_models_facts_are_listed(model, remote_model):
    assert (remote_model.arch, remote_model.n_ctx_train, remote_model.recipe, remote_model.n_expert) == \
           (model.arch, model.n_ctx_train, model.recipe, 0)


@pytest.mark.parametrize("family, options", [
    ("llada-moe", dict(gen_length=32, steps=8, seed=3, cache=True)),      # experts (the Experts view)
    ("sdar", dict(gen_length=16, steps=8, seed=3)),          # block diffusion: block 0 begins in the prompt
    ("llada2", dict(gen_length=64, preset="llada2.1-speed")),       # experts and editing
])
def test_moe_block_diffusion_and_editing_over_the_network(tiny_gguf, family, options):
    model = diffuse.load(tiny_gguf(family, "f32"), threads=1)
    server = Server(model, port=0, max_batch=2)
    server.start()
    try:
        remote_model = RemoteModel.connect(server.url, timeout=60)
        assert remote_model.n_expert == model.n_expert
        if "preset" in options:
            options = {**diffuse.generation.preset(options.pop("preset")), **options}
        local_events, remote_events = [], []
        model.generate("Hello there", chat=False, on_step=local_events.append, **options)
        remote_model.generate("Hello there", chat=False, on_step=remote_events.append, **options)
        assert_same_steps(model, remote_model, remote_events, local_events)
        if model.n_expert:
            assert all(r.experts is not None and r.experts.shape[1] == len(r.active) > 0 for r in remote_events)
        if family == "sdar":
            assert local_events[0].block_start < local_events[0].prompt_length
        if family == "llada2":
            assert sum(len(r.edited) for r in remote_events) > 0
    finally:
        server.stop()


def test_completion_and_options_reach_diffuse_serve(model, remote_model):
    local = model.generate("It was", chat=False, gen_length=16, steps=4, seed=3, temperature=0.5)
    result = remote_model.generate("It was", chat=False, gen_length=16, steps=4, seed=3, temperature=0.5)
    assert result.text == local.text and result.steps == 4
    assert remote_model.not_sent({"steps": 4, "cache": True}) == []


def test_a_listener_cancels_and_the_answer_so_far_comes_back(remote_model):
    seen = []
    result = remote_model.generate("Tell me a story.", gen_length=64, steps=32, seed=1,
                                   on_step=lambda e: seen.append(e) or len(seen) < 3)
    assert result.stop_reason == "cancelled" and result.steps == 3 and len(seen) == 3


def test_chat_messages_are_sent_as_they_are(model, remote_model):
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello"}]
    local = model.generate(model.tokenizer.encode_chat(messages), chat=False, gen_length=16, steps=4, seed=2)
    assert remote_model.generate(messages, gen_length=16, steps=4, seed=2).text == local.text


def test_key_model_and_address_errors_are_one_line(server):
    with pytest.raises(DiffuseError, match=r"refused the API key \(401.*--api-key or \$DIFFUSE_API_KEY"):
        RemoteModel.connect(server.url)
    with pytest.raises(DiffuseError, match="refused the API key") as e:
        RemoteModel.connect(server.url, "wrong")
    assert "--api-key" not in str(e.value)      # a key was given: no hint to give one
    with pytest.raises(DiffuseError, match="no model 'other' there; it serves diffuse-demo-3m"):
        RemoteModel.connect(server.url, KEY, model="other")
    with pytest.raises(DiffuseError, match=r"404 Not Found.*usually ends in /v1"):
        RemoteModel.connect(server.url.replace("/v1", "/api"), KEY)
    with socket.socket() as s:        # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(DiffuseError, match=f"cannot connect to 127.0.0.1:{port}: connection refused"):
        RemoteModel.connect(f"127.0.0.1:{port}")
    with pytest.raises(DiffuseError, match="answered 400 Bad Request: .*temperature"):
        RemoteModel.connect(server.url, KEY).generate("Hi", gen_length=16, temperature=-1.0)


@pytest.mark.parametrize("url, expected", [
    ("localhost:8080", "http://localhost:8080/v1"),
    ("http://127.0.0.1:8080/v1/", "http://127.0.0.1:8080/v1"),
    ("https://example.com", "https://example.com/v1"),
    ("https://example.com/openai/v1/chat/completions", "https://example.com/openai/v1"),
    ("http://[::1]:9000/v1", "http://[::1]:9000/v1"),
])
def test_urls_as_people_type_them(url, expected):
    assert Endpoint.parse(url).url == expected


@pytest.mark.parametrize("url, message", [
    ("ftp://host/v1", "not a server URL"), ("http://", "not a server URL"),
    ("http://user:secret@host/v1", "not in the URL"), ("http://host/v1?x=1", r"no \?query"),
    ("http://host:99999/v1", "not a server URL"),
])
def test_bad_urls_are_refused(url, message):
    with pytest.raises(DiffuseError, match=message):
        Endpoint.parse(url)


def test_a_key_with_a_newline_is_refused_before_sending():
    with pytest.raises(DiffuseError, match="control character"):
        remote.Connection("localhost:1", "key\r\nX-Injected: 1")


# ---- other and hostile servers ------------------------------------------------------------------

MODELS = {"object": "list", "data": [{"id": "other-model", "object": "model", "owned_by": "someone"}]}


def chunk(text: str | None = None, finish: str | None = None) -> bytes:
    delta = {} if text is None else {"content": text}
    body = {"object": "chat.completion.chunk", "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}
    return b"data: " + json.dumps(body).encode() + b"\n\n"


class Fake:
    """An HTTP server whose POST answers are written by `post(handler)`; /v1/models lists one model."""

    def __init__(self, post, models: bytes = json.dumps(MODELS).encode(), content_type="application/json"):
        fake = self
        self.bodies: list[dict] = []

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_GET(self):
                self.send_response(200)
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(models)))
                self.end_headers()
                self.wfile.write(models)

            def do_POST(self):
                fake.bodies.append(json.loads(self.rfile.read(int(self.headers["Content-Length"]))))
                try:
                    post(self)
                except (BrokenPipeError, ConnectionResetError):
                    pass        # the client gave up, as it should

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def fake():
    made = []

    def make(post, **kwargs) -> Fake:
        made.append(Fake(post, **kwargs))
        return made[-1]
    yield make
    for f in made:
        f.close()


def sse(handler) -> None:
    handler.send_response(200)
    handler.send_header("Content-Type", "text/event-stream")
    handler.end_headers()


def test_another_engine_streams_text_and_gets_openais_fields_only(fake):
    def post(h):
        sse(h)
        for piece in ("Paris", " is", " the capital."):
            h.wfile.write(chunk(piece))
            h.wfile.flush()
        h.wfile.write(chunk(finish="stop") + b"data: [DONE]\n\n")
    f = fake(post)
    m = RemoteModel.connect(f.url)
    texts = []
    r = m.generate("Capital of France?", on_text=texts.append, gen_length=20, temperature=0.2, steps=8, seed=1,
                   cache=None)
    assert r.text == "Paris is the capital." and texts == ["Paris", " is", " the capital."]
    assert not m.steps_sent and r.steps == 0 and r.stop_reason == "eos"
    body = f.bodies[0]
    assert body["max_tokens"] == 20 and body["temperature"] == 0.2 and body["seed"] == 1 and body["stream"]
    assert "steps" not in body and "diffusion_events" not in body and body["model"] == "other-model"
    assert m.not_sent({"steps": 8, "temperature": 0.2, "cache": None}) == ["steps"]


def test_a_server_that_does_not_stream_still_answers(fake):
    def post(h):
        body = json.dumps({"choices": [{"index": 0, "message": {"content": "whole"}, "finish_reason": "stop"}]})
        h.send_response(200)
        h.send_header("Content-Type", "application/json")
        h.end_headers()
        h.wfile.write(body.encode())
    assert RemoteModel.connect(fake(post).url).generate("Hi").text == "whole"


@pytest.mark.parametrize("models, content_type, message", [
    (b"<html>It works!</html>", "text/html", "did not answer as an OpenAI-compatible server.*text/html"),
    (b'{"data": "nope"}', "application/json", "no data list"),
    (b'{"object": "list", "data": []}', "application/json", "lists no models"),
])
def test_non_openai_answers(fake, models, content_type, message):
    with pytest.raises(DiffuseError, match=message):
        RemoteModel.connect(fake(lambda h: None, models=models, content_type=content_type).url)


def hostile(fake, post, timeout: float = 30) -> RemoteModel:
    return RemoteModel.connect(fake(post).url, timeout=timeout)


def test_a_huge_event_is_refused_without_reading_it_all(fake):
    def post(h):
        sse(h)
        h.wfile.write(b"data: " + b"x" * (remote.MAX_EVENT_BYTES + 1024))    # no end of line, ever
    with pytest.raises(DiffuseError, match="an event over 8 MiB"):
        hostile(fake, post).generate("Hi")


def test_an_endless_stream_stops_at_the_bound(fake, monkeypatch):
    monkeypatch.setattr(remote, "MAX_STREAM_BYTES", 1 << 20)

    def post(h):
        sse(h)
        while True:
            h.wfile.write(chunk("more text "))
    with pytest.raises(DiffuseError, match="stream passed 1 MiB; stopped"):
        hostile(fake, post).generate("Hi")


def test_endless_step_events_stop_at_the_bound(fake, monkeypatch):
    monkeypatch.setattr(remote, "MAX_STREAM_BYTES", 1 << 20)
    step = {"index": 0, "step": 0, "block": 0, "n_blocks": 1, "steps_allowed": 10**9, "tokens": [1] * 64,
            "mask": [True] * 64, "unmasked": [], "edited": [], "entropy": [1.0] * 64, "active": 64, "cached": 0,
            "forward_ms": 1, "sample_ms": 1, "total_ms": 2}
    line = b"data: " + json.dumps({"choices": [], "diffusion": step}).encode() + b"\n\n"

    def post(h):
        sse(h)
        while True:
            h.wfile.write(line)
    seen = []
    with pytest.raises(DiffuseError, match="stream passed 1 MiB"):
        m = hostile(fake, post)
        m.steps_sent = True
        m.generate("Hi", on_step=seen.append)
    assert 0 < len(seen) < (1 << 20) // len(line) + 1


def test_a_server_that_stalls_ends_the_run(fake):
    def silent(h):
        sse(h)
        time.sleep(5)
    started = time.monotonic()
    with pytest.raises(DiffuseError, match=r"stalls"):
        hostile(fake, silent, timeout=0.5).generate("Hi")
    assert time.monotonic() - started < 4.5


def test_a_server_that_drips_bytes_ends_the_run(fake):
    def drip(h):
        sse(h)
        for _ in range(40):          # a byte every 0.1 s: every read succeeds, no event ever ends
            h.wfile.write(b"d")
            h.wfile.flush()
            time.sleep(0.1)
    with pytest.raises(DiffuseError, match=r"no event from the server in 0.5 s"):
        hostile(fake, drip, timeout=0.5).generate("Hi")


@pytest.mark.parametrize("body, message", [
    (chunk("half an answer"), "closed the stream before the answer ended"),
    (b"data: {not json\n\n", "an event that is not OpenAI's JSON"),
    (b'data: {"error": {"message": "the engine failed", "type": "server_error"}}\n\ndata: [DONE]\n\n',
     "the server failed: the engine failed"),
    (chunk("cut") + b"data: [DONE]\n\n", "ended without a finish_reason"),
    (b'data: {"choices": [], "diffusion": {"index": 0, "step": 0, "tokens": [1, 2], "mask": [true]}}\n\n',
     "a step event that is not diffuse serve's"),
    (b'data: {"choices": [], "diffusion": {"index": 0, "step": 0, "block": 0, "n_blocks": 1, "steps_allowed": 1, '
     b'"tokens": [1], "mask": [true], "entropy": [null], "unmasked": [7], "forward_ms": 0, "sample_ms": 0, '
     b'"total_ms": 0}}\n\n', "positions or lengths that do not fit"),
])
def test_broken_streams_are_one_line(fake, body, message):
    def post(h):
        sse(h)
        h.wfile.write(body)
    m = hostile(fake, post)
    m.steps_sent = True         # read its step events as diffuse serve's
    with pytest.raises(DiffuseError, match=message):
        m.generate("Hi")


@pytest.mark.parametrize("status, body, message", [
    (404, {"error": {"message": "The model `other-model` does not exist."}}, "no model 'other-model' there"),
    (500, {"error": {"message": "out of memory"}}, "answered 500 Internal Server Error: out of memory"),
    (429, {"detail": "slow down"}, "answered 429 Too Many Requests: slow down"),
    (502, "<html><body>Bad Gateway</body></html>", "502 Bad Gateway: text/html.*Bad Gateway"),
])
def test_refusals_quote_the_servers_message(fake, status, body, message):
    def post(h):
        data = body.encode() if isinstance(body, str) else json.dumps(body).encode()
        h.send_response(status)
        h.send_header("Content-Type", "text/html" if isinstance(body, str) else "application/json")
        h.send_header("Content-Length", str(len(data)))
        h.end_headers()
        h.wfile.write(data)
    with pytest.raises(DiffuseError, match=message):
        hostile(fake, post).generate("Hi")


def test_step_event_fields_are_read_and_their_absence_named(fake):
    """Token texts, top-1 probabilities, the schedule's count, block bounds and cache positions, and
    the model facts in /v1/models, are read; a server that leaves them out (an older diffuse serve)
    is named in the views' note for what it lacks."""
    full = {"index": 0, "step": 0, "block": 0, "n_blocks": 2, "steps_allowed": 2, "tokens": [7, 9, 0, 0],
            "mask": [False, False, True, True], "unmasked": [0, 1], "edited": [], "entropy": [0.5, 0.25, 1, 1],
            "confidence": [0.9, None, 0.5, 0.5], "scheduled": 1, "block_start": -2, "block_end": 2,
            "active": [0, 1], "cached": [2, 3], "pieces": {"7": "Hel", "9": "lo"}, "eos_ids": [5],
            "forward_ms": 1, "sample_ms": 1, "total_ms": 2}
    bare = {k: v for k, v in full.items() if k not in ("confidence", "scheduled", "block_start", "block_end",
                                                         "pieces", "eos_ids")} | {"active": 2, "cached": 2}

    def post(h):
        sse(h)
        for d in (full, bare):
            h.wfile.write(b"data: " + json.dumps({"choices": [], "diffusion": d}).encode() + b"\n\n")
        h.wfile.write(chunk("Hello", "stop") + b"data: [DONE]\n\n")
    models = {"data": [{"id": "d", "owned_by": "diffuse", "diffuse": {"arch": "llada", "n_ctx_train": 4096,
                                                                      "recipe": {"steps": 64}}}]}
    m = RemoteModel.connect(fake(post, models=json.dumps(models).encode()).url)
    assert (m.steps_sent, m.arch, m.n_ctx_train, m.recipe) == (True, "llada", 4096, {"steps": 64})
    events = []
    m.generate("Hi", on_step=lambda e: events.append((e, m.views_note())))
    (first, note_full), (second, note_bare) = events
    assert (first.block_start, first.block_end, first.scheduled) == (0, 2, 1) and note_full == ""
    np.testing.assert_allclose(first.confidence, [0.9, np.nan, 0.5, 0.5], rtol=1e-6)
    np.testing.assert_array_equal(first.cached, [2, 3])
    assert m.tokenizer.decode([7, 9]) == "Hello" and m.tokenizer.eos_token_ids == {5}
    assert (second.block_start, second.block_end, second.scheduled, len(second.active)) == (0, 2, -1, 0)
    assert np.isnan(second.confidence).all()
    assert all(what in note_bare for what in ("token texts", "top-1 probabilities", "Cache view"))
