"""`diffuse train DATA --out RUN [--gguf MODEL.gguf]`: train a small masked diffusion LM."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from diffuse import DiffuseError


def add_parser(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser(
        "train",
        usage="diffuse train DATA --out RUN [--gguf MODEL.gguf] [options]",
        help="train a small LLaDA-architecture model on text (needs PyTorch: pip install 'diffuse[train]')",
        description="Train a small masked diffusion LM (LLaDA architecture and objective) with its own "
        "byte-level BPE tokenizer. DATA is a .txt file or a folder of them, documents separated by blank "
        "lines (python -m diffuse.train.corpus DIR writes the demo corpus). Resumes from RUN/state.pt.",
    )
    p.add_argument("data", type=Path, metavar="DATA", help="text file or folder of .txt files")
    p.add_argument("--out", type=Path, required=True, metavar="RUN", help="run folder: hf/ checkpoint, state.pt, train.log")
    p.add_argument("--gguf", type=Path, metavar="MODEL.gguf", help="also convert the final checkpoint to this GGUF file")
    p.add_argument("--outtype", default="f16", choices=["f32", "f16", "bf16", "q8_0"], help="GGUF weight type (default f16)")
    p.add_argument("--steps", type=int, default=8000, help="optimizer steps (default 8000)")
    p.add_argument("--minutes", type=float, default=0.0, help="stop after this much training time (0: no limit)")
    p.add_argument("--batch", type=int, default=16, help="sequences per step (default 16)")
    p.add_argument("--seq-len", type=int, default=256, help="tokens per sequence, also the context length (default 256)")
    p.add_argument("--vocab-size", type=int, default=4096, help="BPE vocabulary incl. 6 special tokens (default 4096)")
    p.add_argument("--d-model", type=int, default=192, help="embedding width (default 192)")
    p.add_argument("--layers", type=int, default=4, help="transformer blocks (default 4)")
    p.add_argument("--heads", type=int, default=3, help="attention heads (default 3, head size 64)")
    p.add_argument("--ffn", type=int, default=512, help="SwiGLU hidden size (default 512)")
    p.add_argument("--lr", type=float, default=2e-3, help="peak learning rate (default 2e-3)")
    p.add_argument("--chat-fraction", type=float, default=0.25, help="share of rows that are chat examples (default 0.25)")
    p.add_argument("--no-bf16", action="store_true", help="train in float32 (slower; for CPUs without bf16)")
    p.add_argument("--threads", type=int, default=2, help="PyTorch threads (default 2)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--eval-every", type=int, default=500, help="steps between held-out scores and checkpoints")
    return p


def run(args: argparse.Namespace) -> int:
    try:
        from diffuse.train.loop import TrainConfig, train
    except ImportError as e:
        raise DiffuseError(f"diffuse train needs PyTorch ({e}); install it with: pip install 'diffuse[train]'") from e
    for name in ("steps", "batch", "seq_len", "vocab_size", "d_model", "layers", "heads", "ffn", "threads"):
        if getattr(args, name) <= 0:
            raise DiffuseError(f"--{name.replace('_', '-')} must be positive")
    if args.vocab_size < 300:
        raise DiffuseError("--vocab-size must be at least 300 (256 bytes + 6 special tokens + merges)")
    cfg = TrainConfig(
        data=args.data, out=args.out, vocab_size=args.vocab_size, d_model=args.d_model, n_layers=args.layers,
        n_heads=args.heads, mlp_hidden_size=args.ffn, seq_len=args.seq_len, batch=args.batch, steps=args.steps,
        minutes=args.minutes, lr=args.lr, chat_fraction=args.chat_fraction, bf16=not args.no_bf16,
        threads=args.threads, seed=args.seed, eval_every=args.eval_every,
    )
    args.out.mkdir(parents=True, exist_ok=True)
    with open(args.out / "train.log", "a", encoding="utf-8") as log_file:
        def log(line: str) -> None:
            print(line, flush=True)
            log_file.write(line + "\n")
            log_file.flush()

        hf = train(cfg, log)
        if args.gguf:
            from diffuse.convert import convert_hf

            convert_hf(hf, args.gguf, outtype=args.outtype)
            log(f"converted {hf} -> {args.gguf} ({args.outtype})")
    return 0


if __name__ == "__main__":
    sys.exit(run(add_parser(argparse.ArgumentParser().add_subparsers()).parse_args()))
