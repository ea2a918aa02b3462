"""`diffuse generate`: live view, summary, recording, clear errors, flags from the option table."""
import pytest

from diffuse import physical_cores
from diffuse.cli import build_parser, main
from diffuse.cli.bench import GRID_AXES
from diffuse.cli.generate import generation_options
from diffuse.generation import OPTIONS, resolve_options
from diffuse.recording import Recording

NUMBERS = [o for o in OPTIONS if o["kind"] in ("int", "float", "seed")]


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
    assert rec.options == resolve_options("llada", gen_length=16, steps=8, block_length=8)   # what ran


def test_generate_reports_bad_requests(tiny_gguf, capsys):
    code = main(["generate", "-m", str(tiny_gguf("dream", "f32")), "-p", "  ", "--threads", "1"])
    assert code == 1 and "the prompt is empty" in capsys.readouterr().err
    code = main(["generate", "-m", str(tiny_gguf("dream", "f32")), "-p", "hi", "--gen-length", "30",
                 "--block-length", "8"])
    assert code == 1 and "multiple of block_length" in capsys.readouterr().err


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
        argv += ["--no-cache"] if o["kind"] == "bool" else [flag(o), value if o["kind"] == "choice" else text(o, value)]
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
    assert "default llada 32, dream 0" in out and "(0, 1]; default 1" in out
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
