"""`diffuse generate`: denoise a prompt, with a live view of the steps in the terminal."""
from __future__ import annotations

import argparse
import dataclasses
import itertools
import json
import os
import shutil
import signal
import sys
import unicodedata

from pathlib import Path

import numpy as np

from diffuse import DiffuseError, load, physical_cores
from diffuse.cli import check_input, check_output
from diffuse.events import GenerateResult, StepEvent
from diffuse.generation import (ARCHITECTURES, FAMILIES, OPTIONS, PRESETS, default_options, plan, preset,
                                 resolve_options, schedule_check, whole_blocks)
from diffuse.recording import Recording
from diffuse.remote import TIMEOUT_S, RemoteModel, api_key_from_env

MASK_GLYPH = "\u2591"   # light shade: a position still masked
EOS_GLYPH = "\u00b7"    # middle dot: end-of-text (the padding after the answer), not 13 columns of <|endoftext|>
PARSE = {"int": int, "seed": int, "float": float}
MAX_PROMPT_BYTES = 64 * 2**20   # far beyond any context; bounds what a stray file or pipe costs


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
    if value is None:   # the seed: drawn afresh for each run and reported with its result
        return "a fresh random one per run"
    if isinstance(value, bool):
        return "on" if value else "off"
    return f"{value:g}" if isinstance(value, float) else str(value)


def _defaults_text(name: str) -> str:
    """'family default 1.5', or per family where they differ: 'family default llada 32, dream 0'
    (a model file's recipe may suggest another, see add_generation_options)."""
    text = {f: _shown(default_options(f)[name]) for f in FAMILIES}
    if len(set(text.values())) == 1:
        return f"family default {text[FAMILIES[0]]}"
    return "family default " + ", ".join(f"{f} {t}" for f, t in text.items())


def add_generation_options(p: argparse.ArgumentParser, skip: tuple[str, ...] = ()) -> None:
    """One flag per engine option (diffuse.generation.OPTIONS) not in `skip`, None = the model's
    default (its file's recipe, else the family's)."""
    g = p.add_argument_group("generation (defaults: the model file's recipe, see diffuse recipe MODEL, "
                             "else the family's)")
    modes = "; ".join(f"{name}: " + ", ".join(f"{k} {_shown(v)}" for k, v in opts.items())
                      for name, opts in PRESETS.items())
    g.add_argument("--preset", choices=list(PRESETS),
                   help=f"a published decoding mode over the model's defaults; the flags below override it "
                        f"({modes})".replace("%", "%%"))
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
    """The options as given on the command line (--preset's under the flags given); None leaves
    one to the model's default."""
    base = preset(args.preset) if args.preset else {}
    return {o["name"]: v if (v := getattr(args, o["name"])) is not None else base.get(o["name"])
            for o in OPTIONS if o["name"] not in skip}


def typed_options(args: argparse.Namespace, skip: tuple[str, ...] = ()) -> dict:
    """The options the user typed (not a preset's, a recipe's or a default)."""
    return {o["name"]: v for o in OPTIONS if o["name"] not in skip and (v := getattr(args, o["name"])) is not None}


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def unused_options(typed: dict, arch: str, mode: str, no_draft_lora: str | None = None) -> list[str]:
    """Why each typed option this run does not read is ignored (a recipe or the defaults pass them
    to every run, silently: only the user's own are worth a word). no_draft_lora: why the model has
    no draft LoRA, when it has none (a server's model: not known, no word)."""
    family = ARCHITECTURES[arch]["family"]
    window = family != "wedlm" and f"it applies to WeDLM's window only, not {arch}"
    why = {"window_size": window, "pos_penalty": window,
           "draft_length": mode != "self_spec" and f"it applies to mode self_spec only, not {mode}",
           "draft_lora": no_draft_lora}
    return [f"{_flag(name)} is ignored: {why[name]}" for name in typed if why.get(name)]


