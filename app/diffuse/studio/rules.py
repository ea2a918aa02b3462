"""The threshold rules, as the views explain them: what each compares with its tau, and which of a
step's commits the threshold added to what the rule commits anyway.

entropy_exit and low_confidence_dynamic commit at least the schedule's count (StepEvent.scheduled)
and every position past tau on top; confidence_threshold and entropy_bounded ignore the schedule
and commit at least one position (the most confident; the lowest entropy) and as many more as tau
allows. A step's commits split into that floor and the threshold's extras: the extras are the
committed positions ranked past the floor in the rule's own order (entropy lowest first,
confidence highest first). The rules themselves live in the engine (core_cpp/src/schedulers.cpp).

Events carry each position's top-1 probability; the confidence rules compare the probability of
the token they sample (after temperature, top-k, top-p). The two agree at temperature 0; at others
a position's shown confidence may sit on the other side of tau (the counts stay the engine's).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from diffuse.events import StepEvent
from diffuse.generation import default_options


@dataclass(frozen=True)
class ThresholdRule:
    scheduler: str
    option: str          # the generation option that holds tau
    quantity: str        # "entropy" (nats) or "confidence" (top-1 probability): what tau is compared with
    test: str            # how a commit passes tau, as the views word it (tau follows)
    floor: str           # what the rule commits whatever tau is: "schedule" or a one-position rule
    budget: bool = False  # tau bounds the sum of the step's entropies, not each position's
    tau: float = 0.0

    @property
    def lowest_first(self) -> bool:
        return self.quantity == "entropy"

    def passes(self, values: np.ndarray) -> np.ndarray:
        """bool: per-position rules, the values that pass tau on their own (a budget rule: none,
        its tau bounds a sum)."""
        with np.errstate(invalid="ignore"):
            if self.budget:
                return np.zeros(np.shape(values), bool)
            if self.quantity == "entropy":
                return values < self.tau
            return values > self.tau if self.scheduler == "low_confidence_dynamic" else values >= self.tau

    def floor_count(self, event: StepEvent) -> int:
        """How many of the step's commits the rule makes whatever tau is; -1: not known (a
        recording made before events carried the schedule's count)."""
        if self.floor != "schedule":
            return min(1, len(event.unmasked))
        return min(event.scheduled, len(event.unmasked)) if event.scheduled >= 0 else -1

    def condition(self) -> str:
        """The test with its tau: "entropy < 1.5 nats", "confidence ≥ 0.9"."""
        return f"{self.test} {self.tau:.3g}{' nats' if self.quantity == 'entropy' else ''}"


_RULES = {
    "entropy_exit": ThresholdRule("entropy_exit", "threshold", "entropy", "entropy <", "schedule"),
    "low_confidence_dynamic": ThresholdRule("low_confidence_dynamic", "confidence_threshold",
                                            "confidence", "confidence >", "schedule"),
    "confidence_threshold": ThresholdRule("confidence_threshold", "confidence_threshold",
                                          "confidence", "confidence ≥", "the most confident"),
    "entropy_bounded": ThresholdRule("entropy_bounded", "entropy_budget", "entropy",
                                     "Σ entropy − max ≤", "the lowest entropy", budget=True),
}


def threshold_rule(options: dict, arch: str | None) -> ThresholdRule | None:
    """The run's threshold rule with its tau, or None for a scheduler without one. A tau left to
    the model (None: a recording made before runs recorded their options resolved) is its
    family's default."""
    rule = _RULES.get(options.get("scheduler"))
    if rule is None:
        return None
    tau = options.get(rule.option)
    if tau is None and arch:
        tau = default_options(arch)[rule.option]
    if tau is None:      # no model to take the default from: nothing to explain with
        return None
    return ThresholdRule(**{**rule.__dict__, "tau": float(tau)})


def threshold_extras(rule: ThresholdRule, event: StepEvent) -> np.ndarray | None:
    """The positions (absolute, int64) among the step's commits that the threshold added past the
    rule's floor; None when the floor is not known."""
    floor = rule.floor_count(event)
    if floor < 0:
        return None
    committed = np.asarray(event.unmasked, np.int64)
    values = np.asarray(event.entropy if rule.quantity == "entropy" else event.confidence)[committed]
    order = np.argsort(values if rule.lowest_first else -values, kind="stable")
    return np.sort(committed[order[floor:]])
