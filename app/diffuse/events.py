"""Plain-data records that flow out of the denoising loop.

One `StepEvent` per denoising step, from the engine thread, to every listener (CLI live view,
Studio worker, recorder, benchmarks). Plain numpy arrays and numbers only, so events can be
recorded to a file, replayed into the UI in tests and exported. Positions are absolute indices
into the full sequence (prompt + generated buffer); `prompt_length` tells where the buffer starts.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


@dataclass
class StepEvent:
    step: int                 # 0-based global step index
    block: int                # 0-based block index (semi-autoregressive blocks)
    n_blocks: int
    steps_allowed: int        # total step budget of the run
    prompt_length: int
    block_start: int          # absolute position of the current block's first token
    block_end: int            # one past its last token
    tokens: np.ndarray        # int32 (n_total,), the sequence after this step (masked = mask id)
    mask: np.ndarray          # bool  (n_total,), True where still masked after this step
    unmasked: np.ndarray      # int32 (k,), positions committed this step
    entropy: np.ndarray       # float32 (n_total,), nats; NaN where not evaluated this step
    confidence: np.ndarray    # float32 (n_total,), top-1 probability; NaN where not evaluated
    active: np.ndarray        # int32, positions recomputed through the network this step
    cached: np.ndarray        # int32, positions whose K/V came from the inter-step cache
    forward_ms: float         # the forward pass (in a batch: the pass shared by every sequence)
    sample_ms: float
    total_ms: float
    # positions the schedule asked for this step (-1: unknown, a recording made before it was kept);
    # a rule may commit more (entropy_exit's tau, the threshold rules) or, capped, fewer
    scheduled: int = -1
    sequence: int = 0         # index of the prompt in generate_batch or generate_stream (0 for generate)
    # MoE models (expert_routing): int32 (n_layer, len(active), n_expert_used), the experts each
    # active position used at this step, best first; -1 in the last layer for rows whose logits
    # the step did not need (only those run its FFN). None for dense models.
    experts: np.ndarray | None = None
    # editing_threshold < 1 (LLaDA2.1's token-to-token editing): int32 (e,), committed positions
    # whose token this step replaced; the previous event's tokens hold what they were
    edited: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int32))
    # Uniform-state diffusion (DiffusionGemma); None for the other families. tokens then hold the
    # canvas this step denoised, `unmasked` the positions accepted (they take the drawn token) and
    # `mask` / `redrawn` the others (a uniform random token next); draft: int32 (canvas,), the argmax
    # canvas (the output if the canvas stops here); entropy_cut: the largest accepted entropy, nats
    # (a position is accepted when its entropy is at most this: the lowest entropies while their sum
    # minus the largest stays within entropy_budget).
    draft: np.ndarray | None = None
    redrawn: np.ndarray | None = None
    entropy_cut: float | None = None
    # mode self_spec: int32 (block_end - block_start,), the iteration's block as drafted (the seed,
    # committed before, then the drafted tokens), and how many drafts the verify pass kept. The bonus
    # token follows them at block_start + 1 + spec_accepted (in tokens); spec_draft[spec_accepted + 1],
    # when there is one, was the first rejected. None / -1 in the other modes.
    spec_draft: np.ndarray | None = None
    spec_accepted: int = -1
    # WeDLM (diffusion under causal attention): block_start/block_end span the sliding window;
    # window_order: int32 (w,), the window's absolute positions in the order the causal pass ran
    # them (filled tokens first, at their true RoPE positions, then the still-masked ones);
    # committed: int32 (c,), the leading filled positions whose exact causal K/V this step wrote
    # to the cache for good (the window slides past them). None in the other families.
    window_order: np.ndarray | None = None
    committed: np.ndarray | None = None

    @property
    def gen_tokens(self) -> np.ndarray:
        return self.tokens[self.prompt_length:]

    @property
    def gen_mask(self) -> np.ndarray:
        return self.mask[self.prompt_length:]


# Why a run ended: every step ran, end-of-text ended it early, a listener cancelled it, the engine failed.
STOP_REASONS = ("done", "eos", "cancelled", "error")


@dataclass
class GenerateResult:
    text: str                          # decoded answer, end-of-text padding trimmed
    tokens: np.ndarray                 # int32, generated positions (gen_length,), final state
    prompt_tokens: np.ndarray          # int32
    steps: int                         # steps actually run
    steps_allowed: int
    stop_reason: str                   # one of STOP_REASONS
    step_ms: np.ndarray                # float64 (steps,), wall time per step
    forward_ms: np.ndarray             # float64 (steps,)
    sample_ms: np.ndarray              # float64 (steps,)
    total_ms: float
    gen_length: int
    useful_length: int                 # decided (non-mask) tokens before the first end-of-text
    decided_step: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int32))  # (gen_length,)
    prefill_ms: float = 0.0            # block diffusion: the prompt's whole blocks, once (in total_ms)
    forward_passes: int = 0            # modes ar and self_spec, Nemotron's diffusion: forward passes run
    # The options the run used, the model's defaults filled in. options["seed"] is the seed that
    # ran, also when none was given (each run then draws one): passing it again repeats the run.
    options: dict = field(default_factory=dict)

    @property
    def buffer_tokens_per_s(self) -> float:
        """The paper's figure: generated positions (EOS padding included) per second."""
        return self.gen_length / (self.total_ms / 1000.0) if self.total_ms > 0 else 0.0

    @property
    def useful_tokens_per_s(self) -> float:
        """Decided tokens before the first end-of-text per second."""
        return self.useful_length / (self.total_ms / 1000.0) if self.total_ms > 0 else 0.0
