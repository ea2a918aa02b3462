"""`diffuse bench grid`: the paper's grid, quantisation x threads x steps x scheduler x cache x
generation length (x prompt), with the AR baseline and a roofline in the same run.

Every configuration runs `reps` times after one warm-up per (model, threads); the table gives
medians and the spread (max - min) / median. Outputs in OUT_DIR: grid.json (every run, the
aggregates, the machine), grid.csv (aggregates), report.md and PNG plots.
"""
from __future__ import annotations

import itertools
import os
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

import diffuse
from diffuse import gguf_file
from diffuse.bench import cost, machine, roofline
from diffuse.bench.forward import time_forward
from diffuse.bench.llama_ref import LlamaBins, ar_baseline
from diffuse.bench.prompts import PAPER_PROMPTS
from diffuse.bench.tables import md_table, on_off, text_table, write_csv, write_json
from diffuse.quantize import QTYPES
from diffuse.recording import write_atomic


@dataclass
class Axes:
    """The grid's axes; every combination is one configuration."""
    models: list[str]
    threads: list[int]
    steps: list[int] = field(default_factory=lambda: [16])
    schedulers: list[str] = field(default_factory=lambda: ["low_confidence", "entropy_exit"])
    cache: list[bool] = field(default_factory=lambda: [False, True])
    gen_lengths: list[int] = field(default_factory=lambda: [32, 64])
    prompts: list[int] = field(default_factory=lambda: [0, 6])   # indices into PAPER_PROMPTS

    def configs(self):
        return itertools.product(self.steps, self.schedulers, self.cache, self.gen_lengths, self.prompts)


def quant_label(path: str) -> str:
    """general.file_type's name (Q4_K_M, ...), else the weight type with the most bytes."""
    names = {q.ftype: name for name, q in QTYPES.items()}
    ft = gguf_file.read(path).kv.get("general.file_type")
    return names.get(ft) or cost.type_mix(cost.matmuls(path)).split()[0]


