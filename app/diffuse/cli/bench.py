"""`diffuse bench`: forward-pass cost, the paper's grid and prompts, the performance study (batch,
context, steps) and the report of them all (see docs/benchmarks.md)."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from diffuse import DiffuseError, physical_cores
from diffuse.recording import write_atomic
from diffuse.cli import check_input, check_output, check_output_folder
from diffuse.cli.generate import add_generation_options, add_threads_option, generation_options

# The grid's axes: lists of values, not the single-valued generation flags.
GRID_AXES = ("steps", "scheduler", "cache", "gen_length")


def int_list(text: str) -> list[int]:
    try:
        values = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None
    if not values or min(values) <= 0:
        raise argparse.ArgumentTypeError(f"expected positive integers, got {text!r}")
    return values


def float_list(text: str) -> list[float]:
    try:
        values = [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated numbers, got {text!r}") from None
    if not values or not all(1 <= v < 1e6 for v in values):
        raise argparse.ArgumentTypeError(f"expected numbers of at least 1, got {text!r}")
    return values


def str_list(text: str) -> list[str]:
    return [x.strip() for x in text.split(",") if x.strip()]


def on_off_list(text: str) -> list[bool]:
    table = {"on": True, "off": False}
    try:
        return [table[x] for x in str_list(text)]
    except KeyError:
        raise argparse.ArgumentTypeError(f"expected a list of on/off, got {text!r}") from None


def default_threads() -> list[int]:
    """1, 2, 4, ... up to the physical cores, and their count itself (hyper-threads only slow a pass)."""
    cores = physical_cores()
    return sorted({1 << i for i in range(cores.bit_length()) if 1 << i <= cores} | {cores})


def _llama_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--llama-bin", metavar="DIR",
                   help="folder with llama.cpp's llama-bench / llama-diffusion-cli (default: $DIFFUSE_LLAMA_BIN)")


def add_parser(sub) -> argparse.ArgumentParser:
    p = sub.add_parser("bench", help="benchmarks: forward pass, the paper's grid and prompts, the performance study",
                       description="Measure speed and memory. See docs/benchmarks.md.")
    bs = p.add_subparsers(dest="bench_command", required=True, metavar="BENCH")

    f = bs.add_parser("forward", help="ms per forward pass, GFLOP/s, ggml's mat-mul ceiling, memory",
                      description="Cost of one full forward pass (a denoising step without cache).")
    f.add_argument("model", help="GGUF model file")
    f.add_argument("--tokens", type=int_list, default=[64, 256], help="token counts (default 64,256)")
    f.add_argument("--threads", type=int_list, default=None,
                   help=f"thread counts (default 1,2,4.. up to the physical cores, {physical_cores()} here)")
    f.add_argument("--reps", type=int, default=3,
                   help="timed runs per configuration, after a warm-up (default %(default)s)")
    f.add_argument("--no-ceiling", dest="ceiling", action="store_false", help="skip ggml's mat-mul ceiling")
    f.add_argument("--llama", action="store_true",
                   help="llama.cpp side by side: llama-bench prompt processing and llama-diffusion-cli ms/step")
    f.add_argument("--flash-attn", action="store_true", help="also llama-bench with flash attention")
    _llama_options(f)
    f.add_argument("--json", type=Path, help="write the result as JSON")
    f.add_argument("--markdown", type=Path, help="write the table as markdown")

    g = bs.add_parser("grid", help="the paper's grid with AR baseline and roofline: JSON, CSV, PNG, report",
                      description="quantisation (one file each) x threads x steps x scheduler x cache x "
                                  "generation length x prompt; medians and spread over repetitions.")
    g.add_argument("models", nargs="+", help="GGUF files (e.g. the same model in F16, Q8_0, Q4_K_M)")
    g.add_argument("-o", "--out", type=Path, default=Path("bench-grid"), help="output folder (default bench-grid)")
    g.add_argument("--threads", type=int_list, default=None,
                   help=f"default 1,2,4.. up to the physical cores, {physical_cores()} here")
    g.add_argument("--steps", type=int_list, default=[16], help="step budgets (default 16)")
    g.add_argument("--schedulers", type=str_list, default=["low_confidence", "entropy_exit"])
    g.add_argument("--cache", type=on_off_list, default=[False, True], help="on,off (default both)")
    g.add_argument("--gen-lengths", type=int_list, default=[32, 64], help="generation lengths B (default 32,64)")
    g.add_argument("--prompts", type=int_list, default=[1, 7],
                   help="1-based indices of the paper's 8 prompts (default 1,7: capital, sky)")
    g.add_argument("--reps", type=int, default=2, help="runs per configuration (default %(default)s)")
    g.add_argument("--ar-model", help="an autoregressive GGUF for the baseline (decode and prompt tok/s)")
    g.add_argument("--ar-backend", choices=["auto", "llama-cpp-python", "llama-bench"], default="auto")
    g.add_argument("--no-plots", dest="plots", action="store_false")
    _llama_options(g)
    add_generation_options(g, skip=GRID_AXES)

    pr = bs.add_parser("prompts", help="the paper's 8 prompts: steps, tok/s, cache speedup, fidelity, answers",
                       description="Each prompt with and without the inter-step cache (defaults: entropy_exit, "
                                   "16 steps, B=64).")
    pr.add_argument("model", help="GGUF model file")
    pr.add_argument("--tokenizer", help="tokenizer.json for model files that carry none")
    pr.add_argument("--reps", type=int, default=1,
                    help="runs per prompt and setting, median time (default %(default)s)")
    pr.add_argument("--ar-model", help="an autoregressive GGUF: its decode tok/s at the same threads")
    pr.add_argument("--ar-backend", choices=["auto", "llama-cpp-python", "llama-bench"], default="auto")
    _llama_options(pr)
    pr.add_argument("--json", type=Path, help="write the result as JSON")
    pr.add_argument("--markdown", type=Path, help="write the table and answers as markdown")
    add_generation_options(pr)
    add_threads_option(pr)

    b = bs.add_parser("batch", help="generate_batch throughput against AR batched decoding, per batch size",
                      description="Diffusion (one forward pass per step over every sequence) and, with "
                                  "--ar-model, llama.cpp decoding B sequences at once, side by side per B.")
    b.add_argument("model", help="GGUF model file")
    b.add_argument("--batch", type=int_list, default=[1, 2, 4, 8, 16], help="batch sizes (default 1,2,4,8,16)")
    b.add_argument("--ar-model", help="an autoregressive GGUF, decoded in batches by llama-batched-bench")
    b.add_argument("--reps", type=int, default=1, help="runs per batch size, median time (default %(default)s)")
    _llama_options(b)
    b.add_argument("--json", type=Path, help="write the records as JSON")
    add_generation_options(b)
    add_threads_option(b)

    c = bs.add_parser("context", help="long contexts: full-sequence vs block-wise denoising per length",
                      description="ms per step and per generated token, peak RSS and arithmetic intensity "
                                  "(attention FLOPs and K/V bytes counted), each configuration in its own process.")
    c.add_argument("model", help="GGUF model file")
    c.add_argument("--lengths", type=int_list, default=[64, 256, 1024],
                   help="generated positions (default 64,256,1024)")
    c.add_argument("--block-length", type=int, default=32, help="block of the block-wise mode (default %(default)s)")
    c.add_argument("--steps", type=int, default=2, help="steps timed after step 0 (default %(default)s)")
    c.add_argument("--json", type=Path, help="write the records as JSON")
    add_threads_option(c)

    st = bs.add_parser("steps", help="latency and quality against the step budget, low_confidence and entropy_exit",
                       description="Quality proxy: agreement with the many-step answer; with --heldout also "
                                   "held-out infilling accuracy.")
    st.add_argument("model", help="GGUF model file")
    st.add_argument("--budgets", type=int_list, default=[4, 8, 16, 32, 64], help="step budgets (default 4,8,16,32,64)")
    st.add_argument("--prompts", type=int_list, default=[1, 7],
                    help="1-based indices of the paper's 8 prompts (default 1,7: capital, sky)")
    st.add_argument("--heldout", type=Path, metavar="DATA",
                    help="the training text (a .txt file or folder, as for `diffuse train`): its held-out "
                         "documents are infilled")
    st.add_argument("--json", type=Path, help="write the records as JSON")
    add_generation_options(st, skip=("steps", "scheduler"))
    add_threads_option(st)

    bl = bs.add_parser("block", help="block diffusion against AR decode: block steps vs llama-bench pp/tg at depth",
                       description="Block-diffusion steps of w rows at cached depth d beside llama-bench's prompt "
                                   "pass of w tokens and decode token at that depth, then whole runs: tokens per "
                                   "step and tok/s against AR decode (see docs/benchmarks.md).")
    bl.add_argument("model", help="a block-diffusion GGUF (python -m diffuse.bench.ar_models makes one)")
    bl.add_argument("--ar-model", required=True, metavar="AR.gguf",
                    help="the same weights as an autoregressive GGUF, for llama-bench")
    bl.add_argument("--depths", type=int_list, default=[512, 2048], help="cached depths (default 512,2048)")
    bl.add_argument("--widths", type=int_list, default=[1, 2, 4, 8, 32], help="rows per step (default 1,2,4,8,32)")
    bl.add_argument("--threads", type=int, default=physical_cores(),
                    help=f"threads (default: the physical cores, {physical_cores()} here)")
    bl.add_argument("--reps", type=int, default=5, help="alternated repetitions per point (default 5)")
    bl.add_argument("--gen-length", type=int, default=64, help="answer length of the whole runs (default 64)")
    _llama_options(bl)
    bl.add_argument("--json", type=Path, metavar="PATH", help="write the measurements as JSON")
    bl.add_argument("--markdown", type=Path, metavar="PATH", help="write the tables as markdown")

    kn = bs.add_parser("knee", help="where diffusion wins here: a pass over w rows in decode tokens, each "
                                    "family's reported tokens per forward against AR decode",
                       description="The cost of a pass over w new rows (logits for every row) at a few cache "
                                   "depths, in decode tokens of the same weights, and the speed against AR decode "
                                   "that each family's published tokens per forward would give on this machine and "
                                   "file (see docs/benchmarks.md). Any family's GGUF; DiffusionGemma, which has "
                                   "no such pass and no AR decode, gets its canvas step and encoder pass in ms.")
    kn.add_argument("model", help="GGUF model file")
    kn.add_argument("--depths", type=int_list, default=[512, 2048], help="cached depths (default 512,2048)")
    kn.add_argument("--widths", type=int_list, default=[1, 2, 4, 8, 16, 32],
                    help="rows per pass (default 1,2,4,8,16,32)")
    kn.add_argument("--threads", type=int, default=physical_cores(),
                    help=f"threads (default: the physical cores, {physical_cores()} here)")
    kn.add_argument("--reps", type=int, default=5, help="alternated rounds over the widths (default 5)")
    kn.add_argument("--json", type=Path, metavar="PATH", help="write the measurements as JSON")
    kn.add_argument("--markdown", type=Path, metavar="PATH", help="write the tables as markdown")

    th = bs.add_parser("threads", help="thread scaling: a full step, a block step and AR decode over 1..N threads, "
                                       "beside llama.cpp",
                       description="ms of a full step (ROWS rows, nothing cached), a block step (WIDTH rows over "
                                   "DEPTH cached) and an AR decode token at each thread count, with the speedup over "
                                   "the first count, alternated with llama.cpp's pass of the same rows and decode of "
                                   "the same weights where llama-bench is found (see docs/benchmarks.md). "
                                   "DiffusionGemma: its canvas step and encoder pass instead.")
    th.add_argument("model", help="GGUF model file (python -m diffuse.bench.threads make writes a real-shape one)")
    th.add_argument("--threads", type=int_list, default=None,
                    help=f"thread counts (default 1,2,4.. up to the physical cores, {physical_cores()} here)")
    th.add_argument("--rows", type=int, default=128, help="rows of the full step (default %(default)s)")
    th.add_argument("--depth", type=int, default=512, help="cached rows of the block step and decode (default 512)")
    th.add_argument("--width", type=int, default=4, help="rows of the block step (default %(default)s)")
    th.add_argument("--reps", type=int, default=3, help="alternated rounds (default %(default)s)")
    th.add_argument("--ar-model", metavar="AR.gguf",
                    help="the same weights as an AR file, for llama.cpp's block pass and decode")
    _llama_options(th)
    th.add_argument("--no-llama", dest="llama", action="store_false", help="ours only")
    th.add_argument("--json", type=Path, metavar="PATH", help="write the measurements as JSON")
    th.add_argument("--markdown", type=Path, metavar="PATH", help="write the table as markdown")

    hd = bs.add_parser("head", help="the output head's product for 1-32 rows: ggml's against the engine's own, "
                                    "with the memory bandwidth each reaches",
                       description="Best time of the output head's product W x for each row count, ggml's mat-mul "
                                   "and the engine's few-row product alternated, with GB/s against this machine's "
                                   "memory read and copy figures (see docs/benchmarks.md).")
    hd.add_argument("model", nargs="?", help="a GGUF whose output matrix's type and shape to use (default: "
                                             "Qwen2.5's 151936 x 896 Q8_0); the values are random")
    hd.add_argument("--rows", type=int_list, default=[1, 2, 4, 8, 16, 32], help="row counts (default 1,2,4,8,16,32)")
    hd.add_argument("--threads", type=int, default=physical_cores(),
                    help=f"threads (default: the physical cores, {physical_cores()} here)")
    hd.add_argument("--reps", type=int, default=9, help="alternated runs per row count, best kept (default 9)")
    hd.add_argument("--json", type=Path, metavar="PATH", help="write the measurements as JSON")
    hd.add_argument("--markdown", type=Path, metavar="PATH", help="write the table as markdown")

    sp = bs.add_parser("spec", help="self-speculation against AR decode: draft and verify passes per draft length",
                       description="Per draft length k, the draft pass (the seed and k - 1 masks) and the verify "
                                   "pass (k rows, causal) at a cached depth, against one AR decode token of the "
                                   "same file in the same engine; the break-even acceptance, and tok/s at the "
                                   "acceptance lengths given (see docs/benchmarks.md).")
    sp.add_argument("model", help="a GGUF with a mask token (python -m diffuse.bench.spec make makes a random "
                                  "Nemotron-Labs-Diffusion one of real shapes)")
    sp.add_argument("--depth", type=int, default=512, help="cached depth (default %(default)s)")
    sp.add_argument("--draft-lengths", type=int_list, default=[4, 8, 16, 32],
                    help="rows of a draft: the seed and k - 1 masks (default 4,8,16,32)")
    sp.add_argument("--acceptance", type=float_list, default=[5.46, 6.82],
                    help="tokens committed per iteration, the bonus included (default: the published 5.46 and "
                         "6.82 of Nemotron-Labs-Diffusion-8B at draft 32, without and with its draft LoRA)")
    sp.add_argument("--reps", type=int, default=5, help="alternated repetitions per pass (default 5)")
    sp.add_argument("--ar-tokens", type=int, default=32, help="tokens of the real AR run and of llama.cpp's decode "
                                                              "(default 32)")
    _llama_options(sp)
    sp.add_argument("--llama-model", metavar="LLAMA.gguf",
                    help="the same weights as a llama.cpp GGUF, for llama-bench's decode (default: a "
                         "Nemotron-Labs-Diffusion file is written as llama.cpp's mistral3 in a temporary folder)")
    add_threads_option(sp)
    sp.add_argument("--json", type=Path, metavar="PATH", help="write the measurements as JSON")
    sp.add_argument("--markdown", type=Path, metavar="PATH", help="write the tables as markdown")

    fa = bs.add_parser("fast", help="fast decoding (threshold, factor, DualCache, PrefixCache, suffix window, "
                                    "early EOS) against the model's own decoding",
                       description="Each fast-decoding method beside the model's defaults: forward passes, ms per "
                                   "step, useful tok/s, agreement with the baseline's answer and, with --data, "
                                   "the model's held-out masked-token accuracy for scale; then ms per step at "
                                   "each --lengths "
                                   "(blocks of 32). See docs/benchmarks.md.")
    fa.add_argument("model", help="GGUF model file (a full-attention model: LLaDA, Dream, LLaDA-MoE)")
    fa.add_argument("--data", type=Path, help="the demo model's training text (a .txt file or a folder of them, "
                                             "python -m diffuse.train.corpus): the model's held-out masked-token accuracy")
    fa.add_argument("--lengths", type=int_list, default=[], help="answer lengths of the speed table (e.g. 256,1024)")
    fa.add_argument("--no-quality", dest="quality", action="store_false", help="only the speed table")
    fa.add_argument("--temperature", type=float, help="of the quality runs (default: the model's)")
    add_threads_option(fa)
    fa.add_argument("--json", type=Path, metavar="PATH", help="write the measurements as JSON")
    fa.add_argument("--markdown", type=Path, metavar="PATH", help="write the tables as markdown")

    rp = bs.add_parser("report", help="the paper's tables, Fig. 3 and the study's findings from a folder of JSON",
                       description="Reads DIR/**/grid.json (bench grid) and DIR/batch.json, context.json, "
                                   "steps.json; writes DIR/study.md and its PNG plots.")
    rp.add_argument("dir", type=Path, help="folder with the JSON of the other bench commands")
    rp.add_argument("--no-plots", dest="plots", action="store_false")
    return p


def run(args: argparse.Namespace) -> int:
    return {"forward": _forward, "grid": _grid, "prompts": _prompts, "batch": _batch, "context": _context,
            "steps": _steps, "block": _block, "knee": _knee, "threads": _threads, "head": _head, "fast": _fast,
            "report": _report, "spec": _spec}[args.bench_command](args)


def _check_files(args, *inputs) -> None:
    """Before any measurement: the models can be read, and --json / --markdown can be written
    without overwriting one of them (or each other)."""
    given = [x for x in inputs if x]
    for path in given:
        check_input(path)
    outputs = [(option, getattr(args, option.strip("-"), None)) for option in ("--json", "--markdown")]
    outputs = [(option, path) for option, path in outputs if path is not None]
    for option, path in outputs:
        check_output(path, option, given + [str(p) for o, p in outputs if o != option], example_name="bench.json")
    if len(outputs) == 2 and Path(outputs[0][1]).resolve() == Path(outputs[1][1]).resolve():
        raise DiffuseError(f"--json and --markdown are both {outputs[0][1]}; give two file names")


def _write(path: Path | None, text: str) -> None:
    if path is not None:
        write_atomic(path, text.encode())
        print(f"wrote {path}", file=sys.stderr)


def _write_json(path: Path | None, result) -> None:
    from diffuse.bench.tables import json_text
    _write(path, json_text(result))


def _check_reps(reps: int) -> None:
    if reps < 1:
        raise DiffuseError(f"--reps must be at least 1 (got {reps})")


def _forward(args) -> int:
    from diffuse.bench import forward, llama_ref
    from diffuse.bench.tables import text_table
    _check_reps(args.reps)
    _check_files(args, args.model)
    llama = llama_ref.find_bins(args.llama_bin) if args.llama else None
    if llama is not None and llama.bench is None and llama.diffusion is None:
        raise DiffuseError("--llama: llama-bench / llama-diffusion-cli not found (--llama-bin DIR)")
    result = forward.run(args.model, args.tokens, args.threads or default_threads(), args.reps,
                         ceiling=args.ceiling, llama=llama, flash_attn_too=args.flash_attn,
                         log=lambda line: print(line, file=sys.stderr))
    print(forward.header(result))
    print(text_table(result["rows"], forward.COLUMNS))
    _write_json(args.json, result)
    _write(args.markdown, forward.markdown(result))
    return 0


def _ar_bins(args):
    """Refuses --ar-model without its backend before any model is loaded; the llama.cpp programs
    found (None when llama-cpp-python is used or there is no AR model)."""
    if not args.ar_model:
        return None
    from diffuse.bench import llama_ref
    python = llama_ref.have_llama_cpp_python()
    if args.ar_backend == "llama-cpp-python" or (args.ar_backend == "auto" and python):
        if not python:
            raise DiffuseError("--ar-backend llama-cpp-python: it is not installed (pip install 'diffuse[ar]')")
        return None
    bins = llama_ref.find_bins(args.llama_bin)
    if bins.bench is None:
        where = f"llama-bench (--llama-bin DIR or ${llama_ref.ENV_BIN})"
        raise DiffuseError(f"--ar-backend llama-bench: {where} not found" if args.ar_backend == "llama-bench" else
                           f"--ar-model needs llama-cpp-python (pip install 'diffuse[ar]') or {where}: neither found")
    return bins


def _ar(args, bins, threads: int, n_prompt: int, n_gen: int, reps: int) -> dict | None:
    if not args.ar_model:
        return None
    from diffuse.bench import llama_ref
    return llama_ref.ar_baseline(args.ar_model, threads=threads, n_prompt=n_prompt, n_gen=n_gen, reps=reps,
                                 backend=args.ar_backend, bins=bins)


def _grid(args) -> int:
    from diffuse.bench import grid, plots
    from diffuse.bench.prompts import PAPER_PROMPTS
    _check_reps(args.reps)
    if args.plots and not plots.available():
        raise DiffuseError("the plots need matplotlib: pip install 'diffuse[bench]' (or pass --no-plots)")
    bad = [i for i in args.prompts if not 1 <= i <= len(PAPER_PROMPTS)]
    if bad:
        raise DiffuseError(f"--prompts: {bad} outside 1..{len(PAPER_PROMPTS)}")
    axes = grid.Axes(models=args.models, threads=args.threads or default_threads(), steps=args.steps,
                     schedulers=args.schedulers, cache=args.cache, gen_lengths=args.gen_lengths,
                     prompts=[i - 1 for i in args.prompts])
    fixed = generation_options(args, skip=GRID_AXES)
    bins = _ar_bins(args)
    _check_files(args, *args.models, args.ar_model)
    check_output_folder(args.out, "-o")
    result = grid.run(axes, args.reps, fixed, ar_model=args.ar_model, ar_backend=args.ar_backend, llama=bins,
                      log=lambda line: print(line, file=sys.stderr))
    result["command"] = "diffuse " + " ".join(args.argv)
    print(grid.table(result))
    for path in grid.write(result, args.out, plots=args.plots):
        print(f"wrote {path}", file=sys.stderr)
    return 0


def _prompts(args) -> int:
    from diffuse.bench import prompts
    from diffuse.bench.tables import text_table
    _check_reps(args.reps)
    options = generation_options(args)
    bins = _ar_bins(args)
    _check_files(args, args.model, args.ar_model, args.tokenizer)
    threads = args.threads or physical_cores()
    gen = options.get("gen_length") or prompts.DEFAULTS["gen_length"]
    ar = _ar(args, bins, threads, n_prompt=32, n_gen=gen, reps=max(args.reps, 2))
    result = prompts.run(args.model, threads=threads, reps=args.reps, options=options, ar=ar,
                         tokenizer=args.tokenizer, log=lambda line: print(line, file=sys.stderr))
    print(text_table(result["rows"], prompts.COLUMNS))
    s = result["summary"]
    print(f"average: buffer {s['mean_buffer_tok_s_no_cache']:.2f} -> {s['mean_buffer_tok_s']:.2f} tok/s, "
          f"cache x{s['cache_speedup']:.2f}, fidelity {s['mean_fidelity']:.2f}\n")
    for r in result["rows"]:
        print(f"[{r['prompt']}] {r['answer'].strip()}\n")
    _write_json(args.json, result)
    _write(args.markdown, prompts.markdown(result))
    return 0


def _with_command(rows: list[dict], args) -> list[dict]:
    """Each record names the command that measured it, for the report."""
    command = "diffuse " + " ".join(args.argv)
    return [{**r, "command": command} for r in rows]


def _batch(args) -> int:
    from diffuse.bench import batch, llama_ref
    from diffuse.bench.tables import text_table
    _check_reps(args.reps)
    batched = None
    if args.ar_model:
        batched = llama_ref.find_bins(args.llama_bin).batched
        if batched is None:
            raise DiffuseError("--ar-model needs llama.cpp's llama-batched-bench (--llama-bin DIR or "
                               f"${llama_ref.ENV_BIN}); build it with `cmake --build BUILD --target "
                               "llama-batched-bench` (see diffuse/bench/llama_ref.py)")
    _check_files(args, args.model, args.ar_model)
    rows = batch.run(args.model, args.batch, args.threads or physical_cores(), args.reps,
                     generation_options(args), ar_model=args.ar_model, batched_bin=batched,
                     log=lambda line: print(line, file=sys.stderr))
    print(text_table(batch.with_gain(rows), batch.COLUMNS))
    _write_json(args.json, _with_command(rows, args))
    return 0


def _context(args) -> int:
    from diffuse.bench import context
    from diffuse.bench.tables import text_table
    if args.steps < 1 or args.block_length < 1:
        raise DiffuseError("--steps and --block-length must be at least 1")
    _check_files(args, args.model)
    rows = context.run(args.model, args.lengths, args.block_length, args.threads or physical_cores(), args.steps,
                       log=lambda line: print(line, file=sys.stderr))
    print(text_table(context.shown(rows), context.COLUMNS))
    _write_json(args.json, _with_command(rows, args))
    return 0


def _steps(args) -> int:
    from diffuse.bench import steps
    from diffuse.bench.prompts import PAPER_PROMPTS
    from diffuse.bench.tables import text_table
    bad = [i for i in args.prompts if not 1 <= i <= len(PAPER_PROMPTS)]
    if bad:
        raise DiffuseError(f"--prompts: {bad} outside 1..{len(PAPER_PROMPTS)}")
    _check_files(args, args.model)
    if args.heldout is not None and not args.heldout.is_dir():
        check_input(args.heldout, "--heldout")
    rows = steps.run(args.model, args.budgets, args.threads, [i - 1 for i in args.prompts],
                     generation_options(args, skip=("steps", "scheduler")), heldout=args.heldout,
                     log=lambda line: print(line, file=sys.stderr))
    print(text_table(rows, steps.COLUMNS))
    _write_json(args.json, _with_command(rows, args))
    return 0


def _block(args) -> int:
    from diffuse.bench import block
    from diffuse.bench.tables import text_table
    _check_reps(args.reps)
    if args.threads < 1 or args.gen_length < 1:
        raise DiffuseError("--threads and --gen-length must be at least 1")
    _check_files(args, args.model, args.ar_model)
    result = block.run(args.model, args.ar_model, args.depths, args.widths, args.threads, args.reps, args.llama_bin,
                       gen_length=args.gen_length, log=lambda line: print(line, file=sys.stderr))
    print(text_table(result["steps"], block.STEP_COLUMNS))
    print(text_table(result["runs"], block.RUN_COLUMNS))
    _write_json(args.json, result)
    _write(args.markdown, block.markdown(result))
    return 0


def _knee(args) -> int:
    from diffuse.bench import knee
    from diffuse.bench.tables import text_table
    _check_reps(args.reps)
    if args.threads < 1:
        raise DiffuseError("--threads must be at least 1")
    _check_files(args, args.model)
    result = knee.run(args.model, args.depths, args.widths, args.threads, args.reps,
                      log=lambda line: print(line, file=sys.stderr))
    if result.get("note"):
        print(result["note"])
    print(knee.header(result))
    print("\n".join(knee.tables(result, text_table)))
    _write_json(args.json, result)
    _write(args.markdown, knee.markdown(result))
    return 0


def _threads(args) -> int:
    from diffuse.bench import threads
    from diffuse.bench.tables import text_table
    _check_files(args, args.model, args.ar_model)
    result = threads.run(args.model, args.threads or default_threads(), args.rows, args.depth, args.width, args.reps,
                         llama_bin=args.llama_bin, ar_path=args.ar_model, use_llama=args.llama,
                         log=lambda line: print(line, file=sys.stderr))
    if result.get("note"):
        print(result["note"])
    print(threads.header(result))
    print(text_table(result["table"], threads.COLUMNS) + threads.left_out_lines(result))
    _write_json(args.json, result)
    _write(args.markdown, threads.markdown(result))
    return 0


def _head(args) -> int:
    from diffuse.bench import head
    from diffuse.bench.tables import text_table
    _check_reps(args.reps)
    if args.threads < 1:
        raise DiffuseError("--threads must be at least 1")
    _check_files(args, args.model)
    result = head.run(args.model, args.rows, args.threads, args.reps, log=lambda line: print(line, file=sys.stderr))
    print(head.header(result))
    print(text_table(result["rows"], head.COLUMNS))
    _write_json(args.json, result)
    _write(args.markdown, head.markdown(result))
    return 0


def _spec(args) -> int:
    from diffuse.bench import spec
    from diffuse.bench.tables import text_table
    _check_reps(args.reps)
    _check_files(args, args.model, args.llama_model)
    result = spec.run(args.model, args.depth, args.draft_lengths, args.acceptance, args.threads or 0, args.reps,
                      ar_tokens=args.ar_tokens, llama_bin=args.llama_bin, llama_model=args.llama_model,
                      log=lambda line: print(line, file=sys.stderr))
    print(spec.header(result))
    print(text_table(result["rows"], spec.COLUMNS))
    print(text_table(result["speed"], spec.SPEED_COLUMNS))
    _write_json(args.json, result)
    _write(args.markdown, spec.markdown(result))
    return 0


def _fast(args) -> int:
    from diffuse.bench import fast
    from diffuse.bench.tables import text_table
    _check_files(args, args.model)
    if args.data is not None and not args.data.exists():
        raise DiffuseError(f"--data {args.data}: no such file or folder")
    result = fast.run(str(args.model), args.threads, args.lengths, str(args.data) if args.data else None,
                      quality_run=args.quality, temperature=args.temperature,
                      log=lambda line: print(line, file=sys.stderr))
    if result["quality"]:
        print(text_table(result["quality"], fast.QUALITY_COLUMNS))
    if result["speed"]:
        print(text_table(result["speed"], fast.SPEED_COLUMNS))
    _write_json(args.json, result)
    _write(args.markdown, fast.markdown(result))
    return 0


def _report(args) -> int:
    from diffuse.bench import plots, report
    if args.plots and not plots.available():
        raise DiffuseError("the plots need matplotlib: pip install 'diffuse[bench]' (or pass --no-plots)")
    if not args.dir.is_dir():
        raise DiffuseError(f"{args.dir}: not a folder (the folder of the bench commands' JSON)")
    check_output(args.dir / "study.md", "DIR", [])
    for path in report.write(args.dir, plots=args.plots):
        print(f"wrote {path}", file=sys.stderr)
    return 0
