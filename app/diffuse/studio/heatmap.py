"""Entropy heatmap: steps x positions, filled row by row as the run goes, and how each step's
commits compare with the scheduler's threshold.

Left: the image (row = step, column = generated position; transparent where a position was not
evaluated at that step; as many rows as steps used) with a colour bar, on the canvas's colour
scale (absolute or fitted to the run, as the bar's label says). Middle, on the same step axis:
the committed positions' values (entropy, or top-1 probability for the confidence rules) at the
step they were committed, those a threshold added past the rule's floor in white, beside the
most certain and the median still-masked position after the step, and the rule's tau; a budget
rule (entropy_bounded) also plots each step's sum of committed entropies less the largest
against its budget. Right: the commits of each step, split into the rule's floor (the schedule's
count, or its one position) and tau's extras, then the tokens editing replaced (LLaDA2.1), which
the image also marks where they happened. All three share the step axis, numbered from 1 like
every view (step_number), and the step cursor; the caption under them says what the shown step
committed and why. The rule's legends and tau come from the run's options, so a live run explains
its rule from its first step, as its replay does. Items are made once per run and fed with setData.
"""
from __future__ import annotations

import html

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import Qt, Signal

from diffuse.studio import theme
from diffuse.studio.canvas import color_scale, scale_name
from diffuse.studio.run_state import EDIT_MARK, TAU_MARK, RunState, step_number
from diffuse.studio.view_base import RunView

# Widest and narrowest: the side plot keeps readable entropy ticks at 80 px; the counts plot keeps
# room for its axis title ("commits", about 70 px) so the title never runs out of a narrow view.
SIDE_WIDTH, COUNTS_WIDTH = (220, 80), (110, 72)
TITLE_ROW = 30      # pyqtgraph's own title row: the height the legends need on one or two lines


