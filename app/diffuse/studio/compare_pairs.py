"""Compare's pairs: what each isolates, and the headline its two finished runs support.

Each pair changes one thing between A and B and says which effect it is about:
- STEPS: a rule that decides more positions per step (a threshold, an early stop): the headline is
  the steps each run took and why; time per step is a side figure.
- TIME: a cache or a narrower attention (the same schedule, cheaper steps): both runs take every
  step of the schedule (eos_stop none, so an answer that ends sooner cannot stop one early) and the
  headline is the median time per step beside the rows each step computed, read from the cache
  or left out; when the times do not tell apart work that differs, it says the model is too
  small for the saving to show.
- ANSWER: a change meant to give another answer (the order, sampling): the headline is where the
  answers differ.
- SPEC: AR against self-speculation on the same model and seed, which should give the same text
  (docs/self_speculation.md): the headline says whether it did (or where they part and why), the
  forward passes saved and the time per token after the prefill. Offered only for models that can
  self-speculate.

Every line states what the runs measured. The answers are compared up to the later end of text
(what a reader sees), and the line says until which step the runs made the same commits: with the
same seed, runs agree exactly until the one change first acts. The noise a sampled token draws is
keyed by (seed, step, position), so at a temperature above 0 a token decided at another step is
drawn with other noise.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from diffuse.generation import has_causal_modes
from diffuse.studio.run_state import RunState, options_text

STEPS, TIME, ANSWER, SPEC = "steps", "time", "answer", "spec"
# Per-step times closer than this ratio are not called a difference: on a busy machine one run's
# median moves by about that much.
TIME_NOISE = 1.2
ROWS_APART = 1.25      # rows per step this far apart should show in the time


@dataclass(frozen=True)
class Pair:
    a: dict                  # A's options over the Settings
    b: dict                  # B's
    effect: str              # STEPS, TIME or ANSWER: what the headline is about
    names: tuple[str, str]   # A and B in a few words, for the titles
    cause: str               # what makes the answers differ, when they do
    shared: dict = field(default_factory=dict)   # both runs, over the Settings: keeps the effect alone
    why_shared: str = ""
    causal: bool = False     # runs the modes over a causal cache: only for models that have them

    def offered(self, arch: str | None) -> bool:
        """Whether the pair can run on a model of architecture `arch` ("" or None: not known)."""
        return not self.causal or has_causal_modes(arch)

    def options(self, base: dict) -> tuple[dict, dict]:
        """A's and B's options: the Settings, the pair's shared options, then each side's own."""
        return ({**base, **self.shared, **self.a}, {**base, **self.shared, **self.b})

    @property
    def varied(self) -> set[str]:
        return set(self.a) | set(self.b) | set(self.shared)

    def shared_text(self) -> str:
        """What the pair sets for both runs and why; "" when nothing."""
        return f"both: {options_text(self.shared)} ({self.why_shared})" if self.shared else ""


def _timed(a: dict, b: dict, names: tuple[str, str], cause: str) -> Pair:
    """A TIME pair: the whole schedule in both, so their whole runs' times compare too."""
    return Pair(a, b, TIME, names, cause, shared={"eos_stop": "none"},
                why_shared="so both take every step of the schedule and their whole times compare")


_APPROX = ("keys and values reused for rows a step does not recompute are an approximation on "
           "full-attention models (block diffusion's cache is exact)")
