"""The `diffuse` command. Each sub-command lives in its own module with add_parser() and run()."""
from __future__ import annotations

import argparse
import importlib
import sys

from diffuse import DiffuseError
from diffuse.info import escaped

COMMANDS = ["convert", "quantize", "info", "generate", "bench", "train"]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="diffuse", description="CPU inference for masked diffusion language models")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name in COMMANDS:
        module = importlib.import_module(f"diffuse.cli.{name}")
        p = module.add_parser(sub)
        p.set_defaults(_run=module.run)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args._run(args)
    except DiffuseError as e:
        # Messages quote file names, keys and values from files a stranger may have made: escaped,
        # so they cannot drive the terminal.
        message = "\n".join(escaped(line, limit=None) for line in str(e).split("\n"))
        print(f"diffuse: error: {message}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("diffuse: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