class EntropyHeatmap(RunView, pg.GraphicsLayoutWidget):
    step_clicked = Signal(int)

    def __init__(self, parent=None):
        super().__init__(parent)
        self.fitted = False
        self._scale, self._side_hi, self._counts_hi = None, None, None
        self.plot = self.addPlot(row=0, col=0)
        self.plot.invertY(True)
        self.plot.setLabel("bottom", "generated position")
        self.plot.setLabel("left", "step")
        self.plot.setMenuEnabled(False)
        self.image = pg.ImageItem(axisOrder="row-major")   # [step, position]
        self.image.setPos(0, step_number(0) - 0.5)       # row k centred on its step number
        self.plot.addItem(self.image)
        self.bar = pg.ColorBarItem(values=(0, 1), colorMap=theme.ENTROPY_CMAP,
                                   label=self._bar_label(), interactive=False, width=14,
                                   colorMapMenu=False)
        self.bar.setImageItem(self.image, insert_in=self.plot)
        # The colour bar draws its gradient over y in [0, 256]; the tau mark is placed in those units.
        self.bar_tau = pg.InfiniteLine(angle=0, pen=pg.mkPen(theme.HIGHLIGHT, width=2))
        self.bar.addItem(self.bar_tau)
        self.block_lines: list[pg.InfiniteLine] = []
        self.edit_marks = pg.ScatterPlotItem(size=7, pen=pg.mkPen(theme.EDITED, width=1.5),
                                             brush=None, symbol="x")    # (position, step) of each edit
        self.plot.addItem(self.edit_marks)

        self.side = self._step_plot(col=1, widths=SIDE_WIDTH)
        self.committed = pg.ScatterPlotItem(size=5, pen=None, brush=pg.mkBrush(theme.MUTED))
        self.by_tau = pg.ScatterPlotItem(size=7, pen=pg.mkPen(theme.BG, width=1),
                                         brush=pg.mkBrush(theme.HIGHLIGHT), symbol="t1")
        self.min_curve = self.side.plot(pen=pg.mkPen(theme.ACCENT, width=2))    # most certain masked
        self.median_curve = self.side.plot(pen=pg.mkPen(theme.MUTED, width=1.5))
        self.budget_curve = self.side.plot(pen=pg.mkPen(theme.ACTIVE, width=2))
        for item in (self.committed, self.by_tau):
            self.side.addItem(item)
        self.tau_line = pg.InfiniteLine(angle=90, pen=pg.mkPen(theme.HIGHLIGHT, width=1.5,
                                                               style=Qt.PenStyle.DashLine),
                                        label="τ",
                                        labelOpts={"position": 0.95, "color": theme.HIGHLIGHT})
        self.side.addItem(self.tau_line)

        self.counts = self._step_plot(col=2, widths=COUNTS_WIDTH)
        self.counts.setLabel("bottom", "commits")
        self.floor_bars = pg.BarGraphItem(x0=[], y=[], width=[], height=0.8,
                                          brush=pg.mkBrush(theme.MUTED), pen=None)
        self.tau_bars = pg.BarGraphItem(x0=[], y=[], width=[], height=0.8,
                                        brush=pg.mkBrush(theme.HIGHLIGHT), pen=None)
        self.edit_bars = pg.BarGraphItem(x0=[], y=[], width=[], height=0.8,
                                         brush=pg.mkBrush(theme.EDITED), pen=None)
        self.counts.addItem(self.floor_bars)
        self.counts.addItem(self.tau_bars)
        self.counts.addItem(self.edit_bars)
        for col, stretch in enumerate((4, 2, 1)):      # a narrow view narrows the image least
            self.ci.layout.setColumnStretchFactor(col, stretch)
        # The shown step, across the three plots: the slider's step in the image, its commits
        # against tau, and its split
        self.step_lines = [pg.InfiniteLine(angle=0, pen=pg.mkPen(theme.ACCENT, width=1.5))
                           for _ in range(3)]
        for plot, line in zip((self.plot, self.side, self.counts), self.step_lines):
            plot.addItem(line)
        self.summary = theme.Caption(justify="left", color=theme.MUTED)
        self.addItem(self.summary, row=1, col=0, colspan=3)
        self.empty = theme.EmptyState(self.plot, also=(self.bar, self.side, self.counts, self.plot.titleLabel))
        for plot in (self.side, self.counts):
            plot.vb.sigResized.connect(self._fit_titles)
        self.scene().sigMouseClicked.connect(self._clicked)
        self.set_run(None)

    def _step_plot(self, col: int, widths: tuple[int, int]) -> pg.PlotItem:
        """A narrow plot beside the image, on its step axis."""
        plot = self.addPlot(row=0, col=col)
        plot.setYLink(self.plot)
        plot.invertY(True)
        plot.hideAxis("left")
        plot.setMenuEnabled(False)
        plot.setMaximumWidth(widths[0])
        plot.setMinimumWidth(widths[1])
        # Its legend wraps at the plot's width: with real fonts a one-line legend (147 px for the
        # middle plot's at 8 pt) asked for more than the narrow column, and the plot drew its
        # axis and legend over the next one.
        plot.layout.removeItem(plot.titleLabel)
        plot.scene().removeItem(plot.titleLabel)
        plot.titleLabel = theme.Caption("", size="11pt", parent=plot)
        plot.layout.addItem(plot.titleLabel, 0, 1)
        plot.setTitle(None)
        return plot

    def _fit_titles(self, *_) -> None:
        """The three plots' title rows take the tallest legend's height (wrapped at its plot's
        width), so that their step axes stay aligned."""
        plots = (self.plot, self.side, self.counts)
        for plot in plots[1:]:
            plot.titleLabel.item.setTextWidth(max(plot.vb.width(), 1.0))
        height = max([TITLE_ROW] + [p.titleLabel.item.boundingRect().height() for p in plots
                                    if p.titleLabel.isVisible()])
        for plot in plots:
            if plot.titleLabel.isVisible() and plot.layout.rowMinimumHeight(0) != height:
                plot.titleLabel.setMaximumHeight(height)
                plot.layout.setRowFixedHeight(0, height)

    def _bar_label(self) -> str:
        return f"entropy (nats), {scale_name(self.fitted)}"

    def set_fitted(self, fitted: bool) -> None:
        self.fitted = fitted
        self.bar.setLabel("left", self._bar_label())
        self.show_step(self.step)

    def _titles(self, run: RunState | None) -> None:
        """The image's legend (the step cursor, and tau's line on the colour bar under an entropy
        tau); the middle plot's axis and legend, in its rule's quantity; the counts' legend."""
        rule = run.rule if run is not None else None
        lines = [("shown step", theme.ACCENT)]
        if rule is not None and rule.quantity == "entropy" and not rule.budget:
            lines.insert(0, (f"τ {rule.tau:.3g}", theme.HIGHLIGHT))
        self.plot.setTitle(theme.legend_html(lines, glyph="━"), size="8pt")
        confidence = rule is not None and rule.quantity == "confidence"
        self.side.setLabel("bottom", "top-1 probability" if confidence else "entropy (nats)")
        dots = [("committed", theme.MUTED)] + [(f"by τ {TAU_MARK}", theme.HIGHLIGHT)] * (rule is not None)
        lines = [("masked max" if confidence else "masked min", theme.ACCENT), ("median", theme.MUTED)]
        if rule is not None and rule.budget:
            lines.append(("Σ−max", theme.ACTIVE))
        self.side.setTitle(theme.legend_html(dots, glyph="●") + "<br>" + theme.legend_html(lines, glyph="━"),
                           size="8pt")
        if rule is None:
            counts = [("this step", theme.MUTED)]
        else:
            counts = [("schedule" if rule.floor == "schedule" else "min 1", theme.MUTED),
                      ("τ", theme.HIGHLIGHT)]
        if run is not None and run.events and run.edits:
            counts.append((f"edits {EDIT_MARK}", theme.EDITED))
        self.counts.setTitle(theme.legend_html(counts), size="8pt")
        self._fit_titles()      # setTitle put each title row back to pyqtgraph's height

    def clear_run(self, run: RunState | None) -> None:
        """The rule's legends, axis and tau from the run's options (known before its first step);
        the data and block marks wait for the steps."""
        self._rows = 0
        self._scale, self._side_hi, self._counts_hi = None, None, None   # what the plots show, set on change
        for line in self.block_lines:
            self.plot.removeItem(line)
        self.block_lines = []
        rule = run.rule if run is not None else None
        self._titles(run)
        self.tau_line.setVisible(rule is not None)
        self.bar_tau.setVisible(rule is not None and rule.quantity == "entropy" and not rule.budget)
        if rule is not None:
            text = f"{'budget' if rule.budget else 'τ'}={rule.tau:.2f}"
            self.tau_line.setValue(rule.tau)
            self.tau_line.label.setFormat(text)
            self.tau_line.label.setText(text)    # now: a hidden label does not format itself
        self.image.clear()
        for curve in (self.min_curve, self.median_curve, self.budget_curve):
            curve.setData([], [])
        for item in (self.committed, self.by_tau, self.edit_marks):
            item.setData([], [])
        for bars in (self.floor_bars, self.tau_bars, self.edit_bars):
            bars.setOpts(x0=[], y=[], width=[])
        for line in self.step_lines:
            line.setVisible(False)
        self.summary.setText("")
        self.empty.show(True, self.empty_text(self.empty.idle))

    def _lay_out(self, run: RunState) -> None:
        """What the first step tells: the blocks and the positions."""
        e = run.events[0]
        block = e.block_end - e.block_start
        for b in range(1, e.n_blocks):
            line = pg.InfiniteLine(pos=b * block, angle=90,
                                   pen=pg.mkPen(theme.MUTED, width=1, style=Qt.PenStyle.DotLine))
            self.plot.addItem(line)
            self.block_lines.append(line)
        self.plot.setLimits(xMin=0, xMax=run.gen_length)
        self.empty.show(False)

    def draw_step(self, run: RunState, k: int) -> None:
        # The range: the step budget while the run goes (one change per run, not one per step),
        # then the steps used, so that an early stop does not leave the data in a sliver.
        rows = run.n_steps if run.done else max(run.steps_allowed, run.n_steps)
        scale = color_scale(run, "entropy", self.fitted)
        if scale != self._scale:        # a colour map costs more than the image: only when it changes
            self._scale = scale
            self.bar.setColorMap(scale.colormap())
            self.bar.setLevels((scale.lo, scale.hi))
        self.image.setImage(run.entropy[:run.n_steps], levels=(scale.lo, scale.hi), autoLevels=False)
        rule = run.rule
        if rule is not None and rule.quantity == "entropy" and not rule.budget:     # tau in nats
            self.bar_tau.setValue(256.0 * min(max((rule.tau - scale.lo) / (scale.hi - scale.lo), 0.0), 1.0))
        if rows != self._rows:
            if not self._rows:
                self._lay_out(run)
            self._rows = rows
            first = step_number(0) - 0.5
            self.plot.setRange(xRange=(0, run.gen_length), yRange=(first, first + rows), padding=0.01)
        self._show_commits(run)
        for line in self.step_lines:
            line.setVisible(True)
            line.setValue(step_number(k))
        # escaped: a LabelItem reads HTML, and a condition's "<" would end the text there
        self.summary.setText(html.escape(f"{run.step_label(k)}: {run.commits_text(k)}"))

    def _show_commits(self, run: RunState) -> None:
        n = run.n_steps
        steps = step_number(np.arange(n))
        confidence = run.rule is not None and run.rule.quantity == "confidence"
        if confidence:
            values, best, median = run.commit_confidence, run.masked_max_confidence, run.masked_median_confidence
        else:
            values, best, median = run.commit_entropy, run.masked_min, run.masked_median
        self.min_curve.setData(best[:n], steps, connect="finite")
        self.median_curve.setData(median[:n], steps, connect="finite")
        self.budget_curve.setData(run.budget_used[:n], steps, connect="finite")
        decided = (run.decided_step >= 0) & np.isfinite(values)
        floor = decided & ~run.by_threshold
        self.committed.setData(values[floor], step_number(run.decided_step[floor]))
        tau = decided & run.by_threshold
        self.by_tau.setData(values[tau], step_number(run.decided_step[tau]))
        side_hi = 1.0 if confidence else max(run.entropy_max, 1e-3)
        if side_hi != self._side_hi:    # a range change lays the axes out again
            self._side_hi = side_hi
            self.side.setXRange(0, side_hi, padding=0.02)
        # Commits per step: the rule's floor, then tau's extras after it; a run without a
        # threshold, or a recording without the schedule's count, shows each step's total.
        total = run.n_committed[:n]
        extra = np.nan_to_num(run.n_extra[:n])
        self.floor_bars.setOpts(x0=np.zeros(n), y=steps, width=total - extra)
        self.tau_bars.setOpts(x0=total - extra, y=steps, width=extra)
        edited = run.n_edited[:n]
        self.edit_bars.setOpts(x0=total, y=steps, width=edited)
        hi = max(float((total + edited).max()), 1.0)
        if hi != self._counts_hi:
            self._counts_hi = hi
            self.counts.setXRange(0, hi, padding=0.05)
            whole = max(1, int(np.ceil(hi / 3)))        # commits are counts: whole ticks, three at most
            self.counts.getAxis("bottom").setTickSpacing(whole, whole)
        if len(run.edits) != len(self.edit_marks.data):      # new edits (a run only adds them)
            self._titles(run)
            k, g = (np.array([e[i] for e in run.edits], float) for i in (0, 1))
            self.edit_marks.setData(g + 0.5, step_number(k))

    def _clicked(self, ev) -> None:
        if self.run is None or not self.run.events:
            return
        vb = self.plot.getViewBox()
        if vb.sceneBoundingRect().contains(ev.scenePos()):
            # the row under the click: rows are centred on their step numbers
            k = int(np.floor(vb.mapSceneToView(ev.scenePos()).y() - step_number(0) + 0.5))
            if 0 <= k < self.run.n_steps:
                self.step_clicked.emit(k)
