"""One denoising step, ours against llama.cpp's `llama-diffusion-cli`, measured side by side.

Both run the same file over the same buffer (a 32-token prompt + 96 masks by default), 8 steps,
the same thread count, alternating run by run so that both see the same machine load. Ours runs
Dream's defaults (whole-buffer denoising, its entropy rule) without and with the inter-step cache,
and with the cache in semi-autoregressive blocks of 32; llama.cpp re-decodes the whole buffer every
step. Reported: median ms per step and the ratio
ours / llama.cpp (below 1: ours is faster).

    python -m diffuse.bench.peer MODEL.gguf --llama-bin DIR [--threads 2] [--reps 5]
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

from diffuse.bench.llama_ref import diffusion_step_ms, find_bins


def our_step_ms(model, n_prompt: int, n_gen: int, steps: int, cache: bool, block_length: int = 0) -> float:
    """Mean ms per step of one run (every step counted, step 0's full pass included)."""
    prompt = list(np.random.default_rng(0).integers(100, 1000, n_prompt))
    r = model.generate(prompt, gen_length=n_gen, steps=steps, block_length=block_length, cache=cache, seed=0)
    return float(np.mean(r.step_ms))


def run(path: str, llama_bin: str | None, threads: int, reps: int, n_prompt: int = 32, n_gen: int = 96,
        steps: int = 8) -> dict:
    import diffuse

    bins = find_bins(llama_bin)
    model = diffuse.load(path, threads=threads)
    our_step_ms(model, n_prompt, n_gen, steps, True)   # warm-up: page the weights in
    samples = {"llama.cpp": [], "ours, no cache": [], "ours, cache": [], "ours, cache, blocks of 32": []}
    for _ in range(reps):
        if bins.diffusion is not None:
            samples["llama.cpp"].append(diffusion_step_ms(bins.diffusion, path, n_positions=n_prompt + n_gen,
                                                          threads=threads, steps=steps)["ms_per_step"])
        samples["ours, no cache"].append(our_step_ms(model, n_prompt, n_gen, steps, False))
        samples["ours, cache"].append(our_step_ms(model, n_prompt, n_gen, steps, True))
        samples["ours, cache, blocks of 32"].append(our_step_ms(model, n_prompt, n_gen, steps, True, 32))
    med = {k: float(np.median(v)) for k, v in samples.items() if v}
    peer = med.get("llama.cpp")
    return {"model": path, "threads": threads, "positions": n_prompt + n_gen, "steps": steps, "reps": reps,
            "samples_ms": samples, "median_ms": med,
            "ratio": {k: v / peer for k, v in med.items() if peer and k != "llama.cpp"}}


def table(result: dict) -> str:
    lines = ["| engine | ms per step (median) | min | ours / llama.cpp |", "|---|---|---|---|"]
    for k, v in result["median_ms"].items():
        ratio = result["ratio"].get(k)
        lines.append(f"| {k} | {v:.0f} | {min(result['samples_ms'][k]):.0f} | "
                     f"{f'{ratio:.2f}' if ratio is not None else '-'} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model")
    ap.add_argument("--llama-bin", help="folder with llama-diffusion-cli (default $DIFFUSE_LLAMA_BIN or PATH)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)
    result = run(args.model, args.llama_bin, args.threads, args.reps)
    print(table(result))
    if args.json:
        args.json.write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
