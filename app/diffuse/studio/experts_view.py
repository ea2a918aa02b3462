"""Experts view (mixture-of-experts models): which experts the recomputed positions used.

Top: layers x experts, how many of the step's recomputed positions each expert served (any of its
k slots); beside it, per layer, how many distinct experts the step touched (a block-diffusion step
over a block of 32 rows may touch most of them, and each touched expert's weights are read once).
Bottom: layers x sequence positions, coloured by each position's top-1 expert at that step;
positions served from the cache (and, in the last layer, rows whose logits the step did not need)
stay dark. Reads `StepEvent.experts` (n_layer, n_active, k), which MoE runs carry; a dense layer
(LLaDA2's first) routes nothing: its rows are -1, and it is named as dense, not counted as idle.
"""
from __future__ import annotations

import numpy as np
import pyqtgraph as pg

from diffuse.studio import theme
from diffuse.studio.run_state import RunState, step_number
from diffuse.studio.view_base import RunView

EXPERT_CMAP = "turbo"    # many distinguishable hues: neighbouring expert ids look different
# What the view says instead of plots, in short lines (the view may be narrow)
NO_RUN = "Generate with a mixture-of-experts\nmodel (LLaDA-MoE, LLaDA2) to see\nwhich experts each step used"
DENSE = "This run's model is dense:\nit has no experts to show.\nLLaDA-MoE and LLaDA2 runs\nshow them here."


def usage_counts(experts: np.ndarray, n_expert: int) -> np.ndarray:
    """int (n_layer, n_expert): positions that used each expert, from (n_layer, n_active, k) ids
    (-1 = not computed)."""
    counts = np.zeros((experts.shape[0], n_expert), np.int64)
    for layer, ids in enumerate(experts):
        ids = ids[ids >= 0]
        counts[layer] = np.bincount(ids, minlength=n_expert)[:n_expert]
    return counts


def touched_per_layer(experts: np.ndarray) -> np.ndarray:
    """int (n_layer,): distinct experts the step's rows used in each layer; -1 for a dense layer
    (no row routed)."""
    out = np.full(experts.shape[0], -1, np.int64)
    for layer, ids in enumerate(experts):
        ids = ids[ids >= 0]
        if ids.size:
            out[layer] = np.unique(ids).size
    return out


def touched_text(touched: np.ndarray, n_expert: int) -> str:
    """One line on the experts touched per MoE layer: mean, range, and the dense layers."""
    moe = touched[touched >= 0]
    dense = np.flatnonzero(touched < 0)
    if moe.size == 0:
        return "no layer routed at this step"
    text = (f"experts touched per MoE layer: {moe.mean():.1f} of {n_expert} on average "
            f"({moe.min()}-{moe.max()}, {moe.size} layers)")
    if dense.size:
        text += f" · dense layer{'s' if dense.size > 1 else ''} {', '.join(map(str, dense))}"
    return text


def top1_map(experts: np.ndarray, active: np.ndarray, n_total: int) -> np.ndarray:
    """int (n_layer, n_total): each position's top-1 expert, -1 where the step did not compute it."""
    out = np.full((experts.shape[0], n_total), -1, np.int64)
    out[:, active] = experts[:, :, 0]
    return out


