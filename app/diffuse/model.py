"""The Python face of a loaded model: hyper-parameters, tokenizer, forward pass."""
from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from diffuse import _core
from diffuse._core import DiffuseError


class Model:
    """A GGUF model, memory-mapped. Use :func:`diffuse.load`."""

    def __init__(self, path: str | os.PathLike, threads: int | None = None,
                 tokenizer: str | os.PathLike | None = None):
        self.path = str(path)
        self._core = _core.Model(self.path, threads=threads or 0)
        hp = self._core.hparams
        self.hparams: dict = hp
        self.arch: str = hp["arch"]
        self.dialect: str = hp["dialect"]
        self.n_vocab: int = hp["n_vocab"]
        self.n_layer: int = hp["n_layer"]
        self.n_ctx_train: int = hp["n_ctx_train"]
        self.mask_token_id: int = hp["mask_token_id"]
        self._tokenizer_path = tokenizer
        self._tokenizer = None

    @property
    def tokenizer(self):
        """The model's tokenizer (loaded on first use)."""
        if self._tokenizer is None:
            from diffuse.tokenizer import Tokenizer
            self._tokenizer = Tokenizer.for_model(self.path, self._tokenizer_path, self.hparams)
        return self._tokenizer

    @property
    def threads(self) -> int:
        return self._core.threads

    @threads.setter
    def threads(self, n: int) -> None:
        self._core.threads = n

    @property
    def weights_bytes(self) -> int:
        return self._core.weights_bytes

    def forward(self, token_ids) -> np.ndarray:
        """Raw logits (n_tokens, n_vocab) float32 of every position, bidirectional, no Dream shift."""
        ids = np.asarray(token_ids)
        if ids.ndim != 1 or ids.size == 0:
            raise DiffuseError("forward: expected a non-empty 1-D sequence of token ids")
        if not np.issubdtype(ids.dtype, np.integer):
            raise DiffuseError("forward: token ids must be integers")
        return self._core.forward(ids.astype(np.int32))

    def __repr__(self) -> str:
        return f"<diffuse.Model {self.arch} ({self.dialect}) {Path(self.path).name}>"


def load(path: str | os.PathLike, threads: int | None = None,
         tokenizer: str | os.PathLike | None = None) -> Model:
    """Load a GGUF model (ours, llama.cpp's or diffuse-cpp's dialect).

    threads: CPU threads for the forward pass (default: all). tokenizer: a tokenizer.json for
    files that carry none (diffuse-cpp's); by default one beside the model file is used.
    """
    return Model(path, threads=threads, tokenizer=tokenizer)
