"""Views of decoding over a causal K/V cache (docs/self_speculation.md): self-speculation's
iterations and WeDLM's sliding window.

Self-speculation: per iteration, the block as drafted (ghost tokens after the seed) over what the
verify pass made of it: the drafts it kept, the first one it rejected and the bonus token (its own
choice there, or after the last draft when it kept them all). Under it, the tokens each iteration
committed against its two passes, and the run's figures so far: tokens per pass (AR: one), passes
saved, and time per token beside AR's measured on this model (RunController.ar_cost), each said
for what it is.

WeDLM: the window a step ran, in text order and in the order the causal pass ran it (filled
tokens first, at their true positions), each position committed (exact causal K/V, written for
good), filled but not committed, or still a mask; under it, the commits per step.

Both read StepEvent's fields for these modes and say so for runs without them. One code path
draws live runs and replays (RunView).
"""
from __future__ import annotations

import html
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import QRectF, QSize, Qt, Signal
from PySide6.QtGui import QColor, QFont, QFontMetrics, QPainter, QPen
from PySide6.QtWidgets import QLabel, QScrollArea, QSizePolicy, QToolTip, QVBoxLayout, QWidget

from diffuse.studio import theme
from diffuse.studio.canvas import display_text
from diffuse.studio.compare_pairs import ms_per_token
from diffuse.studio.run_state import RunState, counted, step_number
from diffuse.studio.view_base import RunView

if TYPE_CHECKING:
    from diffuse.studio.run_controller import ARCost

QWIDGETSIZE_MAX = (1 << 24) - 1     # Qt's "no maximum"

SPEC_IDLE = "Generate in mode self_spec (Settings › Schedule › Decoding mode) to see each draft checked"
SPEC_OTHER = ("This run is not self-speculation (mode {mode}): its steps draft nothing. Choose the "
              "decoding mode self_spec in Settings to see drafts kept and rejected here.")
SPEC_PREFILL = ("Prefill: the prompt's K/V written causally, its last row choosing the first token, the "
                "seed of the first draft. Step on to see the iterations.")
SPEC_UNSENT = ("This self-speculation step carries no draft: the server that ran it did not send it. "
               "The Canvas view shows what each step committed.")
WINDOW_IDLE = "Generate with a WeDLM model to see its window fill and commit"
WINDOW_OTHER = ("This run has no sliding window (WeDLM's diffusion under causal attention): the Canvas "
                "and Cache views show its steps.")
CELL_CHARS = 10       # a token's text in a cell, at most
STRIP_BANDS = 3       # the strip's height follows its bands up to this many, then it scrolls
PLOT_HEIGHT = 150     # the plot's least height, axes included: under it the view scrolls
BONUS = QColor("#f2c94c")    # gold: the bonus token, the verify pass's own choice
REJECTED = QColor("#ff5c7a")


@dataclass(frozen=True)
class Style:
    fill: QColor | None
    border: QColor
    text: QColor
    dashed: bool = False
    italic: bool = False
    strike: bool = False


def _alpha(color: QColor, a: int) -> QColor:
    c = QColor(color)
    c.setAlpha(a)
    return c


STYLES = {
    "seed": Style(theme.GRID, theme.MUTED, theme.TEXT),
    "draft": Style(None, theme.MUTED, theme.MUTED, dashed=True, italic=True),       # a ghost
    "accepted": Style(_alpha(theme.ACCENT, 70), theme.ACCENT, theme.TEXT),
    "rejected": Style(_alpha(REJECTED, 45), REJECTED, QColor("#ffd0da"), dashed=True, italic=True, strike=True),
    "discarded": Style(None, _alpha(theme.MUTED, 110), _alpha(theme.MUTED, 150), dashed=True, italic=True),
    "bonus": Style(_alpha(BONUS, 80), BONUS, theme.TEXT),
    "committed": Style(_alpha(theme.ACCENT, 70), theme.ACCENT, theme.TEXT),
    "filled": Style(_alpha(theme.ACTIVE, 60), theme.ACTIVE, theme.TEXT),
    "mask": Style(theme.MASKED, theme.MASK_HATCH, theme.MUTED),
}
# What the strips' colours mean, in the legends over them
SPEC_LEGEND = [("seed", theme.MUTED), ("draft", theme.MUTED), ("kept", theme.ACCENT),
               ("first rejected", REJECTED), ("bonus", BONUS)]
