"""The fixed cost of a forward pass and of a denoising step, on a small model where it dominates.

Times a 1-row forward pass repeated with the same shape (the graph is reused) and with the shape
changing every call (rebuilt and re-planned), and the median step of a short cached run.

    python -m diffuse.bench.overhead [MODEL.gguf] [--threads 2]    (default: the demo model)
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

DEMO = Path(__file__).resolve().parent.parent / "models" / "diffuse-demo-3m.gguf"


def per_call_ms(fn, reps: int = 300) -> float:
    fn()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e3)
    return float(np.median(times))


def run(path: str, threads: int) -> dict:
    import diffuse

    m = diffuse.load(path, threads=threads)
    one, two = np.array([5]), np.array([5, 6])
    flip = [False]

    def changing():
        flip[0] = not flip[0]
        m.forward(one if flip[0] else two)

    runs = [m.generate("Tell me about the weather.", gen_length=64, steps=64, block_length=16, temperature=0.7,
                       seed=s) for s in range(3)]
    return {"threads": threads, "forward_1_row_same_shape_ms": per_call_ms(lambda: m.forward(one)),
            "forward_1_row_changing_shape_ms": per_call_ms(changing),
            "step_ms": float(np.median(np.concatenate([r.step_ms for r in runs])))}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model", nargs="?", default=str(DEMO))
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args(argv)
    r = run(args.model, args.threads)
    print(f"threads {r['threads']}: 1-row forward {r['forward_1_row_same_shape_ms']:.3f} ms (same shape), "
          f"{r['forward_1_row_changing_shape_ms']:.3f} ms (shape changing); step {r['step_ms']:.2f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
