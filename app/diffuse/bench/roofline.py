"""The roofline: where a workload sits between the machine's memory and compute ceilings.

Arithmetic intensity (AI) = FLOPs per byte of weights read. An AR decode step reads every weight
for one token (AI ~ 2 / bytes per weight, ~4 for Q4); a diffusion step reads them once for B
positions (AI ~ 2B / bytes per weight). Attainable GFLOP/s = min(compute ceiling, AI x bandwidth).
The compute ceiling is ggml's own mat-mul at the model's shapes and weight types; the memory
ceiling is a measured memory copy (bytes read + written per second).
"""
from __future__ import annotations

from diffuse.bench import cost, machine
from diffuse.bench.tables import md_table


def diffusion_point(label: str, mms: list[cost.MatMul], hp: dict, n_tokens: int, threads: int, ms: float) -> dict:
    """A full forward pass of n_tokens (every position's logits) that took `ms`."""
    flops = cost.forward_flops(mms, hp, n_tokens)["total"]
    wbytes = cost.weight_bytes(mms)
    return {"kind": "diffusion step", "label": label, "threads": threads, "tokens": n_tokens,
            "ai": flops / wbytes, "gflops": flops / ms / 1e6, "gbps": wbytes / ms / 1e6}


def ar_points(label: str, mms: list[cost.MatMul], ar: dict, threads: int) -> list[dict]:
    """AR decode (one token per pass) and AR prompt processing (n_prompt tokens, head on the last)."""
    params = sum(mm.params for mm in mms)
    head = cost.head(mms).params
    wbytes = cost.weight_bytes(mms)
    n = ar["n_prompt"]
    per_pass = {"AR decode": (2.0 * params, 1.0 / ar["decode_tokens_per_s"]),
                "AR prompt": (2.0 * ((params - head) * n + head), n / ar["prompt_tokens_per_s"])}
    return [{"kind": kind, "label": label, "threads": threads, "tokens": 1 if kind == "AR decode" else n,
             "ai": flops / wbytes, "gflops": flops / s / 1e9, "gbps": wbytes / s / 1e9}
            for kind, (flops, s) in per_pass.items()]


def measure_roof(label: str, mms: list[cost.MatMul], threads: int, n_tokens: int) -> dict:
    """The ceilings of one model's weights at `threads`: memory-copy GB/s, and ggml's mat-mul
    GFLOP/s on its products at n_tokens columns (the compute ceiling depends on the weight types)."""
    return {"label": label, "threads": threads, "memcpy_gbps": machine.memcpy_gbps(threads),
            "matmul_gflops": cost.matmul_ceiling(mms, n_tokens, threads)["gflops"], "matmul_tokens": n_tokens}


def attainable(point: dict, roof: dict) -> tuple[float, str]:
    """(attainable GFLOP/s, 'memory' or 'compute') for a point under a roof."""
    mem = point["ai"] * roof["memcpy_gbps"]
    return (mem, "memory") if mem < roof["matmul_gflops"] else (roof["matmul_gflops"], "compute")


COLUMNS = [
    ("kind", "workload", "{}"), ("label", "model", "{}"), ("threads", "threads", "{:d}"),
    ("tokens", "tokens/pass", "{:d}"), ("ai", "FLOP/byte", "{:.1f}"), ("gflops", "GFLOP/s", "{:.1f}"),
    ("gbps", "weight GB/s", "{:.1f}"), ("bound", "bound by", "{}"), ("of_roof", "of roof", "{:.0%}"),
]
ROOF_COLUMNS = [
    ("label", "weights of", "{}"), ("threads", "threads", "{:d}"), ("memcpy_gbps", "memory copy GB/s", "{:.1f}"),
    ("matmul_gflops", "ggml mat-mul GFLOP/s", "{:.1f}"), ("matmul_tokens", "at tokens", "{:d}"),
]


def annotated(roof: dict) -> list[dict]:
    by_key = {(r["label"], r["threads"]): r for r in roof["roofs"]}
    rows = []
    for p in roof["points"]:
        r = by_key.get((p["label"], p["threads"]))
        if r is None:
            continue
        att, bound = attainable(p, r)
        rows.append({**p, "bound": bound, "of_roof": p["gflops"] / att})
    return rows


def markdown(roof: dict) -> str:
    return md_table(roof["roofs"], ROOF_COLUMNS) + "\n" + md_table(annotated(roof), COLUMNS)


def verdict(result: dict) -> str:
    """Where diffusion wins and loses against AR decoding, per thread count, from the grid's own
    numbers: buffer tok/s (every generated position) and useful tok/s (before end-of-text)."""
    if not result["ar"]:
        return "No AR baseline in this run (pass --ar-model).\n"
    lines = []
    for a in result["ar"]:
        t, dec = a["threads"], a["decode_tokens_per_s"]
        rows = [r for r in result["rows"] if r["threads"] == t]
        best = max(rows, key=lambda r: r["buffer_tok_s"])
        lines.append(
            f"- {t} thread(s): AR decodes {dec:.1f} tok/s. Diffusion is faster in buffer tok/s in "
            f"{sum(r['buffer_tok_s'] > dec for r in rows)} of {len(rows)} configurations and in useful tok/s "
            f"in {sum(r['useful_tok_s'] > dec for r in rows)}; the fastest is {best['buffer_tok_s']:.1f} buffer tok/s "
            f"({best['scheduler']}, cache {'on' if best['cache'] else 'off'}, B={best['gen_length']}, "
            f"{best['steps_used']} steps, prompt {best['prompt']}).")
    return "\n".join(lines) + "\n"