_OTHER_STEPS = "decided positions at other steps than A, and every later step sees the text they make"
# A keeps the rule and sets a tau that never fires (no entropy is below 0; no probability above
# 1), so it commits what its schedule asks, in the same order: only tau's effect differs.
PRESETS: dict[str, Pair] = {
    "Inter-step cache: on vs off": _timed({"cache": True}, {"cache": False},
                                          ("cache on", "cache off"), _APPROX),
    "Entropy exit: τ off vs on": Pair(
        {"scheduler": "entropy_exit", "threshold": 0.0}, {"scheduler": "entropy_exit"}, STEPS,
        ("τ off", "τ on"), f"B's τ {_OTHER_STEPS}"),
    "Confidence threshold (low_confidence_dynamic): τ off vs on": Pair(
        {"scheduler": "low_confidence_dynamic", "confidence_threshold": 1.0},
        {"scheduler": "low_confidence_dynamic"}, STEPS, ("τ off", "τ on"), f"B's τ {_OTHER_STEPS}"),
    "Scheduler: low_confidence vs random": Pair(
        {"scheduler": "low_confidence"}, {"scheduler": "random"}, ANSWER,
        ("low_confidence: the most confident first", "random: a random order"),
        "the positions are decided in another order, so each sees other text"),
    "Temperature: 0 vs 0.8": Pair(
        {"temperature": 0.0}, {"temperature": 0.8}, ANSWER, ("temperature 0: the most likely token", "temperature 0.8: sampled"),
        "B samples each token (with the seed's noise), A takes the most likely"),
    # The fast-decoding methods against the decoding they speed up: A is the plain method, B adds one.
    "Fast-dLLM threshold vs the fixed schedule": Pair(
        {"scheduler": "low_confidence"}, {"scheduler": "confidence_threshold"}, STEPS,
        ("the fixed schedule", "Fast-dLLM's threshold"), f"B {_OTHER_STEPS}"),
    "Fast-dLLM factor rule vs the fixed schedule": Pair(
        {"scheduler": "low_confidence"}, {"scheduler": "confidence_factor"}, STEPS,
        ("the fixed schedule", "Fast-dLLM's factor rule"), f"B {_OTHER_STEPS}"),
    "DualCache vs the paper's cache": _timed(
        {"cache": True, "cache_policy": "active"}, {"cache": True, "cache_policy": "dual"},
        ("the paper's cache", "DualCache"), f"the two caches recompute other rows: {_APPROX}"),
    "PrefixCache vs no cache": _timed({"cache": False}, {"cache": True, "cache_policy": "prefix"},
                                      ("no cache", "PrefixCache"), _APPROX),
    "DPad suffix window 8 vs the whole suffix": _timed(
        {"suffix_window": -1}, {"suffix_window": 8}, ("the whole suffix", "a suffix window of 8"),
        "B's positions do not see the masked suffix past 8 positions after the block"),
    "Early end-of-text: none vs dInfer's": Pair(
        {"eos_stop": "none"}, {"eos_stop": "holds_eos"}, STEPS, ("no early stop", "dInfer's stop"),
        "B stopped where A went on"),
    "AR vs self-speculation, same model, same seed": Pair(
        {"mode": "ar"}, {"mode": "self_spec"}, SPEC, ("AR: one token per pass", "self-speculation: draft, verify"),
        "self-speculation keeps only drafts the AR pass agrees with", causal=True),
}


# -- what the runs measured ------------------------------------------------------------------

def answer_end(run: RunState) -> int:
    """The generated positions a reader sees: up to the first decided end-of-text."""
    e = run.events[-1]
    for i, (tid, masked) in enumerate(zip(e.gen_tokens.tolist(), e.gen_mask.tolist())):
        if not masked and tid in run.eos_ids:
            return i
    return run.gen_length


def answer_diff(a: RunState, b: RunState) -> np.ndarray:
    """bool (G,): positions where the final answers differ, up to the later end of text (past
    both ends the runs hold padding nobody reads)."""
    diff = a.differs_from(b)
    diff[max(answer_end(a), answer_end(b)):] = False
    return diff


def first_divergence(a: RunState, b: RunState) -> int | None:
    """The first step index at which the runs' tokens or masks differ (or one run ended); None
    when they went step for step alike to the same end."""
    for k, (ea, eb) in enumerate(zip(a.events, b.events)):
        if not (np.array_equal(ea.gen_tokens, eb.gen_tokens) and np.array_equal(ea.gen_mask, eb.gen_mask)):
            return k
    return None if a.n_steps == b.n_steps else min(a.n_steps, b.n_steps)


def step_ms(run: RunState) -> float:
    """The median step's time: one slow step (the machine busy elsewhere) does not move it."""
    return float(np.median(run.step_ms[:run.n_steps])) if run.n_steps else 0.0


def rows(run: RunState) -> tuple[float, float, int]:
    """Per step on average, the rows of the sequence the forward pass computed and those it read
    from the cache, and the sequence's rows (a suffix window leaves the rest out)."""
    cache = run.cache[:run.n_steps]
    return float((cache == 2).sum(1).mean()), float((cache == 1).sum(1).mean()), cache.shape[1]


