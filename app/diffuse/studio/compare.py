"""Compare mode: one prompt, two settings, side by side.

The two runs go one after the other on the same engine (running them at once would make each
slower and the timing meaningless). Both take the loaded model and the main window's settings
(the seed included), which the window shows, with the one setting A and B change: a threshold
rule's comparison keeps the rule and sets its tau to one that never fires in A, so only tau's
effect differs. Both canvases share one colour scale, mode and fit. When both are done it reports
steps (those a threshold saved), time per step and whether the answers agree, as separate
figures, and outlines the positions where the answers differ, in both canvases and texts.
Results of another model than the loaded one are cleared when the model changes.
"""
from __future__ import annotations

import html

import numpy as np
from PySide6.QtCore import Qt, QTimer
from PySide6.QtWidgets import (QComboBox, QGridLayout, QHBoxLayout, QLabel, QLineEdit,
                               QPushButton, QTextBrowser, QVBoxLayout, QWidget)

from diffuse.studio import theme
from diffuse.studio.canvas import CanvasPanel, display_text
from diffuse.studio.run_state import TAU_MARK, RunState, options_text
from diffuse.studio.workers import Engine

# A: the rule with a tau that never fires (no entropy is below 0; no probability above 1), so
# it commits what its schedule asks, by the same order; B: the same rule at the Settings' tau.
PRESETS = {
    "Inter-step cache: on vs off": ({"cache": True}, {"cache": False}),
    "Entropy exit: τ off vs on": ({"scheduler": "entropy_exit", "threshold": 0.0},
                                  {"scheduler": "entropy_exit"}),
    "Confidence threshold (low_confidence_dynamic): τ off vs on": (
        {"scheduler": "low_confidence_dynamic", "confidence_threshold": 1.0},
        {"scheduler": "low_confidence_dynamic"}),
    "Scheduler: low_confidence vs random": ({"scheduler": "low_confidence"},
                                            {"scheduler": "random"}),
    "Temperature: 0 vs 0.8": ({"temperature": 0.0}, {"temperature": 0.8}),
    # The fast-decoding methods against the decoding they speed up: A is the plain method, B adds one.
    "Fast-dLLM threshold vs the fixed schedule": ({"scheduler": "low_confidence"},
                                                  {"scheduler": "confidence_threshold"}),
    "Fast-dLLM factor rule vs the fixed schedule": ({"scheduler": "low_confidence"},
                                                    {"scheduler": "confidence_factor"}),
    "DualCache vs the paper's cache": ({"cache": True, "cache_policy": "active"},
                                       {"cache": True, "cache_policy": "dual"}),
    "PrefixCache vs no cache": ({"cache": False}, {"cache": True, "cache_policy": "prefix"}),
    "DPad suffix window 8 vs the whole suffix": ({"suffix_window": -1}, {"suffix_window": 8}),
    "Early end-of-text: none vs dInfer's": ({"eos_stop": "none"}, {"eos_stop": "holds_eos"}),
}




def shared_text(model: str, options: dict, overrides: tuple[dict, dict]) -> str:
    """The model and the settings both runs take from the main window; the values left to the
    model ("auto") are not listed."""
    varied = {k for over in overrides for k in over}
    shared = options_text({k: v for k, v in options.items() if k not in varied})
    return (f"Model: {model or 'none loaded'} · both runs use the Settings tab: "
            f"{shared or 'the model defaults'}")


def answer_html(run: RunState, diff: np.ndarray | None) -> str:
    """The final tokens up to end of text, differing positions marked."""
    e = run.events[-1]
    out = []
    for i, (tid, masked) in enumerate(zip(e.gen_tokens.tolist(), e.gen_mask.tolist())):
        if not masked and tid in run.eos_ids:
            break
        text = "░" if masked else run.piece(tid)
        shown = html.escape(text).replace("\n", "<br>")
        if diff is not None and i < diff.shape[0] and diff[i]:
            shown = (f"<span style='background-color:#5a2530; color:#ffd0da' "
                     f"title='position {i}'>{shown or display_text(text)}</span>")
        out.append(shown)
    return "".join(out)


def _per_step_ms(res) -> float:
    return res.total_ms / max(res.steps, 1)