def add_parser(sub) -> argparse.ArgumentParser:
    p = sub.add_parser("generate", help="generate text from a prompt, showing the denoising live",
                       description="Generate text with a masked diffusion model. The answer goes to "
                                   "standard output, the live view and the summary to standard error. "
                                   "--gen-length is rounded up to a multiple of --block-length (the "
                                   "answer is cut at the length asked for), as the server does. Ctrl-C "
                                   f"stops at the end of the step and prints the answer so far, {MASK_GLYPH} "
                                   "marking each position still undecided. With --server the model runs on "
                                   "an OpenAI-compatible server: diffuse serve streams its steps to the live "
                                   "view; any other (llama.cpp, vLLM, SGLang) streams text only, and is sent "
                                   "only max_tokens (--gen-length), temperature, top_p and seed.")
    p.add_argument("-m", "--model",
                   help="GGUF model file; with --server, the name of one of its models (default: the first "
                        "it lists)")
    remote = p.add_argument_group("a server instead of a model file")
    remote.add_argument("--server", metavar="URL", help="an OpenAI-compatible server, e.g. http://localhost:8080/v1")
    remote.add_argument("--api-key", metavar="KEY",
                        help="its API key (default: $DIFFUSE_API_KEY, else $OPENAI_API_KEY; on the command line "
                             "a key is visible to other users of this machine)")
    remote.add_argument("--timeout", type=float, default=TIMEOUT_S, metavar="S",
                        help=f"give up on a server silent for this long (default {TIMEOUT_S:g} s)")
    given = p.add_mutually_exclusive_group(required=True)
    given.add_argument("-p", "--prompt", help="prompt text; - reads it from standard input")
    given.add_argument("--prompt-file", metavar="PATH", help="read the prompt from a UTF-8 text file")
    p.add_argument("--no-chat", dest="chat", action="store_false", help="do not apply the chat template")
    p.add_argument("--tokenizer", help="tokenizer.json for model files that carry none")
    p.add_argument("--quiet", action="store_true", help="no live view, only the answer and the summary")
    p.add_argument("--json", action="store_true",
                   help="print the answer, tokens, steps, timings and resolved options as JSON")
    p.add_argument("--record", metavar="RUN.npz", help="save every step, to replay in Diffuse Studio")
    add_generation_options(p)
    add_threads_option(p)
    return p


class LiveView:
    """Redraws the generated buffer after every step on a terminal, fitted to its current size so
    that no line wraps and no frame scrolls (either would leave stale copies in the scrollback)."""

    def __init__(self, tokenizer, stream):
        self.tok = tokenizer
        self.out = stream
        self.lines_drawn = None     # newlines in the last frame; None before the first
        self.pieces: dict[int, str] = {int(t): EOS_GLYPH for t in tokenizer.eos_token_ids}

    def piece(self, token: int) -> str:
        if token not in self.pieces:
            text = self.tok.decode([int(token)]).replace("\n", "\u21b5")
            # Tabs and control characters would move the cursor where the width count does not.
            self.pieces[token] = "".join(c if c.isprintable() else "\ufffd" for c in text)
        return self.pieces[token]

    def size(self) -> os.terminal_size:
        try:
            return os.get_terminal_size(self.out.fileno())     # re-read every step: the user may resize
        except (OSError, ValueError):
            return shutil.get_terminal_size()

    def __call__(self, ev: StepEvent) -> None:
        cols, rows = self.size()
        width = cols - 1            # a line filling the last column leaves the cursor in a pending wrap
        fields = [f"step {ev.step + 1}/{ev.steps_allowed}", f"block {ev.block + 1}/{ev.n_blocks}",
                  f"+{len(ev.unmasked)}", *([f"edited {len(ev.edited)}"] if len(ev.edited) else []),
                  f"masked {int(ev.gen_mask.sum())}", f"active {len(ev.active)}/{len(ev.tokens)}",
                  f"{ev.total_ms:.0f} ms"]
        status = fitted(fields, width)
        if cols < 20 or rows < 4 or len(status) >= rows - 1:
            lines = [clip(compact_status(ev), width)]
        else:
            body = self.wrapped(ev, width)
            if len(body) + len(status) > rows:
                # the note of the lines scrolled away may take a status line of its own: sized
                # with the most there can be, then said with the count
                status = fitted([f"{len(body)} lines above", *fields], width)
                hidden = len(body) - max(rows - len(status), 0)
                status = fitted([f"{hidden} line{'s' if hidden > 1 else ''} above", *fields], width)
                body = body[hidden:]
            lines = body + [f"\x1b[2m{line}\x1b[0m" for line in status]
        # Back to the first line of the last frame, then each line overwrites one of the last
        # frame's (\e[K clears what is left of it) and \e[J clears what is below. Never one clear of
        # the whole screen: tmux and other terminals copy a screen cleared from the top-left corner
        # into the scrollback, one copy per step. No final newline: a frame of `rows` lines fits.
        if self.lines_drawn is not None:
            self.out.write(f"\r\x1b[{self.lines_drawn}A" if self.lines_drawn else "\r")
        self.out.write("\x1b[K\n".join(lines) + "\x1b[J")
        self.out.flush()
        self.lines_drawn = len(lines) - 1

    def wrapped(self, ev: StepEvent, width: int) -> list[str]:
        """The buffer as lines of at most `width` columns, masked positions dim, new ones green."""
        new = set(int(i) for i in ev.unmasked)
        lines, line, used = [], "", 0
        for pos in range(ev.prompt_length, len(ev.tokens)):
            if ev.mask[pos]:
                text, style = MASK_GLYPH, "\x1b[2m"
            elif self.pieces.get(int(ev.tokens[pos])) == EOS_GLYPH:
                text, style = EOS_GLYPH, "\x1b[2m"
            else:
                text, style = self.piece(ev.tokens[pos]), "\x1b[1;32m" if pos in new else ""
            for c in text:
                w = char_width(c)
                if used + w > width:
                    lines.append(line)
                    line, used = "", 0
                line += f"{style}{c}\x1b[0m" if style else c
                used += w
        return lines + [line]

    def close(self) -> None:
        """Leave the last frame on screen and the cursor below it."""
        if self.lines_drawn is not None:
            self.out.write("\n")
            self.out.flush()


