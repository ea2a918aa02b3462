"""`diffuse serve` through the official openai client, against a server on a free local port
running the demo model."""
from __future__ import annotations

import concurrent.futures
import http.client
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

import openai
import pytest

import diffuse
from diffuse import recipe
from diffuse.serve import Server, protocol
from diffuse.serve.batcher import INTERNAL_ERROR, AnswerText

DEMO = Path(__file__).resolve().parents[1] / "models" / "diffuse-demo-3m.gguf"
KEY = "test-key"
STORY = [{"role": "user", "content": "Tell me a story."}]


@pytest.fixture(scope="module")
def model():
    return diffuse.load(DEMO, threads=1)


@pytest.fixture(scope="module")
def server(model):
    s = Server(model, port=0, api_key=KEY, max_batch=8)
    s.start()
    yield s
    s.stop()
    assert not s.running()


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.url, api_key=KEY, max_retries=0, timeout=30)


def post(server, path: str, body: bytes, key: str | None = KEY) -> tuple[int, dict]:
    headers = {"Content-Type": "application/json", **({"Authorization": f"Bearer {key}"} if key else {})}
    request = urllib.request.Request(server.url + path, data=body, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=30) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def test_models_and_plain_chat(client, model):
    assert [m.id for m in client.models.list()] == ["diffuse-demo-3m"]
    r = client.chat.completions.create(model="diffuse-demo-3m", messages=STORY, max_tokens=32, seed=3,
                                       extra_body={"steps": 16})
    expected = model.generate("Tell me a story.", gen_length=32, steps=16, seed=3)
    assert r.choices[0].message.content == expected.text
    # end-of-text within the 32 tokens: "stop"; an answer as long as max_tokens: "length"
    eos = set(model.tokenizer.eos_token_ids)
    assert r.choices[0].finish_reason == ("stop" if eos & set(expected.tokens.tolist()) else "length")
    assert r.choices[0].model_extra["stop_reason"] == expected.stop_reason
    assert r.usage.prompt_tokens == len(expected.prompt_tokens)
    assert r.usage.completion_tokens == expected.useful_length
    assert "forward_passes" not in r.usage.model_extra     # a denoising loop counts none


def test_completion_cut_at_max_tokens_and_stop(client, model):
    # 40 tokens is not a whole number of 32-position blocks: the buffer is 64, the answer 40 tokens.
    r = client.completions.create(model="m", prompt="It was", max_tokens=40, seed=3, extra_body={"steps": 32})
    assert r.choices[0].finish_reason == "length" and r.usage.completion_tokens == 40
    first = r.choices[0].text.split(",")[0]
    cut = client.completions.create(model="m", prompt="It was", max_tokens=40, stop=[","], seed=3,
                                    extra_body={"steps": 32})
    assert cut.choices[0].text == first and cut.choices[0].finish_reason == "stop"
    assert 0 < cut.usage.completion_tokens < 40


def test_length_without_max_tokens_is_the_models_in_whole_blocks_that_fit(model):
    # The demo model's recipe: 64 positions in blocks of 16; 140 prompt tokens leave room for it.
    r = protocol.parse(json.dumps({"prompt": "x " * 70}).encode(), "completion", model, 8)
    assert len(r.prompts[0]) == 140 and r.max_tokens == r.options["gen_length"] == 64
    # 220 prompt tokens leave 36 of its 256 positions: 2 blocks of 16.
    r = protocol.parse(json.dumps({"prompt": "x " * 110}).encode(), "completion", model, 8)
    assert len(r.prompts[0]) == 220 and r.max_tokens == r.options["gen_length"] == 32


def test_the_readmes_curl_example_gets_an_answer(server):
    """README.md's example names no temperature or block length: the demo model's recipe gives them
    (under LLaDA's greedy defaults it answers end-of-text at once)."""
    body = {"model": "llada", "messages": [{"role": "user", "content": "Why is the sky blue?"}],
            "max_tokens": 64, "steps": 32, "scheduler": "entropy_exit"}
    # (a seed: without one each request draws its own, and the demo model answers end-of-text at
    # once for some)
    status, reply = post(server, "/chat/completions", json.dumps({**body, "seed": 1}).encode())
    assert status == 200 and reply["choices"][0]["message"]["content"].strip()
    assert reply["usage"]["completion_tokens"] > 0


