"""`diffuse bench forward`: the cost of one forward pass (one denoising step without cache).

For each token count and thread count: ms per forward (median of reps after a warm-up), tokens/s,
achieved GFLOP/s, and ggml's own mat-mul at the model's shapes and weight types as the ceiling.
With llama.cpp's programs at hand, the same token count through llama.cpp's prompt processing
(`llama-bench -p N -n 0`, logits of the last row only) and llama-diffusion-cli's ms/step (logits
of every row, like ours) run side by side, configuration by configuration.
Peak RSS is read after loading and after the forward passes, next to the file size.
"""
from __future__ import annotations

import os
import time

import numpy as np

import diffuse
from diffuse.bench import cost, machine
from diffuse.bench.llama_ref import LlamaBins, diffusion_step_ms, llama_bench
from diffuse.bench.tables import md_table


def time_forward(model, ids: np.ndarray, reps: int) -> list[float]:
    """Wall ms of `reps` forward passes after one warm-up (graph planning, page faults)."""
    model.forward(ids)
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        model.forward(ids)
        times.append((time.perf_counter() - t0) * 1000.0)
    return times


def run(path: str, tokens: list[int], threads: list[int], reps: int = 3, ceiling: bool = True,
        llama: LlamaBins | None = None, flash_attn_too: bool = False, log=print) -> dict:
    """Measure; returns {machine, model, memory, rows}. `log` gets one line per configuration."""
    rss_start = machine.rss_bytes()
    model = diffuse.load(path, threads=threads[0])
    memory = {"file_bytes": os.path.getsize(path), "weights_bytes": model.weights_bytes,
              "rss_before_load": rss_start, "peak_rss_after_load": machine.peak_rss_bytes()}
    hp = model.hparams
    mms = cost.matmuls(path)
    rng = np.random.default_rng(0)
    batches = {n: rng.integers(0, model.n_vocab, size=n).astype(np.int32) for n in tokens}
    # One pass per size before anything else allocates: the peak RSS of forward passes alone.
    for ids in batches.values():
        model.forward(ids)
    memory["peak_rss_after_forward"] = machine.peak_rss_bytes()
    rows = []
    for n, ids in batches.items():
        flops = cost.forward_flops(mms, hp, n)
        for t in threads:
            model.threads = t
            ms = time_forward(model, ids, reps)
            med = float(np.median(ms))
            row = {"tokens": n, "threads": t, "ms": med, "ms_min": min(ms), "ms_max": max(ms),
                   "tokens_per_s": n / med * 1000.0, "gflops": flops["total"] / med / 1e6,
                   "gbps_weights": cost.weight_bytes(mms) / med / 1e6}
            if ceiling:
                c = cost.matmul_ceiling(mms, n, t)
                row.update(ceiling_ms=c["seconds"] * 1000.0, ceiling_gflops=c["gflops"])
            if llama is not None and llama.bench is not None:
                pp = llama_bench(llama.bench, path, n_prompt=n, n_gen=0, threads=t, reps=reps)
                row.update(llama_pp_ms=pp["ms"], llama_pp_ms_min=pp["ms_min"], ratio_vs_pp=med / pp["ms"])
                if flash_attn_too:
                    fa = llama_bench(llama.bench, path, n_prompt=n, n_gen=0, threads=t, reps=reps, flash_attn=True)
                    row.update(llama_pp_fa_ms=fa["ms"], ratio_vs_pp_fa=med / fa["ms"])
            if llama is not None and llama.diffusion is not None:
                d = diffusion_step_ms(llama.diffusion, path, n_positions=n, threads=t)
                row.update(llama_step_ms=d["ms_per_step"], llama_step_sampling_ms=d["sampling_ms_per_step"],
                           ratio_vs_llama_step=med / d["ms_per_step"])
            rows.append(row)
            log(format_row(row))
    info = {"path": path, "arch": model.arch, "n_layer": hp["n_layer"], "n_embd": hp["n_embd"],
            "n_vocab": model.n_vocab, "params_in_matmuls": sum(mm.params for mm in mms),
            "weight_types": cost.type_mix(mms)}
    return {"machine": machine.describe(), "model": info, "memory": memory, "reps": reps, "rows": rows}


COLUMNS = [  # (key, header, format)
    ("tokens", "tokens", "{:d}"), ("threads", "threads", "{:d}"), ("ms", "ms/forward", "{:.1f}"),
    ("tokens_per_s", "tok/s", "{:.1f}"), ("gflops", "GFLOP/s", "{:.1f}"),
    ("ceiling_ms", "ggml matmul ms", "{:.1f}"), ("ceiling_gflops", "ggml matmul GFLOP/s", "{:.1f}"),
    ("llama_pp_ms", "llama.cpp pp ms", "{:.1f}"), ("ratio_vs_pp", "ours/pp", "{:.2f}"),
    ("llama_pp_fa_ms", "pp (flash) ms", "{:.1f}"), ("ratio_vs_pp_fa", "ours/pp flash", "{:.2f}"),
    ("llama_step_ms", "llama-diffusion ms/step", "{:.1f}"), ("ratio_vs_llama_step", "ours/step", "{:.2f}"),
]


def format_row(row: dict) -> str:
    return "  ".join(f"{h} {fmt.format(row[k])}" for k, h, fmt in COLUMNS if k in row)


def header(result: dict) -> str:
    """Model, machine and memory lines that go above the table."""
    mem, mod = result["memory"], result["model"]
    return "\n".join([
        f"Model: `{os.path.basename(mod['path'])}` ({mod['arch']}, {mod['n_layer']} layers, "
        f"{mod['params_in_matmuls'] / 1e6:.0f}M params in mat-muls; {mod['weight_types']})",
        f"Machine: {machine.describe_line(result['machine'])}; median of {result['reps']} runs after a warm-up",
        f"Memory: file {mem['file_bytes'] / 2**20:.0f} MiB; peak RSS {mem['peak_rss_after_load'] / 2**20:.0f} MiB "
        f"after load, {mem['peak_rss_after_forward'] / 2**20:.0f} MiB after the forward passes "
        f"(process at start {mem['rss_before_load'] / 2**20:.0f} MiB)",
    ]) + "\n"


def markdown(result: dict) -> str:
    return header(result) + "\n" + md_table(result["rows"], COLUMNS)
