"""llama.cpp as the reference: its `llama-bench` and `llama-diffusion-cli` programs for per-step
parity, the autoregressive baseline through `llama-cpp-python` (the optional extra
`diffuse[ar]`) or, without it, through `llama-bench`, and AR batched decoding through
`llama-batched-bench`.

llama.cpp is not part of diffuse. Build the programs once from the pinned sdist:

    pip download --no-deps --no-binary :all: llama-cpp-python==0.3.36 && tar xf llama_cpp_python-0.3.36.tar.gz
    cmake -S llama_cpp_python-0.3.36/vendor/llama.cpp -B /tmp/llama-build -DGGML_NATIVE=ON -DLLAMA_CURL=OFF
    cmake --build /tmp/llama-build --target llama-bench llama-diffusion-cli llama-batched-bench -j

and point `--llama-bin` (or DIFFUSE_LLAMA_BIN) at /tmp/llama-build/bin. On a virtual machine that
lists AMX in /proc/cpuinfo without enabling it, a native build dies with "Illegal instruction" in
ggml's AMX mat-mul: name the instruction sets instead (`-DGGML_NATIVE=OFF -DGGML_AVX=ON
-DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON`, plus `-DGGML_AVX512=ON
-DGGML_AVX512_VNNI=ON -DGGML_AVX512_BF16=ON` where the CPU has them), which leaves AMX out.
"""
from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from diffuse._core import DiffuseError

ENV_BIN = "DIFFUSE_LLAMA_BIN"


@dataclass(frozen=True)
class LlamaBins:
    bench: Path | None          # llama-bench
    diffusion: Path | None      # llama-diffusion-cli
    batched: Path | None = None  # llama-batched-bench


def find_bins(bin_dir: str | os.PathLike | None = None) -> LlamaBins:
    """The programs in bin_dir, else in $DIFFUSE_LLAMA_BIN, else on PATH (None where absent)."""
    folder = bin_dir or os.environ.get(ENV_BIN)

    def find(name: str) -> Path | None:
        if folder:
            p = Path(folder) / name
            return p if p.is_file() and os.access(p, os.X_OK) else None
        hit = shutil.which(name)
        return Path(hit) if hit else None

    bins = LlamaBins(find("llama-bench"), find("llama-diffusion-cli"), find("llama-batched-bench"))
    if folder and bins.bench is None and bins.diffusion is None and bins.batched is None:
        raise DiffuseError(f"{folder}: none of llama-bench, llama-diffusion-cli, llama-batched-bench found there")
    return bins


def _run(cmd: list[str], what: str) -> str:
    try:
        p = subprocess.run(cmd, capture_output=True, text=True)
    except OSError as e:
        raise DiffuseError(f"{cmd[0]}: cannot run: {e}") from e
    if p.returncode != 0:
        tail = "\n".join((p.stderr or p.stdout).strip().splitlines()[-5:])
        raise DiffuseError(f"{cmd[0]} failed on {what} (exit {p.returncode}):\n{tail}")
    return p.stdout + p.stderr


def llama_bench(bench: Path, model: str, *, n_prompt: int, n_gen: int, threads: int, reps: int = 3,
                flash_attn: bool = False, depth: int = 0, extra: tuple[str, ...] = ()) -> dict:
    """One llama-bench test: prompt processing of n_prompt tokens (logits of the last one only)
    when n_gen is 0, else decoding n_gen tokens one by one; with `depth` tokens already in the KV
    cache (not timed). ms per run (median, min, std), tokens/s.

    On a diffusion file (arch dream/llada) llama.cpp keeps no KV memory and outputs the logits of
    every row, so its prompt processing is exactly one full forward pass, like Model.forward."""
    cmd = [str(bench), "-m", model, "-p", str(n_prompt), "-n", str(n_gen), "-t", str(threads),
           "-r", str(reps), "-fa", "1" if flash_attn else "0", "-d", str(depth), "-o", "json", *extra]
    out = _run(cmd, model)
    try:
        rows = json.loads(out[out.index("["):out.rindex("]") + 1])
        r = rows[0]
    except (ValueError, IndexError, KeyError) as e:
        raise DiffuseError(f"{bench}: unexpected output on {model}") from e
    samples = np.asarray(r.get("samples_ns") or [r["avg_ns"]], dtype=np.float64) / 1e6
    ms = float(np.median(samples))      # the median, like our own timings
    return {"ms": ms, "ms_min": float(samples.min()), "ms_std": r["stddev_ns"] / 1e6,
            "tokens_per_s": (n_prompt + n_gen) / ms * 1000.0, "flash_attn": flash_attn}


_STEP_TIMES = re.compile(r"time per step: ([\d.]+)ms, sampling time per step: ([\d.]+)ms")