def test_defaults_are_the_model_files_recipe(model, tmp_path):
    """A request that names no option runs the model's recipe over its family's defaults (the
    demo model answers end-of-text at once under LLaDA's greedy 128 steps); without a recipe,
    the family's."""
    body = json.dumps({"prompt": "Once upon a time"}).encode()
    r = protocol.parse(body, "completion", model, 8)
    # (the seed: a fresh one for each request, test_a_request_without_a_seed_reports_the_one_drawn)
    assert r.options == {**diffuse.generation.default_options(model.arch, model.recipe), "seed": r.seed}
    assert model.recipe["temperature"] == r.options["temperature"] == 0.7
    assert model.generate(r.prompts[0], **r.options).useful_length > 0
    plain = tmp_path / "plain.gguf"
    recipe.write(DEMO, {}, plain)
    r = protocol.parse(body, "completion", diffuse.load(plain, threads=1), 8)
    assert r.options == {**diffuse.generation.default_options(model.arch), "seed": r.seed}


def test_stream_blocks_and_diffusion_events(client, server):
    body = {"steps": 16, "block_length": 16, "scheduler": "low_confidence", "diffusion_events": True, "seed": 3}
    plain = client.completions.create(model="m", prompt="It was", max_tokens=64, seed=3,
                                      extra_body={"steps": 16, "block_length": 16})
    stream = client.completions.create(model="m", prompt="It was", max_tokens=64, stream=True,
                                       stream_options={"include_usage": True}, extra_body=body)
    pieces, steps, last_step_before_text = [], [], []
    usage = None
    for chunk in stream:
        if (ev := (chunk.model_extra or {}).get("diffusion")) is not None:
            steps.append(ev)
        elif chunk.choices:
            if chunk.choices[0].text:
                pieces.append(chunk.choices[0].text)
                last_step_before_text.append(steps[-1]["step"] if steps else None)
        else:
            usage = chunk.usage
    assert "".join(pieces) == plain.choices[0].text
    assert usage.completion_tokens == plain.usage.completion_tokens
    # Text came out block by block as blocks were decided, not only at the end.
    assert len(pieces) >= 2 and last_step_before_text[0] < steps[-1]["step"]
    ev = steps[-1]
    assert len(ev["tokens"]) == len(ev["mask"]) == len(ev["entropy"]) == 64
    assert len(ev["active"]) + len(ev["cached"]) > 0 and ev["total_ms"] > 0
    assert [e["step"] for e in steps] == list(range(len(steps)))


def test_chat_stream_and_n(client):
    stream = client.chat.completions.create(model="m", messages=STORY, max_tokens=32, n=2, temperature=0.9,
                                            seed=5, stream=True)
    texts = ["", ""]
    finished = set()
    for chunk in stream:
        for c in chunk.choices:
            texts[c.index] += c.delta.content or ""
            if c.finish_reason:
                finished.add(c.index)
    assert finished == {0, 1} and texts[0] != texts[1]


def test_concurrent_requests_are_batched(client, server):
    before = len(server.batcher.log)

    def ask(i):
        return client.completions.create(model="m", prompt=f"It was day {i} of", max_tokens=32,
                                         extra_body={"steps": 32, "cache": False})
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(ask, range(8)))
    assert all(a.choices[0].finish_reason for a in answers)
    entries = list(server.batcher.log)[before:]
    assert len(entries) == 8 and all(e["status"] == "ok" for e in entries)
    # The first request may start alone; the others join it at its next steps.
    assert max(e["batch"] for e in entries) >= 4


def test_a_request_joins_a_running_one_and_leaves_when_done(client, server):
    long = dict(model="m", prompt="Long ago", max_tokens=64, seed=3, extra_body={"steps": 64, "cache": False})
    short = dict(model="m", prompt="It was", max_tokens=32, seed=3, extra_body={"steps": 16, "cache": False})
    alone = [client.completions.create(**long).choices[0].text, client.completions.create(**short).choices[0].text]
    before = len(server.batcher.log)
    stream = client.completions.create(**{**long, "extra_body": {**long["extra_body"], "diffusion_events": True}},
                                       stream=True)
    pieces, joined = [], None
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        for chunk in stream:
            if joined is None:      # the long request is running: send the short one now
                joined = pool.submit(client.completions.create, **short)
            if chunk.choices:
                pieces.append(chunk.choices[0].text)
        assert ["".join(pieces), joined.result().choices[0].text] == alone
    entries = list(server.batcher.log)[before:]
    # The short one (16 steps) shared the long one's (64) forward passes and left with its answer first.
    assert [(e["steps"], e["batch"], e["status"]) for e in entries] == [(16, 2, "ok"), (64, 2, "ok")]