def rows_text(run: RunState) -> str:
    """"12 of 87 computed, 75 from the cache, 0 left out", the parts there are."""
    computed, cached, total = rows(run)
    left = total - computed - cached
    return (f"{computed:.0f} of {total} computed" + (f", {cached:.0f} from the cache" if cached >= 0.5 else "")
            + (f", {left:.0f} left out" if left >= 0.5 else ""))


def _n(n: int, noun: str) -> str:
    return f"{n} {noun}{'s' * (n != 1)}"


def _stop(run: RunState) -> str:
    return {"eos": " (its answer ended: end of text)",
            "cancelled": " (stopped)"}.get(run.result.stop_reason, "")


# -- the figures, one line each, and the headline over them ----------------------------------

def steps_line(a: RunState, b: RunState) -> str:
    ra, rb = a.result, b.result
    line = (f"Steps: A {ra.steps}/{ra.steps_allowed}{_stop(a)} · "
            f"B {rb.steps}/{rb.steps_allowed}{_stop(b)}")
    saved = ra.steps - rb.steps
    if saved:
        who, n = ("B", saved) if saved > 0 else ("A", -saved)
        line += f" · {who} needed {n} fewer ({n / max(ra.steps, rb.steps):.0%})"
    return line


def tau_line(run: RunState) -> str | None:
    """What B's threshold did, measured: its commits past the rule's floor, or how close the
    masked positions came to tau when it never fired; None without a threshold rule."""
    rule = run.rule
    if rule is None or np.isnan(run.n_extra[:run.n_steps]).all():
        return None
    extra = run.n_extra[:run.n_steps]
    n_steps = int((extra > 0).sum())
    head = f"B ({rule.scheduler}, {rule.condition()}): "
    floor = "the schedule's count" if rule.floor == "schedule" else f"{rule.floor} position"
    if n_steps:
        return (f"{head}τ decided {_n(int(np.nansum(extra)), 'position')} beyond {floor}, at "
                f"{_n(n_steps, 'step')}")
    return f"{head}τ never fired: {closest_to_tau(run)}, so each step decided {floor} only"


def closest_to_tau(run: RunState) -> str:
    """How near tau the positions came that the rule could have decided but left masked (the
    current block's), over the whole run."""
    rule, values = run.rule, []
    for e in run.events:
        left = e.mask[e.block_start:e.block_end]
        v = (e.entropy if rule.quantity == "entropy" else e.confidence)[e.block_start:e.block_end][left]
        values.append(v[np.isfinite(v)])
    values = np.concatenate(values) if values else np.zeros(0)
    if not values.size:
        return "no position was left masked in its block"
    if rule.quantity == "entropy":
        return f"the positions left masked in their block had {values.min():.2f} nats at the lowest"
    return f"the positions left masked in their block had a probability of {values.max():.2f} at the highest"


def time_line(a: RunState, b: RunState) -> str:
    return (f"Time per step: A {step_ms(a):.1f} ms · B {step_ms(b):.1f} ms (medians) · rows per "
            f"step: A {rows_text(a)}, B {rows_text(b)} · whole runs: A "
            f"{a.result.total_ms / 1000:.2f} s, B {b.result.total_ms / 1000:.2f} s")


def answers_line(a: RunState, b: RunState, pair: Pair) -> str:
    diff = answer_diff(a, b)
    span = max(answer_end(a), answer_end(b))
    n = int(diff.sum())
    if not n:
        return f"Answers: identical (all {span} positions up to end of text)"
    k = first_divergence(a, b)
    when = "from the first step" if k == 0 else f"from step {k + 1} (the same commits until then)"
    line = (f"Answers: differ at {n} of {span} positions up to end of text (first at "
            f"{int(np.argmax(diff))}), outlined in both · the runs parted {when}: {pair.cause}")
    temperature = max(r.options.get("temperature") or 0.0 for r in (a, b))
    if pair.effect == STEPS and temperature > 0:
        line += (f"; at temperature {temperature:g} a token decided at another step is drawn "
                 f"with other noise")
    return line


def summary_lines(a: RunState, b: RunState, pair: Pair) -> list[str]:
    """Every figure the two runs measured, one line each, in the same order for every pair."""
    if pair.effect == SPEC:
        return [passes_line(a, b), token_time_line(a, b), spec_answer_line(a, b, pair)]
    tau = tau_line(b)       # A's tau, where it has one, is set never to fire
    return [steps_line(a, b), *([tau] if tau else []), time_line(a, b), answers_line(a, b, pair)]


