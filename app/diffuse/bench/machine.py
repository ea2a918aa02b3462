"""The machine a benchmark ran on, its memory-copy bandwidth, and the process's memory use."""
from __future__ import annotations

import json
import os
import platform
import resource
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from diffuse import DiffuseError, _core


def describe() -> dict:
    """CPU model, cores, memory, SIMD flags and load: everything a reader needs to weigh the numbers."""
    cpuinfo = {}
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, _, value = line.partition(":")
                cpuinfo.setdefault(key.strip(), value.strip())
    except OSError:
        pass
    cpu = cpuinfo.get("model name") or platform.processor() or platform.machine()
    flags = cpuinfo.get("flags", "").split()
    simd = [f for f in ("avx2", "fma", "f16c", "avx512f", "avx512_bf16", "avx512_vnni", "avx_vnni", "amx_tile")
            if f in flags]
    return {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "physical_cores": _core.physical_cores(),
        "memory_gib": round(_meminfo_kib("MemTotal") / 2**20, 1),
        "simd": simd,
        "load_avg_1min": round(os.getloadavg()[0], 2),
        "os": f"{platform.system()} {platform.release()}",
        "python": platform.python_version(),
        "ggml": _core.GGML_VERSION,
    }


def describe_line(m: dict) -> str:
    return (f"{m['cpu']}, {m['cores']} cores, {m['memory_gib']} GiB, {' '.join(m['simd']) or 'no AVX2'}, "
            f"ggml {m['ggml']}, load {m['load_avg_1min']} at start")


def _meminfo_kib(key: str) -> int:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith(key + ":"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def peak_rss_bytes() -> int:
    """The process's peak resident set so far. Memory-mapped weight pages that were touched count,
    so after a forward pass it includes the file. VmHWM where Linux has it: ru_maxrss survives
    exec, so a benchmark child started from a big parent would report the parent's peak."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024   # KiB on Linux


def rss_bytes() -> int:
    """The process's resident set now."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except OSError:
        return peak_rss_bytes()


def memcpy_gbps(threads: int = 1, mib: int = 256, reps: int = 5) -> float:
    """Best memory-copy bandwidth, GB/s counted as bytes read + bytes written (the traffic of a
    copy), with `threads` numpy copies of disjoint slices at once (numpy releases the GIL).
    `mib` per buffer, well past the last-level cache."""
    n = mib * 2**20 // 8
    src = np.ones(n, dtype=np.float64)
    dst = np.empty_like(src)
    bounds = np.linspace(0, n, threads + 1, dtype=np.int64)
    parts = [(dst[a:b], src[a:b]) for a, b in zip(bounds[:-1], bounds[1:])]
    best = float("inf")
    with ThreadPoolExecutor(threads) as pool:
        for _ in range(reps + 1):    # the first pass faults the pages in
            t0 = time.perf_counter()
            list(pool.map(lambda p: np.copyto(*p), parts))
            best = min(best, time.perf_counter() - t0)
    return 2 * src.nbytes / best / 1e9


def run_in_child(module: str, function: str, **kwargs) -> dict:
    """`module.function(**kwargs)` in a fresh Python process, its JSON result back: the child's
    peak RSS (peak_rss_bytes) is that one measurement's alone."""
    code = ("import json, sys; from " + module + " import " + function + " as f; "
            "print(json.dumps(f(**json.loads(sys.argv[1]))))")
    out = subprocess.run([sys.executable, "-c", code, json.dumps(kwargs)], capture_output=True, text=True)
    if out.returncode != 0:
        lines = out.stderr.strip().splitlines() or [f"exit {out.returncode}"]
        raise DiffuseError(f"{module}.{function} failed in its child process: {lines[-1]}")
    return json.loads(out.stdout.strip().splitlines()[-1])
