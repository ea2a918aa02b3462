"""Runs decoded over a causal K/V cache, for the Studio's tests: a real self-speculation run of a tiny
Nemotron-Labs-Diffusion look-alike whose drafts are kept sometimes (fixtures' agreeable_head, as
tests/test_causal_modes.py's `agreeable`), and a made-up WeDLM run (its engine loop is written elsewhere against StepEvent's
window_order / committed contract)."""
from __future__ import annotations

from pathlib import Path

import numpy as np

import diffuse
from diffuse.convert import convert_hf
from diffuse.events import GenerateResult, StepEvent
from diffuse.generation import resolve_options
from diffuse.recording import Recording
from diffuse.studio.run_state import RunState
from fixtures.tiny_models import agreeable_head, write_nemotron_diffusion

PROMPT = [300, 12, 12, 8, 77, 140, 2, 64, 33, 9, 210]


def agreeable_nemotron(folder: Path) -> Path:
    """A GGUF of the tiny look-alike whose drafts are kept sometimes (fixtures' agreeable_head)."""
    hf = write_nemotron_diffusion(folder / "hf", dtype="f32", edit=agreeable_head)
    return convert_hf(hf, folder / "agreeable.gguf", "f32")


def model_info(model) -> dict:
    tok = model.tokenizer
    return {"name": Path(model.path).name, "arch": model.arch, "path": str(model.path),
            "n_vocab": int(model.n_vocab), "eos_ids": [int(i) for i in tok.eos_token_ids],
            "special_ids": sorted(int(i) for i in tok.special_tokens)}


def causal_run(model, mode: str, **options) -> RunState:
    """A finished run of `model` on PROMPT in `mode`, as the Studio keeps it."""
    options = resolve_options(model.arch, model.recipe, mode=mode, **{"gen_length": 40, **options})
    run = RunState("ids", options, model_info(model), decode=model.tokenizer.decode)
    run.finish(model.generate(PROMPT, chat=False, on_step=run.add, **options))
    return run


def wedlm_recording(prompt_length=4, gen_length=24, window=8, seed=0) -> Recording:
    """A made-up WeDLM run: each step fills some of the window's masks, runs the window with the
    filled tokens first (pass order), commits the filled ones that lead it in text order (their
    K/V exact) and slides past them."""
    rng = np.random.default_rng(seed)
    p, n = prompt_length, prompt_length + gen_length
    target = rng.integers(2, 40, n).astype(np.int32)
    tokens = np.zeros(n, np.int32)            # 0: the mask id
    tokens[:p] = target[:p]
    start, events, step = p, [], 0
    budget = gen_length + window - 1       # the engine's: each pass fills one of the window's reach
    while start < n:
        end = min(start + window, n)
        win = np.arange(start, end)
        masked = win[tokens[win] == 0]
        filled_before = win[tokens[win] != 0]
        # commit the leading run of positions filled before this step (their K/V exact this pass)
        lead = 0
        while lead < len(win) and tokens[win[lead]] != 0:
            lead += 1
        committed = win[:lead]
        order = np.concatenate([filled_before, masked]).astype(np.int32)
        pick = masked[:max(1, int(rng.integers(1, 4)))] if masked.size else masked
        pick = np.sort(rng.permutation(masked)[:len(pick)]) if masked.size else pick
        tokens[pick] = target[pick]
        entropy = np.full(n, np.nan, np.float32)
        entropy[masked] = rng.uniform(0.1, 3, masked.size)
        events.append(StepEvent(
            step=step, block=0, n_blocks=1, steps_allowed=budget, prompt_length=p,
            block_start=start, block_end=end, tokens=tokens.copy(), mask=tokens == 0,
            unmasked=pick.astype(np.int32), entropy=entropy, confidence=np.exp(-entropy),
            active=win.astype(np.int32), cached=np.arange(start, dtype=np.int32), forward_ms=3.0,
            sample_ms=0.5, total_ms=3.5, window_order=order, committed=committed.astype(np.int32)))
        step += 1
        start += lead
        if lead == 0 and not masked.size:
            break
    ms = np.array([e.total_ms for e in events])
    result = GenerateResult(
        text="", tokens=tokens[p:].copy(), prompt_tokens=tokens[:p].copy(), steps=len(events),
        steps_allowed=budget, stop_reason="done", step_ms=ms, forward_ms=ms - 0.5,
        sample_ms=np.full(len(events), 0.5), total_ms=float(ms.sum()), gen_length=gen_length,
        useful_length=gen_length)
    pieces = {i: f"w{i}" for i in range(40)} | {0: "<mask>"}
    return Recording(prompt="wedlm", options={"gen_length": gen_length, "window_size": window}, events=events, result=result,
                     model={"name": "wedlm-synthetic", "arch": "wedlm", "eos_ids": [1], "special_ids": [0, 1]},
                     pieces=pieces)