def char_width(c: str) -> int:
    if unicodedata.combining(c):
        return 0
    return 2 if unicodedata.east_asian_width(c) in "WF" else 1


def clip(text: str, width: int) -> str:
    """`text` (no escape sequences) cut to `width` columns."""
    out, used = "", 0
    for c in text:
        used += char_width(c)
        if used > width:
            break
        out += c
    return out


def fitted(fields: list[str], width: int) -> list[str]:
    """Status fields on one line of `width` columns, two spaces apart, else one; else wrapped
    between fields onto as many lines as they need (a field wider than a line is cut)."""
    for gap in ("  ", " "):
        if columns(line := gap.join(fields)) <= width:
            return [line]
    lines = []
    for field in fields:
        if lines and columns(lines[-1]) + 1 + columns(field) <= width:
            lines[-1] += " " + field
        else:
            lines.append(clip(field, width))
    return lines


def columns(text: str) -> int:
    return sum(char_width(c) for c in text)


def compact_status(ev: StepEvent) -> str:
    """One line for a terminal too small for the buffer: 'step 5/64 ▕████░░░░▏ 23/64 decided'."""
    n = len(ev.gen_mask)
    decided = n - int(ev.gen_mask.sum())
    bar = "\u2588" * round(8 * decided / n) if n else ""
    return f"step {ev.step + 1}/{ev.steps_allowed} \u2595{bar:\u2591<8}\u258f {decided}/{n} decided"


def summary(r: GenerateResult) -> str:
    step_ms = np.asarray(r.step_ms)
    return (f"steps {r.steps}/{r.steps_allowed} ({r.stop_reason})  total {r.total_ms / 1000:.2f} s  "
            f"per step {step_ms.mean():.1f} ms (forward {np.mean(r.forward_ms):.1f}, "
            f"sampling {np.mean(r.sample_ms):.1f})  buffer {r.buffer_tokens_per_s:.2f} tok/s  "
            f"useful {r.useful_tokens_per_s:.2f} tok/s ({r.useful_length}/{r.gen_length} tokens)"
            + (f"  forward passes {r.forward_passes}" if r.forward_passes else ""))