def test_a_stop_string_longer_than_the_text_so_far(client, model):
    # The answer's text is shorter than the stop string for its first steps: what may begin the
    # stop string is held back, and no earlier text is ever taken back (this request got a 500).
    body = {"temperature": 0.8, "seed": 4, "block_length": 0, "steps": 24}
    r = client.completions.create(model="m", prompt="Once upon a time", max_tokens=48, stop=[" of the rest"],
                                  extra_body=body)
    plain = model.generate("Once upon a time", chat=False, gen_length=48, **body)
    assert r.choices[0].text == plain.text.split(" of the rest")[0]
    stream = client.completions.create(model="m", prompt="Once upon a time", max_tokens=48, stop=[" of the rest"],
                                       stream=True, extra_body=body)
    assert "".join(c.choices[0].text for c in stream if c.choices) == r.choices[0].text


@pytest.mark.parametrize("text, stops, held", [
    ("Once", [" of the rest"], 0), ("Once ", [" of the rest"], 1), ("a time of", [" of the rest"], 3),
    ("a time of t", [" of the rest", "time"], 5), ("ti", ["time", "x"], 2), ("abc", [], 0), ("", ["ab"], 0)])
def test_what_is_held_back_is_the_end_that_may_begin_a_stop_string(model, text, stops, held):
    assert AnswerText(model.tokenizer, [], 8, stops)._held(text) == held


def test_a_failing_request_fails_alone_and_its_stream_ends_clearly(client, server, model):
    """One request's failure (here a step listener that raises for it) never fails those batched with it."""
    doomed = []

    def breaks_one(job, index, event):
        if job.request.prompts == doomed:
            raise RuntimeError("this request's bug")

    server.batcher.step_listeners.append(breaks_one)
    try:
        doomed[:] = [model.encode_prompt("Doomed", chat=False)]
        long = dict(model="m", max_tokens=64, extra_body={"steps": 64, "cache": False})
        with concurrent.futures.ThreadPoolExecutor(3) as pool:
            fine = [pool.submit(client.completions.create, prompt=f"Fine {i}", **long) for i in range(2)]
            failed = pool.submit(client.completions.create, prompt="Doomed", **long)
            with pytest.raises(openai.InternalServerError) as e:
                failed.result()
            assert e.value.body["message"] == INTERNAL_ERROR
            assert all(f.result().choices[0].finish_reason for f in fine)
        # Streamed: the text so far, an error event, then the stream's end ([DONE]), never a silent cut.
        lines = []
        with urllib.request.urlopen(urllib.request.Request(
                server.url + "/completions", headers={"Authorization": f"Bearer {KEY}",
                                                      "Content-Type": "application/json"},
                data=json.dumps({"prompt": "Doomed", "stream": True, "max_tokens": 16}).encode()), timeout=30) as r:
            lines = [line for line in r.read().decode().split("\n") if line]
        assert json.loads(lines[-2].removeprefix("data: "))["error"]["message"] == INTERNAL_ERROR
        assert lines[-1] == "data: [DONE]"
    finally:
        server.batcher.step_listeners.remove(breaks_one)
    assert [e["status"] for e in list(server.batcher.log)[-4:]].count("error") == 2


