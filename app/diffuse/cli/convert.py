"""`diffuse convert HF_DIR -o OUT.gguf --outtype f16`: a Hugging Face checkpoint folder to GGUF."""
from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

from diffuse import DiffuseError, recipe
from diffuse.cli import check_input, check_output
from diffuse.convert import OUTTYPES, TAKES, convert_hf


def add_parser(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser(
        "convert", help=f"convert a Hugging Face checkpoint folder to GGUF ({TAKES})",
        description=f"Convert a Hugging Face checkpoint folder (config.json, safetensors, tokenizer) of "
                    f"{TAKES} to one GGUF file that diffuse and llama.cpp can run. Norms and biases stay F32.")
    p.add_argument("hf_dir", metavar="HF_DIR", help="folder with config.json and *.safetensors")
    p.add_argument("-o", "--output", metavar="OUT.gguf",
                   help="file to write (default: <folder name>-<outtype>.gguf in the current directory)")
    p.add_argument("--outtype", choices=list(OUTTYPES), default="f16", help="type of the weight matrices (default: f16)")
    p.add_argument("--recipe", action="append", default=[], metavar="OPTION=VALUE",
                   help="a generation option the model suggests, stored in the file and used as its "
                        "default everywhere (repeatable), e.g. --recipe temperature=0.7; see diffuse recipe")
    return p


def run(args: argparse.Namespace) -> int:
    if not Path(args.hf_dir).is_dir():
        check_input(args.hf_dir, "HF_DIR")     # says what it is instead (missing, a FIFO, ...)
        raise DiffuseError(f"HF_DIR {args.hf_dir}: is a file; give the checkpoint's folder (config.json, *.safetensors)")
    out = args.output or f"{Path(args.hf_dir).resolve().name}-{args.outtype}.gguf"
    out = Path(check_output(out, "-o", [args.hf_dir]))
    suggested = recipe.parse(args.recipe, "--recipe")
    start = time.monotonic()
    live = sys.stderr.isatty()

    def progress(done: int, total: int, name: str) -> None:
        if live:
            print(f"\rconvert [{done:>4}/{total}] {name:<40.40}", end="", file=sys.stderr, flush=True)

    convert_hf(args.hf_dir, out, args.outtype, progress=progress, recipe=suggested)
    if live:
        print(file=sys.stderr)
    print(f"wrote {out} ({args.outtype}, {os.path.getsize(out) / 2**20:.1f} MiB) in {time.monotonic() - start:.1f} s"
          + (f"; recipe {recipe.text(suggested)}" if suggested else ""))
    return 0