def summary_text(a: RunState, b: RunState) -> str:
    """Steps, time per step and agreement, each on its own line: a run that takes more steps
    to another answer is not "slower" by its total alone."""
    ra, rb = a.result, b.result
    lines = [f"Steps: A {ra.steps}/{ra.steps_allowed} · B {rb.steps}/{rb.steps_allowed}"]
    saved = ra.steps - rb.steps
    if saved:
        more, who = ("B", saved) if saved > 0 else ("A", -saved)
        lines[0] += f" · {more} needed {who} fewer ({who / max(ra.steps, rb.steps):.0%})"
    for letter, run in (("A", a), ("B", b)):
        if run.rule is not None and not np.isnan(run.n_extra[:run.n_steps]).all():
            extra = run.n_extra[:run.n_steps]
            n_steps = int((extra > 0).sum())
            did = (f"τ committed {np.nansum(extra):.0f} positions past the rule's floor, at "
                   f"{n_steps} step{'s' * (n_steps != 1)}" if n_steps else "τ never fired")
            lines.append(f"{letter} ({run.rule.scheduler}, {run.rule.condition()}): {did}")
    ms_a, ms_b = _per_step_ms(ra), _per_step_ms(rb)
    ratio = f" (B {ms_b / ms_a:.2f}x A per step)" if ms_a > 0 else ""
    lines.append(f"Time per step: A {ms_a:.1f} ms · B {ms_b:.1f} ms{ratio} · whole runs: "
                 f"A {ra.total_ms / 1000:.2f} s, B {rb.total_ms / 1000:.2f} s")
    diff = a.differs_from(b)
    n = int(diff.sum())
    lines.append(f"Answers: differ at {n} of {diff.shape[0]} positions (first at {int(np.argmax(diff))}), "
                 f"outlined in both" if n else f"Answers: identical at all {diff.shape[0]} positions")
    return "\n".join(lines)


DIFF_LEGEND = (f"<span style='color:{theme.DIFF.name()}'>┅┅</span> the answers differ at this "
               f"position &nbsp; <span style='color:{theme.HIGHLIGHT.name()}'>{TAU_MARK}</span> "
               f"committed by τ &nbsp; <span style='color:{theme.HIGHLIGHT.name()}'>○</span> "
               f"committed at the shown step")


class _Side(QWidget):
    def __init__(self, letter: str):
        super().__init__()
        self.title = QLabel(letter)
        self.title.setObjectName("Title")
        self.canvas = CanvasPanel(cell_w=44, cell_h=24)
        self.stats = QLabel()
        self.stats.setObjectName("Muted")
        self.text = QTextBrowser()
        self.text.setMaximumHeight(150)
        self.shared: list[RunState] | None = None     # the runs its colour scale spans
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.addWidget(self.title)
        layout.addWidget(self.canvas, 1)
        layout.addWidget(self.stats)
        layout.addWidget(self.text)

    def show_run(self, run: RunState, diff: np.ndarray | None = None) -> None:
        self.canvas.canvas.share_scale(self.shared)
        self.canvas.show_step(-1)
        self.canvas.canvas.set_diff(diff)
        res = run.result
        if res is not None:
            self.stats.setText(
                f"{res.steps}/{res.steps_allowed} steps · {res.total_ms / 1000:.2f} s · "
                f"{res.total_ms / max(res.steps, 1):.0f} ms/step · "
                f"{res.buffer_tokens_per_s:.1f} tok/s · {res.stop_reason}")
        else:
            self.stats.setText(f"step {run.n_steps}…")
        self.text.setHtml(answer_html(run, diff))

    def clear(self) -> None:
        self.shared = None
        self.canvas.canvas.share_scale(None)
        self.canvas.canvas.set_diff(None)
        self.canvas.set_run(None)
        self.stats.clear()
        self.text.clear()


