"""`diffuse info FILE.gguf`: what a model file holds."""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from diffuse import DiffuseError
from diffuse.generation import default_options
from diffuse.cli import check_input
from diffuse.info import describe, escaped, format_info, format_json


def add_parser(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser("info", help="show what a GGUF model file holds",
                              description="Show a GGUF file's family, dialect, hyper-parameters, weight "
                                          "types and tokenizer (or, for a recording of a run, what it "
                                          "holds). Exits 1 when the engine cannot load the model.")
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
    check_input(args.file)
    if args.tokenizer:
        check_input(args.tokenizer, "--tokenizer")
    with open(args.file, "rb") as f:
        if f.read(4) == b"PK\x03\x04":     # a zip (.npz): a recording of a run, not a model
            return _recording(args)
    d = describe(args.file, tokenizer=args.tokenizer)
    print(format_json(d) if args.json else format_info(d, tensors=args.tensors))
    if d["family"] is not None and "load_error" in d:
        # described as far as it goes, but a damaged or truncated model is no success
        raise DiffuseError(f"the engine cannot load it: {d['load_error']}")
    return 0


def _options_shown(options: dict, arch) -> list[str]:
    """A recording's options as "name value", those that differ from the architecture's defaults
    (the ones that say what the run did) first."""
    try:
        defaults = default_options(arch) if isinstance(arch, str) else {}
    except DiffuseError:     # an architecture this build does not know
        defaults = {}
    shown = {k: v for k, v in options.items() if v is not None}
    ordered = sorted(shown, key=lambda k: k in defaults and defaults[k] == shown[k])     # stable: changed first
    return [escaped(f"{k} {shown[k]}") for k in ordered]


def _wrapped(label: str, items: list[str], width: int = 100) -> list[str]:
    """`label` and the comma-separated items, wrapped at `width` columns under the values' column."""
    lines, line = [], f"{label:<14}"
    for i, item in enumerate(items):
        piece = item + ("," if i < len(items) - 1 else "")
        if len(line) + len(piece) + 1 > width and line.strip() != label:
            lines.append(line.rstrip())
            line = " " * 14
        line += piece + " "
    return [*lines, line.rstrip()]


def _recording(args: argparse.Namespace) -> int:
    from diffuse.recording import Recording
    rec = Recording.load(args.file)
    r = rec.result
    summary = {"path": args.file, "kind": "recording", "model": rec.model, "prompt": rec.prompt,
               "options": rec.options, "steps_recorded": len(rec.events),
               "stop_reason": r.stop_reason if r else None, "text": r.text if r else None}
    if args.json:
        print(json.dumps(summary, ensure_ascii=False))
        return 0
    name = rec.model.get("name") or "?"
    lines = [f"file          {escaped(args.file)} (a recording of a run, not a GGUF model: replay it in "
             f"Diffuse Studio)",
             f"model         {escaped(str(name))} ({escaped(str(rec.model.get('arch', '?')))})",
             f"prompt        {escaped(rec.prompt)}",
             f"steps         {len(rec.events)} recorded" + (f", {r.steps}/{r.steps_allowed} ({r.stop_reason})" if r else ""),
             *_wrapped("options", _options_shown(rec.options, rec.model.get("arch")))]
    if r is not None:
        lines.append(f"answer        {escaped(r.text)}")
    print("\n".join(lines))
    return 0
