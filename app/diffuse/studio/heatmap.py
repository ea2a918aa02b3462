"""Entropy heatmap: steps x positions, filled row by row as the run goes.

Left: the image (row = step, column = generated position; transparent where a position was not
evaluated at that step; as many rows as steps used) with a colour bar, on the canvas's colour
scale (absolute or fitted to the run, as the bar's label says). Right, on the same step axis:
the smallest and the median entropy over still-masked positions, with the tau line of
entropy-exit (positions left of it are committed at once). Items are made once per run and fed
with setData/setImage.
"""
from __future__ import annotations

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import Qt, Signal

from diffuse.generation import default_options
from diffuse.studio import theme
from diffuse.studio.canvas import scale_name, value_range
from diffuse.studio.run_state import RunState


def tau_of(run: RunState) -> float | None:
    """The entropy-exit threshold of a run, or None for other schedulers."""
    if run.options.get("scheduler") != "entropy_exit":
        return None
    tau = run.options.get("threshold")
    # None: a recording made before runs recorded their "auto" options resolved (Engine.start):
    # its family's default.
    return default_options(run.recording.model["arch"])["threshold"] if tau is None else float(tau)


class EntropyHeatmap(pg.GraphicsLayoutWidget):
    step_clicked = Signal(int)

    def __init__(self, parent=None):
        super().__init__(parent)
        self.run: RunState | None = None
        self.fitted = False
        self.step = -1
        self.plot = self.addPlot(row=0, col=0)
        self.plot.invertY(True)
        self.plot.setLabel("bottom", "generated position")
        self.plot.setLabel("left", "step")
        self.plot.setMenuEnabled(False)
        self.image = pg.ImageItem(axisOrder="row-major")   # [step, position]
        self.plot.addItem(self.image)
        self.bar = pg.ColorBarItem(values=(0, 1), colorMap=theme.ENTROPY_CMAP,
                                   label=self._bar_label(), interactive=False, width=14,
                                   colorMapMenu=False)
        self.bar.setImageItem(self.image, insert_in=self.plot)
        # The colour bar draws its gradient over y in [0, 256]; the tau mark is placed in those units.
        self.bar_tau = pg.InfiniteLine(angle=0, pen=pg.mkPen(theme.HIGHLIGHT, width=2))
        self.bar.addItem(self.bar_tau)
        self.step_line = pg.InfiniteLine(angle=0, pen=pg.mkPen(theme.ACCENT, width=1.5))
        self.plot.addItem(self.step_line)
        self.block_lines: list[pg.InfiniteLine] = []

        self.side = self.addPlot(row=0, col=1)
        self.side.setYLink(self.plot)
        self.side.invertY(True)
        self.side.setLabel("bottom", "masked entropy")
        self.side.hideAxis("left")
        self.side.setMenuEnabled(False)
        self.side.setMaximumWidth(200)
        self.side.setTitle(theme.legend_html([("min", theme.ACCENT), ("median", theme.MUTED)],
                                             glyph="━"), size="8pt")
        self.min_curve = self.side.plot(pen=pg.mkPen(theme.ACCENT, width=2))
        self.median_curve = self.side.plot(pen=pg.mkPen(theme.MUTED, width=1.5))
        self.empty = theme.EmptyState(self.plot, also=(self.bar, self.side))
        self.tau_line = pg.InfiniteLine(angle=90, pen=pg.mkPen(theme.HIGHLIGHT, width=1.5,
                                                               style=Qt.PenStyle.DashLine),
                                        label="τ={value:.2f}",
                                        labelOpts={"position": 0.95, "color": theme.HIGHLIGHT})
        self.side.addItem(self.tau_line)
        self.scene().sigMouseClicked.connect(self._clicked)
        self.set_run(None)

    def _bar_label(self) -> str:
        return f"entropy (nats), {scale_name(self.fitted)}"

    def set_fitted(self, fitted: bool) -> None:
        self.fitted = fitted
        self.bar.setLabel("left", self._bar_label())
        self.show_step(self.step)

    def set_run(self, run: RunState | None) -> None:
        self.run = run
        self._rows = 0
        for line in self.block_lines:
            self.plot.removeItem(line)
        self.block_lines = []
        tau = tau_of(run) if run is not None else None
        self.tau_line.setVisible(tau is not None)
        self.bar_tau.setVisible(tau is not None)
        if tau is not None:
            self.tau_line.setValue(tau)
        if run is None or not run.events:
            self.image.clear()
            self.min_curve.setData([], [])
            self.median_curve.setData([], [])
            self.step_line.setVisible(False)
            self.empty.show(True)
            return
        e = run.events[0]
        block = e.block_end - e.block_start
        for b in range(1, e.n_blocks):
            line = pg.InfiniteLine(pos=b * block, angle=90,
                                   pen=pg.mkPen(theme.MUTED, width=1, style=Qt.PenStyle.DotLine))
            self.plot.addItem(line)
            self.block_lines.append(line)
        self.plot.setLimits(xMin=0, xMax=run.gen_length)
        self.show_step(-1)

    def show_step(self, step: int) -> None:
        self.step = step
        run = self.run
        if run is None or not run.events:
            return
        k = run.clamp(step)
        # The range: the step budget while the run goes (one change per run, not one per step),
        # then the steps used, so that an early stop does not leave the data in a sliver.
        rows = run.n_steps if run.done else max(run.steps_allowed, run.n_steps)
        lo, hi = value_range(run, "entropy", self.fitted)
        self.image.setImage(run.entropy[:run.n_steps], levels=(lo, hi), autoLevels=False)
        self.bar.setLevels((lo, hi))
        tau = tau_of(run)
        if tau is not None:
            self.bar_tau.setValue(256.0 * min(max((tau - lo) / (hi - lo), 0.0), 1.0))
        if rows != self._rows:
            self._rows = rows
            self.empty.show(False)
            self.plot.setRange(xRange=(0, run.gen_length), yRange=(0, rows), padding=0.01)
        steps = np.arange(run.n_steps) + 0.5
        self.min_curve.setData(run.masked_min[:run.n_steps], steps, connect="finite")
        self.median_curve.setData(run.masked_median[:run.n_steps], steps, connect="finite")
        self.side.setXRange(0, max(run.entropy_max, 1e-3), padding=0.02)
        self.step_line.setVisible(True)
        self.step_line.setValue(k + 0.5)

    def _clicked(self, ev) -> None:
        if self.run is None or not self.run.events:
            return
        vb = self.plot.getViewBox()
        if vb.sceneBoundingRect().contains(ev.scenePos()):
            y = vb.mapSceneToView(ev.scenePos()).y()
            if 0 <= y < self.run.n_steps:
                self.step_clicked.emit(int(y))
