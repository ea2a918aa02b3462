"""Block diffusion (SDAR, Fast-dLLM v2): block-causal attention, the exact growing K/V cache, the
commit rules, batches and errors, on a random SDAR-shaped model (Qwen3 blocks, GQA, head_dim
stated, q/k norms)."""
from __future__ import annotations

import numpy as np
import pytest

import diffuse
from diffuse import DiffuseError, _core
from diffuse.bench.random_models import write_random_sdar

BLOCK_RULES = ["low_confidence_dynamic", "low_confidence_static", "confidence_threshold", "entropy_bounded"]
PROMPT_13 = [5, 17, 42, 8, 99, 3, 250, 7, 61, 12, 140, 33, 90]   # ends mid-block (4 and 8)


@pytest.fixture(scope="module")
def sdar(tmp_path_factory):
    path = write_random_sdar(tmp_path_factory.mktemp("sdar") / "sdar.gguf", n_layer=2, n_embd=64, n_head=4,
                             n_head_kv=2, head_dim=24, n_ff=96, n_vocab=300, n_ctx=4608, block_size=4)
    return diffuse.load(path, threads=2)


def test_forward_is_causal_across_blocks(sdar):
    ids = np.array(PROMPT_13, np.int32)
    full = sdar.forward(ids)
    for n in (4, 8, 12):                       # whole blocks see nothing after them
        assert np.abs(sdar.forward(ids[:n]) - full[:n]).max() < 1e-5
    part = sdar.forward(ids[:10])              # inside a block attention is bidirectional
    assert np.abs(part[:8] - full[:8]).max() < 1e-5
    assert np.abs(part[8:10] - full[8:10]).max() > 1e-3
    wide = sdar.forward(ids, block_size=8)     # a run's own block length
    assert np.abs(wide[:8] - sdar.forward(ids[:8], block_size=8)).max() < 1e-5
    assert np.abs(wide[:4] - full[:4]).max() > 1e-3


@pytest.mark.parametrize("scheduler", BLOCK_RULES)
@pytest.mark.parametrize("block_length", [4, 8])
@pytest.mark.parametrize("n_prompt", [8, 13])
def test_cache_is_exact(sdar, scheduler, block_length, n_prompt):
    kw = dict(gen_length=24, steps=block_length, block_length=block_length, scheduler=scheduler,
              confidence_threshold=0.05, entropy_budget=8.0, temperature=0, chat=False)
    cached = sdar.generate(PROMPT_13[:n_prompt], cache=True, **kw)
    full = sdar.generate(PROMPT_13[:n_prompt], cache=False, **kw)
    assert cached.tokens.tolist() == full.tokens.tolist()
    assert cached.steps == full.steps
    assert not (cached.tokens == sdar.mask_token_id).any()


def test_a_step_computes_at_most_two_blocks_and_the_prompt_once(sdar):
    prompt = list(np.random.default_rng(0).integers(0, 299, 1030))    # 257 whole blocks + 2
    events = []
    r = sdar.generate(prompt, gen_length=12, steps=4, block_length=4, scheduler="low_confidence_static",
                      chat=False, on_step=events.append)
    assert r.prefill_ms > 0
    first = events[0]
    assert first.active.tolist() == [1028, 1029, 1030, 1031]          # the prompt's tail and 2 masks
    assert first.cached.tolist() == list(range(1028))                  # prefilled once, served from the cache
    for ev in events:
        assert len(ev.active) <= 8 and ev.active.max() < ev.block_end
        assert ev.block_start % 4 == 0
        if ev.block_start > 1028 and ev.active.min() < ev.block_start:   # the block that just finished
            assert ev.active.min() == ev.block_start - 4
    assert len(r.tokens) == 1032 + 12 - 1030    # whole blocks: the last one ends at 1044


def test_answer_ends_on_a_block_boundary(sdar):
    r = sdar.generate(PROMPT_13, gen_length=10, steps=4, block_length=4, chat=False)
    assert (13 + len(r.tokens)) % 4 == 0 and len(r.tokens) >= 10


@pytest.mark.parametrize("scheduler", BLOCK_RULES)
def test_batches_and_streams_give_the_tokens_of_single_runs(sdar, scheduler):
    prompts = [PROMPT_13, PROMPT_13[:8], PROMPT_13[:5]]
    kw = dict(gen_length=16, steps=4, block_length=4, scheduler=scheduler, confidence_threshold=0.05,
              chat=False)
    batch = sdar.generate_batch(prompts, **kw)
    for p, b in zip(prompts, batch):
        assert sdar.generate(p, **kw).tokens.tolist() == b.tokens.tolist()


