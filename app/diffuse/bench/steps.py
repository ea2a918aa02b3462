"""`diffuse bench steps`: latency and quality against the step budget (the study's "fewer steps").

For each scheduler and step budget, greedy runs of the paper's prompts: total time, steps used,
buffer tok/s and, as the quality proxy, agreement with the many-step answer (low_confidence with
one step per generated position: the same prompt, greedy, so only the budget differs). With
`heldout` (a training-text folder, the format `diffuse train` reads), also held-out infilling
accuracy: windows of its held-out documents (every 50th), the first part as the prompt (no chat
template), the rest generated with the budget and compared token by token with the real text.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from diffuse import DiffuseError
from diffuse.bench.prompts import PAPER_PROMPTS

SCHEDULERS = ("low_confidence", "entropy_exit")
DEFAULTS = {"gen_length": 64, "temperature": 0.0}
HELDOUT_WINDOWS = 8
HELDOUT_PROMPT = 64      # tokens of each held-out window given as the prompt


def heldout_windows(model, data: Path, gen_length: int) -> np.ndarray:
    """(n, HELDOUT_PROMPT + gen_length) token windows of the held-out documents."""
    from diffuse.train.bpe import EOS
    from diffuse.train.data import heldout_windows as windows, read_documents, split_heldout

    eos = model.tokenizer.token_to_id(EOS)
    if eos is None:
        raise DiffuseError(f"--heldout: the model's tokenizer has no {EOS} (the demo model's does)")
    _, held = split_heldout(read_documents(data))
    return windows(model.tokenizer.encode, eos, held, HELDOUT_PROMPT + gen_length, HELDOUT_WINDOWS)


def run(path: str, budgets: list[int], threads: int | None = None, prompts: list[int] = (0, 6),
        options: dict | None = None, heldout: Path | None = None, schedulers=SCHEDULERS, log=print) -> list[dict]:
    """One record per (scheduler, budget): means over the prompts."""
    import diffuse

    opts = {**DEFAULTS, **{k: v for k, v in (options or {}).items() if v is not None}}
    for axis in ("steps", "scheduler"):
        opts.pop(axis, None)
    model = diffuse.load(path, threads=threads)
    texts = [PAPER_PROMPTS[i][1] for i in prompts]
    reference = [model.generate(t, **{**opts, "steps": opts["gen_length"], "scheduler": "low_confidence"}).tokens
                 for t in texts]
    windows = heldout_windows(model, heldout, opts["gen_length"]) if heldout else None
    rows = []
    for sched in schedulers:
        for budget in budgets:
            run_opts = {**opts, "steps": budget, "scheduler": sched}
            results = [model.generate(t, **run_opts) for t in texts]
            row = {"scheduler": sched, "steps": budget, "threads": model.threads,
                   "steps_allowed": results[0].steps_allowed,
                   "steps_used": float(np.mean([r.steps for r in results])),
                   "ms": float(np.mean([r.total_ms for r in results])),
                   "tokens_per_s": float(np.mean([r.buffer_tokens_per_s for r in results])),
                   "agreement": float(np.mean([np.mean(r.tokens == ref) for r, ref in zip(results, reference)]))}
            if windows is not None:
                hits = [np.mean(model.generate(w[:HELDOUT_PROMPT].tolist(), chat=False, **run_opts).tokens
                                == w[HELDOUT_PROMPT:]) for w in windows]
                row["heldout_accuracy"] = float(np.mean(hits))
            rows.append(row)
            log(f"{sched:14s} {budget:4d} steps: {row['steps_used']:5.1f} used, {row['ms']:8.1f} ms, "
                f"{row['tokens_per_s']:7.1f} tok/s, agreement {row['agreement']:.3f}"
                + (f", held-out accuracy {row['heldout_accuracy']:.3f}" if "heldout_accuracy" in row else ""))
    return rows


COLUMNS = [
    ("scheduler", "scheduler", "{}"), ("steps", "budget", "{:d}"), ("steps_used", "steps used", "{:.1f}"),
    ("ms", "ms", "{:.0f}"), ("tokens_per_s", "buffer tok/s", "{:.1f}"),
    ("agreement", "agreement with many-step", "{:.3f}"), ("heldout_accuracy", "held-out accuracy", "{:.3f}"),
]
