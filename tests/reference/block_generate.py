"""Python ports of the official block-diffusion loops, driven by the float64 reference forward
(tests/reference/forward.py); nothing here touches the engine.

`sdar_generate`: JetAstra/SDAR generate.py `block_diffusion_generate`. The sequence is the prompt
plus masks up to a whole number of blocks: ceil((len(prompt) + gen_length) / B) * B positions, so
the answer is gen_length rounded up to end on a block boundary (blocks aligned at position 0; the
prompt's last partial block is shared with the first answer tokens). The prompt's whole blocks are
prefilled once (one pass storing K/V). Each step then runs the current block's B rows against the
finished blocks; when the block has no masks left, one more pass over its final tokens stores its
K/V. Per-step scheduled count: B // steps, the remainder to the first steps. Rules:
low_confidence_static (the scheduled count, most confident first), low_confidence_dynamic (every
masked position with confidence > tau when there are at least the (capped) scheduled count of them, else the
scheduled count), entropy_bounded and confidence_threshold (below). Generation stops after a
finished block when the answer so far holds a stop id.

`llada2_generate`: LLaDA2's `generate` (the HF remote modeling_llada2_moe.py; a copy in
yks23/Information-Gain-Sampler): SDAR's loop with block 32, 32 steps and low_confidence_dynamic at
0.95, whose scheduled count the official code already caps at the masks left. It recomputes the
window 0..b1-1 every step (no prefill or store passes: caching finished blocks is exact, so the tokens
are the same); a block ends when it has no masks; generation stops after a block whose answer holds
eos_id, and the answer is cut after its first eos_id.

`llada21_generate`: LLaDA2.1's `generate` (the HF remote modeling_llada2_moe.py of
inclusionAI/LLaDA2.1-mini; read in copies of it, the same loop as SGLang's JointThreshold in
python/sglang/srt/dllm/algorithm/joint_threshold.py). LLaDA2's loop, every pass recomputing the
window 0..b1-1, with token-to-token editing; `steps` is computed there but never read. A pass over
block [b0, b1): x0 and its probability for every row; mask to token: every masked position above
`threshold` when there are at least num_to_transfer (1) of them, else the num_to_transfer most
confident; token to token: every position of the block that was neither masked at the pass's
start nor prompt, whose x0 differs from its token and is more than `editing_threshold` likely.
Both apply at once. Once the block has no masks, each pass counts as a post step: the block ends
before a pass that would be post step max_post_steps + 1, or after a post step that edits
nothing. eos_early_stop: generation stops after a block when the answer so far has no masks and
holds eos_id; the answer is cut after its first eos_id.

`fast_dllm_v2_generate`: Fast-dLLM v2's `generate` (its Hugging Face modeling.py, batch 1,
use_block_cache=False), described on the function.

`stable_diffcoder_generate`: Stable-DiffCoder's `generate_block` (ByteDance-Seed's remote
modeling_stable_diffcoder.py, read through copies of the Hugging Face file), described on the
function.

Our deliberate differences from the official code:
- Temperature 0 is greedy: x0 = argmax, confidence = softmax probability of x0 at temperature 1
  (SDAR's sampler has no temperature-0 branch: it divides by the temperature; LLaDA2's samples with
  torch.multinomial at temperature 1 when given 0).
- The scheduled count is capped at the masks left. Officially top-k then also picks positions
  already decided (confidence -inf) and overwrites them with x0, prompt tokens included (when the
  prompt shares the block, or block_length % steps leaves a count above the masks left).
- entropy_bounded follows the EB-sampler: per masked position the entropy H of its full
  distribution (temperature 1), sorted ascending; commit the largest k with
  sum(H_1..H_k) - max(H_1..H_k) <= gamma (`eb_threshold`, official default 0.35), at least 1. The
  official branch computes -sum(p log p) over the block dimension of x0's probabilities (one number
  per sequence, not per position), then searchsorted over its cumulative sum, and assigns into
  `transfer_index`, which that branch never creates: it raises UnboundLocalError on its first step.
- entropy_bounded and confidence_threshold run a block until it has no masks (the official loop
  stops after steps + 1 passes, which may leave masks); static and dynamic finish within `steps`
  steps either way.
- confidence_threshold (Fast-dLLM): every masked position with confidence >= tau, and always the
  most confident one. Fast-dLLM v2's code compares with > tau; the two differ only at a probability
  exactly equal to tau.
- Fast-dLLM v2: a prompt of exactly one block is prefilled like a longer one (the official code
  prefills only when len(prompt) > block_size, so a one-block prompt is never seen by the model and
  the answer starts at position 0).
- LLaDA2.1: mask to token is the dynamic rule with a floor of 1 (num_to_transfer), which is ours
  with a scheduled count of 1 (steps = block_length). With editing off (editing_threshold 1: no
  probability is above it) the official loop still runs one post step per block that cannot
  change a token; we skip it. The 2.1 official answer is cut after its first eos_id too.
- Ties between equal confidences go to the lower position (torch.topk leaves the order open).
- The mask token is never x0 (its logit is dropped before the softmax): committing it would leave
  the position masked (the official code would count it as decided).

Every pass is recorded: `Run.passes` lists (kind, commits) per forward pass, kind "prefill",
"denoise" or "store", commits the (position, token) pairs it decided; the number of forward
passes (NFE) is len(passes), counted as the official loops run them.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
from reference.forward import forward

RULES = ("low_confidence_static", "low_confidence_dynamic", "entropy_bounded", "confidence_threshold")


@dataclass
class Run:
    tokens: list[int]                                   # the answer (positions from len(prompt) on)
    passes: list[tuple[str, list[tuple[int, int]]]] = field(default_factory=list)
    edits: list[list[tuple[int, int]]] = field(default_factory=list)   # LLaDA2.1: per pass, (position, token)

    @property
    def forwards(self) -> int:
        return len(self.passes)


class Recompute:
    """Every pass recomputes positions 0..b1-1 under the block-causal mask (no cache)."""

    def __init__(self, hf_dir, block_size: int):
        self.hf_dir, self.block_size = hf_dir, block_size

    def logits(self, x: list[int], b0: int, b1: int) -> np.ndarray:
        return forward(self.hf_dir, x[:b1], block_size=self.block_size)[b0:b1]

    store = logits


class Cached:
    """Finished blocks' K/V are kept; a pass computes only rows b0..b1-1 against them, and `store`
    appends those rows' K/V (b0 must be where the cache ends)."""

    def __init__(self, hf_dir, block_size: int):
        self.hf_dir, self.block_size, self.past = hf_dir, block_size, None

    def _length(self) -> int:
        return 0 if self.past is None else self.past[0][0].shape[1]

    def logits(self, x: list[int], b0: int, b1: int, kv_out: list | None = None) -> np.ndarray:
        assert b0 == self._length(), "a pass must start where the cache ends"
        return forward(self.hf_dir, x[b0:b1], block_size=self.block_size, past=self.past, kv_out=kv_out)

    def store(self, x: list[int], b0: int, b1: int) -> np.ndarray:
        kv: list = []
        out = self.logits(x, b0, b1, kv)
        self.past = kv
        return out


