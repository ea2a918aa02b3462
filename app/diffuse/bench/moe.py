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

import numpy as np

from diffuse.bench import forward
from diffuse.bench.attention import write_random_llada
from diffuse.bench.llama_ref import LlamaBins, find_bins

MOE_WIDE = dict(n_embd=2048, n_head=16, n_expert=64, n_expert_used=8, n_ff_exp=1024, n_vocab=32000, n_ctx=8192)


def write_random_llada_moe(path: Path, n_layer: int, n_embd: int, n_head: int, n_expert: int, n_expert_used: int,
                           n_ff_exp: int, n_vocab: int, n_ctx: int) -> Path:
    """A llama.cpp `llada-moe` GGUF of the given shape with random F16 matrices (F32 router and
    norms) and no tokenizer (tokenizer.ggml.model "none", which llama.cpp accepts)."""
    from diffuse.gguf_file import OutTensor, write

    d, f, e, v = n_embd, n_ff_exp, n_expert, n_vocab
    F16, F32 = 1, 0
    a = "llada-moe"
    kv = {"general.architecture": a, "general.file_type": 1, f"{a}.context_length": n_ctx,
          f"{a}.embedding_length": d, f"{a}.block_count": n_layer, f"{a}.feed_forward_length": n_expert_used * f,
          f"{a}.attention.head_count": n_head, f"{a}.attention.head_count_kv": n_head,
          f"{a}.rope.freq_base": 50000.0, f"{a}.attention.layer_norm_rms_epsilon": 1e-5,
          f"{a}.expert_count": e, f"{a}.expert_used_count": n_expert_used, f"{a}.expert_feed_forward_length": f,
          f"{a}.vocab_size": v, "tokenizer.ggml.model": "none", "tokenizer.ggml.mask_token_id": v - 1}
    types = {k: "str" if isinstance(val, str) else "f32" if isinstance(val, float) else "u32" for k, val in kv.items()}
    hd = d // n_head
    layer = {"attn_norm.weight": (d,), "attn_q.weight": (d, d), "attn_k.weight": (d, d), "attn_v.weight": (d, d),
             "attn_output.weight": (d, d), "attn_q_norm.weight": (hd,), "attn_k_norm.weight": (hd,),
             "ffn_norm.weight": (d,), "ffn_gate_inp.weight": (d, e), "ffn_gate_exps.weight": (d, f, e),
             "ffn_up_exps.weight": (d, f, e), "ffn_down_exps.weight": (f, d, e)}
    shapes = {"token_embd.weight": (d, v), "output_norm.weight": (d,), "output.weight": (d, v)}
    shapes.update({f"blk.{i}.{name}": shape for i in range(n_layer) for name, shape in layer.items()})
    f32 = lambda name, shape: len(shape) == 1 or name.endswith("ffn_gate_inp.weight")   # noqa: E731
    tensors = [OutTensor(n, F32 if f32(n, s) else F16, s) for n, s in shapes.items()]
    rng = np.random.default_rng(0)

    def data():
        for t in tensors:
            if len(t.shape) == 1:
                yield np.ones(t.shape, np.float32)
            else:
                x = rng.standard_normal(t.shape[::-1], np.float32) / np.float32(np.sqrt(t.shape[0]))
                yield x if t.type == F32 else x.astype(np.float16)

    path.parent.mkdir(parents=True, exist_ok=True)
    write(path, kv, types, tensors, data())
    return path


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
