"""The `diffuse` command. Each sub-command lives in its own module with add_parser() and run()."""
from __future__ import annotations

import argparse
import importlib
import os
import sys
import warnings
from pathlib import Path

from diffuse import DiffuseError, __version__, gguf_file
from diffuse._core import GGML_VERSION
from diffuse.info import escaped
from diffuse.recipe import RecipeWarning

COMMANDS = ["convert", "quantize", "info", "recipe", "generate", "bench", "train", "serve", "download"]


def check_output(path: str, option: str, inputs: list[str], example_name: str = "model.gguf") -> str:
    """Refuse an output path that cannot become a file before any work is done (a conversion or
    a run would otherwise go to the end and fail at the save). Overwriting an input is named first."""
    gguf_file.refuse_overwrite(path, inputs)
    example = f"{path.rstrip('/' + os.sep)}/{example_name}"
    if Path(path).is_dir():
        raise DiffuseError(f"{option} {path}: is a folder; give a file name (e.g. {example})")
    if path.endswith(("/", os.sep)):
        raise DiffuseError(f"{option} {path}: ends with a path separator; give a file name (e.g. {example})")
    parent = Path(path).parent
    if not parent.is_dir():
        raise DiffuseError(f"{option} {path}: the folder {parent} does not exist")
    return path


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="diffuse", description="CPU inference for masked diffusion language models")
    parser.add_argument("--version", action="version", version=f"diffuse {__version__} (ggml {GGML_VERSION})")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name in COMMANDS:
        module = importlib.import_module(f"diffuse.cli.{name}")
        p = module.add_parser(sub)
        p.set_defaults(_run=module.run)
    return parser


def _message(text: str) -> str:
    # Messages quote file names, keys and values from files a stranger may have made: escaped,
    # so they cannot drive the terminal.
    return "\n".join(escaped(line, limit=None) for line in text.split("\n"))


def _show_warning(message, category, filename, lineno, file=None, line=None) -> None:
    """A warning (e.g. a model file's recipe ignored) as one line, like the errors."""
    print(f"diffuse: warning: {_message(str(message))}", file=sys.stderr)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    args.argv = sys.argv[1:] if argv is None else list(argv)   # benchmarks record their command
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("default", RecipeWarning)     # told, never raised
            warnings.showwarning = _show_warning
            return args._run(args)
    except DiffuseError as e:
        print(f"diffuse: error: {_message(str(e))}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("diffuse: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
