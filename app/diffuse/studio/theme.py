"""Look of the app: bundled fonts, the style sheet, colours and colour maps, sizes as text, and
the widgets that keep a narrow panel readable (text wrapped, or cut with "…" and a tooltip).

Resources live in the repository's `resources/` folder; an installed package carries them as
`diffuse/studio/resources/` (see the wheel settings), so both places are searched.
"""
from __future__ import annotations

from functools import lru_cache
from pathlib import Path

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import QEvent, QRect, QSize, Qt
from PySide6.QtGui import QColor, QFont, QFontDatabase, QIcon, QPainter
from PySide6.QtWidgets import (QApplication, QComboBox, QLabel, QSizePolicy, QStyle,
                               QStyleOptionComboBox, QStylePainter)

from diffuse import DiffuseError

UI_FAMILY = "DejaVu Sans"
MONO_FAMILY = "DejaVu Sans Mono"

# Palette (dark). One place for every colour the widgets paint themselves.
BG = QColor("#12141a")
PANEL = QColor("#1a1d25")
GRID = QColor("#2a2e39")
TEXT = QColor("#e6e8ee")
MUTED = QColor("#8a90a2")
ACCENT = QColor("#5ad1c8")        # teal: the current block, live progress
HIGHLIGHT = QColor("#ffffff")     # ring around positions unmasked this step
DIFF = QColor("#ff5c7a")          # compare mode: positions where two runs differ
EDITED = QColor("#c084fc")        # violet: a committed token editing replaced (LLaDA2.1)
MASKED = QColor("#232733")
MASK_HATCH = QColor("#363b4a")
ACTIVE = QColor("#f2a541")        # cache view: recomputed this step
CACHED = QColor("#3b6ea8")        # cache view: K/V served from the cache

ENTROPY_CMAP = "plasma"           # low entropy dark blue -> high entropy yellow
CONFIDENCE_CMAP = "viridis"       # low top-1 probability purple -> high yellow


@lru_cache(maxsize=1)
def resources_dir() -> Path:
    here = Path(__file__).resolve().parent
    for candidate in (here / "resources", here.parents[2] / "resources"):
        if (candidate / "style.qss").is_file():
            return candidate
    raise DiffuseError(f"Diffuse Studio resources not found next to {here}")


def register_fonts() -> list[str]:
    """Register the bundled TTFs so text renders on machines without fonts; returns families."""
    families: list[str] = []
    for ttf in sorted((resources_dir() / "fonts").glob("*.ttf")):
        font_id = QFontDatabase.addApplicationFont(str(ttf))
        if font_id < 0:
            raise DiffuseError(f"{ttf}: Qt could not load this font")
        families += QFontDatabase.applicationFontFamilies(font_id)
    return sorted(set(families))


def mono_font(point_size: float = 9.0) -> QFont:
    font = QFont(MONO_FAMILY)
    font.setPointSizeF(point_size)
    font.setStyleHint(QFont.StyleHint.Monospace)
    return font


def apply(app: QApplication) -> None:
    """Fonts, style sheet, icon and pyqtgraph defaults for the whole application."""
    register_fonts()
    font = QFont(UI_FAMILY)
    font.setPointSizeF(9.5)
    app.setFont(font)
    # The sheet names its images relative to the resources folder; Qt resolves them from the
    # working directory.
    sheet = (resources_dir() / "style.qss").read_text(encoding="utf-8")
    sheet = sheet.replace("url(icons/", f"url({resources_dir().as_posix()}/icons/")
    app.setStyleSheet(sheet)
    app.setWindowIcon(icon("diffuse"))
    pg.setConfigOptions(antialias=True, background=PANEL, foreground=MUTED)


def icon(name: str) -> QIcon:
    return QIcon(str(resources_dir() / "icons" / f"{name}.svg"))


@lru_cache(maxsize=8)
def lut(name: str, n: int = 256) -> np.ndarray:
    """uint8 (n, 3) lookup table of a pyqtgraph colour map."""
    return pg.colormap.get(name).getLookupTable(0.0, 1.0, n, alpha=False)


