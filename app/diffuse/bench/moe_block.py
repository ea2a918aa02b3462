"""What the CPU makes of a MoE block (issue 23): LLaDA2-mini-shaped random weights at Q4_K_M, one
block-diffusion step over w new rows against llama.cpp's AR decode of the same file.

A block of 32 rows routes each row to 8 of 256 experts per layer, so one step may read most of the
16B weights while an AR decode token reads 8 experts per layer. For each width w (rows in the step)
this measures, on one file and in one run:

- ms per step (`_core.bench_block_step`: w new rows over `depth` cached rows, logits for every
  row), at each thread count; rounds alternate every configuration so all see the same load;
- experts touched per MoE layer by those same rows (the step's routing, which bench_block_step
  returns): the rows either distinct tokens (committed text, as in prefill) or all the mask token
  (a block's first step);
- bytes of weights a step reads: every non-expert matrix once (the embedding: w rows), plus the
  touched experts' gate/up/down slices at their stored types;
- useful tok/s at the published tokens per forward (2.60 LLaDA2.0-mini, 3.12 / 5.34 LLaDA2.1-mini
  Q / S mode) against AR decode: llama.cpp's `bailingmoe2` llama-bench tg on the same bytes (the
  file's header is relabelled in place, see `relabel`), and our own one-row step;
- whole runs of one block decoded whole and in sub-blocks of 8 (ms per step: each pass still
  covers the block's 32 rows).

The random file carries both key sets (llada2.* for diffuse, bailingmoe2.* for llama.cpp); only
general.architecture differs, and a padding key keeps the header the same length under either label,
so `relabel` rewrites a few hundred bytes and the 9 GB of weights are written (and cached) once.
Expert slices repeat a quantised pool of random rows (the bytes a step reads are what is measured;
the router, attention and shared expert are fully random), so routing is random-weight routing: a
trained router's spread may differ, which is why the experts touched are reported beside the times.

    python -m diffuse.bench.moe_block [--layers 20] [--depth 512] [--widths 1,2,4,8,16,32] [--threads 1,2]
                                      [--rounds 3] [--reps 2] [--mixes tokens,masks] [--llama-bin DIR]
                                      [--no-llama] [--no-sub-blocks] [--dest DIR] [--json OUT]
"""
from __future__ import annotations

import argparse
import json
import os
import struct
import time
from pathlib import Path

import numpy as np

from diffuse import DiffuseError

# LLaDA2.0/2.1-mini (config.json of inclusionAI/LLaDA2.1-mini; the converter's LLADA2 family).
MINI = dict(n_layer=20, n_embd=2048, n_head=16, n_head_kv=4, head_dim=128, n_expert=256, n_expert_used=8,
            n_ff_exp=512, n_expert_groups=8, n_group_used=4, n_expert_shared=1, n_layer_dense=1, n_ff=5120,
            n_vocab=157184, n_ctx=32768, rope_theta=600000.0, rope_factor=0.5, expert_scale=2.5, mask_id=156895)
# Tokens per forward pass published on the model cards.
PUBLISHED_TPF = {"LLaDA2.0-mini": 2.60, "LLaDA2.1-mini Q mode": 3.12, "LLaDA2.1-mini S mode": 5.34}
ARCHES = ("llada2", "bailingmoe2")
_PAD = "general.diffuse_pad"
_EXPERT_TENSORS = ("ffn_gate_exps.weight", "ffn_up_exps.weight", "ffn_down_exps.weight")


def _kv(n_layer: int, m: dict) -> dict:
    """Both label's keys (without the arch prefix: written once per label)."""
    return {"context_length": m["n_ctx"], "embedding_length": m["n_embd"], "block_count": n_layer,
            "feed_forward_length": m["n_ff"], "expert_count": m["n_expert"], "expert_used_count": m["n_expert_used"],
            "expert_feed_forward_length": m["n_ff_exp"], "leading_dense_block_count": m["n_layer_dense"],
            "expert_shared_count": m["n_expert_shared"], "expert_shared_feed_forward_length": m["n_ff_exp"],
            "expert_gating_func": 2, "expert_group_count": m["n_expert_groups"],
            "expert_group_used_count": m["n_group_used"], "expert_weights_norm": True,
            "expert_weights_scale": m["expert_scale"], "attention.head_count": m["n_head"],
            "attention.head_count_kv": m["n_head_kv"], "rope.freq_base": m["rope_theta"],
            "attention.layer_norm_rms_epsilon": 1e-6, "rope.dimension_count": int(m["head_dim"] * m["rope_factor"]),
            "vocab_size": m["n_vocab"], "attention.causal": False, "attention.key_length": m["head_dim"],
            "attention.value_length": m["head_dim"]}