def schedule(block_length: int, steps: int) -> list[int]:
    """SDAR's get_num_transfer_tokens: block_length // steps per step, the remainder first."""
    return [block_length // steps + (i < block_length % steps) for i in range(steps)]


def _probs(logits: np.ndarray) -> np.ndarray:
    z = np.exp(logits - logits.max(-1, keepdims=True))
    return z / z.sum(-1, keepdims=True)


def choose(rule: str, logits: np.ndarray, masked: np.ndarray, count: int, tau: float, gamma: float) -> np.ndarray:
    """Rows (indices into logits) to commit: logits (n, vocab) float64, masked (n,) bool."""
    p = _probs(logits)
    x0 = logits.argmax(-1)
    conf = np.where(masked, p[np.arange(len(p)), x0], -np.inf)
    order = np.argsort(-conf, kind="stable")            # most confident first, lower position on ties
    n_masked = int(masked.sum())
    count = min(count, n_masked)
    if rule == "low_confidence_static":
        return order[:count]
    if rule == "low_confidence_dynamic":
        high = np.nonzero(conf > tau)[0]
        return high if len(high) >= count else order[:count]
    if rule == "confidence_threshold":
        return np.union1d(np.nonzero(conf >= tau)[0], order[:1])
    if rule == "entropy_bounded":
        h = -(p * np.log(np.maximum(p, 1e-300))).sum(-1)
        rows = np.nonzero(masked)[0]
        rows = rows[np.argsort(h[rows], kind="stable")]
        hs = h[rows]
        # sorted ascending, so max(H_1..H_k) = H_k and the bound reads sum(H_1..H_{k-1}) <= gamma
        k = max(1, int(np.searchsorted(np.cumsum(hs) - hs, gamma, side="right")))
        return rows[:k]
    raise ValueError(f"unknown rule {rule!r}")


def _commit(run: Run, x: list[int], start: int, logits: np.ndarray, rows) -> None:
    """Writes the argmax of `rows` (offsets from position `start`) into x, recorded as one denoising pass."""
    x0 = logits.argmax(-1)
    commits = [(start + int(r), int(x0[r])) for r in sorted(rows)]
    for pos, tok in commits:
        x[pos] = tok
    run.passes.append(("denoise", commits))


def sdar_generate(model, prompt: list[int], mask_id: int, gen_length: int, block_length: int = 4, steps: int = 4,
                  rule: str = "low_confidence_dynamic", confidence_threshold: float = 0.85,
                  eb_threshold: float = 0.35, stop_ids=()) -> Run:
    """SDAR's block_diffusion_generate at temperature 0 (see the module docstring)."""
    n, B = len(prompt), block_length
    n_blocks = -(-(n + gen_length) // B)
    x = list(prompt) + [mask_id] * (n_blocks * B - n)
    run = Run(tokens=[])
    prefill = n // B * B
    if prefill:
        model.store(x, 0, prefill)
        run.passes.append(("prefill", []))
    counts = schedule(B, steps)
    end = n
    for b0 in range(prefill, n_blocks * B, B):
        b1, step = b0 + B, 0
        while True:
            masked = np.array([t == mask_id for t in x[b0:b1]])
            if not masked.any():
                model.store(x, b0, b1)
                run.passes.append(("store", []))
                break
            logits = model.logits(x, b0, b1).copy()
            logits[:, mask_id] = -np.inf
            rows = choose(rule, logits, masked, counts[step] if step < steps else 0, confidence_threshold,
                          eb_threshold)
            x0 = logits.argmax(-1)
            commits = [(b0 + int(r), int(x0[r])) for r in sorted(rows)]
            for pos, tok in commits:
                x[pos] = tok
            run.passes.append(("denoise", commits))
            step += 1
        end = b1
        if any(t in stop_ids for t in x[n:b1]):
            break
    run.tokens = x[n:end]
    return run


def llada2_generate(model, prompt: list[int], mask_id: int, eos_id: int, gen_length: int, block_length: int = 32,
                    steps: int = 32, threshold: float = 0.95) -> Run:
    """LLaDA2's generate at temperature 0 (see the module docstring): the answer up to and with its
    first eos_id, at most gen_length tokens."""
    steps = min(steps, gen_length)                 # the official minimal_topk = 1 cap
    n, B = len(prompt), block_length
    n_blocks = -(-(n + gen_length) // B)
    x = list(prompt) + [mask_id] * (n_blocks * B - n)
    run = Run(tokens=[])
    counts = schedule(B, steps)
    end = n
    for b0 in range(n // B * B, n_blocks * B, B):
        b1 = b0 + B
        for step in range(steps):
            masked = np.array([t == mask_id for t in x[b0:b1]])
            if not masked.any():
                break
            logits = model.logits(x, b0, b1).copy()
            logits[:, mask_id] = -np.inf
            rows = choose("low_confidence_dynamic", logits, masked, counts[step], threshold, 0.0)
            x0 = logits.argmax(-1)
            commits = [(b0 + int(r), int(x0[r])) for r in sorted(rows)]
            for pos, tok in commits:
                x[pos] = tok
            run.passes.append(("denoise", commits))
        end = b1
        if eos_id in x[n:b1]:
            break
    answer = x[n:min(end, n + gen_length)]
    run.tokens = answer[:answer.index(eos_id) + 1] if eos_id in answer else answer
    return run


def llada21_generate(model, prompt: list[int], mask_id: int, eos_id: int, gen_length: int, block_length: int = 32,
                     threshold: float = 0.95, editing_threshold: float = 0.9, max_post_steps: int = 16) -> Run:
    """LLaDA2.1's generate at temperature 0, eos_early_stop on (see the module docstring).
    `passes` holds each pass's mask-to-token commits, `edits` its token-to-token edits."""
    n, B = len(prompt), block_length
    n_blocks = -(-(n + gen_length) // B)
    x = list(prompt) + [mask_id] * (n_blocks * B - n)
    run = Run(tokens=[])
    end = n
    for b0 in range(n // B * B, n_blocks * B, B):
        b1 = b0 + B
        post_steps = 0
        while True:
            masked = np.array([t == mask_id for t in x[b0:b1]])
            if not masked.any():
                post_steps += 1
                if post_steps > max_post_steps or editing_threshold >= 1:
                    break
            logits = model.logits(x, b0, b1).copy()
            logits[:, mask_id] = -np.inf
            x0 = logits.argmax(-1)
            p = _probs(logits)[np.arange(B), x0]
            rows = choose("low_confidence_dynamic", logits, masked, 1, threshold, 0.0) if masked.any() else []
            commits = [(b0 + int(r), int(x0[r])) for r in sorted(rows)]
            editable = [r for r in range(B) if not masked[r] and b0 + r >= n]
            edits = [(b0 + r, int(x0[r])) for r in editable if x0[r] != x[b0 + r] and p[r] > editing_threshold]
            for pos, tok in commits + edits:
                x[pos] = tok
            run.passes.append(("denoise", commits))
            run.edits.append(edits)
            if not masked.any() and not edits:
                break
        end = b1
        if mask_id not in x[n:b1] and eos_id in x[n:b1]:
            break
    answer = x[n:min(end, n + gen_length)]
    run.tokens = answer[:answer.index(eos_id) + 1] if eos_id in answer else answer
    return run


def fast_dllm_v2_generate(model, prompt: list[int], mask_id: int, max_new_tokens: int, block_size: int = 32,
                          sub_block_size: int = 8, threshold: float = 0.9, stop_id: int | None = None) -> Run:
    """Fast-dLLM v2's generate at temperature 0, batch 1, without the sub-block cache.

    - Blocks of B = block_size aligned at 0; max_new_tokens // B blocks are decoded.
    - A prompt of at least one whole block is prefilled (its whole blocks, K/V stored). When it ends
      on a block boundary, the prefill's last logit row (argmax, unshifted) gives the first answer
      token, committed at once.
    - A block: the sequence is padded with masks to the block's end. While the block has masks, its
      sub-blocks of sub_block_size are decoded in order; while a sub-block has masks, one pass over
      the whole block (all B rows, against the finished blocks) with the token shift (row r reads
      the logits of row r - 1, row 0 its own), and the confidence_threshold rule restricted to the
      sub-block's masked positions.
    - A finished block gets one more pass over its final tokens, storing its K/V; its last row's
      logit (argmax) is the next block's first token, appended at once (so every later block has
      B - 1 masks). This also happens after the last block: the answer then ends with that token.
    - Stop: before every pass, when the tokens since the current block's start (its first,
      inherited token excluded) hold stop_id with no mask before it, the block ends there (no store
      pass); and before every block, a stop_id anywhere in the answer ends generation. The answer
      is cut after its first stop_id.
    """
    n, B = len(prompt), block_size
    x = list(prompt)
    run = Run(tokens=[])
    def carried(logits: np.ndarray) -> int:
        """The next block's first token: the argmax of the last row, the mask token excluded."""
        last = logits[-1].copy()
        last[mask_id] = -np.inf
        return int(last.argmax())

    def stopped(start: int) -> bool:
        rest = x[start:]
        return stop_id in rest and mask_id not in rest[:rest.index(stop_id)]

    if n >= B:
        prefill = n // B * B
        logits = model.store(x, 0, prefill)
        commits = []
        if n % B == 0:
            commits = [(n, carried(logits))]
            x.append(commits[0][1])
        run.passes.append(("prefill", commits))

    for _ in range(max_new_tokens // B):
        if stop_id in x[n:]:
            break
        start = len(x)
        b0 = start // B * B
        b1 = b0 + B
        x += [mask_id] * (b1 - start)
        while not stopped(start):
            if mask_id not in x[b0:b1]:
                x.append(carried(model.store(x, b0, b1)))
                run.passes.append(("store", [(b1, x[-1])]))
                break
            for s0 in range(b0, b1, sub_block_size):
                s1 = s0 + sub_block_size
                while mask_id in x[s0:s1] and not stopped(start):
                    logits = model.logits(x, b0, b1)
                    logits = np.concatenate([logits[:1], logits[:-1]])[s0 - b0:s1 - b0]   # the token shift
                    masked = np.array([t == mask_id for t in x[s0:s1]])
                    _commit(run, x, s0, logits, choose("confidence_threshold", logits, masked, 0, threshold, 0.0))
    answer = x[n:]
    if stop_id in answer:
        answer = answer[:answer.index(stop_id) + 1]
    run.tokens = answer
    return run


def stable_diffcoder_generate(model, prompt: list[int], mask_id: int, gen_length: int, block_length: int = 4,
                              steps: int = 4, threshold: float | None = None, eos_id: int | None = None) -> Run:
    """Stable-DiffCoder's generate_block at temperature 0, batch 1. `steps` is the official total
    (its card: steps = gen_length), divided evenly among the gen_length // block_length blocks.

    - Blocks of B = block_length aligned at position 0 and ending at len(prompt) + gen_length: the
      prompt's whole blocks are prefilled (K/V stored); its tail shares the first block; the last
      block is cut at the answer's end (gen_length need not fill it).
    - A block with m masks: m // s per step, the remainder to the first steps (s steps per block);
      a step scheduled 0 runs no pass. A pass computes the block's rows against the cache (its
      K/V are not kept); low_confidence commits the scheduled count of masked positions with the
      highest probability of their argmax; with a threshold every masked position at or above it,
      and the most confident always.
    - A block without masks: when its answer positions hold eos_id, the answer ends at the first
      one (the rest of the block becomes eos_id) and generation stops, with no further pass;
      otherwise one pass over its final tokens stores its K/V.

    Differences (beside the module's): with a threshold a block runs until it has no masks (the
    official loop leaves masks behind, and writes no K/V for that block, when m > s)."""
    n, B = len(prompt), block_length
    assert gen_length % B == 0 and steps % (gen_length // B) == 0, "the official loop's asserts"
    s = steps // (gen_length // B)
    end = n + gen_length
    x = list(prompt) + [mask_id] * gen_length
    run = Run(tokens=[])
    prefill = n // B * B
    if prefill:
        model.store(x, 0, prefill)
        run.passes.append(("prefill", []))
    for b0 in range(prefill, end, B):
        b1 = min(b0 + B, end)
        m = sum(t == mask_id for t in x[b0:b1])
        counts = schedule(m, s)
        step = 0
        while mask_id in x[b0:b1]:
            count = counts[step] if step < s else 0
            step += 1
            if threshold is None and count == 0:
                continue
            logits = model.logits(x, b0, b1).copy()
            logits[:, mask_id] = -np.inf
            masked = np.array([t == mask_id for t in x[b0:b1]])
            if threshold is None:
                rows = choose("low_confidence_static", logits, masked, count, 0.0, 0.0)
            else:
                rows = choose("confidence_threshold", logits, masked, 0, threshold, 0.0)
            _commit(run, x, b0, logits, rows)
        answer = x[max(b0, n):b1]
        if eos_id is not None and eos_id in answer:
            first = max(b0, n) + answer.index(eos_id)
            run.tokens = x[n:first] + [eos_id] * (b1 - first)
            return run
        model.store(x, b0, b1)
        run.passes.append(("store", []))
    run.tokens = x[n:end]
    return run
