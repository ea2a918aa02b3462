"""Seeds: a run that names none draws a fresh random one, so that sampling again gives another
answer, and reports it (result.options["seed"], the recording, `diffuse info`) so that the run can
be repeated exactly; a seed that is given runs as given."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

import diffuse
from diffuse.cli import main
from diffuse.generation import RANDOM_SEEDS, default_options, resolve_options
from diffuse.recording import Recording

DEMO = Path(__file__).resolve().parents[1] / "models" / "diffuse-demo-3m.gguf"
PROMPT = "Tell me about Mr. Darcy."
SMALL = dict(gen_length=32, steps=16)      # the demo model's recipe samples at temperature 0.7


@pytest.fixture(scope="module")
def model():
    m = diffuse.load(DEMO, threads=1)
    assert m.recipe["temperature"] > 0
    return m


def seed_of(result) -> int:
    seed = result.options["seed"]
    assert isinstance(seed, int) and 0 <= seed < RANDOM_SEEDS
    return seed


def test_unset_seeds_differ_and_the_reported_one_repeats_the_run(model):
    a, b = model.generate(PROMPT, **SMALL), model.generate(PROMPT, **SMALL)
    assert seed_of(a) != seed_of(b)
    assert a.text != b.text or not a.text.strip()   # the 3M demo can answer nothing (rarely since 2026-12-03)
    again = model.generate(PROMPT, **SMALL, seed=seed_of(a))
    assert again.tokens.tolist() == a.tokens.tolist() and again.text == a.text
    assert a.options == again.options      # every option the run used, the model's defaults included


def test_a_given_seed_runs_as_given(model):
    runs = [model.generate(PROMPT, **SMALL, seed=7) for _ in range(2)] + [model.generate(PROMPT, **SMALL, seed=None)]
    assert [r.options["seed"] for r in runs[:2]] == [7, 7] and runs[0].tokens.tolist() == runs[1].tokens.tolist()
    assert seed_of(runs[2]) != 7      # None: left unset, drawn
    big = model.generate(PROMPT, **SMALL, seed=2**64 - 1)      # the engine's whole range still runs
    assert big.options["seed"] == 2**64 - 1


def test_each_sequence_of_a_batch_draws_its_own(model):
    results = model.generate_batch([PROMPT] * 3, per_prompt=[{}, {}, {"seed": 11}], **SMALL)
    seeds = [r.options["seed"] for r in results]
    assert len(set(seeds)) == 3 and seeds[2] == 11
    assert len({r.text for r in results[:2]}) == 2
    again = model.generate_batch([PROMPT] * 3, per_prompt=[{"seed": s} for s in seeds], **SMALL)
    assert [r.tokens.tolist() for r in again] == [r.tokens.tolist() for r in results]


def test_each_sequence_of_a_stream_draws_its_own(model):
    def stream(overrides: list[dict]) -> dict:
        waiting, done = [[(PROMPT, o) for o in overrides]], {}
        model.generate_stream(lambda: waiting.pop() if waiting else [], done.__setitem__, **SMALL)
        return done

    first = stream([{}, {}])
    seeds = [seed_of(first[i]) for i in range(2)]
    assert seeds[0] != seeds[1]
    again = stream([{"seed": s} for s in seeds])
    assert [again[i].tokens.tolist() for i in range(2)] == [first[i].tokens.tolist() for i in range(2)]


def test_options_resolve_to_a_fresh_seed_and_defaults_say_none():
    assert len({resolve_options("llada")["seed"] for _ in range(5)}) == 5
    assert resolve_options("llada", seed=0)["seed"] == 0
    assert default_options("llada")["seed"] is None            # what "auto" means: drawn per run
    assert resolve_options("llada", {"seed": 5})["seed"] == default_options("llada", {"seed": 5})["seed"] == 5
    assert resolve_options("llada", {"seed": 5}, seed=6)["seed"] == 6


def test_the_recording_and_diffuse_info_hold_the_seed(tmp_path, capsys):
    """diffuse generate without --seed: its --json and its --record say which seed ran, and
    --seed with it gives the same tokens."""
    path = tmp_path / "run.npz"
    argv = ["generate", "-m", str(DEMO), "-p", PROMPT, "--gen-length", "32", "--steps", "16", "--threads", "1",
            "--json"]
    capsys.readouterr()
    assert main([*argv, "--record", str(path)]) == 0
    out = json.loads(capsys.readouterr().out)
    rec = Recording.load(path)
    seed = out["options"]["seed"]
    assert 0 <= seed < RANDOM_SEEDS
    assert rec.options["seed"] == rec.result.options["seed"] == seed
    assert rec.result.options == rec.options
    assert main(["info", str(path)]) == 0
    assert f"seed {seed}" in capsys.readouterr().out
    assert main(["info", str(path), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["options"]["seed"] == seed
    assert main([*argv, "--seed", str(seed)]) == 0
    assert json.loads(capsys.readouterr().out)["tokens"] == out["tokens"] == rec.result.tokens.tolist()
