"""The denoising loop: parity with the reference samplers, cache semantics, events, errors."""
from __future__ import annotations

import numpy as np
import pytest

import diffuse
from diffuse import DiffuseError, _core
from reference.generate import dream_generate, llada_generate

PROMPT = [5, 17, 42, 8, 99, 3]


@pytest.fixture(scope="module")
def llada(tiny_gguf):
    return diffuse.load(tiny_gguf("llada", "f32"), threads=2)


@pytest.fixture(scope="module")
def dream(tiny_gguf):
    return diffuse.load(tiny_gguf("dream", "f32"), threads=2)


@pytest.mark.parametrize("block_length,steps", [(8, 16), (16, 8), (32, 32)])
def test_llada_low_confidence_matches_reference(llada, block_length, steps):
    expected = llada_generate(llada.forward, PROMPT, llada.mask_token_id, 32, steps, block_length)
    got = llada.generate(PROMPT, gen_length=32, steps=steps, block_length=block_length,
                         scheduler="low_confidence", cache=False)
    assert got.tokens.tolist() == expected.tolist()
    assert got.steps == steps and got.stop_reason == "done"


def test_llada_classifier_free_guidance_matches_reference(llada):
    expected = llada_generate(llada.forward, PROMPT, llada.mask_token_id, 16, 8, 8, cfg_scale=1.5)
    got = llada.generate(PROMPT, gen_length=16, steps=8, block_length=8, cfg_scale=1.5, cache=False)
    assert got.tokens.tolist() == expected.tolist()
    plain = llada.generate(PROMPT, gen_length=16, steps=8, block_length=8, cache=False)
    assert got.tokens.tolist() != plain.tokens.tolist()


@pytest.mark.parametrize("alg", ["maskgit_plus", "topk_margin", "entropy"])
def test_dream_matches_reference(dream, alg):
    expected = dream_generate(dream.forward, PROMPT, dream.mask_token_id, 24, 12, alg)
    got = dream.generate(PROMPT, gen_length=24, steps=12, block_length=0, scheduler=alg, cache=False)
    assert got.tokens.tolist() == expected.tolist()


@pytest.mark.parametrize("family", ["llada", "dream"])
def test_cache_refreshed_every_step_is_exact(family, llada, dream):
    m = llada if family == "llada" else dream
    kw = dict(gen_length=32, steps=16, block_length=8)
    plain = m.generate(PROMPT, cache=False, **kw)
    refreshed = m.generate(PROMPT, cache=True, refresh_every=1, **kw)
    assert refreshed.tokens.tolist() == plain.tokens.tolist()


@pytest.mark.parametrize("family", ["llada", "dream"])
def test_positions_that_never_changed_stay_cached(family, llada, dream):
    """With default options step 1 recomputes only the block's masks, what step 0 committed and
    (Dream) the rows whose shifted logits are needed: the prompt and later blocks come from the cache."""
    m = llada if family == "llada" else dream
    events = []
    m.generate(PROMPT, gen_length=32, steps=16, block_length=8, on_step=events.append)
    n_total = len(PROMPT) + 32
    first, second = events[0], events[1]
    assert len(first.active) == n_total
    want = set(range(second.block_start, second.block_end))   # masked or just committed, all in block 0
    if family == "dream":
        want |= {p - 1 for p in range(second.block_start, second.block_end) if first.mask[p]}
    assert set(second.active.tolist()) == want
    assert set(range(len(PROMPT) - 1)) <= set(second.cached.tolist())


def test_cache_recomputes_only_active_positions(llada):
    events = []
    llada.generate(PROMPT, gen_length=32, steps=16, block_length=8, keep_active=1, on_step=events.append)
    n_total = len(PROMPT) + 32
    assert len(events[0].active) == n_total            # step 0: full refresh
    for ev in events[1:]:
        assert len(ev.active) < n_total
        assert sorted(np.concatenate([ev.active, ev.cached]).tolist()) == list(range(n_total))
        # every masked position of the current block is recomputed
        masked_in_block = [p for p in range(ev.block_start, ev.block_end)
                           if ev.mask[p] or p in set(ev.unmasked.tolist())]
        assert set(masked_in_block) <= set(ev.active.tolist())


def test_refresh_every_recomputes_all(llada):
    events = []
    llada.generate(PROMPT, gen_length=32, steps=16, block_length=8, refresh_every=4, on_step=events.append)
    n_total = len(PROMPT) + 32
    for ev in events:
        if ev.step % 4 == 0:
            assert len(ev.active) == n_total


def test_events_describe_each_step(llada):
    events = []
    r = llada.generate(PROMPT, gen_length=32, steps=16, block_length=8, on_step=events.append)
    assert len(events) == r.steps
    seen_masked = np.ones(32, bool)
    for ev in events:
        assert ev.tokens.dtype == np.int32 and ev.mask.dtype == bool
        assert len(ev.unmasked) > 0
        for p in ev.unmasked:
            assert ev.block_start <= p < ev.block_end and not ev.mask[p]
            assert np.isfinite(ev.entropy[p]) and 0 < ev.confidence[p] <= 1
        # entropy is evaluated exactly on the positions that were masked in this block before the step
        evaluated = set(np.nonzero(np.isfinite(ev.entropy))[0].tolist())
        before = {ev.prompt_length + i for i in np.nonzero(seen_masked)[0]
                  if ev.block_start <= ev.prompt_length + i < ev.block_end}
        assert evaluated == before
        seen_masked = ev.gen_mask.copy()
        assert ev.forward_ms > 0 and ev.total_ms >= ev.forward_ms
    assert not events[-1].mask.any()
    assert np.array_equal(events[-1].gen_tokens, r.tokens)
    assert (r.decided_step >= 0).all() and r.decided_step.max() == r.steps - 1


