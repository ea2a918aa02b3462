"""`diffuse generate`: answer, summary, JSON, recording, clear errors, flags from the option table
(the live view: test_cli_live_view.py)."""
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from diffuse import load, physical_cores
from diffuse.cli import build_parser, main
from diffuse.cli.bench import GRID_AXES
from diffuse.cli.generate import generation_options
from diffuse.generation import OPTIONS, resolve_options
from diffuse.recording import Recording

DIFFUSE = str(Path(sys.executable).parent / "diffuse")      # the console script
DEMO = str(Path(__file__).resolve().parent.parent / "models" / "diffuse-demo-3m.gguf")
NUMBERS = [o for o in OPTIONS if o["kind"] in ("int", "float", "seed")]


def test_generate_prints_the_answer_on_stdout_and_the_summary_on_stderr(tiny_gguf, tmp_path, capsys):
    run = tmp_path / "run.npz"
    code = main(["generate", "-m", str(tiny_gguf("llada", "f32")), "-p", "Hello there", "--gen-length", "16",
                 "--steps", "8", "--block-length", "8", "--threads", "1", "--record", str(run)])
    out, err = capsys.readouterr()
    assert code == 0
    rec = Recording.load(run)
    assert out == rec.result.text + "\n"                        # no progress without a terminal
    assert "step " not in out and "steps 8/8 (done)" in err and "tok/s" in err
    assert len(rec.events) == 8 and rec.result.steps == 8
    assert rec.options == {**resolve_options("llada", gen_length=16, steps=8, block_length=8),   # what ran,
                           "seed": rec.options["seed"]}      # the seed drawn for it included
    assert run.stat().st_mode & 0o777 == 0o644 & ~current_umask()   # like the user's other files


def current_umask() -> int:
    umask = os.umask(0)
    os.umask(umask)
    return umask