@pytest.mark.parametrize("body, param", [
    (b'{"model": "m", "messages": [', None),                                                # malformed JSON
    (b'{"messages": [{"role": "user", "content": "  "}]}', "messages"),                     # empty prompt
    (b'{"messages": [{"role": "user", "content": "hi"}], "max_tokens": 100000}', "max_tokens"),
    (b'{"messages": [{"role": "user", "content": "hi"}], "max_tokens": "10"}', "max_tokens"),
    (b'{"messages": [{"role": "user", "content": "hi"}], "scheduler": "fastest"}', "scheduler"),
    (b'{"messages": [{"role": "user", "content": "hi"}], "n": 9}', "n"),
    (b'{"messages": [{"role": "user", "content": "hi"}], "temperature": "hot"}', "temperature"),
    (b'{"messages": [{"role": "user", "content": "hi"}], "tools": []}', "tools"),
    (b'{"messages": [{"role": "user", "content": "hi"}], "presence_penalty": 0.5}', "presence_penalty"),
    (b'{"messages": [{"role": "user", "content": "hi"}], "temperature": 2.5}', "temperature"),
    (b'{"messages": [{"role": "user", "content": "hi"}], "metadata": "x"}', "metadata"),
    (b'{"messages": [{"role": "user", "content": "hi"}], "store": "yes"}', "store"),
    (b'{"messages": [{"role": "user", "content": "hi"}], "stream": true,'
     b' "stream_options": {"include_obfuscation": 1}}', "stream_options.include_obfuscation"),
    (b'{"messages": "hi"}', "messages"),
    (b'[1, 2]', None),
])
def test_bad_chat_requests_get_400(server, body, param):
    status, answer = post(server, "/chat/completions", body)
    assert status == 400
    assert set(answer["error"]) == {"message", "type", "param", "code"}
    assert answer["error"]["param"] == param and answer["error"]["message"]


def test_bad_requests_through_the_client_then_still_serving(client):
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model="m", prompt="x " * 300, max_tokens=16)     # longer than the context
    assert e.value.body["code"] == "context_length_exceeded"
    with pytest.raises(openai.BadRequestError):
        client.completions.create(model="m", prompt="", max_tokens=16)
    # Parameters OpenAI clients send by default are fine at their neutral value.
    assert client.completions.create(model="m", prompt="Still", max_tokens=8, presence_penalty=0, seed=1,
                                     logprobs=None, echo=False).choices[0].text


def test_api_key(server):
    for key in (None, "wrong"):
        status, answer = post(server, "/completions", b'{"prompt": "hi"}', key=key)
        assert status == 401 and answer["error"]["code"] == "invalid_api_key"
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=server.url, api_key="wrong", max_retries=0).models.list()


def test_disconnect_cancels_within_a_step(client, server):
    before = len(server.batcher.log)
    # 192 positions, one step each: seconds of work unless the disconnect stops it.
    stream = client.completions.create(model="m", prompt="Long ago", max_tokens=192, stream=True,
                                       extra_body={"steps": 192, "cache": False, "diffusion_events": True})
    for n, _ in enumerate(stream):
        if n == 3:
            break
    stream.close()
    deadline = time.monotonic() + 10
    while len(server.batcher.log) == before and time.monotonic() < deadline:
        time.sleep(0.02)
    entry = server.batcher.log[-1]
    assert entry["status"] == "cancelled" and entry["steps"] < 192
    assert entry["steps_after_cancel"] <= 1
    assert client.completions.create(model="m", prompt="After", max_tokens=8, seed=1).choices[0].text


def test_a_plain_request_whose_client_leaves_is_cancelled(server):
    before = len(server.batcher.log)
    started = threading.Event()

    def slow_step(job, index, event):     # >= 1 s of steps, whatever the machine's speed
        started.set()
        time.sleep(0.005)

    server.batcher.step_listeners.append(slow_step)
    try:
        body = json.dumps({"prompt": "Long ago", "max_tokens": 192, "steps": 192, "cache": False})
        conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=10)
        conn.request("POST", "/v1/completions", body, {"Authorization": f"Bearer {KEY}",
                                                       "Content-Type": "application/json"})
        assert started.wait(10)
        conn.close()
        deadline = time.monotonic() + 10
        while len(server.batcher.log) == before and time.monotonic() < deadline:
            time.sleep(0.02)
    finally:
        server.batcher.step_listeners.remove(slow_step)
    assert server.batcher.log[-1]["status"] == "cancelled" and server.batcher.log[-1]["steps"] < 192


