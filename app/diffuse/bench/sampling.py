"""The cost of sampling per denoising step: greedy, temperature, temperature + top-p + top-k.

Two measurements, each at every thread count asked for:

- `sample_ms` of real runs (the engine's per-step sampling time: stats, draws and the scheduler's
  pick) on a Dream model, by default a random-weight one with Dream's 152064-token vocabulary
  written once to the scratch folder (random weights give flat N(0, 1) logits, whose mass is
  spread over the whole vocabulary: the hard case for partial sorting);
- `_core.sample_rows` alone on synthetic 152064-wide logits, flat and peaked (a few tokens far
  above the rest, as trained models give), in ms per row; also LLaDA's Gumbel-max at T=0.7.

    python -m diffuse.bench.sampling [--model M.gguf] [--threads 1 2] [--gen-length 128] [--steps 32]
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

DREAM_VOCAB = 152064
SCRATCH = Path("/tmp/diffuse-models")
CONFIGS = {"greedy": {}, "T=0.7": {"temperature": 0.7},
           "T=0.7 top_p 0.95 top_k 50": {"temperature": 0.7, "top_p": 0.95, "top_k": 50}}
GUMBEL = {"Gumbel T=0.7 (LLaDA)": {"temperature": 0.7, "gumbel": True}}
PROMPT = [5, 17, 42, 8, 99, 3]


def random_dream(dest: Path = SCRATCH) -> Path:
    """A 2-layer Dream model with the real vocabulary (forward cost small, sampling cost real)."""
    from diffuse.bench.random_models import write_random_dream

    path = dest / "random-dream-152k.gguf"
    if not path.exists():
        write_random_dream(path, n_layer=2, n_embd=256, n_head=4, n_head_kv=2, n_ff=512, n_vocab=DREAM_VOCAB,
                           n_ctx=1024)
    return path


def model_runs(path: Path, threads: list[int], gen_length: int, steps: int, reps: int) -> list[dict]:
    """Per config and thread count: mean sample_ms per step and per sampled row, over `reps` runs."""
    import diffuse

    m = diffuse.load(str(path), threads=max(threads))
    out = []
    for t in threads:
        for name, kw in CONFIGS.items():
            ms, rows = [], 0
            for seed in range(reps):
                r = m.generate(PROMPT, gen_length=gen_length, steps=steps, block_length=0,
                               threads=t, seed=seed, **kw)
                ms.append(np.asarray(r.sample_ms))
                # a step samples the positions still masked when it starts
                rows += int(sum(np.count_nonzero(r.decided_step >= s) for s in range(len(r.sample_ms))))
            ms = np.concatenate(ms)
            out.append({"threads": t, "config": name, "sample_ms": float(ms.mean()),
                        "ms_per_row": float(ms.sum() / rows), "rows_per_step": rows / ms.size})
    return out


def synthetic_logits(kind: str, rows: int, vocab: int = DREAM_VOCAB, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    if kind == "flat":
        return rng.standard_normal((rows, vocab), np.float32)
    l = rng.standard_normal((rows, vocab), np.float32) * 3
    for r in range(rows):
        l[r, rng.integers(0, vocab, 8)] += rng.uniform(5, 25, 8).astype(np.float32)
    return l


def row_timings(threads: list[int], rows: int, reps: int, vocab: int = DREAM_VOCAB) -> list[dict]:
    """_core.sample_rows on synthetic logits: best of `reps` calls, ms per row."""
    from diffuse import _core

    out = []
    keys = np.arange(rows, dtype=np.int32)
    for kind in ("peaked", "flat"):
        l = synthetic_logits(kind, rows, vocab)
        for t in threads:
            for name, kw in {**{k: {**v, "gumbel": False} for k, v in CONFIGS.items()}, **GUMBEL}.items():
                best = np.inf
                for rep in range(reps):
                    t0 = time.perf_counter()
                    _core.sample_rows(l, keys, seed=1, step=rep, mask_token_id=151666, threads=t, **kw)
                    best = min(best, time.perf_counter() - t0)
                out.append({"logits": kind, "threads": t, "config": name, "ms_per_row": best * 1e3 / rows})
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", type=Path, help="a Dream GGUF (default: a random-weight one, written once to "
                                                f"{SCRATCH})")
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--gen-length", type=int, default=128)
    ap.add_argument("--steps", type=int, default=32)
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--rows", type=int, default=32, help="rows of synthetic logits per sample_rows call")
    ap.add_argument("--skip-model", action="store_true", help="only the synthetic-logits timings")
    args = ap.parse_args(argv)
    if min(args.threads) < 1 or args.gen_length < 1 or args.steps < 1 or args.reps < 1 or args.rows < 1:
        ap.error("--threads, --gen-length, --steps, --reps and --rows must be positive")
    if not args.skip_model:
        path = args.model or random_dream()
        print(f"{path.name}: {args.gen_length} tokens, {args.steps} steps, block_length 0")
        print(f"{'threads':>7}  {'config':<26} {'sample_ms/step':>14} {'ms/row':>7} {'rows/step':>9}")
        for r in model_runs(path, args.threads, args.gen_length, args.steps, args.reps):
            print(f"{r['threads']:>7}  {r['config']:<26} {r['sample_ms']:>14.1f} {r['ms_per_row']:>7.2f} "
                  f"{r['rows_per_step']:>9.1f}")
    print(f"_core.sample_rows, {args.rows} rows x {DREAM_VOCAB} logits, best of {args.reps}")
    print(f"{'logits':>7}  {'threads':>7}  {'config':<26} {'ms/row':>7}")
    for r in row_timings(args.threads, args.rows, args.reps):
        print(f"{r['logits']:>7}  {r['threads']:>7}  {r['config']:<26} {r['ms_per_row']:>7.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
