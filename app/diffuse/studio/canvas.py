"""The denoising canvas: one cell per generated position, watched step by step.

Masked cells are dark and hatched, with a thin bar showing their current uncertainty; decided
cells carry their token and are coloured by the entropy (or top-1 probability) they had when
committed; cells committed at the shown step get a white ring and flash, fading while the step
is shown; block starts get a vertical bar, and the current block is underlined (runs without
blocks, modes ar and self_spec and WeDLM's window: the step's span; DiffusionGemma: its canvas,
and at the run's end the answer, its argmax draft, decided: RunState.shown). Colours use an
absolute scale or one fitted to the run (its 5th-95th percentiles), as the legend says. Hover a
cell for its token, entropy, probability and the step it was decided. `paint_cells` draws into any
QPainter, so exports reuse it.
"""
from __future__ import annotations

import html
import math
import time
from dataclasses import dataclass
from functools import lru_cache

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import QEvent, QPointF, QRectF, QSize, Qt, QTimer, Signal
from PySide6.QtGui import (QBrush, QColor, QFontMetrics, QImage, QLinearGradient, QPainter,
                           QPen, QPolygonF)
from PySide6.QtWidgets import (QButtonGroup, QHBoxLayout, QLabel, QScrollArea, QSizePolicy,
                               QToolButton, QToolTip, QVBoxLayout, QWidget)

from diffuse.studio import storage, theme
from diffuse.studio.run_state import EDIT_MARK, FIT_PERCENTILES, TAU_MARK, RunState, counted, step_number
from diffuse.studio.view_base import RunView

MODES = ("entropy", "confidence")
FLASH_MS = 450       # cells committed at the shown step flash, fading over this time


