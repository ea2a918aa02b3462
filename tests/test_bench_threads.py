"""`diffuse bench threads` on tiny models: every kind at every thread count, llama.cpp's side from a
stand-in llama-bench (20 ms a run), a side llama.cpp cannot run left out with its reason. No timing
is asserted."""
from __future__ import annotations

import json

import pytest

from diffuse.bench import threads
from diffuse.cli import main

FAKE_LLAMA_BENCH = "#!/bin/sh\necho '[{\"avg_ns\": 20000000, \"stddev_ns\": 1, \"samples_ns\": [20000000]}]'\n"
FAILING_LLAMA_BENCH = "#!/bin/sh\necho 'llama_bench: error: failed to load model' >&2\nexit 1\n"


def _bin(folder, script: str):
    folder.mkdir()
    (folder / "llama-bench").write_text(script)
    (folder / "llama-bench").chmod(0o755)
    return folder


def test_every_kind_at_every_thread_count_beside_llama(tiny_gguf, tmp_path, capsys):
    dream = str(tiny_gguf("dream", "f32"))
    rc = main(["bench", "threads", dream, "--threads", "1,2", "--rows", "16", "--depth", "16", "--width", "4",
               "--reps", "2", "--ar-model", dream, "--llama-bin", str(_bin(tmp_path / "bin", FAKE_LLAMA_BENCH)),
               "--json", str(tmp_path / "t.json"), "--markdown", str(tmp_path / "t.md")])
    assert rc == 0, capsys.readouterr().err
    result = json.loads((tmp_path / "t.json").read_text())
    assert [(r["kind"], r["threads"]) for r in result["table"]] == [(k, t) for k in threads.KINDS for t in (1, 2)]
    for r in result["table"]:
        assert r["ms"] > 0 and len(r["samples"]) == 2 and len(r["llama_samples"]) == 2
        first = next(x for x in result["table"] if x["kind"] == r["kind"] and x["threads"] == 1)
        assert r["speedup"] == pytest.approx(first["ms"] / r["ms"])
        # the stand-in's 20 ms per run; its decode run is 16 tokens
        assert r["llama_ms"] == pytest.approx(20.0 / 16 if r["kind"] == "AR decode" else 20.0)
        assert r["ratio"] == pytest.approx(r["ms"] / r["llama_ms"]) and r["llama_speedup"] == pytest.approx(1.0)
    assert result["llama_left_out"] == {} and result["machine"]["cores"] >= 1
    out = capsys.readouterr().out
    assert "ours / llama.cpp" in out and "speedup over 1 thread" in out
    assert "| AR decode | 2 |" in (tmp_path / "t.md").read_text()


def test_what_llama_cannot_run_is_left_out_with_its_reason(tiny_gguf, tmp_path, capsys):
    """An SDAR file has no llama.cpp full pass; without --ar-model there is nothing to decode; a
    llama-bench that fails says so; --no-llama and no llama-bench at all leave ours alone."""
    sdar = str(tiny_gguf("sdar", "f32"))
    args = ["bench", "threads", sdar, "--threads", "1", "--rows", "8", "--depth", "8", "--reps", "1"]
    assert main([*args, "--llama-bin", str(_bin(tmp_path / "ok", FAKE_LLAMA_BENCH)),
                 "--json", str(tmp_path / "a.json")]) == 0
    left = json.loads((tmp_path / "a.json").read_text())["llama_left_out"]
    assert "dream and llada only" in left["full step"] and "no --ar-model" in left["AR decode"]
    out = capsys.readouterr().out
    assert "llama.cpp, block step: not measured (no --ar-model" in out and "ours / llama.cpp" not in out

    assert main([*args, "--ar-model", sdar, "--llama-bin", str(_bin(tmp_path / "bad", FAILING_LLAMA_BENCH)),
                 "--json", str(tmp_path / "b.json")]) == 0
    left = json.loads((tmp_path / "b.json").read_text())["llama_left_out"]
    assert "failed on" in left["AR decode"] and "failed to load model" in left["AR decode"]

    assert main([*args, "--no-llama", "--json", str(tmp_path / "c.json")]) == 0
    result = json.loads((tmp_path / "c.json").read_text())
    assert set(result["llama_left_out"].values()) == {"--no-llama"}
    assert all("llama_ms" not in r for r in result["table"])


@pytest.mark.parametrize("argv, message", [
    (["--depth", "10", "--width", "4"], "not a multiple of --width 4"),
    (["--rows", "1000000000"], "exceed the model's context"),
    (["--reps", "0"], "must be at least 1"),
    (["--threads", "0"], "positive integers"),
])
def test_bad_arguments_are_one_clear_line(tiny_gguf, argv, message, capsys):
    try:
        code = main(["bench", "threads", str(tiny_gguf("dream", "f32")), "--no-llama", *argv])
    except SystemExit as e:         # argparse's own refusal
        code = e.code
    assert code != 0
    assert message in capsys.readouterr().err


def test_diffusion_gemma_times_its_canvas_step_and_encoder(tmp_path, capsys):
    """No full step, block step or AR decode: one line says so before the header, and its two
    passes are timed at each thread count instead (exit 0)."""
    from fixtures.tiny_diffusion_gemma import write_diffusion_gemma

    from diffuse.convert import convert_hf
    model = str(convert_hf(write_diffusion_gemma(tmp_path / "hf"), tmp_path / "dg.gguf", "f32"))
    assert main(["bench", "threads", model, "--threads", "1,2", "--depth", "8", "--reps", "1",
                 "--json", str(tmp_path / "t.json")]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[0].startswith("dg.gguf: no full step, block step or AR decode")
    result = json.loads((tmp_path / "t.json").read_text())
    assert [(r["kind"], r["threads"]) for r in result["table"]] == [
        (k, t) for k in threads.CANVAS_KINDS for t in (1, 2)]
    assert all(r["ms"] > 0 for r in result["table"]) and result["rows"] == 16
