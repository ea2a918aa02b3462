"""The command line on wrong input: one clear error line before any work, no traceback, no output
file; and the notes and warnings a user should see."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from fixtures.dialects import to_diffuse_cpp
from fixtures.tiny_models import write_llada

import diffuse
from diffuse import gguf_file
from diffuse._core import GGML_VERSION
from diffuse.cli import main
from diffuse.convert import convert_hf
from diffuse.tokenizer import Tokenizer


def error_line(capsys, argv: list[str]) -> str:
    """Runs the CLI expecting a refusal; returns its single stderr line."""
    assert main(argv) == 1
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("diffuse: error: "), err
    assert "Traceback" not in err
    return lines[0]


def test_quantize_refuses_threads_below_one(capsys, tiny_gguf, tmp_path):
    out = tmp_path / "q.gguf"
    line = error_line(capsys, ["quantize", str(tiny_gguf("llada", "f32")), str(out), "Q8_0", "--threads", "-3"])
    assert "--threads" in line and "at least 1" in line
    assert not out.exists()


def test_quantize_caps_threads_at_the_cpus(capsys, tiny_gguf, tmp_path, monkeypatch):
    monkeypatch.setattr("os.cpu_count", lambda: 2)
    out = tmp_path / "q.gguf"
    assert main(["quantize", str(tiny_gguf("llada", "f32")), str(out), "Q8_0", "--threads", "500"]) == 0
    assert "--threads 500 is more than the 2 logical CPUs; using 2" in capsys.readouterr().err
    assert out.is_file()


@pytest.mark.parametrize("command", ["convert", "quantize"])
@pytest.mark.parametrize("case", ["folder", "missing parent", "trailing separator"])
def test_output_path_checked_before_work(capsys, tiny_gguf, tiny_hf_llada, tmp_path, command, case):
    target = {"folder": tmp_path, "missing parent": tmp_path / "nowhere" / "m.gguf",
              "trailing separator": tmp_path / "new"}[case]
    text = str(target) + ("/" if case == "trailing separator" else "")
    source = tiny_hf_llada if command == "convert" else tiny_gguf("llada", "f32")
    argv = ["convert", str(source), "-o", text] if command == "convert" else ["quantize", str(source), text, "Q8_0"]
    line = error_line(capsys, argv)
    assert text in line
    assert {"folder": "is a folder", "missing parent": "does not exist",
            "trailing separator": "ends with a path separator"}[case] in line
    assert list(tmp_path.iterdir()) == []


def test_quantize_carries_the_tokenizer_beside_a_diffuse_cpp_file(capsys, tiny_gguf, tmp_path):
    src = to_diffuse_cpp(tiny_gguf("llada", "f32"), tmp_path / "cpp")
    out = tmp_path / "elsewhere" / "q.gguf"
    out.parent.mkdir()
    assert main(["quantize", str(src), str(out), "Q8_0"]) == 0
    assert "carries no tokenizer: embedding" in capsys.readouterr().err
    tok = Tokenizer.for_model(out)
    assert tok.source == "embedded tokenizer.json"
    assert tok.encode("hello") == Tokenizer.for_model(src).encode("hello")
    assert gguf_file.read(out).dialect == gguf_file.read(src).dialect


def test_requantising_warns(capsys, tiny_gguf, tmp_path):
    q4 = tmp_path / "q4.gguf"
    assert main(["quantize", str(tiny_gguf("llada", "f32")), str(q4), "Q4_K_M"]) == 0
    assert "warning" not in capsys.readouterr().err
    assert main(["quantize", str(q4), str(tmp_path / "q8.gguf"), "Q8_0"]) == 0
    err = capsys.readouterr().err
    assert "diffuse: warning:" in err and "already quantised" in err and "Q4_K" in err


def test_k_quant_that_no_tensor_can_take_is_refused(capsys, tmp_path):
    """96-wide rows (ffn 192) fit no 256-value K-quant block: a "Q6_K" file would hold only Q8_0."""
    hf = write_llada(tmp_path / "narrow", dtype="f32", n_shards=1, d_model=96)
    src = convert_hf(hf, tmp_path / "narrow.gguf", "f32")
    out = tmp_path / "q6.gguf"
    line = error_line(capsys, ["quantize", str(src), str(out), "Q6_K"])
    assert "Q6_K" in line and "Q8_0" in line and "256" in line
    assert not out.exists()


def test_info_on_a_folder(capsys, tmp_path):
    (tmp_path / "a.gguf").write_bytes(b"")
    line = error_line(capsys, ["info", str(tmp_path)])
    assert "is a folder" in line and "a.gguf" in line
    empty = tmp_path / "empty"
    empty.mkdir()
    assert "no .gguf file" in error_line(capsys, ["info", str(empty)])


def test_version(capsys):
    with pytest.raises(SystemExit) as e:
        main(["--version"])
    assert e.value.code == 0
    assert capsys.readouterr().out.strip() == f"diffuse {diffuse.__version__} (ggml {GGML_VERSION})"


def test_no_traceback_in_a_real_process(tmp_path):
    run = subprocess.run([sys.executable, "-c", "import sys; from diffuse.cli import main; sys.exit(main())",
                          "convert", str(tmp_path), "-o", str(tmp_path / "no" / "m.gguf")],
                         capture_output=True, text=True, timeout=60)
    assert run.returncode == 1
    assert run.stderr.strip().splitlines() == [f"diffuse: error: -o {tmp_path / 'no' / 'm.gguf'}: "
                                               f"the folder {tmp_path / 'no'} does not exist"]


@pytest.mark.parametrize("backend", ["auto", "llama-bench", "llama-cpp-python"])
def test_grid_checks_the_ar_backend_before_loading(capsys, tmp_path, monkeypatch, backend):
    from diffuse.bench import grid, llama_ref
    monkeypatch.setattr(llama_ref, "have_llama_cpp_python", lambda: False)
    monkeypatch.delenv(llama_ref.ENV_BIN, raising=False)
    monkeypatch.setenv("PATH", str(tmp_path))   # no llama-bench on it
    monkeypatch.setattr(grid, "run", lambda *a, **k: pytest.fail("the grid ran"))
    line = error_line(capsys, ["bench", "grid", "M.gguf", "--no-plots", "--ar-model", "AR.gguf",
                               "--ar-backend", backend, "-o", str(tmp_path / "out")])
    assert "--ar-" in line and ("llama-bench" in line or "llama-cpp-python" in line)
    assert not (tmp_path / "out").exists()


# ---- what a model path names: missing, a folder, a FIFO, a device (a FIFO must never block) ----

DEMO = str(Path(__file__).resolve().parent.parent / "models" / "diffuse-demo-3m.gguf")
MODEL_COMMANDS = {
    "generate": lambda m: ["generate", "-m", m, "-p", "hi"],
    "info": lambda m: ["info", m],
    "quantize": lambda m: ["quantize", m, "out.gguf", "Q8_0"],
    "bench forward": lambda m: ["bench", "forward", m],
    "bench prompts": lambda m: ["bench", "prompts", m],
    "bench batch": lambda m: ["bench", "batch", m],
    "bench context": lambda m: ["bench", "context", m],
    "bench steps": lambda m: ["bench", "steps", m],
    "bench grid": lambda m: ["bench", "grid", m, "--no-plots", "-o", "g"],
}
NOT_FILES = {"fifo": "is a FIFO (named pipe), not a regular file",
             "device": "is a character device, not a regular file",
             "folder": "is a folder", "missing": "no such file"}


@pytest.mark.parametrize("kind", list(NOT_FILES))
@pytest.mark.parametrize("command", list(MODEL_COMMANDS))
def test_a_model_path_that_is_no_file_says_what_it_is(capsys, tmp_path, monkeypatch, command, kind):
    monkeypatch.chdir(tmp_path)
    path = {"fifo": "pipe", "device": "/dev/zero", "folder": "dir", "missing": "absent.gguf"}[kind]
    if kind == "fifo":
        os.mkfifo(tmp_path / "pipe")      # opening it for reading would block: the test would hang
    if kind == "folder":
        (tmp_path / "dir").mkdir()
    line = error_line(capsys, MODEL_COMMANDS[command](path))
    assert NOT_FILES[kind] in line and path in line


def test_convert_says_what_its_folder_is(capsys, tmp_path):
    os.mkfifo(tmp_path / "pipe")
    assert "is a FIFO" in error_line(capsys, ["convert", str(tmp_path / "pipe")])
    (tmp_path / "f").write_text("x")
    assert "is a file; give the checkpoint's folder" in error_line(capsys, ["convert", str(tmp_path / "f")])


# ---- stdout: a reader that goes away, a full disk, a closed descriptor (real processes) ----

def diffuse_process(argv: list[str], **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "diffuse.cli", *argv], stderr=subprocess.PIPE, text=True,
                          timeout=120, **kwargs)


# A fixed seed: the demo's recipe samples (temperature 0.7), and these tests compare two runs.
GENERATE = ["generate", "-m", DEMO, "-p", "Once upon a time", "--gen-length", "32", "--steps", "8", "--threads", "1",
            "--seed", "0"]
PIPED = {"info --tensors": ["info", DEMO, "--tensors"], "generate": GENERATE, "download": ["download"]}


@pytest.mark.parametrize("command", list(PIPED))
def test_a_closed_pipe_ends_quietly(command):
    """`diffuse ... | head` where head has exited: the status of SIGPIPE, nothing on stderr."""
    read, write = os.pipe()
    os.close(read)
    try:
        done = diffuse_process(PIPED[command], stdout=write)
    finally:
        os.close(write)
    assert done.returncode == 128 + signal.SIGPIPE
    assert "Traceback" not in done.stderr and "BrokenPipe" not in done.stderr


@pytest.mark.parametrize("command", ["generate", "info --json"])
def test_a_full_disk_on_stdout_is_an_error(command):
    argv = GENERATE if command == "generate" else ["info", DEMO, "--json"]
    with open("/dev/full", "w") as full:
        done = diffuse_process(argv, stdout=full)
    assert done.returncode == 1
    assert "diffuse: error: cannot write the output (standard output): No space left on device" in done.stderr
    assert "Traceback" not in done.stderr


def test_a_closed_stderr_still_gives_the_answer():
    done = subprocess.run([sys.executable, "-m", "diffuse.cli", *GENERATE], stdout=subprocess.PIPE, text=True,
                          timeout=120, preexec_fn=lambda: os.close(2))
    given = diffuse_process(GENERATE, stdout=subprocess.PIPE)
    assert done.returncode == 0 and done.stdout == given.stdout and "steps" not in done.stdout


def test_a_closed_stdout_is_an_error():
    done = diffuse_process(GENERATE, stdout=subprocess.DEVNULL, preexec_fn=lambda: os.close(1))
    assert done.returncode == 1
    assert done.stderr == "diffuse: error: standard output is closed; the output has nowhere to go\n"


# ---- the prompt from a file or standard input ----

def test_prompt_from_a_file_and_from_stdin(tmp_path):
    (tmp_path / "p.txt").write_text("Once upon a time\n")
    from_file = diffuse_process([*GENERATE[:3], "--prompt-file", str(tmp_path / "p.txt"), *GENERATE[5:]],
                                stdout=subprocess.PIPE)
    from_stdin = diffuse_process([*GENERATE[:3], "-p", "-", *GENERATE[5:]], stdout=subprocess.PIPE,
                                 input="Once upon a time\n")
    given = diffuse_process(GENERATE, stdout=subprocess.PIPE)
    assert from_file.returncode == from_stdin.returncode == given.returncode == 0, from_file.stderr
    assert from_file.stdout == from_stdin.stdout == given.stdout     # one seed: the same prompt, the same answer


@pytest.mark.parametrize("content, message", [
    (b"", "the prompt is empty"), (b" \n\t\n", "the prompt is empty"),
    (b"GGUF\x03\x00\x00\x00", "holds NUL bytes, so it is a binary file"),
    (b"caf\xe9", "not UTF-8 text (byte 3 is 0xe9)")])
def test_a_prompt_file_that_is_no_prompt(capsys, tmp_path, content, message):
    (tmp_path / "p.txt").write_bytes(content)
    line = error_line(capsys, ["generate", "-m", DEMO, "--prompt-file", str(tmp_path / "p.txt")])
    assert f"--prompt-file {tmp_path / 'p.txt'}: {message}" in line


def test_prompt_file_and_prompt_are_one_or_the_other(capsys, tmp_path):
    with pytest.raises(SystemExit):
        main(["generate", "-m", DEMO, "-p", "hi", "--prompt-file", "x"])
    assert "not allowed with" in capsys.readouterr().err
    os.mkfifo(tmp_path / "pipe")
    assert "is a FIFO" in error_line(capsys, ["generate", "-m", DEMO, "--prompt-file", str(tmp_path / "pipe")])
    assert "no such file" in error_line(capsys, ["generate", "-m", DEMO, "--prompt-file", str(tmp_path / "no")])


def test_an_empty_stdin_prompt_is_refused():
    done = diffuse_process([*GENERATE[:3], "-p", "-"], stdout=subprocess.PIPE, stdin=subprocess.DEVNULL)
    assert done.returncode == 1 and "-p - (standard input): the prompt is empty" in done.stderr


# ---- bench report on JSON that is not what the bench commands write ----

@pytest.mark.parametrize("name, content, message", [
    ("grid.json", '{"rows": [1', "not valid JSON (line 1, column 12"),
    ("grid.json", "[1, 2]", "expected a JSON object, found list"),
    ("grid.json", '{"rows": 3}', 'not what `diffuse bench grid` writes: "rows" is not a list of records'),
    ("grid.json", '{"rows": [{"x": 1}], "ar": []}', "not what `diffuse bench grid` writes (a record lacks the field"),
    ("batch.json", '{"a": 1}', "expected a JSON list, found dict"),
    ("batch.json", '[{"batch": 1}]', "not what `diffuse bench batch` writes"),
    ("steps.json", "[1]", "not what `diffuse bench steps` writes: a list of records"),
    ("context.json", b"\xff\xfe", "not valid JSON"),
])
def test_bench_report_names_the_malformed_file(capsys, tmp_path, name, content, message):
    path = tmp_path / "sub" / name
    path.parent.mkdir()
    path.write_bytes(content.encode() if isinstance(content, str) else content)
    line = error_line(capsys, ["bench", "report", str(tmp_path), "--no-plots"])
    assert f"{path}: {message}" in line
    assert not (tmp_path / "study.md").exists()


@pytest.mark.parametrize("flag", ["--draft-length", "--window-size", "--steps"])
def test_an_option_out_of_its_range_is_one_line(capsys, tiny_gguf, flag):
    """A value out of range is the engine's one line, before the model loads, not the usage."""
    with pytest.raises(SystemExit) as e:
        main(["generate", "-m", str(tiny_gguf("llada", "f32")), "-p", "Hi", flag, "0"])
    assert e.value.code == 2
    assert capsys.readouterr().err == (f"diffuse generate: error: argument {flag}: {flag[2:].replace('-', '_')} = 0 "
                                       "is out of range: expected an integer in [1, 1048576] (see diffuse generate "
                                       "--help)\n")


