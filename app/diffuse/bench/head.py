"""The output head's product for few rows, ggml's mat-mul against the engine's own (issue 31).

    diffuse bench head [MODEL] [--rows 1,2,4,8,16,32] [--threads N] [--reps 9]

For each row count n: the best time of y = W x with W the head (MODEL's output matrix: its type
and shape, random values; without MODEL Qwen2.5's 151936 x 896 Q8_0), by ggml's mat-mul and by
the engine's head product, alternated run by run in one process (`_core.bench_head`). Beside it
the bandwidth each reaches (W's bytes over the time: it is read once per product) against this
machine's plain memory figures: a copy (read + written bytes, `machine.memcpy_gbps`) and a read
(numpy summing a 256 MiB array, per thread).

The engine picks its head product per model and row count by timing both on first use
(core_cpp/src/head_product.h); DIFFUSE_HEAD=own or ggml forces one (`forced_head`).
"""
from __future__ import annotations

import contextlib
import os
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from diffuse import DiffuseError

ENV = "DIFFUSE_HEAD"
QWEN_HEAD = (8, "q8_0", 151936, 896)   # ggml type id, name, vocabulary rows, width
COLUMNS = [("n", "rows", "{}"), ("ggml_ms", "ggml ms", "{:.2f}"), ("own_ms", "own ms", "{:.2f}"),
           ("ratio", "own / ggml", "{:.2f}"), ("ggml_gbps", "ggml GB/s", "{:.1f}"), ("own_gbps", "own GB/s", "{:.1f}"),
           ("own_of_read", "own / memory read", "{:.2f}")]


@contextlib.contextmanager
def forced_head(which: str):
    """The engine's head product forced to `which` ("own", "ggml" or "auto") inside the block: the
    engine reads DIFFUSE_HEAD at every pass. The caller's setting comes back afterwards."""
    old = os.environ.get(ENV)
    os.environ[ENV] = which
    try:
        yield
    finally:
        if old is None:
            os.environ.pop(ENV, None)
        else:
            os.environ[ENV] = old


def read_gbps(threads: int = 1, mib: int = 256, reps: int = 5) -> float:
    """Best plain memory-read bandwidth, GB/s: `threads` numpy sums of disjoint slices of a `mib`
    MiB float64 array at once (numpy releases the GIL), past the last-level cache."""
    a = np.ones(mib * 2**20 // 8)
    parts = np.array_split(a, threads)
    best = float("inf")
    with ThreadPoolExecutor(threads) as pool:
        for _ in range(reps + 1):   # the first pass faults the pages in
            t0 = time.perf_counter()
            list(pool.map(np.sum, parts))
            best = min(best, time.perf_counter() - t0)
    return a.nbytes / best / 1e9


def head_of(path: str) -> tuple[int, str, int, int]:
    """(ggml type id, its name, vocabulary rows, hidden width) of a GGUF's output matrix (the token
    embedding when tied)."""
    from diffuse import gguf_file
    tensors = {t.name: t for t in gguf_file.read(path).tensors}
    t = tensors.get("output.weight") or tensors.get("token_embd.weight")
    if t is None:
        raise DiffuseError(f"{path}: no output.weight or token_embd.weight")
    return int(t.type), t.type_name, int(t.shape[1]), int(t.shape[0])


def run(model: str | None, rows: list[int], threads: int, reps: int, log=lambda line: None) -> dict:
    from diffuse import _core
    from diffuse.bench.machine import memcpy_gbps

    if any(n < 1 or n > 32 for n in rows):
        raise DiffuseError(f"--rows must be between 1 and 32 (got {rows})")
    type_id, type_name, m, k = head_of(model) if model else QWEN_HEAD
    nbytes = m * k * _core.type_info(type_id)["type_size"] // _core.type_info(type_id)["block_size"]
    read = read_gbps(threads)
    out = []
    for n in rows:
        g, o = _core.bench_head(type_id, k, m, n, threads=threads, reps=reps)
        out.append({"n": n, "ggml_ms": g * 1e3, "own_ms": o * 1e3, "ratio": o / g, "ggml_gbps": nbytes / g / 1e9,
                    "own_gbps": nbytes / o / 1e9, "own_of_read": nbytes / o / 1e9 / read})
        log(f"{n} rows: ggml {g * 1e3:.2f} ms, own {o * 1e3:.2f} ms")
    return {"model": model, "type": type_name, "shape": [m, k], "bytes": nbytes, "threads": threads, "reps": reps,
            "isa": _core.HEAD_PRODUCT_ISA, "read_gbps": read, "memcpy_gbps": memcpy_gbps(threads), "rows": out}


def header(result: dict) -> str:
    m, k = result["shape"]
    return (f"Output head {m} x {k} {result['type'].upper()} ({result['bytes'] / 2**20:.0f} MiB), {result['threads']} "
            f"threads, best of {result['reps']} alternated runs; own product on {result['isa']}. Memory on this "
            f"machine: read {result['read_gbps']:.1f} GB/s, copy {result['memcpy_gbps']:.1f} GB/s (read + write).")


def markdown(result: dict) -> str:
    from diffuse.bench.tables import md_table
    return header(result) + "\n\n" + md_table(result["rows"], COLUMNS)
