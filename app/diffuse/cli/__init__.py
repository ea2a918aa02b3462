"""The `diffuse` command. Each sub-command lives in its own module with add_parser() and run()."""
from __future__ import annotations

import argparse
import importlib
import os
import signal
import stat
import sys
import warnings
from pathlib import Path

from diffuse import DiffuseError, __version__, gguf_file
from diffuse._core import GGML_VERSION
from diffuse.info import escaped
from diffuse.convert.hf_to_gguf import NotConverted
from diffuse.recipe import RecipeWarning

COMMANDS = ["convert", "quantize", "info", "recipe", "generate", "bench", "train", "serve", "download"]


def check_output(path: str | os.PathLike, option: str, inputs: list[str], example_name: str = "model.gguf") -> str:
    """Refuse an output path that cannot become a file before any work is done (a conversion or
    a run would otherwise go to the end and fail at the save). Overwriting an input is named first.
    Every command that writes a file calls this, then writes through write_atomic or gguf_file.write."""
    path = str(path)
    try:
        gguf_file.refuse_overwrite(path, inputs)
    except DiffuseError as e:
        raise DiffuseError(f"{option} {e}") from None
    example = f"{path.rstrip('/' + os.sep)}/{example_name}"
    if Path(path).is_dir():
        raise DiffuseError(f"{option} {path}: is a folder; give a file name (e.g. {example})")
    if path.endswith(("/", os.sep)):
        raise DiffuseError(f"{option} {path}: ends with a path separator; give a file name (e.g. {example})")
    if os.path.lexists(path) and not Path(path).is_file():
        # the output replaces the path by a rename: a device or a FIFO must not be replaced
        raise DiffuseError(f"{option} {path}: is {_kind(path)}, not a regular file; give a file name")
    parent = Path(path).parent
    if not parent.is_dir():
        raise DiffuseError(f"{option} {path}: the folder {parent} does not exist")
    _check_writable(parent, f"{option} {path}")
    return path


def check_output_folder(path: str | os.PathLike, option: str) -> Path:
    """check_output for a folder a command fills (made when missing): the nearest folder that
    exists must be writable and have room, before any work is done."""
    path = Path(path)
    if os.path.lexists(path) and not path.is_dir():
        raise DiffuseError(f"{option} {path}: is {_kind(path)}, not a folder")
    existing = path
    while not existing.is_dir():
        if os.path.lexists(existing):
            raise DiffuseError(f"{option} {path}: {existing} is {_kind(existing)}, not a folder")
        existing = existing.parent
    _check_writable(existing, f"{option} {path}")
    return path


def _check_writable(folder: Path, what: str) -> None:
    # access() also reports a read-only file system (EROFS); root passes the permission bits.
    if not os.access(folder, os.W_OK | os.X_OK):
        raise DiffuseError(f"{what}: the folder {folder} is not writable")
    try:
        st = os.statvfs(folder)
    except (OSError, AttributeError):   # Windows has no statvfs
        return
    if st.f_bavail * st.f_frsize == 0:
        raise DiffuseError(f"{what}: the disk holding {folder} is full")


def check_input(path: str | os.PathLike, option: str = "") -> str:
    """Refuse a path to read that is missing or not a regular file, before anything opens it
    (a FIFO would block the read, /dev/zero never ends)."""
    label = f"{option} {path}" if option else str(path)
    try:
        st = os.stat(path)
    except FileNotFoundError:
        raise DiffuseError(f"{label}: no such file") from None
    except OSError as e:
        raise DiffuseError(f"{label}: cannot read it: {e.strerror}") from None
    if not stat.S_ISREG(st.st_mode):
        raise DiffuseError(f"{label}: is {_kind(path)}, not a regular file")
    if not os.access(path, os.R_OK):
        raise DiffuseError(f"{label}: cannot read it: permission denied")
    return str(path)


def _kind(path: str | os.PathLike) -> str:
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return "a broken link"
    for test, name in ((stat.S_ISDIR, "a folder"), (stat.S_ISFIFO, "a FIFO (named pipe)"),
                       (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
                       (stat.S_ISSOCK, "a socket"), (stat.S_ISREG, "a file")):
        if test(mode):
            return name
    return "a special file"


class _Parser(argparse.ArgumentParser):
    """A bad argument is one line, as every other error (argparse puts a command's whole usage,
    25 lines for generate, before it); --help has the usage."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="diffuse", description="CPU inference for masked diffusion language models")
    parser.add_argument("--version", action="version", version=f"diffuse {__version__} (ggml {GGML_VERSION})")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name in COMMANDS:
        module = importlib.import_module(f"diffuse.cli.{name}")
        p = module.add_parser(sub)
        p.set_defaults(_run=module.run)
    return parser


class _Stdout:
    """sys.stdout whose write errors are told apart: the reader went away (a pipe to `head`:
    BrokenPipeError as it is) or the output cannot be written (a full disk, a bad descriptor)."""

    def __init__(self, stream):
        self._stream = stream

    def write(self, text: str) -> int:
        return self._guarded(self._stream.write, text)

    def flush(self) -> None:
        self._guarded(self._stream.flush)

    @staticmethod
    def _guarded(call, *args):
        try:
            return call(*args)
        except BrokenPipeError:
            raise
        except OSError as e:
            raise DiffuseError(f"cannot write the output (standard output): {e.strerror or e}") from None

    def __getattr__(self, name):
        return getattr(self._stream, name)


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
    if sys.stderr is None:   # `2>&-`: no notes wanted; the answer still goes out, the exit status still tells
        sys.stderr = open(os.devnull, "w")
    if sys.stdout is None:   # Python's stdout when descriptor 1 is closed (`>&-`): print() would drop it all
        print("diffuse: error: standard output is closed; the output has nowhere to go", file=sys.stderr)
        return 1
    stdout = sys.stdout
    sys.stdout = _Stdout(stdout)
    try:
        with warnings.catch_warnings():
            for told in (RecipeWarning, NotConverted):         # told, never raised
                warnings.simplefilter("default", told)
            warnings.showwarning = _show_warning
            code = args._run(args)
            sys.stdout.flush()   # inside the try: a failing write at exit would only be a warning
            return code
    except DiffuseError as e:
        print(f"diffuse: error: {_message(str(e))}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("diffuse: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return _quiet_after_broken_pipe(stdout)
    except OSError as e:
        if e.filename is None:
            raise
        # a file the command reads or writes besides those checked up front (a plot, a log)
        print(f"diffuse: error: {escaped(str(e.filename), limit=None)}: {e.strerror or e}", file=sys.stderr)
        return 1
    finally:
        sys.stdout = stdout


def _quiet_after_broken_pipe(stdout) -> int:
    """The reader stopped reading (`| head`): end quietly, with the status of a process ended by
    SIGPIPE, as other tools do. What is still buffered goes nowhere, so the flush at exit does not
    fail again."""
    for stream in (stdout, sys.stderr):
        try:
            os.dup2(os.open(os.devnull, os.O_WRONLY), stream.fileno())
        except (OSError, ValueError):
            pass
    return 128 + signal.SIGPIPE if hasattr(signal, "SIGPIPE") else 1


if __name__ == "__main__":
    sys.exit(main())