def headline(a: RunState, b: RunState, pair: Pair) -> str:
    """The pair's point in one sentence, from what its runs measured; says so when the effect
    does not show on this model."""
    names = dict(zip("AB", pair.names))
    if pair.effect == TIME:
        return _time_headline(a, b, names)
    if pair.effect == STEPS:
        return _steps_headline(a, b, names)
    if pair.effect == SPEC:
        return _spec_headline(a, b)
    diff = answer_diff(a, b)
    span = max(answer_end(a), answer_end(b))
    if not diff.any():
        return f"The answers are the same ({span} positions up to end of text)."
    return (f"The answers differ at {int(diff.sum())} of {span} positions up to end of text: "
            f"{pair.cause}.")


def _time_headline(a: RunState, b: RunState, names: dict) -> str:
    runs = {"A": a, "B": b}
    ms = {x: step_ms(r) for x, r in runs.items()}
    fast, slow = sorted("AB", key=ms.get)
    ratio = ms[slow] / ms[fast] if ms[fast] > 0 else 1.0
    apart = {}      # the run whose steps did less work, by each measure where they differed
    for what, count in (("computed", lambda r: rows(r)[0]),
                        ("attended to", lambda r: rows(r)[0] + rows(r)[1])):
        n = {x: count(r) for x, r in runs.items()}
        few, many = sorted("AB", key=n.get)
        if n[many] >= ROWS_APART * n[few]:
            apart[f"{few}'s steps {what} {n[few]:.0f} rows and {many}'s {n[many]:.0f}"] = few
    if ratio >= TIME_NOISE:
        said = (f"{fast} ({names[fast]}) is {ratio:.1f}x faster per step: {ms[fast]:.1f} ms "
                f"against {ms[slow]:.1f} ms; rows per step: {fast} {rows_text(runs[fast])}, "
                f"{slow} {rows_text(runs[slow])}")
        if fast not in apart.values():      # the time says what the work does not
            said += (f". {fast} did no less work per step: load from elsewhere on the machine "
                     f"likely slowed {slow}'s run; run the pair again")
        return said + "."
    said = (f"No clear difference per step ({ms['A']:.1f} ms against {ms['B']:.1f} ms, within "
            f"{TIME_NOISE - 1:.0%}: one run's timing noise)")
    if not apart:
        return f"{said}; the steps did about the same work (A {rows_text(a)}; B {rows_text(b)})."
    return (f"{said}, though {' and '.join(apart)}: on this model that saving does not show in "
            f"the time (a small model's step has little matrix work to save); a larger model "
            f"shows it.")


def _steps_headline(a: RunState, b: RunState, names: dict) -> str:
    ra, rb = a.result, b.result
    saved = ra.steps - rb.steps
    rule = b.rule
    fired = rule is not None and np.nansum(b.n_extra[:b.n_steps]) > 0
    why = ""
    if ra.stop_reason == "eos" or rb.stop_reason == "eos":
        ended = [x for x, r in (("A", ra), ("B", rb)) if r.stop_reason == "eos"]
        why = (f"; {' and '.join(ended)} stopped when {'their answers' if len(ended) == 2 else 'its answer'} "
               f"ended, so the counts also measure where the answers end")
    if saved > 0:
        floor = ("the schedule's count" if rule is not None and rule.floor == "schedule"
                 else "the one position the rule always decides")
        by = (f", τ deciding {_n(int(np.nansum(b.n_extra[:b.n_steps])), 'position')} beyond {floor}"
              if fired else "")
        return (f"B ({names['B']}) took {_n(saved, 'fewer step')} than A ({names['A']}): {rb.steps} "
                f"against {ra.steps} ({saved / ra.steps:.0%}){by}{why}.")
    if rule is not None and not fired:
        return (f"B's τ ({rule.condition()}) never fired on this model at these settings: "
                f"{closest_to_tau(b)}; B took {rb.steps} steps, A {ra.steps}{why}.")
    if saved < 0:
        return (f"B ({names['B']}) took {_n(-saved, 'more step')} than A ({names['A']}): {rb.steps} "
                f"against {ra.steps}{why}.")
    return f"Both took {ra.steps} steps{why}."


