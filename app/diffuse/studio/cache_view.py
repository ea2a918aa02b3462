"""Cache view: which positions went through the network each step, which came from the cache.

Top: steps used x sequence positions (prompt included, its end marked), orange = recomputed
(active), blue = K/V served from the inter-step cache, dark = not run; the legend is the title.
Bottom: the active fraction per step; without the cache every step is at 1. Steps are numbered
from 1 on both, as in every view (step_number).
"""
from __future__ import annotations

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import Qt

from diffuse.studio import theme
from diffuse.studio.run_state import RunState, step_number
from diffuse.studio.view_base import RunView


class CacheView(RunView, pg.GraphicsLayoutWidget):
    def __init__(self, parent=None):
        super().__init__(parent)
        self.plot = self.addPlot(row=0, col=0)
        self.plot.invertY(True)
        self.plot.setLabel("left", "step")
        # Named here, not on the line: a label on it would sit on the data.
        self.plot.setLabel("bottom", "sequence position (the white line ends the prompt)")
        self.plot.setMenuEnabled(False)
        self.plot.setTitle(theme.legend_html([("recomputed", theme.ACTIVE),
                                              ("from cache", theme.CACHED)]), size="9pt")
        self.image = pg.ImageItem(axisOrder="row-major")   # [step, position]
        table = np.array([[theme.BG.red(), theme.BG.green(), theme.BG.blue()],
                          [theme.CACHED.red(), theme.CACHED.green(), theme.CACHED.blue()],
                          [theme.ACTIVE.red(), theme.ACTIVE.green(), theme.ACTIVE.blue()]],
                         np.uint8)
        self.image.setLookupTable(table)
        self.image.setPos(0, step_number(0) - 0.5)       # row k centred on its step number
        self.plot.addItem(self.image)
        self.prompt_line = pg.InfiniteLine(angle=90, pen=pg.mkPen(theme.HIGHLIGHT, width=1.5))
        self.plot.addItem(self.prompt_line)
        self.step_line = pg.InfiniteLine(angle=0, pen=pg.mkPen(theme.ACCENT, width=1.5))
        self.plot.addItem(self.step_line)

        self.fraction = self.addPlot(row=1, col=0)
        self.fraction.setLabel("left", "active fraction")
        self.fraction.setLabel("bottom", "step")
        self.fraction.setYRange(0, 1.05, padding=0)
        self.fraction.setMaximumHeight(170)
        self.fraction.setMenuEnabled(False)
        self.fraction.addItem(pg.InfiniteLine(pos=1.0, angle=0, pen=pg.mkPen(
            theme.MUTED, style=Qt.PenStyle.DashLine), label="no cache",
            labelOpts={"position": 0.97, "color": theme.MUTED, "anchors": [(1, 1), (1, 1)]}))
        self.curve = self.fraction.plot(pen=pg.mkPen(theme.ACTIVE, width=2), symbol="o",
                                        symbolSize=4, symbolBrush=theme.ACTIVE,
                                        symbolPen=None)
        self.fraction_marker = pg.InfiniteLine(angle=90, pen=pg.mkPen(theme.ACCENT, width=1.5))
        self.fraction.addItem(self.fraction_marker)
        self.empty = theme.EmptyState(self.plot, also=(self.fraction,))
        self.summary = theme.Caption(justify="left", color=theme.MUTED)
        self.addItem(self.summary, row=2, col=0)
        self.set_run(None)

    def clear_run(self, run: RunState | None) -> None:
        self._rows = 0
        # A live run has no events yet when it is shown: the first step brings its sizes.
        self.empty.show(True, self.empty_text(self.empty.idle))
        self.image.clear()
        self.curve.setData([], [])
        self.summary.setText("")
        for line in (self.step_line, self.fraction_marker, self.prompt_line):
            line.setVisible(False)

    def draw_step(self, run: RunState, k: int) -> None:
        # The budget while the run goes (one range change, not one per step), then the steps
        # used: an early stop must not leave the data in a sliver.
        rows = run.n_steps if run.done else max(run.steps_allowed, run.n_steps)
        self.image.setImage(run.cache[:rows], levels=(0, 2), autoLevels=False)
        if rows != self._rows:
            self._rows = rows
            self.empty.show(False)
            self.prompt_line.setValue(run.prompt_length)
            self.prompt_line.setVisible(True)
            first = step_number(0)
            self.plot.setRange(xRange=(0, run.cache.shape[1]), yRange=(first - 0.5, first - 0.5 + rows),
                               padding=0.01)
            self.fraction.setXRange(first, step_number(max(rows - 1, 1)), padding=0.02)
        frac = run.active_fraction[:run.n_steps]
        self.curve.setData(step_number(np.arange(run.n_steps)), frac)
        for line in (self.step_line, self.fraction_marker):
            line.setVisible(True)
            line.setValue(step_number(k))
        mean = float(np.nanmean(frac)) if np.isfinite(frac).any() else float("nan")
        cache_on = run.options.get("cache") is not False     # None: the default, on
        self.summary.setText(
            f"step {step_number(k)}: {frac[k]:.0%} of positions recomputed · run average {mean:.0%} · "
            f"cache {'on' if cache_on else 'off'} · prompt {run.prompt_length} positions")
