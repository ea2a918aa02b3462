"""One run, live or replayed, and the per-step arrays that every view draws from.

Views never walk the event list: each new event updates these arrays once (O(positions)), and a
view shows any step k by indexing them. G = generated positions, N = prompt + G, S = capacity in
steps (the run's step budget, grown if a run goes past it).
"""
from __future__ import annotations

from typing import Callable

import numpy as np

from diffuse import DiffuseError

from diffuse.events import GenerateResult, StepEvent
from diffuse.generation import ARCHITECTURES, default_options
from diffuse.recording import Recording
from diffuse.studio.rules import ThresholdRule, threshold_extras, threshold_rule

MASK_GLYPH = "░"
TAU_MARK = "◥"      # the corner mark of a threshold's commit on the canvas, as legends name it
EDIT_MARK = "◣"     # the corner mark of a token replaced by editing (LLaDA2.1), as legends name it
FIT_PERCENTILES = (5, 95)     # a fitted colour scale spends most colours on these percentiles


def step_number(k):
    """What every view calls step index k (an int or an array of them): steps are numbered from
    1, in headers ("step 1/15"), captions, tooltips, plot axes and step cursors alike."""
    return k + 1


def counted(n: int, noun: str) -> str:
    """n and its noun, plural unless n is 1: "1 draft", "3 passes"."""
    return f"{n} {noun}{('es' if noun.endswith('s') else 's') * (n != 1)}"


def options_text(options: dict) -> str:
    """Options as every view lists them: "steps 24, cache on, seed 0"; those left to the model
    (None) are not listed."""
    return ", ".join(f"{k} {'on' if v is True else 'off' if v is False else v}"
                     for k, v in options.items() if v is not None)


CAUSAL_MODES = {"ar": "AR decode", "self_spec": "self-speculation"}    # mode: what views call it


def family_of(arch) -> str | None:
    """The family of architecture `arch` (a recording's or a server's: anything), None if unknown."""
    return ARCHITECTURES[arch]["family"] if isinstance(arch, str) and arch in ARCHITECTURES else None


def run_option(options: dict, arch, name: str):
    """A run's option as it ran: the recorded value, or where the run left it to the model (None:
    a recording made before runs recorded their options resolved) the model's default."""
    value = options.get(name)
    if value is None and isinstance(arch, str) and arch in ARCHITECTURES:
        value = default_options(arch).get(name)
    return value


def causal_mode(options: dict) -> str | None:
    """"ar" or "self_spec" for a run in one of those modes (a token at a time over the causal cache,
    however it was drafted), else None (options read from a file: the mode may be anything)."""
    mode = options.get("mode")
    return mode if isinstance(mode, str) and mode in CAUSAL_MODES else None


def decoding_text(options: dict, arch) -> str:
    """How a run decoded, in a few words, for headers: its causal-cache mode ("AR decode",
    "self-speculation, draft blocks of 8"), the uniform-state canvas ("uniform-state canvas, up to 48 steps
    per canvas": it has no scheduler), WeDLM's window ("WeDLM, window 16") or its scheduler; "" when the
    options say none of these."""
    mode = causal_mode(options)
    if mode == "self_spec":
        return f"{CAUSAL_MODES[mode]}, draft blocks of {run_option(options, arch, 'draft_length')}"
    if mode:
        return CAUSAL_MODES[mode]
    if isinstance(arch, str) and arch in ARCHITECTURES and ARCHITECTURES[arch]["loop"] == "uniform-state":
        return f"uniform-state canvas, up to {run_option(options, arch, 'steps')} steps per canvas"
    if family_of(arch) == "wedlm":
        return f"WeDLM, window {run_option(options, arch, 'window_size')}"
    return str(options.get("scheduler") or "")


