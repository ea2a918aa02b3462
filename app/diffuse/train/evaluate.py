"""Score a model the way the model card reports it.

Held-out masked-token accuracy: mask a fixed share of each held-out window (same positions every
call), predict all masks in one forward pass, count argmax hits. Works on the PyTorch model during
training and on a converted GGUF through our engine:

    python -m diffuse.train.evaluate MODEL.gguf DATA

prints the accuracy table and sample generations (low_confidence vs entropy_exit) in Markdown.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Callable

import numpy as np

from diffuse import DiffuseError

RATIOS = (0.25, 0.5, 0.75)
CHUNK = 16  # windows per forward call: (16, 256, 4096) float32 logits are 64 MB

# Easy prompts (short answer, then <|eot_id|> and padding) and open ones (the whole length is text).
PROMPTS = [
    "Repeat after me: It is a truth universally acknowledged.",
    "Repeat after me: The early bird gets the worm.",
    "Continue: Emma Woodhouse, handsome, clever, and rich,",
    "Continue: She was a woman of",
    "Continue: A fool and his money",
    "Tell me something.",
    "Hello",
    "What is the weather like?",
]
# What people type first: each run over SEEDS seeds, counting the answers with no text at all.
FIRST_PROMPTS = ["Hello", "Hi there!", "What is the weather like?", "Tell me a story.", "Once upon a time",
                 "Who are you?"]
SEEDS = 20


def masked_accuracy(logits_fn: Callable[[np.ndarray], np.ndarray], windows: np.ndarray, mask_id: int,
                    ratios=RATIOS, seed: int = 0) -> dict:
    """logits_fn: ids (n, T) int64 -> logits (n, T, V); windows (N, T). Returns {ratio: {acc, loss}}."""
    rng = np.random.default_rng(seed)
    N, T = windows.shape
    out = {}
    for r in ratios:
        k = max(1, round(r * T))
        masked = np.zeros((N, T), dtype=bool)
        np.put_along_axis(masked, rng.random((N, T)).argsort(axis=1)[:, :k], True, axis=1)
        correct, loss = 0, 0.0
        for i in range(0, N, CHUNK):
            x, m = windows[i : i + CHUNK], masked[i : i + CHUNK]
            logits = logits_fn(np.where(m, mask_id, x))[m].astype(np.float64)  # (n_masked, V)
            target = x[m]
            correct += int((logits.argmax(-1) == target).sum())
            top = logits.max(-1)
            lse = top + np.log(np.exp(logits - top[:, None]).sum(-1))
            loss += float((lse - logits[np.arange(len(target)), target]).sum())
        out[r] = {"acc": correct / (N * k), "loss": loss / (N * k)}
    return out


def torch_logits_fn(model) -> Callable[[np.ndarray], np.ndarray]:
    import torch

    def fn(ids: np.ndarray) -> np.ndarray:
        was_training = model.training
        model.eval()
        with torch.no_grad():
            logits = model(torch.from_numpy(ids)).float().numpy()
        model.train(was_training)
        return logits

    return fn


def engine_logits_fn(m) -> Callable[[np.ndarray], np.ndarray]:
    return lambda ids: np.stack([m.forward(row) for row in ids])


def _report(gguf: Path, data: Path, gen_length: int, steps: int, block_length: int, temperature: float) -> str:
    import diffuse
    from diffuse.train.bpe import EOS
    from diffuse.train.data import heldout_windows, read_documents, split_heldout

    m = diffuse.load(gguf)
    _, held = split_heldout(read_documents(data))
    tok = m.tokenizer
    windows = heldout_windows(tok.encode, tok.token_to_id(EOS), held, m.n_ctx_train, 128)
    t0 = time.time()
    scores = masked_accuracy(engine_logits_fn(m), windows, m.mask_token_id)
    lines = [f"Held-out masked-token accuracy ({windows.shape[0]} windows of {windows.shape[1]} tokens, "
             f"one forward pass, our engine on {gguf.name}; {time.time() - t0:.0f} s):", "",
             "| mask ratio | accuracy | cross-entropy (nats) |", "|---|---|---|"]
    lines += [f"| {r} | {v['acc']:.3f} | {v['loss']:.2f} |" for r, v in scores.items()]
    lines += ["", f"Generations (chat template, gen_length {gen_length}, {steps} steps, blocks of {block_length}, "
              f"temperature {temperature}, seed 0):", ""]
    lines += ["| prompt | scheduler | steps used | ms | text |", "|---|---|---|---|---|"]
    for prompt in PROMPTS:
        for scheduler in ("low_confidence", "entropy_exit"):
            r = m.generate(prompt, gen_length=gen_length, steps=steps, block_length=block_length,
                           temperature=temperature, seed=0, scheduler=scheduler)
            text = r.text.replace("|", "\\|").replace("\n", " ")
            lines.append(f"| {prompt} | {scheduler} | {r.steps} | {r.total_ms:.0f} | {text} |")
    lines += ["", f"Empty answers (no text) over seeds 0-{SEEDS - 1}, the same settings, low_confidence:", "",
              "| prompt | empty |", "|---|---|"]
    for prompt in FIRST_PROMPTS:
        empty = sum(not m.generate(prompt, gen_length=gen_length, steps=steps, block_length=block_length,
                                   temperature=temperature, seed=seed).text.strip() for seed in range(SEEDS))
        lines.append(f"| {prompt} | {empty} of {SEEDS} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m diffuse.train.evaluate", description=__doc__.split("\n\n")[0])
    p.add_argument("gguf", type=Path)
    p.add_argument("data", type=Path, help="the training text (its held-out documents are scored)")
    p.add_argument("--gen-length", type=int, default=64)
    p.add_argument("--steps", type=int, default=64)
    p.add_argument("--block-length", type=int, default=16)
    p.add_argument("--temperature", type=float, default=0.0)
    args = p.parse_args(argv)
    try:
        print(_report(args.gguf, args.data, args.gen_length, args.steps, args.block_length, args.temperature))
    except DiffuseError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