# Started with SIGINT ignored (a background job of a non-interactive shell), uvicorn's re-raise of
# the Ctrl-C after its shutdown did nothing and the command exited 0: this test's flaky failure.
IGNORING_SIGINT = ["-c", "import os, signal, sys; signal.signal(signal.SIGINT, signal.SIG_IGN); "
                         "os.execv(sys.executable, [sys.executable, '-m', 'diffuse.cli', *sys.argv[1:]])"]


@pytest.mark.parametrize("launcher", [["-m", "diffuse.cli"], IGNORING_SIGINT], ids=["plain", "sigint-ignored"])
def test_cli_serves_until_interrupted(launcher):
    command = [sys.executable, *launcher, "serve", "-m", str(DEMO), "--port", "0", "--threads", "1"]
    with subprocess.Popen(command, stderr=subprocess.PIPE, text=True) as proc:
        try:
            url = re.search(r"at (http://\S+/v1),", proc.stderr.readline()).group(1)
            client = openai.OpenAI(base_url=url, api_key="none", max_retries=0)
            assert client.completions.create(model="m", prompt="It was", max_tokens=8,
                                             seed=1).usage.completion_tokens > 0
            assert " POST /v1/completions 200 " in proc.stderr.readline()
            proc.send_signal(signal.SIGINT)     # Ctrl-C: uvicorn closes, then the command ends as interrupted
            assert proc.wait(timeout=15) == 130
            assert "Traceback" not in proc.stderr.read()
        finally:
            proc.kill()


def test_cli_refuses_a_taken_port(server, capsys):
    from diffuse.cli import main
    assert main(["serve", "-m", str(DEMO), "--port", str(server.port), "--threads", "1"]) == 1
    assert "cannot listen" in capsys.readouterr().err


def test_cli_warns_when_every_interface_may_use_the_model_without_a_key(monkeypatch, capsys):
    from diffuse.cli import main
    monkeypatch.setattr(Server, "serve", lambda self: self.socket.close())     # bind, warn, return
    assert main(["serve", "-m", str(DEMO), "--host", "0.0.0.0", "--port", "0", "--threads", "1"]) == 0
    assert "without --api-key: anyone who can reach this machine" in capsys.readouterr().err
    assert main(["serve", "-m", str(DEMO), "--port", "0", "--threads", "1"]) == 0
    assert "warning" not in capsys.readouterr().err


def test_an_engine_failure_answers_the_waiting_requests_and_serving_goes_on(model):
    class FailsOnce:
        """The model, except that its first stream fails before admitting anything."""
        failed = False

        def __getattr__(self, name):
            return getattr(model, name)

        def generate_stream(self, *args, **kw):
            if not self.failed:
                self.failed = True
                raise RuntimeError("engine broke")
            return model.generate_stream(*args, **kw)

    s = Server(FailsOnce(), port=0, max_batch=2)
    s.start()
    try:
        body = json.dumps({"prompt": "It was", "max_tokens": 8}).encode()
        status, answer = post(s, "/completions", body, key=None)
        # A bug of ours: the log has the traceback, the client a message without internals.
        assert status == 500 and answer["error"]["message"] == INTERNAL_ERROR
        status, answer = post(s, "/completions", body, key=None)
        assert status == 200 and answer["choices"][0]["finish_reason"]
    finally:
        s.stop()


def test_cli_reads_the_key_from_a_file_or_the_environment(tmp_path, monkeypatch, capsys):
    """Not only from argv, where ps shows it to every user of the machine."""
    from diffuse.cli import main
    keys = []

    class Recorded(Server):
        def __init__(self, *args, api_key=None, **kwargs):
            keys.append(api_key)
            super().__init__(*args, api_key=api_key, **kwargs)

        def serve(self):
            self.socket.close()
    monkeypatch.setattr(diffuse.serve, "Server", Recorded)
    keyfile = tmp_path / "key"
    keyfile.write_text("from-file\n")
    monkeypatch.setenv("DIFFUSE_API_KEY", "from-env")
    for argv in [], ["--api-key-file", str(keyfile)], ["--api-key", "a"]:
        assert main(["serve", "-m", str(DEMO), "--port", "0", "--threads", "1", *argv]) == 0
        assert "API key required" in capsys.readouterr().err
    monkeypatch.setenv("DIFFUSE_API_KEY", "")
    assert main(["serve", "-m", str(DEMO), "--port", "0", "--threads", "1"]) == 0
    assert keys == ["from-env", "from-file", "a", None]