SPEC_LEGEND_TIP = ("Each iteration drafts a block after the seed (the last token committed), then one causal pass "
                   "verifies it: drafts are kept while each equals the verify pass's choice, the first that does "
                   "not is rejected, and the verify pass's own token there (or after the last draft, when all were "
                   "kept) is the bonus. The answer is mode ar's, token for token.")
WINDOW_LEGEND = [("committed: exact causal K/V", theme.ACCENT), ("filled, not committed", theme.ACTIVE),
                 ("mask", theme.MASK_HATCH)]
WINDOW_LEGEND_TIP = ("WeDLM runs a window of positions under causal attention, filled tokens first at their true "
                     "positions. The filled tokens that lead it commit: their K/V is exact and stays in the cache, "
                     "and the window slides past them. #n: a position's place in the pass; @n: its answer position.")


@dataclass(frozen=True)
class Cell:
    text: str
    style: str           # a STYLES key; "" draws nothing (a column one lane leaves empty)
    mark: str = ""       # a small second line (a place in another order)
    ring: bool = False   # outlined: filled at the shown step
    tip: str = ""


class TokenStrip(QWidget):
    """Lanes of cells that share columns (column i of every lane stacked), wrapped into bands at
    the widget's width; each band starts with the lanes' titles. Its height follows its width
    (in a scroll area, a long block scrolls rather than being cut)."""

    PAD, GAP, LANE_GAP, BAND_GAP = 5, 3, 3, 8

    def __init__(self, parent=None):
        super().__init__(parent)
        self.lanes: list[tuple[str, list[Cell]]] = []
        self.message = ""
        self.cell_font = theme.mono_font(8.5)
        self.small = theme.mono_font(6.5)
        self.title_font = QFont(self.font())
        self.title_font.setPointSizeF(8.0)
        policy = QSizePolicy(QSizePolicy.Policy.Preferred, QSizePolicy.Policy.Preferred)
        policy.setHeightForWidth(True)
        self.setSizePolicy(policy)
        self._rects: list[tuple[QRectF, Cell]] = []

    def set_lanes(self, lanes: list[tuple[str, list[Cell]]], message: str = "") -> None:
        self.lanes, self.message = lanes, message
        self.setMinimumHeight(self.heightForWidth(self.width()))
        self.updateGeometry()
        self.update()

    # -- geometry -----------------------------------------------------------------------------

    def _metrics(self):
        return QFontMetrics(self.cell_font), QFontMetrics(self.small), QFontMetrics(self.title_font)

    def _title_w(self) -> int:
        tm = self._metrics()[2]
        return max((tm.horizontalAdvance(t) for t, _ in self.lanes), default=0) + 8

    def _cell_h(self) -> int:
        fm, sm, _ = self._metrics()
        marks = any(c.mark for _, cells in self.lanes for c in cells)
        return fm.height() + 6 + (sm.height() if marks else 0)

    def _columns(self) -> list[int]:
        fm, sm, _ = self._metrics()
        n = max((len(cells) for _, cells in self.lanes), default=0)
        widths = [fm.horizontalAdvance("MM") + 8] * n
        for _, cells in self.lanes:
            for i, c in enumerate(cells):      # the mark ("@126") too: a cell showed it cut
                widths[i] = max(widths[i], fm.horizontalAdvance(c.text) + 10, sm.horizontalAdvance(c.mark) + 6)
        return widths

    def _bands(self, width: int) -> list[list[int]]:
        """Column indices per band at `width`."""
        room = max(width - 2 * self.PAD - self._title_w(), 40)
        bands, band, used = [], [], 0
        for i, w in enumerate(self._columns()):
            if band and used + w > room:
                bands.append(band)
                band, used = [], 0
            band.append(i)
            used += w + self.GAP
        return bands + ([band] if band else [])

    def hasHeightForWidth(self) -> bool:
        return True

    def heightForWidth(self, width: int, bands: int | None = None) -> int:
        """The height its bands take at `width` (at most `bands` of them)."""
        if not self.lanes:
            return 44
        n = len(self._bands(width))
        n = n if bands is None else min(n, bands)
        band_h = len(self.lanes) * (self._cell_h() + self.LANE_GAP)
        return 2 * self.PAD + n * band_h + (n - 1) * self.BAND_GAP

    def sizeHint(self) -> QSize:
        return QSize(400, self.heightForWidth(400))

    def minimumSizeHint(self) -> QSize:
        return QSize(120, 60)

    def resizeEvent(self, event) -> None:
        super().resizeEvent(event)
        self.setMinimumHeight(self.heightForWidth(self.width()))

    # -- painting -----------------------------------------------------------------------------

    def paintEvent(self, _event) -> None:
        p = QPainter(self)
        p.setRenderHint(QPainter.RenderHint.Antialiasing)
        p.fillRect(self.rect(), theme.PANEL)
        self._rects = []
        if not self.lanes:
            p.setPen(theme.MUTED)
            p.drawText(self.rect().adjusted(12, 6, -12, -6),
                       Qt.AlignmentFlag.AlignCenter | Qt.TextFlag.TextWordWrap, self.message)
            return
        widths, cell_h, title_w = self._columns(), self._cell_h(), self._title_w()
        y = self.PAD
        for band in self._bands(self.width()):
            for title, cells in self.lanes:
                p.setFont(self.title_font)
                p.setPen(theme.MUTED)
                p.drawText(QRectF(self.PAD, y, title_w - 6, cell_h),
                           Qt.AlignmentFlag.AlignRight | Qt.AlignmentFlag.AlignVCenter, title)
                x = self.PAD + title_w
                for i in band:
                    r = QRectF(x, y, widths[i], cell_h)
                    if i < len(cells) and cells[i].style:
                        self._paint_cell(p, r, cells[i])
                        self._rects.append((r, cells[i]))
                    x += widths[i] + self.GAP
                y += cell_h + self.LANE_GAP
            y += self.BAND_GAP

    def _paint_cell(self, p: QPainter, r: QRectF, cell: Cell) -> None:
        s = STYLES[cell.style]
        pen = QPen(theme.HIGHLIGHT if cell.ring else s.border, 2.0 if cell.ring else 1.2)
        if s.dashed:
            pen.setStyle(Qt.PenStyle.DashLine)
        p.setPen(pen)
        p.setBrush(s.fill if s.fill is not None else Qt.BrushStyle.NoBrush)
        p.drawRoundedRect(r.adjusted(1, 1, -1, -1), 3, 3)
        font = QFont(self.cell_font)
        font.setItalic(s.italic)
        font.setStrikeOut(s.strike)
        p.setFont(font)
        p.setPen(s.text)
        fm = self._metrics()[0]
        text_r = QRectF(r.left(), r.top() + 2, r.width(), fm.height() + 2)
        p.drawText(text_r, Qt.AlignmentFlag.AlignCenter, cell.text)
        if cell.mark:
            p.setFont(self.small)
            p.setPen(theme.MUTED)
            p.drawText(QRectF(r.left(), text_r.bottom(), r.width(), r.bottom() - text_r.bottom() - 1),
                       Qt.AlignmentFlag.AlignCenter, cell.mark)

    def event(self, event) -> bool:
        if event.type() == event.Type.ToolTip:       # what the cell under the pointer is
            tip = next((cell.tip for r, cell in self._rects if r.contains(event.pos())), "")
            if tip:
                QToolTip.showText(event.globalPos(), tip, self)
            else:
                QToolTip.hideText()
            return True
        return super().event(event)


