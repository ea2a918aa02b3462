"""Training text -> batches for the LLaDA objective.

Input: a .txt file or a folder of them; documents are separated by blank lines (the format
`python -m diffuse.train.corpus` writes). Every `HELDOUT_EVERY`-th document is held out.

A batch row is either
- plain text: a window of the document stream (documents joined by <|endoftext|>), every position
  maskable, as in LLaDA pre-training; or
- a chat example (LLaDA SFT): a user prompt in the chat template, never masked, then the answer,
  <|eot_id|> and <|endoftext|> padding to the row length, all maskable. The padding teaches the
  model to stop, so short answers commit their tail in the first steps.
"""
from __future__ import annotations

import random
from pathlib import Path
from typing import Callable

import numpy as np
from tokenizers import Tokenizer

from diffuse import DiffuseError
from diffuse.train.bpe import EOS, EOT, chat_prompt

HELDOUT_EVERY = 50
# Share of batches cut to a random shorter length (LLaDA does this for 1%): the engine often runs
# prompt + answer far shorter than the training length, and attention sees every position.
SHORT_BATCHES = 0.2


def read_documents(path: Path) -> list[str]:
    files = sorted(path.glob("*.txt")) if path.is_dir() else [path]
    if not files or not all(f.is_file() for f in files):
        raise DiffuseError(f"{path}: no .txt files to train on")
    docs = []
    for f in files:
        try:
            text = f.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as e:
            raise DiffuseError(f"{f}: cannot read as UTF-8 text: {e}") from e
        docs += [d.strip() for d in text.split("\n\n") if d.strip()]
    if len(docs) < 2:
        raise DiffuseError(f"{path}: needs at least two documents separated by a blank line")
    return docs


def split_heldout(docs: list[str]) -> tuple[list[str], list[str]]:
    held = docs[::HELDOUT_EVERY]
    train = [d for i, d in enumerate(docs) if i % HELDOUT_EVERY]
    return train, held


def token_stream(encode: Callable[[str], list[int]], eos_id: int, docs: list[str]) -> np.ndarray:
    """The documents' ids joined by <|endoftext|>: (n_tokens,) int64."""
    out = []
    for d in docs:
        out += encode(d) + [eos_id]
    return np.asarray(out, dtype=np.int64)


class Batches:
    """Random batches: `next()` -> ids (B, T') int64, maskable (B, T') bool, T' <= T."""

    def __init__(self, tok: Tokenizer, docs: list[str], seq_len: int, batch: int, chat_fraction: float, seed: int):
        self.tok, self.docs, self.T, self.B = tok, docs, seq_len, batch
        self.chat_fraction = chat_fraction
        self.eos, self.eot = tok.token_to_id(EOS), tok.token_to_id(EOT)
        self.stream = token_stream(lambda text: tok.encode(text).ids, self.eos, docs)
        if len(self.stream) <= seq_len:
            raise DiffuseError(f"training text has {len(self.stream)} tokens, fewer than one sequence of {seq_len}")
        self.rng = random.Random(seed)

    def next(self) -> tuple[np.ndarray, np.ndarray]:
        ids = np.empty((self.B, self.T), dtype=np.int64)
        maskable = np.ones((self.B, self.T), dtype=bool)
        for b in range(self.B):
            if self.rng.random() < self.chat_fraction:
                ids[b], start = self._chat_row()
                maskable[b, :start] = False
            else:
                s = self.rng.randrange(len(self.stream) - self.T)
                ids[b] = self.stream[s : s + self.T]
        if self.rng.random() < SHORT_BATCHES:
            # multiples of T/8 only: every new shape costs the CPU matmul backend a kernel set-up
            n = self.T // 8 * self.rng.randint(2, 7)
            return ids[:, :n], maskable[:, :n]
        return ids, maskable

    def _chat_row(self) -> tuple[np.ndarray, int]:
        """One SFT row and the index where the answer starts."""
        user, answer = self._task(self.rng.choice(self.docs).split())
        # The prompt is tokenized alone, exactly as the engine does before appending masks.
        p = self.tok.encode(chat_prompt(user)).ids[: self.T // 2]
        a = self.tok.encode(answer).ids + [self.eot]
        row = (p + a)[: self.T]
        return np.asarray(row + [self.eos] * (self.T - len(row)), dtype=np.int64), len(p)

    def _task(self, words: list[str]) -> tuple[str, str]:
        r = self.rng.random()
        if r < 0.4 and len(words) > 6:
            k = self.rng.randint(3, min(12, len(words) - 3))
            return f"Continue: {' '.join(words[:k])}", " ".join(words[k:])
        if r < 0.5:
            phrase = " ".join(words[: self.rng.randint(3, 15)])
            return f"Repeat after me: {phrase}", phrase
        if r < 0.7:
            return "Tell me something.", " ".join(words)
        # Anything else a user types ("Hello", a question): the opening 1-16 words of another
        # document, answered with a whole one. Without these rows the demo met an unknown prompt
        # with an empty answer (9 of 20 seeds for "Hello"). Short answers are few on purpose: the
        # end-of-text padding after them teaches that answers are short, and a low-confidence
        # schedule then commits the padding first and the answer ends before it starts.
        said = self.rng.choice(self.docs).split()[: self.rng.randint(1, 16)]
        return " ".join(said), " ".join(words)


def heldout_windows(encode: Callable[[str], list[int]], eos_id: int, docs: list[str], seq_len: int,
                    n: int) -> np.ndarray:
    """Up to n non-overlapping windows (n, T) of the held-out stream, for a reproducible score."""
    stream = token_stream(encode, eos_id, docs)
    n = min(n, len(stream) // seq_len)
    if n == 0:
        raise DiffuseError(f"held-out text is shorter than one sequence of {seq_len} tokens")
    return stream[: n * seq_len].reshape(n, seq_len)