def cell_ticks(n: int, most: int = 16) -> list[list[tuple[float, str]]]:
    """Integer labels at the centres of n image cells, at most `most` of them."""
    stride = max(1, -(-n // most))
    return [[(i + 0.5, str(i)) for i in range(0, n, stride)]]


class ExpertsView(RunView, pg.GraphicsLayoutWidget):
    def __init__(self, parent=None):
        super().__init__(parent)
        self.usage = self.addPlot(row=0, col=0)
        self.usage.invertY(True)
        self.usage.setLabel("left", "layer")
        self.usage.setLabel("bottom", "expert")
        self.usage.setMenuEnabled(False)
        self.usage.setTitle("positions per expert at this step", size="9pt")
        self.usage_image = pg.ImageItem(axisOrder="row-major")     # [layer, expert]
        self.usage_image.setLookupTable(theme.lut("viridis"))
        self.usage.addItem(self.usage_image)

        # Per layer, the distinct experts the step touched (bars; a dense layer has none).
        self.touched = self.addPlot(row=0, col=1)
        self.touched.invertY(True)
        self.touched.setLabel("bottom", "experts touched")
        self.touched.setMenuEnabled(False)
        self.touched.setMaximumWidth(140)
        self.touched.setYLink(self.usage)
        self.touched.hideAxis("left")
        self.touched_bars = pg.BarGraphItem(x0=[], y=[], height=0.8, width=[], brush=theme.ACCENT)
        self.touched.addItem(self.touched_bars)
        self.touched_values: np.ndarray | None = None
        self.dense_labels: list[pg.TextItem] = []     # "dense" on the layers that route nothing

        self.top1 = self.addPlot(row=1, col=0)
        self.top1.invertY(True)
        self.top1.setLabel("left", "layer")
        self.top1.setLabel("bottom", "sequence position (prompt, then generated): top-1 expert")
        self.top1.setMenuEnabled(False)
        self.top1_image = pg.ImageItem(axisOrder="row-major")      # [layer, position]
        self.top1.addItem(self.top1_image)
        self.prompt_line = pg.InfiniteLine(angle=90, pen=pg.mkPen(theme.HIGHLIGHT, width=1.5))
        self.top1.addItem(self.prompt_line)
        self.summary = theme.Caption(justify="left", color=theme.MUTED)
        self.addItem(self.summary, row=2, col=0, colspan=2)
        # Without routing there is nothing to plot: the other plots and the title go too.
        self.empty = theme.EmptyState(self.usage, NO_RUN, also=(self.top1, self.touched, self.usage.titleLabel))
        self.set_run(None)

    def clear_run(self, run: RunState | None) -> None:
        self._shape = None
        self.empty.show(True, self.empty_text(self.empty.idle))
        self.usage_image.clear()
        self.top1_image.clear()
        self.touched_bars.setOpts(x0=[], y=[], width=[])
        self.touched_values = None
        self._label_dense(np.zeros(0, np.int64))
        self.prompt_line.setVisible(False)
        self.summary.setText("")

    def _label_dense(self, touched: np.ndarray) -> None:
        for item in self.dense_labels:
            self.touched.removeItem(item)
        self.dense_labels = []
        for layer in np.flatnonzero(touched < 0):
            item = pg.TextItem("dense", color=theme.MUTED, anchor=(0, 0.5))
            item.setPos(0, layer + 0.5)
            self.touched.addItem(item)
            self.dense_labels.append(item)

    def draw_step(self, run: RunState, k: int) -> None:
        event = run.events[k]
        if event.experts is None:
            self.empty.show(True, DENSE)     # said once, in the middle, not again below
            return
        experts = np.asarray(event.experts)
        # experts per layer: the model's count when the run states it (at least every id seen)
        n_expert = max(int(run.recording.model.get("n_expert") or 0), int(experts.max(initial=-1)) + 1, 1)
        counts = usage_counts(experts, n_expert)
        top = top1_map(experts, np.asarray(event.active), len(event.tokens))
        shape = (experts.shape[0], n_expert, len(event.tokens))
        if shape != self._shape:
            self._shape = shape
            self.empty.show(False)
            self.usage.setRange(xRange=(0, n_expert), yRange=(0, shape[0]), padding=0.01)
            self.touched.setXRange(0, n_expert, padding=0.02)
            self.top1.setRange(xRange=(0, shape[2]), yRange=(0, shape[0]), padding=0.01)
            self.usage.getAxis("bottom").setTicks(cell_ticks(n_expert))
            for plot in (self.usage, self.top1):
                plot.getAxis("left").setTicks(cell_ticks(shape[0]))
            self.prompt_line.setValue(event.prompt_length)
            self.prompt_line.setVisible(True)
            # -1 (not computed) is the background colour, expert e the e-th hue
            table = theme.lut(EXPERT_CMAP, n_expert)
            bg = np.array([[theme.BG.red(), theme.BG.green(), theme.BG.blue()]], np.uint8)
            self.top1_image.setLookupTable(np.concatenate([bg, table[:, :3]]))
        self.usage_image.setImage(counts, levels=(0, max(1, int(counts.max()))), autoLevels=False)
        self.top1_image.setImage(top + 1, levels=(0, n_expert), autoLevels=False)
        touched = touched_per_layer(experts)
        self.touched_values = touched
        self.touched_bars.setOpts(x0=np.zeros(len(touched)), y=np.arange(len(touched)) + 0.5,
                                  width=np.maximum(touched, 0), height=0.8)
        self._label_dense(touched)
        self.summary.setText(
            f"step {step_number(k)}: {len(event.active)} positions recomputed · {touched_text(touched, n_expert)} · "
            f"busiest expert: {int(counts.max())} positions")