def token_text(run: RunState, tid: int) -> str:
    """A token as a cell shows it: whitespace visible, cut to CELL_CHARS."""
    text = display_text(run.piece(int(tid)), int(tid) in run.special_ids)
    return text if len(text) <= CELL_CHARS else text[:CELL_CHARS - 1] + "…"


def quoted(run: RunState, tid: int) -> str:
    return repr(run.piece(int(tid)))


class _StripView(RunView, QWidget):
    """A legend, the strip (scrolling when a block is long), a plot over the steps and a caption;
    in a short tab the whole view scrolls rather than squeezing the plot to a sliver."""

    def __init__(self, legend: list[tuple[str, QColor]], legend_tip: str, caption_tip: str = "", parent=None):
        super().__init__(parent)
        self.legend = QLabel(theme.legend_html(legend))
        self.legend.setWordWrap(True)
        self.legend.setToolTip(legend_tip)
        self.strip = TokenStrip()
        self.scroll = QScrollArea()
        self.scroll.setWidgetResizable(True)
        self.scroll.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        self.scroll.setWidget(self.strip)
        self.scroll.setFrameShape(QScrollArea.Shape.NoFrame)
        self.plot = pg.PlotWidget()
        self.plot.setMenuEnabled(False)
        self.plot.setLabel("bottom", "step")
        self.plot.setMinimumHeight(PLOT_HEIGHT)
        self.plot.setSizePolicy(QSizePolicy.Policy.Expanding, QSizePolicy.Policy.Ignored)   # the room left
        self.plot.setMouseEnabled(False, False)
        self.cursor = pg.InfiniteLine(angle=90, pen=pg.mkPen(theme.ACCENT, width=1.5))
        self.plot.addItem(self.cursor)
        self.caption = QLabel()
        self.caption.setObjectName("Muted")
        self.caption.setWordWrap(True)
        self.caption.setTextFormat(Qt.TextFormat.RichText)
        self.caption.setTextInteractionFlags(Qt.TextInteractionFlag.TextBrowserInteraction)
        self.caption.setToolTip(caption_tip)
        content = QWidget()
        layout = QVBoxLayout(content)
        layout.setContentsMargins(4, 4, 4, 4)
        layout.setSpacing(3)
        layout.addWidget(self.legend)
        layout.addWidget(self.scroll)
        layout.addWidget(self.plot, 1)
        layout.addWidget(self.caption)
        self.page = QScrollArea()
        self.page.setWidgetResizable(True)
        self.page.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        self.page.setFrameShape(QScrollArea.Shape.NoFrame)
        self.page.setWidget(content)
        outer = QVBoxLayout(self)
        outer.setContentsMargins(0, 0, 0, 0)
        outer.addWidget(self.page)

    def _say(self, message: str) -> None:
        """Nothing to draw: the message in the strip's place, no plot."""
        self._set_lanes([], message)
        self._set_caption("")
        self.plot.setVisible(False)
        self.legend.setVisible(False)
        self.scroll.setMaximumHeight(QWIDGETSIZE_MAX)     # the message takes the room
        self.scroll.setMinimumHeight(0)

    def _set_lanes(self, lanes: list[tuple[str, list[Cell]]], message: str = "") -> None:
        self.strip.set_lanes(lanes, message)
        self._fit()

    def _set_caption(self, text: str) -> None:
        self.caption.setText(text)
        self._fit()

    def _drawing(self) -> None:
        self.plot.setVisible(True)
        self.legend.setVisible(True)

    @staticmethod
    def _steps_range(run: RunState) -> tuple[float, float]:
        """The plot's steps: those used once the run is over; while it goes, the next power of two
        (a range that changes now and then, not every step; the budget, one step per token for
        self-speculation, would squeeze the bars into a sliver)."""
        last = run.n_steps if run.done else min(max(run.steps_allowed, run.n_steps), 1 << run.n_steps.bit_length())
        return 0.5, max(step_number(last - 1), 2) + 0.5

    def _fit(self) -> None:
        """The strip as tall as its bands, STRIP_BANDS at most (the rest scrolls): every cell of a
        window shows (at one band, a wrapped window's last cells were out of sight); the wrapped
        legend and caption as tall as their lines (the page read their one-line minimum, and the
        plot ran over the caption); the plot takes the rest."""
        height = self.strip.heightForWidth(self.scroll.viewport().width(), STRIP_BANDS)
        self.scroll.setMinimumHeight(height)
        self.scroll.setMaximumHeight(height)
        # the page's width less its margins and the scrollbar it may show (which does not resize this view)
        width = self.page.width() - self.page.verticalScrollBar().sizeHint().width() - 8
        for label in (self.legend, self.caption):
            label.setMinimumHeight(label.heightForWidth(width) if label.text() else 0)

    def resizeEvent(self, event) -> None:
        super().resizeEvent(event)
        self._fit()


