"""Python ports of Fast-dLLM's decoding loops (NVlabs/Fast-dLLM), at temperature 0, driven by a
model object (below); nothing here touches the engine.

`llada_generate`: llada/generate.py `generate` (no cache), `generate_with_prefix_cache` and
`generate_with_dual_cache`, each with `threshold` (get_transfer_index) or `factor`
(get_transfer_index_dynamic, the later code's factor rule) or neither (the fixed per-step counts).
- Blocks of block_length after the prompt, steps // n_blocks counts per block; a block runs until it
  has no masks (with a threshold or factor the step budget is not used). NFE counts every pass.
- Prefix and dual caches: each block starts with one full pass, whose logits also decide that step;
  then every pass computes the rows from the block's start to the end (prefix) or the block's rows
  (dual), against the keys and values of the other rows from that full pass.
- `window` (DPad's suffix window, no cache): a pass sees the block and the next `window` positions
  only, at their absolute positions: the sequence cut there.

`dream_generate`: dream/model/generation_utils_block.py `_sample` with alg="confidence_threshold".
- Each block starts with one full pass; its shifted logits commit the block's first position at
  once. Then, while the block has masks, a pass over the block and what follows (prefix), the block
  (dual), or, with `cache=None`, the whole sequence (the official code has no such mode: this is the
  exact computation the caches approximate); logits shifted inside the rows computed (row r reads
  row r - 1's), the threshold rule over the block's masked positions.

Our deliberate differences, as in reference/block_generate.py: the mask token is never x0; ties
between equal confidences go to the lower position.

The model: `model.logits(x, rows=None)` -> float64 (len(rows), vocab); rows=None computes every row
(and, for a cached model, refills its cache).
"""
from __future__ import annotations

import numpy as np
from reference.block_generate import schedule
from reference.forward import forward


class Recompute:
    """Every pass computes every row (what the caches approximate)."""

    def __init__(self, hf_dir):
        self.hf_dir = hf_dir

    def logits(self, x, rows=None):
        out = forward(self.hf_dir, np.asarray(x))
        return out if rows is None else out[np.asarray(rows)]


class Cached:
    """A K/V cache of its own: a full pass stores every position's K/V; a pass over some rows
    replaces theirs and attends to the stored K/V of the others."""

    def __init__(self, hf_dir):
        self.hf_dir, self.kv = hf_dir, []

    def logits(self, x, rows=None):
        return forward(self.hf_dir, np.asarray(x), rows=rows, cache=self.kv)


def _probs(logits: np.ndarray) -> np.ndarray:
    z = np.exp(logits - logits.max(-1, keepdims=True))
    return z / z.sum(-1, keepdims=True)


def _proposals(logits: np.ndarray, mask_id: int) -> tuple[np.ndarray, np.ndarray]:
    """x0 (the argmax, the mask token excluded) and its softmax probability, per row."""
    logits = logits.copy()
    logits[:, mask_id] = -np.inf
    x0 = logits.argmax(-1)
    return x0, _probs(logits)[np.arange(len(x0)), x0]


def transfer(conf: np.ndarray, count: int | None, threshold: float | None, factor: float | None) -> np.ndarray:
    """Positions (indices into conf, -inf where not masked) one step commits: get_transfer_index
    (count, or with a threshold the first and every other one not below it) or
    get_transfer_index_dynamic (factor), most confident first."""
    n_masked = int(np.isfinite(conf).sum())
    order = np.argsort(-conf, kind="stable")[:n_masked]
    if factor is not None:
        # thresholds 1 - factor / (n + 1) for the n-th most confident (1-based), the first always passes;
        # the first failure at index top_i commits top_i, except at the last index, where all are
        top_i = n_masked - 1
        for j in range(1, n_masked):
            if conf[order[j]] < 1 - factor / (j + 2):
                top_i = j
                break
        if top_i == n_masked - 1:
            top_i += 1
        return order[:top_i]
    if threshold is not None:
        return np.array([o for j, o in enumerate(order) if j == 0 or conf[o] >= threshold], dtype=int)
    return order[:count]


def llada_generate(model, prompt: list[int], mask_id: int, gen_length: int, block_length: int, steps: int,
                   threshold: float | None = None, factor: float | None = None,
                   cache: str | None = None, window: int | None = None) -> tuple[list[int], int]:
    """(answer tokens, NFE) of Fast-dLLM's LLaDA generate; cache None, "prefix" or "dual"."""
    x = np.array(list(prompt) + [mask_id] * gen_length)
    n_prompt, n = len(prompt), len(prompt) + gen_length
    n_blocks = gen_length // block_length
    steps_per_block = steps // n_blocks
    nfe = 0
    for b in range(n_blocks):
        bs, be = n_prompt + b * block_length, n_prompt + (b + 1) * block_length
        counts = schedule(int((x[bs:be] == mask_id).sum()), steps_per_block)
        i = 0
        while True:
            nfe += 1
            if cache is None or i == 0:
                end = n if window is None else min(n, be + window)
                rows = np.arange(end)
                logits = model.logits(x[:end])
            else:
                rows = np.arange(bs, n if cache == "prefix" else be)
                logits = model.logits(x, rows)
            x0, p = _proposals(logits, mask_id)
            in_block = (rows >= bs) & (rows < be) & (x[rows] == mask_id)
            conf = np.where(in_block, p, -np.inf)
            chosen = transfer(conf, counts[i] if i < len(counts) else 0, threshold, factor)
            x[rows[chosen]] = x0[chosen]
            i += 1
            if not (x[bs:be] == mask_id).any():
                break
    return x[n_prompt:].tolist(), nfe


def dream_generate(model, prompt: list[int], mask_id: int, gen_length: int, block_length: int,
                   threshold: float, cache: str | None = None) -> tuple[list[int], int]:
    """(answer tokens, NFE) of Fast-dLLM's Dream block loop with the confidence_threshold alg;
    cache None (every pass over the whole sequence), "prefix" or "dual"."""
    x = np.array(list(prompt) + [mask_id] * gen_length)
    n_prompt, n = len(prompt), len(prompt) + gen_length
    nfe = 0
    for b in range(gen_length // block_length):
        bs, be = n_prompt + b * block_length, n_prompt + (b + 1) * block_length
        logits = model.logits(x)
        nfe += 1
        shifted = np.concatenate([logits[:1], logits[:-1]])
        x[bs] = _proposals(shifted[bs:bs + 1], mask_id)[0][0]           # the block's first position, at once
        while (x[bs:be] == mask_id).any():
            rows = np.arange(n) if cache is None else np.arange(bs, n if cache == "prefix" else be)
            logits = model.logits(x) if cache is None else model.logits(x, rows)
            nfe += 1
            logits = np.concatenate([logits[:1], logits[:-1]])              # the shift, inside the rows
            x0, p = _proposals(logits, mask_id)
            conf = np.where((rows >= bs) & (rows < be) & (x[rows] == mask_id), p, -np.inf)
            chosen = transfer(conf, None, threshold, None)
            x[rows[chosen]] = x0[chosen]
    return x[n_prompt:].tolist(), nfe
