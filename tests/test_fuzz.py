"""Fuzzing: damaged copies of valid tiny models never take the process down.

Each case flips bits, overwrites bytes, truncates, or splices bytes from elsewhere into one
region of a valid file (header, metadata, tensor table or tensor data). One worker process
loads each damaged file, runs a forward pass and the tokenizer, describes it (`diffuse info`)
and quantizes it, and reports; if it dies (a signal) or hangs, the case is recorded, its file
kept in /tmp/fuzz_crashes/, and a new worker carries on with the next case. Every failure must
be a DiffuseError that names the file.
"""
from __future__ import annotations

import json
import os
import random
import selectors
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

CRASH_DIR = Path("/tmp/fuzz_crashes")
N_CASES = 600
CASE_TIMEOUT_S = 30          # one load + forward takes milliseconds; longer means a hang
INTERESTING = [b"\x00" * 8, b"\xff" * 8, b"\x7f\xff\xff\xff", b"\x00\x00\x00\x80", b"\xff\xff\xff\x7f",
               (2**62).to_bytes(8, "little"), (2**31).to_bytes(4, "little"), b"\x01\x00\x00\x00"]


def regions(path: Path) -> dict[str, list[tuple[int, int]]]:
    """Byte ranges to damage, per region: the header; the start (64 bytes) of every metadata entry
    and of every tensor info, where the lengths, types and counts are; the tensor data."""
    from gguf import GGUFReader
    reader = GGUFReader(path)
    kv = sorted(f.offset for f in reader.fields.values() if f.offset >= 24)
    ti = [t.field.offset for t in reader.tensors]
    def starts(offsets, end):
        return [(a, min(a + 64, b)) for a, b in zip(offsets, offsets[1:] + [end])]
    return {"header": [(0, 24)], "kv": starts(kv, ti[0]), "tensor_infos": starts(ti, reader.data_offset),
            "data": [(reader.data_offset, path.stat().st_size)]}


def make_cases(bases: list[Path], n: int, seed: int = 1234) -> list[dict]:
    """Mutation specs; each is reproducible from its dict alone (see mutate)."""
    rng = random.Random(seed)
    spans = [regions(p) for p in bases]
    weights = {"header": 1, "kv": 4, "tensor_infos": 4, "data": 2}
    cases = []
    for i in range(n):
        b = i % len(bases)
        region = rng.choices(list(weights), list(weights.values()))[0]
        lo, hi = rng.choice(spans[b][region])
        kind = rng.choice(["flip", "overwrite", "interesting", "truncate", "splice"])
        pos = rng.randrange(lo, hi)
        case = {"id": i, "base": b, "region": region, "kind": kind, "pos": pos}
        if kind == "flip":
            case["bits"] = [[rng.randrange(lo, hi), rng.randrange(8)] for _ in range(rng.randint(1, 8))]
        elif kind == "overwrite":
            case["bytes"] = [rng.randrange(256) for _ in range(rng.randint(1, 16))]
        elif kind == "interesting":
            case["bytes"] = list(rng.choice(INTERESTING))
        elif kind == "splice":
            size = spans[b]["data"][0][1]
            case["src"] = rng.randrange(0, size - 64)
            case["len"] = rng.randint(4, 64)
        cases.append(case)
    return cases


def mutate(data: bytes, case: dict) -> bytes:
    out = bytearray(data)
    kind, pos = case["kind"], case["pos"]
    if kind == "flip":
        for p, bit in case["bits"]:
            out[p] ^= 1 << bit
    elif kind in ("overwrite", "interesting"):
        chunk = bytes(case["bytes"])
        out[pos:pos + len(chunk)] = chunk
    elif kind == "truncate":
        del out[pos:]
    elif kind == "splice":
        chunk = data[case["src"]:case["src"] + case["len"]]
        out[pos:pos + len(chunk)] = chunk
    return bytes(out)


# ---- the worker (this file run as a script) ----

def worker(bases: list[str], cases_file: str, start: int, workdir: str) -> None:
    import diffuse
    from diffuse import DiffuseError
    from diffuse.info import describe
    from diffuse.quantize import quantize_file

    data = [Path(b).read_bytes() for b in bases]
    cases = json.loads(Path(cases_file).read_text())
    quantized = Path(workdir) / "quantized.gguf"

    def engine(path: Path) -> None:
        m = diffuse.load(path, threads=1)
        m.forward(np.arange(4) % m.n_vocab)
        tok = m.tokenizer
        tok.decode(tok.encode("The river ran past the old mill."))

    def quantize(path: Path, case: dict) -> None:
        # Q4_K's search for scales meets the NaN/Inf weights of damaged data; elsewhere Q8_0 is quicker.
        quantize_file(path, quantized, "Q4_K_M" if case["region"] == "data" else "Q8_0", threads=1)
        quantized.unlink()

    for case in cases[start:]:
        path = Path(workdir) / f"case_{case['id']}.gguf"
        path.write_bytes(mutate(data[case["base"]], case))
        print(f"start {case['id']}", flush=True)
        if case["kind"] == "abort":   # the harness's own test: a worker that dies
            os.abort()
        status, details = "ok", []
        for step in (engine, describe, lambda p: quantize(p, case)):
            try:
                step(path)
            except DiffuseError as e:
                status, details = ("error" if status == "ok" else status), details + [str(e)]
            except BaseException as e:   # noqa: BLE001 - any other exception is what the test reports
                status, details = "other", details + [f"{type(e).__module__}.{type(e).__name__}: {e}"]
        path.unlink()
        print(f"done {case['id']} {status} {json.dumps(details)}", flush=True)


