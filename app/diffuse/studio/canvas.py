"""The denoising canvas: one cell per generated position, watched step by step.

Masked cells are dark and hatched, with a thin bar showing their current uncertainty; decided
cells carry their token and are coloured by the entropy (or top-1 probability) they had when
committed; cells committed at the shown step get a white ring; block starts get a vertical bar,
and the current block is underlined. Hover a cell for its token, entropy, probability and the
step it was decided. `paint_cells` draws into any QPainter, so exports reuse it.
"""
from __future__ import annotations

import html
import math
from functools import lru_cache

import numpy as np
from PySide6.QtCore import QEvent, QRectF, QSize, Qt, Signal
from PySide6.QtGui import (QBrush, QColor, QFontMetrics, QImage, QLinearGradient, QPainter,
                           QPen)
from PySide6.QtWidgets import (QButtonGroup, QHBoxLayout, QLabel, QScrollArea, QSizePolicy,
                               QToolButton, QToolTip, QVBoxLayout, QWidget)

from diffuse.studio import theme
from diffuse.studio.run_state import RunState

MODES = ("entropy", "confidence")


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


def value_colors(values: np.ndarray, mode: str, vmax: float) -> list[QColor | None]:
    """A QColor per value through the mode's colour map; None where the value is NaN."""
    table = theme.lut(theme.ENTROPY_CMAP if mode == "entropy" else theme.CONFIDENCE_CMAP)
    norm = np.clip(np.nan_to_num(values / vmax, nan=0.0), 0.0, 1.0)
    idx = (norm * (len(table) - 1)).astype(np.int64)
    finite = np.isfinite(values)
    return [QColor(*table[j]) if ok else None for j, ok in zip(idx.tolist(), finite.tolist())]


def value_range(run: RunState, mode: str) -> float:
    """Upper end of the colour scale: 1 for probabilities, the run's largest entropy for entropy
    (set by the first, most uncertain step, so colours stay put while a run goes on)."""
    return 1.0 if mode == "confidence" else max(run.entropy_max, 1e-3)


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
                clip: QRectF | None = None) -> None:
    """Draw the canvas of `run` at `step` with `layout`'s geometry (background not included);
    with `clip`, only the rows that reach into it."""
    if not run.events:
        return
    event = run.events[step]
    pl = run.prompt_length
    masked = event.gen_mask.tolist()
    tokens = event.gen_tokens.tolist()
    colors = value_colors(run.cell_values(step, mode), mode, value_range(run, mode))
    fresh = set((np.asarray(event.unmasked) - pl).tolist())
    block_lo, block_hi = event.block_start - pl, event.block_end - pl
    block_len = max(1, block_hi - block_lo)
    blocks = event.n_blocks > 1      # one block (Dream's default): no block marks at all
    point_size = 8.5 if layout.cell_h >= 26 else 7.0
    font, small = theme.mono_font(point_size), theme.mono_font(point_size - 1.5)
    small.setItalic(True)
    mask_pix = _masked_cell(layout.cell_w, layout.cell_h)
    text_w = layout.cell_w - 6
    ring, diff_pen = QPen(theme.HIGHLIGHT, 2.2), QPen(theme.DIFF, 2.0, Qt.PenStyle.DashLine)
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
        if masked[i]:
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
        if i in fresh:
            p.setPen(ring)
            p.setBrush(Qt.BrushStyle.NoBrush)
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
        if i > 0 and i % block_len == 0:   # a block starts here
            x = r.left() - layout.gap / 2
            p.fillRect(QRectF(x - 1, r.top() - 1, 2, r.height() + 2),
                       theme.ACCENT if i in (block_lo, block_hi) else theme.MUTED)


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


