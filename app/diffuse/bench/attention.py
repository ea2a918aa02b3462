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
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from diffuse.bench import machine

CONFIGS = {
    "flash, F16 K/V (default)": dict(flash_attn=True, kv_f16=True),
    "flash, F32 K/V": dict(flash_attn=True, kv_f16=False),
    "no flash, F32 K/V (before)": dict(flash_attn=False, kv_f16=False),
}
WIDE = dict(n_embd=4096, n_head=32, n_ff=12288, n_vocab=32000, n_ctx=4096)


def write_random_llada(path: Path, n_layer: int, n_embd: int, n_head: int, n_ff: int, n_vocab: int,
                       n_ctx: int) -> Path:
    """A LLaDA GGUF of the given shape with random F16 matrices (llama.cpp dialect keys, no
    tokenizer): for measurements, and for tests of shapes no checkpoint fixture has."""
    from diffuse.gguf_file import OutTensor, write

    d, f, v = n_embd, n_ff, n_vocab
    F16, F32 = 1, 0
    kv = {"general.architecture": "llada", "general.file_type": 1, "llada.context_length": n_ctx,
          "llada.embedding_length": d, "llada.block_count": n_layer, "llada.feed_forward_length": f,
          "llada.attention.head_count": n_head, "llada.attention.head_count_kv": n_head,
          "llada.rope.freq_base": 500000.0, "llada.attention.layer_norm_rms_epsilon": 1e-5,
          "tokenizer.ggml.mask_token_id": v - 1}
    types = {k: "str" if isinstance(val, str) else "f32" if isinstance(val, float) else "u32" for k, val in kv.items()}
    layer = {"attn_norm.weight": (d,), "attn_q.weight": (d, d), "attn_k.weight": (d, d), "attn_v.weight": (d, d),
             "attn_output.weight": (d, d), "ffn_norm.weight": (d,), "ffn_gate.weight": (d, f),
             "ffn_up.weight": (d, f), "ffn_down.weight": (f, d)}
    shapes = {"token_embd.weight": (d, v), "output_norm.weight": (d,), "output.weight": (d, v)}
    shapes.update({f"blk.{i}.{name}": shape for i in range(n_layer) for name, shape in layer.items()})
    tensors = [OutTensor(n, F32 if len(s) == 1 else F16, s) for n, s in shapes.items()]
    rng = np.random.default_rng(0)

    def data():
        for t in tensors:
            if len(t.shape) == 1:
                yield np.ones(t.shape, np.float32)
            else:
                yield (rng.standard_normal(t.shape[::-1], np.float32) / np.sqrt(t.shape[0])).astype(np.float16)

    path.parent.mkdir(parents=True, exist_ok=True)
    write(path, kv, types, tensors, data())
    return path


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
            code = (f"import json,sys; from diffuse.bench.attention import measure; "
                    f"print(json.dumps(measure({str(path)!r}, {n - gen}, {gen}, {cfg!r}, {threads}, {steps})))")
            out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
            if out.returncode != 0:
                rows.append({"name": name, "prompt": n - gen, "error": out.stderr.strip().splitlines()[-1]})
            else:
                rows.append({"name": name, **json.loads(out.stdout), "file_bytes": path.stat().st_size})
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