def run(axes: Axes, reps: int = 3, fixed: dict | None = None, ar_model: str | None = None,
        ar_backend: str = "auto", llama: LlamaBins | None = None, log=print) -> dict:
    """Run the grid; returns {machine, models, axes, runs, rows, ar, roofline} (the CLI adds the command)."""
    # seed 0 unless given: an unset seed would be a fresh one per run, and a grid's runs must repeat
    fixed = {"seed": 0, **{k: v for k, v in (fixed or {}).items() if v is not None}}
    mach = machine.describe()
    runs, roof_points, roofs, ar, models = [], [], [], [], []
    for i, path in enumerate(axes.models):
        model = diffuse.load(path)
        quant = quant_label(path)
        label = f"{Path(path).stem} [{quant}]"
        models.append({"model": label, "path": path, "arch": model.arch, "quant": quant,
                       "file_bytes": Path(path).stat().st_size})
        mms = cost.matmuls(path)
        n_prompt = len(model.encode_prompt(PAPER_PROMPTS[axes.prompts[0]][1]))
        for t in axes.threads:
            # The ceilings for these weights, and the AR baseline, next to the diffusion runs of t threads.
            roofs.append(roofline.measure_roof(label, mms, t, n_tokens=n_prompt + max(axes.gen_lengths)))
            if i == 0 and ar_model:
                ar_mms, ar_label = cost.matmuls(ar_model), Path(ar_model).stem
                ar.append(_ar_at(ar_model, t, max(axes.gen_lengths), reps, ar_backend, llama, log))
                roofs.append(roofline.measure_roof(ar_label, ar_mms, t, n_tokens=max(axes.gen_lengths)))
                roof_points += roofline.ar_points(ar_label, ar_mms, ar[-1], t)
            model.threads = t
            model.generate(PAPER_PROMPTS[0][1], gen_length=16, steps=2, cache=False)   # warm-up
            for steps, sched, cache_on, gen, p in axes.configs():
                opts = {**fixed, "steps": steps, "scheduler": sched, "cache": cache_on, "gen_length": gen}
                for rep in range(reps):
                    r = model.generate(PAPER_PROMPTS[p][1], **opts)
                    runs.append({
                        "model": label, "path": path, "threads": t, "steps": steps, "scheduler": sched,
                        "cache": cache_on, "gen_length": gen, "prompt": PAPER_PROMPTS[p][0], "rep": rep,
                        "steps_used": r.steps, "total_ms": r.total_ms, "step_ms": float(np.mean(r.step_ms)),
                        "forward_ms": float(np.mean(r.forward_ms)), "sample_ms": float(np.mean(r.sample_ms)),
                        "buffer_tok_s": r.buffer_tokens_per_s, "useful_tok_s": r.useful_tokens_per_s,
                        "useful_length": r.useful_length, "prompt_tokens": len(r.prompt_tokens),
                        "stop_reason": r.stop_reason})
                log(f"{label} t={t} steps={steps} {sched} cache={'on' if cache_on else 'off'} B={gen} "
                    f"{PAPER_PROMPTS[p][0]}: {runs[-1]['buffer_tok_s']:.2f} tok/s, {runs[-1]['steps_used']} steps")
            # Roofline point of a full step at each buffer size: one uncached forward pass.
            for gen in axes.gen_lengths:
                n = n_prompt + gen
                ids = np.random.default_rng(0).integers(0, model.n_vocab, size=n).astype(np.int32)
                ms = float(np.median(time_forward(model, ids, max(reps, 1))))
                roof_points.append(roofline.diffusion_point(label, mms, model.hparams, n, t, ms))
    rows = aggregate(runs)
    if ar:
        decode = {a["threads"]: a["decode_tokens_per_s"] for a in ar}
        for r in rows:
            r["buffer_vs_ar"] = r["buffer_tok_s"] / decode[r["threads"]]
            r["useful_vs_ar"] = r["useful_tok_s"] / decode[r["threads"]]
    return {"machine": mach, "reps": reps, "fixed": fixed, "models": models,
            "axes": dict(vars(axes)), "runs": runs, "rows": rows, "ar": ar,
            "roofline": {"roofs": roofs, "points": roof_points}}


def _ar_at(ar_model: str, threads: int, n_tokens: int, reps: int, backend: str, llama, log) -> dict:
    """AR prompt tok/s over n_tokens and decode tok/s of n_tokens at `threads`."""
    a = ar_baseline(ar_model, threads=threads, n_prompt=n_tokens, n_gen=n_tokens, reps=reps, backend=backend,
                    bins=llama)
    a.update(threads=threads, model=Path(ar_model).name, n_prompt=n_tokens)
    log(f"AR {Path(ar_model).name} t={threads}: decode {a['decode_tokens_per_s']:.1f} tok/s, "
        f"prompt {a['prompt_tokens_per_s']:.1f} tok/s ({a['backend']})")
    return a


KEYS = ("model", "threads", "steps", "scheduler", "cache", "gen_length", "prompt")


def aggregate(runs: list[dict]) -> list[dict]:
    """One row per configuration: medians over reps, spread = (max - min) / median of total time."""
    groups: dict[tuple, list[dict]] = {}
    for r in runs:
        groups.setdefault(tuple(r[k] for k in KEYS), []).append(r)
    rows = []
    for key, rs in groups.items():
        total = np.array([r["total_ms"] for r in rs])
        med = float(np.median(total))
        row = dict(zip(KEYS, key))
        row.update({
            # One run has no spread (None, shown as "-"), not a spread of 0.
            "reps": len(rs), "total_ms": med,
            "spread": float((total.max() - total.min()) / med) if med and len(rs) > 1 else None,
            "steps_used": int(np.median([r["steps_used"] for r in rs])),
            "step_ms": float(np.median([r["step_ms"] for r in rs])),
            "forward_ms": float(np.median([r["forward_ms"] for r in rs])),
            "sample_ms": float(np.median([r["sample_ms"] for r in rs])),
            "buffer_tok_s": float(np.median([r["buffer_tok_s"] for r in rs])),
            "useful_tok_s": float(np.median([r["useful_tok_s"] for r in rs])),
            "useful_length": int(np.median([r["useful_length"] for r in rs])),
        })
        rows.append(row)
    return rows


