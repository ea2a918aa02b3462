"""`diffuse quantize IN.gguf OUT.gguf TYPE`: write a model in another weight type."""
from __future__ import annotations

import argparse
import os
import sys
import time

from diffuse import DiffuseError
from diffuse.cli import check_input, check_output
from diffuse.quantize import QTYPES, quantize_file


def add_parser(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser(
        "quantize", help="write a GGUF model in another weight type",
        description="Write a GGUF model in another weight type. Q4_K_M and Q5_K_M use llama.cpp's "
                    "per-tensor mixture; norms and biases stay F32.")
    p.add_argument("input", help="model to read (any dialect, any weight type)")
    p.add_argument("output", help="file to write")
    p.add_argument("type", type=str.upper, choices=list(QTYPES), metavar="TYPE",
                   help=f"one of {', '.join(QTYPES)}")
    p.add_argument("--threads", type=int, default=None,
                   help=f"CPU threads, 1 to the logical CPUs (default: all, {os.cpu_count()} here)")
    return p


def run(args: argparse.Namespace) -> int:
    check_input(args.input, "input")
    check_output(args.output, "output", [args.input])
    if args.threads is not None and args.threads < 1:
        raise DiffuseError(f"--threads must be at least 1 (got {args.threads})")
    cpus = os.cpu_count() or 1
    if args.threads is not None and args.threads > cpus:
        print(f"diffuse: note: --threads {args.threads} is more than the {cpus} logical CPUs; using {cpus}",
              file=sys.stderr)
        args.threads = cpus
    start = time.monotonic()
    live = sys.stderr.isatty()
    shown = 0.0

    def progress(done: int, total: int, name: str) -> None:
        nonlocal shown
        now = time.monotonic()
        if live and (now - shown > 0.1 or done == total):
            shown = now
            print(f"\rquantize {100 * done / max(total, 1):5.1f}%  {name:<36.36}", end="", file=sys.stderr, flush=True)

    quantize_file(args.input, args.output, args.type, progress=progress, threads=args.threads,
                  warn=lambda text: print(f"diffuse: warning: {text}", file=sys.stderr))
    if live:
        print(file=sys.stderr)
    size_in, size_out = os.path.getsize(args.input), os.path.getsize(args.output)
    print(f"wrote {args.output} ({args.type}, {size_out / 2**20:.1f} MiB from {size_in / 2**20:.1f} MiB) "
          f"in {time.monotonic() - start:.1f} s")
    return 0
