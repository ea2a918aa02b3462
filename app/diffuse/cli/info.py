"""`diffuse info FILE.gguf`: what a model file holds."""
from __future__ import annotations

import argparse
from pathlib import Path

from diffuse import DiffuseError
from diffuse.info import describe, format_info, format_json


def add_parser(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser("info", help="show what a GGUF model file holds",
                              description="Show a GGUF file's family, dialect, hyper-parameters, weight "
                                          "types and tokenizer.")
    p.add_argument("file", help="GGUF file")
    p.add_argument("--tensors", action="store_true", help="list every tensor")
    p.add_argument("--json", action="store_true", help="print everything as JSON")
    p.add_argument("--tokenizer", default=None, help="tokenizer.json for files that carry none (diffuse-cpp)")
    return p


def run(args: argparse.Namespace) -> int:
    folder = Path(args.file)
    if folder.is_dir():
        models = sorted(p.name for p in folder.glob("*.gguf"))
        listing = f"; it holds {', '.join(models)}" if models else " with no .gguf file in it"
        raise DiffuseError(f"{folder}: is a folder, not a GGUF file{listing}")
    d = describe(args.file, tokenizer=args.tokenizer)
    print(format_json(d) if args.json else format_info(d, tensors=args.tensors))
    return 0