def tooltip_html(run: RunState, step: int, i: int) -> str:
    event = run.events[step]
    pl = run.prompt_length
    pos = pl + i
    block = (i // max(1, event.block_end - event.block_start))
    lines = [f"<b>position {i}</b> &nbsp;<span style='color:#8a90a2'>(sequence {pos}, "
             f"block {block})</span>"]
    decided = run.decided_step[i]
    if event.gen_mask[i]:
        lines.append("<i>still masked</i>")
        ent, conf = run.latest_entropy[step, i], run.latest_confidence[step, i]
        what = "latest"
    else:
        tid = int(event.gen_tokens[i])
        lines.append(f"token <b>{html.escape(repr(run.piece(tid)))}</b> (id {tid})")
        ent, conf = run.commit_entropy[i], run.commit_confidence[i]
        what = "when decided"
    lines.append(f"entropy: {ent:.3f} nats ({what})" if np.isfinite(ent)
                 else "entropy: not evaluated yet")
    lines.append(f"top-1 probability: {conf:.3f}" if np.isfinite(conf)
                 else "top-1 probability: not evaluated yet")
    if decided >= 0 and decided <= event.step:
        lines.append(f"decided at step {decided}")
    elif decided >= 0:
        lines.append(f"will be decided at step {decided}")
    else:
        lines.append("not decided")
    return "<br>".join(lines)


class DenoisingCanvas(QWidget):
    """The cells of one run at one step. Call `show_step`; it repaints only when asked."""

    hovered = Signal(int)

    def __init__(self, parent=None, cell_w: int = 60, cell_h: int = 30):
        super().__init__(parent)
        self.cell_w, self.cell_h = cell_w, cell_h
        self.run: RunState | None = None
        self.step = -1
        self.mode = "entropy"
        self.diff: np.ndarray | None = None
        self.hover = -1
        self._layout = CellLayout(0, 100, cell_w, cell_h)
        self.setMouseTracking(True)
        self.setSizePolicy(QSizePolicy.Policy.Expanding, QSizePolicy.Policy.Minimum)
        self.setAttribute(Qt.WidgetAttribute.WA_OpaquePaintEvent)

    def set_run(self, run: RunState | None) -> None:
        self.run, self.step, self.diff, self.hover = run, -1, None, -1
        self._relayout()
        self.update()

    def show_step(self, step: int) -> None:
        if self.run is not None and self.run.gen_length != self._layout.n:
            self._relayout()
        self.step = step
        self.update()

    def set_mode(self, mode: str) -> None:
        self.mode = mode
        self.update()

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
            p.drawText(self.rect(), Qt.AlignmentFlag.AlignCenter,
                       "Generate, or open a recorded run, to watch the denoising here")
        else:
            paint_cells(p, self._layout, run, run.clamp(self.step), self.mode, self.diff,
                        self.hover, QRectF(event.rect()))
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


class ColorLegend(QWidget):
    """A small horizontal gradient with its range, for the canvas header."""

    def __init__(self, parent=None):
        super().__init__(parent)
        self.mode, self.vmax = "entropy", 1.0
        self.setFixedSize(170, 26)

    def set_scale(self, mode: str, vmax: float) -> None:
        if (mode, vmax) != (self.mode, self.vmax):
            self.mode, self.vmax = mode, vmax
            self.update()

    def paintEvent(self, event) -> None:
        p = QPainter(self)
        p.fillRect(self.rect(), theme.BG)
        table = theme.lut(theme.ENTROPY_CMAP if self.mode == "entropy" else
                          theme.CONFIDENCE_CMAP)
        bar = QRectF(44, 4, self.width() - 88, 10)
        grad = QLinearGradient(bar.topLeft(), bar.topRight())
        for t in np.linspace(0, 1, 9):
            grad.setColorAt(float(t), QColor(*table[int(t * (len(table) - 1))]))
        p.setPen(Qt.PenStyle.NoPen)
        p.setBrush(grad)
        p.drawRoundedRect(bar, 3, 3)
        p.setPen(theme.MUTED)
        p.setFont(theme.mono_font(7.5))
        unit = " nats" if self.mode == "entropy" else ""
        p.drawText(QRectF(0, 0, 42, 18), Qt.AlignmentFlag.AlignRight | Qt.AlignmentFlag.AlignVCenter, "0")
        p.drawText(QRectF(bar.right() + 4, 0, 60, 18),
                   Qt.AlignmentFlag.AlignLeft | Qt.AlignmentFlag.AlignVCenter,
                   f"{self.vmax:.2g}{unit}")
        p.drawText(QRectF(0, 14, self.width(), 12), Qt.AlignmentFlag.AlignCenter,
                   "entropy" if self.mode == "entropy" else "top-1 probability")
        p.end()


class CanvasPanel(QWidget):
    """Canvas with its header: colour-mode switch, legend and a one-line status."""

    def __init__(self, parent=None, cell_w: int = 60, cell_h: int = 30, title: str = ""):
        super().__init__(parent)
        self.canvas = DenoisingCanvas(cell_w=cell_w, cell_h=cell_h)
        self.status = QLabel()
        self.status.setObjectName("Muted")
        self.status.setSizePolicy(QSizePolicy.Policy.Ignored, QSizePolicy.Policy.Preferred)
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

    def _mode_clicked(self, k: int) -> None:
        self.set_mode(MODES[k])

    def set_mode(self, mode: str) -> None:
        self.mode_buttons.button(MODES.index(mode)).setChecked(True)
        self.canvas.set_mode(mode)
        self._update_header()

    def set_run(self, run: RunState | None) -> None:
        self.canvas.set_run(run)
        self._update_header()

    def show_step(self, step: int) -> None:
        self.canvas.show_step(step)
        self._update_header()

    def _update_header(self) -> None:
        run = self.canvas.run
        if run is None or not run.events:
            self.status.setText("")
            return
        self.legend.set_scale(self.canvas.mode, value_range(run, self.canvas.mode))
        e = run.events[run.clamp(self.canvas.step)]
        self.status.setText(
            f"step {e.step + 1}/{e.steps_allowed} · block {e.block + 1}/{e.n_blocks} · "
            f"{int(e.gen_mask.sum())} of {run.gen_length} masked · "
            f"{len(e.unmasked)} decided this step")
