"""`diffuse bench batch`: batched diffusion (Model.generate_batch) against AR batched decoding.

For each batch size B, the first B of a fixed prompt list run once as a batch (one forward pass per
step over every sequence) and once one by one, greedy: generated positions per second both ways,
the speed-up, and the fraction of tokens the batch shares with the one-by-one runs (rows of a batch
go through the same kernels, so only float ties may differ). Right after, at the same B and thread
count, llama.cpp decodes B sequences of an AR model at once (llama-batched-bench): the study's
claim is that AR decoding gains more from batching, as one token per sequence is too little work
to fill a pass while a diffusion step already computes dozens of rows.
"""
from __future__ import annotations

import time

import numpy as np

from diffuse.bench.llama_ref import batched_decode

PROMPTS = ["What is the capital of France?", "Write a short poem about the sea.", "Is 97 a prime number?",
           "Name three planets.", "Why is the sky blue?", "Translate 'good morning' into Spanish.",
           "What is 12 times 12?", "Tell me a fact about cats."]

# Greedy low_confidence with the cache: the same tokens batched or not, so agreement is checkable.
DEFAULTS = {"gen_length": 64, "steps": 16, "block_length": 32, "cache": True, "temperature": 0.0,
            "scheduler": "low_confidence"}


def diffusion_at(model, prompts: list[str], reps: int, options: dict) -> dict:
    """One batch size: batched and one-by-one tok/s (medians over reps, alternating), agreement."""
    t_batch, t_single, agree = [], [], []
    for _ in range(reps):
        t0 = time.perf_counter()
        batch = model.generate_batch(prompts, **options)
        t_batch.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        single = [model.generate(p, **options) for p in prompts]
        t_single.append(time.perf_counter() - t0)
        agree.append(np.mean([np.mean(x.tokens == y.tokens) for x, y in zip(batch, single)]))
    n = len(prompts) * options["gen_length"]
    return {"engine": "diffusion", "batch": len(prompts), "threads": model.threads,
            "tokens_per_s": n / float(np.median(t_batch)), "sequential_tok_s": n / float(np.median(t_single)),
            "speedup": float(np.median(t_single) / np.median(t_batch)), "agreement": float(np.min(agree)),
            "gen_length": options["gen_length"], "steps": options["steps"]}


def run(path: str, batches: list[int], threads: int, reps: int, options: dict | None = None,
        ar_model: str | None = None, batched_bin=None, log=print) -> list[dict]:
    """Records per batch size: engine "diffusion" and, given ar_model and llama-batched-bench,
    engine "ar" (decode tok/s over all sequences; n_gen = the diffusion's gen_length)."""
    import diffuse

    opts = {**DEFAULTS, **{k: v for k, v in (options or {}).items() if v is not None}}
    model = diffuse.load(path, threads=threads)
    prompts = [PROMPTS[i % len(PROMPTS)] for i in range(max(batches))]
    n_prompt = len(model.encode_prompt(prompts[0]))
    model.generate(prompts[0], **opts)   # warm-up
    rows = []
    for b in batches:
        rows.append(diffusion_at(model, prompts[:b], reps, opts))
        r = rows[-1]
        log(f"B={b:3d} diffusion: batched {r['tokens_per_s']:8.1f} tok/s, one by one {r['sequential_tok_s']:8.1f} "
            f"tok/s, x{r['speedup']:.2f}, token agreement {r['agreement']:.3f}")
        if ar_model:
            (a,) = batched_decode(batched_bin, ar_model, batches=[b], threads=threads, n_prompt=n_prompt,
                                  n_gen=opts["gen_length"])
            rows.append({"engine": "ar", "threads": threads, "n_prompt": n_prompt, "n_gen": opts["gen_length"], **a})
            log(f"B={b:3d} AR decode: {a['tokens_per_s']:8.1f} tok/s")
    return rows


COLUMNS = [
    ("engine", "engine", "{}"), ("batch", "B", "{:d}"), ("threads", "threads", "{:d}"),
    ("tokens_per_s", "tok/s", "{:.1f}"), ("gain", "vs B=1", "x{:.2f}"),
    ("sequential_tok_s", "one by one tok/s", "{:.1f}"), ("agreement", "token agreement", "{:.3f}"),
]


def with_gain(rows: list[dict]) -> list[dict]:
    """Each row with its throughput over the same engine's at the smallest batch and same threads."""
    base = {}
    for r in sorted(rows, key=lambda r: r["batch"]):
        base.setdefault((r["engine"], r["threads"]), r["tokens_per_s"])
    return [{**r, "gain": r["tokens_per_s"] / base[r["engine"], r["threads"]]} for r in rows]