def as_json(r: GenerateResult, text: str, undecided: np.ndarray, options: dict, **extra) -> str:
    # Per generated position: its token, the step that committed it (-1: none did) and, after a
    # cancel, which positions are still masked (their token is the mask id, not an answer).
    # forward_passes: the passes modes ar and self_spec (and Nemotron's diffusion) ran; 0 where uncounted.
    return json.dumps({
        "text": text, "tokens": r.tokens.tolist(), "decided_step": np.asarray(r.decided_step).tolist(),
        "undecided": np.flatnonzero(undecided).tolist(),
        "steps": r.steps, "steps_allowed": r.steps_allowed, "forward_passes": r.forward_passes,
        "stop_reason": r.stop_reason, "gen_length": r.gen_length, "useful_length": r.useful_length,
        "timings": {"total_ms": r.total_ms, "step_ms": np.asarray(r.step_ms).tolist(),
                    "forward_ms": np.asarray(r.forward_ms).tolist(), "sample_ms": np.asarray(r.sample_ms).tolist()},
        "options": options, **extra}, ensure_ascii=False)


def read_prompt(args: argparse.Namespace) -> str:
    """The prompt of -p TEXT, -p - (standard input) or --prompt-file PATH."""
    if args.prompt is not None and args.prompt != "-":
        return args.prompt
    if args.prompt is None:
        where = f"--prompt-file {args.prompt_file}"
        check_input(args.prompt_file, "--prompt-file")
        try:
            with open(args.prompt_file, "rb") as f:
                data = f.read(MAX_PROMPT_BYTES + 1)
        except OSError as e:
            raise DiffuseError(f"{where}: cannot read it: {e.strerror}") from None
    else:
        where = "-p - (standard input)"
        if sys.stdin is None:
            raise DiffuseError(f"{where}: standard input is closed; pipe the prompt in or use --prompt-file")
        if sys.stdin.isatty():
            print("diffuse: type the prompt, then Ctrl-D on a line of its own", file=sys.stderr)
        data = sys.stdin.buffer.read(MAX_PROMPT_BYTES + 1)
    if len(data) > MAX_PROMPT_BYTES:
        raise DiffuseError(f"{where}: more than {MAX_PROMPT_BYTES // 2**20} MiB; no model's context holds that")
    if b"\0" in data:
        raise DiffuseError(f"{where}: holds NUL bytes, so it is a binary file, not text")
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        raise DiffuseError(f"{where}: not UTF-8 text (byte {e.start} is 0x{data[e.start]:02x})") from None
    if not text.strip():
        raise DiffuseError(f"{where}: the prompt is empty")
    # A file's or a pipe's last newline ends the line; it is not part of the prompt.
    return text[:-1] if text.endswith("\n") else text


def fit_blocks(options: dict, model, n_prompt: int) -> tuple[dict, str | None]:
    """gen_length in whole blocks (diffuse.generation.whole_blocks, as the server does with
    max_tokens), and a note when the engine runs more positions than asked for: those whole blocks,
    the model's own block (block_length 0) or its canvas, or block diffusion's blocks from the
    prompt's start (its plan for this prompt, generation.plan). The answer is cut at the length asked for."""
    gen = options["gen_length"]
    options = {**options, "gen_length": whole_blocks(gen, options, model.arch)}
    try:
        planned = plan(model.arch, options, model.hparams, n_prompt=n_prompt)
    except DiffuseError:        # the run itself says why
        return options, None
    if planned.get("gen_length", gen) <= gen:
        return options, None
    own = " (the model's own)" if options["block_length"] <= 0 else ""
    start = " from the prompt's start" if ARCHITECTURES[model.arch]["block_diffusion"] else ""
    unit = "canvases" if planned["loop"] == "uniform-state" else "blocks"
    return options, (f"gen_length {gen} -> {planned['gen_length']}: whole {unit} of {planned['block_length']}{own}"
                     f"{start}; the answer is cut at {gen} tokens")


def cut(r: GenerateResult, model, length: int) -> GenerateResult:
    """The result as asked for: its first `length` positions (the engine ran whole blocks), the
    answer's text and useful tokens counted in them, so that --json, the summary and a recording's
    answer say what the user asked for and got."""
    text = answer_text(r, model, length)
    if length >= len(r.tokens):
        return dataclasses.replace(r, text=text)
    ids = r.tokens[:length]
    eos = set(model.tokenizer.eos_token_ids)
    end = next((i for i, t in enumerate(ids.tolist()) if t in eos), length)
    return dataclasses.replace(r, text=text, tokens=ids, decided_step=np.asarray(r.decided_step)[:length],
                               gen_length=length, useful_length=int((ids[:end] != model.mask_token_id).sum()))


