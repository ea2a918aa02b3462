"""generate_batch against one prompt at a time: throughput and token agreement.

For each batch size B, the first B of a fixed prompt list run once as a batch (one forward pass per
step over every sequence) and once one by one, alternating, greedy. Reported: generated positions
per second both ways, the speed-up, and the fraction of tokens the batch shares with the one-by-one
runs (rows of a batch go through the same kernels, so only float ties may differ).

    python -m diffuse.bench.batch MODEL.gguf [--batch 1,2,4,8] [--threads 2] [--reps 3]
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

PROMPTS = ["What is the capital of France?", "Write a short poem about the sea.", "Is 97 a prime number?",
           "Name three planets.", "Why is the sky blue?", "Translate 'good morning' into Spanish.",
           "What is 12 times 12?", "Tell me a fact about cats."]


def run(path: str, batches: list[int], threads: int, reps: int, options: dict) -> list[dict]:
    import diffuse

    model = diffuse.load(path, threads=threads)
    prompts = [PROMPTS[i % len(PROMPTS)] for i in range(max(batches))]
    model.generate(prompts[0], **options)   # warm-up
    rows = []
    for b in batches:
        t_batch, t_single, agree = [], [], []
        for _ in range(reps):
            t0 = time.perf_counter()
            batch = model.generate_batch(prompts[:b], **options)
            t_batch.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            single = [model.generate(p, **options) for p in prompts[:b]]
            t_single.append(time.perf_counter() - t0)
            agree.append(np.mean([np.mean(x.tokens == y.tokens) for x, y in zip(batch, single)]))
        n = b * options["gen_length"]
        rows.append({"batch": b, "threads": threads, "batched_tok_s": n / np.median(t_batch),
                     "sequential_tok_s": n / np.median(t_single),
                     "speedup": float(np.median(t_single) / np.median(t_batch)), "agreement": float(np.min(agree))})
        r = rows[-1]
        print(f"B={b:3d}: batched {r['batched_tok_s']:8.1f} tok/s, one by one {r['sequential_tok_s']:8.1f} tok/s, "
              f"x{r['speedup']:.2f}, token agreement {r['agreement']:.3f}", flush=True)
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model")
    ap.add_argument("--batch", default="1,2,4,8")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--gen-length", type=int, default=64)
    ap.add_argument("--steps", type=int, default=16)
    ap.add_argument("--block-length", type=int, default=32)
    ap.add_argument("--cache", action=argparse.BooleanOptionalAction, default=True)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)
    options = dict(gen_length=args.gen_length, steps=args.steps, block_length=args.block_length, cache=args.cache,
                   temperature=0.0, scheduler="low_confidence")
    rows = run(args.model, [int(x) for x in args.batch.split(",")], args.threads, args.reps, options)
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
