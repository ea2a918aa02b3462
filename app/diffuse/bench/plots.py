"""PNG plots of a grid result and of the study's report (matplotlib, the optional extra `diffuse[bench]`)."""
from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np

from diffuse.bench import roofline


def available() -> bool:
    return importlib.util.find_spec("matplotlib") is not None


def _pyplot():
    import matplotlib
    matplotlib.use("Agg")           # files only, no display
    import matplotlib.pyplot as plt
    return plt


def _save(fig, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    _pyplot().close(fig)
    return path


def _quant(model_label: str) -> str:
    """'name [Q4_K_M]' -> 'Q4_K_M', to keep legends short."""
    return model_label.rsplit("[", 1)[-1].rstrip("]")


def _where(rows: list[dict], **eq) -> list[dict]:
    return [r for r in rows if all(r[k] == v for k, v in eq.items())]


def thread_scaling(result: dict, path: Path) -> Path:
    """Buffer tok/s against threads (left) and the speedup over 1 thread (right), per model /
    scheduler / cache, at the largest B and step budget; AR decode beside them."""
    plt = _pyplot()
    rows, axes = result["rows"], result["axes"]
    fixed = {"gen_length": max(axes["gen_lengths"]), "steps": max(axes["steps"])}
    fig, (ax, ax2) = plt.subplots(1, 2, figsize=(10, 4))
    for model in dict.fromkeys(r["model"] for r in rows):
        for sched in axes["schedulers"]:
            for cache_on in axes["cache"]:
                sel = _where(rows, model=model, scheduler=sched, cache=cache_on, **fixed)
                threads = sorted({r["threads"] for r in sel})
                tps = [np.mean([r["buffer_tok_s"] for r in sel if r["threads"] == t]) for t in threads]
                name = f"{_quant(model)} {sched}{' cache' if cache_on else ''}"
                ax.plot(threads, tps, marker="o", label=name)
                ax2.plot(threads, np.array(tps) / tps[0], marker="o", label=name)
    if result["ar"]:
        threads = [a["threads"] for a in result["ar"]]
        dec = [a["decode_tokens_per_s"] for a in result["ar"]]
        ax.plot(threads, dec, "k--", marker="s", label="AR decode")
        ax2.plot(threads, np.array(dec) / dec[0], "k--", marker="s", label="AR decode")
    for a in (ax, ax2):
        a.set_xticks(axes["threads"])
    ax.set(xlabel="threads", ylabel="tokens/s (buffer)", title=f"Thread scaling (B={fixed['gen_length']})")
    ax2.set(xlabel="threads", ylabel="speedup over 1 thread", title="Normalised")
    ax.legend(fontsize=7)
    return _save(fig, path)


def step_cost(result: dict, path: Path) -> Path:
    """Mean ms per step against the generation length, per threads and cache setting."""
    plt = _pyplot()
    rows, axes = result["rows"], result["axes"]
    fig, ax = plt.subplots(figsize=(6, 4))
    for t in axes["threads"]:
        for cache_on in axes["cache"]:
            sel = _where(rows, threads=t, cache=cache_on)
            gens = sorted({r["gen_length"] for r in sel})
            ms = [np.median([r["step_ms"] for r in sel if r["gen_length"] == g]) for g in gens]
            ax.plot(gens, ms, marker="o", label=f"{t} thread(s), cache {'on' if cache_on else 'off'}")
    ax.set(xlabel="generation length B", ylabel="ms per step (median)", title="Per-step cost vs generation length")
    ax.legend(fontsize=8)
    return _save(fig, path)


def _bars(ax, groups: list[str], series: dict[str, list[float]]):
    width = 0.8 / max(len(series), 1)
    x = np.arange(len(groups))
    for i, (name, values) in enumerate(series.items()):
        ax.bar(x + i * width, values, width, label=name)
    ax.set_xticks(x + width * (len(series) - 1) / 2, groups, rotation=20)
    ax.legend(fontsize=8)


def steps_per_prompt(result: dict, path: Path) -> Path:
    """Steps used per prompt and scheduler, at the most threads, the largest B and budget."""
    plt = _pyplot()
    rows, axes = result["rows"], result["axes"]
    fixed = {"threads": max(axes["threads"]), "gen_length": max(axes["gen_lengths"]), "steps": max(axes["steps"])}
    prompts = list(dict.fromkeys(r["prompt"] for r in rows))
    series = {f"{s}{' cache' if c else ''}": [np.median([r["steps_used"] for r in _where(rows, scheduler=s, cache=c,
                                                          prompt=p, **fixed)] or [0]) for p in prompts]
              for s in axes["schedulers"] for c in axes["cache"]}
    fig, ax = plt.subplots(figsize=(7, 4))
    _bars(ax, prompts, series)
    ax.axhline(fixed["steps"], color="gray", linestyle=":")
    ax.set(ylabel="steps used", title=f"Steps used per prompt (budget {fixed['steps']}, B={fixed['gen_length']})")
    return _save(fig, path)


def cache_speedup(result: dict, path: Path) -> Path:
    """Uncached / cached total time per prompt and scheduler (needs both cache settings)."""
    plt = _pyplot()
    rows, axes = result["rows"], result["axes"]
    fixed = {"threads": max(axes["threads"]), "gen_length": max(axes["gen_lengths"]), "steps": max(axes["steps"])}
    prompts = list(dict.fromkeys(r["prompt"] for r in rows))
    series = {}
    for s in axes["schedulers"]:
        vals = []
        for p in prompts:
            off = _where(rows, scheduler=s, cache=False, prompt=p, **fixed)
            on = _where(rows, scheduler=s, cache=True, prompt=p, **fixed)
            vals.append(off[0]["total_ms"] / on[0]["total_ms"] if off and on else 0.0)
        series[s] = vals
    fig, ax = plt.subplots(figsize=(7, 4))
    _bars(ax, prompts, series)
    ax.axhline(1.0, color="gray", linestyle=":")
    ax.set(ylabel="speedup (no cache / cache)", title=f"Inter-step cache speedup ({fixed['threads']} threads)")
    return _save(fig, path)


def roofline_plot(result: dict, path: Path) -> Path:
    """Log-log roofline: ceilings per thread count and the measured workloads under them."""
    plt = _pyplot()
    roof = result["roofline"]
    fig, ax = plt.subplots(figsize=(7, 5))
    ai = np.logspace(-0.5, 3.5, 200)
    colour = {}
    for r in roof["roofs"]:
        (line,) = ax.plot(ai, np.minimum(ai * r["memcpy_gbps"], r["matmul_gflops"]), linestyle="--",
                          label=f"roof {_quant(r['label'])}, {r['threads']}t: {r['memcpy_gbps']:.0f} GB/s, "
                                f"{r['matmul_gflops']:.0f} GFLOP/s")
        colour[r["label"], r["threads"]] = line.get_color()
    markers = {"diffusion step": "o", "AR decode": "s", "AR prompt": "^"}
    for p in roofline.annotated(roof):
        ax.scatter(p["ai"], p["gflops"], marker=markers.get(p["kind"], "x"), color=colour[p["label"], p["threads"]],
                   zorder=3)
    for kind, marker in markers.items():     # legend entries for the point shapes
        ax.scatter([], [], marker=marker, color="gray", label=kind)
    ax.set(xscale="log", yscale="log", xlabel="arithmetic intensity (FLOP / weight byte)", ylabel="GFLOP/s",
           title="Roofline: AR decode vs diffusion step (colour = weights and threads)")
    ax.legend(fontsize=7, loc="lower right")
    return _save(fig, path)


def grid_plots(result: dict, out_dir: Path) -> list[Path]:
    plots = [thread_scaling(result, out_dir / "thread_scaling.png"),
             step_cost(result, out_dir / "step_cost_vs_gen_length.png"),
             steps_per_prompt(result, out_dir / "steps_per_prompt.png")]
    if len(result["axes"]["cache"]) == 2:
        plots.append(cache_speedup(result, out_dir / "cache_speedup.png"))
    plots.append(roofline_plot(result, out_dir / "roofline.png"))
    return plots


def waterfall(stages: list[tuple[str, float]], ar: float | None, path: Path) -> Path:
    """The paper's Fig. 3: tok/s after each optimisation, the speed-up over the first stage on top."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(8, 4))
    labels, values = zip(*stages)
    bars = ax.bar(range(len(values)), values, color="tab:blue")
    for bar, v in zip(bars, values):
        ax.annotate(f"{v / values[0]:.1f}x", (bar.get_x() + bar.get_width() / 2, v), ha="center", va="bottom")
    if ar:
        ax.axhline(ar, color="k", linestyle="--", label=f"llama.cpp AR decode {ar:.1f} tok/s")
        ax.legend(fontsize=8)
    ax.set_xticks(range(len(labels)), labels, rotation=15, fontsize=8)
    ax.set(ylabel="tokens/s (buffer)", title="Optimisations combined (paper Fig. 3)")
    return _save(fig, path)


def batch_plot(rows: list[dict], path: Path) -> Path:
    """Throughput against batch size per engine (left) and over its B=1 value (right)."""
    plt = _pyplot()
    fig, (ax, ax2) = plt.subplots(1, 2, figsize=(10, 4))
    for engine, style in (("diffusion", "o-"), ("ar", "s--")):
        sel = sorted((r for r in rows if r["engine"] == engine), key=lambda r: r["batch"])
        if sel:
            b = [r["batch"] for r in sel]
            ax.plot(b, [r["tokens_per_s"] for r in sel], style, label=engine)
            ax2.plot(b, [r["gain"] for r in sel], style, label=engine)
    for a in (ax, ax2):
        a.set_xscale("log", base=2)
        a.set_xlabel("batch size")
        a.legend(fontsize=8)
    ax.set(ylabel="tokens/s", title="Batched throughput")
    ax2.set(ylabel="over batch 1", title="Gain from batching")
    return _save(fig, path)


def context_plot(rows: list[dict], path: Path) -> Path:
    """ms per step, peak RSS and arithmetic intensity against length, full vs block-wise."""
    plt = _pyplot()
    fig, axes = plt.subplots(1, 3, figsize=(13, 4))
    for mode, style in (("full", "o-"), ("blockwise", "s--")):
        sel = sorted((r for r in rows if r["mode"] == mode), key=lambda r: r["length"])
        n = [r["length"] for r in sel]
        axes[0].plot(n, [r["ms_per_step"] for r in sel], style, label=mode)
        axes[1].plot(n, [r["peak_rss_bytes"] / 2**20 for r in sel], style, label=mode)
        axes[2].plot(n, [r["arithmetic_intensity"] for r in sel], style, label=mode)
    for a, (ylabel, title) in zip(axes, [("ms per step", "Step time"), ("peak RSS MiB", "Memory"),
                                         ("FLOP / byte", "Arithmetic intensity")]):
        a.set(xscale="log", xlabel="generated positions L", ylabel=ylabel, title=title)
        a.legend(fontsize=8)
    axes[0].set_yscale("log")
    return _save(fig, path)


def steps_plot(rows: list[dict], path: Path) -> Path:
    """Latency and agreement with the many-step answer against the step budget, per scheduler."""
    plt = _pyplot()
    fig, (ax, ax2) = plt.subplots(1, 2, figsize=(10, 4))
    for sched in dict.fromkeys(r["scheduler"] for r in rows):
        sel = sorted((r for r in rows if r["scheduler"] == sched), key=lambda r: r["steps"])
        b = [r["steps"] for r in sel]
        ax.plot(b, [r["ms"] for r in sel], "o-", label=sched)
        ax2.plot(b, [r["agreement"] for r in sel], "o-", label=f"{sched}: agreement")
        if all("heldout_accuracy" in r for r in sel):
            ax2.plot(b, [r["heldout_accuracy"] for r in sel], "s:", label=f"{sched}: held-out accuracy")
    for a in (ax, ax2):
        a.set_xscale("log", base=2)
        a.set_xlabel("step budget")
        a.legend(fontsize=8)
    ax.set(ylabel="ms per answer", title="Latency")
    ax2.set(ylabel="fraction of tokens", ylim=(0, 1.05), title="Quality proxy")
    return _save(fig, path)


def study_plots(data: dict, stages: list[tuple[str, float]], ar: float | None, out_dir: Path) -> list[Path]:
    """The report's plots, for the measurements the folder has; `ar`: AR decode tok/s for Fig. 3."""
    from diffuse.bench import batch
    out = []
    if len(stages) > 1:
        out.append(waterfall(stages, ar, out_dir / "fig3_waterfall.png"))
    rows = [r for _, records in data["batch"] for r in records]
    if rows:
        out.append(batch_plot(batch.with_gain(rows), out_dir / "batch.png"))
    rows = [r for _, records in data["context"] for r in records]
    if rows:
        out.append(context_plot(rows, out_dir / "context.png"))
    for i, (_, records) in enumerate(data["steps"]):
        out.append(steps_plot(records, out_dir / f"steps{i or ''}.png"))
    return out
