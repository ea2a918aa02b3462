"""Who may run the loaded model now, and the runs the main window shows.

One thing runs the model at a time: a chat answer, a compare pair or a benchmark sweep (the smoke
test asks as the chat does). Two at once would time each other and share the model's buffers.
A part of the Studio asks `acquire(holder, stop)` before it runs and calls `release(holder)` when
it is done (a compare pair holds the model across both of its runs); `holder_changed` tells every
part, so that each run button turns off with `refusal(...)` as its tooltip, and Cancel stops
whoever holds it. Runs on the engine thread start through `start`, by the holder only.

Who runs is a name and a stop function, not a kind of model: the runner is whatever `engine`
is (the local Engine, or anything with its start/stop/busy, model and run signals, such as a
client of a remote server).

It also keeps the state of the runs the window shows: the one on screen, the chat's run while it
goes (and what was on screen before it), the served request the views follow, and the
recordings and exports being written, which closing the window waits for; and what a token costs
in mode ar on each model, as measured by the last such run here (what self-speculation's speed is
held against: `ar_cost`), or by a short one it runs when asked (`measure_ar`).
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from PySide6.QtCore import QObject, Signal

from diffuse.studio import storage
from diffuse.studio.compare_pairs import ms_per_token
from diffuse.studio.run_state import RunState
from diffuse.studio.workers import Engine, Job

# holder -> what it is, as the refusal names it
HOLDERS = {"chat": "A chat answer", "compare": "A comparison", "benchmarks": "A benchmark sweep",
           "measure": "A measurement of AR decoding"}
AR_MEASURE_TOKENS = 32      # the one-row steps `measure_ar` runs: enough for a steady median


@dataclass(frozen=True)
class ARCost:
    """What a token cost in mode ar on a model: the time per token after the prefill (one one-row
    pass and its sampling each; compare_pairs.ms_per_token) of a run of `steps` such steps that ended
    at `when` (HH:MM)."""
    ms_per_token: float
    steps: int
    when: str


def ar_cost_of(run: RunState) -> ARCost | None:
    """`run`'s AR cost per token, if it is a finished mode-ar run with steps past its prefill."""
    if run.options.get("mode") != "ar" or run.result is None or run.result.stop_reason == "cancelled" \
            or run.n_steps < 2:
        return None
    return ARCost(ms_per_token(run), run.n_steps - 1, time.strftime("%H:%M", time.localtime()))


