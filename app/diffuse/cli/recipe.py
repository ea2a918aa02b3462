"""`diffuse recipe MODEL [--set OPTION=VALUE ...] [--unset OPTION ...] [--clear] [-o OUT]`: show or
change the generation options a model file suggests (diffuse.recipe)."""
from __future__ import annotations

import argparse
from pathlib import Path

from diffuse import DiffuseError, load, recipe
from diffuse.cli import check_output
from diffuse.generation import OPTION_NAMES, default_options


def add_parser(sub) -> argparse.ArgumentParser:
    p = sub.add_parser(
        "recipe", help="show or change the generation options a model file suggests",
        description="A model's recipe is the generation options its GGUF file suggests (keys "
                    "diffuse.recipe.<option>); they are the defaults of generate, bench, serve and "
                    "the Studio, over the family's. Without --set, --unset or --clear, show it. "
                    "Changing it rewrites the file (tensors copied as they are), or writes OUT.")
    p.add_argument("model", metavar="MODEL", help="GGUF model file")
    p.add_argument("--set", action="append", default=[], metavar="OPTION=VALUE",
                   help="suggest this value (repeatable), e.g. --set temperature=0.7; options: "
                        + ", ".join(OPTION_NAMES))
    p.add_argument("--unset", action="append", default=[], metavar="OPTION",
                   help="suggest nothing for this option: the family default applies (repeatable)")
    p.add_argument("--clear", action="store_true", help="remove the whole recipe (before any --set)")
    p.add_argument("-o", "--output", metavar="OUT.gguf", help="write the changed model here instead of over MODEL")
    return p


def run(args: argparse.Namespace) -> int:
    changes = recipe.parse(args.set, "--set")
    unknown = [n for n in args.unset if n.replace("-", "_") not in OPTION_NAMES]
    if unknown:
        raise DiffuseError(f"--unset {unknown[0]}: no such option; options: {', '.join(OPTION_NAMES)}")
    if args.output:
        check_output(args.output, "-o", [args.model])
    model = load(args.model, threads=1)
    if not (changes or args.unset or args.clear):
        print(f"recipe    {recipe.text(model.recipe)}")
        print(f"defaults  {recipe.text(default_options(model.arch, model.recipe))}")
        return 0
    new = {} if args.clear else dict(model.recipe)
    for name in args.unset:
        new.pop(name.replace("-", "_"), None)
    new.update(changes)
    del model
    written = recipe.write(args.model, new, args.output)
    print(f"wrote {args.output or args.model}: recipe {recipe.text(written)}")
    return 0
