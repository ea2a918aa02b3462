"""The command line on wrong input: one clear error line before any work, no traceback, no output
file; and the notes and warnings a user should see."""
from __future__ import annotations

import subprocess
import sys

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