class RunState:
    def __init__(self, prompt: str = "", options: dict | None = None,
                 model: dict | None = None, decode: Callable[[list[int]], str] | None = None,
                 templated: bool = False):
        self.recording = Recording(prompt=prompt, options=dict(options or {}),
                                   model=dict(model or {}), templated=templated)
        self._decode = decode
        model = self.recording.model
        self.eos_ids = frozenset(int(t) for t in model.get("eos_ids", ()))
        self.special_ids = frozenset(int(t) for t in model.get("special_ids", ())) | self.eos_ids
        self.prompt_length = 0
        self.gen_length = 0
        self.n_steps = 0
        self.failed: str | None = None
        self.left_out = 0     # oldest chat messages left out of the prompt to fit the context
        self.cpu_percent: np.ndarray | None = None    # per core, over the run (set when it ends)
        self._fitted: dict[str, np.ndarray] = {}    # fitted_values, by mode

    @classmethod
    def from_recording(cls, rec: Recording) -> RunState:
        run = cls(rec.prompt, rec.options, rec.model, templated=rec.templated)
        run.recording.pieces = dict(rec.pieces)
        run.recording.created = rec.created
        for event in rec.events:
            run.add(event)
        run.finish(rec.result)
        return run

    # -- facts --------------------------------------------------------------------------------

    @property
    def prompt(self) -> str:
        return self.recording.prompt

    @property
    def options(self) -> dict:
        return self.recording.options

    @property
    def events(self) -> list[StepEvent]:
        return self.recording.events

    @property
    def result(self) -> GenerateResult | None:
        return self.recording.result

    @property
    def done(self) -> bool:
        return self.result is not None or self.failed is not None

    @property
    def arch(self):
        return self.recording.model.get("arch")

    @property
    def causal_mode(self) -> str | None:
        return causal_mode(self.options)

    @property
    def wedlm_window(self) -> bool:
        """Whether the run is WeDLM's own decoding: its sliding window, filled by its entropy rule."""
        return self.causal_mode is None and family_of(self.arch) == "wedlm"

    @property
    def rule(self) -> ThresholdRule | None:
        """The scheduler's threshold rule, if it has one: from the options, so a live run knows it
        before its first step (the engine resolves "auto" options as the run starts). None where no
        scheduler decides: modes ar and self_spec commit what the causal pass chooses, and WeDLM's
        window fills by its own rule (window_rule_text)."""
        if self.causal_mode or self.wedlm_window:
            return None
        return threshold_rule(self.options, self.arch)

    @property
    def uniform_state(self) -> bool:
        """Whether the run is uniform-state diffusion (DiffusionGemma's canvases): its steps carry
        the argmax draft."""
        return bool(self.events) and self.events[0].draft is not None

    def final_draft(self, step: int) -> bool:
        """Whether `step` ends a finished uniform-state run: its argmax draft is the answer."""
        return self.result is not None and step == self.n_steps - 1 and self.events[step].draft is not None

    def shown(self, step: int) -> tuple[np.ndarray, np.ndarray]:
        """The generated tokens and masks the canvas shows at `step`: the step's own, but at the
        end of a uniform-state run the last canvas's argmax draft, all decided (the step holds the
        canvas it denoised, its re-drawn positions masked; the draft is what the run returns)."""
        e = self.events[step]
        if not self.final_draft(step):
            return e.gen_tokens, e.gen_mask
        lo, hi = e.block_start - self.prompt_length, e.block_end - self.prompt_length
        tokens, mask = e.gen_tokens.copy(), e.gen_mask.copy()
        tokens[lo:hi], mask[lo:hi] = e.draft, False
        return tokens, mask

    def window_rule_text(self) -> str:
        """WeDLM's rule, as its window fills masks (core_cpp/src/loops/wedlm.cpp, WeDLMWindow::select)."""
        tau, penalty = (run_option(self.options, self.arch, k) for k in ("threshold", "pos_penalty"))
        return f"fills the masks whose entropy + {penalty} × distance to the first mask < {tau} nats, at least one"

    @property
    def steps_allowed(self) -> int:
        return self.events[-1].steps_allowed if self.events else 0

    def budget_text(self) -> str:
        """WeDLM's step budget and where it comes from (the n of "step k/n" while it runs, and of
        the chat's "25/39 steps", is not its steps option; each pass fills at least one position of
        the window's reach): "" for the other runs."""
        if not self.wedlm_window or not self.events:
            return ""
        window = run_option(self.options, self.arch, "window_size")
        if isinstance(window, int) and self.steps_allowed == self.gen_length + window - 1:
            why = f"gen_length {self.gen_length} + window {window} − 1"
        else:
            why = "what the model's context leaves"
        return f"at most {counted(self.steps_allowed, 'pass')} ({why})"

    def step_label(self, step: int) -> str:
        """"step k/n" for every view: n is the steps used once the run is over, the budget while
        it goes."""
        total = self.n_steps if self.done else max(self.steps_allowed, self.n_steps)
        return f"step {step_number(step)}/{total}"

    def commits_text(self, step: int) -> str:
        """How many positions the step committed; under a threshold rule, how many the rule
        commits anyway (the schedule's count, or its one position) and how many tau added."""
        n, rule = len(self.events[step].unmasked), self.rule
        said = f"{n} decided" + (f", {self.n_edited[step]:.0f} edited {EDIT_MARK}" if self.n_edited[step] else "")
        if rule is None:
            return said
        if np.isnan(self.n_extra[step]):      # a recording without the schedule's count
            return (f"{said}, {self.n_passed[step]:.0f} with {rule.condition()} (the schedule's "
                    f"count was not recorded)")
        floor = "by the schedule" if rule.floor == "schedule" else rule.floor
        extra = f"{self.n_extra[step]:.0f} by τ ({rule.condition()}) {TAU_MARK}"
        if rule.budget:
            extra += f", Σ − max {self.budget_used[step]:.2f}"
        return f"{said}: {self.n_floor[step]:.0f} {floor} + {extra}"

    def piece(self, token_id: int) -> str:
        """Text of one token; cached in the recording so replays need no tokenizer."""
        text = self.recording.pieces.get(token_id)
        if text is None:
            try:
                text = self._decode([token_id]) if self._decode else f"<{token_id}>"
            except DiffuseError:   # a damaged tokenizer from the model file: show the id, keep drawing
                text = f"<{token_id}>"
            self.recording.pieces[token_id] = text
        return text

    # -- building -----------------------------------------------------------------------------

    def _allocate(self, event: StepEvent) -> None:
        p, n = event.prompt_length, event.tokens.shape[0]
        self.prompt_length, self.gen_length = p, n - p
        s, g = max(event.steps_allowed, 1), n - p
        self.entropy = np.full((s, g), np.nan, np.float32)       # evaluated at step k
        self.confidence = np.full((s, g), np.nan, np.float32)
        self.latest_entropy = np.full((s, g), np.nan, np.float32)   # last value up to step k
        self.latest_confidence = np.full((s, g), np.nan, np.float32)
        self.cache = np.zeros((s, n), np.int8)            # 0 not run, 1 cached, 2 recomputed
        self.active_fraction = np.full(s, np.nan)
        self.step_ms = np.zeros(s)
        self.forward_ms = np.zeros(s)
        self.sample_ms = np.zeros(s)
        self.masked_min = np.full(s, np.nan)              # entropy over still-masked positions
        self.masked_median = np.full(s, np.nan)
        self.masked_max_confidence = np.full(s, np.nan)   # top-1 probability over them
        self.masked_median_confidence = np.full(s, np.nan)
        # Threshold rules (self.rule): of each step's commits, those the rule makes whatever tau
        # is (the schedule's count, or its one position) and those tau added; NaN: not known
        self.n_committed = np.zeros(s)
        self.n_edited = np.zeros(s)             # tokens replaced by editing at each step
        # Editing: (step index, generated position, the token it replaced), in step order
        self.edits: list[tuple[int, int, int]] = []
        self.n_floor = np.full(s, np.nan)
        self.n_extra = np.full(s, np.nan)
        self.n_passed = np.full(s, np.nan)      # commits whose own value passes tau
        self.budget_used = np.full(s, np.nan)   # budget rules: the step's sum of entropies less the largest
        self.by_threshold = np.zeros(g, bool)   # committed because of tau, past the rule's floor
        self.decided_step = np.full(g, -1, np.int32)
        self.commit_entropy = np.full(g, np.nan, np.float32)
        self.commit_confidence = np.full(g, np.nan, np.float32)
        self.entropy_max = 0.0

    def _grow(self) -> None:
        for name in ("entropy", "confidence", "latest_entropy", "latest_confidence", "cache",
                     "active_fraction", "step_ms", "forward_ms", "sample_ms", "masked_min",
                     "masked_median", "masked_max_confidence", "masked_median_confidence",
                     "n_committed", "n_edited", "n_floor", "n_extra", "n_passed", "budget_used"):
            a = getattr(self, name)
            pad = np.full_like(a, np.nan if a.dtype.kind == "f" else 0)
            setattr(self, name, np.concatenate([a, pad]))

    def add(self, event: StepEvent) -> None:
        if not self.events:
            self._allocate(event)
        elif self.n_steps >= self.entropy.shape[0]:
            self._grow()
        self.recording.add(event)
        k, p = self.n_steps, self.prompt_length
        ent = np.asarray(event.entropy[p:], np.float32)
        conf = np.asarray(event.confidence[p:], np.float32)
        self.entropy[k], self.confidence[k] = ent, conf
        prev_e = self.latest_entropy[k - 1] if k else np.full_like(ent, np.nan)
        prev_c = self.latest_confidence[k - 1] if k else np.full_like(conf, np.nan)
        self.latest_entropy[k] = np.where(np.isnan(ent), prev_e, ent)
        self.latest_confidence[k] = np.where(np.isnan(conf), prev_c, conf)
        if np.isfinite(ent).any():
            self.entropy_max = max(self.entropy_max, float(np.nanmax(ent)))
        self.cache[k, np.asarray(event.cached)] = 1
        self.cache[k, np.asarray(event.active)] = 2
        n_run = len(event.active) + len(event.cached)
        self.active_fraction[k] = len(event.active) / n_run if n_run else np.nan
        self.step_ms[k], self.forward_ms[k] = event.total_ms, event.forward_ms
        self.sample_ms[k] = event.sample_ms
        idx = np.asarray(event.unmasked, np.int64) - p
        self.n_committed[k] = len(idx)
        self.decided_step[idx] = event.step
        self.commit_entropy[idx] = self.latest_entropy[k, idx]
        self.commit_confidence[idx] = self.latest_confidence[k, idx]
        still = ent[event.gen_mask & np.isfinite(ent)]
        if still.size:
            self.masked_min[k], self.masked_median[k] = still.min(), np.median(still)
        still = conf[event.gen_mask & np.isfinite(conf)]
        if still.size:
            self.masked_max_confidence[k], self.masked_median_confidence[k] = still.max(), np.median(still)
        if (rule := self.rule) is not None:
            self._split_commits(rule, k, event, idx)
        edited = np.asarray(event.edited, np.int64) - p
        if edited.size and k:      # what they were: the previous step's tokens (step 0 has none to edit)
            before = self.events[-2].gen_tokens[edited]
            self.edits += [(k, int(g), int(t)) for g, t in zip(edited, before)]
            self.n_edited[k] = edited.size
        self.n_steps += 1
        self._fitted = {}

    def _split_commits(self, rule: ThresholdRule, k: int, event: StepEvent, committed: np.ndarray) -> None:
        p = self.prompt_length
        values = (self.entropy if rule.quantity == "entropy" else self.confidence)[k, committed]
        self.n_passed[k] = int(rule.passes(values).sum())
        if rule.budget and values.size:
            self.budget_used[k] = float(values.sum() - values.max())
        extras = threshold_extras(rule, event)
        if extras is not None:
            self.by_threshold[extras - p] = True
            self.n_extra[k] = len(extras)
            self.n_floor[k] = len(committed) - len(extras)

    def finish(self, result: GenerateResult | None) -> None:
        self.recording.finish(result)
        for tid in self.recording.token_ids():
            self.piece(tid)

    # -- reading ------------------------------------------------------------------------------

    def clamp(self, step: int) -> int:
        """A valid step index; -1 (or anything past the end) means the latest."""
        return self.n_steps - 1 if step < 0 or step >= self.n_steps else step

    def edits_until(self, step: int) -> dict[int, list[tuple[int, int]]]:
        """Generated position -> [(step index, the token it replaced)] of the edits up to `step`."""
        out: dict[int, list[tuple[int, int]]] = {}
        for k, g, old in self.edits:
            if k > step:
                break
            out.setdefault(g, []).append((k, old))
        return out

    def cell_values(self, step: int, mode: str) -> np.ndarray:
        """float32 (G,): per position, the value its cell shows at `step` (mode: entropy|confidence).

        Decided positions keep the value they had when committed; masked ones show the latest.
        """
        latest = self.latest_entropy if mode == "entropy" else self.latest_confidence
        commit = self.commit_entropy if mode == "entropy" else self.commit_confidence
        decided = (self.decided_step >= 0) & (self.decided_step <= self.events[step].step)
        return np.where(decided, commit, latest[step])

    def not_started(self, step: int) -> np.ndarray:
        """bool (G,): masked positions the step neither computed nor read from the cache. Block
        diffusion's later blocks: they do not exist for the model yet (full-attention runs have none).
        Uniform state: the canvases after the step's, which hold padding, not masks."""
        event = self.events[step]
        if event.draft is not None:
            return np.arange(self.gen_length) >= event.block_end - self.prompt_length
        return event.gen_mask & (self.cache[step, self.prompt_length:] == 0)

    def fitted_values(self, mode: str) -> np.ndarray:
        """The entropy (or top-1 probability) the answer's text tokens had when committed, special
        tokens (end-of-text, near 0 nats) left out: what a fitted colour scale fits. Kept until
        the next step (views ask on every redraw)."""
        if mode not in self._fitted:
            values = self.commit_entropy if mode == "entropy" else self.commit_confidence
            special = np.isin(self.events[-1].gen_tokens, list(self.special_ids))
            self._fitted[mode] = values[~special & np.isfinite(values)]
        return self._fitted[mode]

    def text_at(self, step: int) -> str:
        """The answer as it stands after `step`, as a reader sees it: committed text without
        special tokens, masks as MASK_GLYPH. Each stretch of committed tokens is decoded at once
        (a character may span tokens), and a character cut by a mask is held back."""
        event = self.events[step]
        stretches, stretch = [], []          # token ids of the committed text between masks
        for tid, masked in zip(event.gen_tokens.tolist(), event.gen_mask.tolist()):
            if masked:
                stretches.append(stretch)
                stretch = []
            elif tid in self.eos_ids:
                break
            elif tid not in self.special_ids:
                stretch.append(tid)
        texts = [self._decode_stretch(s) for s in stretches + [stretch]]
        if len(texts) > 1:      # a character cut by a mask decodes to U+FFFD at its edges
            texts = [t.strip("\ufffd") for t in texts]
        return MASK_GLYPH.join(texts).rstrip(MASK_GLYPH)

    def _decode_stretch(self, ids: list[int]) -> str:
        if self._decode is not None and ids:
            try:
                return self._decode(ids)
            except DiffuseError:   # a damaged tokenizer: the pieces as recorded
                pass
        return "".join(self.piece(t) for t in ids)

    def differs_from(self, other: RunState) -> np.ndarray:
        """bool (G,): generated positions whose final tokens differ between two runs."""
        a, b = self.events[-1].gen_tokens, other.events[-1].gen_tokens
        n = max(a.shape[0], b.shape[0])
        diff = np.ones(n, bool)
        m = min(a.shape[0], b.shape[0])
        diff[:m] = a[:m] != b[:m]
        return diff