COLUMNS = [
    ("model", "model", "{}"), ("threads", "threads", "{:d}"), ("steps", "steps", "{:d}"),
    ("scheduler", "scheduler", "{}"), ("cache", "cache", on_off), ("gen_length", "B", "{:d}"),
    ("prompt", "prompt", "{}"), ("steps_used", "steps used", "{:d}"), ("step_ms", "ms/step", "{:.1f}"),
    ("sample_ms", "sampling ms", "{:.1f}"), ("total_ms", "total ms", "{:.0f}"), ("spread", "spread", "{}"),
    ("buffer_tok_s", "buffer tok/s", "{:.2f}"), ("useful_tok_s", "useful tok/s", "{:.2f}"),
    ("buffer_vs_ar", "buffer/AR", "{:.2f}x"), ("useful_vs_ar", "useful/AR", "{:.2f}x"),
]
AR_COLUMNS = [
    ("model", "AR model", "{}"), ("threads", "threads", "{:d}"), ("backend", "backend", "{}"),
    ("n_prompt", "prompt tokens", "{:d}"), ("prompt_tokens_per_s", "prompt tok/s", "{:.1f}"),
    ("decode_tokens_per_s", "decode tok/s", "{:.1f}"),
]


def _shown(rows: list[dict]) -> list[dict]:
    """Rows for the tables: the spread as a percentage, or "-" where one run gives none."""
    return [{**r, "spread": "-" if r["spread"] is None else f"{r['spread']:.0%}"} for r in rows]


def table(result: dict) -> str:
    return text_table(_shown(result["rows"]), COLUMNS)


def write(result: dict, out_dir: Path, plots: bool = True) -> list[Path]:
    """grid.json, grid.csv, report.md and (with matplotlib) the PNG plots; returns the paths."""
    out_dir.mkdir(parents=True, exist_ok=True)
    files = [out_dir / "grid.json", out_dir / "grid.csv", out_dir / "report.md"]
    write_json(files[0], result)
    write_csv(files[1], result["rows"])
    pngs = []
    if plots:
        from diffuse.bench import plots as plotting
        pngs = plotting.grid_plots(result, out_dir)
    write_atomic(files[2], report(result, [p.name for p in pngs]).encode())
    return files + pngs


def report(result: dict, pngs: list[str]) -> str:
    m, axes = result["machine"], result["axes"]
    lines = [
        "# diffuse bench grid",
        "",
        f"Machine: {machine.describe_line(m)}. Threads used: {', '.join(map(str, axes['threads']))}.",
        f"Grid: models {', '.join(os.path.basename(p) for p in axes['models'])}; steps {axes['steps']}; "
        f"schedulers {axes['schedulers']}; cache {axes['cache']}; B {axes['gen_lengths']}; "
        f"prompts {[PAPER_PROMPTS[i][0] for i in axes['prompts']]}. "
        f"Median of {result['reps']} run(s) after a warm-up; spread = (max - min) / median.",
        "",
        md_table(_shown(result["rows"]), COLUMNS),
    ]
    if result["ar"]:
        lines += ["## Autoregressive baseline", "", md_table(result["ar"], AR_COLUMNS)]
    lines += ["## Roofline", "", roofline.markdown(result["roofline"]), roofline.verdict(result)]
    if pngs:
        lines += ["## Plots", ""] + [f"![{p}]({p})" for p in pngs]
    return "\n".join(lines) + "\n"