@pytest.mark.parametrize("argv, message", [
    (["--api-key-file", "/nonexistent/key"], "cannot read the key"),
    (["--api-key", "a", "--api-key-file", "k"], "not both"),
    (["--api-key", "has space"], "printable ASCII without spaces"),
    (["--cors-origin", "http://localhost:3000/"], "scheme://host[:port]"),
    (["--cors-origin", "localhost:3000"], "scheme://host[:port]"),
])
def test_cli_refuses_bad_key_and_origin_options(argv, message, capsys):
    from diffuse.cli import main
    assert main(["serve", "-m", str(DEMO), "--port", "0", "--threads", "1", *argv]) == 1
    assert message in capsys.readouterr().err


def test_allowed_hosts(model):
    s = Server(model, port=0, allowed_hosts=("my-box.lan",))
    s.start()
    try:
        for host, status in (("my-box.lan:8080", 200), ("MY-BOX.LAN.", 200), ("other.lan", 400)):
            conn = http.client.HTTPConnection("127.0.0.1", s.port, timeout=30)
            conn.request("GET", "/v1/models", headers={"Host": host})
            assert conn.getresponse().status == status
            conn.close()
    finally:
        s.stop()


TOOL = {"type": "function", "function": {"name": "add", "description": "add two numbers", "parameters": {
    "type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}, "required": ["a", "b"]}}}


def test_fields_clients_send_are_accepted(client):
    """What the openai client, LangChain and llm send as a matter of course: ignored (user, metadata,
    store, service_tier, ...) or honoured (tools the answer must not call, a text response_format)."""
    r = client.chat.completions.create(
        model="m", messages=STORY, max_completion_tokens=8, user="u1", metadata={"app": "test"}, store=False,
        service_tier="auto", parallel_tool_calls=False, tools=[TOOL], tool_choice="none",
        response_format={"type": "text"}, logit_bias=None, frequency_penalty=0, n=1, seed=1, stream=True,
        stream_options={"include_usage": True, "include_obfuscation": False}, extra_body={"steps": 8})
    chunks = list(r)
    assert chunks[-1].usage.completion_tokens > 0
    assert all(c.choices[0].delta.tool_calls is None for c in chunks if c.choices)
    r = client.completions.create(model="m", prompt="It was", max_tokens=8, user="u1", suffix=None, best_of=1,
                                  extra_body={"steps": 8, "store": True, "safety_identifier": "h"})
    assert r.choices[0].finish_reason


@pytest.mark.parametrize("extra, param, code", [
    ({"tools": [TOOL]}, "tools", "unsupported_parameter"),
    ({"tools": [TOOL], "tool_choice": "required"}, "tools", "unsupported_parameter"),
    ({"tools": [TOOL], "tool_choice": {"type": "function", "function": {"name": "add"}}}, "tools",
     "unsupported_parameter"),
    ({"tool_choice": "required"}, "tool_choice", "invalid_value"),
    ({"tool_choice": "sometimes"}, "tool_choice", "invalid_value"),
    ({"response_format": {"type": "json_object"}}, "response_format.type", "unsupported_value"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "A", "schema": {}}}},
     "response_format.type", "unsupported_value"),
    ({"response_format": "json"}, "response_format", "invalid_value"),
    ({"temperature": 2.01}, "temperature", "decimal_above_max_value"),
    ({"presence_penalty": 1}, "presence_penalty", "unsupported_value"),
    ({"messages": [{"role": "tool", "tool_call_id": "1", "content": "3"}]}, "messages[0]", "unsupported_value"),
    ({"reasoning_effort": "low"}, "reasoning_effort", "unknown_parameter"),
])
def test_what_this_server_cannot_honour_is_refused_in_openais_shape(client, extra, param, code):
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(**{"model": "m", "messages": STORY, "max_tokens": 8, **extra})
    assert e.value.status_code == 400
    assert e.value.body["param"] == param and e.value.body["code"] == code
    assert e.value.body["type"] == "invalid_request_error" and e.value.body["message"]


def test_temperature_up_to_openais_2(model):
    body = {"prompt": "It was", "temperature": 2}
    assert protocol.parse(json.dumps(body).encode(), "completion", model, 8).options["temperature"] == 2