@dataclass
class SpecFigures:
    """Self-speculation's iterations up to a step (the prefill left out: AR runs the same one): the
    tokens they committed and their forward passes."""
    tokens: int
    passes: int

    @property
    def tokens_per_pass(self) -> float:
        return self.tokens / self.passes if self.passes else 0.0


class SpecView(_StripView):
    """Self-speculation, iteration by iteration. `ar_cost(run)` gives AR's measured cost on the
    run's model (RunController.ar_cost), or None when none was measured; then the caption offers to
    measure it (`measure_requested(run)`)."""

    measure_requested = Signal(object)      # the run whose model AR should be measured on

    def __init__(self, ar_cost: Callable[[RunState], ARCost | None] | None = None, parent=None):
        super().__init__(SPEC_LEGEND, SPEC_LEGEND_TIP, CAPTION_TIP, parent)
        self.ar_cost = ar_cost or (lambda run: None)
        self.kept_bars = pg.BarGraphItem(x=[], height=[], width=0.8, brush=_alpha(theme.ACCENT, 200), pen=None)
        self.bonus_bars = pg.BarGraphItem(x=[], y0=[], height=[], width=0.8, brush=_alpha(BONUS, 220), pen=None)
        self.rest_bars = pg.BarGraphItem(x=[], y0=[], height=[], width=0.8, brush=None,
                                         pen=pg.mkPen(theme.MUTED, width=1, style=Qt.PenStyle.DashLine))
        for item in (self.rest_bars, self.kept_bars, self.bonus_bars):
            self.plot.addItem(item)
        # An iteration runs two passes: AR commits two tokens in them, so bars above this line saved passes
        self.even_line = pg.InfiniteLine(pos=2, angle=0, pen=pg.mkPen(BONUS, width=1, style=Qt.PenStyle.DotLine))
        self.plot.addItem(self.even_line)
        self.caption.linkActivated.connect(lambda _link: self.measure_requested.emit(self.run))
        self.plot.setToolTip("Per iteration, the tokens it committed: the drafts kept (teal) and the bonus "
                             "(gold); dashed, the drafts not kept. Dotted: 2 tokens, what AR commits in an "
                             "iteration's 2 passes: a bar above it saved passes.")
        self.set_run(None)

    def clear_run(self, run: RunState | None) -> None:
        self._counted = 0       # events folded into the per-step arrays below
        # per step: an iteration (not the prefill), drafts kept, drafts made, tokens committed, passes
        self._spec, self._kept, self._drafted, self._tokens, self._passes = [], [], [], [], []
        mode = (run.options.get("mode") if run is not None else None) or "diffusion"
        if run is not None and mode != "self_spec" and not self.no_steps:
            self._say(SPEC_OTHER.format(mode=mode))
        else:
            self._say(self.empty_text(SPEC_IDLE))

    def _count(self, run: RunState) -> None:
        """Fold the events not yet counted into per-step arrays (a view draws often; it never walks
        the whole run for it)."""
        for e in run.events[self._counted:]:
            spec = e.spec_draft is not None
            self._spec.append(spec)
            self._kept.append(max(e.spec_accepted, 0) if spec else 0)
            self._drafted.append(len(e.spec_draft) - 1 if spec else 0)
            self._tokens.append(len(e.unmasked))
            self._passes.append((2 if len(e.spec_draft) > 1 else 1) if spec else 0)   # one row: no draft pass
        self._counted = len(run.events)

    def figures(self, run: RunState, k: int) -> SpecFigures:
        self._count(run)
        spec = np.asarray(self._spec[:k + 1], bool)
        return SpecFigures(int(np.asarray(self._tokens[:k + 1])[spec].sum()), int(sum(self._passes[:k + 1])))

    def draw_step(self, run: RunState, k: int) -> None:
        ev = run.events[k]
        self._count(run)
        if ev.spec_draft is None:
            if run.options.get("mode") != "self_spec" and not any(self._spec):
                self._say(SPEC_OTHER.format(mode=run.options.get("mode") or "diffusion"))
                return
            if k > 0:       # only the prefill has no draft
                self._say(SPEC_UNSENT)
                return
            self._set_lanes([], SPEC_PREFILL)
        else:
            self._set_lanes(self.lanes(run, k))
        self._drawing()
        self._draw_plot(run, k)
        text = html.escape(self.caption_text(run, k), quote=False).replace("\n", "<br>")
        if self.ar_cost(run) is None and self.figures(run, k).tokens:
            text += f" · <a href='measure' style='color:{theme.ACCENT.name()}'>measure AR here</a>"
        self._set_caption(text)

    def lanes(self, run: RunState, k: int) -> list[tuple[str, list[Cell]]]:
        """The drafted block over what the verify pass made of it."""
        ev = run.events[k]
        draft = np.asarray(ev.spec_draft)
        a = min(max(ev.spec_accepted, 0), len(draft) - 1)
        s, n = ev.block_start, ev.tokens.shape[0]
        top, bottom = [], []
        for i, tid in enumerate(draft.tolist()):
            pos = s + i
            if i == 0:
                cell = Cell(token_text(run, tid), "seed", tip=f"the seed {quoted(run, tid)}, committed before")
                top.append(cell)
                bottom.append(cell)
            elif i <= a:
                top.append(Cell(token_text(run, tid), "draft", tip=f"draft {i}: {quoted(run, tid)}"))
                bottom.append(Cell(token_text(run, tid), "accepted",
                                   tip=f"kept: the verify pass chose {quoted(run, tid)} here too"))
            elif i == a + 1:
                chosen = int(ev.tokens[pos]) if pos < n else tid
                top.append(Cell(token_text(run, tid), "rejected",
                                tip=f"first rejected: the draft {quoted(run, tid)}, the verify pass chose "
                                    f"{quoted(run, chosen)}"))
                bottom.append(Cell(token_text(run, chosen), "bonus",
                                   tip=f"bonus: the verify pass's own token {quoted(run, chosen)}"))
            else:
                top.append(Cell(token_text(run, tid), "discarded",
                                tip=f"draft {i}: {quoted(run, tid)}, after the first rejected: not kept"))
                bottom.append(Cell("", ""))
        if a == len(draft) - 1 and s + len(draft) < n:      # every draft kept: the bonus follows them
            chosen = int(ev.tokens[s + len(draft)])
            top.append(Cell("", ""))
            bottom.append(Cell(token_text(run, chosen), "bonus",
                               tip=f"bonus after the last draft: the verify pass's own token {quoted(run, chosen)}"))
        return [("draft", top), ("verified", bottom)]

    def _draw_plot(self, run: RunState, k: int) -> None:
        drafted = np.asarray(self._drafted, float)
        spec = np.asarray(self._spec, bool)
        x = step_number(np.arange(len(drafted)))[spec]
        kept = np.asarray(self._kept, float)[spec]
        bonus = np.asarray(self._tokens, float)[spec] - kept       # 1, or 0 where the answer ended
        self.kept_bars.setOpts(x=x, height=kept)
        self.bonus_bars.setOpts(x=x, y0=kept, height=bonus)
        self.rest_bars.setOpts(x=x, y0=kept + bonus, height=np.maximum(drafted[spec] - kept - bonus + 1, 0))
        self.cursor.setValue(step_number(k))
        top = float(drafted.max() + 1) if drafted.size else 2.0
        self.plot.setRange(xRange=self._steps_range(run), yRange=(0, max(top, 2.5)), padding=0)

    def caption_text(self, run: RunState, k: int) -> str:
        """Three lines: the step, the passes so far against AR's, the time per token against AR's."""
        ev, f = run.events[k], self.figures(run, k)
        if ev.spec_draft is not None:
            drafted, a = len(ev.spec_draft) - 1, max(ev.spec_accepted, 0)
            said = f"kept {a} of {counted(drafted, 'draft')}"
            if a < drafted:
                said += (f", rejected {quoted(run, ev.spec_draft[a + 1])} → bonus "
                         f"{quoted(run, ev.tokens[ev.block_start + a + 1])}")
            passes = "2 passes" if drafted else "1 pass"
            step = (f"{run.step_label(k)}: {said} · {counted(len(ev.unmasked), 'token')}, {passes} of "
                    f"{counted(drafted + 1, 'row')}, {ev.total_ms:.1f} ms")
        else:
            step = f"{run.step_label(k)}: the prefill, {counted(len(ev.unmasked), 'token')}"
        saved = f.tokens - f.passes
        vs_ar = (f"{counted(saved, 'pass')} fewer than AR" if saved > 0 else f"{counted(-saved, 'pass')} more than AR"
                 if saved < 0 else "as many passes as AR")
        passes = (f"After the prefill {counted(f.tokens, 'token')} / {counted(f.passes, 'pass')} = "
                  f"{f.tokens_per_pass:.2f} "
                  f"per pass (AR 1) · {vs_ar}")
        return "\n".join((step, passes, self.time_text(run, k)))

    def time_text(self, run: RunState, k: int) -> str:
        ms = ms_per_token(run, k)
        if not ms:
            return "Time per token: from the first iteration on"
        mine = f"So far {ms:.2f} ms/token"
        cost = self.ar_cost(run)
        if cost is None:
            return f"{mine} · AR's not measured on this model yet"
        return (f"{mine} vs AR's {cost.ms_per_token:.2f} (measured {cost.when}): {cost.ms_per_token / ms:.2f}x "
                f"AR's speed")


