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
- DiffusionGemma (a uniform-state model with a canvas) has no pass over 1..32 new rows and no AR
  decode of its weights, so nothing to take as the unit: its canvas step (the decoder over its
  canvas_length rows over the encoded context) and the encoder's pass over the context are timed
  at each depth instead, in ms, by the engine inside a real run (`Model.generate`'s step events and
  prefill time), and `note` says why the decode-token table is absent.
"""
from __future__ import annotations

import os
import time
from pathlib import Path

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
    ("WeDLM-8B, window 16", None, 16, 1,
     "not published: Tencent's README and paper report wall-clock speedups over vLLM-served Qwen3-8B on GPUs "
     "(3-6x on GSM8K; about 3x on reasoning, up to 10x on low-entropy text), not tokens per forward"),
    ("Stable-DiffCoder-8B, block 4", (1.0, 1.0), 4, 1,
     "its model card's call: steps=512 over gen_length=512 in blocks of 4, one token per 4-row pass"),
    ("DiffusionGemma 26B-A4B", None, 256, 1, "not yet measured (no tokens per forward published)"),
]
CANVAS_COLUMNS = [("depth", "context rows", "{}"), ("w", "canvas rows", "{}"),
                  ("ms", "canvas step ms (self-conditioned)", "{:.1f}"), ("first_ms", "first step ms", "{:.1f}"),
                  ("row_ms", "ms per canvas row", "{:.2f}"), ("encoder_ms", "encoder ms over the context", "{:.1f}")]
CANVAS_NOTE = ("{name}: no cost in decode tokens: DiffusionGemma has no pass over 1..32 new rows and no AR decode of "
               "its weights (its decoder denoises a whole canvas of {canvas} rows over the encoded context), so its "
               "canvas step and encoder pass are timed instead, in ms; its tokens per forward are not published.")
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
    from diffuse.bench.machine import describe

    if any(w < 1 for w in widths) or any(d < 0 for d in depths):
        raise DiffuseError("--widths must be positive and --depths not negative")
    model = model or diffuse.load(path, threads=threads)
    machine, load_before = describe(), os.getloadavg()[0]     # the load at the start
    canvas = model._core.hparams.get("canvas_length", 0)
    if canvas:
        result = _canvas_run(model, path, depths, canvas, threads, reps, log, cancel)
    else:
        result = _rows_run(model, path, depths, widths, threads, reps, log, cancel)
    return result | {"machine": machine, "load_average": [load_before, os.getloadavg()[0]],
                     "when": time.strftime("%Y-%m-%d %H:%M")}


def _rows_run(model, path: str, depths: list[int], widths: list[int], threads: int, reps: int, log, cancel) -> dict:
    from diffuse import _core

    for d in depths:
        bad = [w for w in widths if d % w]
        if bad:
            raise DiffuseError(f"--depths {d} is not a multiple of the widths {bad}: blocks align at position 0")
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

    return {"model": path, "threads": threads, "reps": reps, "passes": passes, "families": _families(passes, measured),
            "cancelled": measured != depths}


def _canvas_run(model, path: str, depths: list[int], canvas: int, threads: int, reps: int, log, cancel) -> dict:
    """DiffusionGemma: per depth and round, one real run of one canvas over a random context of
    that many tokens (diffusion_gemma.time_canvas), the depths alternating."""
    if min(depths) < 1:
        raise DiffuseError("--depths: DiffusionGemma's encoder needs a context of at least 1 token")
    if max(depths) + canvas > model.n_ctx_train:
        raise DiffuseError(f"depth {max(depths)} + its canvas of {canvas} rows exceed the model's context "
                           f"({model.n_ctx_train})")
    from diffuse.bench.diffusion_gemma import time_canvas

    rng = np.random.default_rng(0)
    contexts = {d: [int(t) for t in rng.integers(0, model.n_vocab, d)] for d in depths}
    time_canvas(model, contexts[depths[0]][:1], threads)     # page the weights in
    times = {d: {"ms": [], "first_ms": [], "encoder_ms": []} for d in depths}
    for rnd in range(reps):
        if cancel():
            break
        for d in depths if rnd % 2 == 0 else depths[::-1]:
            for key, ms in time_canvas(model, contexts[d], threads).items():
                times[d][key].append(ms)
        log(f"round {rnd + 1} of {reps}: canvas step " + ", ".join(
            f"depth {d} {times[d]['ms'][-1]:.1f} ms" for d in depths))
    rows = []
    for d in depths:
        if times[d]["ms"]:
            med = {k: float(np.median(v)) for k, v in times[d].items()}
            rows.append({"depth": d, "w": canvas, **med, "row_ms": med["ms"] / canvas, "samples": times[d]["ms"]})
    return {"model": path, "threads": threads, "reps": reps, "passes": [], "canvas": rows,
            "families": _families([], []), "cancelled": len(times[depths[0]]["ms"]) < reps,
            "note": CANVAS_NOTE.format(name=Path(path).name, canvas=canvas)}


def _families(passes: list[dict], measured: list[int]) -> list[dict]:
    """Each family's row per depth measured: its rate over the cost of its passes; a family
    without a rate, or no depth measured, gets one row that says so."""
    families = []
    cost = {(p["depth"], p["w"]): p["tokens"] for p in passes}
    for name, rate, w, n_pass, source in FAMILIES:
        for d in measured or ["-"]:
            row = {"family": name, "w": w, "passes": n_pass, "depth": d, "source": source,
                   "tokens_per_pass": _range(*rate) if rate else "not published"}
            if rate and (d, w) in cost:
                c = n_pass * cost[d, w]
                row.update(cost=f"{c:.2f}", vs_ar=_range(rate[0] / c, rate[1] / c))
            elif rate:
                row.update(cost=f"({w} rows not measured)")
            families.append(row)
            if not rate:
                break   # one row says it: nothing to compute at any depth
    return families


def header(result: dict) -> str:
    load = result.get("load_average")
    where = (f"; {result['when']}, load average {load[0]:.1f} -> {load[1]:.1f}" if load and result.get("when")
             else "")
    unit = ("the canvas step timed inside a real run, the encoder's pass over the whole context beside it"
            if result.get("canvas") is not None else
            "one decode token = this engine's 1-row pass with its logits at that depth")
    return (f"Passes over `{result['model']}`, {result['threads']} threads, median of {result['reps']} alternated "
            f"rounds{where}; {unit}.")


def tables(result: dict, table) -> list[str]:
    """The result's tables, each drawn by `table(rows, columns)` (text or markdown)."""
    measured = (table(result["canvas"], CANVAS_COLUMNS) if result.get("canvas") is not None
                else table(result["passes"], PASS_COLUMNS))
    return [measured, table(result["families"], FAMILY_COLUMNS)]


def markdown(result: dict) -> str:
    from diffuse.bench.machine import describe_line
    from diffuse.bench.tables import md_table
    passes, families = tables(result, md_table)
    return "\n\n".join(([result["note"]] if result.get("note") else []) + [
        header(result), describe_line(result["machine"]), passes + "\nEach family's reported rate on this machine "
        "and file (rates from the papers, costs measured here):", families])