def test_static_rule_commits_the_scheduled_count(sdar):
    events = []
    sdar.generate(PROMPT_13[:8], gen_length=16, steps=2, block_length=8, scheduler="low_confidence_static",
                  chat=False, on_step=events.append)
    assert [len(e.unmasked) for e in events] == [4, 4, 4, 4]


def test_threshold_rules_commit_many_when_confident_and_one_at_least(sdar):
    kw = dict(gen_length=16, steps=4, block_length=8, chat=False)
    for rule in ("confidence_threshold", "low_confidence_dynamic"):
        eager = sdar.generate(PROMPT_13[:8], scheduler=rule, confidence_threshold=0.0, **kw)
        assert eager.steps == 2                          # every position of a block at once
    slow = sdar.generate(PROMPT_13[:8], scheduler="confidence_threshold", confidence_threshold=1.0, **kw)
    assert slow.steps == 16                              # one position per step
    bounded = sdar.generate(PROMPT_13[:8], scheduler="entropy_bounded", entropy_budget=0.0, **kw)
    assert bounded.steps == 16


def test_a_block_holding_end_of_text_ends_the_answer(sdar):
    def run(eos_ids):
        options = diffuse.generation.resolve_options("sdar", gen_length=24, steps=4, block_length=4)
        return _core.generate_batch(sdar._core, [np.array(PROMPT_13[:8], np.int32)], options=[options],
                                    threads=2, eos_ids=eos_ids, on_step=None, expert_routing=False)[0]
    plain = run([])
    eos = int(plain["tokens"][5])                         # a token the second block commits
    r = run([eos])
    assert r["stop_reason"] == "eos" and r["steps"] < plain["steps"]
    assert r["tokens"][:8].tolist() == plain["tokens"][:8].tolist()
    assert r["tokens"][8:].tolist() == [eos] * 16         # the blocks after it: end-of-text


def test_cancel_stops_at_the_step(sdar):
    r = sdar.generate(PROMPT_13, gen_length=24, steps=4, block_length=4, chat=False, on_step=lambda ev: ev.step < 2)
    assert r.stop_reason == "cancelled" and r.steps == 3


@pytest.mark.parametrize("options, message", [
    ({"cfg_scale": 1.0}, "cfg_scale is not supported for block-diffusion models"),
    ({"gen_length": 4600}, "exceeds the model's context"),
    ({"block_length": 5000}, "exceeds the model's context"),
])
def test_bad_requests_get_one_clear_error(sdar, options, message):
    with pytest.raises(DiffuseError, match=message):
        sdar.generate(PROMPT_13, **{"gen_length": 8, **options}, chat=False)


def test_forward_block_size_checked(sdar, tiny_gguf):
    with pytest.raises(DiffuseError, match="out of range"):
        sdar.forward(PROMPT_13, block_size=0)
    llada = diffuse.load(tiny_gguf("llada", "f32"))
    with pytest.raises(DiffuseError, match="block-diffusion models only"):
        llada.forward([1, 2, 3], block_size=4)


def test_missing_or_absurd_block_size_is_refused(tmp_path):
    for block in (0, 1 << 20):
        path = write_random_sdar(tmp_path / f"b{block}.gguf", n_layer=1, n_embd=32, n_head=2, n_head_kv=1,
                                 head_dim=16, n_ff=32, n_vocab=64, n_ctx=256, block_size=block)
        with pytest.raises(DiffuseError, match="diffusion.block_size"):
            diffuse.load(path)


# ---- parity with the references (tests/reference/): float64 forward, the official loops ----

@pytest.fixture(scope="module")
def tiny_sdar(tiny_gguf, tiny_hf_sdar):
    return diffuse.load(tiny_gguf("sdar", "f32"), threads=2, flash_attn=False, kv_f16=False), tiny_hf_sdar


@pytest.mark.parametrize("family", ["sdar", "fast-dllm-v2"])
@pytest.mark.parametrize("block_size", [None, 8])
def test_logits_match_the_float64_reference(family, block_size, tiny_gguf, request):
    """F32 weights and K/V, no flash attention: within 1e-4 of float64 (relative to the largest
    logit); the default F16 K/V and flash attention within 5e-3."""
    from reference.forward import forward
    hf = request.getfixturevalue("tiny_hf_sdar" if family == "sdar" else "tiny_hf_fast_dllm_v2")
    ids = np.array(PROMPT_13 + [7, 3, 9], np.int32) % 200
    want = forward(hf, ids.tolist(), block_size=block_size)
    for kw, limit in (({"flash_attn": False, "kv_f16": False}, 1e-4), ({}, 5e-3)):
        model = diffuse.load(tiny_gguf(family, "f32"), threads=2, **kw)
        got = model.forward(ids, block_size=block_size)
        assert np.abs(got - want).max() / np.abs(want).max() < limit