def test_entropy_exit_finishes_blocks_early(llada):
    kw = dict(gen_length=32, steps=32, block_length=8, scheduler="entropy_exit")
    eager = llada.generate(PROMPT, threshold=1e6, **kw)      # every position is below tau
    assert eager.steps == 4                                    # one step per block
    strict = llada.generate(PROMPT, threshold=0.0, **kw)     # none is: the schedule alone
    assert strict.steps == 32
    assert not (eager.tokens == llada.mask_token_id).any()


def test_same_seed_same_tokens_any_thread_count(llada):
    kw = dict(gen_length=32, steps=16, block_length=8, temperature=0.9, seed=1234)
    a = llada.generate(PROMPT, threads=1, **kw)
    b = llada.generate(PROMPT, threads=2, **kw)
    c = llada.generate(PROMPT, threads=2, **{**kw, "seed": 99})
    assert a.tokens.tolist() == b.tokens.tolist()
    assert a.tokens.tolist() != c.tokens.tolist()


@pytest.mark.parametrize("scheduler", diffuse.generation.SCHEDULERS)
def test_every_scheduler_fills_the_buffer(dream, scheduler):
    r = dream.generate(PROMPT, gen_length=16, steps=8, block_length=8, scheduler=scheduler,
                       temperature=0.7, top_p=0.9, top_k=50, seed=3)
    # Threshold rules run a block until it has no masks: at most one step per position.
    until_done = scheduler in ("confidence_threshold", "entropy_bounded", "confidence_factor")
    assert r.steps <= r.steps_allowed == (16 if until_done else 8)
    assert not (r.tokens == dream.mask_token_id).any()


def test_cancel_within_one_step(llada):
    seen = []

    def stop_at_third(ev):
        seen.append(ev.step)
        return ev.step < 2

    r = llada.generate(PROMPT, gen_length=32, steps=16, block_length=8, on_step=stop_at_third)
    assert r.stop_reason == "cancelled" and r.steps == 3 and seen == [0, 1, 2]


def test_callback_exception_propagates(llada):
    class Boom(Exception):
        pass

    def explode(ev):
        if ev.step == 1:
            raise Boom("from the callback")

    with pytest.raises(Boom, match="from the callback"):
        llada.generate(PROMPT, gen_length=16, steps=8, block_length=8, on_step=explode)
    # the model is still usable afterwards
    assert llada.generate(PROMPT, gen_length=16, steps=8, block_length=8).steps == 8


def test_all_eos_block_stops_early(llada):
    opts = {**diffuse.generation.default_options("llada"), "gen_length": 32, "steps": 16, "block_length": 8}
    [out] = _core.generate_batch(llada._core, [np.array(PROMPT, np.int32)], options=[opts],
                                 eos_ids=list(range(llada.n_vocab)))
    assert out["stop_reason"] == "eos" and out["steps"] == 4


@pytest.mark.parametrize("bad,match", [
    (dict(prompt=[]), "prompt is empty"),
    (dict(prompt="   "), "prompt is empty"),
    (dict(gen_length=30, block_length=8), "multiple of block_length"),
    (dict(gen_length=100000), "exceeds the model's context"),
    (dict(scheduler="nope"), "unknown scheduler"),
    (dict(keep_active=0), "keep_active"),
    (dict(top_p=0.0), "top_p"),
    (dict(steps=0), r"steps = 0 is out of range: expected an integer in \[1, "),
    (dict(seed=-1), "seed = -1 is out of range"),
    (dict(gen_length="64"), "gen_length must be an integer"),
    (dict(cache=1), "cache must be true or false"),
    (dict(prompt=[10 ** 6]), "outside the vocabulary"),
    (dict(bogus=1), "unknown generation option"),
])
def test_bad_requests_raise_clear_errors(llada, bad, match):
    kw = dict(prompt=PROMPT, gen_length=16, steps=8, block_length=8)
    kw.update(bad)
    prompt = kw.pop("prompt")
    with pytest.raises(DiffuseError, match=match):
        llada.generate(prompt, **kw)


def test_steps_round_down_to_blocks(llada):
    r = llada.generate(PROMPT, gen_length=32, steps=10, block_length=8)   # 4 blocks
    assert r.steps_allowed == 8 and r.steps == 8


def test_forward_positions_select_rows(llada):
    ids = np.arange(3, 40) % llada.n_vocab
    full = llada.forward(ids)
    some = llada.forward(ids, positions=[30, 2, 7])
    np.testing.assert_allclose(some, full[[30, 2, 7]], rtol=0, atol=1e-5 * np.abs(full).max())
    with pytest.raises(DiffuseError, match="out of range"):
        llada.forward(ids, positions=[len(ids)])


@pytest.mark.parametrize("scheduler", ["entropy", "low_confidence"])
def test_a_block_gets_at_most_one_step_per_position(dream, scheduler):
    """steps > gen_length only added steps that commit nothing (Dream's eps schedule spent half
    of them so): the budget per block is capped at the block's length."""
    events = []
    r = dream.generate(PROMPT, gen_length=16, steps=64, block_length=0, scheduler=scheduler, on_step=events.append)
    assert r.steps_allowed == 16 and r.steps <= 16
    assert not (r.tokens == dream.mask_token_id).any()
    idle = sum(len(e.unmasked) == 0 for e in events)
    assert idle <= len(events) // 2
