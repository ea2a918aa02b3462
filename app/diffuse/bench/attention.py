"""Long contexts: peak memory and time per step of the attention configurations.

A one-layer LLaDA-8B-wide model (d 4096, 32 heads, ffn 12288, vocab 32000, F16 random weights,
about 1.0 GB) stands for the real one: per layer, the compute memory of a forward pass is what
grows with the context, and a single layer shows it without 16 GB of weights. Each configuration
runs in its own process, so its peak RSS is its own.

    python -m diffuse.bench.attention [--lengths 512,4064] [--dest DIR]
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

from diffuse import DiffuseError
from diffuse.bench import machine
from diffuse.bench.random_models import write_random_llada

CONFIGS = {
    "flash, F16 K/V (default)": dict(flash_attn=True, kv_f16=True),
    "flash, F32 K/V": dict(flash_attn=True, kv_f16=False),
    "no flash, F32 K/V (before)": dict(flash_attn=False, kv_f16=False),
}
WIDE = dict(n_embd=4096, n_head=32, n_ff=12288, n_vocab=32000, n_ctx=4096)


def write_wide_layer(path: Path) -> Path:
    """The one-layer LLaDA-8B-wide F16 model (written once, then reused)."""
    if not path.exists():
        write_random_llada(path, n_layer=1, **WIDE)
    return path


def measure(path: str, prompt_len: int, gen: int, config: dict, threads: int, steps: int) -> dict:
    """One configuration in this process: ms per step and peak RSS of a short run."""
    import diffuse

    m = diffuse.load(path, threads=threads, **config)
    prompt = list(np.random.default_rng(1).integers(0, m.n_vocab - 1, prompt_len))
    t0 = time.perf_counter()
    r = m.generate(prompt, gen_length=gen, steps=steps, block_length=gen, scheduler="low_confidence")
    wall = time.perf_counter() - t0
    return {"config": config, "prompt": prompt_len, "gen": gen, "threads": threads, "steps": r.steps,
            "first_step_ms": float(r.step_ms[0]), "cached_step_ms": float(np.median(r.step_ms[1:])) if r.steps > 1 else None,
            "wall_s": wall, "peak_rss_bytes": machine.peak_rss_bytes()}


def run(dest: Path, lengths: list[int], gen: int = 32, threads: int = 2, steps: int = 2) -> list[dict]:
    path = write_wide_layer(dest / "llada8b-wide-1layer-f16.gguf")
    rows = []
    for n in lengths:
        for name, cfg in CONFIGS.items():
            try:
                r = machine.run_in_child("diffuse.bench.attention", "measure", path=str(path), prompt_len=n - gen,
                                         gen=gen, config=cfg, threads=threads, steps=steps)
                rows.append({"name": name, **r, "file_bytes": path.stat().st_size})
            except DiffuseError as e:
                rows.append({"name": name, "prompt": n - gen, "error": str(e)})
            print(format_row(rows[-1]), flush=True)
    return rows


def format_row(r: dict) -> str:
    if "error" in r:
        return f"{r['name']:28s} prompt {r['prompt']:5d}: {r['error']}"
    over = (r["peak_rss_bytes"] - r["file_bytes"]) / 2**30
    cached = f"{r['cached_step_ms']:8.0f}" if r["cached_step_ms"] is not None else "       -"
    return (f"{r['name']:28s} prompt {r['prompt']:5d} + {r['gen']}: step 0 {r['first_step_ms']:8.0f} ms, "
            f"cached step {cached} ms, peak RSS {r['peak_rss_bytes'] / 2**30:5.2f} GiB = file + {over:5.2f} GiB")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lengths", default="512,4096", help="total positions (prompt + 32 generated)")
    ap.add_argument("--dest", type=Path, default=Path("/tmp/diffuse-models"))
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--json", type=Path, help="write the rows here")
    args = ap.parse_args(argv)
    rows = run(args.dest, [int(x) for x in args.lengths.split(",")], threads=args.threads)
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
