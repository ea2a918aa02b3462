"""One Model shared by threads, many sequences per forward pass, and the option table.

The Model is immutable and every call borrows its own engine context, so concurrent calls must
give exactly the tokens of sequential ones. generate_batch runs every sequence through one forward
pass per step; with greedy decoding it must give each prompt's generate() tokens."""
from __future__ import annotations

import threading

import numpy as np
import pytest

import diffuse
from diffuse import DiffuseError, _core
from diffuse.generation import OPTIONS, default_options, resolve_options

PROMPTS = [[5, 17, 42, 8, 99, 3], [7, 7, 120, 33], [200, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10], [64]]


@pytest.fixture(scope="module", params=["llada", "dream"])
def model(request, tiny_gguf):
    return diffuse.load(tiny_gguf(request.param, "f32"), threads=1)


def run_threads(n: int, work) -> list:
    """work(i) on n threads at once; results in thread order; the first exception re-raised."""
    results, errors = [None] * n, []
    barrier = threading.Barrier(n)

    def body(i):
        try:
            barrier.wait()
            results[i] = work(i)
        except BaseException as e:   # noqa: BLE001 - re-raised below
            errors.append(e)

    threads = [threading.Thread(target=body, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    return results


def test_four_threads_generate_the_sequential_tokens(model):
    kw = dict(gen_length=32, steps=16, block_length=8, temperature=0.8, seed=11)
    want = [model.generate(p, **kw).tokens.tolist() for p in PROMPTS]
    for _ in range(5):   # rounds: a race shows up as a crash, an assertion or other tokens
        got = run_threads(4, lambda i: model.generate(PROMPTS[i], **kw).tokens.tolist())
        assert got == want


def test_threads_mixing_forward_and_generate(model):
    ids = np.arange(3, 40) % model.n_vocab
    logits = model.forward(ids)
    tokens = model.generate(PROMPTS[0], gen_length=16, steps=8, block_length=8).tokens.tolist()

    def work(i):
        if i % 2:
            return np.array_equal(model.forward(ids), logits)
        return model.generate(PROMPTS[0], gen_length=16, steps=8, block_length=8).tokens.tolist() == tokens

    for _ in range(3):
        assert all(run_threads(4, work))


@pytest.mark.parametrize("cache", [False, True])
def test_batch_matches_one_by_one(model, cache):
    kw = dict(gen_length=32, steps=16, block_length=8, cache=cache)
    single = [model.generate(p, **kw) for p in PROMPTS]
    batch = model.generate_batch(PROMPTS, **kw)
    # Measured: every token equal (ragged lengths 1-11, both families, cache on and off). Rows of a
    # batch go through the same kernels as alone, so only float ties could differ.
    agree = np.mean([np.mean(a.tokens == b.tokens) for a, b in zip(single, batch)])
    assert agree == 1.0
    assert [b.steps for b in batch] == [s.steps for s in single]


def test_batch_events_carry_the_sequence_and_cancel_one(model):
    events = []

    def on_step(ev):
        events.append((ev.sequence, ev.step, len(ev.tokens)))
        return not (ev.sequence == 1 and ev.step == 2)   # cancel sequence 1 after its third step

    out = model.generate_batch(PROMPTS[:3], gen_length=16, steps=8, block_length=8, on_step=on_step)
    assert [r.stop_reason for r in out] == ["done", "cancelled", "done"]
    assert out[1].steps == 3 and out[0].steps == out[2].steps == 8
    for s in range(3):
        mine = [e for e in events if e[0] == s]
        assert [e[1] for e in mine] == list(range(out[s].steps))
        assert {e[2] for e in mine} == {len(PROMPTS[s]) + 16}


def test_batch_per_prompt_options(model):
    per_prompt = [dict(gen_length=16, block_length=8, steps=8), dict(gen_length=32, block_length=32, steps=4,
                                                                     scheduler="entropy_exit", threshold=1e6)]
    out = model.generate_batch(PROMPTS[:2], per_prompt=per_prompt)
    alone = [model.generate(p, **o) for p, o in zip(PROMPTS[:2], per_prompt)]
    assert [len(r.tokens) for r in out] == [16, 32]
    assert [r.tokens.tolist() for r in out] == [r.tokens.tolist() for r in alone]
    assert out[1].steps == 1   # entropy_exit with tau above every entropy commits the block at once


def test_batch_errors_name_the_prompt(model):
    with pytest.raises(DiffuseError, match="prompt 1: the prompt is empty"):
        model.generate_batch([PROMPTS[0], []], gen_length=16, steps=8, block_length=8)
    with pytest.raises(DiffuseError, match="no prompts"):
        model.generate_batch([])
    with pytest.raises(DiffuseError, match="per_prompt has 1 entries for 2 prompts"):
        model.generate_batch(PROMPTS[:2], per_prompt=[{}])


def test_pooled_contexts_survive_errors(model):
    """A failed call returns its context to the pool in a usable state."""
    with pytest.raises(DiffuseError):
        model.generate(PROMPTS[0], gen_length=30, block_length=8)
    with pytest.raises(DiffuseError):
        model.forward([model.n_vocab + 5])
    assert model.generate(PROMPTS[0], gen_length=16, steps=8, block_length=8).steps == 8


# ---- the option table ----

def test_every_option_has_a_table_entry_and_a_default():
    names = [o["name"] for o in OPTIONS]
    for arch in ("llada", "dream"):
        assert list(default_options(arch)) == names
    assert default_options("dream")["eps"] == 0.001     # the shortest decimal, not 0.0010000000474974513
    for o in OPTIONS:
        assert o["help"] and o["range"]


@pytest.mark.parametrize("o", OPTIONS, ids=lambda o: o["name"])
def test_option_range_edges(o):
    """The table's range is exactly what the engine accepts: its ends pass, one step past fails."""
    name = o["name"]
    if o["kind"] == "choice":
        for c in o["choices"]:
            assert resolve_options("llada", **{name: c})[name] == c
        with pytest.raises(DiffuseError, match=f"unknown {name} .nope."):
            resolve_options("llada", **{name: "nope"})
        return
    if o["kind"] == "bool":
        assert resolve_options("llada", **{name: False})[name] is False
        with pytest.raises(DiffuseError, match=f"{name} must be true or false"):
            resolve_options("llada", **{name: 1})
        return
    integral = o["kind"] in ("int", "seed")
    lo, hi = o["min"], o["max"]
    step = 1 if integral else 1e-6 * max(1.0, abs(hi))
    cast = int if integral else float
    if o["kind"] == "seed":
        lo, hi = 0, 2**64 - 1
    for ok in (lo + step if o["min_open"] else lo, hi - step if o["max_open"] else hi):
        assert resolve_options("llada", **{name: cast(ok)})[name] == pytest.approx(cast(ok))
    for bad in (lo if o["min_open"] else lo - step, hi if o["max_open"] else hi + step):
        with pytest.raises(DiffuseError, match=f"{name} = .* is out of range: expected"):
            resolve_options("llada", **{name: cast(bad)})


def test_option_types_are_checked():
    with pytest.raises(DiffuseError, match="gen_length must be an integer"):
        resolve_options("llada", gen_length=64.0)
    with pytest.raises(DiffuseError, match="temperature must be a number"):
        resolve_options("llada", temperature="hot")
    with pytest.raises(DiffuseError, match="unknown generation option 'bogus'"):
        resolve_options("llada", bogus=1)
    assert resolve_options("llada", gen_length=np.int64(64), temperature=np.float32(0.5), cache=np.bool_(False))[
        "gen_length"] == 64


def test_physical_cores_is_the_default_thread_count(tiny_gguf):
    assert 1 <= diffuse.physical_cores()
    assert diffuse.load(tiny_gguf("llada", "f32")).threads == diffuse.physical_cores()
    assert _core.physical_cores() == diffuse.physical_cores()
