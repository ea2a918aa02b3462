"""`diffuse serve` against hostile clients, all on 127.0.0.1 and bounded.

Tried here: 2 slow clients (headers and body a byte at a time), a client gone mid-body, 4
concurrent 4 MB prompts, 6 concurrent 12 MB bodies of millions of tiny values, 2 prompts with lone
surrogates, 48 concurrent stop-string requests, a stream client that stops reading, 4 foreign Host
headers, 3 foreign Origin headers, 3 wrong content types."""
from __future__ import annotations

import asyncio
import concurrent.futures
import http.client
import json
import select
import socket
import time
from pathlib import Path

import pytest

import diffuse
from diffuse.serve import Server, batcher, protocol

DEMO = Path(__file__).resolve().parents[2] / "models" / "diffuse-demo-3m.gguf"
JSON = {"Content-Type": "application/json"}


@pytest.fixture(scope="module")
def server():
    s = Server(diffuse.load(DEMO, threads=1), port=0, max_batch=8, head_timeout=1, body_timeout=1,
               cors_origins=("http://localhost:3000",))
    s.log = []
    s.request_listeners.append(s.log.append)
    s.start()
    yield s
    s.stop()


def request(server, method: str, path: str, body: str | bytes | None = None, headers: dict | None = None):
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
    try:
        conn.request(method, path, body, headers or {})
        r = conn.getresponse()
        data = r.read()
        return r.status, dict(r.getheaders()), json.loads(data) if data.startswith(b"{") else data
    finally:
        conn.close()


def trickle(server, data: bytes, first: bytes = b"", gap: float = 0.1) -> bytes:
    """Send `first`, then `data` a byte every `gap` s until the server answers; its answer (at
    most 80 bytes, 8 s, of sending). Sending stops once an answer is there to read, so that no
    byte sent after the server closed makes the connection reset under the answer."""
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as c:
        c.sendall(first)
        for i in range(min(len(data), 80)):
            if select.select([c], [], [], gap)[0]:
                break
            c.sendall(data[i:i + 1])
        reply = b""
        while chunk := c.recv(4096):
            reply += chunk
        return reply


HEAD = b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"


def test_slow_headers_are_timed_out(server):
    reply = trickle(server, HEAD + b"Content-Length: 20\r\n\r\n")
    assert reply.startswith(b"HTTP/1.1 408")
    assert json.loads(reply.partition(b"\r\n\r\n")[2])["error"]["code"] == "request_timeout"


def test_a_slow_body_is_timed_out(server):
    # The headers at once, then the first 5 of 60 body bytes at 10 a second and no more: the body
    # cannot arrive within the 1 s body timeout. (Bytes still trickling when the server answers and
    # closes make the kernel reset the connection under the answer: the sending stops before that.)
    body = b'{"prompt": "hi", "max_tokens": 4}'.ljust(60)
    reply = trickle(server, body[:5], first=HEAD + b"Content-Length: 60\r\n\r\n")
    assert reply.startswith(b"HTTP/1.1 408") and b"the body did not arrive within 1 s" in reply


def test_a_client_gone_mid_body_is_one_log_line(server, capfd):
    before = len(server.log)
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as c:
        c.sendall(HEAD + b"Content-Length: 1000\r\n\r\n{\"prompt\": ")
    deadline = time.monotonic() + 10
    while len(server.log) == before and time.monotonic() < deadline:
        time.sleep(0.02)
    assert [e["status"] for e in server.log[before:]] == [499]
    assert "Traceback" not in capfd.readouterr().err


def test_large_prompts_are_refused_before_tokenising(server):
    prompt = ("lorem ipsum dolor " * 250_000)[:4_000_000]
    body = json.dumps({"prompt": prompt, "max_tokens": 8})

    def send(_):
        return request(server, "POST", "/v1/completions", body, JSON)
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        answers = list(pool.map(send, range(4)))
        assert request(server, "GET", "/v1/models")[0] == 200      # still serving meanwhile
    for status, _, answer in answers:
        assert status == 400 and answer["error"]["code"] == "context_length_exceeded"
        assert "4000000 characters" in answer["error"]["message"]
    chat = json.dumps({"messages": [{"role": "user", "content": prompt}]})
    status, _, answer = request(server, "POST", "/v1/chat/completions", chat, JSON)
    assert status == 400 and answer["error"]["param"] == "messages"


