"""`diffuse bench prompts`: the paper's 8 real prompts (its Tables 4, 7 and 8), each run with and without
the inter-step cache under the same options.

Per prompt: steps used, buffer tok/s (the paper's figure: every generated position, end-of-text
padding included), useful tok/s (tokens before the first end-of-text), the cache speedup (uncached
time / cached time), fidelity (fraction of generated positions where the cached run chose the same
token as the uncached one), the answers, and, given an AR model, the AR decode speed beside it.
"""
from __future__ import annotations

import dataclasses

import numpy as np

import diffuse
from diffuse.bench import machine
from diffuse.bench.tables import md_table

# The paper names its prompts only by topic; these are our wordings of those topics.
PAPER_PROMPTS = [
    ("capital", "What is the capital of France?"),
    ("french", "Translate to French: The weather is beautiful today and we are going to the beach."),
    ("arith", "What is 15 x 23?"),
    ("spanish", "Translate to Spanish: I would like to order a coffee and a glass of water, please."),
    ("is_prime", "Write a Python function is_prime(n) that returns True if n is a prime number."),
    ("poem", "Write a short poem about the ocean."),
    ("sky", "Why is the sky blue?"),
    ("planets", "List the planets of the solar system."),
]
# The paper's classes (its Tables 4 and 5): easy ones end in 2-4 steps, hard ones use all 16.
DIFFICULTY = {"capital": "easy", "french": "easy", "arith": "easy", "spanish": "medium", "is_prime": "medium",
              "poem": "hard", "sky": "hard", "planets": "hard"}

# The paper's real-prompt setting (entropy_exit, 16 steps), scaled to B=64 for small machines; one
# seed, so that the cache-on and cache-off runs compared for fidelity draw the same noise.
DEFAULTS = {"scheduler": "entropy_exit", "steps": 16, "gen_length": 64, "seed": 0}


def _timed(model, prompt: str, reps: int, options: dict):
    """The first run's result with total_ms replaced by the median over `reps` runs."""
    runs = [model.generate(prompt, **options) for _ in range(reps)]
    return dataclasses.replace(runs[0], total_ms=float(np.median([r.total_ms for r in runs])))


def run(path: str, threads: int | None = None, reps: int = 1, options: dict | None = None,
        prompts: list[tuple[str, str]] | None = None, ar: dict | None = None, tokenizer: str | None = None,
        log=print) -> dict:
    """Measure every prompt; `ar` (from llama_ref.ar_baseline, same threads) adds the AR columns."""
    opts = {**DEFAULTS, **{k: v for k, v in (options or {}).items() if v is not None}}
    opts.pop("cache", None)                      # both settings are run
    model = diffuse.load(path, threads=threads, tokenizer=tokenizer)
    model.generate(PAPER_PROMPTS[0][1], **{**opts, "steps": 2, "cache": False})   # warm-up
    rows = []
    for name, text in prompts or PAPER_PROMPTS:
        plain = _timed(model, text, reps, {**opts, "cache": False})
        cached = _timed(model, text, reps, {**opts, "cache": True})
        row = {
            "prompt": name, "text": text,
            "steps": cached.steps, "steps_no_cache": plain.steps, "steps_allowed": cached.steps_allowed,
            "ms": cached.total_ms, "ms_no_cache": plain.total_ms,
            "buffer_tok_s": cached.buffer_tokens_per_s, "buffer_tok_s_no_cache": plain.buffer_tokens_per_s,
            "useful_tok_s": cached.useful_tokens_per_s, "useful_tok_s_no_cache": plain.useful_tokens_per_s,
            "useful_tokens": cached.useful_length, "gen_length": cached.gen_length,
            "cache_speedup": plain.total_ms / cached.total_ms,
            "fidelity": float(np.mean(cached.tokens == plain.tokens)),
            "answer": cached.text, "answer_no_cache": plain.text,
        }
        if ar is not None:
            row["ar_decode_tok_s"] = ar["decode_tokens_per_s"]
            row["buffer_vs_ar"] = row["buffer_tok_s"] / ar["decode_tokens_per_s"]
            row["useful_vs_ar"] = row["useful_tok_s"] / ar["decode_tokens_per_s"]
        rows.append(row)
        log(f"{name:10s} steps {row['steps']:3d}/{row['steps_allowed']}  buffer {row['buffer_tok_s']:6.2f} tok/s  "
            f"useful {row['useful_tok_s']:6.2f} tok/s  cache x{row['cache_speedup']:.2f}  "
            f"fidelity {row['fidelity']:.2f}")
    summary = {"mean_buffer_tok_s": float(np.mean([r["buffer_tok_s"] for r in rows])),
               "mean_buffer_tok_s_no_cache": float(np.mean([r["buffer_tok_s_no_cache"] for r in rows])),
               "mean_useful_tok_s": float(np.mean([r["useful_tok_s"] for r in rows])),
               "mean_fidelity": float(np.mean([r["fidelity"] for r in rows]))}
    # The ratio of the averages printed beside it; a mean of per-row ratios lets one noisy row dominate.
    summary["cache_speedup"] = summary["mean_buffer_tok_s"] / summary["mean_buffer_tok_s_no_cache"]
    return {"machine": machine.describe(), "model": path, "arch": model.arch, "threads": model.threads,
            "reps": reps, "options": opts, "ar": ar, "rows": rows, "summary": summary}


COLUMNS = [
    ("prompt", "prompt", "{}"), ("steps", "steps", "{:d}"), ("steps_no_cache", "steps (no cache)", "{:d}"),
    ("buffer_tok_s_no_cache", "buffer tok/s no cache", "{:.2f}"), ("buffer_tok_s", "buffer tok/s cache", "{:.2f}"),
    ("useful_tok_s", "useful tok/s", "{:.2f}"), ("useful_tokens", "useful tokens", "{:d}"),
    ("cache_speedup", "cache speedup", "{:.2f}x"), ("fidelity", "fidelity", "{:.2f}"),
    ("ar_decode_tok_s", "AR decode tok/s", "{:.1f}"), ("buffer_vs_ar", "buffer/AR", "{:.2f}x"),
    ("useful_vs_ar", "useful/AR", "{:.2f}x"),
]


def markdown(result: dict) -> str:
    o, s = result["options"], result["summary"]
    lines = [
        f"Model: `{result['model']}` ({result['arch']}); {o['scheduler']}, {o['steps']} steps, "
        f"B={o['gen_length']}, {result['threads']} threads, median of {result['reps']} run(s) after a warm-up",
        f"Machine: {machine.describe_line(result['machine'])}",
        "",
        md_table(result["rows"], COLUMNS),
        f"Average: buffer {s['mean_buffer_tok_s_no_cache']:.2f} -> {s['mean_buffer_tok_s']:.2f} tok/s with the cache "
        f"(x{s['cache_speedup']:.2f}), useful {s['mean_useful_tok_s']:.2f} tok/s, fidelity {s['mean_fidelity']:.2f}",
        "",
        "Answers (cached run):",
        "",
    ]
    for r in result["rows"]:
        answer = r["answer"].strip().replace("\n", " ") or "(empty)"
        lines.append(f"- **{r['prompt']}** ({r['text']}): {answer}")
    return "\n".join(lines) + "\n"
