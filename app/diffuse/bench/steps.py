"""`diffuse bench steps`: latency and quality against the step budget (the study's "fewer steps").

For each scheduler and step budget, greedy runs of the paper's prompts: total time, steps used,
buffer tok/s and, as the quality proxy, agreement with the many-step answer (low_confidence with
one step per generated position: the same prompt, greedy, so only the budget differs). With
`heldout` (a training-text folder, the format `diffuse train` reads), also the held-out masked
accuracy of models/README.md's evaluation, decoded with the budget: in each held-out window a fixed
random half of the positions is masked, and `budget` forward passes fill them, each committing an
equal share of the still-masked positions, the most confident first (low_confidence). With one
step every masked token is read off one pass (the README's number); with one step per masked
position each sees every earlier decision. It is the same for both schedulers, so it is reported
on the low_confidence rows.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from diffuse import DiffuseError
from diffuse.bench.prompts import PAPER_PROMPTS

SCHEDULERS = ("low_confidence", "entropy_exit")
DEFAULTS = {"gen_length": 64, "temperature": 0.0}
HELDOUT_WINDOWS = 16
HELDOUT_LENGTH = 128      # tokens per held-out window
HELDOUT_MASKED = 0.5      # share of each window's positions to fill


def heldout_windows(model, data: Path) -> np.ndarray:
    """(n, HELDOUT_LENGTH) token windows of the held-out documents."""
    from diffuse.train.bpe import EOS
    from diffuse.train.data import heldout_windows as windows, read_documents, split_heldout

    eos = model.tokenizer.token_to_id(EOS)
    if eos is None:
        raise DiffuseError(f"--heldout: the model's tokenizer has no {EOS} (the demo model's does)")
    _, held = split_heldout(read_documents(data))
    return windows(model.tokenizer.encode, eos, held, HELDOUT_LENGTH, HELDOUT_WINDOWS)


def infill_accuracy(model, windows: np.ndarray, budget: int, seed: int = 0) -> float:
    """Share of the masked positions filled with the true token, in `budget` passes (see above)."""
    rng = np.random.default_rng(seed)
    shift = model.hparams["shift_logits"]     # Dream: position i is predicted at row i - 1
    hits = total = 0
    for window in windows:
        hidden = rng.permutation(len(window))[:max(1, round(HELDOUT_MASKED * len(window)))]
        if shift:
            hidden = hidden[hidden > 0]
        x = window.copy()
        x[hidden] = model.mask_token_id
        for share in np.array_split(np.arange(len(hidden)), min(budget, len(hidden))):
            masked = np.flatnonzero(x == model.mask_token_id)
            logits = model.forward(x, positions=masked - 1 if shift else masked)   # (n_masked, V)
            top = logits.max(axis=1)          # top-1 probability = 1 / sum(exp(logits - top))
            confidence = 1.0 / np.exp(logits - top[:, None]).sum(axis=1)
            chosen = np.argsort(-confidence, kind="stable")[:len(share)]
            x[masked[chosen]] = logits[chosen].argmax(axis=1)
        hits += int((x[hidden] == window[hidden]).sum())
        total += len(hidden)
    return hits / total


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
    windows = heldout_windows(model, heldout) if heldout else None
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
            if windows is not None and sched == "low_confidence":
                row["heldout_accuracy"] = infill_accuracy(model, windows, budget)
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
