"""What every view of a run shares: which run it shows, which step, and when there is a step to draw.

A live run is shown before its first step arrives (its options, and so its rule, are known from
the start; its sizes come with the first step), so `set_run` clears and `show_step` draws only
once the run has a step; until then a view says the run is starting (`empty_text`), not that
there is none. Subclasses implement `clear_run` and `draw_step`.
"""
from __future__ import annotations

from diffuse.studio.run_state import RunState

STARTING = "starting…"      # a run shown before its first step


class RunView:
    """Mixin for the Qt widgets that show one run at one step (put it first among the bases)."""

    run: RunState | None = None
    step: int = -1          # the step asked for; -1 (or past the end): the newest
    no_steps = ""           # why the loaded model's runs bring no steps (a server that sends text only)

    def set_run(self, run: RunState | None) -> None:
        self.run, self.step = run, -1
        self.clear_run(run)
        self.show_step(-1)

    def show_step(self, step: int) -> None:
        self.step = step
        run = self.run
        if run is not None and run.events:
            self.draw_step(run, run.clamp(step))

    def set_no_steps(self, why: str) -> None:
        """Say `why` while there is no step to draw ("": say the usual)."""
        self.no_steps = why
        if self.run is None or not self.run.events:
            self.clear_run(self.run)

    def empty_text(self, idle: str) -> str:
        """What the view says while it has no step to draw: why none will come, else `idle`
        without a run, else that the run is starting."""
        return self.no_steps or (idle if self.run is None else STARTING)

    def clear_run(self, run: RunState | None) -> None:
        """Forget what the previous run drew; show what `run` (None: no run) says before its
        first step: its rule and options, not its sizes."""
        raise NotImplementedError

    def draw_step(self, run: RunState, k: int) -> None:
        """Draw step index `k` (valid) of `run`, which has at least one step."""
        raise NotImplementedError