def run(args: argparse.Namespace) -> int:
    if args.server is not None:
        return run_remote(args)
    if args.model is None:
        raise DiffuseError("generate needs -m MODEL.gguf, or --server URL for a model on a server")
    if args.api_key is not None:
        raise DiffuseError("--api-key is for --server URL; a model file needs none")
    if args.record:   # refused before the model loads: the run would be lost to a failing save
        check_output(args.record, "--record", [args.model], example_name="run.npz")
    check_input(args.model, "-m")
    if args.tokenizer:
        check_input(args.tokenizer, "--tokenizer")
    prompt = read_prompt(args)
    logical = os.cpu_count() or 1
    if args.threads is not None and args.threads > logical:
        print(f"diffuse: note: --threads {args.threads} -> {logical}: more threads than logical CPUs only "
              "add waiting", file=sys.stderr)
    model = load(args.model, threads=args.threads, tokenizer=args.tokenizer)
    # stdout carries the answer only (it may be redirected to a file); progress goes to stderr.
    view = LiveView(model.tokenizer, sys.stderr) if not args.quiet and sys.stderr.isatty() else None
    options = generation_options(args)
    asked = resolve_options(model.arch, model.recipe, **options)
    resolved, length_note = fit_blocks(asked, model, len(model.encode_prompt(prompt, args.chat)))
    for note in (length_note, schedule_check(resolved, model.arch, hparams=model.hparams)[0]):
        if note:
            print(f"diffuse: note: {note}", file=sys.stderr)
    no_lora = not model.hparams["draft_lora_rank"] and f"{Path(model.path).name} holds no draft LoRA"
    for warning in unused_options(typed_options(args), model.arch, resolved["mode"], no_lora or None):
        print(f"diffuse: warning: {warning}", file=sys.stderr)
    # The recording keeps the values that ran, the model's defaults included.
    recording = Recording(prompt=prompt, options=resolved,
                          model={"name": Path(args.model).name, "arch": model.arch, "path": args.model,
                                 "n_vocab": model.n_vocab}) if args.record else None
    interrupted = False

    def on_interrupt(signum, frame):
        # Ctrl-C cancels the run at the end of the step: the answer so far is still printed.
        nonlocal interrupted
        interrupted = True

    def on_step(ev: StepEvent) -> bool:
        if recording is not None:
            recording.add(ev)
        if view is not None:
            view(ev)
        return not interrupted

    previous = signal.signal(signal.SIGINT, on_interrupt)
    try:
        try:
            result = model.generate(prompt, chat=args.chat, on_step=on_step, **resolved)
        finally:
            if view is not None:
                view.close()
        # Until the answer is out, a late Ctrl-C only marks the run: it must not cut the answer short.
        answer = cut(result, model, asked["gen_length"])
        print(as_json(answer, answer.text, answer.tokens == model.mask_token_id,
                      {**resolved, "gen_length": asked["gen_length"]}) if args.json else answer.text, flush=True)
        print(summary(answer), file=sys.stderr)
    finally:
        signal.signal(signal.SIGINT, previous)
    if recording is not None:   # after the answer: a save that fails (a full disk) does not lose it
        # every position the steps ran, with the answer as it was printed
        recording.finish(dataclasses.replace(result, text=answer.text), model.tokenizer.decode).save(args.record)
    return 130 if interrupted else 0


