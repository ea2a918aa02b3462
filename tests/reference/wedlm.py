"""Tencent WeDLM's decoding loop, ported from its engine (github.com/Tencent/WeDLM, commit 0216110:
wedlm/engine/wedlm_decoder.py, sampler.py, scheduler.py postprocess), batch 1, greedy, driven by
the float64 `reference.nemotron.Reference` (Qwen3 or Qwen2ForCausalLM with WeDLM's weights).

The engine's paged K/V cache and flash attention become one cache-free pass per step: the
committed tokens in order, then the window in pass order, causal, each at its true RoPE position.
That is what the engine computes: a committed token's K/V were written when it led the window,
seeing only the tokens before it.

Quirks kept: the window is window_size positions plus the filled ones at its head (refilled before
each pass); the mask token is not excluded from the argmax or the entropy; the window runs past
max_tokens (those positions are filled, then dropped); the answer ends at the first stop token or
after max_tokens committed tokens, the final pass that commits them included.
"""
from __future__ import annotations

import numpy as np

from reference.nemotron import Reference


def wedlm_generate(model: Reference, prompt: list[int], mask_id: int, max_tokens: int, window_size: int = 16,
                   threshold: float | None = 0.4, pos_penalty: float = 0.02,
                   stop_ids: tuple[int, ...] = ()) -> tuple[list[int], list[dict]]:
    """The answer, and per decode pass {order, committed, filled: {position: token}, entropy:
    {position: nats}} (positions absolute)."""
    seq = list(prompt)
    cur = len(prompt)                                   # state.current_seq_len
    tokens, masked = [mask_id] * window_size, [True] * window_size
    passes: list[dict] = []
    finished = False
    while not finished:
        # prepare_decode_inputs: _refill_window_masks, then masks after the filled tokens
        first = next((i for i, m in enumerate(masked) if m), len(tokens))
        tokens, masked = tokens + [mask_id] * first, masked + [True] * first
        order = [i for i, m in enumerate(masked) if not m] + [i for i, m in enumerate(masked) if m]
        n_filled = sum(not m for m in masked)
        logits = model.logits(seq + [tokens[i] for i in order],
                              positions=list(range(cur)) + [cur + i for i in order])[cur:]
        record = {"order": [cur + i for i in order], "committed": [], "filled": {}, "entropy": {}}
        passes.append(record)
        # process_decode_outputs: commit the head, then fill
        prune = next((i for i, m in enumerate(masked) if m), len(tokens))
        for t in tokens[:prune]:
            record["committed"].append(cur)
            seq.append(t)
            cur += 1
            if t in stop_ids or cur - len(prompt) >= max_tokens:
                finished = True
                break
        if finished:
            break
        tokens, masked = tokens[prune:], masked[prune:]
        remaining = [i for i, m in enumerate(masked) if m]
        if not remaining:
            continue
        rows = logits[n_filled:]
        logp = rows - rows.max(-1, keepdims=True)
        logp -= np.log(np.exp(logp).sum(-1, keepdims=True))
        entropy = -(np.exp(logp) * logp).sum(-1)
        greedy = rows.argmax(-1)
        adjusted = entropy + (np.array(remaining) - remaining[0]) * pos_penalty
        chosen = list(np.nonzero(adjusted < threshold)[0]) if threshold is not None else []
        if not chosen:
            chosen = [int(adjusted.argmin())]
        for j, i in enumerate(remaining):
            record["entropy"][cur + i] = float(entropy[j])
        for j in chosen:
            tokens[remaining[j]] = int(greedy[j])
            masked[remaining[j]] = False
            record["filled"][cur + remaining[j]] = int(greedy[j])
    answer = seq[len(prompt):][:max_tokens]
    stop = next((k for k, t in enumerate(answer) if t in stop_ids), None)
    return (answer if stop is None else answer[:stop + 1]), passes