class CompareWindow(QWidget):
    """Needs the shared engine and a callable giving the current generation options."""

    def __init__(self, engine: Engine, base_options, model_info, parent=None):
        super().__init__(parent, Qt.WindowType.Window)
        self.setWindowTitle("Diffuse Studio · compare")
        self.resize(1400, 820)
        self.engine = engine
        self.base_options = base_options
        self.model_info = model_info
        self.runs: list[RunState] = []
        self._queue: list[RunState] = []

        self.prompt = QLineEdit()
        self.prompt.setPlaceholderText("Prompt for both runs")
        self.prompt.returnPressed.connect(self.start)
        self.preset = QComboBox()
        self.preset.addItems(list(PRESETS))
        self.preset.currentIndexChanged.connect(self._update_titles)
        self.run_button = QPushButton("Run both")
        self.run_button.setObjectName("Primary")
        self.run_button.clicked.connect(self.start)
        self.stop_button = QPushButton("Stop")
        self.stop_button.setObjectName("Danger")
        self.stop_button.clicked.connect(self.stop)
        top = QHBoxLayout()
        top.addWidget(self.prompt, 1)
        top.addWidget(self.preset)
        top.addWidget(self.run_button)
        top.addWidget(self.stop_button)
        self.context = QLabel()      # the model and the shared settings
        self.context.setObjectName("Muted")
        self.context.setWordWrap(True)
        self.sides = (_Side("A"), _Side("B"))
        # One colour scale for both: a mode or fit chosen on one side is the other's too
        for one, other in (self.sides, self.sides[::-1]):
            one.canvas.scale_changed.connect(other.canvas.set_fitted)
            one.canvas.mode_changed.connect(other.canvas.set_mode)
        self.diff_legend = QLabel(DIFF_LEGEND)
        self.diff_legend.setObjectName("Muted")
        grid = QGridLayout()
        grid.addWidget(self.sides[0], 0, 0)
        grid.addWidget(self.sides[1], 0, 1)
        self.summary = QLabel("Pick a comparison and run it; the two runs go one after the other.")
        self.summary.setWordWrap(True)
        layout = QVBoxLayout(self)
        layout.addLayout(top)
        layout.addWidget(self.context)
        layout.addLayout(grid, 1)
        layout.addWidget(self.diff_legend)
        layout.addWidget(self.summary)

        self._dirty = False
        self._timer = QTimer(self)
        self._timer.setInterval(33)
        self._timer.timeout.connect(self._refresh)
        self._timer.start()
        engine.run_stepped.connect(self._stepped)
        engine.run_finished.connect(self._finished)
        engine.run_failed.connect(self._failed)
        engine.busy_changed.connect(self._busy_changed)
        self._update_titles()
        self._busy_changed(engine.busy)

    def _overrides(self) -> tuple[dict, dict]:
        return PRESETS[self.preset.currentText()]

    def _update_titles(self) -> None:
        for side, letter, over in zip(self.sides, "AB", self._overrides()):
            side.title.setText(f"{letter} · {options_text(over)}")
        self.update_context()

    def _title_runs(self) -> None:
        """The titles with the tau each run used (B's comes from the Settings or the model)."""
        for side, letter, over, run in zip(self.sides, "AB", self._overrides(), self.runs):
            rule = f" · {run.rule.condition()}" if run.events and run.rule is not None else ""
            side.title.setText(f"{letter} · {options_text(over)}{rule}")

    def update_context(self) -> None:
        """Show the model and shared settings now in force; drop results of another model."""
        model = self.model_info()
        name = model.get("name", "")
        self.context.setText(shared_text(name, self.base_options(), self._overrides()))
        shown = self.runs[0].recording.model if self.runs else model
        if shown.get("path") != model.get("path") and not any(r is self.engine.run
                                                              for r in self.runs):
            self.runs, self._queue = [], []
            for side in self.sides:
                side.clear()
            self.summary.setText(f"The results of {shown.get('name')} were cleared: the model "
                                 f"is now {name or 'unloaded'}.")

    def start(self) -> None:
        text = self.prompt.text().strip()
        if not text or self.engine.busy or self.engine.model is None:
            return
        self.update_context()
        base = dict(self.base_options())
        self.runs = [RunState(text, {**base, **over}, self.model_info(),
                              self.engine.model.tokenizer.decode)
                     for over in self._overrides()]
        for side, run in zip(self.sides, self.runs):
            side.shared = self.runs
            side.canvas.set_run(run)
            side.text.clear()
            side.stats.setText("waiting…")
        self._queue = list(self.runs)
        self.summary.setText("Running A…")
        self.engine.start(self._queue.pop(0))

    def stop(self) -> None:
        self._queue.clear()
        self.engine.stop()

    def _side_of(self, run: RunState):
        for side, mine in zip(self.sides, self.runs):
            if run is mine:
                return side
        return None

    def _stepped(self, run: RunState) -> None:
        if self._side_of(run) is not None:
            self._dirty = True

    def _refresh(self) -> None:
        if not self._dirty:
            return
        self._dirty = False
        for side, run in zip(self.sides, self.runs):
            if run.events:
                side.show_run(run)
        self._title_runs()

    def _finished(self, run: RunState) -> None:
        if self._side_of(run) is None:
            return
        self._refresh()
        if self._queue:
            self.summary.setText("Running B…")
            self.engine.start(self._queue.pop(0))
            return
        a, b = self.runs
        if a.result is not None and b.result is not None and a.events and b.events:
            diff = a.differs_from(b)
            for side, r in zip(self.sides, self.runs):
                side.show_run(r, diff)
            self._title_runs()
            self.summary.setText(summary_text(a, b))
        else:
            self.summary.setText("Stopped before both runs finished.")

    def _failed(self, run: RunState, message: str) -> None:
        if self._side_of(run) is not None:
            self._queue.clear()
            self.summary.setText(f"Run failed: {message}")

    def _busy_changed(self, busy: bool) -> None:
        self.run_button.setEnabled(not busy and self.engine.model is not None)
        self.stop_button.setEnabled(busy and bool(self.runs))

    def keyPressEvent(self, event) -> None:
        if event.key() == Qt.Key.Key_Escape:       # as a dialog closes
            self.close()
        else:
            super().keyPressEvent(event)

    def closeEvent(self, event) -> None:
        if any(r is self.engine.run for r in self.runs):
            self.stop()
        super().closeEvent(event)
