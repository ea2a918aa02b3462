"""Where diffusion wins on this machine and this file: the cost of a pass over w new rows, in
autoregressive decode tokens, and what each family's published tokens per forward make of it.

    diffuse bench knee MODEL [--depths 512,2048] [--widths 1,2,4,8,16,32] [--threads N] [--reps 5]

- Pass cost: w new rows against d cached rows with the logits of every row (a rule that reads each
  masked position's confidence needs them all), timed by the engine (`_core.bench_block_steps`; a
  block-diffusion model's rows attend block-causally, a full-attention model's over every row).
  The unit, one decode token, is the same engine's pass over 1 row with its logits at that depth:
  the work of an autoregressive decode step on the same weights (llama.cpp's decode token costs
  the same, 1.00-1.05x, docs/benchmarks.md section 10). Widths alternate round by round.
- Families: the tokens per forward each family reports for its own models, each over the rows its
  step computes. Speed against AR decode = tokens per pass / (passes x cost of the pass), i.e. what
  a model of this file's shape would gain on this machine at that family's reported rate. The rates
  are the papers', not measured here; the costs are this machine's.
"""
from __future__ import annotations

import numpy as np

from diffuse import DiffuseError

# name, tokens per forward (low, high; None: not measured), rows per pass, passes per step, source
FAMILIES = [
    ("SDAR, block 4", (2.0, 4.0), 4, 1, "SDAR (JetLM) report: 2-4 tokens per step at block 4"),
    ("LLaDA2.0/2.1, block 32", (2.6, 5.3), 32, 1, "LLaDA2 report: 2.6-5.3 tokens per forward, blocks of 32"),
    ("Nemotron-Labs-Diffusion self-speculation, as reported", (5.99, 5.99), 32, 1,
     "NVIDIA's 8B report: 5.99 tokens per forward, a forward counted as one 32-row pass"),
    ("Nemotron-Labs-Diffusion self-speculation, released loop", (5.99, 5.99), 32, 2,
     "same rate; the released linear_spec_generate runs a draft and a verify pass of 32 rows each"),
    ("DiffusionGemma 26B-A4B", None, 256, 1, "not yet measured (no tokens per forward published)"),
]
PASS_COLUMNS = [("depth", "depth", "{}"), ("w", "rows w", "{}"), ("ms", "ms per pass", "{:.1f}"),
                ("decode_ms", "decode token ms", "{:.1f}"), ("tokens", "cost in decode tokens", "{:.2f}")]
FAMILY_COLUMNS = [("family", "family", "{}"), ("tokens_per_pass", "tokens per pass", "{}"),
                  ("w", "rows per pass", "{}"), ("passes", "passes per step", "{}"), ("depth", "depth", "{}"),
                  ("cost", "step cost in decode tokens", "{}"), ("vs_ar", "speed vs AR decode", "{}"),
                  ("source", "tokens per pass from", "{}")]


def _range(lo: float, hi: float, fmt: str = "{:.2f}") -> str:
    return fmt.format(lo) if lo == hi else f"{fmt.format(lo)}-{fmt.format(hi)}"


def range_values(text: str) -> tuple[float, float] | None:
    """_range's text back as (low, high); None for what is no number (a row not measured)."""
    try:
        lo, _, hi = text.partition("-")
        return float(lo), float(hi or lo)
    except (AttributeError, ValueError):
        return None


def run(path: str, depths: list[int], widths: list[int], threads: int, reps: int, log=lambda line: None,
        model=None, cancel=lambda: False) -> dict:
    """`model`: the file already loaded (the Studio's); cancel(): checked between depths, the
    depths measured by then are the result (`cancelled` says so)."""
    import diffuse
    from diffuse import _core

    if any(w < 1 for w in widths) or any(d < 0 for d in depths):
        raise DiffuseError("--widths must be positive and --depths not negative")
    for d in depths:
        bad = [w for w in widths if d % w]
        if bad:
            raise DiffuseError(f"--depths {d} is not a multiple of the widths {bad}: blocks align at position 0")
    model = model or diffuse.load(path, threads=threads)
    if max(depths) + max(widths) > model.n_ctx_train:
        raise DiffuseError(f"depth {max(depths)} + {max(widths)} rows exceed the model's context ({model.n_ctx_train})")
    _core.bench_block_step(model._core, 0, 1, threads=threads, reps=1)   # page the weights in

    passes, measured = [], []
    for d in depths:
        if cancel():
            break
        log(f"depth {d}: {reps} rounds over {', '.join(map(str, sorted({1, *widths})))} rows")
        # Round by round over every width and the 1-row unit (one prefill for all):
        # (width, masked, threads, logit rows: all).
        cases = [(w, 0, threads, 0) for w in sorted({1, *widths})]
        got = _core.bench_block_steps(model._core, d, cases * reps, reps=1, routing=False)
        ms = {}
        for (w, _, _, _), (samples, _) in zip(cases * reps, got):
            ms.setdefault(w, []).extend(samples)
        unit = float(np.median(ms[1]))
        for w in widths:
            m = float(np.median(ms[w]))
            passes.append({"depth": d, "w": w, "ms": m, "decode_ms": unit, "tokens": m / unit, "samples": ms[w],
                           "decode_samples": ms[1]})
            log(f"depth {d}, {w} rows: {m:.1f} ms = {m / unit:.2f} decode tokens ({unit:.1f} ms)")
        measured.append(d)

    families = []
    cost = {(p["depth"], p["w"]): p["tokens"] for p in passes}
    for name, rate, w, n_pass, source in FAMILIES:
        for d in measured:
            row = {"family": name, "w": w, "passes": n_pass, "depth": d, "source": source,
                   "tokens_per_pass": _range(*rate) if rate else "not measured"}
            if rate and (d, w) in cost:
                c = n_pass * cost[d, w]
                row.update(cost=f"{c:.2f}", vs_ar=_range(rate[0] / c, rate[1] / c))
            elif rate:
                row.update(cost=f"({w} rows not measured)")
            families.append(row)
            if not rate:
                break   # one row says it: nothing to compute at any depth
    return {"model": path, "threads": threads, "reps": reps, "passes": passes, "families": families,
            "cancelled": measured != depths}


def header(result: dict) -> str:
    return (f"Passes over `{result['model']}`, {result['threads']} threads, median of {result['reps']} alternated "
            f"rounds; one decode token = this engine's 1-row pass with its logits at that depth.")


def markdown(result: dict) -> str:
    from diffuse.bench.tables import md_table
    return (header(result) + "\n\n" + md_table(result["passes"], PASS_COLUMNS) + "\nEach family's reported rate "
            "on this machine and file (rates from the papers, costs measured here):\n\n"
            + md_table(result["families"], FAMILY_COLUMNS))