class CellLayout:
    """Where each position's cell goes for a given width: rows of equal cells, left to right."""

    def __init__(self, n_cells: int, width: int, cell_w: int, cell_h: int, gap: int = 4,
                 margin: int = 10):
        self.n, self.cell_w, self.cell_h, self.gap, self.margin = n_cells, cell_w, cell_h, gap, margin
        self.cols = max(1, (width - 2 * margin + gap) // (cell_w + gap))
        self.rows = math.ceil(n_cells / self.cols) if n_cells else 0
        self.height = 2 * margin + self.rows * (cell_h + gap)

    def rect(self, i: int) -> QRectF:
        r, c = divmod(i, self.cols)
        return QRectF(self.margin + c * (self.cell_w + self.gap),
                      self.margin + r * (self.cell_h + self.gap), self.cell_w, self.cell_h)

    def index_at(self, x: float, y: float) -> int:
        c = int((x - self.margin) // (self.cell_w + self.gap))
        r = int((y - self.margin) // (self.cell_h + self.gap))
        if c < 0 or c >= self.cols or r < 0:
            return -1
        i = r * self.cols + c
        return i if i < self.n and self.rect(i).contains(x, y) else -1


def display_text(piece: str, special: bool = False) -> str:
    """A token's text as a cell shows it: whitespace made visible, special tokens shortened
    (<|endoftext|> -> endoftext)."""
    if special:
        return piece.strip("<>|") or piece
    shown = piece.replace("\n", "⏎").replace("\t", "⇥").strip()
    return shown if shown else ("␣" if piece else "∅")


BAND_SHARE = 0.7    # of a fitted scale's colours, the share of the committed text's band


@dataclass(frozen=True)
class ColorScale:
    """Values to colours of a mode's colour map, piecewise linear through knots: (lo, hi) for the
    absolute scale; a fitted one spans the same range but gives BAND_SHARE of the colours to the
    band of the committed text (its FIT_PERCENTILES) and the rest to the values either side, so
    that crowded values differ and values outside the band still do (0 nats is not the band's
    low end)."""

    mode: str                        # entropy | confidence
    fitted: bool
    values: tuple[float, ...]        # increasing
    positions: tuple[float, ...]     # each value's place on the colour map, 0..1, increasing
    band: tuple[float, float] | None = None    # fitted: the committed text's band

    @property
    def lo(self) -> float:
        return self.values[0]

    @property
    def hi(self) -> float:
        return self.values[-1]

    def normalise(self, values: np.ndarray) -> np.ndarray:
        """Each value's place on the colour map, 0..1 (NaN stays NaN)."""
        return np.interp(values, self.values, self.positions)

    def colors(self, values: np.ndarray) -> list[QColor | None]:
        """A QColor per value; None where it is NaN."""
        table = theme.lut(theme.ENTROPY_CMAP if self.mode == "entropy" else theme.CONFIDENCE_CMAP)
        t = self.normalise(np.asarray(values, np.float64))
        idx = (np.nan_to_num(t, nan=0.0) * (len(table) - 1)).round().astype(np.int64)
        return [QColor(*table[j]) if ok else None for j, ok in zip(idx.tolist(), np.isfinite(t).tolist())]

    def stops(self, n: int = 65) -> list[tuple[float, QColor]]:
        """The gradient along a linear value axis from lo to hi: (fraction of the axis, colour)."""
        table = theme.lut(theme.ENTROPY_CMAP if self.mode == "entropy" else theme.CONFIDENCE_CMAP)
        t = np.linspace(0.0, 1.0, n)
        where = (np.interp(t, self.positions, self.values) - self.lo) / (self.hi - self.lo)
        return [(float(x), QColor(*table[int(round(u * (len(table) - 1)))])) for x, u in zip(where, t)]

    def colormap(self) -> pg.ColorMap:
        """The same colours as a pyqtgraph map over levels (lo, hi), for images and colour bars."""
        pos, colors = zip(*self.stops())
        return pg.ColorMap(np.array(pos), [c.getRgb()[:3] for c in colors])

    def numbers(self) -> str:
        """The scale in numbers, as legends print it: "0–7.3", fitted "0 · 4.3–5.6 · 7.3"."""
        if self.band is None:
            return f"{self.lo:.2g}–{self.hi:.2g}"
        return f"{self.lo:.2g} · {self.band[0]:.2g}–{self.band[1]:.2g} · {self.hi:.2g}"


def color_scale(runs: RunState | list[RunState], mode: str, fitted: bool = False) -> ColorScale:
    """The colour scale of one run, or one shared by several (compare). Absolute: 0 to 1 for
    probabilities, 0 to the largest entropy (set by the first, most uncertain step, so colours
    stay put while a run goes on). Fitted: the same range, its colours spent mostly on the
    FIT_PERCENTILES of the committed text so far (special tokens left out: end-of-text, near 0
    nats, would fill the band), so that a model whose values crowd into a narrow band still
    shows differences."""
    runs = [runs] if isinstance(runs, RunState) else runs
    lo = 0.0
    hi = 1.0 if mode == "confidence" else max([r.entropy_max for r in runs if r.events] + [1e-3])
    values = np.concatenate([r.fitted_values(mode) for r in runs if r.events] or [np.zeros(0)])
    if not fitted or values.size == 0:
        return ColorScale(mode, fitted, (lo, hi), (0.0, 1.0))
    b_lo, b_hi = (float(np.clip(v, lo, hi)) for v in np.percentile(values, FIT_PERCENTILES))
    b_hi = max(b_hi, min(b_lo + 1e-3, hi))
    tail = (1.0 - BAND_SHARE) / 2
    below, above = b_lo - lo > 1e-6, hi - b_hi > 1e-6      # a tail with no room gets no colours
    start = tail if below else 0.0
    end = 1.0 - tail if above else 1.0
    if not below:
        end = min(1.0, end + tail)
    if not above:
        start = max(0.0, start - tail)
    knots = [(lo, 0.0)] * below + [(b_lo, start), (b_hi, end)] + [(hi, 1.0)] * above
    vals, pos = zip(*knots)
    return ColorScale(mode, fitted, tuple(vals), tuple(pos), (b_lo, b_hi))


def scale_name(fitted: bool) -> str:
    """What the legends say of the colour scale in use."""
    lo, hi = FIT_PERCENTILES
    return f"fitted {lo}–{hi}%" if fitted else "absolute"


RADIUS = 4.0


@lru_cache(maxsize=8)
def _masked_cell(w: int, h: int) -> QImage:
    """A masked cell (dark, hatched), drawn once per size: most cells are masked early on.
    A QImage, not a QPixmap, so exports may paint on a worker thread."""
    pix = QImage(w, h, QImage.Format.Format_ARGB32_Premultiplied)
    pix.fill(Qt.GlobalColor.transparent)
    p = QPainter(pix)
    p.setRenderHint(QPainter.RenderHint.Antialiasing, True)
    p.setPen(Qt.PenStyle.NoPen)
    p.setBrush(theme.MASKED)
    p.drawRoundedRect(QRectF(0, 0, w, h), RADIUS, RADIUS)
    p.setBrush(QBrush(theme.MASK_HATCH, Qt.BrushStyle.BDiagPattern))
    p.drawRoundedRect(QRectF(0, 0, w, h), RADIUS, RADIUS)
    p.end()
    return pix


@lru_cache(maxsize=65536)
def _cell_text(piece: str, special: bool, width: int, point_size: float) -> str:
    """The cell's text elided to `width`; special tokens use a smaller font."""
    size = point_size - 1.5 if special else point_size
    return QFontMetrics(theme.mono_font(size)).elidedText(
        display_text(piece, special), Qt.TextElideMode.ElideRight, width)


def paint_cells(p: QPainter, layout: CellLayout, run: RunState, step: int, mode: str,
                diff: np.ndarray | None = None, hover: int = -1,
                clip: QRectF | None = None, scale: ColorScale | None = None,
                flash: float = 0.0) -> None:
    """Draw the canvas of `run` at `step` with `layout`'s geometry (background not included);
    with `clip`, only the rows that reach into it; colours over `scale` (default: absolute);
    `flash` (0..1) lights the cells committed at `step`. Cells a threshold committed past the
    rule's floor (RunState.by_threshold) carry a corner mark; cells whose token editing replaced
    carry one in theme.EDITED, and a ring of it at the step of the edit."""
    if not run.events:
        return
    event = run.events[step]
    pl = run.prompt_length
    tokens, masked = (a.tolist() for a in run.shown(step))
    later = run.not_started(step).tolist()     # block diffusion: blocks not begun, drawn as outlines
    colors = (scale or color_scale(run, mode)).colors(run.cell_values(step, mode))
    by_tau = (run.by_threshold & (run.decided_step >= 0) & (run.decided_step <= event.step)).tolist()
    fresh = set((np.asarray(event.unmasked) - pl).tolist())
    edited = run.edits_until(step)
    edited_now = set((np.asarray(event.edited) - pl).tolist())
    block_lo, block_hi = event.block_start - pl, event.block_end - pl
    block_len = max(1, block_hi - block_lo)
    # Modes ar and self_spec and WeDLM's window have no blocks: the step's span (its token, its
    # draft, its window) is underlined and its ends marked.
    span = no_blocks(run)
    blocks = span or event.n_blocks > 1      # one block (Dream's default): no block marks at all
    point_size = 8.5 if layout.cell_h >= 26 else 7.0
    font, small = theme.mono_font(point_size), theme.mono_font(point_size - 1.5)
    small.setItalic(True)
    mask_pix = _masked_cell(layout.cell_w, layout.cell_h)
    text_w = layout.cell_w - 6
    ring, diff_pen = QPen(theme.HIGHLIGHT, 2.2), QPen(theme.DIFF, 2.0, Qt.PenStyle.DashLine)
    edit_ring = QPen(theme.EDITED, 2.6)
    glow = QColor(theme.HIGHLIGHT)
    glow.setAlphaF(0.55 * flash)
    p.setRenderHint(QPainter.RenderHint.Antialiasing, True)
    first, last = 0, run.gen_length
    if clip is not None:          # rows are cell_h + gap apart, starting at the margin
        pitch = layout.cell_h + layout.gap
        row_lo = max(0, int((clip.top() - layout.margin) // pitch) - 1)
        row_hi = int((clip.bottom() - layout.margin) // pitch) + 1
        first, last = row_lo * layout.cols, min(run.gen_length, (row_hi + 1) * layout.cols)
    for i in range(first, last):
        r = layout.rect(i)
        color = colors[i]
        if later[i]:
            p.setPen(QPen(theme.GRID, 1.0))
            p.setBrush(Qt.BrushStyle.NoBrush)
            p.drawRoundedRect(r, RADIUS, RADIUS)
        elif masked[i]:
            p.drawImage(r.topLeft(), mask_pix)
            if color is not None:     # pending uncertainty, as a bar along the bottom
                p.fillRect(QRectF(r.left() + 3, r.bottom() - 4, r.width() - 6, 2.5), color)
        else:
            color = color or theme.GRID
            p.setPen(Qt.PenStyle.NoPen)
            p.setBrush(color)
            p.drawRoundedRect(r, RADIUS, RADIUS)
            special = tokens[i] in run.special_ids
            text = _cell_text(run.piece(tokens[i]), special, text_w, point_size)
            ink = theme.text_on(color)
            if special:
                ink.setAlphaF(0.65)
            p.setPen(ink)
            p.setFont(small if special else font)
            p.drawText(r, Qt.AlignmentFlag.AlignCenter, text)
            if by_tau[i]:
                paint_tau_mark(p, r)
            if i in edited:
                paint_edit_mark(p, r)
        if i in fresh or i in edited_now:
            p.setPen(edit_ring if i in edited_now else ring)
            p.setBrush(glow if flash > 0 else Qt.BrushStyle.NoBrush)
            p.drawRoundedRect(r.adjusted(-1.5, -1.5, 1.5, 1.5), RADIUS + 1, RADIUS + 1)
        if diff is not None and i < diff.shape[0] and diff[i]:
            p.setPen(diff_pen)
            p.setBrush(Qt.BrushStyle.NoBrush)
            p.drawRoundedRect(r.adjusted(-2.5, -2.5, 2.5, 2.5), RADIUS + 2, RADIUS + 2)
        if i == hover:
            p.setPen(QPen(theme.ACCENT, 1.5))
            p.setBrush(Qt.BrushStyle.NoBrush)
            p.drawRoundedRect(r.adjusted(-1, -1, 1, 1), RADIUS, RADIUS)
        if blocks and block_lo <= i < block_hi:   # underline the block being denoised
            p.fillRect(QRectF(r.left(), r.bottom() + 1, r.width(), 2), theme.ACCENT)
        # a block starts here (block diffusion: at multiples of the block length from position 0,
        # so the prompt's tail may share one)
        if i > 0 and (i in (block_lo, block_hi) if span else (i - block_lo) % block_len == 0):
            x = r.left() - layout.gap / 2
            p.fillRect(QRectF(x - 1, r.top() - 1, 2, r.height() + 2),
                       theme.ACCENT if i in (block_lo, block_hi) else theme.MUTED)


def paint_tau_mark(p: QPainter, r: QRectF, size: float = 7.0) -> None:
    """The mark of a threshold's commit: a white corner, outlined to read on any colour."""
    corner = QPolygonF([QPointF(r.right() - size, r.top()), QPointF(r.right(), r.top()),
                        QPointF(r.right(), r.top() + size)])
    p.setPen(QPen(theme.BG, 1.0))
    p.setBrush(theme.HIGHLIGHT)
    p.drawPolygon(corner)


def paint_edit_mark(p: QPainter, r: QRectF, size: float = 8.0) -> None:
    """The mark of a token editing replaced: a violet corner at the bottom left, outlined."""
    corner = QPolygonF([QPointF(r.left(), r.bottom() - size), QPointF(r.left(), r.bottom()),
                        QPointF(r.left() + size, r.bottom())])
    p.setPen(QPen(theme.BG, 1.0))
    p.setBrush(theme.EDITED)
    p.drawPolygon(corner)


def render_image(run: RunState, step: int, mode: str, width: int = 960, cell_w: int = 60,
                 cell_h: int = 30, diff: np.ndarray | None = None) -> QImage:
    """The canvas at `step` as an RGB image `width` pixels wide (for exports)."""
    layout = CellLayout(run.gen_length, width, cell_w, cell_h)
    image = QImage(width, max(layout.height, 1), QImage.Format.Format_RGB32)
    image.fill(theme.BG)
    p = QPainter(image)
    paint_cells(p, layout, run, run.clamp(step), mode, diff)
    p.end()
    return image


def no_blocks(run: RunState) -> bool:
    """Whether the run decodes without blocks: modes ar and self_spec (a token, or a draft, at a time
    in text order) and WeDLM's sliding window; its events' "block" is the step's span."""
    return run.causal_mode is not None or run.wedlm_window


def _not_started_text(run: RunState) -> str:
    if run.causal_mode is not None:
        return "not reached yet: the causal pass decodes in text order"
    if run.uniform_state:
        return "a later canvas: not run yet (canvases are denoised one at a time; end of text stops the run)"
    if run.wedlm_window:
        return "past the window: not in a pass yet"
    return "a later block: not started (block diffusion computes one block at a time)"


def header_text(run: RunState, k: int) -> str:
    """The canvas's status line at step k: where the run stands and what the step committed."""
    e, g, pl = run.events[k], run.gen_length, run.prompt_length
    masked, later = int(e.gen_mask.sum()), int(run.not_started(k).sum())
    lo, hi = e.block_start - pl, e.block_end - pl
    if run.causal_mode == "ar":
        where = f"AR decode: one token per pass at position {lo} · {masked} of {g} still masked"
    elif run.causal_mode == "self_spec":
        where = ("the prefill: the prompt's pass chose the first token" if k == 0 else
                 f"iteration {k}: {counted(hi - lo - 1, 'draft')} after the seed at position {lo}")
        where += f" · {masked} of {g} still masked"
    elif run.wedlm_window:
        committed = "" if e.committed is None else f", {len(e.committed)} committed"
        return (f"{run.step_label(k)}, {run.budget_text()} · window at positions {lo}–{hi - 1} · "
                f"{masked - later} masked in it, "
                f"{later} past it · {len(e.unmasked)} filled{committed} · {run.window_rule_text()}")
    elif run.uniform_state:     # "canvas", as the Uniform state tab says
        where = f"canvas {e.block + 1}/{e.n_blocks} · "
        if run.final_draft(k):
            return f"{run.step_label(k)} · {where}the answer: its argmax draft, all {hi - lo} positions decided"
        return (f"{run.step_label(k)} · {where}{len(e.unmasked)} of {hi - lo} accepted (keep their draw), "
                f"{int(e.gen_mask[lo:hi].sum())} re-drawn · {later} positions in later canvases")
    else:
        where = f"block {e.block + 1}/{e.n_blocks} · " + (
            f"{masked - later} masked in this block · {later} positions in later blocks" if later
            else f"{masked} of {g} masked")
    return f"{run.step_label(k)} · {where} · {run.commits_text(k)}"


def tooltip_html(run: RunState, step: int, i: int) -> str:
    event = run.events[step]
    pl = run.prompt_length
    pos = pl + i
    if no_blocks(run):
        lines = [f"<b>position {i}</b> &nbsp;<span style='color:#8a90a2'>(sequence {pos})</span>"]
    else:
        block_len = max(1, event.block_end - event.block_start)
        block = event.block + (pos - event.block_start) // block_len
        # counted from 1, like the header's "block k/n"
        lines = [f"<b>position {i}</b> &nbsp;<span style='color:#8a90a2'>(sequence {pos}, "
                 f"{'canvas' if run.uniform_state else 'block'} {block + 1}/{event.n_blocks})</span>"]
    decided = run.decided_step[i]
    if run.not_started(step)[i]:
        lines.append(f"<i>{_not_started_text(run)}</i>")
        return "<br>".join(lines)
    tokens, mask = run.shown(step)
    if mask[i]:
        lines.append("<i>still masked</i>")
        ent, conf = run.latest_entropy[step, i], run.latest_confidence[step, i]
        what = "latest"
    else:
        tid = int(tokens[i])
        lines.append(f"token <b>{html.escape(repr(run.piece(tid)))}</b> (id {tid})")
        ent, conf = run.commit_entropy[i], run.commit_confidence[i]
        what = "when decided"
        if event.gen_mask[i]:       # re-drawn at the last step: its token is the final argmax draft's
            ent, conf, what = run.latest_entropy[step, i], run.latest_confidence[step, i], "at the last step"
    lines.append(f"entropy: {ent:.3f} nats ({what})" if np.isfinite(ent)
                 else "entropy: not evaluated yet")
    lines.append(f"top-1 probability: {conf:.3f}" if np.isfinite(conf)
                 else "top-1 probability: not evaluated yet")
    if event.gen_mask[i] and not mask[i]:
        lines.append(f"decided at step {step_number(step)}: the final argmax draft is the answer")
    elif decided >= 0 and decided <= event.step:
        lines.append(f"decided at step {step_number(decided)}")
        if run.by_threshold[i]:     # the condition holds "<": escaped, or the tooltip ends at it
            lines.append(f"{TAU_MARK} committed by the threshold ({html.escape(run.rule.condition())}), "
                         f"past what the rule commits anyway")
    elif decided >= 0:
        lines.append(f"will be decided at step {step_number(decided)}")
    else:
        lines.append("not decided")
    for k, old in run.edits_until(step).get(i, []):
        lines.append(f"<span style='color:{theme.EDITED.name()}'>{EDIT_MARK}</span> edited at step "
                     f"{step_number(k)} (was {html.escape(repr(run.piece(old)))})")
    return "<br>".join(lines)


class DenoisingCanvas(RunView, QWidget):
    """The cells of one run at one step. Call `show_step`; it repaints only when asked."""

    hovered = Signal(int)

    def __init__(self, parent=None, cell_w: int = 60, cell_h: int = 30):
        super().__init__(parent)
        self.cell_w, self.cell_h = cell_w, cell_h
        self._shown: int | None = None    # the step index drawn last (None: none of this run yet)
        self.mode = "entropy"
        self.fitted = False
        self.scale = ColorScale("entropy", False, (0.0, 1.0), (0.0, 1.0))   # color_scale of the shown runs
        self.scale_runs: list[RunState] | None = None     # the runs the scale spans (compare: both)
        self.diff: np.ndarray | None = None
        self.hover = -1
        self._layout = CellLayout(0, 100, cell_w, cell_h)
        self._flash_start = 0.0          # when the shown step was first drawn
        self._flash = QTimer(self)       # repaints the committed cells while their flash fades
        self._flash.setInterval(40)
        self._flash.timeout.connect(self._fade)
        self.setMouseTracking(True)
        self.setSizePolicy(QSizePolicy.Policy.Expanding, QSizePolicy.Policy.Minimum)
        self.setAttribute(Qt.WidgetAttribute.WA_OpaquePaintEvent)

    def clear_run(self, run: RunState | None) -> None:
        self.diff, self.hover, self._shown = None, -1, None
        self._relayout()
        self._rescale()

    def draw_step(self, run: RunState, k: int) -> None:
        if run.gen_length != self._layout.n:     # a live run's size comes with its first step
            self._relayout()
        if self._shown is not None and k != self._shown:
            self._flash_start = time.monotonic()
            self._flash.start()
        self._shown = k
        self._rescale()

    def _rescale(self) -> None:
        if self.run is not None and self.run.events:
            self.scale = color_scale(self.scale_runs or self.run, self.mode, self.fitted)
        else:
            self.scale = ColorScale(self.mode, self.fitted, (0.0, 1.0), (0.0, 1.0))
        self.update()

    def flash(self) -> float:
        """How strongly the cells committed at the shown step flash now: 1 fading to 0."""
        return max(0.0, 1.0 - (time.monotonic() - self._flash_start) * 1000.0 / FLASH_MS)

    def _fade(self) -> None:
        run = self.run
        if self.flash() <= 0.0 or run is None or not run.events:
            self._flash.stop()
        if run is not None and run.events:
            for i in np.asarray(run.events[run.clamp(self.step)].unmasked) - run.prompt_length:
                self.update(self._layout.rect(int(i)).adjusted(-3, -3, 3, 3).toAlignedRect())

    def set_mode(self, mode: str) -> None:
        self.mode = mode
        self._rescale()

    def set_fitted(self, fitted: bool) -> None:
        self.fitted = fitted
        self._rescale()

    def share_scale(self, runs: list[RunState] | None) -> None:
        """Colour over one scale spanning `runs` (None: this canvas's run alone)."""
        self.scale_runs = runs
        self._rescale()

    def set_diff(self, diff: np.ndarray | None) -> None:
        self.diff = diff
        self.update()

    def cell_rect(self, i: int) -> QRectF:
        return self._layout.rect(i)

    def _relayout(self) -> None:
        n = self.run.gen_length if self.run is not None else 0
        self._layout = CellLayout(n, max(self.width(), self.cell_w + 20), self.cell_w, self.cell_h)
        self.setMinimumHeight(max(self._layout.height, 2 * self.cell_h))

    def resizeEvent(self, event) -> None:
        super().resizeEvent(event)
        self._relayout()

    def sizeHint(self) -> QSize:
        return QSize(640, max(self._layout.height, 120))

    def paintEvent(self, event) -> None:
        p = QPainter(self)
        p.fillRect(self.rect(), theme.BG)
        run = self.run
        if run is None or not run.events:
            p.setPen(theme.MUTED)
            p.drawText(self.rect(), Qt.AlignmentFlag.AlignCenter | Qt.TextFlag.TextWordWrap,
                       self.empty_text("Generate, or open a recorded run, to watch the denoising here"))
        else:
            paint_cells(p, self._layout, run, run.clamp(self.step), self.mode, self.diff,
                        self.hover, QRectF(event.rect()), self.scale, self.flash())
        p.end()

    def mouseMoveEvent(self, event) -> None:
        i = self._layout.index_at(event.position().x(), event.position().y())
        if i != self.hover:
            self.hover = i
            self.hovered.emit(i)
            self.update()

    def leaveEvent(self, event) -> None:
        self.hover = -1
        self.update()

    def event(self, e) -> bool:
        if e.type() == QEvent.Type.ToolTip:
            run = self.run
            i = self._layout.index_at(e.pos().x(), e.pos().y())
            if run is not None and run.events and i >= 0:
                QToolTip.showText(e.globalPos(), tooltip_html(run, run.clamp(self.step), i), self)
            else:
                QToolTip.hideText()
            return True
        return super().event(e)


def paint_legend(p: QPainter, rect: QRectF, scale: ColorScale, font_size: float = 7.5) -> None:
    """The colour scale as a gradient bar with its numbers under it: its ends and, fitted, the
    band's edges (marked on the bar). The painters of the header legend and of exports."""
    bar = QRectF(rect.left() + 2, rect.top() + 2, rect.width() - 4, 10)
    grad = QLinearGradient(bar.topLeft(), bar.topRight())
    for x, color in scale.stops():
        grad.setColorAt(x, color)
    p.setPen(Qt.PenStyle.NoPen)
    p.setBrush(grad)
    p.drawRoundedRect(bar, 3, 3)
    p.setFont(theme.mono_font(font_size))
    p.setPen(theme.MUTED)
    row = QRectF(bar.left(), bar.bottom() + 1, bar.width(), rect.bottom() - bar.bottom() - 1)
    p.drawText(row, Qt.AlignmentFlag.AlignLeft | Qt.AlignmentFlag.AlignTop, f"{scale.lo:.2g}")
    p.drawText(row, Qt.AlignmentFlag.AlignRight | Qt.AlignmentFlag.AlignTop, f"{scale.hi:.2g}")
    if scale.band is not None:
        xs = [bar.left() + bar.width() * (v - scale.lo) / (scale.hi - scale.lo) for v in scale.band]
        p.setPen(QPen(theme.TEXT, 1.5))
        for x in xs:
            p.drawLine(QPointF(x, bar.top() - 1), QPointF(x, bar.bottom() + 1))
        p.setPen(theme.TEXT)
        p.drawText(row, Qt.AlignmentFlag.AlignHCenter | Qt.AlignmentFlag.AlignTop,
                   f"band {scale.band[0]:.2g}–{scale.band[1]:.2g}")


class ColorLegend(QWidget):
    """The colour scale in the canvas header: gradient, numbers, and which scale it is."""

    WIDTH, LEAST = 210, 120    # it shrinks so that two canvas headers fit side by side in 1024 px

    def __init__(self, parent=None):
        super().__init__(parent)
        self.scale = ColorScale("entropy", False, (0.0, 1.0), (0.0, 1.0))
        self.setFixedHeight(38)
        self.setMinimumWidth(self.LEAST)
        self.setSizePolicy(QSizePolicy.Policy.Preferred, QSizePolicy.Policy.Fixed)

    def sizeHint(self) -> QSize:
        return QSize(self.WIDTH, 38)

    @property
    def mode(self) -> str:
        return self.scale.mode

    def set_scale(self, scale: ColorScale) -> None:
        if scale != self.scale:
            self.scale = scale
            self.setToolTip(f"{self.caption()}: {scale.numbers()}")
            self.update()

    def caption(self, short: bool = False) -> str:
        """What the colours are and which scale; `short` for a narrow legend (the tooltip
        then has the rest)."""
        if self.scale.mode == "entropy":
            what = "entropy" if short else "entropy (nats)"
        else:
            what = "top-1 prob." if short else "top-1 probability"
        return f"{what} · {scale_name(self.scale.fitted)}"

    def paintEvent(self, event) -> None:
        p = QPainter(self)
        p.fillRect(self.rect(), theme.BG)
        paint_legend(p, QRectF(0, 0, self.width(), 25), self.scale)
        p.setPen(theme.MUTED)
        caption, metrics = self.caption(), p.fontMetrics()
        if metrics.horizontalAdvance(caption) > self.width():
            caption = metrics.elidedText(self.caption(short=True), Qt.TextElideMode.ElideRight, self.width())
        p.drawText(QRectF(0, 25, self.width(), 13), Qt.AlignmentFlag.AlignCenter, caption)
        p.end()


class CanvasPanel(RunView, QWidget):
    """Canvas with its header: colour-mode and colour-scale switches, legend and a status line
    that wraps in a narrow window. With `remember`, the mode and scale are kept in the settings."""

    scale_changed = Signal(bool)        # fitted
    mode_changed = Signal(str)

    def __init__(self, parent=None, cell_w: int = 60, cell_h: int = 30, title: str = "",
                 remember: bool = False):
        super().__init__(parent)
        self.remember = remember
        self.canvas = DenoisingCanvas(cell_w=cell_w, cell_h=cell_h)
        self.status = QLabel()
        self.status.setObjectName("Muted")
        self.status.setTextFormat(Qt.TextFormat.PlainText)     # rules' conditions hold "<"
        # Wrapped, not cut: at 1366 pixels the canvas is narrower than a threshold rule's line.
        # Two lines always, so that the canvas does not jump as the text grows and shrinks.
        self.status.setWordWrap(True)
        self.status.setSizePolicy(QSizePolicy.Policy.Ignored, QSizePolicy.Policy.Preferred)
        self.status.setMinimumHeight(2 * self.status.fontMetrics().lineSpacing())
        self.legend = ColorLegend()
        header = QHBoxLayout()
        if title:
            label = QLabel(title)
            label.setObjectName("Title")
            header.addWidget(label)
        header.addStretch(1)
        self.mode_buttons = QButtonGroup(self)
        for k, mode in enumerate(MODES):
            b = QToolButton()
            b.setText(mode.capitalize())
            b.setCheckable(True)
            b.setChecked(k == 0)
            b.setToolTip(f"Colour decided cells by their {mode}")
            self.mode_buttons.addButton(b, k)
            header.addWidget(b)
        self.mode_buttons.idClicked.connect(self._mode_clicked)
        self.fit_button = QToolButton()
        self.fit_button.setText("Fitted")
        self.fit_button.setCheckable(True)
        lo, hi = FIT_PERCENTILES
        self.fit_button.setToolTip(
            f"Fit the colours to this run: from the {lo}th to the {hi}th percentile of its "
            f"text tokens when committed (on), or the absolute scale: entropy from 0 to the "
            f"run's largest, probability 0 to 1 (off)")
        self.fit_button.toggled.connect(self.set_fitted)
        header.addWidget(self.fit_button)
        header.addWidget(self.legend)
        scroll = QScrollArea()
        scroll.setWidgetResizable(True)
        scroll.setWidget(self.canvas)
        scroll.setFrameShape(QScrollArea.Shape.NoFrame)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(6, 6, 6, 6)
        layout.addLayout(header)
        layout.addWidget(self.status)
        layout.addWidget(scroll, 1)
        if remember:        # fitted by default: on small models every absolute colour looks alike
            s = storage.settings()
            mode = s.value("view/colour_mode", MODES[0])
            self.set_mode(mode if mode in MODES else MODES[0])
            self.fit_button.setChecked(s.value("view/colour_fitted", "true") != "false")

    def _mode_clicked(self, k: int) -> None:
        self.set_mode(MODES[k])

    def set_mode(self, mode: str) -> None:
        self.mode_buttons.button(MODES.index(mode)).setChecked(True)
        changed = mode != self.canvas.mode
        self.canvas.set_mode(mode)
        self._remember("view/colour_mode", mode)
        self.legend.set_scale(self.canvas.scale)
        if changed:
            self.mode_changed.emit(mode)

    def set_fitted(self, fitted: bool) -> None:
        self.fit_button.setChecked(fitted)
        if fitted != self.canvas.fitted:
            self.canvas.set_fitted(fitted)
            self._remember("view/colour_fitted", "true" if fitted else "false")
            self.legend.set_scale(self.canvas.scale)
            self.scale_changed.emit(fitted)

    def _remember(self, key: str, value: str) -> None:
        if self.remember:
            storage.settings().setValue(key, value)

    def clear_run(self, run: RunState | None) -> None:
        self.canvas.no_steps = self.no_steps
        self.canvas.set_run(run)
        self.legend.set_scale(self.canvas.scale)
        self.status.setText("")

    def draw_step(self, run: RunState, k: int) -> None:
        self.canvas.show_step(self.step)      # as asked: -1 keeps the canvas on the newest step
        self.legend.set_scale(self.canvas.scale)
        self.status.setText(header_text(run, k))
