"""`diffuse bench report DIR`: the seed paper's Tables 2-8 and Fig. 3, and the performance study's
four findings, from the JSON the other bench commands wrote into DIR.

Reads every DIR/**/grid.json (`bench grid`; their rows are pooled, so separate small grids can
fill separate tables) and DIR/**/batch.json, context.json, steps.json. Writes DIR/study.md and,
with matplotlib, its PNG plots. A table whose measurements are missing says which command makes
them. The paper's layout: Table 2 quantisation, 3 threads, 4 real prompts, 5 vs llama.cpp by
difficulty, 6 generation length, 7 inter-step cache, 8 Dream vs LLaDA; Fig. 3 the combined
optimisations as a waterfall.
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from diffuse import DiffuseError
from diffuse.bench import batch, context, steps
from diffuse.bench.prompts import DIFFICULTY, PAPER_PROMPTS
from diffuse.bench.tables import md_table
from diffuse.recording import write_atomic

STUDY = ("batch", "context", "steps")


def load(folder: Path) -> dict:
    """{"grids": [grid results], "rows": pooled grid rows (each with its grid's command), "ar": AR
    baselines, "models": {label: model facts}, "batch"/"context"/"steps": [(path, records)]}."""
    if not folder.is_dir():
        raise DiffuseError(f"{folder}: not a folder")
    return _pool(sorted(folder.rglob("grid.json")), {name: sorted(folder.rglob(f"{name}.json")) for name in STUDY})


def _pool(grid_paths: list[Path], study_paths: dict[str, list[Path]]) -> dict:
    grids = [_read(p, dict) for p in grid_paths]
    data = {"grids": grids, "rows": [], "ar": [], "models": {}}
    for p, g in zip(grid_paths, grids):
        for key in ("rows", "ar", "models"):
            if not isinstance(g.get(key, []), list) or not all(isinstance(x, dict) for x in g.get(key, [])):
                raise DiffuseError(f"{p}: not what `diffuse bench grid` writes: \"{key}\" is not a list of records")
        command = g.get("command", "diffuse bench grid ...")
        g["rows"] = [{**r, "command": command} for r in g.get("rows", [])]
        data["rows"] += g["rows"]
        data["ar"] += [{**a, "command": command} for a in g.get("ar", [])]
        data["models"].update({m.get("model"): m for m in g.get("models", [])})
    for name in STUDY:
        data[name] = [(p, _read(p, list)) for p in study_paths.get(name, [])]
        for p, records in data[name]:
            if not all(isinstance(r, dict) for r in records):
                raise DiffuseError(f"{p}: not what `diffuse bench {name}` writes: a list of records (objects)")
    return data


def _read(path: Path, kind: type):
    """One JSON file of the folder; a clear error naming it when it is not JSON of that kind."""
    try:
        value = json.loads(path.read_bytes())
    except OSError as e:
        raise DiffuseError(f"{path}: cannot read it: {e.strerror or e}") from None
    except json.JSONDecodeError as e:
        raise DiffuseError(f"{path}: not valid JSON (line {e.lineno}, column {e.colno}: {e.msg})") from None
    except (UnicodeDecodeError, RecursionError, ValueError) as e:
        raise DiffuseError(f"{path}: not valid JSON ({e})") from None
    if not isinstance(value, kind):
        raise DiffuseError(f"{path}: expected a JSON {'object' if kind is dict else 'list'}, found "
                           f"{type(value).__name__ if value is not None else 'null'}")
    return value


# What a record with a missing or wrong-typed field raises deep in a table or a plot.
_BAD_RECORD = (KeyError, TypeError, ValueError, IndexError, AttributeError, ZeroDivisionError)


def _culprit(data: dict, error: Exception) -> DiffuseError:
    """The file whose records a table could not use: each one is tried alone, so the error names it."""
    what = f"a record lacks the field {error}" if isinstance(error, KeyError) else f"{type(error).__name__}: {error}"
    files = [(p, "grid") for p in data["grid_paths"]] + [(p, n) for n in STUDY for p, _ in data[n]]
    for p, name in files:
        try:
            markdown(_pool([p] if name == "grid" else [], {name: [p]} if name != "grid" else {}), [])
        except _BAD_RECORD:
            return DiffuseError(f"{p}: not what `diffuse bench {name}` writes ({what})")
        except DiffuseError as e:
            return e
    return DiffuseError(f"the JSON files together do not make a report ({what})")


def _where(rows: list[dict], **eq) -> list[dict]:
    return [r for r in rows if all(r.get(k) == v for k, v in eq.items())]


def _mean(rows: list[dict], key: str) -> float:
    return float(np.mean([r[key] for r in rows]))


def _commands(rows: list[dict]) -> str:
    cmds = list(dict.fromkeys(r["command"] for r in rows if r.get("command")))
    return "\n".join(f"`{c}`" for c in cmds) or "(no command recorded)"


def _missing(what: str, command: str) -> str:
    return f"Not in this folder: needs {what} (`{command}`).\n"


def _main_model(rows: list[dict]) -> str | None:
    """The Q4_K_M model if there is one (the paper's main configuration), else the first."""
    labels = list(dict.fromkeys(r["model"] for r in rows))
    return next((m for m in labels if m.endswith("[Q4_K_M]")), labels[0] if labels else None)


def _threads(rows: list[dict]) -> int | None:
    """The thread count most of these rows ran at (ties: the most threads): pooled grids may have
    measured different tables at different counts."""
    counts = {}
    for r in rows:
        counts[r["threads"]] = counts.get(r["threads"], 0) + 1
    return max(counts, key=lambda t: (counts[t], t), default=None)


def _one_grid(data: dict, key: str) -> list[dict]:
    """The rows of the grid that varies `key` most: a table of ratios compares one run's rows."""
    return max((g["rows"] for g in data["grids"]), key=lambda rows: len({r[key] for r in rows}), default=[])


def _ar_decode(data: dict, threads: int, rows: list[dict] = ()) -> float | None:
    """AR decode tok/s at `threads`: from the grids these rows came from (measured beside them)
    where they have one, else the median over every grid's."""
    at = [a for a in data["ar"] if a["threads"] == threads]
    beside = [a for a in at if a["command"] in {r["command"] for r in rows}]
    hits = [a["decode_tokens_per_s"] for a in beside or at]
    return float(np.median(hits)) if hits else None


# -- the paper's tables ----------------------------------------------------------------------------

def table2(data: dict) -> str:
    """Quantisation: size, low_confidence tok/s, ms/step, vs F16 (at the most threads)."""
    rows = _where(_one_grid(data, "model"), scheduler="low_confidence", cache=False)
    rows = _where(rows, threads=_threads(rows))
    models = list(dict.fromkeys(r["model"] for r in rows))
    if len(models) < 2:
        return _missing("a grid over two or more weight files", "diffuse bench grid Q4_K_M.gguf Q8_0.gguf F16.gguf "
                        "--schedulers low_confidence --cache off --gen-lengths 64 --prompts 1")
    gen = min(r["gen_length"] for r in rows)
    out, used = [], []
    for m in models:
        sel = _where(rows, model=m, gen_length=gen)
        used += sel
        info = data["models"].get(m, {})
        out.append({"model": m, "quant": info.get("quant"), "size_mib": info.get("file_bytes", 0) / 2**20 or None,
                    "tok_s": _mean(sel, "buffer_tok_s"), "step_ms": _mean(sel, "step_ms")})
    f16 = next((o for o in out if o["quant"] == "F16"), None)
    for o in out:
        o["vs_f16"] = f16["step_ms"] / o["step_ms"] if f16 else None
    cols = [("model", "Model", "{}"), ("quant", "Weights", "{}"), ("size_mib", "Size MiB", "{:.0f}"),
            ("tok_s", "low_confidence tok/s", "{:.2f}"),
            ("step_ms", "Per-step ms", "{:.0f}"), ("vs_f16", "vs F16", "{:.2f}x")]
    caption = f"B={gen}, {rows[0]['threads']} threads, {rows[0]['steps']} steps."
    return md_table(out, cols) + f"\n{caption} {_commands(used)}\n"


def table3(data: dict) -> str:
    """Thread scaling of low_confidence tok/s, with AR decode beside it."""
    grid = _one_grid(data, "threads")
    model = _main_model(grid)
    rows = _where(grid, model=model, scheduler="low_confidence", cache=False)
    threads = sorted({r["threads"] for r in rows})
    if len(threads) < 2:
        return _missing("a grid over two or more thread counts", "diffuse bench grid MODEL --threads 1,2,... "
                        "--schedulers low_confidence --cache off --gen-lengths 64 --prompts 1 --ar-model AR.gguf")
    gen = min(r["gen_length"] for r in rows)
    cores = {g["machine"].get("physical_cores") for g in data["grids"]} - {None}
    out = []
    for t in threads:
        sel = _where(rows, threads=t, gen_length=gen)
        out.append({"threads": f"{t}{' (physical cores)' if t in cores else ''}", "tok_s": _mean(sel, "buffer_tok_s"),
                    "ar": _ar_decode(data, t, rows)})
    for o in out:
        o["scaling"] = o["tok_s"] / out[0]["tok_s"]
        o["ar_scaling"] = o["ar"] / out[0]["ar"] if o["ar"] and out[0]["ar"] else None
    cols = [("threads", "Threads", "{}"), ("tok_s", "tok/s", "{:.2f}"), ("scaling", "Scaling", "{:.2f}x"),
            ("ar", "AR decode tok/s", "{:.1f}"), ("ar_scaling", "AR scaling", "{:.2f}x")]
    return md_table(out, cols) + f"\n{model}, B={gen}, {rows[0]['steps']} steps. {_commands(rows)}\n"


def _lengths(rows: list[dict]) -> tuple[int, int]:
    gens = sorted({r["gen_length"] for r in rows})
    return gens[0], gens[-1]


def table4(data: dict) -> str:
    """Real prompts: entropy_exit (and low_confidence) at the short B, no-cache/cache at the long B."""
    model = _main_model(data["rows"])
    rows = _where(data["rows"], model=model)
    rows = _where(rows, threads=_threads(_where(rows, scheduler="entropy_exit")))
    ee = _where(rows, scheduler="entropy_exit")
    if len({r["prompt"] for r in ee}) < 2:
        return _missing("a grid over the paper's prompts with entropy_exit", "diffuse bench grid MODEL "
                        "--prompts 1,2,3,4,5,6,7,8 --gen-lengths 64,256 --cache off,on")
    short, long = _lengths(ee)
    out = []
    for name, _ in PAPER_PROMPTS:
        row = {"prompt": name}
        for key, sched, gen, cache in (("ee", "entropy_exit", short, True),
                                       ("lc", "low_confidence", short, True),
                                       ("no_cache", "entropy_exit", long, False),
                                       ("cache", "entropy_exit", long, True)):
            hit = _where(rows, prompt=name, scheduler=sched, gen_length=gen, cache=cache)
            if hit:
                row[key] = hit[0]["buffer_tok_s"]
                row[key + "_steps"] = hit[0]["steps_used"]
        if len(row) > 1:
            out.append(row)
    cols = [("prompt", "Prompt", "{}"), ("ee", f"B={short} EE tok/s", "{:.2f}"), ("ee_steps", "Steps", "{:d}"),
            ("lc", f"B={short} LC tok/s", "{:.2f}"), ("no_cache", f"B={long} No-Cache", "{:.2f}"),
            ("cache", f"B={long} Cache", "{:.2f}"), ("cache_steps", "Steps", "{:d}")]
    return (md_table(out, cols) + f"\n{model}, {rows[0]['threads']} threads, {rows[0]['steps']} steps; "
            "EE entropy_exit, LC "
            f"low_confidence (both with the cache at B={short}). {_commands(ee)}\n")


def table5(data: dict) -> str:
    """Against AR decoding by prompt difficulty (entropy_exit with the cache at the longest B)."""
    model = _main_model(data["rows"])
    rows = _where(data["rows"], model=model, scheduler="entropy_exit", cache=True)
    t = _threads(rows)
    rows = _where(rows, threads=t)
    ar = _ar_decode(data, t, rows)
    if not rows or ar is None:
        return _missing("a grid with entropy_exit, the cache and an AR baseline",
                        "diffuse bench grid MODEL --prompts 1,2,3,4,5,6,7,8 --ar-model AR.gguf")
    gen = max(r["gen_length"] for r in rows)
    out = []
    for level in ("easy", "medium", "hard"):
        sel = [r for r in _where(rows, gen_length=gen) if DIFFICULTY.get(r["prompt"]) == level]
        if sel:
            tps = [r["buffer_tok_s"] for r in sel]
            out.append({"scenario": f"{level.capitalize()} prompts (EE)",
                        "diffusion": f"{min(tps):.1f}-{max(tps):.1f} tok/s",
                        "ar": f"{ar:.1f} tok/s", "ratio": f"{min(tps) / ar:.2f}-{max(tps) / ar:.2f}x"})
    scaling = _where(_one_grid(data, "threads"), model=model, scheduler="low_confidence", cache=False)
    threads = sorted({r["threads"] for r in scaling})
    if len(threads) > 1 and _ar_decode(data, threads[0], scaling):
        lo, hi = threads[0], threads[-1]
        g = min(r["gen_length"] for r in scaling)
        d = _mean(_where(scaling, threads=hi, gen_length=g), "buffer_tok_s") / \
            _mean(_where(scaling, threads=lo, gen_length=g), "buffer_tok_s")
        out.append({"scenario": f"Thread scaling ({lo} -> {hi})", "diffusion": f"{d:.2f}x",
                    "ar": f"{_ar_decode(data, hi, scaling) / _ar_decode(data, lo, scaling):.2f}x", "ratio": ""})
    cols = [("scenario", "Scenario", "{}"), ("diffusion", f"diffusion (B={gen}, cache)", "{}"),
            ("ar", "llama.cpp AR decode", "{}"), ("ratio", "diffusion / AR", "{}")]
    return md_table(out, cols) + f"\n{model}, {t} threads; AR decode measured in the same grid. {_commands(rows)}\n"


def table6(data: dict) -> str:
    """Generation length: short vs long B per scheduler (cache off, the prompts both have)."""
    model = _main_model(data["rows"])
    rows = _where(data["rows"], model=model, cache=False)
    rows = _where(rows, threads=_threads(rows))
    out, used = [], []
    for sched in ("low_confidence", "entropy_exit"):
        sel = _where(rows, scheduler=sched)
        if len({r["gen_length"] for r in sel}) < 2:
            continue
        short, long = _lengths(sel)
        common = ({r["prompt"] for r in _where(sel, gen_length=short)}
                  & {r["prompt"] for r in _where(sel, gen_length=long)})
        a = [r for r in _where(sel, gen_length=short) if r["prompt"] in common]
        b = [r for r in _where(sel, gen_length=long) if r["prompt"] in common]
        if not common:
            continue
        used += a + b
        ms_a, ms_b = _mean(a, "total_ms") / short, _mean(b, "total_ms") / long
        out.append({"scheduler": sched, "short": _mean(a, "buffer_tok_s"), "long": _mean(b, "buffer_tok_s"),
                    "time_ratio": _mean(b, "total_ms") / _mean(a, "total_ms"),
                    "ms_token": f"{ms_a:.1f} -> {ms_b:.1f}", "improvement": ms_b / ms_a - 1})
    if not out:
        return _missing("a grid over two generation lengths", "diffuse bench grid MODEL --gen-lengths 64,256")
    short, long = _lengths(used)
    cols = [("scheduler", "Scheduler", "{}"), ("short", f"B={short} tok/s", "{:.2f}"),
            ("long", f"B={long} tok/s", "{:.2f}"), ("time_ratio", "Time ratio", "{:.2f}x"),
            ("ms_token", "ms/token", "{}"), ("improvement", "Improvement", "{:+.0%}")]
    return md_table(out, cols) + f"\n{model}, no cache, {used[0]['steps']} steps. {_commands(used)}\n"


def table7(data: dict) -> str:
    """Inter-step cache per prompt: entropy_exit at the longest B, no cache vs cache."""
    model = _main_model(data["rows"])
    rows = _where(data["rows"], model=model, scheduler="entropy_exit")
    rows = _where(rows, threads=_threads(rows))
    if not rows:
        return _missing("a grid with entropy_exit, cache off and on", "diffuse bench grid MODEL --cache off,on")
    gen = max(r["gen_length"] for r in rows)
    out = []
    for name, _ in PAPER_PROMPTS:
        off = _where(rows, prompt=name, gen_length=gen, cache=False)
        on = _where(rows, prompt=name, gen_length=gen, cache=True)
        if off and on:
            out.append({"prompt": name, "no_cache": off[0]["buffer_tok_s"], "cache": on[0]["buffer_tok_s"],
                        "speedup": off[0]["total_ms"] / on[0]["total_ms"], "steps": on[0]["steps_used"]})
    if not out:
        return _missing("a grid with both cache settings", "diffuse bench grid MODEL --cache off,on")
    out.append({"prompt": "**Average**", "no_cache": _mean(out, "no_cache"), "cache": _mean(out, "cache")})
    out[-1]["speedup"] = out[-1]["cache"] / out[-1]["no_cache"]
    cols = [("prompt", "Prompt", "{}"), ("no_cache", "No-Cache tok/s", "{:.2f}"), ("cache", "Cache tok/s", "{:.2f}"),
            ("speedup", "Speedup", "{:.2f}x"), ("steps", "Steps", "{:d}")]
    return md_table(out, cols) + f"\n{model}, B={gen}, {rows[0]['steps']} steps. {_commands(rows)}\n"


def table8(data: dict) -> str:
    """Dream vs LLaDA per prompt (entropy_exit with the cache), and each against AR decoding."""
    by_arch = {}
    for m in data["models"].values():
        by_arch.setdefault(m["arch"], m["model"])
    if not {"dream", "llada"} <= by_arch.keys():
        return _missing(f"a grid with a Dream and a LLaDA file (this folder has {sorted(by_arch) or 'none'})",
                        "diffuse bench grid DREAM.gguf LLADA.gguf --schedulers entropy_exit --cache on "
                        "--prompts 1,2,3,4,5,6,7,8 --ar-model AR.gguf")
    ee = _where(data["rows"], scheduler="entropy_exit", cache=True)
    t = _threads(ee)
    ar = _ar_decode(data, t, ee)
    out, used = [], []
    for name, _ in PAPER_PROMPTS:
        row = {"prompt": name}
        for arch in ("dream", "llada"):
            hit = _where(data["rows"], model=by_arch[arch], prompt=name, threads=t, scheduler="entropy_exit",
                         cache=True)
            if hit:
                best = max(hit, key=lambda r: r["gen_length"])
                used.append(best)
                row.update({arch: best["buffer_tok_s"], arch + "_steps": best["steps_used"],
                            arch + "_ar": best["buffer_tok_s"] / ar if ar else None})
        if len(row) > 1:
            out.append(row)
    cols = [("prompt", "Prompt", "{}"), ("dream", "Dream tok/s", "{:.2f}"), ("dream_steps", "Steps", "{:d}"),
            ("llada", "LLaDA tok/s", "{:.2f}"), ("llada_steps", "Steps", "{:d}"),
            ("dream_ar", "Dream vs AR", "{:.2f}x"), ("llada_ar", "LLaDA vs AR", "{:.2f}x")]
    return md_table(out, cols) + f"\n{t} threads, entropy_exit with the cache. {_commands(used)}\n"


def waterfall_threads(data: dict) -> int | None:
    """Fig. 3's thread count: that of most entropy_exit runs."""
    return _threads(_where(data["rows"], scheduler="entropy_exit"))


def waterfall_ar(data: dict) -> float | None:
    t = waterfall_threads(data)
    return _ar_decode(data, t, _where(data["rows"], scheduler="entropy_exit", threads=t))


def waterfall_stages(data: dict) -> list[tuple[str, float]]:
    """Fig. 3: F16 low_confidence, then Q4_K_M, entropy_exit on easy prompts at the short B, the long
    B, and the cache (cache off before that stage); the stages this folder has, in tok/s."""
    rows = _where(data["rows"], threads=waterfall_threads(data))
    quant = {m["model"]: m.get("quant") for m in data["models"].values()}
    easy = [name for name, level in DIFFICULTY.items() if level == "easy"]
    ee = _where(rows, scheduler="entropy_exit")
    short, long = _lengths(ee) if ee else (None, None)
    main = _main_model(rows)

    def best(sel):
        return max((r["buffer_tok_s"] for r in sel), default=None)
    # the weights' stages side by side from one grid (Table 2's), at the short B like the paper
    lc = _where(_one_grid(data, "model"), scheduler="low_confidence", cache=False, gen_length=short)
    stages = [
        ("F16, low_confidence", best(r for r in lc if quant.get(r["model"]) == "F16")),
        (f"{quant.get(main) or main}, low_confidence", best(_where(lc, model=main))),
        (f"+ entropy_exit, easy, B={short}", best(r for r in _where(ee, model=main, gen_length=short, cache=False)
                                                  if r["prompt"] in easy)),
        (f"+ B={long}", best(r for r in _where(ee, model=main, gen_length=long, cache=False) if r["prompt"] in easy)
         if long != short else None),
        ("+ inter-step cache", best(r for r in _where(ee, model=main, gen_length=long, cache=True)
                                    if r["prompt"] in easy)),
    ]
    return [(label, v) for label, v in stages if v is not None]


def fig3_table(data: dict) -> str:
    stages = waterfall_stages(data)
    if len(stages) < 2:
        return _missing("grids with low_confidence and entropy_exit", "the grids of Tables 2 and 4")
    ar = waterfall_ar(data)
    out = [{"stage": label, "tok_s": v, "x": v / stages[0][1], "ar": v / ar if ar else None} for label, v in stages]
    cols = [("stage", "Stage", "{}"), ("tok_s", "tok/s", "{:.2f}"), ("x", "vs first", "{:.2f}x"),
            ("ar", "vs AR decode", "{:.2f}x")]
    return md_table(out, cols) + (f"\nAR decode (llama.cpp): {ar:.1f} tok/s.\n" if ar else "")


# -- the study's findings --------------------------------------------------------------------------

def _study(data: dict, name: str) -> list[dict]:
    return [r for _, records in data[name] for r in records]


def finding_batch(data: dict) -> str:
    rows = _study(data, "batch")
    if not rows:
        return _missing("batch.json", "diffuse bench batch MODEL --ar-model AR.gguf --batch 1,2,4,8,16 "
                        "--json DIR/batch.json")
    rows = batch.with_gain(rows)
    lines = [md_table(rows, batch.COLUMNS)]
    for t in sorted({r["threads"] for r in rows}):
        sel = _where(rows, threads=t)
        top = max(r["batch"] for r in sel)
        gain = {r["engine"]: r["gain"] for r in _where(sel, batch=top)}
        if {"ar", "diffusion"} <= gain.keys():
            holds = "holds" if gain["ar"] > gain["diffusion"] else "does not hold"
            lines.append(f"{t} thread(s), B=1 to B={top}: AR decoding gains x{gain['ar']:.2f} in throughput, "
                         f"diffusion x{gain['diffusion']:.2f}: the study's finding {holds} here.")
    return "\n".join(lines) + "\n" + _commands(rows) + "\n"


def finding_context(data: dict) -> str:
    rows = _study(data, "context")
    if not rows:
        return _missing("context.json", "diffuse bench context MODEL --lengths 64,256,1024,4096 --block-length 32 "
                        "--json DIR/context.json")
    text = md_table(context.shown(rows), context.COLUMNS)
    full = sorted(_where(rows, mode="full"), key=lambda r: r["length"])
    blk = sorted(_where(rows, mode="blockwise"), key=lambda r: r["length"])
    if len(full) > 1:
        a, b = full[0], full[-1]
        text += (f"\nFull-sequence denoising from L={a['length']} to {b['length']}: "
                 f"ms/step x{b['ms_per_step'] / a['ms_per_step']:.1f}, peak RSS {a['peak_rss_bytes'] / 2**20:.0f} -> "
                 f"{b['peak_rss_bytes'] / 2**20:.0f} MiB, arithmetic intensity "
                 f"{a['arithmetic_intensity']:.0f} -> {b['arithmetic_intensity']:.0f} FLOP/byte, achieved "
                 f"{a['gflops']:.0f} -> {b['gflops']:.0f} GFLOP/s.")
    if len(blk) > 1:
        a, b = blk[0], blk[-1]
        text += (f" Block-wise (blocks of {a['block_length']}, cache): "
                 f"ms/step x{b['ms_per_step'] / a['ms_per_step']:.1f}, "
                 f"ms/token {a['ms_per_token']:.1f} -> {b['ms_per_token']:.1f}, arithmetic intensity "
                 f"{a['arithmetic_intensity']:.0f} -> {b['arithmetic_intensity']:.0f} FLOP/byte.")
    if full and blk:
        f, k = full[-1], next((r for r in blk if r["length"] == full[-1]["length"]), blk[-1])
        text += (f" At L={f['length']} a generated token costs x{f['ms_per_token'] / k['ms_per_token']:.1f} more "
                 "without blocks.")
    return text + "\n\n" + _commands(rows) + "\n"


def finding_steps(data: dict) -> str:
    if not data["steps"]:
        return _missing("steps.json", "diffuse bench steps MODEL --json DIR/steps.json")
    parts = []
    for _, rows in data["steps"]:
        text = md_table(rows, steps.COLUMNS)
        for sched in dict.fromkeys(r["scheduler"] for r in rows):
            sel = sorted(_where(rows, scheduler=sched), key=lambda r: r["steps"])
            if len(sel) > 1:
                lo, hi = sel[0], sel[-1]
                text += (f"\n{sched}: budget {hi['steps']} -> {lo['steps']} takes {lo['ms'] / hi['ms']:.2f}x the time, "
                         f"with agreement {lo['agreement']:.2f} to the many-step answer.")
        parts.append(text + "\n\n" + _commands(rows) + "\n")
    return "\n".join(parts)


def markdown(data: dict, pngs: list[str]) -> str:
    machines = {f"{g['machine']['cpu']}, {g['machine']['cores']} logical / {g['machine'].get('physical_cores', '?')} "
                f"physical cores" for g in data["grids"]}
    sections = [
        ("# The performance study and the paper's tables",
         "Regenerated by `diffuse bench report DIR` from the JSON in DIR. Machine(s): "
             + ("; ".join(sorted(machines)) or "not recorded") + ".\n"),
        ("## Table 2 (paper): quantisation", table2(data)),
        ("## Table 3 (paper): thread scaling", table3(data)),
        ("## Table 4 (paper): the real prompts", table4(data)),
        ("## Table 5 (paper): against llama.cpp by difficulty", table5(data)),
        ("## Table 6 (paper): generation length", table6(data)),
        ("## Table 7 (paper): inter-step cache", table7(data)),
        ("## Table 8 (paper): Dream vs LLaDA", table8(data)),
        ("## Fig. 3 (paper): the optimisations combined", fig3_table(data)),
        ("## Finding 1: batching helps AR decoding more", finding_batch(data)),
        ("## Findings 2 and 3: long contexts, full-sequence vs block-wise", finding_context(data)),
        ("## Finding 4: fewer steps", finding_steps(data)),
    ]
    lines = []
    for heading, body in sections:
        lines += [heading, "", body]
    if pngs:
        lines += ["## Plots", ""] + [f"![{p}]({p})" for p in pngs]
    return "\n".join(lines).rstrip() + "\n"


def write(folder: Path, plots: bool = True) -> list[Path]:
    data = load(folder)
    data["grid_paths"] = sorted(folder.rglob("grid.json"))
    try:
        markdown(data, [])            # every table, before a plot is drawn or a file is written
        pngs = []
        if plots:
            from diffuse.bench import plots as plotting
            pngs = plotting.study_plots(data, waterfall_stages(data), waterfall_ar(data), folder)
        text = markdown(data, [p.name for p in pngs])
    except _BAD_RECORD as e:
        raise _culprit(data, e) from None
    out = folder / "study.md"
    write_atomic(out, text.encode())
    return [out, *pngs]