def size_text(n_bytes: float) -> str:
    """An amount of memory or disk as every view of the app writes it: binary units (as system
    monitors count RAM: the same machine must not read 25 in one place and 23.5 in another), the
    largest that keeps a whole number in front (6.8 MiB, not 0.01 GiB)."""
    for unit, scale in (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(n_bytes) >= scale:
            value = n_bytes / scale      # three digits at most: 6.8 MiB, 271 MiB, 23.5 GiB
            return f"{value:.1f} {unit}" if abs(value) < 100 else f"{value:.0f} {unit}"
    return f"{n_bytes:.0f} B"


def legend_html(entries: list[tuple[str, QColor]], glyph: str = "■") -> str:
    """A one-line legend for a plot's title: a filled swatch in each drawn colour, then its
    name. Above the plot, it never covers the data (pyqtgraph's legends sit on top of it)."""
    return " &nbsp; ".join(f"<span style='color:{c.name()}'>{glyph}</span>"
                           f"<span style='color:{MUTED.name()}'> {name}</span>"
                           for name, c in entries)


class Caption(pg.LabelItem):
    """Text under plots that never widens them: a LabelItem asks its layout for its text's
    width, so a long line pushed the plots past the right edge of a narrow view. It wraps at the
    plots' width instead (and grows a line taller)."""

    def resizeEvent(self, ev) -> None:
        if self.item.textWidth() != self.width():
            self.item.setTextWidth(max(self.width(), 1.0))
        super().resizeEvent(ev)

    def updateMin(self) -> None:
        super().updateMin()
        self.setMinimumWidth(0)

    def sizeHint(self, hint, constraint):
        size = super().sizeHint(hint, constraint)
        if hint in (Qt.SizeHint.MinimumSize, Qt.SizeHint.PreferredSize):
            size.setWidth(0)
        return size


class EmptyState:
    """A message in a plot while there is nothing to show: its axes and `also` (a colour bar,
    a second plot) are hidden, since bare axes show pyqtgraph's default range (-0.5...0.5),
    which reads as data. A message wider than the plot wraps."""

    def __init__(self, plot: pg.PlotItem, message: str = "No run yet", also: tuple = ()):
        self.plot, self.also = plot, also
        self.note = pg.TextItem(message, color=MUTED, anchor=(0.5, 0.5))
        plot.addItem(self.note, ignoreBounds=True)
        plot.vb.sigResized.connect(self._wrap)
        self.idle = message             # what it says without a run
        self.empty: bool | None = None

    def show(self, empty: bool, message: str | None = None) -> None:
        """Hide the data and say `message` (by default what was said last), or show the data."""
        if message is not None:
            self.note.setText(message)
            self._wrap()
        if empty == self.empty:         # views call this on every step
            return
        self.empty = empty
        for axis in ("left", "bottom"):
            self.plot.showAxis(axis, not empty)
        for item in self.also:
            item.setVisible(not empty)
        self.note.setVisible(empty)
        if empty:
            self.plot.setRange(xRange=(0, 1), yRange=(0, 1), padding=0)
            self.note.setPos(0.5, 0.5)

    def _wrap(self, *_) -> None:
        """A message wider than the plot wraps to its width (a plot may be narrow)."""
        text = self.note.textItem
        text.setTextWidth(-1)
        room = self.plot.vb.width() - 8
        if 0 < room < text.boundingRect().width():
            text.setTextWidth(room)
        self.note.updateTextPos()


class SteadyLabel(QLabel):
    """A one-line label whose text changes with every step (a step counter, a ms figure) without
    relaying out the window: its size is fixed, so a new text repaints only the label (a QLabel's
    size hint follows its text, and each change re-ran the main window's layout and repainted all
    of it, 100 times a second during a run). It widens, once, for a text that does not fit, up to
    `max_chars` digits' width; a longer text ends in "…" (it must leave its row's other widgets room)."""

    def __init__(self, text: str = "", min_width: int = 0, max_chars: int = 0, parent=None):
        super().__init__(text, parent)
        self._min_width, self._max_chars = min_width, max_chars
        self._fit(anew=True)

    def setText(self, text: str) -> None:
        super().setText(text)
        self._fit()

    def changeEvent(self, event) -> None:     # a style sheet or font applied: measure anew
        super().changeEvent(event)
        if event.type() in (QEvent.Type.FontChange, QEvent.Type.StyleChange):
            self._fit(anew=True)

    def _fit(self, anew: bool = False) -> None:
        hint = super().sizeHint()
        width = max(self._min_width, hint.width(), 0 if anew else self.maximumWidth())
        if self._max_chars:
            width = min(width, max(self._min_width, self.fontMetrics().horizontalAdvance("0" * self._max_chars)))
        if width != self.maximumWidth() or hint.height() != self.maximumHeight():
            self.setFixedSize(width, hint.height())

    def paintEvent(self, event) -> None:
        paint_elided(self)


class ElidedLabel(QLabel):
    """One line of text that never widens its panel: narrower than its text, it ends in "…"
    and its tooltip holds the whole text."""

    def __init__(self, text: str = "", parent=None):
        super().__init__(text, parent)
        self.setSizePolicy(QSizePolicy.Policy.Ignored, QSizePolicy.Policy.Preferred)

    def minimumSizeHint(self) -> QSize:
        return QSize(0, super().minimumSizeHint().height())

    def setText(self, text: str) -> None:
        super().setText(text)
        self._update_tip()

    def resizeEvent(self, event) -> None:
        super().resizeEvent(event)
        self._update_tip()

    def elided(self) -> bool:
        return self.fontMetrics().horizontalAdvance(self.text()) > self.contentsRect().width()

    def _update_tip(self) -> None:
        self.setToolTip(self.text() if self.elided() else "")

    def paintEvent(self, event) -> None:
        paint_elided(self)


def paint_elided(label: QLabel) -> None:
    """A one-line label's text, ending in "…" where it does not fit."""
    painter = QPainter(label)
    rect = label.contentsRect()
    text = label.fontMetrics().elidedText(label.text(), Qt.TextElideMode.ElideRight, rect.width())
    label.style().drawItemText(painter, rect, label.alignment() | Qt.AlignmentFlag.AlignVCenter,
                               label.palette(), label.isEnabled(), text, label.foregroundRole())


class ElidedComboBox(QComboBox):
    """A combo box as narrow as its panel whose current text ends in "…" when it does not fit
    (Qt cuts it off mid-letter); its list shows the items whole. Give it a tooltip."""

    def __init__(self, min_chars: int = 8, parent=None):
        super().__init__(parent)
        self.setSizeAdjustPolicy(QComboBox.SizeAdjustPolicy.AdjustToMinimumContentsLengthWithIcon)
        self.setMinimumContentsLength(min_chars)

    def text_rect(self) -> QRect:
        option = QStyleOptionComboBox()
        self.initStyleOption(option)
        return self.style().subControlRect(QStyle.ComplexControl.CC_ComboBox, option,
                                           QStyle.SubControl.SC_ComboBoxEditField, self)

    def showPopup(self) -> None:
        self.view().setMinimumWidth(self.view().sizeHintForColumn(0) + 24)
        super().showPopup()

    def paintEvent(self, event) -> None:
        painter = QStylePainter(self)
        option = QStyleOptionComboBox()
        self.initStyleOption(option)
        painter.drawComplexControl(QStyle.ComplexControl.CC_ComboBox, option)
        option.currentText = self.fontMetrics().elidedText(
            option.currentText, Qt.TextElideMode.ElideRight, self.text_rect().width() - 2)
        painter.drawControl(QStyle.ControlElement.CE_ComboBoxLabel, option)


def text_on(color: QColor) -> QColor:
    """Black or white text, whichever reads better on `color`."""
    luma = 0.299 * color.redF() + 0.587 * color.greenF() + 0.114 * color.blueF()
    return QColor("#0b0c10") if luma > 0.55 else QColor("#f4f5f8")