def tensor_shapes(n_layer: int, m: dict = MINI) -> dict[str, tuple]:
    """GGUF name -> ggml shape (fastest dimension first), the converter's llada2 layout."""
    d, hd, e, f = m["n_embd"], m["head_dim"], m["n_expert"], m["n_ff_exp"]
    qkv = (m["n_head"] + 2 * m["n_head_kv"]) * hd
    shapes = {"token_embd.weight": (d, m["n_vocab"])}
    for i in range(n_layer):
        p = f"blk.{i}."
        shapes.update({p + "attn_norm.weight": (d,), p + "attn_qkv.weight": (d, qkv), p + "attn_q_norm.weight": (hd,),
                       p + "attn_k_norm.weight": (hd,), p + "attn_output.weight": (m["n_head"] * hd, d),
                       p + "ffn_norm.weight": (d,)})
        if i < m["n_layer_dense"]:
            shapes.update({p + "ffn_gate.weight": (d, m["n_ff"]), p + "ffn_up.weight": (d, m["n_ff"]),
                           p + "ffn_down.weight": (m["n_ff"], d)})
            continue
        sh = f * m["n_expert_shared"]
        shapes.update({p + "ffn_gate_inp.weight": (d, e), p + "exp_probs_b.bias": (e,),
                       p + "ffn_gate_exps.weight": (d, f, e), p + "ffn_up_exps.weight": (d, f, e),
                       p + "ffn_down_exps.weight": (f, d, e), p + "ffn_gate_shexp.weight": (d, sh),
                       p + "ffn_up_shexp.weight": (d, sh), p + "ffn_down_shexp.weight": (sh, d)})
    shapes.update({"output_norm.weight": (d,), "output.weight": (d, m["n_vocab"])})
    return shapes