CAPTION_TIP = ("Counted after the prefill, which AR runs alike. Passes count forward passes, not time: a pass of "
               "a block of rows costs more than AR's one-row pass. Time per token: the iterations' steps (both "
               "passes, sampling and checks) over the tokens they committed. AR's: the same over the last "
               "finished mode-ar run of this model file at these threads in this session (a chat answer or "
               "Compare in mode ar, or 'measure AR here': 32 tokens in mode ar after this run's prompt).")


class WindowView(_StripView):
    """WeDLM's window at a step: text order over pass order."""

    def __init__(self, parent=None):
        super().__init__(WINDOW_LEGEND, WINDOW_LEGEND_TIP, parent=parent)
        self.legend.setText(f"{self.legend.text()} &nbsp; <span style='color:{theme.MUTED.name()}'>"
                            f"#n: place in the pass · @n: answer position</span>")
        self.committed_bars = pg.BarGraphItem(x=[], height=[], width=0.8, brush=_alpha(theme.ACCENT, 200), pen=None)
        self.filled_curve = self.plot.plot([], [], pen=pg.mkPen(theme.ACTIVE, width=1.5), symbol="o", symbolSize=4,
                                           symbolBrush=theme.ACTIVE, symbolPen=None)
        self.plot.addItem(self.committed_bars)
        self.plot.setToolTip("Per step: bars, the positions it committed; the line, those filled but not "
                             "committed after it.")
        self.set_run(None)

    def clear_run(self, run: RunState | None) -> None:
        self._counted = 0
        self._committed, self._filled = [], []
        self._say(self.empty_text(WINDOW_IDLE))

    def _count(self, run: RunState) -> None:
        for e in run.events[self._counted:]:
            if e.window_order is None:
                self._committed.append(0)
                self._filled.append(0)
                continue
            window = np.arange(e.block_start, e.block_end)
            self._committed.append(len(e.committed))
            self._filled.append(int((~e.mask[window]).sum()) - int(np.isin(e.committed, window).sum()))
        self._counted = len(run.events)

    def draw_step(self, run: RunState, k: int) -> None:
        ev = run.events[k]
        if ev.window_order is None:
            self._say(WINDOW_OTHER)
            return
        self._count(run)
        self._drawing()
        self._set_lanes(self.lanes(run, k))
        x = step_number(np.arange(len(self._committed)))
        self.committed_bars.setOpts(x=x, height=np.asarray(self._committed, float))
        self.filled_curve.setData(x, np.asarray(self._filled, float))
        self.cursor.setValue(step_number(k))
        top = max(max(self._committed, default=0), max(self._filled, default=0), 1)
        self.plot.setRange(xRange=self._steps_range(run), yRange=(0, top + 0.5), padding=0)
        self._set_caption(html.escape(self.caption_text(run, k), quote=False))

    @staticmethod
    def states(ev) -> dict[int, str]:
        """Each window position's state after the step: committed (this step, exact causal K/V),
        filled (not committed) or mask."""
        committed = set(np.asarray(ev.committed).tolist())
        return {pos: "committed" if pos in committed else "mask" if ev.mask[pos] else "filled"
                for pos in range(ev.block_start, ev.block_end)}

    def lanes(self, run: RunState, k: int) -> list[tuple[str, list[Cell]]]:
        ev = run.events[k]
        states, p = self.states(ev), ev.prompt_length
        order = [int(i) for i in ev.window_order]
        place = {pos: i for i, pos in enumerate(order)}
        filled_now = set(np.asarray(ev.unmasked).tolist())

        def cell(pos: int, mark: str) -> Cell:
            state = states.get(pos, "mask")
            text = "░" if state == "mask" else token_text(run, ev.tokens[pos])
            said = {"committed": "committed at this step: its exact causal K/V is in the cache for good",
                    "filled": "filled, not committed: its K/V is computed again next pass",
                    "mask": "still a mask"}[state]
            return Cell(text, state, mark, ring=pos in filled_now,
                        tip=f"answer position {pos - p}, run {place.get(pos, -1) + 1} in the pass: {said}")
        text_order = [cell(pos, f"#{place[pos] + 1}" if pos in place else "")
                      for pos in range(ev.block_start, ev.block_end)]
        pass_order = [cell(pos, f"@{pos - p}") for pos in order]
        return [("text order", text_order), ("pass order", pass_order)]

    def caption_text(self, run: RunState, k: int) -> str:
        ev = run.events[k]
        states = list(self.states(ev).values())
        p = ev.prompt_length
        done = int((~ev.mask[p:ev.block_start]).sum()) + states.count("committed")
        return (f"{run.step_label(k)}, {run.budget_text()}: window at answer positions "
                f"{ev.block_start - p}–{ev.block_end - p - 1} · "
                f"{states.count('committed')} committed at this step, {states.count('filled')} filled not committed, "
                f"{states.count('mask')} masks (outlined: filled at this step) · {done} of {run.gen_length} "
                f"committed so far")
