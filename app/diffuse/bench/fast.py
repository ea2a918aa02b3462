"""`diffuse bench fast`: the fast-decoding methods of the full-attention models against the
model's own decoding, side by side in one run (issue 21; see docs/benchmarks.md section 11).

Methods, each the model's defaults (its recipe over its family's) with one change:
threshold (Fast-dLLM's confidence_threshold rule), factor (its factor rule), DualCache,
PrefixCache, both threshold and DualCache, a suffix window (DPad) and dInfer's end-of-text stop.

Quality, on the model's defaults: per method over a few prompts the forward passes (NFE), ms per
step, useful tok/s, and the share of the baseline's answer (up to its first end-of-text) the
method's answer matches position for position; with held-out text (`--data`, the demo model's
training text), the model's own held-out masked-token accuracy for scale.

Speed: ms per step at each answer length (blocks of 32), over a run's first SPEED_STEPS steps.
"""
from __future__ import annotations

import time
from pathlib import Path

import numpy as np

import diffuse
from diffuse.bench.tables import md_table
from diffuse.generation import FAST_METHODS, PRESETS

# The methods, by their preset names (diffuse.generation.PRESETS), after the baseline.
METHODS: dict[str, dict] = {"baseline": {}, **{name: PRESETS[name] for name in FAST_METHODS}}
# The baseline's own early stop is the paper's (a block all end-of-text); early EOS is compared to it.
BASELINE = {"eos_stop": "all_eos"}

PROMPTS = [
    "Tell me about Mr. Darcy.",
    "Continue: It is a truth universally acknowledged,",
    "Continue: Emma Woodhouse, handsome, clever, and rich,",
    "Repeat after me: The early bird gets the worm.",
    "What is a fool and his money?",
    "Tell me something.",
]

QUALITY_COLUMNS = [("method", "method", "{}"), ("nfe", "NFE", "{:.1f}"), ("ms_per_step", "ms/step", "{:.1f}"),
                   ("useful_tok_s", "useful tok/s", "{:.1f}"), ("agreement", "agrees with baseline", "{:.2f}")]
SPEED_STEPS = 12
SPEED_COLUMNS = [("method", "method", "{}"), ("gen_length", "gen_length", "{}"),
                 ("ms_per_step", "ms/step (wall)", "{:.1f}"), ("cpu_ms_per_step", "CPU ms/step", "{:.1f}"),
                 ("cpu_ms_median", "median CPU ms/step", "{:.1f}"),
                 ("rows_per_step", "rows/step", "{:.0f}")]


def agreement(answer: np.ndarray, baseline: np.ndarray, eos_ids) -> float:
    """Share of the baseline's answer, up to and with its first end-of-text, matched position for position."""
    ends = [i for i, t in enumerate(baseline.tolist()) if t in eos_ids]
    n = ends[0] + 1 if ends else len(baseline)
    return float((answer[:n] == baseline[:n]).mean()) if n else 1.0


def quality(model, prompts: list[str], temperature: float | None = None, log=print) -> list[dict]:
    eos = set(model.tokenizer.eos_token_ids)
    base_opts = {**BASELINE, "seed": 0, "temperature": temperature}
    baseline = [model.generate(p, **base_opts) for p in prompts]
    rows = []
    for name, change in METHODS.items():
        opts = {**base_opts, **change}
        results = baseline if not change else [model.generate(p, **opts) for p in prompts]
        ms = sum(r.total_ms for r in results)
        row = {"method": name, "options": change,
               "nfe": float(np.mean([r.steps for r in results])),
               "ms_per_step": ms / sum(r.steps for r in results),
               "useful_tok_s": sum(r.useful_length for r in results) / (ms / 1000.0),
               "agreement": float(np.mean([agreement(r.tokens, b.tokens, eos) for r, b in zip(results, baseline)]))}
        log(f"{name}: {row['nfe']:.1f} passes, {row['ms_per_step']:.1f} ms/step, agreement {row['agreement']:.2f}")
        rows.append(row)
    return rows


def speed(model, lengths: list[int], prompt: str, log=print) -> list[dict]:
    """ms per step over a run's first SPEED_STEPS steps (step 0 and, for the block caches, each
    block's first step are full passes; the others recompute what the method keeps). Besides the
    wall time, the process's CPU time per step: with one thread it is the step's own work, which a
    shared machine's other processes do not inflate; its median is a step that is no full pass."""
    rows = []
    for gen in lengths:
        for name, change in METHODS.items():
            if "eos_stop" in change:
                continue                      # the same steps as the baseline, fewer of them
            events, cpu = [], [time.process_time()]

            def first_steps(ev, events=events, cpu=cpu):
                cpu.append(time.process_time())
                events.append(ev)
                return len(events) < SPEED_STEPS

            opts = {**BASELINE, "seed": 0, "gen_length": gen, "block_length": 32, "steps": gen, **change}
            model.generate(prompt, on_step=first_steps, **opts)
            rows.append({"method": name, "gen_length": gen, "options": change,
                         "ms_per_step": float(np.mean([e.total_ms for e in events])),
                         "cpu_ms_per_step": 1000.0 * float(np.mean(np.diff(cpu))),
                         "cpu_ms_median": 1000.0 * float(np.median(np.diff(cpu))),
                         "rows_per_step": float(np.mean([len(e.active) for e in events]))})
            log(f"{gen} {name}: {rows[-1]['ms_per_step']:.1f} ms/step wall, "
                f"{rows[-1]['cpu_ms_per_step']:.1f} CPU, {rows[-1]['rows_per_step']:.0f} rows")
    return rows


def run(path: str, threads: int | None, lengths: list[int], data: str | None = None, n_windows: int = 64,
        quality_run: bool = True, temperature: float | None = None, log=print) -> dict:
    model = diffuse.load(path, threads=threads)
    heldout = None
    if data is not None and quality_run:
        # The model's own quality, for scale: held-out masked-token accuracy in one pass (the model card's figure).
        from diffuse.train.bpe import EOS
        from diffuse.train.data import heldout_windows, read_documents, split_heldout
        from diffuse.train.evaluate import engine_logits_fn, masked_accuracy
        _, held = split_heldout(read_documents(Path(data)))
        tok = model.tokenizer
        windows = heldout_windows(tok.encode, tok.token_to_id(EOS), held, 128, n_windows)
        heldout = {str(r): v["acc"] for r, v in masked_accuracy(engine_logits_fn(model), windows,
                                                                  model.mask_token_id).items()}
        log("held-out masked-token accuracy: " + ", ".join(f"{r}: {a:.3f}" for r, a in heldout.items()))
    return {"model": path, "threads": model.threads,
            "temperature": diffuse.generation.resolve_options(model.arch, model.recipe,
                                                              temperature=temperature)["temperature"],
            "heldout_masked_accuracy": heldout,
            "quality": quality(model, PROMPTS, temperature, log) if quality_run else [],
            "speed": speed(model, lengths, PROMPTS[0], log) if lengths else []}


def markdown(result: dict) -> str:
    out = f"`{result['model']}`, {result['threads']} threads, temperature {result['temperature']:g}.\n\n"
    if result["heldout_masked_accuracy"]:
        out += ("The model's held-out masked-token accuracy (one pass, masks at ratio r): " +
                ", ".join(f"r = {r}: {a:.3f}" for r, a in result["heldout_masked_accuracy"].items()) + ".\n\n")
    if result["quality"]:
        out += md_table(result["quality"], QUALITY_COLUMNS) + "\n"
    if result["speed"]:
        out += md_table(result["speed"], SPEED_COLUMNS)
    return out
