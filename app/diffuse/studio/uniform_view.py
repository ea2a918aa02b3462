"""Uniform-state view (DiffusionGemma): why each canvas position froze or was re-drawn at a step.

Top: the canvas's positions, each bar its entropy at this step (of the temperature-scaled logits);
teal bars were accepted (they keep the token drawn for them), grey ones re-drawn at random; the
dashed line is the entropy cut, the largest accepted entropy. Bottom: the rule itself, the same
entropies sorted from the lowest: a position is accepted while the entropies before it sum to no
more than the bound (entropy_budget, the dotted line), so the cut falls where that running sum
crosses the bound. The caption: the argmax draft of the canvas (its output if it stops here) and
the stop rule's mean entropy. Reads StepEvent.draft / redrawn / entropy_cut, which only
uniform-state runs carry.
"""
from __future__ import annotations

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import Qt
from PySide6.QtWidgets import QScrollArea

from diffuse.studio import theme
from diffuse.studio.run_state import RunState

NO_RUN = "Generate with a DiffusionGemma\nmodel to see which positions\neach step accepts and re-draws"
OTHER = "This run's model unmasks masks:\nthe Canvas and Entropy views\nshow its steps. DiffusionGemma\nruns show theirs here."
DRAFT_CHARS = 160     # of the argmax draft in the caption
MIN_HEIGHT = 440      # two plots with room for their ticks, and the caption: in a shorter tab it scrolls


def rule_curve(entropy: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The entropies sorted from the lowest, and for each the sum of those before it (what the
    rule compares with the bound: sum(H) - max(H) over the accepted ones)."""
    order = np.sort(entropy)
    return order, np.concatenate([[0.0], np.cumsum(order)[:-1]])


class UniformView(QScrollArea):
    def __init__(self, parent=None):
        super().__init__(parent)
        self.run: RunState | None = None
        self.plots = pg.GraphicsLayoutWidget()
        self.setWidget(self.plots)
        self.setWidgetResizable(True)
        self.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        self.setFrameShape(QScrollArea.Shape.NoFrame)
        self.canvas = self.plots.addPlot(row=0, col=0)
        self.canvas.setLabel("left", "entropy (nats)")
        self.canvas.setLabel("bottom", "canvas position")
        self.canvas.setMenuEnabled(False)
        # short: a title sets the plots' least width, and a long one pushed them past a narrow tab's edge
        self.canvas.setTitle(theme.legend_html([("accepted: keeps its draw", theme.ACCENT),
                                                ("re-drawn at random", theme.MASK_HATCH)]), size="8pt")
        self.accepted_bars = pg.BarGraphItem(x=[], height=[], width=0.8, brush=theme.ACCENT)
        self.redrawn_bars = pg.BarGraphItem(x=[], height=[], width=0.8, brush=theme.MASK_HATCH)
        self.canvas.addItem(self.redrawn_bars)
        self.canvas.addItem(self.accepted_bars)
        self.cut_line = pg.InfiniteLine(angle=0, pen=pg.mkPen(theme.HIGHLIGHT, width=1.2, style=Qt.PenStyle.DashLine),
                                        label="cut {value:.3f}", labelOpts={"color": theme.TEXT, "position": 0.85})
        self.canvas.addItem(self.cut_line)

        self.rule = self.plots.addPlot(row=1, col=0)
        self.rule.setLabel("left", "nats")
        self.rule.setLabel("bottom", "positions by entropy, lowest first")
        self.rule.setMenuEnabled(False)
        # the legend in the title, above the plot: over it, it covered the curves of a short plot
        self.rule.setTitle(theme.legend_html([("entropy", theme.MUTED), ("sum of the lower entropies", theme.ACCENT)],
                                             glyph="━"), size="8pt")
        self.sorted_curve = self.rule.plot([], [], pen=pg.mkPen(theme.MUTED, width=1.5))
        self.before_curve = self.rule.plot([], [], pen=pg.mkPen(theme.ACCENT, width=2))
        self.bound_line = pg.InfiniteLine(angle=0, pen=pg.mkPen(theme.ACTIVE, width=1.2, style=Qt.PenStyle.DotLine),
                                          label="bound {value:.3f}", labelOpts={"color": theme.TEXT, "position": 0.85})
        self.rule.addItem(self.bound_line)
        self.accepted_region = pg.LinearRegionItem(movable=False, brush=pg.mkBrush(90, 209, 200, 40),
                                                   pen=pg.mkPen(None))
        self.rule.addItem(self.accepted_region)
        self.summary = theme.Caption(justify="left", color=theme.MUTED)
        self.plots.addItem(self.summary, row=2, col=0)
        self.empty = theme.EmptyState(self.canvas, NO_RUN, also=(self.rule, self.canvas.titleLabel, self.cut_line))
        self.set_run(None)

    def set_run(self, run: RunState | None) -> None:
        self.run = run
        self._clear(NO_RUN)
        self.show_step(-1)

    def _clear(self, message: str) -> None:
        """Nothing to show: say why, and drop the last uniform-state run's plots (the message is
        drawn over the plot, which would otherwise keep that run's bars under it)."""
        for bars in (self.accepted_bars, self.redrawn_bars):
            bars.setOpts(x=[], height=[])
        for curve in (self.sorted_curve, self.before_curve):
            curve.setData([], [])
        self.summary.setText("")
        self.empty.show(True, message)
        self.plots.setMinimumHeight(0)       # the message alone needs no room

    def show_step(self, step: int) -> None:
        run = self.run
        if run is None or not run.events:
            return
        k = run.clamp(step)
        ev = run.events[k]
        if ev.draft is None:
            self._clear(OTHER)
            return
        self.empty.show(False)
        self.plots.setMinimumHeight(MIN_HEIGHT)
        start, end = ev.block_start, ev.block_end
        entropy = np.asarray(ev.entropy[start:end], np.float64)
        accepted = np.zeros(end - start, bool)
        accepted[np.asarray(ev.unmasked) - start] = True
        x = np.arange(end - start)
        self.accepted_bars.setOpts(x=x[accepted], height=entropy[accepted])
        self.redrawn_bars.setOpts(x=x[~accepted], height=entropy[~accepted])
        self.cut_line.setValue(ev.entropy_cut)
        self.canvas.setRange(xRange=(-1, end - start), yRange=(0, max(1e-3, entropy.max()) * 1.05), padding=0)

        bound = float(run.options.get("entropy_budget") or 0.0)
        order, before = rule_curve(entropy)
        self.sorted_curve.setData(np.arange(len(order)), order)
        self.before_curve.setData(np.arange(len(order)), before)
        self.bound_line.setValue(bound)
        n = int(accepted.sum())
        self.accepted_region.setRegion((-0.5, n - 0.5))
        top = max(bound, float(before[min(n, len(before) - 1)]), float(order.max())) * 1.1
        self.rule.setRange(xRange=(-1, len(order)), yRange=(0, max(top, 1e-3)), padding=0)

        draft = "".join(run.piece(int(t)) for t in ev.draft).replace("\n", "⏎")
        if len(draft) > DRAFT_CHARS:
            draft = draft[:DRAFT_CHARS] + "…"
        self.summary.setText(
            f"{run.step_label(k)} · canvas {ev.block + 1}/{ev.n_blocks}: {n} of {end - start} accepted "
            f"(entropy ≤ {ev.entropy_cut:.3f}; the lower ones sum to {before[n - 1]:.3f} ≤ bound {bound:g}), "
            f"{end - start - n} re-drawn · mean entropy {entropy.mean():.3f} "
            f"(stops below {run.options.get('stop_entropy', '?')} once the draft holds) · draft: {draft}")
