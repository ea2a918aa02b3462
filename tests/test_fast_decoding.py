"""Fast decoding for the full-attention models (issue 21): Fast-dLLM's threshold and factor rules,
its PrefixCache and DualCache, the suffix window (DPad), the end-of-text stops. Parity with the
ports of Fast-dLLM's loops (tests/reference/fast_generate.py), driven by the float64 reference
forward (with a K/V cache of its own for the cached loops) and by the engine's forward."""
from __future__ import annotations

import numpy as np
import pytest

import diffuse
from diffuse import DiffuseError, _core
from reference import fast_generate as ref

PROMPT = [5, 17, 42, 8, 99, 3, 61, 12, 140]
RULES = {"threshold": dict(scheduler="confidence_threshold", confidence_threshold=0.3),
         "factor": dict(scheduler="confidence_factor", factor=1.0),
         "count": dict(scheduler="low_confidence")}


def port_rule(rule: str) -> dict:
    return {"threshold": dict(threshold=0.3), "factor": dict(factor=1.0), "count": {}}[rule]


@pytest.fixture(scope="module")
def llada(tiny_gguf, tiny_hf_llada):
    return diffuse.load(tiny_gguf("llada", "f32"), threads=2, flash_attn=False, kv_f16=False), tiny_hf_llada


@pytest.fixture(scope="module")
def dream(tiny_gguf, tiny_hf_dream):
    return diffuse.load(tiny_gguf("dream", "f32"), threads=2, flash_attn=False, kv_f16=False), tiny_hf_dream


class EngineLogits:
    """The ports' model interface over the engine's forward (every row, every pass)."""

    def __init__(self, model):
        self.model = model

    def logits(self, x, rows=None):
        out = self.model.forward(np.asarray(x, np.int32)).astype(np.float64)
        return out if rows is None else out[np.asarray(rows)]


def run(model, **options):
    events = []
    r = model.generate(PROMPT, temperature=0, chat=False, eos_stop="none", on_step=events.append, **options)
    return r, events


@pytest.mark.parametrize("rule", RULES)
@pytest.mark.parametrize("block_length", [8, 16])
@pytest.mark.parametrize("driver", ["float64", "engine forward"])
def test_llada_threshold_and_factor_match_fast_dllm_without_cache(llada, rule, block_length, driver):
    """Cache off: the tokens and the number of forward passes of Fast-dLLM's generate()."""
    model, hf = llada
    logits = ref.Recompute(hf) if driver == "float64" else EngineLogits(model)
    want, nfe = ref.llada_generate(logits, PROMPT, model.mask_token_id, 32, block_length, 16, **port_rule(rule))
    got, _ = run(model, gen_length=32, block_length=block_length, steps=16, cache=False, **RULES[rule])
    assert got.tokens.tolist() == want
    assert got.steps == nfe


@pytest.mark.parametrize("block_length", [8, 16])
@pytest.mark.parametrize("driver", ["float64", "engine forward"])
def test_dream_threshold_matches_fast_dllm_block_loop_without_cache(dream, block_length, driver):
    """Dream's block variant: each block's first position committed alone from the row before it
    (carry_first), then the threshold rule; cache off."""
    model, hf = dream
    logits = ref.Recompute(hf) if driver == "float64" else EngineLogits(model)
    want, nfe = ref.dream_generate(logits, PROMPT, model.mask_token_id, 32, block_length, threshold=0.3)
    got, events = run(model, gen_length=32, block_length=block_length, steps=32, cache=False, carry_first=True,
                      scheduler="confidence_threshold", confidence_threshold=0.3)
    assert got.tokens.tolist() == want
    assert got.steps == nfe
    firsts = [ev for ev in events if ev.unmasked.tolist() == [ev.block_start]]
    assert len(firsts) >= 32 // block_length         # every block's carry step (more if a rule commits one alone)


@pytest.mark.parametrize("policy", ["prefix", "dual"])
@pytest.mark.parametrize("rule", ["threshold", "count"])
def test_llada_prefix_and_dual_cache_match_a_reference_with_its_own_cache(llada, policy, rule):
    """The engine's K/V reuse against a float64 loop that keeps a K/V cache of its own."""
    model, hf = llada
    want, nfe = ref.llada_generate(ref.Cached(hf), PROMPT, model.mask_token_id, 32, 8, 16, cache=policy,
                                   **port_rule(rule))
    got, events = run(model, gen_length=32, block_length=8, steps=16, cache=True, cache_policy=policy, **RULES[rule])
    assert got.tokens.tolist() == want and got.steps == nfe
    n = len(PROMPT) + 32
    for ev in events:               # a full pass at each block's start, then only the block (and, prefix, after it)
        if ev.active.tolist() != list(range(n)):
            end = n if policy == "prefix" else ev.block_end
            assert ev.active.tolist() == list(range(ev.block_start, end))
    # The cache changes the numbers: the answer is not the recomputed one's, but close to it.
    exact, _ = run(model, gen_length=32, block_length=8, steps=16, cache=False, **RULES[rule])
    assert exact.tokens.tolist() == ref.llada_generate(ref.Recompute(hf), PROMPT, model.mask_token_id, 32, 8, 16,
                                                       **port_rule(rule))[0]