def test_a_chunked_body_too_large_gets_its_413_and_its_memory_back(server):
    """20 MB sent in chunks (no Content-Length to refuse it by): the client reads a 413, not a
    reset, and the server does not keep the 16 MiB it read (it kept 17 MB a request until the
    cycle collector ran)."""
    import psutil

    payload = json.dumps({"prompt": "x" * 20_000_000}).encode()
    process = psutil.Process()
    before = process.memory_info().rss
    for _ in range(3):
        conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
        try:
            conn.request("POST", "/v1/completions", (payload[i:i + 65536] for i in range(0, len(payload), 65536)),
                         {**JSON, "Transfer-Encoding": "chunked"}, encode_chunked=True)
            r = conn.getresponse()
            answer = json.loads(r.read())
        finally:
            conn.close()
        assert r.status == 413 and "larger than 16 MiB" in answer["error"]["message"]
    assert process.memory_info().rss - before < 24 << 20     # not 3 x 17 MB


@pytest.mark.parametrize("path, body", [
    ("/v1/completions", {"prompt": "a\ud800b"}),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "\udfffhi"}]}),
])
def test_a_lone_surrogate_is_a_clean_400(server, path, body):
    status, _, answer = request(server, "POST", path, json.dumps(body), JSON)
    assert status == 400 and "lone surrogate" in answer["error"]["message"]
    assert "/" not in answer["error"]["message"] and "Error" not in answer["error"]["message"]


def test_concurrent_stop_strings_all_answer(server):
    stops = [" of the rest", ",", " the", "and", "\n", "ing", " was a", "time"]

    def ask(i):
        body = {"prompt": "Once upon a time", "max_tokens": 48, "temperature": 0.8, "seed": i, "steps": 24,
                "block_length": i % 3 * 16, "stop": [stops[i % 8], stops[(i * 3 + 1) % 8]]}
        return request(server, "POST", "/v1/completions", json.dumps(body), JSON)
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(ask, range(48)))
    assert [status for status, _, _ in answers] == [200] * 48
    for (_, _, answer), i in zip(answers, range(48)):
        assert not any(s in answer["choices"][0]["text"] for s in (stops[i % 8], stops[(i * 3 + 1) % 8]))


@pytest.mark.parametrize("host", ["evil.example", "evil.example:8080", "127.0.0.1.evil.example", "[::2]:80"])
def test_a_foreign_host_header_is_refused(server, host):
    status, headers, answer = request(server, "GET", "/v1/models", headers={"Host": host})
    assert status == 400 and answer["error"]["code"] == "invalid_host"


@pytest.mark.parametrize("host", ["localhost", "LOCALHOST:1", "127.0.0.1", "[::1]:8080"])
def test_this_machines_names_are_accepted(server, host):
    assert request(server, "GET", "/v1/models", headers={"Host": host})[0] == 200


@pytest.mark.parametrize("origin", ["http://evil.example", "null", "http://localhost:3001"])
def test_a_foreign_origin_is_refused(server, origin):
    body = json.dumps({"prompt": "hi", "max_tokens": 4})
    status, headers, answer = request(server, "POST", "/v1/completions", body, {**JSON, "Origin": origin})
    assert status == 403 and answer["error"]["code"] == "forbidden_origin"
    assert not any(k.lower().startswith("access-control") for k in headers)
    preflight = {"Origin": origin, "Access-Control-Request-Method": "POST"}
    assert request(server, "OPTIONS", "/v1/completions", headers=preflight)[0] == 403