def run_remote(args: argparse.Namespace) -> int:
    """generate on a server: its step events to the live view (diffuse serve), else its text as it
    streams; Ctrl-C closes the connection, which the server takes as a cancel."""
    for flag, value in (("--threads", args.threads), ("--tokenizer", args.tokenizer)):
        if value is not None:
            raise DiffuseError(f"{flag} is for a local model file; a server uses its own")
    if args.record:
        check_output(args.record, "--record", [], example_name="run.npz")
    prompt = read_prompt(args)
    model = RemoteModel.connect(args.server, args.api_key or api_key_from_env(), args.model, args.timeout)
    endpoint = model.connection.endpoint
    if model.connection.api_key and endpoint.scheme == "http" and not endpoint.local:
        print(f"diffuse: note: the API key goes to {endpoint.host} over plain http, readable on the way; "
              "use an https:// URL", file=sys.stderr)
    if args.record and not model.steps_sent:
        raise DiffuseError(f"--record keeps a run's steps, which only diffuse serve sends; {model.url} is a "
                           f"{model.server_kind}")
    options = generation_options(args)
    if skipped := model.not_sent(options):
        print(f"diffuse: note: {', '.join(skipped)} not sent: {model.url} is a {model.server_kind}, which takes "
              "OpenAI's max_tokens (--gen-length), temperature, top_p and seed only", file=sys.stderr)
    if model.arch in ARCHITECTURES:      # diffuse serve names its model's architecture
        for warning in unused_options(typed_options(args), model.arch, options.get("mode") or "diffusion"):
            print(f"diffuse: warning: {warning}", file=sys.stderr)
    view = LiveView(model.tokenizer, sys.stderr) if (model.steps_sent and not args.quiet
                                                     and sys.stderr.isatty()) else None
    streamed = not model.steps_sent and not args.json      # text as it comes, when no view shows progress
    recording = Recording(prompt=prompt, options={k: v for k, v in options.items() if v is not None},
                          model={"name": model.id, "server": model.url,
                                 **({"arch": model.arch} if model.arch else {})}) if args.record else None
    interrupted, last = False, None

    def on_interrupt(signum, frame):
        nonlocal interrupted
        interrupted = True

    def on_step(ev: StepEvent) -> bool:
        nonlocal last
        last = ev
        if recording is not None:
            recording.add(ev)
        if view is not None:
            view(ev)
        return not interrupted

    def on_text(text: str) -> bool:
        if streamed:
            sys.stdout.write(text)
            sys.stdout.flush()
        return not interrupted

    previous = signal.signal(signal.SIGINT, on_interrupt)
    try:
        try:
            result = model.generate(prompt, chat=args.chat, on_step=on_step, on_text=on_text, **options)
        finally:
            if view is not None:
                view.close()
        if args.json:
            undecided = last.mask if last is not None else np.zeros(0, bool)
            print(as_json(result, result.text, undecided, {k: v for k, v in options.items() if v is not None},
                          server=model.url, model=model.id), flush=True)
        else:
            print("" if streamed else result.text, flush=True)
        print(remote_summary(result, model), file=sys.stderr)
        if "pieces" in model.unsent and (view is not None or recording is not None):
            print(f"diffuse: note: {model.url} sends no token texts: the live view and the recording show "
                  "token ids", file=sys.stderr)
    finally:
        signal.signal(signal.SIGINT, previous)
    if recording is not None:
        # token texts only where the server sent them: a replay shows the others as <id>, as it would here
        recording.finish(result, model.tokenizer.decode if model.tokenizer.pieces else None).save(args.record)
    return 130 if interrupted else 0


def remote_summary(r: GenerateResult, model: RemoteModel) -> str:
    if r.steps:
        return f"{summary(r)}  ({model.server_kind}, {model.url})"
    seconds = r.total_ms / 1000
    return (f"{r.useful_length} tokens in {seconds:.2f} s ({r.useful_tokens_per_s:.2f} tok/s, {r.stop_reason}) "
            f"from {model.id} on a {model.server_kind}, {model.url}; it sends no denoising steps")


def answer_text(r: GenerateResult, model, length: int) -> str:
    """The answer as a reader should see it: the first `length` positions up to end-of-text, and
    one MASK_GLYPH for each position a cancelled run left undecided (the mask token's own text,
    e.g. Dream's [PAD151665], is no answer, and decoding around the gaps would glue fragments)."""
    ids = r.tokens[:length].tolist()
    eos = set(model.tokenizer.eos_token_ids)
    ids = ids[:next((i for i, t in enumerate(ids) if t in eos), len(ids))]
    if length >= len(r.tokens) and model.mask_token_id not in ids:
        return r.text
    return "".join(MASK_GLYPH * len(run) if masked else model.tokenizer.decode(run, skip_special_tokens=True)
                   for masked, run in ((k, list(g)) for k, g in
                                       itertools.groupby(ids, key=lambda t: t == model.mask_token_id)))