def diffusion_step_ms(diffusion: Path, model: str, *, n_positions: int, threads: int, steps: int = 8,
                      prompt: str = "What is the capital of France?") -> dict:
    """llama-diffusion-cli's own ms per step over a buffer of n_positions (prompt + masks):
    every step re-decodes the whole buffer with logits for every position, then samples."""
    cmd = [str(diffusion), "-m", model, "-p", prompt, "-t", str(threads), "-tb", str(threads),
           "-ub", str(n_positions), "-b", str(n_positions), "-c", str(n_positions),
           "--diffusion-steps", str(steps), "--diffusion-eps", "0.001", "--diffusion-algorithm", "1",
           "--temp", "0", "--seed", "0", "-fa", "off"]
    m = _STEP_TIMES.search(_run(cmd, model))
    if not m:
        raise DiffuseError(f"{diffusion}: no step timing in its output on {model}")
    return {"ms_per_step": float(m.group(1)), "sampling_ms_per_step": float(m.group(2)), "steps": steps}


def batched_decode(batched: Path, model: str, *, batches: list[int], threads: int, n_prompt: int,
                   n_gen: int) -> list[dict]:
    """AR batched decoding with llama-batched-bench: for each batch size B, B sequences of n_prompt
    tokens are processed, then n_gen decode steps each produce one token for every sequence (one
    forward pass of B rows per step). Returns per B the decode and prompt tokens/s over all sequences."""
    n_ctx = max(batches) * (n_prompt + n_gen)
    cmd = [str(batched), "-m", model, "-c", str(n_ctx), "-b", "2048", "-ub", "512", "-npp", str(n_prompt),
           "-ntg", str(n_gen), "-npl", ",".join(map(str, batches)), "-t", str(threads), "-tb", str(threads),
           "-fa", "off", "--output-format", "jsonl"]
    rows = []
    for line in _run(cmd, model).splitlines():
        if line.startswith("{") and '"speed_tg"' in line:
            r = json.loads(line)
            rows.append({"batch": r["pl"], "tokens_per_s": r["speed_tg"], "prompt_tokens_per_s": r["speed_pp"],
                         "decode_s": r["t_tg"]})
    if sorted(r["batch"] for r in rows) != sorted(batches):
        raise DiffuseError(f"{batched}: expected results for batches {batches} on {model}, got {len(rows)}")
    return rows


def have_llama_cpp_python() -> bool:
    return importlib.util.find_spec("llama_cpp") is not None


def ar_baseline(model: str, *, threads: int, n_prompt: int, n_gen: int, reps: int = 3,
                backend: str = "auto", bins: LlamaBins | None = None) -> dict:
    """Autoregressive speed of an AR GGUF: prompt tokens/s (a batch of n_prompt) and decode
    tokens/s (n_gen single-token steps after it). backend: 'llama-cpp-python', 'llama-bench' or
    'auto' (the first one available)."""
    if backend == "auto":
        backend = "llama-cpp-python" if have_llama_cpp_python() else "llama-bench"
    if backend == "llama-bench":
        if bins is None or bins.bench is None:
            raise DiffuseError("the AR baseline needs llama-cpp-python (pip install 'diffuse[ar]') "
                               f"or llama-bench (--llama-bin or ${ENV_BIN})")
        pp = llama_bench(bins.bench, model, n_prompt=n_prompt, n_gen=0, threads=threads, reps=reps)
        tg = llama_bench(bins.bench, model, n_prompt=0, n_gen=n_gen, threads=threads, reps=reps)
        return {"backend": backend, "prompt_tokens_per_s": pp["tokens_per_s"],
                "decode_tokens_per_s": tg["tokens_per_s"], "decode_ms_per_token": 1000.0 / tg["tokens_per_s"]}
    if backend != "llama-cpp-python":
        raise DiffuseError(f"unknown AR backend {backend!r} (auto, llama-cpp-python, llama-bench)")
    return _ar_llama_cpp_python(model, threads, n_prompt, n_gen, reps)


def _ar_llama_cpp_python(model: str, threads: int, n_prompt: int, n_gen: int, reps: int) -> dict:
    try:
        from llama_cpp import Llama
    except ImportError as e:
        raise DiffuseError("llama-cpp-python is not installed (pip install 'diffuse[ar]')") from e
    try:
        llm = Llama(model_path=model, n_ctx=n_prompt + n_gen + 16, n_batch=max(n_prompt, 1),
                    n_ubatch=max(n_prompt, 1), n_threads=threads, n_threads_batch=threads, verbose=False)
    except (ValueError, RuntimeError) as e:
        raise DiffuseError(f"{model}: llama-cpp-python cannot load it: {e}") from e
    rng = np.random.default_rng(0)
    ids = rng.integers(100, min(llm.n_vocab(), 100_000), size=n_prompt + n_gen).tolist()
    prompt_s, decode_s = [], []
    for rep in range(reps + 1):          # the first round warms up
        llm.reset()
        t0 = time.perf_counter()
        llm.eval(ids[:n_prompt])         # one batch, logits of the last token only
        t1 = time.perf_counter()
        for t in ids[n_prompt:]:
            llm.eval([t])                # one decode step
        t2 = time.perf_counter()
        if rep:
            prompt_s.append(t1 - t0)
            decode_s.append(t2 - t1)
    llm.close()
    decode = n_gen / float(np.median(decode_s))
    return {"backend": "llama-cpp-python", "prompt_tokens_per_s": n_prompt / float(np.median(prompt_s)),
            "decode_tokens_per_s": decode, "decode_ms_per_token": 1000.0 / decode}
