"""Model.generate_stream: sequences join a running batch at step boundaries and leave it when done.

A sequence's tokens must not depend on when it joined or which sequences shared its forward passes:
with greedy decoding each equals its own generate() run."""
from __future__ import annotations

import pytest

import diffuse
from diffuse import DiffuseError

PROMPTS = [[5, 17, 42, 8, 99, 3], [7, 7, 120, 33], [200, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10], [64]]
KW = dict(gen_length=32, steps=16, block_length=8)


@pytest.fixture(scope="module", params=["llada", "dream"])
def model(request, tiny_gguf):
    return diffuse.load(tiny_gguf(request.param, "f32"), threads=1)


def run_schedule(model, schedule: list[list[tuple]], **options):
    """A stream that admits schedule[k] at its k-th step boundary: (results and step numbers by
    sequence, caches held)."""
    boundaries = iter(schedule)
    results, steps = {}, {}

    def on_step(ev):
        steps.setdefault(ev.sequence, []).append(ev.step)

    n_caches = model.generate_stream(lambda: next(boundaries, []), results.__setitem__, on_step=on_step, **options)
    return results, steps, n_caches


@pytest.mark.parametrize("cache", [False, True])
def test_sequences_joining_later_match_one_by_one(model, cache):
    kw = dict(KW, cache=cache)
    short = {"gen_length": 16, "steps": 8}
    alone = [model.generate(PROMPTS[0], **kw), model.generate(PROMPTS[1], **{**kw, **short}),
             model.generate(PROMPTS[2], **kw), model.generate(PROMPTS[3], **kw)]
    # Sequence 0 runs alone for one step; 1 joins at step 2 with its own length; 2 and 3 join at step 5.
    schedule = [[(PROMPTS[0], {})], [], [(PROMPTS[1], short)], [], [], [(PROMPTS[2], {}), (PROMPTS[3], {})]]
    results, steps, n_caches = run_schedule(model, schedule, **kw)
    assert [results[s].tokens.tolist() for s in range(4)] == [a.tokens.tolist() for a in alone]
    assert [results[s].steps for s in range(4)] == [a.steps for a in alone]
    assert all(steps[s] == list(range(results[s].steps)) for s in range(4))
    assert n_caches == 4    # all four ran together from step 5 to the end of sequence 1


def test_caches_are_reused_as_sequences_come_and_go(model):
    # 50 sequences of 2-4 steps, at most 2 at a time: the stream holds 2 K/V caches, not 50.
    budget = lambda i: {"steps": 2 + i % 3}   # noqa: E731 - they end at different steps
    alone = {(p, s): model.generate(PROMPTS[p], gen_length=8, block_length=8, steps=s).tokens.tolist()
             for p in range(4) for s in (2, 3, 4)}
    waiting, results = list(range(50)), {}
    running = 0

    def admit():
        nonlocal running
        take = waiting[:2 - running]
        del waiting[:len(take)]
        running += len(take)
        return [(PROMPTS[i % 4], budget(i)) for i in take]

    def on_finish(sequence, result):
        nonlocal running
        running -= 1
        results[sequence] = result

    assert model.generate_stream(admit, on_finish, gen_length=8, block_length=8) == 2
    assert sorted(results) == list(range(50))
    assert all(results[i].tokens.tolist() == alone[i % 4, 2 + i % 3] for i in range(50))


def test_a_refused_item_fails_alone(model):
    schedule = [[(PROMPTS[0], {})],
                [([], {}), (PROMPTS[1], {"scheduler": "fastest"}), (PROMPTS[2], {"gen_length": 30}), (PROMPTS[3], {})]]
    results, steps, _ = run_schedule(model, schedule, **KW)
    assert isinstance(results[1], DiffuseError) and "the prompt is empty" in str(results[1])   # checked in Python
    assert isinstance(results[2], DiffuseError) and "scheduler" in str(results[2])
    assert isinstance(results[3], DiffuseError) and "multiple of block_length" in str(results[3])   # by the engine
    assert 1 not in steps and 3 not in steps
    for s, prompt in ((0, PROMPTS[0]), (4, PROMPTS[3])):
        assert results[s].tokens.tolist() == model.generate(prompt, **KW).tokens.tolist()


def test_a_callback_error_ends_the_stream(model):
    def admit():
        raise RuntimeError("admit broke")

    with pytest.raises(RuntimeError, match="admit broke"):
        model.generate_stream(admit, lambda s, r: None, **KW)
    assert model.generate(PROMPTS[0], **KW).steps == 16
