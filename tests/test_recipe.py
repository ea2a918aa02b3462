"""A model's recipe (diffuse.recipe.* keys): written by convert --recipe and `diffuse recipe`, kept
by quantize, shown by info, the default of generate; a hostile recipe is ignored with a warning
naming its key, a bad one given to a writer is refused before any work."""
from __future__ import annotations

import hashlib
import json
import math
import warnings
from pathlib import Path

import numpy as np
import pytest
from test_bad_input import rewrite

import diffuse
from diffuse import DiffuseError, gguf_file, recipe
from diffuse.cli import main
from diffuse.generation import default_options
from diffuse.info import describe, format_info

DEMO = Path(__file__).resolve().parents[1] / "models" / "diffuse-demo-3m.gguf"
DEMO_RECIPE = {"gen_length": 64, "steps": 64, "block_length": 16, "temperature": 0.7}


def digest(path: Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def same_tensors(a: Path, b: Path) -> bool:
    ta, tb = gguf_file.read(a).tensors, gguf_file.read(b).tensors
    return [(t.name, t.type, t.shape) for t in ta] == [(t.name, t.type, t.shape) for t in tb] and all(
        np.array_equal(x.raw(), y.raw()) for x, y in zip(ta, tb))


def answer(capsys, argv: list[str]) -> dict:
    capsys.readouterr()
    assert main(argv) == 0
    return json.loads(capsys.readouterr().out)


# ---- written, kept, shown ----

def test_convert_writes_the_recipe_and_quantize_keeps_it(tiny_hf_llada, tmp_path, capsys):
    out = tmp_path / "m.gguf"
    assert main(["convert", str(tiny_hf_llada), "-o", str(out), "--outtype", "f32",
                 "--recipe", "temperature=0.7", "--recipe", "steps=16", "--recipe", "cache=off",
                 "--recipe", "scheduler=entropy_exit", "--recipe", "top-p=0.9"]) == 0
    assert "recipe steps 16, scheduler entropy_exit, cache off, temperature 0.7, top_p 0.9" in capsys.readouterr().out
    wanted = {"steps": 16, "scheduler": "entropy_exit", "cache": False, "temperature": 0.7, "top_p": 0.9}
    assert diffuse.load(out, threads=1).recipe == wanted
    types = gguf_file.read(out).kv_types
    assert [types[recipe.key(n)] for n in wanted] == ["i32", "str", "bool", "f32", "f32"]
    q8 = tmp_path / "m-q8.gguf"
    assert main(["quantize", str(out), str(q8), "Q8_0"]) == 0
    assert diffuse.load(q8, threads=1).recipe == wanted
    d = describe(q8)
    assert d["recipe"] == wanted and "recipe_problem" not in d
    assert ("recipe        steps 16, scheduler entropy_exit, cache off, temperature 0.7, top_p 0.9"
            in format_info(d))
    capsys.readouterr()
    assert main(["info", str(q8), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["recipe"] == wanted


def test_a_file_without_recipe_says_so(tiny_gguf):
    path = tiny_gguf("dream", "f32")
    assert diffuse.load(path, threads=1).recipe == {}
    assert "recipe        none (the dream defaults)" in format_info(describe(path))


@pytest.mark.parametrize("given, why", [
    ("steps=0", "diffuse.recipe.steps: steps = 0 is out of range"),
    ("temperature=nan", "diffuse.recipe.temperature"),
    ("scheduler=fastest", "diffuse.recipe.scheduler"),
    ("cache=maybe", "cache must be true or false"),
    ("speed=11", "expected OPTION=VALUE"),
    ("steps", "expected OPTION=VALUE"),
    ("steps=many", "steps must be an integer in"),
    ("gen_length=40", "gen_length (40) must be a multiple of block_length (32)"),
])
def test_convert_refuses_a_bad_recipe_before_any_work(tiny_hf_llada, tmp_path, capsys, given, why):
    out = tmp_path / "m.gguf"
    assert main(["convert", str(tiny_hf_llada), "-o", str(out), "--recipe", given]) == 1
    assert why in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []


def test_the_recipe_command(tmp_path, capsys):
    model = tmp_path / "demo.gguf"
    model.write_bytes(DEMO.read_bytes())
    assert main(["recipe", str(model)]) == 0
    shown = capsys.readouterr().out
    assert "recipe    gen_length 64, steps 64, block_length 16, temperature 0.7" in shown
    assert "defaults  gen_length 64, steps 64, block_length 16, sub_block_length 0, scheduler low_confidence" in shown

    assert main(["recipe", str(model), "--set", "steps=32", "--set", "scheduler=entropy_exit",
                 "--unset", "temperature"]) == 0
    assert diffuse.load(model, threads=1).recipe == {"gen_length": 64, "steps": 32, "block_length": 16,
                                                     "scheduler": "entropy_exit"}
    assert same_tensors(model, DEMO)
    before = gguf_file.read(DEMO).kv
    after = gguf_file.read(model).kv
    assert {k: v for k, v in after.items() if not k.startswith(recipe.PREFIX)}.keys() == \
        {k: v for k, v in before.items() if not k.startswith(recipe.PREFIX)}.keys()

    copy = tmp_path / "plain.gguf"
    kept = digest(model)
    assert main(["recipe", str(model), "--clear", "-o", str(copy)]) == 0
    assert digest(model) == kept and diffuse.load(copy, threads=1).recipe == {}
    assert same_tensors(copy, DEMO)
    assert not list(tmp_path.glob("*.part"))


@pytest.mark.parametrize("argv, why", [
    (["--set", "steps=0"], "diffuse.recipe.steps: steps = 0 is out of range"),
    (["--set", "gen_length=256"], "exceeds the model's context of 256"),
    (["--set", "block_length=24"], "gen_length (64) must be a multiple of block_length (24)"),
    (["--unset", "speed"], "--unset speed: no such option"),
    (["--clear", "-o", "SELF"], "would overwrite the input"),
])
def test_the_recipe_command_refuses_and_leaves_the_file_as_it_was(tmp_path, capsys, argv, why):
    model = tmp_path / "demo.gguf"
    model.write_bytes(DEMO.read_bytes())
    argv = [str(model) if a == "SELF" else a for a in argv]
    assert main(["recipe", str(model), *argv]) == 1
    assert why in capsys.readouterr().err
    assert digest(model) == digest(DEMO) and [p.name for p in tmp_path.iterdir()] == ["demo.gguf"]


def test_the_shipped_demo_model_carries_its_recipe():
    assert diffuse.load(DEMO, threads=1).recipe == DEMO_RECIPE
    types = gguf_file.read(DEMO).kv_types
    assert {n: types[recipe.key(n)] for n in DEMO_RECIPE} == {
        "gen_length": "i32", "steps": "i32", "block_length": "i32", "temperature": "f32"}


# ---- the default everywhere ----

def drawn(options: dict) -> dict:
    """A run's options with its seed (drawn at random when none was given) as default_options
    shows it: None."""
    assert 0 <= options["seed"] < diffuse.generation.RANDOM_SEEDS
    return {**options, "seed": None}


def test_generate_without_flags_gives_an_answer_with_every_file_of_the_demo_model(tmp_path, capsys):
    """The family's defaults (128 greedy steps) make the demo model answer end-of-text at once;
    its recipe does not, in its own file, a renamed copy and a quantised one."""
    renamed = tmp_path / "my-model.gguf"
    renamed.write_bytes(DEMO.read_bytes())
    q8 = tmp_path / "demo-q8_0.gguf"
    assert main(["quantize", str(DEMO), str(q8), "Q8_0"]) == 0
    for path in (DEMO, renamed, q8):    # seed 0 answers (about 1 seed in 12 answers end-of-text at once)
        r = answer(capsys, ["generate", "-m", str(path), "-p", "Once upon a time", "--json", "--threads", "1",
                            "--seed", "0"])
        assert drawn(r["options"]) == default_options("llada", DEMO_RECIPE), path
        assert r["text"].strip() and r["useful_length"] > 0, path
    flags = answer(capsys, ["generate", "-m", str(q8), "-p", "Once upon a time", "--json",
                            "--steps", "32", "--temperature", "0"])
    assert drawn(flags["options"]) == default_options("llada", {**DEMO_RECIPE, "steps": 32, "temperature": 0.0})


def test_python_defaults_are_the_recipe():
    model = diffuse.load(DEMO, threads=1)
    r = model.generate("Once upon a time", seed=3)
    assert r.gen_length == 64 and r.steps_allowed == 64
    assert r.tokens.tolist() == model.generate("Once upon a time", seed=3, **DEMO_RECIPE).tokens.tolist()


# ---- hostile recipes: the model loads, the recipe is ignored, the key is named ----

HOSTILE = [
    ({"diffuse.recipe.steps": 0}, {}, "diffuse.recipe.steps: steps = 0 is out of range"),
    ({"diffuse.recipe.steps": -5}, {"diffuse.recipe.steps": "i64"}, "diffuse.recipe.steps"),
    ({"diffuse.recipe.steps": "64"}, {}, "diffuse.recipe.steps: stored as a GGUF str"),
    ({"diffuse.recipe.steps": [1, 2]}, {"diffuse.recipe.steps": "array[i32]"}, "stored as a GGUF array[i32]"),
    ({"diffuse.recipe.temperature": math.nan}, {"diffuse.recipe.temperature": "f32"},
     "diffuse.recipe.temperature: temperature = nan is out of range"),
    ({"diffuse.recipe.cache": 1}, {"diffuse.recipe.cache": "u8"}, "diffuse.recipe.cache: stored as a GGUF u8"),
    ({"diffuse.recipe.scheduler": "\x1b[2Jfast"}, {}, "diffuse.recipe.scheduler"),
    ({"diffuse.recipe.\x1b[2J": 1}, {"diffuse.recipe.\x1b[2J": "i32"}, "no such generation option"),
    ({"diffuse.recipe.gen_length": 250}, {"diffuse.recipe.gen_length": "u32"}, "must be a multiple of block_length"),
    ({"diffuse.recipe.gen_length": 2**31 - 1}, {"diffuse.recipe.gen_length": "i32"}, "out of range"),
]


@pytest.mark.parametrize("kv, types, why", HOSTILE)
def test_a_hostile_recipe_is_ignored_with_a_warning_naming_its_key(tmp_path, capsys, kv, types, why):
    good = {} if "diffuse.recipe.temperature" in kv else {"diffuse.recipe.temperature": 0.5}
    path = rewrite(DEMO, tmp_path / "hostile.gguf", good | kv, types=types)
    with pytest.warns(recipe.RecipeWarning, match="the file's recipe is ignored") as caught:
        model = diffuse.load(path, threads=1)
    assert why in str(caught[0].message)
    assert model.recipe == {} and why in model.recipe_problem      # all of it: temperature too
    r = answer(capsys, ["generate", "-m", str(path), "-p", "Hello", "--json", "--gen-length", "16",
                        "--steps", "4", "--block-length", "16"])
    assert drawn(r["options"]) == default_options("llada", {"gen_length": 16, "steps": 4, "block_length": 16})
    assert main(["info", str(path)]) == 0
    out = capsys.readouterr().out
    assert "recipe        ignored: " in out and "\x1b" not in out
    with warnings.catch_warnings():
        warnings.simplefilter("error")          # info reports it once, in its text, not as a warning
        describe(path)


def test_the_cli_prints_the_warning_as_one_escaped_line(tmp_path, capsys):
    path = rewrite(DEMO, tmp_path / "hostile.gguf", {"diffuse.recipe.\x1b[2J": 1},
                   types={"diffuse.recipe.\x1b[2J": "i32"})
    capsys.readouterr()
    assert main(["generate", "-m", str(path), "-p", "Hello", "--gen-length", "16", "--steps", "2",
                 "--block-length", "16"]) == 0
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.startswith("diffuse: warning:")]
    assert len(lines) == 1 and "diffuse.recipe.\\x1b[2J: no such generation option" in lines[0]
    assert "\x1b" not in err


def test_recipe_write_is_checked_for_the_model(tmp_path):
    with pytest.raises(DiffuseError, match="diffuse.recipe.top_p"):
        recipe.write(DEMO, {"top_p": 0.0}, tmp_path / "x.gguf")
    with pytest.raises(DiffuseError, match="diffuse.recipe.speed: no such generation option"):
        recipe.write(DEMO, {"speed": 1}, tmp_path / "x.gguf")
    assert list(tmp_path.iterdir()) == []
