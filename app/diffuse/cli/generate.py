"""`diffuse generate`: denoise a prompt, with a live view of the steps in the terminal."""
from __future__ import annotations

import argparse
import shutil
import sys

from pathlib import Path

import numpy as np

from diffuse import DiffuseError, load, physical_cores
from diffuse.events import GenerateResult, StepEvent
from diffuse.generation import OPTIONS, default_options, resolve_options
from diffuse.gguf_file import FAMILIES
from diffuse.recording import Recording

MASK_GLYPH = "\u2591"   # light shade: a position still masked
PARSE = {"int": int, "seed": int, "float": float}


def _checked(o: dict):
    """argparse type of a numeric option: the engine's own check, so a bad value is refused with
    its range before a model is loaded (ranges do not depend on the family)."""
    def parse(text: str):
        try:
            value = PARSE[o["kind"]](text)
            resolve_options(FAMILIES[0], **{o["name"]: value})
        except ValueError:
            raise argparse.ArgumentTypeError(f"{o['name']} must be {o['range']} (got {text!r})") from None
        except DiffuseError as e:
            raise argparse.ArgumentTypeError(str(e)) from None
        return value
    return parse


def _shown(value) -> str:
    if isinstance(value, bool):
        return "on" if value else "off"
    return f"{value:g}" if isinstance(value, float) else str(value)


def _defaults_text(name: str) -> str:
    """'default 1.5', or per family where they differ: 'default llada 32, dream 0'."""
    text = {f: _shown(default_options(f)[name]) for f in FAMILIES}
    if len(set(text.values())) == 1:
        return f"default {text[FAMILIES[0]]}"
    return "default " + ", ".join(f"{f} {t}" for f, t in text.items())


def add_generation_options(p: argparse.ArgumentParser, skip: tuple[str, ...] = ()) -> None:
    """One flag per engine option (diffuse.generation.OPTIONS) not in `skip`, None = family default."""
    g = p.add_argument_group("generation (defaults depend on the model family)")
    for o in OPTIONS:
        if o["name"] in skip:
            continue
        flag = "--" + o["name"].replace("_", "-")
        # bools and choices show their values in the usage already
        about = "; ".join(([o["range"]] if o["kind"] in PARSE else []) + [_defaults_text(o["name"])])
        help_text = f"{o['help']}. {about[0].upper()}{about[1:]}.".replace("%", "%%")
        if o["kind"] == "bool":
            g.add_argument(flag, action=argparse.BooleanOptionalAction, default=None, help=help_text)
        elif o["kind"] == "choice":
            g.add_argument(flag, choices=o["choices"], help=help_text)
        else:
            g.add_argument(flag, type=_checked(o), metavar=o["kind"].upper(), help=help_text)


def add_threads_option(p: argparse.ArgumentParser) -> None:
    p.add_argument("--threads", type=int,
                   help=f"CPU threads (default: the physical cores, {physical_cores()} here; "
                        "hyper-threads cost more than they give)")


def generation_options(args: argparse.Namespace, skip: tuple[str, ...] = ()) -> dict:
    """The options as given on the command line; None leaves one to the family default."""
    return {o["name"]: getattr(args, o["name"]) for o in OPTIONS if o["name"] not in skip}


def add_parser(sub) -> argparse.ArgumentParser:
    p = sub.add_parser("generate", help="generate text from a prompt, showing the denoising live",
                       description="Generate text with a masked diffusion model.")
    p.add_argument("-m", "--model", required=True, help="GGUF model file")
    p.add_argument("-p", "--prompt", required=True, help="prompt text")
    p.add_argument("--no-chat", dest="chat", action="store_false", help="do not apply the chat template")
    p.add_argument("--tokenizer", help="tokenizer.json for model files that carry none")
    p.add_argument("--quiet", action="store_true", help="no live view, only the answer and the summary")
    p.add_argument("--record", metavar="RUN.npz", help="save every step, to replay in Diffuse Studio")
    add_generation_options(p)
    add_threads_option(p)
    return p


class LiveView:
    """Redraws the generated buffer after every step (ANSI on a terminal, one line per step otherwise)."""

    def __init__(self, tokenizer, stream=None):
        self.tok = tokenizer
        self.out = stream or sys.stdout
        self.tty = self.out.isatty()
        self.lines_drawn = 0
        self.pieces: dict[int, str] = {}

    def piece(self, token: int) -> str:
        if token not in self.pieces:
            self.pieces[token] = self.tok.decode([int(token)]).replace("\n", "\u21b5")
        return self.pieces[token]

    def __call__(self, ev: StepEvent) -> bool:
        status = (f"step {ev.step + 1}/{ev.steps_allowed}  block {ev.block + 1}/{ev.n_blocks}  "
                  f"+{len(ev.unmasked)}  masked {int(ev.gen_mask.sum())}  "
                  f"active {len(ev.active)}/{len(ev.tokens)}  {ev.total_ms:.0f} ms")
        if not self.tty:
            print(status, file=self.out, flush=True)
            return True
        new = set(int(i) for i in ev.unmasked)
        parts = []
        for i, (t, m) in enumerate(zip(ev.tokens[ev.prompt_length:], ev.gen_mask)):
            pos = ev.prompt_length + i
            if m:
                parts.append(f"\x1b[2m{MASK_GLYPH}\x1b[0m")
            elif pos in new:
                parts.append(f"\x1b[1;32m{self.piece(t)}\x1b[0m")
            else:
                parts.append(self.piece(t))
        text = "".join(parts)
        width = shutil.get_terminal_size().columns
        if self.lines_drawn:
            self.out.write(f"\x1b[{self.lines_drawn}F\x1b[J")
        body = f"{text}\n\x1b[2m{status}\x1b[0m\n"
        self.out.write(body)
        self.out.flush()
        visible = text.replace("\x1b[2m", "").replace("\x1b[1;32m", "").replace("\x1b[0m", "")
        self.lines_drawn = sum(max(1, -(-len(line) // width)) for line in visible.split("\n")) + 1
        return True


def summary(r: GenerateResult) -> str:
    step_ms = np.asarray(r.step_ms)
    return (f"steps {r.steps}/{r.steps_allowed} ({r.stop_reason})  total {r.total_ms / 1000:.2f} s  "
            f"per step {step_ms.mean():.1f} ms (forward {np.mean(r.forward_ms):.1f}, "
            f"sampling {np.mean(r.sample_ms):.1f})  buffer {r.buffer_tokens_per_s:.2f} tok/s  "
            f"useful {r.useful_tokens_per_s:.2f} tok/s ({r.useful_length}/{r.gen_length} tokens)")


def run(args: argparse.Namespace) -> int:
    model = load(args.model, threads=args.threads, tokenizer=args.tokenizer)
    view = None if args.quiet else LiveView(model.tokenizer)
    options = generation_options(args)
    # The recording keeps the values that ran, the family defaults included.
    recording = Recording(prompt=args.prompt, options=resolve_options(model.arch, **options),
                          model={"name": Path(args.model).name, "arch": model.arch, "path": args.model,
                                 "n_vocab": model.n_vocab}) if args.record else None

    def on_step(ev: StepEvent) -> bool:
        if recording is not None:
            recording.add(ev)
        return view(ev) if view is not None else True

    result = model.generate(args.prompt, chat=args.chat, on_step=on_step, **options)
    if recording is not None:
        recording.finish(result, model.tokenizer.decode).save(args.record)
    print()
    print(result.text)
    print()
    print(summary(result), file=sys.stderr)
    return 0
