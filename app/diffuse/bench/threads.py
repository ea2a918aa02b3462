"""Thread scaling: a full step, a block step and an AR decode token over 1..N threads, beside
llama.cpp's pass of the same rows and decode of the same weights (issue 31).

Three kinds of pass, each timed by the engine (`_core.bench_block_steps`, logits for every row):
- full step: `--rows` rows with nothing cached, every row attending to every row in a
  full-attention model (one denoising step without a cache, the paper's unit of diffusion work);
- block step: `--width` new rows over `--depth` cached rows (a block-diffusion step);
- AR decode: one new row over `--depth` cached rows (the work of an AR decode token).

llama.cpp's side, where `llama-bench` is found (`--llama-bin DIR`, $DIFFUSE_LLAMA_BIN or PATH):
- full step: `llama-bench -p ROWS` on MODEL itself: on a diffusion file (dream, llada) llama.cpp
  keeps no cache and outputs every row's logits, so that is the same full pass;
- block step and AR decode: `llama-bench -p WIDTH -d DEPTH` and `-n 16 -d DEPTH` on `--ar-model`,
  the same weights labelled as an AR model (`make` below writes both). llama-bench's `pp` computes
  the logits of one row where our block step computes every row's (docs/benchmarks.md section 10).
A side llama.cpp cannot run (another architecture, no AR twin) is left out with its reason.
Rounds alternate ours and llama.cpp's, the thread counts in turn forward and backward, so every
point sees the same machine load; medians over the rounds.

DiffusionGemma has none of those three passes (its decoder denoises a whole canvas over the
encoded context; it has no AR decode): its two kinds are timed instead, inside a real run
(diffusion_gemma.time_canvas): the canvas step (self-conditioned, over --depth context rows) and
the encoder's pass over the context; `note` says why the others are absent, llama.cpp is left out.

    diffuse bench threads MODEL.gguf [--ar-model AR.gguf] [--threads 1,2,4,8] [--rows 128] [--depth 512]
    python -m diffuse.bench.threads make DIR [--layers 24] [--type Q4_K_M]   # random Qwen2.5-0.5B-shaped Dream + AR twin
"""
from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

import numpy as np

from diffuse import DiffuseError

KINDS = ("full step", "block step", "AR decode")
CANVAS_KINDS = ("canvas step", "encoder pass")      # DiffusionGemma's
DECODE_TOKENS = 16          # llama-bench decode tokens per sample (its ms is divided by them)
# Qwen2.5-0.5B's layer shapes (Dream-7B's block at 0.5B, as in docs/benchmarks.md "Models").
QWEN_05B = dict(n_embd=896, n_head=14, n_head_kv=2, n_ff=4864, n_vocab=151936, n_ctx=32768)
COLUMNS = [("kind", "kind", "{}"), ("threads", "threads", "{}"), ("ms", "ours ms", "{:.1f}"),
           ("speedup", "ours speedup", "{:.2f}"), ("llama_ms", "llama.cpp ms", "{:.1f}"),
           ("llama_speedup", "llama.cpp speedup", "{:.2f}"), ("ratio", "ours / llama.cpp", "{:.2f}")]


def _llama_plan(bins, path: str, ar_path: str | None) -> tuple[dict, dict]:
    """Per kind the file llama-bench runs, or why that kind is left out."""
    from diffuse.gguf_file import read

    plan, why = {}, {}
    if bins is None or bins.bench is None:
        return plan, dict.fromkeys(KINDS, "llama-bench not found (--llama-bin DIR or $DIFFUSE_LLAMA_BIN)")
    arch = read(path).architecture
    if arch in ("dream", "llada"):
        plan["full step"] = path
    else:
        why["full step"] = f"llama.cpp runs no full diffusion pass of a {arch} file (dream and llada only)"
    for kind in KINDS[1:]:
        if ar_path:
            plan[kind] = ar_path
        else:
            why[kind] = "no --ar-model (the same weights as an AR file) to decode"
    return plan, why


