"""Benchmarks: a small sweep on the loaded model, drawn live (the performance study on screen),
and where diffusion wins on this machine (`diffuse bench knee`, drawn by knee_view).

One axis at a time (step budget, inter-step cache, block length, batch size) over the current
settings: each point is one generation (a batch of copies of the prompt for the batch axis), run
on a background job with progress and Cancel; tokens/s, ms per step and the answer's agreement
with the reference point's are plotted as each point ends. The reference is the largest step
budget on the step axis (how much answer fewer steps keep: the study's fourth finding), the first
value on the others (what the cache or blocks change; a batch changes nothing). The sweep runs on
its own thread with the shared Model, holding it through the run controller: it is refused while
a chat or compare run goes, and they are refused while it sweeps (two runs at once would time
each other). The knee tab runs `bench knee` on the loaded model the same way (one job at a time
in this window: the sweep and the knee share it), or opens a saved result; its cancel takes
effect between cache depths (one depth is one engine call), so closing the window cancels it
without waiting, and the model stays held until that depth ends. Each tab has its own status line:
what the sweep said stays under the sweep, the knee's runs, failures and files under the knee.
"""
from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import Qt
from PySide6.QtGui import QKeySequence, QShortcut
from PySide6.QtWidgets import (QApplication, QComboBox, QFileDialog, QHBoxLayout, QLabel, QLineEdit,
                               QPushButton, QSpinBox, QTabWidget, QVBoxLayout, QWidget)

from diffuse import DiffuseError, physical_cores
from diffuse.bench.knee import run as run_knee
from diffuse.bench.tables import write_json
from diffuse.generation import random_seed
from diffuse.studio import theme
from diffuse.studio.job_box import JobBox
from diffuse.studio.knee_view import KneeView, read_result
from diffuse.studio.run_controller import RunController
from diffuse.studio.workers import Job

# axis label -> (option swept, default values); the cache axis is off/on, drawn at 0/1
SWEEPS = {
    "Step budget": ("steps", "4,8,16,32"),
    "Inter-step cache": ("cache", "off,on"),
    "Block length": ("block_length", "8,16,32,64"),
    "Batch size": ("batch", "1,2,4,8"),
}
KNEE_WIDTHS = [1, 2, 4, 8, 16, 32]      # rows per pass, as `diffuse bench knee` measures them


def parse_values(option: str, text: str) -> list:
    """The values typed for an axis; ValueError with what is wrong."""
    items = [x.strip() for x in text.split(",") if x.strip()]
    if not items:
        raise ValueError("type one or more values, comma-separated")
    if option == "cache":
        table = {"off": False, "on": True}
        if any(x not in table for x in items):
            raise ValueError("the cache values are off and on")
        return [table[x] for x in items]
    try:
        values = [int(x) for x in items]
    except ValueError:
        raise ValueError(f"{option} takes whole numbers") from None
    if min(values) < 1:
        raise ValueError(f"{option} values must be at least 1")
    return values


def measure_point(model, prompt: str, options: dict, option: str, value, cancel) -> dict:
    """One sweep point: tokens/s over every generated position and the mean ms per step."""
    def on_step(_event) -> bool:
        return not cancel()
    t0 = time.perf_counter()
    if option == "batch":   # every sequence is the same prompt: the first one stands for them
        results = model.generate_batch([prompt] * value, on_step=on_step, **options)
    else:
        results = [model.generate(prompt, on_step=on_step, **{**options, option: value})]
    seconds = time.perf_counter() - t0
    return {"x": float(value), "tokens_per_s": sum(r.gen_length for r in results) / seconds,
            "ms_per_step": float(np.mean(np.concatenate([r.step_ms for r in results]))),
            "steps": results[0].steps, "tokens": results[0].tokens}


def point_name(option: str, x: float) -> str:
    """A sweep point as a person says it: "cache on", "16 steps", "a batch of 4"."""
    if option == "cache":
        return f"cache {'on' if x else 'off'}"
    n = f"{x:g}"
    return {"steps": f"{n} steps", "block_length": f"block length {n}", "batch": f"a batch of {n}"}[option]


def sweep_order(option: str, values: list) -> list:
    """The reference point first: the largest step budget, or the first value typed."""
    return sorted(values, reverse=True) if option == "steps" else list(values)


