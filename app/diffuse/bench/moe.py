"""Mixture of experts: a forward pass of an LLaDA-MoE-shaped model against llama.cpp's prompt
processing of the same file, and a dense LLaDA model with the same active parameters for scale.

The MoE model has LLaDA-MoE-7B-A1B's layer widths (d 2048, 16 heads, 64 experts of width 1024,
top 8, q/k norms) with random F16 weights and a 32000-token vocabulary; the dense one the same
attention and one SwiGLU of width 8 x 1024 = 8192, so both multiply the same weights per
position (67M per layer) while the MoE model holds 6.3x more. A few layers stand for 16: the
cost per layer is what is compared.

    python -m diffuse.bench.moe [--layers 2] [--tokens 64,256] [--threads 2] [--dest DIR] [--llama-bin DIR]
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

from diffuse.bench import forward
from diffuse.bench.llama_ref import LlamaBins, find_bins
from diffuse.bench.random_models import write_random_llada, write_random_llada_moe

MOE_WIDE = dict(n_embd=2048, n_head=16, n_expert=64, n_expert_used=8, n_ff_exp=1024, n_vocab=32000, n_ctx=8192)


def with_null_vocab(src: Path, out: Path) -> Path:
    """A copy of a tokenizer-less GGUF that llama.cpp loads: tokenizer.ggml.model "none" and the
    vocabulary size (llama-bench then draws random ids)."""
    from diffuse import gguf_file

    info = gguf_file.read(src)
    kv, types = dict(info.kv), dict(info.kv_types)
    arch = kv["general.architecture"]
    kv["tokenizer.ggml.model"], types["tokenizer.ggml.model"] = "none", "str"
    kv[f"{arch}.vocab_size"], types[f"{arch}.vocab_size"] = info.tensor("token_embd.weight").shape[1], "u32"
    gguf_file.write(out, kv, types, [gguf_file.OutTensor(t.name, t.type, t.shape) for t in info.tensors],
                    (t.raw() for t in info.tensors))
    return out


def models(dest: Path, n_layer: int) -> dict[str, Path]:
    """The MoE model and its dense twin (same active parameters), written once."""
    moe = dest / f"llada-moe-wide-{n_layer}l-f16.gguf"
    dense = dest / f"llada-dense-equal-active-{n_layer}l-f16.gguf"
    w = MOE_WIDE
    if not moe.exists():
        write_random_llada_moe(moe, n_layer, **w)
    if not dense.exists():
        bare = dest / "dense-no-vocab.gguf"
        write_random_llada(bare, n_layer, n_embd=w["n_embd"], n_head=w["n_head"],
                           n_ff=w["n_expert_used"] * w["n_ff_exp"], n_vocab=w["n_vocab"], n_ctx=w["n_ctx"])
        with_null_vocab(bare, dense)
        bare.unlink()
    return {"moe": moe, "dense": dense}


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--tokens", default="64,256")
    ap.add_argument("--threads", default="2")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--dest", type=Path, default=Path("/tmp/diffuse-bench-moe"))
    ap.add_argument("--llama-bin", default=None)
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args(argv)
    tokens = [int(t) for t in args.tokens.split(",")]
    threads = [int(t) for t in args.threads.split(",")]
    # llama-bench only: llama-diffusion-cli needs a tokenizer, which these files do not carry.
    llama = LlamaBins(find_bins(args.llama_bin).bench, None)
    results = {}
    for name, path in models(args.dest, args.layers).items():
        print(f"## {name}: {path.name}")
        results[name] = forward.run(str(path), tokens, threads, reps=args.reps, ceiling=False, llama=llama)
    print("\n| model | tokens | threads | ours ms | llama.cpp pp ms | ours/pp |")
    print("|---|---|---|---|---|---|")
    for name, res in results.items():
        for r in res["rows"]:
            pp = r.get("llama_pp_ms")
            print(f"| {name} | {r['tokens']} | {r['threads']} | {r['ms']:.1f} | "
                  f"{'-' if pp is None else f'{pp:.1f}'} | {r.get('ratio_vs_pp', float('nan')):.2f} |")
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
