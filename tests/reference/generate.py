"""Python references of the published denoising loops at temperature 0, written from FACTS.md.

`logits_fn(x) -> (n, vocab)` is a full forward pass over the whole sequence (no cache), so these
loops recompute everything every step, as the reference implementations do.
"""
from __future__ import annotations

import numpy as np


def _softmax(logits: np.ndarray) -> np.ndarray:
    z = logits - logits.max(-1, keepdims=True)
    e = np.exp(z.astype(np.float64))
    return e / e.sum(-1, keepdims=True)


def llada_generate(logits_fn, prompt: list[int], mask_id: int, gen_length: int, steps: int,
                   block_length: int, cfg_scale: float = 0.0) -> np.ndarray:
    """LLaDA generate.py, remasking='low_confidence', temperature 0, optional classifier-free guidance."""
    x = np.array(list(prompt) + [mask_id] * gen_length)
    n_prompt = len(prompt)
    n_blocks = gen_length // block_length
    steps_per_block = steps // n_blocks
    for b in range(n_blocks):
        bs, be = n_prompt + b * block_length, n_prompt + (b + 1) * block_length
        n_mask = int((x[bs:be] == mask_id).sum())
        counts = [n_mask // steps_per_block + (i < n_mask % steps_per_block) for i in range(steps_per_block)]
        for i in range(steps_per_block):
            mask_index = x == mask_id
            logits = logits_fn(x)
            if cfg_scale > 0:
                un_x = x.copy()
                un_x[:n_prompt] = mask_id
                un_logits = logits_fn(un_x)
                logits = un_logits + (cfg_scale + 1) * (logits - un_logits)
            x0 = logits.argmax(-1)
            p = _softmax(logits)
            conf = p[np.arange(len(x)), x0]
            conf[be:] = -np.inf
            x0 = np.where(mask_index, x0, x)
            conf = np.where(mask_index, conf, -np.inf)
            # torch.topk: the k largest confidences
            order = np.argsort(-conf, kind="stable")[: counts[i]]
            x[order] = x0[order]
    return x[n_prompt:]


def dream_generate(logits_fn, prompt: list[int], mask_id: int, gen_length: int, steps: int,
                   alg: str, eps: float = 1e-3) -> np.ndarray:
    """Dream's diffusion_generate, alg in maskgit_plus | topk_margin | entropy, temperature 0."""
    x = np.array(list(prompt) + [mask_id] * gen_length)
    timesteps = np.linspace(1, eps, steps + 1)
    for i in range(steps):
        mask_index = x == mask_id
        logits = logits_fn(x)
        logits = np.concatenate([logits[:1], logits[:-1]], axis=0)   # Dream's shift
        masked = np.nonzero(mask_index)[0]
        p = _softmax(logits[masked])
        x0 = p.argmax(-1)
        if alg == "maskgit_plus":
            conf = p.max(-1)
        elif alg == "topk_margin":
            top2 = np.sort(p, -1)[:, -2:]
            conf = top2[:, 1] - top2[:, 0]
        else:
            conf = (p * np.log(p + 1e-300)).sum(-1)
        t, s = timesteps[i], timesteps[i + 1]
        n = int(len(masked) * (1 - s / t)) if i < steps - 1 else len(masked)
        if n > 0:
            chosen = np.argsort(-conf, kind="stable")[:n]
            x[masked[chosen]] = x0[chosen]
    return x[len(prompt):]
