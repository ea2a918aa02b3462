"""Throughput: per-core CPU load, milliseconds per step, tokens per second, steps used.

CPU bars show the load now, sampled by psutil twice a second whether or not a run is going (so
you see what else loads the machine), until a run of this session ends: then its own figure,
read by the engine thread at the run's start and end (a sub-second run falls between the
samples). Per-step time is a stacked bar: network forward pass, then sampling. Tokens per second
come in the two flavours that matter: buffer (every generated position, end-of-text padding
included, the paper's figure) and useful (positions before the end of text). Steps are numbered
from 1, as in every view (step_number).
"""
from __future__ import annotations

import numpy as np
import psutil
import pyqtgraph as pg
from PySide6.QtCore import QRectF, Qt, QTimer
from PySide6.QtGui import QPainter
from PySide6.QtWidgets import QGridLayout, QHBoxLayout, QLabel, QVBoxLayout, QWidget

from diffuse.studio import theme
from diffuse.studio.run_state import RunState, step_number
from diffuse.studio.view_base import RunView


class Meter(QWidget):
    """A thin bar filled to a fraction. (QProgressBar repaints synchronously on every change,
    which costs milliseconds per step under a style sheet; this one waits for the next paint.)"""

    def __init__(self, parent=None):
        super().__init__(parent)
        self.fraction = 0.0
        self.setFixedHeight(10)

    def set_fraction(self, fraction: float) -> None:
        if fraction != self.fraction:
            self.fraction = fraction
            self.update()

    def paintEvent(self, event) -> None:
        p = QPainter(self)
        p.setRenderHint(QPainter.RenderHint.Antialiasing, True)
        p.setPen(Qt.PenStyle.NoPen)
        r = QRectF(self.rect())
        p.setBrush(theme.GRID)
        p.drawRoundedRect(r, 4, 4)
        p.setBrush(theme.ACCENT)
        p.drawRoundedRect(QRectF(r.left(), r.top(), r.width() * min(self.fraction, 1.0),
                                 r.height()), 4, 4)
        p.end()


def _metric(title: str, tip: str) -> tuple[QWidget, QLabel]:
    box = QWidget()
    lay = QVBoxLayout(box)
    lay.setContentsMargins(8, 4, 8, 4)
    value = QLabel("–")
    value.setObjectName("Metric")
    caption = QLabel(title)
    caption.setObjectName("Muted")
    box.setToolTip(tip)
    lay.addWidget(value)
    lay.addWidget(caption)
    return box, value