def run(path: str, threads: list[int], rows: int, depth: int, width: int, reps: int, llama_bin: str | None = None,
        ar_path: str | None = None, use_llama: bool = True, log=lambda line: None) -> dict:
    import diffuse
    from diffuse import _core
    from diffuse.bench.llama_ref import find_bins, llama_bench
    from diffuse.bench.machine import describe

    threads = list(dict.fromkeys(threads))
    if min(threads) < 1 or rows < 1 or width < 1 or depth < 1 or reps < 1:
        raise DiffuseError("--threads, --rows, --width, --depth and --reps must be at least 1")
    if depth % width:
        raise DiffuseError(f"--depth {depth} is not a multiple of --width {width}: blocks align at position 0")
    model = diffuse.load(path, threads=max(threads))
    if model._core.hparams.get("canvas_length", 0):
        return _canvas_run(model, path, threads, depth, reps, log)
    if max(rows, depth + width) > model.n_ctx_train:
        raise DiffuseError(f"--rows {rows} or --depth {depth} + --width {width} exceed the model's context "
                           f"({model.n_ctx_train})")
    bins = find_bins(llama_bin) if use_llama else None
    plan, left_out = _llama_plan(bins, path, ar_path) if use_llama else ({}, dict.fromkeys(KINDS, "--no-llama"))
    _core.bench_block_step(model._core, 0, 1, threads=max(threads), reps=1)   # page the weights in
    machine = describe()        # its load figure: at the start
    load_before = os.getloadavg()[0]

    ours = {(k, t): [] for k in KINDS for t in threads}
    theirs = {(k, t): [] for k in plan for t in threads}
    for rnd in range(reps):
        order = threads if rnd % 2 == 0 else threads[::-1]
        # (width, masked, threads, logit rows: all); one prefill per call, the thread counts in turn
        full = _core.bench_block_steps(model._core, 0, [(rows, 0, t, 0) for t in order], reps=1, routing=False)
        cached = _core.bench_block_steps(model._core, depth, [c for t in order for c in ((width, 0, t, 0), (1, 0, t, 0))],
                                         reps=1, routing=False)
        for i, t in enumerate(order):
            ours["full step", t] += full[i][0]
            ours["block step", t] += cached[2 * i][0]
            ours["AR decode", t] += cached[2 * i + 1][0]
        for t in order:
            for kind, file in list(plan.items()):
                args = {"full step": dict(n_prompt=rows, n_gen=0, depth=0),
                        "block step": dict(n_prompt=width, n_gen=0, depth=depth),
                        "AR decode": dict(n_prompt=0, n_gen=DECODE_TOKENS, depth=depth)}[kind]
                try:
                    ms = llama_bench(bins.bench, file, threads=t, reps=1, flash_attn=True, **args)["ms"]
                except DiffuseError as e:     # e.g. an architecture this llama.cpp does not know
                    lines = str(e).splitlines()      # "PROGRAM failed on FILE", its last words
                    left_out[kind] = " ".join(dict.fromkeys([lines[0], lines[-1]]))
                    del plan[kind]
                    log(f"llama.cpp, {kind}: {left_out[kind]}")
                    continue
                theirs[kind, t].append(ms / DECODE_TOKENS if kind == "AR decode" else ms)
        log(f"round {rnd + 1} of {reps}: " + "; ".join(
            f"{k} " + " ".join(f"t{t} {ours[k, t][-1]:.1f}" for t in threads) for k in KINDS)
            + f" ms; load {os.getloadavg()[0]:.2f}")

    table = []
    for kind in KINDS:
        base = float(np.median(ours[kind, threads[0]]))
        llama_base = float(np.median(theirs[kind, threads[0]])) if kind in plan else None
        for t in threads:
            ms = float(np.median(ours[kind, t]))
            row = {"kind": kind, "threads": t, "ms": ms, "speedup": base / ms, "samples": ours[kind, t]}
            if kind in plan:
                lm = float(np.median(theirs[kind, t]))
                row.update(llama_ms=lm, llama_speedup=llama_base / lm, ratio=ms / lm, llama_samples=theirs[kind, t])
            table.append(row)
    return {"model": path, "ar_model": ar_path, "hparams": model._core.hparams, "threads": threads, "rows": rows,
            "depth": depth, "width": width, "reps": reps, "table": table, "llama_left_out": left_out,
            "machine": machine, "load_average": [load_before, os.getloadavg()[0]],
            "when": time.strftime("%Y-%m-%d %H:%M")}