class RunController(QObject):
    holder_changed = Signal(object)     # the HOLDERS key now running the model, or None
    recorded = Signal(object, str)      # (the tag given to `record`, the file written)
    not_recorded = Signal(str)          # why a run's recording could not be written
    ar_measured = Signal(object)        # measure_ar's run ended: its ARCost, or None (stopped, failed)

    def __init__(self, engine: Engine, parent=None):
        super().__init__(parent)
        self.engine = engine
        self.holder: str | None = None
        self._stop: Callable[[], None] | None = None
        self.shown: RunState | None = None          # what the views show
        self.live: RunState | None = None           # the chat's run, while it goes
        self.shown_before: RunState | None = None   # what the views showed before it
        self.served: tuple[object, RunState] | None = None   # (serve Job, its run) the views follow
        self.saves: list[Job] = []                  # recordings and exports being written
        # recordings being written: the file, and the tag `recorded` hands back once written
        self.writing: dict[Job, tuple[Path, object]] = {}
        self._ar_costs: dict[tuple, ARCost] = {}     # by _cost_key: the last mode-ar run's
        self._measuring: RunState | None = None      # the run measure_ar started, while it goes
        engine.run_finished.connect(self._note_ar_cost)
        engine.run_failed.connect(self._measure_failed)

    # -- the right to run ---------------------------------------------------------------------

    @property
    def busy(self) -> bool:
        return self.holder is not None

    def refusal(self, holder: str) -> str:
        """Why `holder` may not run now ("" when it may): another holds the model."""
        if self.holder is not None and self.holder != holder:
            return f"{HOLDERS[self.holder]} is running: wait for it to end or stop it (Esc)"
        if self.holder is None and self.engine.busy:
            return "Another run is going on the engine: wait for it to end or stop it (Esc)"
        return ""

    def acquire(self, holder: str, stop: Callable[[], None]) -> bool:
        """Take the model for `holder` (True), or False while another holds it. `stop` is how
        Cancel ends what `holder` runs."""
        if holder not in HOLDERS:
            raise ValueError(f"unknown holder {holder!r}")
        if self.refusal(holder):
            return False
        self._stop = stop
        if self.holder != holder:
            self.holder = holder
            self.holder_changed.emit(holder)
        return True

    def release(self, holder: str) -> None:
        """`holder` is done with the model; nothing if it does not hold it."""
        if self.holder == holder:
            self.holder, self._stop = None, None
            self.holder_changed.emit(None)

    def start(self, holder: str, run: RunState, prompt=None) -> None:
        """Generate `run` on the engine for `holder`, which must hold the model."""
        if self.holder != holder:
            raise RuntimeError(f"{holder} does not hold the model ({self.holder} does)")
        self.engine.start(run, prompt)

    def stop(self) -> None:
        """Cancel: whoever holds the model stops after its current step."""
        if self._stop is not None:
            self._stop()

    # -- the chat's run -----------------------------------------------------------------------

    def start_live(self, run: RunState, prompt, stop: Callable[[], None]) -> bool:
        """Start the chat's run; False if another holds the model."""
        if not self.acquire("chat", stop):
            return False
        self.live = run
        self.start("chat", run, prompt)
        return True

    def end_live(self, run: RunState) -> bool:
        """`run` ended (finished or failed): True if it was the chat's, whose hold ends."""
        if run is not self.live:
            return False
        self.live = self.shown_before = None
        self.release("chat")
        return True

    # -- what AR costs -------------------------------------------------------------------------

    @staticmethod
    def _cost_key(run: RunState) -> tuple:
        """The same model file at the same thread count: a cost measured there holds."""
        return run.recording.model.get("path"), run.options.get("threads")

    def _note_ar_cost(self, run: RunState) -> None:
        if (cost := ar_cost_of(run)) is not None:
            self._ar_costs[self._cost_key(run)] = cost
        self._measured(run, cost)

    def _measure_failed(self, run: RunState, _message: str) -> None:
        self._measured(run, None)

    def _measured(self, run: RunState, cost: ARCost | None) -> None:
        if run is self._measuring:
            self._measuring = None
            self.release("measure")
            self.ar_measured.emit(cost)

    def measure_ar(self, run: RunState) -> str:
        """Decode AR_MEASURE_TOKENS tokens in mode ar after `run`'s prompt, with its options, on
        the loaded model, which must be `run`'s: `ar_cost(run)` then knows what a token costs.
        "" once started, else why not."""
        model = self.engine.model
        if model is None or str(getattr(model, "path", "")) != run.recording.model.get("path"):
            return "AR is measured on the run's own model: load it first"
        if not run.events or run.prompt_length == 0:
            return "AR is measured after the run's prompt, which this run does not hold"
        if not self.acquire("measure", self.engine.stop):
            return self.refusal("measure")
        options = {**run.options, "mode": "ar", "gen_length": AR_MEASURE_TOKENS, "eos_stop": "none", "chat": False}
        self._measuring = RunState(run.prompt, options, run.recording.model)
        self.start("measure", self._measuring, run.events[0].tokens[:run.prompt_length].tolist())
        return ""

    def ar_cost(self, run: RunState) -> ARCost | None:
        """What a token cost in mode ar on `run`'s model and threads, measured by the last finished
        mode-ar run here; None when none ran."""
        return self._ar_costs.get(self._cost_key(run))

    # -- files being written ------------------------------------------------------------------

    def record(self, run: RunState, tag: object) -> None:
        """Write `run`'s recording off the GUI thread (compressing and syncing take a while);
        `recorded(tag, path)` once it is written, or `not_recorded(why)`."""
        taken = [path for path, _ in self.writing.values()]
        try:
            path = storage.new_run_path(run.prompt, run.recording.created, taken)
        except OSError as e:        # the app's folder cannot be written
            self.not_recorded.emit(str(e))
            return
        job = Job(f"recording {path.name}", lambda progress, cancel: run.recording.save(path))
        self.writing[job] = (path, tag)
        # bound methods, not partials: Qt drops them if the controller goes first
        job.finished.connect(self._recorded)
        job.failed.connect(self._record_failed)
        self.track(job)

    def track(self, job: Job) -> None:
        """Start `job`, a file being written, which closing waits for."""
        self.saves.append(job)
        job.start()

    def _recorded(self, _value=None) -> None:
        path, tag = self.writing.pop(self.sender())
        self.saves_done()
        self.recorded.emit(tag, str(path))

    def _record_failed(self, message: str) -> None:
        self.writing.pop(self.sender())
        self.saves_done()
        self.not_recorded.emit(message)

    def saves_done(self) -> None:
        """Forget the jobs that have ended."""
        self.saves = [j for j in self.saves if j.running]