def test_models_retrieve(client):
    assert client.models.retrieve("diffuse-demo-3m").id == "diffuse-demo-3m"
    with pytest.raises(openai.NotFoundError) as e:
        client.models.retrieve("gpt-4o")
    assert e.value.body["code"] == "model_not_found" and e.value.body["param"] == "model"
    assert "gpt-4o" in e.value.body["message"]


def test_a_request_without_a_seed_reports_the_one_drawn(client, server):
    """Without a seed every request samples anew (it used seed 0: no client could regenerate); the
    seed drawn comes back in the answer, the first stream chunk and the log, and repeats the answer."""
    ask = dict(model="m", messages=STORY, max_tokens=32, temperature=1.0, extra_body={"steps": 16})
    first, second = (client.chat.completions.create(**ask) for _ in range(2))
    seeds = [first.model_extra["seed"], second.model_extra["seed"]]
    assert seeds[0] != seeds[1] and all(isinstance(s, int) for s in seeds)
    assert server.batcher.log[-1]["seed"] == seeds[1]
    again = client.chat.completions.create(**ask, seed=seeds[0])
    assert again.model_extra["seed"] == seeds[0]
    assert again.choices[0].message.content == first.choices[0].message.content
    stream = list(client.chat.completions.create(**ask, seed=seeds[1], n=2, stream=True))
    assert stream[0].model_extra["seed"] == seeds[1] and all("seed" not in c.model_extra for c in stream[1:])
    assert "".join(c.choices[0].delta.content or "" for c in stream
                   if c.choices and c.choices[0].index == 0) == second.choices[0].message.content


def test_health_needs_no_key_and_metrics_do(client, server):
    client.completions.create(model="m", prompt="It was", max_tokens=8, extra_body={"steps": 8})
    logged = []
    server.request_listeners.append(logged.append)
    try:
        health = server.url.removesuffix("/v1") + "/health"
        for _ in range(3):     # a proxy's checks: counted in /metrics, not logged
            with urllib.request.urlopen(health, timeout=30) as r:
                assert r.status == 200 and json.loads(r.read()) == {"status": "ok", "waiting": 0, "running": 0,
                                                                    "max_batch": 8}
        with pytest.raises(urllib.error.HTTPError) as e:       # a check that fails is logged
            urllib.request.urlopen(urllib.request.Request(health, headers={"Host": "evil.example"}), timeout=30)
        e.value.close()
        # logged once the answer has gone; the completion's own entry may land after the listener was
        # added (a busy machine), so only /health's entries are looked at
        def health_logged():
            return [(e["path"], e["status"]) for e in logged if e["path"] == "/health"]
        deadline = time.monotonic() + 30
        while not health_logged() and time.monotonic() < deadline:
            time.sleep(0.01)
    finally:
        server.request_listeners.remove(logged.append)
    assert health_logged() == [("/health", 400)]
    metrics = server.url.removesuffix("/v1") + "/metrics"
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(metrics, timeout=30)
    e.value.close()
    assert e.value.code == 401
    with urllib.request.urlopen(urllib.request.Request(metrics, headers={"Authorization": f"Bearer {KEY}"}),
                                timeout=30) as r:
        assert r.headers["Content-Type"].startswith("text/plain; version=0.0.4")
        text = r.read().decode()
    values = {line.rpartition(" ")[0]: float(line.rpartition(" ")[2])
              for line in text.splitlines() if line and not line.startswith("#")}
    assert values['diffuse_requests_total{route="/v1/completions",status="200"}'] >= 1
    assert values['diffuse_requests_total{route="/metrics",status="401"}'] == 1
    assert values['diffuse_requests_total{route="/health",status="200"}'] == 3
    assert values["diffuse_requests_in_flight"] == 1      # this scrape
    assert values["diffuse_queue_depth"] == 0 and values["diffuse_max_batch"] == 8
    assert values["diffuse_step_seconds_count"] >= 8 and values["diffuse_step_seconds_sum"] > 0
    assert values['diffuse_step_seconds_bucket{le="+Inf"}'] == values["diffuse_step_seconds_count"]
    assert values["diffuse_generated_tokens_total"] > 0 and values['diffuse_answers_total{status="ok"}'] >= 1
