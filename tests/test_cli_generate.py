"""`diffuse generate`: live view, summary, recording, clear errors."""
from diffuse.cli import main
from diffuse.recording import Recording


def test_generate_prints_steps_answer_and_summary(tiny_gguf, tmp_path, capsys):
    run = tmp_path / "run.npz"
    code = main(["generate", "-m", str(tiny_gguf("llada", "f32")), "-p", "Hello there", "--gen-length", "16",
                 "--steps", "8", "--block-length", "8", "--threads", "1", "--record", str(run)])
    out, err = capsys.readouterr()
    assert code == 0
    assert out.count("step ") == 8 and "step 8/8" in out            # one status line per step (not a tty)
    assert "steps 8/8 (done)" in err and "tok/s" in err
    rec = Recording.load(run)
    assert len(rec.events) == 8 and rec.result.steps == 8


def test_generate_reports_bad_requests(tiny_gguf, capsys):
    code = main(["generate", "-m", str(tiny_gguf("dream", "f32")), "-p", "  ", "--threads", "1"])
    assert code == 1 and "the prompt is empty" in capsys.readouterr().err
    code = main(["generate", "-m", str(tiny_gguf("dream", "f32")), "-p", "hi", "--gen-length", "30",
                 "--block-length", "8"])
    assert code == 1 and "multiple of block_length" in capsys.readouterr().err