def test_piped_stdout_is_the_answer_only(tmp_path):
    done = subprocess.run([DIFFUSE, "generate", "-m", DEMO, "-p", "Continue: She was a woman of", "--gen-length",
                           "32", "--steps", "16", "--threads", "1"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() and "step" not in done.stdout and "tok/s" not in done.stdout
    assert done.stderr.count("\n") == 1 and "steps " in done.stderr     # the summary line only


def test_json_output(tiny_gguf, capsys):
    code = main(["generate", "-m", str(tiny_gguf("dream", "f32")), "-p", "Hello", "--gen-length", "16",
                 "--steps", "4", "--threads", "1", "--json"])
    out, err = capsys.readouterr()
    assert code == 0
    r = json.loads(out)
    assert r["steps_allowed"] == 4 and len(r["tokens"]) == 16 and r["stop_reason"] in ("done", "eos")
    assert isinstance(r["text"], str) and 0 <= r["useful_length"] <= 16
    assert len(r["timings"]["step_ms"]) == r["steps"] and r["timings"]["total_ms"] > 0
    # every option that ran; an unset seed is whichever the run drew, reported so it can be repeated
    assert r["options"] == {**resolve_options("dream", gen_length=16, steps=4), "seed": r["options"]["seed"]}


def test_steps_rounded_to_the_blocks_are_noted(tiny_gguf, capsys):
    code = main(["generate", "-m", str(tiny_gguf("llada", "f32")), "-p", "Hello", "--gen-length", "32",
                 "--steps", "6", "--block-length", "8", "--threads", "1"])
    err = capsys.readouterr().err
    assert code == 0 and "steps 6 -> 4: 4 blocks get 1 step each" in err
    main(["generate", "-m", str(tiny_gguf("llada", "f32")), "-p", "Hello", "--gen-length", "32",
          "--steps", "8", "--block-length", "8", "--threads", "1"])
    assert "->" not in capsys.readouterr().err
    main(["generate", "-m", str(tiny_gguf("llada", "f32")), "-p", "Hello", "--gen-length", "16",
          "--steps", "40", "--block-length", "8", "--threads", "1"])
    assert "steps 40 -> 16: at most one step per position (8 per block)" in capsys.readouterr().err


@pytest.mark.parametrize("where", ["folder", "missing parent"])
def test_bad_record_paths_are_refused_before_the_run(tmp_path, capsys, where):
    record = tmp_path if where == "folder" else tmp_path / "missing" / "run.npz"
    code = main(["generate", "-m", str(tmp_path / "absent.gguf"), "-p", "hi", "--record", str(record)])
    err = capsys.readouterr().err
    assert code == 1 and "absent.gguf" not in err           # refused before the model is opened
    assert len(err.splitlines()) == 1 and "--record" in err
    assert not (tmp_path / "missing").exists()


def test_a_cancelled_runs_useful_length_counts_only_decided_tokens():
    model = load(DEMO, threads=1)
    r = model.generate("Continue: She was a woman of", gen_length=64, steps=64, block_length=64,
                       on_step=lambda ev: ev.step < 2)
    assert r.stop_reason == "cancelled"
    tokens = r.tokens.tolist()
    ends = [i for i, t in enumerate(tokens) if t in model.tokenizer.eos_token_ids] + [len(tokens)]
    decided = [t for t in tokens[:ends[0]] if t != model.mask_token_id]
    assert model.mask_token_id in tokens and r.useful_length == len(decided) < ends[0]
    assert "mask" not in r.text


def test_generate_reports_bad_requests(tiny_gguf, capsys):
    code = main(["generate", "-m", str(tiny_gguf("dream", "f32")), "-p", "  ", "--threads", "1"])
    assert code == 1 and "the prompt is empty" in capsys.readouterr().err
    code = main(["generate", "-m", str(tiny_gguf("llada", "f32")), "-p", "hi", "--gen-length", "9000"])
    assert code == 1 and "exceeds the model's context" in capsys.readouterr().err


def flag(o: dict) -> str:
    return "--" + o["name"].replace("_", "-")


def text(o: dict, value: float) -> str:
    return repr(float(value)) if o["kind"] == "float" else str(int(value))


def outside(o: dict) -> list[str]:
    """A value just below and just above the engine's range."""
    below = o["min"] if o["min_open"] else o["min"] - 1
    above = o["max"] if o["max_open"] else o["max"] + 1
    return [text(o, below), text(o, above)]


def greatest(o: dict):
    """The last choice, False, or the greatest value in range."""
    if o["kind"] in ("choice", "bool"):
        return o["choices"][-1] if o["choices"] else False
    if o["kind"] == "seed":
        return 2**64 - 1            # o["max"] is a double: 2^64 - 1 rounds up to 2^64
    return 0.5 if o["max_open"] else o["max"]


def test_every_option_has_a_flag_with_the_engines_help():
    parser = build_parser()
    args = parser.parse_args(["generate", "-m", "M.gguf", "-p", "hi"])
    assert generation_options(args) == {o["name"]: None for o in OPTIONS}     # None: family default
    given = {o["name"]: greatest(o) for o in OPTIONS}
    argv = []
    for o in OPTIONS:
        value = given[o["name"]]
        argv += ["--no-" + flag(o)[2:]] if o["kind"] == "bool" else [flag(o), value if o["kind"] == "choice" else text(o, value)]
    args = parser.parse_args(["generate", "-m", "M.gguf", "-p", "hi", *argv])
    assert generation_options(args) == given
    resolve_options("dream", **generation_options(args))


def test_help_shows_ranges_family_defaults_and_physical_cores(capsys):
    with pytest.raises(SystemExit) as e:
        main(["generate", "-h"])
    assert e.value.code == 0
    out = " ".join(capsys.readouterr().out.split())            # undo argparse's line wrapping
    for o in OPTIONS:
        assert flag(o) in out and " ".join(o["help"].split()) in out
    assert "family default llada 32, dream 0" in out and "(0, 1]; family default 1" in out
    assert "defaults: the model file's recipe, see diffuse recipe MODEL, else the family's" in out
    assert f"the physical cores, {physical_cores()} here" in out


# Every sub-command with the generation flags (the grid's axes take lists instead).
COMMANDS = [(["generate", "-m", "M.gguf", "-p", "hi"], ()), (["bench", "prompts", "M.gguf"], ()),
            (["bench", "grid", "M.gguf"], GRID_AXES)]


@pytest.mark.parametrize("command, o", [(c, o) for c, skip in COMMANDS for o in NUMBERS if o["name"] not in skip],
                         ids=lambda x: x["name"] if isinstance(x, dict) else " ".join(x[:2]))
def test_out_of_range_values_are_refused_with_one_line(command, o, capsys):
    for value in outside(o):
        with pytest.raises(SystemExit) as e:
            main([*command, flag(o), value])
        assert e.value.code == 2
        errors = [line for line in capsys.readouterr().err.splitlines() if "error:" in line]
        assert len(errors) == 1 and flag(o) in errors[0] and o["name"] in errors[0] and o["range"] in errors[0]


@pytest.mark.parametrize("argv", [["--seed", "-1"], ["--keep-active", "0"], ["--top-p", "0"], ["--eps", "1"],
                                  ["--steps", "1.5"], ["--temperature", "nan"], ["--scheduler", "best"]])
def test_bad_values_fail_before_the_model_is_opened(argv, capsys):
    with pytest.raises(SystemExit) as e:
        main(["generate", "-m", "missing.gguf", "-p", "hi", *argv])
    err = capsys.readouterr().err
    assert e.value.code == 2 and "missing.gguf" not in err and argv[0] in err


def test_threads_beyond_the_logical_cpus_are_capped_with_a_note(tiny_gguf, capsys):
    code = main(["generate", "-m", str(tiny_gguf("llada", "f32")), "-p", "Hello", "--gen-length", "8",
                 "--steps", "2", "--block-length", "8", "--threads", "500"])
    assert code == 0 and f"--threads 500 -> {os.cpu_count()}" in capsys.readouterr().err


def interrupt_after_steps(monkeypatch, n: int) -> None:
    """Ctrl-C after step n, through the handler generate installs (the cancel path, no signal)."""
    import signal

    from diffuse.model import Model
    original = Model.generate

    def generate(self, prompt, *, on_step, **kw):
        def step(ev):
            if ev.step + 1 == n:
                signal.getsignal(signal.SIGINT)(signal.SIGINT, None)
            return on_step(ev)
        return original(self, prompt, on_step=step, **kw)
    monkeypatch.setattr(Model, "generate", generate)


@pytest.mark.parametrize("family", ["dream", "llada"])
def test_an_interrupted_answer_marks_undecided_positions(tiny_gguf, capsys, monkeypatch, family):
    interrupt_after_steps(monkeypatch, 2)
    path = str(tiny_gguf(family, "f32"))
    argv = ["generate", "-m", path, "-p", "Hello", "--gen-length", "16", "--steps", "16", "--block-length", "16",
            "--threads", "1", "--no-chat"]
    assert main(argv) == 130
    text = capsys.readouterr().out[:-1]
    assert main([*argv, "--json"]) == 130
    r = json.loads(capsys.readouterr().out)
    assert r["stop_reason"] == "cancelled" and r["text"] == text
    model = load(path)
    eos = [i for i, t in enumerate(r["tokens"]) if t in model.tokenizer.eos_token_ids] + [16]
    undecided = [i for i in r["undecided"] if i < eos[0]]
    assert undecided and text.count("\u2591") == len(undecided)    # one mark per undecided position
    assert "PAD" not in text and "mask" not in text                 # e.g. Dream's [PAD151665]
    assert r["undecided"] == [i for i, t in enumerate(r["tokens"]) if t == model.mask_token_id]


def test_gen_length_is_rounded_up_to_whole_blocks_as_the_server_does(tiny_gguf, capsys):
    code = main(["generate", "-m", str(tiny_gguf("llada", "f32")), "-p", "Hello", "--gen-length", "20",
                 "--steps", "20", "--block-length", "8", "--threads", "1", "--json"])
    out, err = capsys.readouterr()
    assert code == 0, err
    assert "gen_length 20 -> 24: whole blocks of 8; the answer is cut at 20 tokens" in err
    r = json.loads(out)     # the length asked for and got, also where the engine ran whole blocks
    assert r["options"]["gen_length"] == r["gen_length"] == 20 and len(r["tokens"]) == 20
    assert f"({r['useful_length']}/20 tokens)" in err
    model = load(str(tiny_gguf("llada", "f32")))
    ids = r["tokens"][:20]
    ids = ids[:next((i for i, t in enumerate(ids) if t in model.tokenizer.eos_token_ids), 20)]
    assert r["text"] == model.tokenizer.decode(ids, skip_special_tokens=True)


@pytest.mark.parametrize("family, asked, note", [
    ("nemotron-diffusion", 24, "gen_length 24 -> 32: whole blocks of 32 (the model's own); the answer is cut at 24"),
    ("sdar", 10, "whole blocks of 4 from the prompt's start; the answer is cut at 10 tokens")])
def test_the_models_own_blocks_are_noted_and_the_answer_counted_as_asked(tiny_gguf, capsys, family, asked, note):
    """block_length 0 (the model's own block) or block diffusion: the engine runs more positions than
    asked for; the note says so, and --json and the summary count the positions asked for."""
    assert main(["generate", "-m", str(tiny_gguf(family, "f32")), "-p", "Hello", "--gen-length", str(asked),
                 "--threads", "1", "--no-chat", "--json"]) == 0
    out, err = capsys.readouterr()
    assert note in err
    r = json.loads(out)
    assert r["gen_length"] == r["options"]["gen_length"] == len(r["tokens"]) == len(r["decided_step"]) == asked
    assert f"({r['useful_length']}/{asked} tokens)" in err and r["useful_length"] <= asked


def test_help_says_gen_length_is_rounded_up(capsys):
    with pytest.raises(SystemExit):
        main(["generate", "--help"])
    assert "multiple of --block-length" in " ".join(capsys.readouterr().out.split())


# ---- --server: a model behind an OpenAI-compatible server (diffuse.remote; test_remote.py) ----

@pytest.fixture(scope="module")
def served():
    from diffuse.serve import Server
    s = Server(load(DEMO, threads=1), port=0, api_key="cli-key", max_batch=2)
    s.start()
    yield s
    s.stop()


def test_server_answers_records_and_json_as_a_model_file_does(served, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("DIFFUSE_API_KEY", "cli-key")          # the key from the environment
    options = ["-p", "Hello there", "--gen-length", "32", "--steps", "8", "--seed", "7"]
    assert main(["generate", "-m", DEMO, "--threads", "1", *options]) == 0
    local = capsys.readouterr().out
    run = tmp_path / "served.npz"
    assert main(["generate", "--server", served.url, *options, "--record", str(run)]) == 0
    out, err = capsys.readouterr()
    assert out == local and f"(diffuse serve, {served.url})" in err and "tok/s" in err
    rec = Recording.load(run)
    assert rec.result.text == local.rstrip("\n") and len(rec.events) == rec.result.steps > 0
    assert rec.model == {"name": "diffuse-demo-3m", "server": served.url, "arch": "llada"}   # the one /v1/models names
    assert main(["generate", "--server", served.url, "-m", "diffuse-demo-3m", *options, "--json"]) == 0
    r = json.loads(capsys.readouterr().out)
    assert r["text"] == local.rstrip("\n") and r["server"] == served.url and r["model"] == "diffuse-demo-3m"
    assert r["options"] == {"gen_length": 32, "steps": 8, "seed": 7} and len(r["tokens"]) == 32


def test_options_the_served_model_does_not_read_are_named_as_for_a_file(served, capsys):
    """diffuse serve names its model's architecture: --window-size on an LLaDA model and
    --draft-length outside self_spec get their one warning each, as with a local file; the run goes on."""
    argv = ["generate", "--server", served.url, "--api-key", "cli-key", "-p", "Hi", "--gen-length", "8",
            "--steps", "4", "--quiet"]
    assert main([*argv, "--window-size", "4", "--draft-length", "4"]) == 0
    warnings = [line for line in capsys.readouterr().err.splitlines() if "warning" in line]
    assert warnings == ["diffuse: warning: --draft-length is ignored: it applies to mode self_spec only, not diffusion",
                        "diffuse: warning: --window-size is ignored: it applies to WeDLM's window only, not llada"]


@pytest.mark.parametrize("argv, message", [
    (["-p", "Hi"], "refused the API key .*--api-key or \\$DIFFUSE_API_KEY"),
    (["-p", "Hi", "--api-key", "cli-key", "-m", "other"], "no model 'other' there; it serves diffuse-demo-3m"),
    (["-p", "Hi", "--api-key", "cli-key", "--threads", "2"], "--threads is for a local model file"),
])
def test_server_errors_are_one_line(served, capsys, monkeypatch, argv, message):
    for name in ("DIFFUSE_API_KEY", "OPENAI_API_KEY"):
        monkeypatch.delenv(name, raising=False)
    assert main(["generate", "--server", served.url, *argv]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and re.search(message, err), err


def test_a_model_file_or_a_server_is_needed(capsys):
    assert main(["generate", "-p", "Hi"]) == 1
    assert "needs -m MODEL.gguf, or --server URL" in capsys.readouterr().err


def test_another_engine_streams_text_and_says_what_it_is_not_sent(capsys, tmp_path):
    """A server that is not diffuse serve (here a few lines of http.server) gets OpenAI's fields."""
    import http.server
    import threading
    models = json.dumps({"data": [{"id": "ar-model", "owned_by": "llamacpp"}]}).encode()
    bodies = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def do_GET(self):
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.end_headers()
            self.wfile.write(models)

        def do_POST(self):
            bodies.append(json.loads(self.rfile.read(int(self.headers["Content-Length"]))))
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.end_headers()
            for text, finish in (("Paris", None), (".", None), (None, "stop")):
                delta = {"content": text} if text else {}
                self.wfile.write(b"data: " + json.dumps({"choices": [{"index": 0, "delta": delta,
                                                                        "finish_reason": finish}]}).encode() + b"\n\n")
            self.wfile.write(b"data: [DONE]\n\n")

    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{httpd.server_address[1]}/v1"
    try:
        assert main(["generate", "--server", url, "-p", "Capital?", "--steps", "8", "--gen-length", "16"]) == 0
        out, err = capsys.readouterr()
        assert out == "Paris.\n" and bodies[0]["max_tokens"] == 16 and "steps" not in bodies[0]
        assert "steps not sent" in err and "llamacpp server" in err and "sends no denoising steps" in err
        assert main(["generate", "--server", url, "-p", "Hi", "--record", str(tmp_path / "r.npz")]) == 1
        assert "--record keeps a run's steps, which only diffuse serve sends" in capsys.readouterr().err
    finally:
        httpd.shutdown()
        httpd.server_close()