@pytest.mark.parametrize("policy", ["prefix", "dual"])
def test_dream_prefix_and_dual_cache_match_a_reference_with_its_own_cache(dream, policy):
    model, hf = dream
    want, nfe = ref.dream_generate(ref.Cached(hf), PROMPT, model.mask_token_id, 32, 8, threshold=0.3, cache=policy)
    got, _ = run(model, gen_length=32, block_length=8, steps=32, cache=True, cache_policy=policy, carry_first=True,
                 scheduler="confidence_threshold", confidence_threshold=0.3)
    assert got.tokens.tolist() == want and got.steps == nfe


@pytest.mark.parametrize("window", [0, 4])
def test_suffix_window_leaves_far_masks_out(llada, window):
    """DPad: a step attends to the block and the next k positions only, at their absolute
    positions: the tokens and passes of the loop that cuts the sequence there; 0 drops the suffix."""
    model, hf = llada
    want, nfe = ref.llada_generate(ref.Recompute(hf), PROMPT, model.mask_token_id, 32, 8, 16, window=window)
    got, events = run(model, gen_length=32, block_length=8, steps=16, cache=False, suffix_window=window)
    assert got.tokens.tolist() == want and got.steps == nfe
    n = len(PROMPT) + 32
    for ev in events:
        assert len(ev.active) + len(ev.cached) == min(n, ev.block_end + window)
    # With the paper's active-set cache, positions entering the window are computed the first time.
    _, events = run(model, gen_length=32, block_length=8, steps=16, cache=True, suffix_window=window)
    seen: set[int] = set()
    for ev in events:
        new = set(range(min(n, ev.block_end + window))) - seen
        assert new <= set(ev.active.tolist()) and ev.active.max() < ev.block_end + window
        seen |= new


def eos_run(model, eos_ids, **options):
    o = diffuse.generation.resolve_options("llada", gen_length=32, block_length=8, steps=32, temperature=0,
                                           **options)
    return _core.generate_batch(model._core, [np.array(PROMPT, np.int32)], options=[o], threads=2,
                                eos_ids=eos_ids, on_step=None, expert_routing=False)[0]


def test_end_of_text_stops(llada):
    """none decodes every block; holds_eos stops after the finished block that holds one (dInfer);
    prefix as soon as everything before it is decided; the text before it is the same in all."""
    model, _ = llada
    plain = eos_run(model, [], eos_stop="none")
    eos = int(plain["tokens"][10])                  # committed in the second block
    first = plain["tokens"].tolist().index(eos)
    runs = {stop: eos_run(model, [eos], eos_stop=stop) for stop in ("none", "holds_eos", "prefix", "all_eos")}
    assert runs["none"]["steps"] == plain["steps"] and runs["none"]["stop_reason"] == "done"
    assert runs["holds_eos"]["stop_reason"] == "eos" and runs["holds_eos"]["steps"] < plain["steps"]
    assert runs["prefix"]["steps"] <= runs["holds_eos"]["steps"]
    for stop, r in runs.items():
        assert r["tokens"][:first + 1].tolist() == plain["tokens"][:first + 1].tolist(), stop
    held = runs["holds_eos"]["tokens"]
    assert (held[(first // 8 + 1) * 8:] == eos).all()          # the blocks after it: end-of-text


@pytest.mark.parametrize("options, message", [
    ({"carry_first": True}, "carry_first applies to models with shifted logits"),
    ({"cache_policy": "triple"}, "unknown cache_policy 'triple' \\(choose one of: active, prefix, dual\\)"),
    ({"eos_stop": "never"}, "unknown eos_stop 'never'"),
    ({"suffix_window": -2}, "suffix_window = -2 is out of range"),
    ({"factor": 0.0}, "factor = 0 is out of range"),
])
def test_bad_options_get_one_clear_error(llada, options, message):
    model, _ = llada
    with pytest.raises(DiffuseError, match=message):
        model.generate(PROMPT, gen_length=8, block_length=8, steps=8, chat=False, **options)


def test_block_models_refuse_what_they_cannot_use(tmp_path):
    from diffuse.bench.random_models import write_random_sdar
    sdar = diffuse.load(write_random_sdar(tmp_path / "s.gguf", n_layer=1, n_embd=32, n_head=2, n_head_kv=1,
                                          head_dim=16, n_ff=32, n_vocab=64, n_ctx=256))
    with pytest.raises(DiffuseError, match="cache_policy applies to full-attention models only"):
        sdar.generate([1, 2, 3], gen_length=8, chat=False, cache_policy="dual")
    with pytest.raises(DiffuseError, match="suffix_window applies to full-attention models only"):
        sdar.generate([1, 2, 3], gen_length=8, chat=False, suffix_window=4)
