"""`diffuse bench context`: long contexts, full-sequence denoising against block-wise decoding.

For each length L (generated positions after a short prompt), two ways to denoise:

- full: one block of L positions, no cache: every step recomputes the whole sequence and samples
  every masked position (the study's "full-sequence diffusion");
- blockwise: blocks of `block_length` with the inter-step cache: a step recomputes the current
  block (and the rows that changed lately), attending over the cached K/V of all L positions.

Each (mode, L) runs in its own process (peak RSS is its own), for 1 + `steps` steps, then stops:
step 0 is a full pass in both modes; the later steps give ms/step. Per generated token: a whole
run of L steps (one token per step, LLaDA's default budget), i.e. (step 0 + (L - 1) x ms/step) / L.
Arithmetic intensity counts the attention FLOPs and the K/V bytes of the measured steps, beside
the weights (diffuse.bench.cost.step_cost).
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from diffuse import DiffuseError
from diffuse.bench import cost, machine

PROMPT = "Write a long story about a lighthouse keeper."
MODES = ("full", "blockwise")


def options(mode: str, length: int, block_length: int) -> dict:
    """One token per step, greedy; the mode decides blocks and cache."""
    blocks = {"full": (length, False), "blockwise": (block_length, True)}[mode]
    return {"gen_length": length, "steps": length, "block_length": blocks[0], "cache": blocks[1],
            "scheduler": "low_confidence", "temperature": 0.0}


def measure(path: str, mode: str, length: int, block_length: int, threads: int, steps: int) -> dict:
    """One (mode, length) in this process."""
    import diffuse

    model = diffuse.load(path, threads=threads)
    seen = []        # per step: rows recomputed, positions attended, rows through the head

    def on_step(ev) -> bool:
        seen.append((len(ev.active), len(ev.tokens), int(np.count_nonzero(~np.isnan(ev.entropy)))))
        return len(seen) <= steps
    r = model.generate(PROMPT, on_step=on_step, **options(mode, length, block_length))
    mms = cost.matmuls(path)
    later = seen[1:] or seen
    costs = [cost.step_cost(mms, model.hparams, rows, kv, logits) for rows, kv, logits in later]
    ms = float(np.median(r.step_ms[1:])) if r.steps > 1 else float(r.step_ms[0])
    first = float(r.step_ms[0])
    flops = float(np.median([c["flops"] for c in costs]))
    nbytes = float(np.median([c["bytes"] for c in costs]))
    return {"mode": mode, "length": length, "block_length": length if mode == "full" else block_length,
            "threads": model.threads, "prompt_tokens": len(r.prompt_tokens), "steps_measured": len(later),
            "first_step_ms": first, "ms_per_step": ms, "ms_per_token": (first + (length - 1) * ms) / length,
            "active_rows": int(np.median([s[0] for s in later])), "kv_positions": later[0][1],
            "flops_per_step": flops, "bytes_per_step": nbytes, "arithmetic_intensity": flops / nbytes,
            "gflops": flops / ms / 1e6, "peak_rss_bytes": machine.peak_rss_bytes(),
            "file_bytes": Path(path).stat().st_size}


def check(path: str, lengths: list[int], block_length: int) -> None:
    """Refuse lengths the model cannot hold or blocks cannot tile, before any child starts."""
    import diffuse

    bad = [n for n in lengths if n % block_length]
    if bad:
        raise DiffuseError(f"--lengths {bad} are not multiples of --block-length {block_length}")
    model = diffuse.load(path, threads=1)
    total = max(lengths) + len(model.encode_prompt(PROMPT))
    if total > model.n_ctx_train:
        raise DiffuseError(f"--lengths: {max(lengths)} plus the {total - max(lengths)}-token prompt exceeds "
                           f"the model's context of {model.n_ctx_train}")


def run(path: str, lengths: list[int], block_length: int, threads: int, steps: int = 2, log=print) -> list[dict]:
    check(path, lengths, block_length)
    rows = []
    for n in lengths:
        for mode in MODES:     # side by side per length, so a busy spell hits both
            rows.append(machine.run_in_child("diffuse.bench.context", "measure", path=path, mode=mode, length=n,
                                             block_length=block_length, threads=threads, steps=steps))
            r = rows[-1]
            log(f"L={n:5d} {mode:9s}: {r['ms_per_step']:9.1f} ms/step, {r['ms_per_token']:8.1f} ms/token, "
                f"peak RSS {r['peak_rss_bytes'] / 2**20:7.0f} MiB, AI {r['arithmetic_intensity']:6.1f} FLOP/B")
    return rows


COLUMNS = [
    ("mode", "mode", "{}"), ("length", "L", "{:d}"), ("block_length", "block", "{:d}"),
    ("active_rows", "rows/step", "{:d}"), ("first_step_ms", "step 0 ms", "{:.1f}"),
    ("ms_per_step", "ms/step", "{:.1f}"), ("ms_per_token", "ms/token", "{:.2f}"),
    ("peak_rss_mib", "peak RSS MiB", "{:.0f}"), ("arithmetic_intensity", "FLOP/byte", "{:.1f}"),
    ("gflops", "GFLOP/s", "{:.1f}"),
]


def shown(rows: list[dict]) -> list[dict]:
    return [{**r, "peak_rss_mib": r["peak_rss_bytes"] / 2**20} for r in rows]