def test_options_the_run_does_not_read_are_named_once_each(capsys, tiny_gguf):
    """Typed where they do not apply, --window-size, --draft-length and --draft-lora each get one
    warning; the run goes on (a preset or the defaults, which pass them everywhere, get none)."""
    model = str(tiny_gguf("llada", "f32"))
    args = ["generate", "-m", model, "-p", "Hi", "--gen-length", "8", "--steps", "4", "--threads", "1"]
    assert main([*args, "--window-size", "4", "--draft-length", "4", "--draft-lora"]) == 0
    warnings = [line for line in capsys.readouterr().err.splitlines() if "warning" in line]
    assert warnings == ["diffuse: warning: --draft-length is ignored: it applies to mode self_spec only, not diffusion",
                        "diffuse: warning: --draft-lora is ignored: llada-f32.gguf holds no draft LoRA",
                        "diffuse: warning: --window-size is ignored: it applies to WeDLM's window only, not llada"]
    assert main(args) == 0
    assert "warning" not in capsys.readouterr().err


def test_a_draft_lora_beside_a_model_that_reads_none_is_named(capsys, tmp_path):
    hf = write_llada(tmp_path / "hf", dtype="f32", n_shards=1)
    (hf / "linear_spec_lora").mkdir()
    assert main(["convert", str(hf), "-o", str(tmp_path / "m.gguf")]) == 0
    err = capsys.readouterr().err
    assert f"diffuse: warning: {hf / 'linear_spec_lora'}: a draft LoRA, which only Nemotron-Labs-Diffusion's " \
           "self-speculation reads; not converted" in err


@pytest.mark.parametrize("command", ["info", "generate"])
def test_a_file_cut_inside_its_header_is_one_line(capsys, tiny_gguf, tmp_path, command):
    """ggml's log lines, which the engine quotes in parentheses, read as one line: what failed, then why."""
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(tiny_gguf("llada", "f32").read_bytes()[:40])
    argv = ["info", str(cut)] if command == "info" else ["generate", "-m", str(cut), "-p", "Hi"]
    assert main(argv) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.count("(") == err.count(")") and "gguf_init_from_reader" not in err
    assert err.startswith(f"diffuse: error: {cut}: not a valid GGUF file: failed to read key-value pairs; string length ")