def _canvas_run(model, path: str, threads: list[int], depth: int, reps: int, log) -> dict:
    """DiffusionGemma's canvas step and encoder pass over `depth` context rows at each thread count."""
    from diffuse.bench.diffusion_gemma import time_canvas
    from diffuse.bench.machine import describe

    canvas = model._core.hparams["canvas_length"]
    if depth + canvas > model.n_ctx_train:
        raise DiffuseError(f"--depth {depth} + its canvas of {canvas} rows exceed the model's context "
                           f"({model.n_ctx_train})")
    context = [int(t) for t in np.random.default_rng(0).integers(0, model.n_vocab, depth)]
    time_canvas(model, context[:1], max(threads))      # page the weights in
    machine, load_before = describe(), os.getloadavg()[0]
    ours = {(k, t): [] for k in CANVAS_KINDS for t in threads}
    for rnd in range(reps):
        for t in threads if rnd % 2 == 0 else threads[::-1]:
            got = time_canvas(model, context, t)
            ours["canvas step", t].append(got["ms"])
            ours["encoder pass", t].append(got["encoder_ms"])
        log(f"round {rnd + 1} of {reps}: canvas step " + " ".join(
            f"t{t} {ours['canvas step', t][-1]:.1f}" for t in threads) + f" ms; load {os.getloadavg()[0]:.2f}")
    table = []
    for kind in CANVAS_KINDS:
        base = float(np.median(ours[kind, threads[0]]))
        for t in threads:
            ms = float(np.median(ours[kind, t]))
            table.append({"kind": kind, "threads": t, "ms": ms, "speedup": base / ms, "samples": ours[kind, t]})
    note = (f"{Path(path).name}: no full step, block step or AR decode: DiffusionGemma's decoder denoises a whole "
            f"canvas of {canvas} rows over the encoded context and it has no AR decode, so its canvas step and "
            f"encoder pass are timed instead; llama.cpp is left out (no llama-bench pass is either).")
    return {"model": path, "ar_model": None, "hparams": model._core.hparams, "threads": threads, "rows": canvas,
            "depth": depth, "width": canvas, "reps": reps, "table": table, "llama_left_out": {}, "note": note,
            "machine": machine, "load_average": [load_before, os.getloadavg()[0]],
            "when": time.strftime("%Y-%m-%d %H:%M")}


def header(result: dict) -> str:
    hp = result["hparams"]
    passes = (f"Canvas step: the decoder over {result['rows']} canvas rows over {result['depth']} context rows, "
              f"self-conditioned; encoder pass: over the {result['depth']} context rows; timed inside a real run."
              if result.get("note") else
              f"Full step: {result['rows']} rows, nothing cached; block step: {result['width']} rows "
              f"over {result['depth']} cached; AR decode: 1 row over {result['depth']}; logits for every row.")
    return (f"{Path(result['model']).name}: {hp['arch']}, {hp['n_layer']} layers of {hp['n_embd']}, vocabulary "
            f"{hp['n_vocab']}. {passes} Median "
            f"of {result['reps']} alternated rounds; speedup over {result['threads'][0]} thread(s); load average "
            f"{result['load_average'][0]:.1f} -> {result['load_average'][1]:.1f}.")


def left_out_lines(result: dict) -> str:
    return "".join(f"llama.cpp, {kind}: not measured ({why})\n" for kind, why in result["llama_left_out"].items())


def markdown(result: dict) -> str:
    from diffuse.bench.machine import describe_line
    from diffuse.bench.tables import md_table
    return "\n\n".join(([result["note"]] if result.get("note") else []) + [
        header(result), describe_line(result["machine"]), md_table(result["table"], COLUMNS) + left_out_lines(result)]) + "\n"


def make(folder: Path, n_layer: int, weight_type: str = "Q4_K_M") -> tuple[Path, Path]:
    """A random Dream of Qwen2.5-0.5B's layer shapes in `weight_type` (llama.cpp's mixture for
    Q4_K_M) and its AR twin: the same file relabelled qwen2, which llama.cpp decodes."""
    from diffuse.bench.ar_models import relabel
    from diffuse.bench.random_models import write_random_dream
    from diffuse.quantize import quantize_file

    stem = f"0.5b-shape-{n_layer}l-{weight_type.lower()}"
    dream, ar = folder / f"dream-{stem}.gguf", folder / f"qwen2-{stem}.gguf"
    f16 = write_random_dream(folder / f"dream-0.5b-shape-{n_layer}l-f16.gguf", n_layer, **QWEN_05B)
    if weight_type.upper() != "F16":
        quantize_file(f16, dream, weight_type)
        f16.unlink()
    relabel(dream, ar, "qwen2", 151666, {}, source="dream")
    return dream, ar


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m diffuse.bench.threads")
    sub = p.add_subparsers(dest="command", required=True)
    mk = sub.add_parser("make", help="a random Dream of Qwen2.5-0.5B's shapes and the same file as qwen2")
    mk.add_argument("folder", type=Path)
    mk.add_argument("--layers", type=int, default=24, help="layers (default 24, the real model's)")
    mk.add_argument("--type", default="Q4_K_M", help="weight type (default Q4_K_M; see diffuse quantize)")
    args = p.parse_args(argv)
    if args.layers < 1:
        raise SystemExit("--layers must be at least 1")
    for path in make(args.folder, args.layers, args.type):
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