class BenchWindow(QWidget):
    """Needs the run controller (for the model and the right to run it) and a callable giving
    the current options."""

    def __init__(self, runs: RunController, base_options, parent=None):
        super().__init__(parent, Qt.WindowType.Window)
        self.setWindowTitle("Diffuse Studio · benchmarks")
        self.resize(1000, 600)
        self.runs = runs
        self.base_options = base_options
        self.job: Job | None = None
        self.points: list[dict] = []      # appended by the job's thread, read on progress
        self.option = ""                  # the option the points sweep
        self.seed_note = ""               # the seed every point used, said

        self.axis = QComboBox()
        self.axis.addItems(list(SWEEPS))
        self.axis.currentTextChanged.connect(self._axis_changed)
        self.values = QLineEdit()
        self.prompt = QLineEdit("Why is the sky blue?")
        self.run_button = QPushButton("Run sweep")
        self.run_button.setObjectName("Primary")
        self.run_button.clicked.connect(self.start)
        top = QHBoxLayout()
        top.addWidget(QLabel("Sweep"))
        top.addWidget(self.axis)
        top.addWidget(self.values)
        top.addWidget(QLabel("Prompt"))
        top.addWidget(self.prompt, 1)
        top.addWidget(self.run_button)
        self.job_box = JobBox(self.cancel)
        self.status = QLabel("Pick an axis and run: each point is one generation with the current settings.")
        self.status.setObjectName("Muted")
        self.status.setWordWrap(True)

        self.tps_plot, self.tps_curve, self.tps_empty = self._plot("tokens/s (every generated position)")
        self.ms_plot, self.ms_curve, self.ms_empty = self._plot("ms per step")
        self.agree_plot, self.agree_curve, self.agree_empty = self._plot("agreement with the reference answer")
        plots = QHBoxLayout()
        plots.addWidget(self.tps_plot)
        plots.addWidget(self.ms_plot)
        plots.addWidget(self.agree_plot)
        sweep = QWidget()
        sweep_layout = QVBoxLayout(sweep)
        sweep_layout.addLayout(top)
        sweep_layout.addLayout(plots, 1)
        sweep_layout.addWidget(self.status)

        self.knee = KneeView()
        self.knee_depths = QLineEdit("512,2048")
        self.knee_depths.setToolTip("Cache depths: rows already in the cache under each pass (multiples of 32)")
        self.knee_reps = QSpinBox()
        self.knee_reps.setRange(1, 20)
        self.knee_reps.setValue(3)
        self.knee_reps.setToolTip("Alternated rounds over the row counts; the median is kept")
        self.knee_button = QPushButton("Run bench knee")
        self.knee_button.setObjectName("Primary")
        self.knee_button.clicked.connect(self.start_knee)
        open_button = QPushButton("Open JSON…")
        open_button.setToolTip("Show a result saved by diffuse bench knee --json")
        open_button.clicked.connect(lambda: self.open_knee(self._pick(save=False)))
        self.save_button = QPushButton("Save JSON…")
        self.save_button.setToolTip("Save the result measured here, as diffuse bench knee --json writes it")
        self.save_button.clicked.connect(lambda: self.save_knee(self._pick(save=True)))
        self.save_button.setEnabled(False)
        knee_top = QHBoxLayout()
        knee_top.addWidget(QLabel("Depths"))
        knee_top.addWidget(self.knee_depths)
        knee_top.addWidget(QLabel("Rounds"))
        knee_top.addWidget(self.knee_reps)
        knee_top.addStretch(1)
        knee_top.addWidget(open_button)
        knee_top.addWidget(self.save_button)
        knee_top.addWidget(self.knee_button)
        knee = QWidget()
        knee_layout = QVBoxLayout(knee)
        knee_layout.addLayout(knee_top)
        knee_layout.addWidget(self.knee, 1)
        self.knee_status = QLabel("Run bench knee on the loaded model, or open a result saved by "
                                  "diffuse bench knee --json.")
        self.knee_status.setObjectName("Muted")
        self.knee_status.setWordWrap(True)
        knee_layout.addWidget(self.knee_status)
        self.tabs = QTabWidget()
        self.tabs.addTab(sweep, "Sweep")
        self.tabs.addTab(knee, "Where diffusion wins")
        self.measured: dict | None = None     # the knee result measured here, for Save
        layout = QVBoxLayout(self)
        layout.addWidget(self.tabs, 1)
        layout.addWidget(self.job_box)
        self._axis_changed(self.axis.currentText())
        runs.holder_changed.connect(self._holder_changed)
        self._holder_changed()
        QApplication.instance().aboutToQuit.connect(self.stop)
        # Esc closes the window, as in a dialog (closing cancels a sweep, as the X does)
        QShortcut(QKeySequence(Qt.Key.Key_Escape), self, self.close)

    def _plot(self, ylabel: str):
        plot = pg.PlotWidget()
        plot.setMenuEnabled(False)
        plot.setLabel("left", ylabel)
        curve = plot.plot([], [], pen=pg.mkPen(theme.ACCENT, width=2), symbol="o",
                          symbolBrush=theme.ACCENT, symbolPen=None)
        empty = theme.EmptyState(plot.getPlotItem(), f"{ylabel}\n(no sweep yet)")
        empty.show(True)
        return plot, curve, empty

    def _axis_changed(self, name: str) -> None:
        option, default = SWEEPS[name]
        self.values.setText(default)
        for plot in self._plots():
            plot.getAxis("bottom").setLabel(name)    # the axis itself stays hidden while empty
            plot.getAxis("bottom").setTicks([[(0, "off"), (1, "on")]] if option == "cache" else None)

    def _plots(self):
        return self.tps_plot, self.ms_plot, self.agree_plot

    @property
    def running(self) -> bool:
        return self.job is not None

    def _refusal(self) -> str:
        """Why a sweep cannot start now ("" when it can): another part runs the model, or the model
        runs on a server, whose times would measure the network and another machine."""
        if getattr(self.runs.engine.model, "remote", False):
            return "The model runs on a server: a sweep times this machine's engine, so load a model file"
        return self.runs.refusal("benchmarks")

    def showEvent(self, event) -> None:
        self._holder_changed()      # the model may have changed (a server connected) while it was hidden
        super().showEvent(event)

    def _holder_changed(self, *_) -> None:
        """The Run button is off, saying why, while another part runs the model."""
        refused = self._refusal()
        self.run_button.setEnabled(not self.running and not refused)
        self.run_button.setToolTip(refused or "Run one generation per value with the current settings")
        self.knee_button.setEnabled(not self.running and not refused)
        self.knee_button.setToolTip(refused or "Time passes over 1-32 rows at each depth on the loaded model "
                                               "(diffuse bench knee)")

    def start(self) -> None:
        model = self.runs.engine.model
        if model is None:
            self.status.setText("Load a model first.")
            return
        if self.running:
            return
        if refused := self._refusal():
            self.status.setText(f"{refused}.")
            return
        option = SWEEPS[self.axis.currentText()][0]
        try:
            values = sweep_order(option, parse_values(option, self.values.text()))
        except ValueError as e:
            self.status.setText(f"Values: {e}.")
            return
        self.runs.acquire("benchmarks", self.cancel)
        prompt = self.prompt.text().strip() or "Why is the sky blue?"
        # The chat flag and threads of the settings panel are Model.generate arguments too.
        options = {k: v for k, v in self.base_options().items() if v is not None}
        # One seed for every point: an unset one would be drawn per run, and the answers' agreement
        # would measure the seeds, not the axis.
        drawn = "seed" not in options
        options.setdefault("seed", random_seed())
        self.points, self.option = [], option
        self._redraw()
        self.seed_note = (f"Every point used seed {options['seed']}"
                          f"{' (drawn for this sweep: the Settings leave it unset)' if drawn else ''}.")
        self.status.setText(self.seed_note)

        def sweep(progress, cancel):
            model.generate(prompt, **{**options, "steps": 1})   # warm-up: the first call allocates buffers
            for i, value in enumerate(values):
                if cancel():
                    break
                point = measure_point(model, prompt, options, option, value, cancel)
                ref = self.points[0]["tokens"] if self.points else point["tokens"]
                point["agreement"] = float(np.mean(point["tokens"] == ref))
                self.points.append(point)
                progress(i + 1, len(values), f"{option} = {value}")
            return len(self.points)
        self.job = Job(f"sweep {option}", sweep)
        self.job.progressed.connect(self._progressed)
        self.job.finished.connect(self._finished)
        self.job.failed.connect(self._failed)
        self.job_box.label.setText(f"{option}: starting…")
        self.job_box.progress.setRange(0, len(values))
        self.job_box.progress.setValue(0)
        self.job_box.show()
        self.run_button.setEnabled(False)
        self.job.start()

    def start_knee(self) -> None:
        """`diffuse bench knee` on the loaded model, on a background job."""
        model = self.runs.engine.model
        if model is None:
            self.knee_status.setText("Load a model first.")
            return
        if self.running:
            return
        if refused := self._refusal():
            self.knee_status.setText(f"{refused}.")
            return
        try:
            depths = parse_values("depth", self.knee_depths.text())
        except ValueError as e:
            self.knee_status.setText(f"Depths: {e}.")
            return
        threads = self.base_options().get("threads") or physical_cores()
        reps = self.knee_reps.value()
        self.runs.acquire("benchmarks", self.cancel)

        def measure(progress, cancel):
            return run_knee(model.path, depths, KNEE_WIDTHS, threads, reps, model=model, cancel=cancel,
                            log=lambda line: progress(0, 0, line))
        self.job = Job("bench knee", measure)
        self.job.progressed.connect(lambda _d, _t, what: self.job_box.label.setText(what))
        self.job.finished.connect(self._knee_finished)
        self.job.failed.connect(self._failed)
        self.job_box.label.setText(f"bench knee: {threads} threads, depths {', '.join(map(str, depths))}…")
        self.job_box.progress.setRange(0, 0)       # busy: one depth is one engine call
        self.knee_status.setText(f"Bench knee on {Path(model.path).name}: Cancel stops it after the current depth.")
        self.job_box.show()
        self.run_button.setEnabled(False)
        self.knee_button.setEnabled(False)
        self.job.start()

    def _knee_finished(self, result: dict) -> None:
        cancelled = result["cancelled"]
        measured = result["passes"] or result.get("canvas") or []     # canvas: DiffusionGemma's steps
        if measured:
            self.measured = result
            self.knee.show_result(result, "now")
            self.save_button.setEnabled(True)
        depths = sorted({p["depth"] for p in measured})
        self._ended(f"{'Cancelled' if cancelled else 'Done'}: bench knee measured "
                    f"{'depths ' + ', '.join(map(str, depths)) if depths else 'no depth'}.", self.knee_status)

    def _pick(self, save: bool) -> str:
        folder = str(Path.home())
        if save:
            path, _ = QFileDialog.getSaveFileName(self, "Save the knee", str(Path(folder) / "knee.json"),
                                                  "JSON (*.json)")
        else:
            path, _ = QFileDialog.getOpenFileName(self, "Open a bench knee result", folder, "JSON (*.json)")
        return path

    def open_knee(self, path: str) -> None:
        if not path:
            return
        try:
            result = read_result(Path(path))
        except ValueError as e:
            self.knee_status.setText(f"{e}.")
            return
        self.knee.show_result(result, path)
        self.tabs.setCurrentIndex(1)
        self.knee_status.setText(f"Showing {Path(path).name}: bench knee on {Path(str(result.get('model'))).name}.")

    def save_knee(self, path: str) -> None:
        """The dialog asked before replacing a file; the write is atomic."""
        if not path or self.measured is None:
            return
        try:
            write_json(Path(path), self.measured)
        except (OSError, DiffuseError) as e:
            self.knee_status.setText(f"Not saved: {e}.")
            return
        self.knee_status.setText(f"Saved {path}.")

    def cancel(self) -> None:
        if self.job is not None:
            self.job.cancel()
            self.job_box.label.setText("cancelling after this depth…" if self.job.title == "bench knee"
                                       else "cancelling after this step…")

    def _progressed(self, done: int, total: int, what: str) -> None:
        self.job_box.progress.setValue(done)
        self.job_box.label.setText(f"{what} done ({done} of {total})")
        self._redraw()

    def _redraw(self) -> None:
        points = sorted(self.points, key=lambda p: p["x"])     # measured reference first
        x = [p["x"] for p in points]
        self.tps_curve.setData(x, [p["tokens_per_s"] for p in points])
        self.ms_curve.setData(x, [p["ms_per_step"] for p in points])
        self.agree_curve.setData(x, [p["agreement"] for p in points])
        for plot, empty in zip(self._plots(), (self.tps_empty, self.ms_empty, self.agree_empty)):
            empty.show(not points)
            if points and plot is self.agree_plot:
                plot.setYRange(0, 1.05, padding=0)      # a share: always the whole scale
                plot.enableAutoRange(axis="x")
            elif points:
                plot.enableAutoRange()

    def _ended(self, text: str, status: QLabel) -> None:
        """The job is over: the buttons usable again, `text` in its own tab's status line."""
        self.job = None
        self.job_box.hide()
        self.runs.release("benchmarks")
        self._holder_changed()
        self._redraw()
        status.setText(text)

    def _finished(self, n_points: int) -> None:
        cancelled = self.job is not None and self.job.cancelled
        best = max(self.points, key=lambda p: p["tokens_per_s"], default=None)
        summary = (f"; fastest with {point_name(self.option, best['x'])}: {best['tokens_per_s']:.1f} "
                   f"tok/s, {best['ms_per_step']:.0f} ms/step" if best else "")
        self._ended(f"{'Cancelled' if cancelled else 'Done'}: {n_points} point(s){summary}. "
                    f"{self.seed_note}", self.status)

    def _failed(self, message: str) -> None:
        if self.job is not None and self.job.title == "bench knee":
            self._ended(f"Bench knee failed: {message}", self.knee_status)
        else:
            self._ended(f"The sweep failed: {message}", self.status)

    def stop(self) -> None:
        """Cancel a sweep and wait for its current step: no engine call outlives the window."""
        if self.job is not None:
            self.job.cancel()
            self.job.wait()

    def closeEvent(self, event) -> None:
        if self.job is not None and self.job.title == "bench knee":
            self.job.cancel()       # it ends after its current depth; waiting here would freeze the window
        else:
            self.stop()
        super().closeEvent(event)
