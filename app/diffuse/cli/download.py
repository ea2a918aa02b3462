"""`diffuse download MODEL`: a real model of the catalog (models/catalog.json) from the Hugging
Face hub, as its ready GGUF (one file of 4-5 GB, the default where the catalog has one) or as the
whole checkpoint folder (3-16 GB) to convert; the block-diffusion models come only as their
checkpoint. Resumable: run the same command again."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from diffuse import catalog, hub
from diffuse.cli import check_output_folder

FORMATS = ("gguf", "hf")


def add_parser(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser(
        "download", help="download a model of the catalog (a ready GGUF, or the HF checkpoint)",
        description="Download a real model from the Hugging Face hub: its ready GGUF file (the "
                    "default where the catalog has one; checked against the hub's sha256 and the "
                    "catalog's) or its whole checkpoint folder, to make a GGUF with `diffuse "
                    "convert`. An interrupted download resumes when the command is run again. "
                    "Without MODEL, lists the catalog.")
    p.add_argument("model", metavar="MODEL", nargs="?", help="catalog id, e.g. llada-8b-instruct")
    p.add_argument("--format", choices=FORMATS, default=None,
                   help="gguf: the ready GGUF file; hf: the checkpoint folder "
                        "(default: gguf when the catalog has one)")
    p.add_argument("-o", "--output-dir", metavar="FOLDER", default=".",
                   help="where to put the file or the checkpoint folder (default: here)")
    return p


def run(args: argparse.Namespace) -> int:
    models = catalog.load()
    if args.model is None:
        print(_listing(models))
        return 0
    model = catalog.find(models, args.model)
    fmt = args.format or ("gguf" if "ready_gguf" in model else "hf")
    folder = check_output_folder(args.output_dir, "-o")   # before anything is fetched
    live = sys.stderr.isatty()

    def progress(done: int, total: int, what: str) -> None:
        if live:
            print(f"\rdownload {100 * done / max(total, 1):5.1f}%  {done / 1e9:6.2f}/"
                  f"{total / 1e9:.2f} GB  {what:<40.40}", end="", file=sys.stderr, flush=True)

    stopped = False
    try:
        if fmt == "gguf":
            path = catalog.download_ready_gguf(model, folder, progress=progress)
        else:
            path = hub.download(model["hf_repo"], folder / model["hf_repo"].split("/")[-1],
                                progress=progress)
    except KeyboardInterrupt:     # what arrived stays in .part files
        stopped = True
    finally:
        if live:
            print(file=sys.stderr)
    if stopped:
        print("diffuse: download stopped; run the same command again to resume it",
              file=sys.stderr)
        return 130
    if fmt == "gguf":
        gguf = model["ready_gguf"]
        print(f"wrote {path} ({gguf['quantization'].upper()}, {path.stat().st_size / 1e9:.2f} GB, "
              f"needs about {gguf['ram_gb']:.1f} GB of RAM)")
    else:
        print(f"wrote {path}; make a GGUF with: diffuse convert {path} --outtype f16")
    return 0


def _listing(models: list[dict]) -> str:
    lines = []
    ids, families = (max((len(m[k]) for m in models), default=0) for k in ("id", "family"))
    for m in models:
        gguf = m.get("ready_gguf")
        ready = (f"ready GGUF {gguf['quantization'].upper()} {catalog.gguf_size_text(gguf)}, "
                 f"RAM {gguf['ram_gb']:.1f} GB" if gguf else "no ready GGUF")
        lines.append(f"{m['id']:<{ids}}  {m['family']:<{families}}  {ready}; checkpoint "
                     f"{m['download_bytes'] / 1e9:.1f} GB")
    return "\n".join(lines)