def test_an_allowed_origin_gets_cors_headers(server):
    body = json.dumps({"prompt": "hi", "max_tokens": 4})
    status, headers, _ = request(server, "POST", "/v1/completions", body, {**JSON, "Origin": "http://localhost:3000"})
    assert status == 200 and headers["access-control-allow-origin"] == "http://localhost:3000"
    # What the official JS SDK (openai-node) sends from a browser, its x-stainless-* headers included.
    sdk = ("accept, authorization, content-type, openai-organization, openai-project, x-stainless-arch, "
           "x-stainless-lang, x-stainless-os, x-stainless-package-version, x-stainless-retry-count, "
           "x-stainless-runtime, x-stainless-runtime-version, x-stainless-timeout")
    preflight = {"Origin": "http://localhost:3000", "Access-Control-Request-Method": "POST",
                 "Access-Control-Request-Headers": sdk}
    status, headers, _ = request(server, "OPTIONS", "/v1/completions", headers=preflight)
    assert status == 200 and "POST" in headers["access-control-allow-methods"]
    assert headers["access-control-allow-headers"] == sdk


def test_no_cors_headers_without_an_origin(server):
    status, headers, _ = request(server, "GET", "/v1/models")
    assert status == 200 and not any(k.lower().startswith("access-control") for k in headers)


@pytest.mark.parametrize("content_type", [None, "text/plain", "application/x-www-form-urlencoded"])
def test_only_json_bodies(server, content_type):
    headers = {"Content-Type": content_type} if content_type else {}
    status, _, answer = request(server, "POST", "/v1/completions", json.dumps({"prompt": "hi"}), headers)
    assert status == 415 and answer["error"]["code"] == "unsupported_media_type"


def test_every_request_is_logged_refused_ones_too(server):
    before = len(server.log)
    request(server, "GET", "/v1/models", headers={"Host": "evil.example"})
    request(server, "POST", "/v1/completions", json.dumps({"prompt": "hi", "max_tokens": 4, "seed": 1}), JSON)
    # An entry is written once its response is sent: an earlier test's last one may land after
    # `before` was read, and this test's last one after its answer was read, so the entries are
    # found by what they are, once the last is there.
    def logged():
        return [(e["method"], e["path"], e["status"]) for e in server.log[before:]]
    deadline = time.monotonic() + 30
    while ("POST", "/v1/completions", 200) not in logged() and time.monotonic() < deadline:
        time.sleep(0.01)
    seen = logged()
    first = seen.index(("GET", "/v1/models", 400))
    assert seen[first:] == [("GET", "/v1/models", 400), ("POST", "/v1/completions", 200)]
    entries = server.log[before + first:]
    assert "Host header" in entries[0]["error"]
    assert entries[1]["prompt_tokens"] > 0 and entries[1]["completion_tokens"] > 0 and entries[1]["ms"] > 0


def test_bodies_of_millions_of_values_are_refused_before_parsing():
    """{"prompt": [[1],[1],...]} parsed is 330 MB of lists for 15 MB of JSON: refused by counting
    its structure; six at once are read four at a time (the others wait, within the body timeout),
    and the server answers others meanwhile."""
    s = Server(diffuse.load(DEMO, threads=1), port=0)
    s.start()
    body = b'{"prompt": [' + b",".join([b"[1]"] * 3_000_000) + b"]}"
    try:
        def send(_):
            return request(s, "POST", "/v1/completions", body, JSON)
        with concurrent.futures.ThreadPoolExecutor(6) as pool:
            answers = list(pool.map(send, range(6)))
            assert request(s, "GET", "/v1/models")[0] == 200
    finally:
        s.stop()
    for status, _, answer in answers:
        assert status == 400 and answer["error"]["code"] == "too_many_values"


@pytest.mark.parametrize("body, values", [
    (b'{"a": [1, 2, [3, {"b": 4}]]}', 8), (b'{"p": "a, [b], {c}, \\"d, e\\" ,"}', 2), (b'["\\\\", ","]', 3)])
def test_values_are_counted_outside_strings(body, values):
    protocol.check_structure(body, values)
    with pytest.raises(protocol.BadRequest):
        protocol.check_structure(body, values - 1)


def test_text_with_many_commas_is_judged_by_its_length_not_its_commas(server):
    body = json.dumps({"prompt": "a," * 200_000, "max_tokens": 4})
    status, _, answer = request(server, "POST", "/v1/completions", body, JSON)
    assert status == 400 and answer["error"]["code"] == "context_length_exceeded"