def write_model(path: Path, n_layer: int = 20, m: dict = MINI, pool_rows: int = 4096, seed: int = 0) -> Path:
    """A random LLaDA2-mini-shaped GGUF in llama.cpp's Q4_K_M mixture (diffuse.quantize.tensor_type),
    labelled llada2. Matrices are N(0, 1/fan_in) rows quantised once per tensor; a tensor of more
    rows than `pool_rows` repeats its pool (experts, embedding, head). The router (F32) is random in
    full, the selection bias small random, norms ones."""
    from diffuse import _core
    from diffuse.gguf_file import OutTensor, write
    from diffuse.quantize import tensor_type

    shapes = tensor_shapes(n_layer, m)
    types = {n: int(tensor_type(n, s, "Q4_K_M", n_layer, True, m["n_expert"])) for n, s in shapes.items()}
    types.update({n: 0 for n in shapes if n.endswith(("ffn_gate_inp.weight", ".bias"))})
    tensors = [OutTensor(n, types[n], s) for n, s in shapes.items()]
    rng = np.random.default_rng(seed)

    def data():
        for t in tensors:
            if len(t.shape) == 1:
                yield (rng.standard_normal(t.shape, np.float32) * 0.01 if t.name.endswith(".bias")
                       else np.ones(t.shape, np.float32))
                continue
            cols, rows = t.shape[0], int(np.prod(t.shape[1:]))
            if t.type == 0:
                yield rng.standard_normal((rows, cols), np.float32) / np.float32(np.sqrt(cols))
                continue
            n = min(rows, pool_rows)
            pool = rng.standard_normal((n, cols), np.float32) / np.float32(np.sqrt(cols))
            q = np.asarray(_core.quantize_rows(pool, t.type), np.uint8).reshape(n, -1)
            reps = -(-rows // n)
            yield np.tile(q, (reps, 1))[:rows] if reps > 1 else q

    kv = {"general.architecture": ARCHES[0], _PAD: "", "general.name": f"random LLaDA2-mini shape, {n_layer} layers",
          "general.file_type": 15, "general.quantization_version": 2, "tokenizer.ggml.model": "none",
          "tokenizer.ggml.mask_token_id": m["mask_id"], "tokenizer.ggml.eos_token_id": 156892,
          "diffusion.block_size": 32, "diffusion.shift_logits": False}
    pad = max(len(a) for a in ARCHES) - len(ARCHES[0])
    kv[_PAD] = " " * pad
    for arch in ARCHES:
        kv.update({f"{arch}.{k}": v for k, v in _kv(n_layer, m).items()})
    kv_types = {k: "str" if isinstance(v, str) else "bool" if isinstance(v, bool) else
                "f32" if isinstance(v, float) else "u32" for k, v in kv.items()}
    path.parent.mkdir(parents=True, exist_ok=True)
    write(path, kv, kv_types, tensors, data())
    return path


def relabel(path: Path, arch: str) -> None:
    """Set general.architecture to `arch` in place: the architecture is the file's first key and
    the padding key right after it absorbs the length change, so nothing else moves."""
    if arch not in ARCHES:
        raise DiffuseError(f"relabel: {arch} is none of {ARCHES}")
    total = max(len(a) for a in ARCHES)
    with open(path, "r+b") as f:
        head = f.read(4096)
        if head[:4] != b"GGUF":
            raise DiffuseError(f"{path}: not a GGUF file")
        off = 24
        out = bytearray()
        for key, value in (("general.architecture", arch), (_PAD, " " * (total - len(arch)))):
            (klen,) = struct.unpack_from("<Q", head, off)
            if head[off + 8:off + 8 + klen].decode() != key:
                raise DiffuseError(f"{path}: not written by moe_block.write_model (key {key} not in place)")
            off2 = off + 8 + klen + 4
            (vlen,) = struct.unpack_from("<Q", head, off2)
            out += head[off:off + 8 + klen + 4] + struct.pack("<Q", len(value)) + value.encode()
            off = off2 + 8 + vlen
        if len(out) != off - 24:
            raise DiffuseError(f"{path}: the padding key does not fit {arch}")
        f.seek(24)
        f.write(out)


# ---- what a step reads ----

def weight_bytes(path: Path) -> dict:
    """Bytes of the file's weights by role: per MoE layer the bytes of one expert (gate+up+down),
    the always-read matrices (attention, dense FFN, shared expert, router, norms, output head) and
    the embedding's bytes per row."""
    from diffuse import gguf_file

    info = gguf_file.read(path)
    per_expert, fixed, emb_row, n_moe = {}, 0, 0, 0
    for t in info.tensors:
        nb = gguf_file.OutTensor(t.name, t.type, t.shape).nbytes
        if t.name == "token_embd.weight":
            emb_row = nb // t.shape[1]
        elif t.name.endswith(_EXPERT_TENSORS):
            layer = int(t.name.split(".")[1])
            per_expert[layer] = per_expert.get(layer, 0) + nb // t.shape[2]
        else:
            fixed += nb
    return {"per_expert": per_expert, "fixed": fixed, "embedding_row": emb_row, "file": path.stat().st_size}


def step_bytes(wb: dict, touched: dict[int, float], w: int) -> float:
    """Weight bytes one step of w rows reads, `touched` experts per MoE layer."""
    return wb["fixed"] + w * wb["embedding_row"] + sum(wb["per_expert"][il] * n for il, n in touched.items())


def touched_per_layer(experts: np.ndarray) -> dict[int, int]:
    """Distinct experts per MoE layer from (n_layer, rows, k) ids (-1: not routed)."""
    out = {}
    for il, ids in enumerate(experts):
        ids = ids[ids >= 0]
        if ids.size:
            out[il] = int(np.unique(ids).size)
    return out


def steps(model, depth: int, cases: list[tuple[int, int, int]], reps: int) -> list[tuple[list[float], dict[int, int]]]:
    """For each case (w, masked, threads), in order over one prefilled prompt of `depth` rows: ms of
    `reps` block steps of w rows (the last `masked` of them mask tokens), and the experts those rows
    touched per MoE layer."""
    from diffuse import _core
    hp = model.hparams
    out = []
    for (w, _, _), (ms, flat) in zip(cases, _core.bench_block_steps(model._core, depth, cases, reps=reps, routing=True)):
        experts = np.asarray(flat, np.int32).reshape(hp["n_layer"], w, hp["n_expert_used"])
        out.append((list(ms), touched_per_layer(experts)))
    return out


def sub_block_runs(model, depth: int, threads: int) -> list[dict]:
    """Whole runs (one block of 32, 8 steps of the dynamic rule), the block decoded whole and in
    sub-blocks of 8: each pass still covers the block's 32 rows, so ms per step should not move."""
    prompt = list(np.random.default_rng(1).integers(100, 150000, depth))
    out = []
    for sub in (0, 8):
        per_step = []

        def on_step(ev):
            if ev.experts is not None:
                t = touched_per_layer(np.asarray(ev.experts))
                per_step.append((len(ev.active), float(np.mean(list(t.values())))))

        opts = dict(block_length=32, steps=8, scheduler="low_confidence_dynamic", confidence_threshold=0.95)
        if sub:
            opts["sub_block_length"] = sub
        r = model.generate(prompt, gen_length=32, temperature=0, chat=False, threads=threads, on_step=on_step,
                           expert_routing=True, **opts)
        out.append({"sub_block": sub or 32, "steps": r.steps, "rows_per_step": float(np.mean([a for a, _ in per_step])),
                    "experts": float(np.mean([e for _, e in per_step])), "ms_min": float(np.min(r.step_ms)),
                    "ms_median": float(np.median(r.step_ms))})
    return out


MIXES = {"tokens": lambda w: 0, "masks": lambda w: w}   # the step's rows: distinct tokens, or all masks


def run(path: Path, depth: int, widths: list[int], threads: list[int], rounds: int, reps: int,
        llama_bin: str | None | bool, mixes: tuple[str, ...] = ("tokens", "masks"), sub_blocks: bool = True,
        log=print) -> dict:
    import diffuse
    from diffuse import _core
    from diffuse.bench import machine
    from diffuse.bench.llama_ref import find_bins, llama_bench

    relabel(path, "llada2")
    model = diffuse.load(str(path), threads=max(threads))
    wb = weight_bytes(path)
    log(f"file {wb['file'] / 1e9:.2f} GB; always-read {wb['fixed'] / 1e6:.0f} MB, one expert "
        f"{np.mean(list(wb['per_expert'].values())) / 1e6:.2f} MB, {len(wb['per_expert'])} MoE layers")
    t0 = time.time()
    _core.bench_block_step(model._core, 32, 32, threads=max(threads), reps=1)   # pages the experts in
    log(f"warm-up {time.time() - t0:.0f} s")

    bins = find_bins(llama_bin) if llama_bin is not False else None
    keys = [(w, t, mix) for t in threads for mix in mixes for w in widths]
    samples = {k: [] for k in keys}
    touched = {k: [] for k in keys}
    tg = {t: [] for t in threads}
    llama_error = None if bins is not None and bins.bench is not None else "llama-bench not given (--llama-bin)"
    loads = []
    for rnd in range(rounds):
        order = keys if rnd % 2 == 0 else keys[::-1]
        t0 = time.time()
        for k, (ms, tl) in zip(order, steps(model, depth, [(w, MIXES[mix](w), t) for w, t, mix in order], reps)):
            samples[k] += ms
            touched[k].append(tl)
        log(f"round {rnd + 1}: our steps {time.time() - t0:.0f} s")
        for t in (threads if rnd % 2 == 0 else threads[::-1]):
            if llama_error is None:
                relabel(path, "bailingmoe2")
                try:
                    # --repack 0: the weights stay in the shared page cache, as ours do (a repacked copy
                    # is another 9 GB of memory beside it)
                    r = llama_bench(bins.bench, str(path), n_prompt=0, n_gen=8, threads=t, reps=1,
                                    flash_attn=True, depth=depth, extra=("--repack", "0"))
                    tg[t].append(r["ms"] / 8)
                except DiffuseError as e:
                    llama_error = str(e)
                    log(f"llama.cpp: {e}")
                finally:
                    relabel(path, "llada2")
        loads.append(os.getloadavg()[0])
        log(f"round {rnd + 1}: " + "; ".join(f"t{t} {mix} " + " ".join(
            f"w{w}:{np.min(samples[(w, t, mix)]):.0f}" for w in widths) for t in threads for mix in mixes)
            + "".join(f"; llama tg t{t} {tg[t][-1]:.1f} ms" for t in threads if tg[t]) + f"; load {loads[-1]:.2f}")

    rows = []
    for (w, t, mix) in keys:
        s = np.asarray(samples[(w, t, mix)])
        per_layer = {il: float(np.mean([tl[il] for tl in touched[(w, t, mix)]])) for il in wb["per_expert"]}
        b = step_bytes(wb, per_layer, w)
        one = float(np.min(samples[(1, t, mix)])) if (1, t, mix) in samples else None
        tg_min = float(np.min(tg[t])) if tg[t] else None
        vals = list(per_layer.values())
        rows.append({"threads": t, "rows": mix, "w": w, "ms_min": float(s.min()), "ms_median": float(np.median(s)),
                     "n": int(s.size), "experts": float(np.mean(vals)), "experts_min": float(np.min(vals)),
                     "experts_max": float(np.max(vals)), "gb": b / 1e9, "gb_s": b / 1e9 / (float(s.min()) / 1e3),
                     "ms_per_row": float(s.min()) / w, "vs_one_row": float(s.min()) / one if one else None,
                     "vs_llama_tg": float(s.min()) / tg_min if tg_min else None})
    one_token_bytes = step_bytes(wb, {il: float(model.hparams["n_expert_used"]) for il in wb["per_expert"]}, 1)
    useful = []
    for t in threads:
        tg_min = float(np.min(tg[t])) if tg[t] else None
        for mix in mixes:
            blk = next((r for r in rows if r["threads"] == t and r["rows"] == mix and r["w"] == 32), None)
            one = next((r for r in rows if r["threads"] == t and r["rows"] == mix and r["w"] == 1), None)
            if blk is None:
                continue
            for name, tpf in PUBLISHED_TPF.items():
                tok_s = tpf * 1000.0 / blk["ms_min"]
                useful.append({"threads": t, "rows": mix, "model": name, "tpf": tpf, "step_ms": blk["ms_min"],
                               "tok_s": tok_s, "llama_tg_tok_s": 1000.0 / tg_min if tg_min else None,
                               "vs_llama": tok_s * tg_min / 1000.0 if tg_min else None,
                               "ours_one_row_tok_s": 1000.0 / one["ms_min"] if one else None,
                               "vs_ours_one_row": tok_s * one["ms_min"] / 1000.0 if one else None,
                               "break_even_tpf": blk["ms_min"] / tg_min if tg_min else None})
    best_t = min(threads, key=lambda t: min(r["ms_min"] for r in rows if r["threads"] == t and r["w"] == max(widths)))
    subs = sub_block_runs(model, depth, best_t) if sub_blocks else []
    for r in subs:
        log(f"block 32, sub-block {r['sub_block']}: {r['rows_per_step']:.0f} rows/step, {r['experts']:.1f} experts/layer, "
            f"{r['ms_min']:.0f} ms min, {r['ms_median']:.0f} ms median")
    return {"model": str(path), "machine": machine.describe(), "depth": depth, "rounds": rounds, "reps": reps,
            "weights": {"file": wb["file"], "fixed": wb["fixed"], "embedding_row": wb["embedding_row"],
                        "per_expert_mean": float(np.mean(list(wb["per_expert"].values()))),
                        "moe_layers": len(wb["per_expert"]), "one_token_bytes": one_token_bytes},
            "steps": rows, "useful": useful, "sub_blocks": subs, "sub_block_threads": best_t, "llama_tg_ms": {str(t): v for t, v in tg.items()},
            "llama_error": llama_error, "load_avg": loads}


STEP_COLUMNS = [("threads", "threads", "{}"), ("rows", "rows", "{}"), ("w", "w", "{}"), ("ms_min", "ms min", "{:.0f}"),
                ("ms_median", "ms median", "{:.0f}"), ("experts", "experts/layer", "{:.1f}"),
                ("experts_max", "max layer", "{:.0f}"),
                ("gb", "GB read", "{:.2f}"), ("gb_s", "GB/s", "{:.1f}"), ("ms_per_row", "ms/row", "{:.1f}"),
                ("vs_one_row", "x one-row step", "{:.2f}"), ("vs_llama_tg", "x llama tg", "{:.2f}")]
USEFUL_COLUMNS = [("threads", "threads", "{}"), ("rows", "rows", "{}"), ("model", "model (published tok/forward)", "{}"),
                  ("tpf", "tok/forward", "{:.2f}"), ("step_ms", "step ms (w 32)", "{:.0f}"),
                  ("tok_s", "useful tok/s", "{:.2f}"), ("llama_tg_tok_s", "llama.cpp AR tok/s", "{:.2f}"),
                  ("vs_llama", "vs llama AR", "{:.2f}"), ("ours_one_row_tok_s", "ours one-row tok/s", "{:.2f}"),
                  ("vs_ours_one_row", "vs ours one-row", "{:.2f}"), ("break_even_tpf", "tok/forward to tie llama AR", "{:.1f}")]


SUB_COLUMNS = [("sub_block", "sub-block", "{}"), ("steps", "steps", "{}"), ("rows_per_step", "rows/pass", "{:.0f}"),
               ("experts", "experts/layer", "{:.1f}"), ("ms_min", "ms min", "{:.0f}"), ("ms_median", "ms median", "{:.0f}")]


def markdown(result: dict) -> str:
    from diffuse.bench.machine import describe_line
    from diffuse.bench.tables import md_table
    w = result["weights"]
    return (f"`{result['model']}` ({w['file'] / 1e9:.2f} GB, {w['moe_layers']} MoE layers, one expert "
            f"{w['per_expert_mean'] / 1e6:.2f} MB, always-read weights {w['fixed'] / 1e6:.0f} MB), depth "
            f"{result['depth']}, {result['rounds']} alternated rounds x {result['reps']} reps; "
            f"{describe_line(result['machine'])}; load averages during the rounds "
            f"{', '.join(f'{x:.1f}' for x in result['load_avg'])}.\n\n"
            + md_table(result["steps"], STEP_COLUMNS) + "\n\n" + md_table(result["useful"], USEFUL_COLUMNS) + "\n\n"
            + (md_table(result["sub_blocks"], SUB_COLUMNS) + "\n" if result["sub_blocks"] else "")
            + (f"\nllama.cpp: {result['llama_error']}\n" if result["llama_error"] else ""))


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--layers", type=int, default=MINI["n_layer"])
    ap.add_argument("--depth", type=int, default=512)
    ap.add_argument("--widths", default="1,2,4,8,16,32")
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--dest", type=Path, default=Path("/tmp/diffuse-bench-moe-block"))
    ap.add_argument("--llama-bin", default=None)
    ap.add_argument("--no-llama", action="store_true")
    ap.add_argument("--mixes", default="tokens,masks", help="the step's rows: tokens (distinct), masks (all the mask token)")
    ap.add_argument("--no-sub-blocks", action="store_true")
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args(argv)
    path = args.dest / f"llada2-mini-random-{args.layers}l-q4_k_m.gguf"
    if not path.exists():
        t0 = time.time()
        write_model(path, args.layers)
        print(f"wrote {path} ({path.stat().st_size / 1e9:.2f} GB) in {time.time() - t0:.0f} s")
    res = run(path, args.depth, [int(x) for x in args.widths.split(",")], [int(x) for x in args.threads.split(",")],
              args.rounds, args.reps, False if args.no_llama else args.llama_bin, tuple(args.mixes.split(",")),
              not args.no_sub_blocks)
    print(markdown(res))
    if args.json:
        args.json.write_text(json.dumps(res, indent=2))


if __name__ == "__main__":
    main()