class EngineLogits:
    """The reference loop's model interface (reference.block_generate.Recompute) over the engine's
    forward: every pass recomputes positions 0..b1-1 under the run's block-causal mask."""

    def __init__(self, model, block_size):
        self.model, self.block_size = model, block_size

    def logits(self, x, b0, b1):
        return self.model.forward(np.array(x[:b1], np.int32), block_size=self.block_size)[b0:b1].astype(np.float64)

    store = logits


@pytest.mark.parametrize("rule", BLOCK_RULES)
@pytest.mark.parametrize("block_length", [4, 8])
@pytest.mark.parametrize("n_prompt", [8, 13])
@pytest.mark.parametrize("driver", ["engine forward", "float64"])
def test_generation_matches_the_official_loop(tiny_sdar, rule, block_length, n_prompt, driver):
    """Token for token the port of SDAR's block_diffusion_generate (with our stated differences),
    the engine running with its exact cache on; the port recomputes every pass."""
    from reference.block_generate import Recompute, sdar_generate
    model, hf = tiny_sdar
    prompt = [t % 200 for t in PROMPT_13[:n_prompt]]
    steps = block_length // 2
    logits = EngineLogits(model, block_length) if driver == "engine forward" else Recompute(hf, block_length)
    eos = list(model.tokenizer.eos_token_ids)
    want = sdar_generate(logits, prompt, model.mask_token_id, 24, block_length, steps, rule,
                         confidence_threshold=0.3, eb_threshold=1.0, stop_ids=eos)
    got = model.generate(prompt, gen_length=24, steps=steps, block_length=block_length, scheduler=rule,
                         confidence_threshold=0.3, entropy_budget=1.0, temperature=0, chat=False)
    n = len(want.tokens)
    assert got.tokens[:n].tolist() == want.tokens
    assert all(t in eos for t in got.tokens[n:])          # after a block holding end-of-text
    denoising = sum(kind == "denoise" for kind, _ in want.passes)
    assert got.steps == denoising


def test_the_studio_state_shows_later_blocks_as_not_started(sdar):
    """Diffuse Studio's per-step arrays (RunState): a block run's later blocks are neither computed
    nor cached at a step, so the canvas draws them as outlines, not as masks being denoised."""
    from diffuse.studio.run_state import RunState
    run = RunState()
    r = sdar.generate(PROMPT_13[:8], gen_length=16, steps=4, block_length=4, scheduler="low_confidence_static",
                      chat=False, on_step=run.add)
    run.finish(r)
    for k, ev in enumerate(run.events):
        later = run.not_started(k)
        assert later.tolist() == [pos >= ev.block_end for pos in range(8, 24)]
        first = int(ev.active.min())    # the block that just finished is recomputed once, from its final tokens
        assert (run.cache[k, :first] == 1).all() and (run.cache[k, first:ev.block_end] == 2).all()


# ---- Fast-dLLM v2's own decoding: sub-blocks, the token shift, the first token of a block carried ----

@pytest.fixture(scope="module")
def tiny_fast(tiny_gguf, tiny_hf_fast_dllm_v2):
    return (diffuse.load(tiny_gguf("fast-dllm-v2", "f32"), threads=2, flash_attn=False, kv_f16=False),
            tiny_hf_fast_dllm_v2)


def test_fast_dllm_v2_reads_its_sub_block_size(tiny_fast, tiny_gguf):
    model, _ = tiny_fast
    assert model.hparams["block_size"] == 32 and model.hparams["sub_block_size"] == 8
    with pytest.raises(DiffuseError, match="block-diffusion models only"):
        diffuse.load(tiny_gguf("llada", "f32")).generate([1, 2], sub_block_length=4, chat=False)


