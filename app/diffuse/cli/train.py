"""`diffuse train DATA --out RUN [--gguf MODEL.gguf]`: train a small masked diffusion LM."""
from __future__ import annotations

import argparse
import errno
import os
import tempfile
from pathlib import Path

from diffuse import DiffuseError, recipe
from diffuse.cli import check_input, check_output, check_output_folder

# Options that set a stored hyper-parameter (TrainConfig field): default None, so that a resume can
# tell an explicit value from an absent one.
HPARAM_OPTIONS = {"arch": "arch", "block_size": "block_size", "vocab_size": "vocab_size", "d_model": "d_model",
                  "layers": "n_layers", "heads": "n_heads", "ffn": "mlp_hidden_size", "seq_len": "seq_len",
                  "batch": "batch", "lr": "lr", "chat_fraction": "chat_fraction", "seed": "seed"}
FLAG_OF = {field: "--" + name.replace("_", "-") for name, field in HPARAM_OPTIONS.items()}   # field -> its flag


def add_parser(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser(
        "train",
        usage="diffuse train DATA --out RUN [--gguf MODEL.gguf] [options]",
        help="train a small LLaDA- or SDAR-architecture model on text (needs PyTorch: pip install 'diffuse[train]')",
        description="Train a small masked diffusion LM (LLaDA's architecture and objective, or SDAR's block "
        "diffusion with --arch sdar) with its own byte-level BPE tokenizer, or further from a model it made "
        "(--init). DATA is a .txt file or a folder of "
        "them, documents separated by blank lines (python -m diffuse.train.corpus DIR writes the demo corpus). "
        "Resumes from RUN/state.pt with "
        "the run's own hyper-parameters (model shape, tokenizer, batch, learning rate, seed).",
    )
    p.add_argument("data", type=Path, metavar="DATA", help="text file or folder of .txt files")
    p.add_argument("--out", type=Path, required=True, metavar="RUN", help="run folder: hf/ checkpoint, state.pt, train.log")
    p.add_argument("--gguf", type=Path, metavar="MODEL.gguf", help="also convert the final checkpoint to this GGUF file")
    p.add_argument("--init", type=Path, metavar="START.gguf",
                   help="start from this model (an F32/F16 LLaDA GGUF written by diffuse train, the bundled demo "
                   "for one): its weights, shapes and tokenizer; a new run folder only")
    p.add_argument("--name", help="model name in the GGUF (default: the run folder's name)")
    p.add_argument("--outtype", default="f16", choices=["f32", "f16", "bf16", "q8_0"], help="GGUF weight type (default f16)")
    p.add_argument("--arch", choices=["llada", "sdar"],
                   help="llada (default): bidirectional, LLaDA's objective; sdar: block diffusion in SDAR's layout")
    p.add_argument("--block-size", type=int, help="sdar: the block length it is trained and decodes with (default 4)")
    p.add_argument("--steps", type=int, default=8000, help="optimizer steps (default 8000)")
    p.add_argument("--minutes", type=float, default=0.0, help="stop after this much training time (0: no limit)")
    p.add_argument("--batch", type=int, help="sequences per step (default 16)")
    p.add_argument("--seq-len", type=int, help="tokens per sequence, also the context length (default 256)")
    p.add_argument("--vocab-size", type=int, help="BPE vocabulary incl. 6 special tokens (default 4096)")
    p.add_argument("--d-model", type=int, help="embedding width (default 192)")
    p.add_argument("--layers", type=int, help="transformer blocks (default 4)")
    p.add_argument("--heads", type=int, help="attention heads (default 3, head size 64)")
    p.add_argument("--ffn", type=int, help="SwiGLU hidden size (default 512)")
    p.add_argument("--lr", type=float, help="peak learning rate (default 2e-3)")
    p.add_argument("--chat-fraction", type=float, help="share of rows that are chat examples (default 0.25)")
    p.add_argument("--no-bf16", action="store_true", default=None,
                   help="train in float32 (slower; for CPUs without bf16)")
    p.add_argument("--threads", type=int, default=2, help="PyTorch threads (default 2)")
    p.add_argument("--seed", type=int, help="random seed (default 0)")
    p.add_argument("--eval-every", type=int, default=500, help="steps between held-out scores and checkpoints")
    return p


def run(args: argparse.Namespace) -> int:
    try:
        from diffuse.train.loop import TrainConfig, check, saved_hparams, train
    except ImportError as e:
        raise DiffuseError(f"diffuse train needs PyTorch ({e}); install it with: pip install 'diffuse[train]'") from e
    name = args.name or args.out.resolve().name
    if not args.data.is_dir():
        check_input(args.data, "DATA")
    check_output_folder(args.out, "--out")   # before the training: its checkpoints go there
    if args.gguf:
        check_output(str(args.gguf), "--gguf", [str(args.data)])
        if name in ("", ".", "..") or os.sep in name or "/" in name:
            raise DiffuseError(f"--name {name!r}: not usable as a model name (no path separators)")
    stored = saved_hparams(args.out)
    cfg = TrainConfig(data=args.data, out=args.out, steps=args.steps, minutes=args.minutes, threads=args.threads,
                      eval_every=args.eval_every, **{**_hparams(args, stored), **_start(args, stored)})
    for option, value in (("steps", cfg.steps), ("threads", cfg.threads), ("batch", cfg.batch),
                          ("seq-len", cfg.seq_len), ("vocab-size", cfg.vocab_size), ("d-model", cfg.d_model),
                          ("layers", cfg.n_layers), ("heads", cfg.n_heads), ("ffn", cfg.mlp_hidden_size),
                          ("block-size", cfg.block_size)):
        if value <= 0:
            raise DiffuseError(f"--{option} must be positive (got {value})")
    if cfg.vocab_size < 300:
        raise DiffuseError("--vocab-size must be at least 300 (256 bytes + 6 special tokens + merges)")
    check(cfg)   # before the run folder is made
    args.out.mkdir(parents=True, exist_ok=True)
    try:
        return _train(args, cfg, train, name)
    except OSError as e:   # a disk that fills during the run: the last checkpoint stays as it was
        why = "the disk is full" if e.errno in (errno.ENOSPC, errno.EDQUOT) else e.strerror or str(e)
        raise DiffuseError(f"--out {args.out}: {why} ({e.filename or 'while saving'}); the last complete "
                           "checkpoint is kept, run the same command again to resume from it") from None


def _train(args: argparse.Namespace, cfg, train, name: str) -> int:
    with open(args.out / "train.log", "a", encoding="utf-8") as log_file:
        def log(line: str) -> None:
            print(line, flush=True)
            log_file.write(line + "\n")
            log_file.flush()

        hf = train(cfg, log)
        if args.gguf:
            from diffuse.convert import convert_hf
            from diffuse.train.export import recipe_for

            # convert_hf names the model after its folder ("hf"): a folder of links gives it the run's name.
            with tempfile.TemporaryDirectory() as tmp:
                named = Path(tmp) / name
                named.mkdir()
                for f in hf.iterdir():
                    (named / f.name).symlink_to(f.resolve())
                suggested = recipe_for(cfg.seq_len, cfg.arch, cfg.block_size)
                convert_hf(named, args.gguf, outtype=args.outtype, recipe=suggested)
            log(f"converted {hf} -> {args.gguf} ({args.outtype}, name {name}, recipe {recipe.text(suggested)})")
    return 0


def _start(args: argparse.Namespace, stored: dict | None) -> dict:
    """--init's model: the TrainConfig fields its file fixes (shape, tokenizer size, arch)."""
    if args.init is None:
        return {}
    check_input(args.init, "--init")
    if stored:
        raise DiffuseError(f"--init: {args.out} already holds a run; leave --init out to resume it, or choose a "
                           "new --out folder")
    from diffuse.train.from_gguf import read

    _, s, _ = read(args.init)
    fixed = {"vocab_size": s.vocab_size, "d_model": s.d_model, "n_layers": s.n_layers, "n_heads": s.n_heads,
             "mlp_hidden_size": s.mlp_hidden_size, "seq_len": s.max_sequence_length}
    given = {field: getattr(args, name) for name, field in HPARAM_OPTIONS.items() if getattr(args, name) is not None}
    conflicts = [f"{FLAG_OF[k]} {given[k]} (the file has {v})" for k, v in fixed.items() if given.get(k, v) != v]
    if given.get("arch", "llada") != "llada":
        conflicts.append(f"--arch {given['arch']} (the file is llada)")
    if conflicts:
        raise DiffuseError(f"--init {args.init} fixes the model's shape: {', '.join(conflicts)}")
    return {**fixed, "init": args.init}


def _hparams(args: argparse.Namespace, stored: dict | None) -> dict:
    """The hyper-parameters given: the stored ones on resume (a different explicit value is refused),
    else the options given (TrainConfig supplies the rest)."""
    explicit = {field: getattr(args, option) for option, field in HPARAM_OPTIONS.items()
                if getattr(args, option) is not None}
    if args.no_bf16:
        explicit["bf16"] = False
    if not stored:
        return explicit
    conflicts = ["--no-bf16 (the run trains in bf16)" if k == "bf16" else f"{FLAG_OF[k]} {v} (the run has {stored[k]})"
                 for k, v in explicit.items() if stored.get(k, v) != v]
    if conflicts:
        raise DiffuseError(f"{args.out} is a run with other settings: {', '.join(conflicts)}; leave them out "
                           f"to resume it, or choose a new --out folder")
    return {**stored, **explicit}