if __name__ == "__main__" and sys.argv[1:2] == ["--worker"]:
    worker(sys.argv[2].split(os.pathsep), sys.argv[3], int(sys.argv[4]), sys.argv[5])
    sys.exit(0)


# ---- the test ----

def run_cases(bases: list[Path], cases: list[dict], tmp: Path) -> tuple[dict, list]:
    """Results by case id ("ok" | "error" | "other", message), and deaths: (case, why) for each
    case during which a worker died or hung (case None: it died outside any case)."""
    cases_file = tmp / "cases.json"
    cases_file.write_text(json.dumps(cases))
    results, deaths = {}, []
    start = 0
    while start < len(cases):
        proc = subprocess.Popen(
            [sys.executable, __file__, "--worker", os.pathsep.join(map(str, bases)), str(cases_file), str(start),
             str(tmp)], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        current, why = None, None
        with selectors.DefaultSelector() as sel:
            sel.register(proc.stdout, selectors.EVENT_READ)
            while True:
                if not sel.select(timeout=CASE_TIMEOUT_S):
                    proc.kill()
                    why = f"hang over {CASE_TIMEOUT_S} s"
                    break
                line = proc.stdout.readline()
                if not line:
                    break
                word, case_id, *rest = line.rstrip("\n").split(" ", 3)
                if word not in ("start", "done"):
                    continue
                if word == "start":
                    current = int(case_id)
                else:
                    results[current] = (rest[0], json.loads(rest[1]))
                    current = None
        proc.wait()
        proc.stdout.close()
        if current is None and why is None and proc.returncode == 0:
            break
        code = proc.returncode
        why = why or (f"signal {-code}" if code < 0 else f"exit status {code}")
        if current is None:   # died outside a case (start-up): nothing to resume
            deaths.append((None, why))
            break
        deaths.append((cases[current], why))
        start = current + 1
    return results, deaths


def keep_reproducer(base: Path, case: dict, why: str) -> Path:
    CRASH_DIR.mkdir(exist_ok=True)
    out = CRASH_DIR / f"{base.stem}_case{case['id']}.gguf"
    out.write_bytes(mutate(base.read_bytes(), case))
    out.with_suffix(".json").write_text(json.dumps({"base": str(base), "case": case, "why": why}, indent=2))
    return out


def test_fuzz_damaged_models(tiny_gguf, tmp_path):
    bases = [tiny_gguf("llada", "q8_0"), tiny_gguf("dream", "q8_0"), tiny_gguf("dream", "f16")]
    cases = make_cases(bases, N_CASES)
    t0 = time.monotonic()
    results, deaths = run_cases(bases, cases, tmp_path)
    elapsed = time.monotonic() - t0

    problems = []
    for case, why in deaths:
        where = keep_reproducer(bases[case["base"]], case, why) if case else "outside any case"
        problems.append(f"worker died ({why}): {where}")
    for case_id, (status, messages) in sorted(results.items()):
        case = cases[case_id]
        if status == "other":
            problems.append(f"not a DiffuseError: {messages} ({keep_reproducer(bases[case['base']], case, status)})")
        problems += [f"case {case_id}: the message does not name the file: {m}"
                     for m in messages if f"case_{case_id}.gguf" not in m]
    assert not problems, "\n".join(problems[:20])
    assert len(results) == len(cases) >= 500
    outcomes = {s: sum(1 for r in results.values() if r[0] == s) for s in ("ok", "error")}
    print(f"fuzz: {len(cases)} cases in {elapsed:.1f} s: {outcomes}")
    assert outcomes["error"] > 100 and outcomes["ok"] > 50   # the mutations reach both outcomes


def test_harness_reports_a_dying_worker(tiny_gguf, tmp_path):
    base = tiny_gguf("llada", "q8_0")
    cases = [{"id": 0, "base": 0, "region": "data", "kind": "flip", "pos": 0, "bits": [[30000, 1]]},
             {"id": 1, "base": 0, "region": "header", "kind": "abort", "pos": 0},
             {"id": 2, "base": 0, "region": "header", "kind": "truncate", "pos": 10}]
    results, deaths = run_cases([base], cases, tmp_path)
    assert deaths == [(cases[1], "signal 6")]
    assert results[0][0] == "ok" and results[2][0] == "error" and "too small" in results[2][1][0]
