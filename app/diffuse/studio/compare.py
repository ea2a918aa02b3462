"""Compare mode: one prompt, two settings, side by side.

The two runs go one after the other on the same engine (running them at once would make each
slower and the timing meaningless). Both take the loaded model and the main window's settings,
which the window shows, with the one setting A and B change. When both are done it shows steps,
time and speed-up, and rings the positions where the answers differ, in both canvases and texts.
Results of another model than the loaded one are cleared when the model changes.
"""
from __future__ import annotations

import html

import numpy as np
from PySide6.QtCore import Qt, QTimer
from PySide6.QtWidgets import (QComboBox, QGridLayout, QHBoxLayout, QLabel, QLineEdit,
                               QPushButton, QTextBrowser, QVBoxLayout, QWidget)

from diffuse.studio.canvas import CanvasPanel, display_text
from diffuse.studio.run_state import RunState
from diffuse.studio.workers import Engine

PRESETS = {
    "Inter-step cache: on vs off": ({"cache": True}, {"cache": False}),
    "Scheduler: low_confidence vs entropy_exit": ({"scheduler": "low_confidence"},
                                                  {"scheduler": "entropy_exit"}),
    "Scheduler: low_confidence vs random": ({"scheduler": "low_confidence"},
                                            {"scheduler": "random"}),
    "Temperature: 0 vs 0.8": ({"temperature": 0.0}, {"temperature": 0.8}),
}


def _label(overrides: dict) -> str:
    return ", ".join(f"{k} {'on' if v is True else 'off' if v is False else v}"
                     for k, v in overrides.items())


def shared_text(model: str, options: dict, overrides: tuple[dict, dict]) -> str:
    """The model and the settings both runs take from the main window; the values left to the
    model ("auto") are not listed."""
    varied = {k for over in overrides for k in over}
    shared = ", ".join(f"{k} {'on' if v is True else 'off' if v is False else v}"
                       for k, v in options.items() if v is not None and k not in varied)
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


def summary_text(a: RunState, b: RunState) -> str:
    ra, rb = a.result, b.result
    diff = a.differs_from(b)
    n = int(diff.sum())
    where = (f"the answers differ at {n} of {diff.shape[0]} positions (first at {int(np.argmax(diff))})"
             if n else "the answers are identical")
    speed = ra.total_ms / rb.total_ms if rb.total_ms > 0 else float("nan")
    return (f"A: {ra.steps}/{ra.steps_allowed} steps in {ra.total_ms / 1000:.2f} s · "
            f"B: {rb.steps}/{rb.steps_allowed} steps in {rb.total_ms / 1000:.2f} s · "
            f"B takes {1 / speed:.2f}x the time of A · {where}")


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
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.addWidget(self.title)
        layout.addWidget(self.canvas, 1)
        layout.addWidget(self.stats)
        layout.addWidget(self.text)

    def show_run(self, run: RunState, diff: np.ndarray | None = None) -> None:
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
        grid = QGridLayout()
        grid.addWidget(self.sides[0], 0, 0)
        grid.addWidget(self.sides[1], 0, 1)
        self.summary = QLabel("Pick a comparison and run it; the two runs go one after the other.")
        self.summary.setWordWrap(True)
        layout = QVBoxLayout(self)
        layout.addLayout(top)
        layout.addWidget(self.context)
        layout.addLayout(grid, 1)
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
            side.title.setText(f"{letter} · {_label(over)}")
        self.update_context()

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