def test_a_stream_client_that_stops_reading_is_cut_off():
    """Its step events are dropped past a bound instead of piling up, and once it has read nothing
    for write_stall seconds its connection is closed and its request cancelled."""
    s = Server(diffuse.load(DEMO, threads=1), port=0, max_batch=8, write_stall=1)
    s.log = []
    s.request_listeners.append(s.log.append)
    s.start()
    try:
        body = json.dumps({"prompt": "It was", "n": 8, "max_tokens": 240, "steps": 240, "block_length": 8,
                           "stream": True, "diffusion_events": True}).encode()
        with socket.socket() as c:
            c.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            c.connect(("127.0.0.1", s.port))
            c.sendall(HEAD + b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
            deadline = time.monotonic() + 120
            while not (s.log and s.batcher.log) and time.monotonic() < deadline:
                time.sleep(0.1)
            # the connection is really ended: the client, reading at last, meets its end (a reset or
            # the end of the stream) instead of waiting on a socket the server has given up
            c.settimeout(30)
            with pytest.raises(ConnectionResetError):
                while c.recv(1 << 16):
                    pass
        assert s.log[0]["error"] == "the client read nothing for 1 s" and s.log[0]["cut_off"]
        # (the sequences may all have ended while the socket's buffers still held their events)
        assert s.batcher.log[0]["status"] in ("cancelled", "ok") and s.batcher.log[0]["steps_dropped"] > 0
    finally:
        s.stop()


@pytest.mark.parametrize("run_status, outcome", [("ok", "(made, not all delivered)"), ("cancelled", "(cancelled)")])
def test_the_log_line_of_a_client_cut_off_says_so_first(capsys, run_status, outcome):
    """Its 200 went out before the cut, and its run may have ended ok: the line says the cut first,
    not "200 ... (ok)" followed by the reason."""
    from diffuse.cli.serve import _log
    run = {"prompt_tokens": 3, "completion_tokens": 240, "sequences": 8, "batch": 8, "steps": 240, "seed": 1,
           "queued_ms": 2.0, "status": run_status}
    _log({"client": "127.0.0.1:5000", "method": "POST", "path": "/v1/completions", "status": 200, "ms": 5234.0,
          "request": run, "error": "the client read nothing for 1 s", "cut_off": True})
    line = capsys.readouterr().err.strip()
    assert line.startswith("127.0.0.1:5000 POST /v1/completions cut off after 5234 ms, the client read nothing "
                           "for 1 s (200 already sent), 3+240 tokens") and line.endswith(outcome)
    assert line.count("read nothing") == 1 and "\n" not in line


def test_step_events_waiting_for_a_slow_reader_are_bounded_in_bytes(server, monkeypatch):
    """Past MAX_QUEUED_STEP_BYTES of unread step events new ones are dropped (a long answer's events
    are large: the count alone would let them pile up); the next one read still brings the texts
    of every token decided meanwhile."""
    monkeypatch.setattr(batcher, "MAX_QUEUED_STEP_BYTES", 6000)
    model = server.model
    body = json.dumps({"prompt": "It was", "max_tokens": 128, "steps": 128, "seed": 1, "stream": True,
                       "diffusion_events": True}).encode()
    req = protocol.parse(body, "completion", model, 8)
    events = []
    model.generate(req.prompts[0], chat=False, on_step=events.append, **req.options_of(0))
    loop = asyncio.new_event_loop()
    try:
        job = batcher.Job(req, loop, model)
        read, steps = [], []

        async def read_all():
            while not job.events.empty():
                read.append(await job.next_event())
        for i, ev in enumerate(events):
            job.step(0, ev)
            if i % 16 == 15:       # the client reads now and then
                loop.run_until_complete(read_all())
            steps.append(job.step_bytes_put - job.step_bytes_read)
        loop.run_until_complete(read_all())
    finally:
        loop.close()
    sizes = [len(item[2]) for item in read if item[0] == "step"]
    assert job.steps_dropped > 0 and max(steps) < 6000 + max(sizes)
    sent = [json.loads(item[2]) for item in read if item[0] == "step"]
    pieces = {int(t) for d in sent for t in d["pieces"]}
    last = sent[-1]
    assert {t for t, m in zip(last["tokens"], last["mask"]) if not m} <= pieces
    assert sent[0]["eos_ids"] == sorted(model.tokenizer.eos_token_ids) and all("eos_ids" not in d for d in sent[1:])