# -- AR against self-speculation ---------------------------------------------------------------

def ms_per_token(run: RunState, k: int = -1) -> float:
    """The time per token after the prefill, up to step `k` (-1: the last): the steps' time over the
    tokens they committed. Every mode over a causal cache prefills alike and commits the first token
    there; the rest is the decoding compared (self-speculation against AR here, in the Studio's
    Self-speculation view, and AR's measured cost, run_controller.ar_cost_of)."""
    end = run.clamp(k) + 1
    tokens = run.n_committed[1:end].sum()
    return float(run.step_ms[1:end].sum() / tokens) if tokens else 0.0


def passes_line(a: RunState, b: RunState) -> str:
    pa, pb = a.result.forward_passes, b.result.forward_passes
    if not (pa and pb):
        return "Forward passes: not reported (a server sends none)"
    tokens = int(b.n_committed[:b.n_steps].sum())
    return (f"Forward passes: A {pa} (one per token after the prefill) · B {pb} (a draft and a verify pass per "
            f"iteration, {b.result.steps - 1} iterations after the prefill): {tokens / pb:.2f} tokens per pass · "
            f"{_saved(pa - pb)}")


def _saved(n: int) -> str:
    """B's passes against A's: "B ran 7 passes fewer"."""
    passes = f"{abs(n)} pass{'es' * (abs(n) != 1)}"
    return f"B ran {passes} fewer" if n > 0 else f"B ran {passes} more" if n < 0 else "B ran as many passes"


def token_time_line(a: RunState, b: RunState) -> str:
    ta, tb = ms_per_token(a), ms_per_token(b)
    said = f" · B at {ta / tb:.2f}x A's speed" if ta and tb else ""
    return (f"Time per token after the prefill: A {ta:.2f} ms · B {tb:.2f} ms{said} (B's passes run "
            f"{b.options.get('draft_length') or 'the default'} rows each; whole runs: A "
            f"{a.result.total_ms / 1000:.2f} s, B {b.result.total_ms / 1000:.2f} s)")


def parting(a: RunState, b: RunState) -> str:
    """Where the answers part and why, or "" when they are the same up to end of text."""
    diff = answer_diff(a, b)
    if not diff.any():
        return ""
    i = int(np.argmax(diff))
    temperature = max(r.options.get("temperature") or 0.0 for r in (a, b))
    why = (f"both sample at temperature {temperature:g}, and with the F16 K/V cache a one-row pass and a block "
           f"pass round differently, so a draw near a boundary between two tokens can flip (with an F32 "
           f"cache the draws agree)" if temperature > 0 else
           "a near tie between the two best tokens there, which the F16 K/V cache's rounding (different for a "
           "one-row pass and a block pass) can flip")
    return f"they part at position {i} (the {i} before it are the same): {why}; see docs/self_speculation.md"


def spec_answer_line(a: RunState, b: RunState, pair: Pair) -> str:
    span = max(answer_end(a), answer_end(b))
    where = parting(a, b)
    return (f"Answers: {where}" if where else
            f"Answers: the same, token for token (all {span} positions up to end of text): "
            f"{pair.cause}")


def _spec_headline(a: RunState, b: RunState) -> str:
    where = parting(a, b)
    text = (f"The answers differ: {where}." if where else
            f"Self-speculation gave AR's answer token for token ({max(answer_end(a), answer_end(b))} positions).")
    pa, pb = a.result.forward_passes, b.result.forward_passes
    if pa and pb:
        text += f" {_saved(pa - pb)}: {pb} against {pa}."
    ta, tb = ms_per_token(a), ms_per_token(b)
    if ta and tb:
        text += f" Per token after the prefill B took {tb:.2f} ms, A {ta:.2f} ms: "
        if max(ta, tb) / min(ta, tb) < TIME_NOISE:
            text += f"no clear difference (within {TIME_NOISE - 1:.0%}: one run's timing noise)."
        else:
            text += f"{max(ta, tb) / min(ta, tb):.2f}x {'faster' if tb < ta else 'slower'}"
            if tb > ta and pb and pb < pa:
                text += " (fewer passes, but each runs a block of rows: on this model that costs more than it saves)"
            text += "."
    return text