class ThroughputView(RunView, QWidget):
    def __init__(self, parent=None, sample_ms: int = 500):
        super().__init__(parent)
        n_cpu = psutil.cpu_count() or 1

        self.cpu_plot = pg.PlotWidget()
        self.cpu_plot.setMenuEnabled(False)
        self.cpu_plot.setMouseEnabled(x=False, y=False)
        self.cpu_plot.setYRange(0, 100, padding=0.02)
        self.cpu_plot.setLabel("left", "CPU %")
        self.cpu_plot.setLabel("bottom", "core (now)")
        self.cpu_plot.getAxis("bottom").setTicks([[(i, str(i)) for i in range(n_cpu)]])
        self.cpu_bars = pg.BarGraphItem(x=np.arange(n_cpu), height=np.zeros(n_cpu), width=0.7,
                                        brush=theme.ACCENT, pen=None)
        self.cpu_plot.addItem(self.cpu_bars)
        self.cpu_plot.setMaximumWidth(max(220, 40 * n_cpu + 80))

        self.ms_plot = pg.PlotWidget()
        self.ms_plot.setMenuEnabled(False)
        self.ms_plot.setLabel("left", "ms per step")
        self.ms_plot.setLabel("bottom", "step")
        self.ms_plot.setTitle(theme.legend_html([("forward", theme.CACHED),
                                                 ("sampling + rest", theme.ACTIVE)]), size="8pt")
        self.fwd_bars = pg.BarGraphItem(x=[], height=[], width=0.8, brush=theme.CACHED, pen=None)
        self.smp_bars = pg.BarGraphItem(x=[], height=[], y0=[], width=0.8, brush=theme.ACTIVE,
                                        pen=None)
        self.ms_plot.addItem(self.fwd_bars)
        self.ms_plot.addItem(self.smp_bars)
        self.step_marker = pg.InfiniteLine(angle=90, pen=pg.mkPen(theme.ACCENT, width=1.5))   # as every view's cursor
        self.ms_plot.addItem(self.step_marker)

        metrics = QGridLayout()
        box, self.buffer_tps = _metric("buffer tok/s", "generated positions per second, "
                                       "end-of-text padding included (the paper's figure)")
        metrics.addWidget(box, 0, 0)
        box, self.useful_tps = _metric("useful tok/s", "tokens before the first end of text "
                                       "per second (known when the run ends)")
        metrics.addWidget(box, 0, 1)
        box, self.ms_step = _metric("ms / step", "mean wall time of a denoising step so far")
        metrics.addWidget(box, 0, 2)
        box, self.total_time = _metric("total time", "wall time of the run so far")
        metrics.addWidget(box, 0, 3)
        self.steps_bar = Meter()
        self.steps_label = QLabel()
        self.steps_label.setObjectName("Muted")
        self.memory = QLabel()
        self.memory.setObjectName("Muted")
        self.memory.setWordWrap(True)     # the views column is about 400 px at 1024x700

        plots = QHBoxLayout()
        plots.addWidget(self.cpu_plot)
        plots.addWidget(self.ms_plot, 1)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(6, 6, 6, 6)
        layout.addLayout(metrics)
        steps_row = QHBoxLayout()
        steps_row.addWidget(self.steps_bar, 1)
        steps_row.addWidget(self.steps_label)
        layout.addLayout(steps_row)
        layout.addLayout(plots, 1)
        layout.addWidget(self.memory)

        self._cpu_of: RunState | None = None    # the run whose own CPU figure the bars show
        self._process = psutil.Process()
        psutil.cpu_percent(percpu=True)      # the first call only starts the measurement
        self.cpu_timer = QTimer(self)
        self.cpu_timer.setInterval(sample_ms)
        self.cpu_timer.timeout.connect(self.sample_cpu)
        self.cpu_timer.start()

    def sample_cpu(self) -> None:
        loads = np.array(psutil.cpu_percent(percpu=True), float)
        if self.run is None or self.run.cpu_percent is None:
            self._cpu_of = None
            self._draw_cpu(loads, "now")
        vm = psutil.virtual_memory()
        rss = self._process.memory_info().rss
        self.memory.setText(f"this process {theme.size_text(rss)} · RAM available "
                            f"{theme.size_text(vm.available)} of {theme.size_text(vm.total)} · "
                            f"{len(loads)} cores")

    def _draw_cpu(self, loads: np.ndarray, when: str) -> None:
        """`when` the load was measured, said under the bars (the side axis is too short)."""
        self.cpu_bars.setOpts(height=loads)
        self.cpu_plot.setLabel("bottom", f"core ({when})")

    def _show_run_cpu(self) -> None:
        run = self.run
        if run is not None and run.cpu_percent is not None and self._cpu_of is not run:
            self._cpu_of = run
            self._draw_cpu(run.cpu_percent, "whole run")     # its length: "total time"

    def clear_run(self, run: RunState | None) -> None:
        self.fwd_bars.setOpts(x=[], height=[])
        self.smp_bars.setOpts(x=[], height=[], y0=[])
        for label in (self.buffer_tps, self.useful_tps, self.ms_step, self.total_time):
            label.setText("–")
        self.steps_bar.set_fraction(0.0)
        self.steps_label.setText("")

    def draw_step(self, run: RunState, k: int) -> None:
        n = run.n_steps
        x = step_number(np.arange(n))
        fwd = run.forward_ms[:n]
        rest = np.maximum(run.step_ms[:n] - fwd, 0.0)
        self.fwd_bars.setOpts(x=x, height=fwd)
        self.smp_bars.setOpts(x=x, height=rest, y0=fwd)
        self.step_marker.setValue(step_number(k))
        elapsed_s = run.step_ms[:k + 1].sum() / 1000.0
        res = run.result
        if res is not None and k == n - 1:
            buffer, useful, total_s = (res.buffer_tokens_per_s, res.useful_tokens_per_s,
                                       res.total_ms / 1000.0)
        else:   # live: positions decided so far over the time so far
            decided = int((~run.events[k].gen_mask).sum())
            buffer = decided / elapsed_s if elapsed_s > 0 else 0.0
            useful = float("nan")
            total_s = elapsed_s
        self.buffer_tps.setText(f"{buffer:.1f}")
        self.useful_tps.setText("…" if np.isnan(useful) else f"{useful:.1f}")
        self.ms_step.setText(f"{run.step_ms[:k + 1].mean():.0f}")
        self.total_time.setText(f"{total_s:.2f} s")
        self._show_run_cpu()
        self.steps_bar.set_fraction((k + 1) / max(run.steps_allowed, 1))
        self.steps_label.setText(f"steps used {k + 1} of {run.steps_allowed} allowed")