def test_the_schedule_note_is_the_engines_plan_sub_blocks_included(tiny_fast):
    """schedule_check asks the engine's plan (_core.plan): 6 steps for a block of 4 sub-blocks of 8 run
    as one per sub-block, 4, which the run's own budget shows (plus the block's carry step)."""
    from diffuse.generation import schedule_check
    model, _ = tiny_fast
    opts = {"steps": 6, "gen_length": 32, "scheduler": "low_confidence_static"}
    note, refused = schedule_check(opts, model.arch, model.n_ctx_train, model.recipe, model.hparams)
    assert (note, refused) == ("steps 6 -> 4: 4 sub-blocks of 8 get 1 step each", None)
    r = model.generate(list(range(1, 33)), chat=False, **opts)
    assert r.steps_allowed == 4 + 1
    plan = _core.plan(model.arch, opts, n_prompt=13, block_size=32, sub_block_size=8)
    assert (plan["loop"], plan["gen_length"], plan["n_blocks"], plan["steps_per_sub_block"]) == ("masked", 51, 2, 1)
    with pytest.raises(DiffuseError, match="exceeds the model's context of 40 positions"):
        _core.plan(model.arch, opts, n_prompt=13, n_ctx=40, block_size=32)


@pytest.mark.parametrize("block_length, sub_block_length", [(32, 8), (16, 4)])
@pytest.mark.parametrize("n_prompt", [32, 13, 40])
@pytest.mark.parametrize("driver", ["engine forward", "float64"])
def test_fast_dllm_v2_matches_its_official_loop(tiny_fast, block_length, sub_block_length, n_prompt, driver):
    """Token for token the port of Fast-dLLM v2's generate (tests/reference/block_generate.py),
    prompts on and off a block boundary, the engine with its exact cache: each block's first token
    from the previous block's last row (a carry step), its other masks sub-block by sub-block by
    the threshold rule, every pass over the whole block. The port's denoising passes commit what
    the engine's steps that are not carry steps commit."""
    from reference.block_generate import Recompute, fast_dllm_v2_generate
    model, hf = tiny_fast
    prompt = [(7 * t + 3) % 200 for t in range(n_prompt)]
    logits = EngineLogits(model, block_length) if driver == "engine forward" else Recompute(hf, block_length)
    stop = model.tokenizer.eos_token_ids[0]
    want = fast_dllm_v2_generate(logits, prompt, model.mask_token_id, 64, block_length, sub_block_length,
                                 threshold=0.2, stop_id=stop)
    events = []
    got = model.generate(prompt, gen_length=64, block_length=block_length, sub_block_length=sub_block_length,
                         scheduler="confidence_threshold", confidence_threshold=0.2, temperature=0, chat=False,
                         on_step=events.append)
    n = min(len(want.tokens), len(got.tokens))
    assert n >= len(want.tokens) - 1       # all but the token the port carries past its last block
    assert got.tokens[:n].tolist() == want.tokens[:n]
    # The port decodes gen_length // block blocks from the prompt's; the engine covers gen_length.
    denoise = [commits for kind, commits in want.passes if kind == "denoise"]
    end = (denoise[-1][0][0] // block_length + 1) * block_length
    steps = [ev for ev in events if ev.block_end <= end
             and not (ev.unmasked.tolist() == [ev.block_start] and ev.active.max() < ev.block_start)]
    assert [ev.unmasked.tolist() for ev in steps] == [[pos for pos, _ in commits] for commits in denoise]
    for ev in steps:            # the whole block each pass, the commits inside one sub-block
        assert ev.active.tolist()[-block_length:] == list(range(ev.block_start, ev.block_end))
        assert len({(p - ev.block_start) // sub_block_length for p in ev.unmasked}) == 1


def test_fast_dllm_v2_cache_is_exact_and_the_answer_stops_at_end_of_text(tiny_fast):
    model, _ = tiny_fast
    prompt = [(7 * t + 3) % 200 for t in range(13)]
    kw = dict(gen_length=64, scheduler="confidence_threshold", confidence_threshold=0.2, temperature=0, chat=False)
    cached, full = model.generate(prompt, cache=True, **kw), model.generate(prompt, cache=False, **kw)
    assert cached.tokens.tolist() == full.tokens.tolist() and cached.steps == full.steps
    options = diffuse.generation.resolve_options("fast-dllm-v2", model.recipe, gen_length=64, temperature=0,
                                                 scheduler="confidence_threshold", confidence_threshold=0.2)

    def run(eos_ids):
        return _core.generate_batch(model._core, [np.array(prompt, np.int32)], options=[options], threads=2,
                                    eos_ids=eos_ids, on_step=None, expert_routing=False)[0]
    plain = run([])
    eos = int(plain["tokens"][10])     # committed in the first block: the run stops once all before it are decided
    first = plain["tokens"].tolist().index(eos)
    r = run([eos])
    assert r["stop_reason"] == "eos" and r["steps"] < plain["steps"]
    assert r["tokens"][:first + 1].tolist() == plain["tokens"][:first + 1].tolist()
    undecided = r["decided_step"][first:] < 0
    assert undecided.any() and (r["tokens"][first:][undecided] == eos).all()
