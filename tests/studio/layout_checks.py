"""What a user could not read in a window as it is laid out now: text cut without a tooltip that
holds it, widgets running past the edge of what shows them, horizontal scrollbars. Used by the
offscreen layout tests and, inside the app's process, by the real-window (Xvfb) test."""
from __future__ import annotations

import pyqtgraph as pg
from PySide6.QtCore import QPoint
from PySide6.QtWidgets import (QAbstractButton, QAbstractScrollArea, QAbstractSpinBox, QComboBox,
                               QHeaderView, QLabel, QLineEdit, QProgressBar, QScrollArea, QSlider,
                               QStyle, QStyleOptionComboBox, QTableWidget, QTabBar, QWidget)

from diffuse.studio import theme

# Widgets a user reads or uses; their containers and Qt's inner parts are not checked themselves.
LEAVES = (QLabel, QAbstractButton, QComboBox, QLineEdit, QAbstractSpinBox, QAbstractScrollArea,
          QProgressBar, QSlider)
SLACK = 1      # pixels of rounding


def _name(w: QWidget) -> str:
    text = w.text() if hasattr(w, "text") and callable(w.text) else ""
    return f"{type(w).__name__}({text[:40]!r})" if text else type(w).__name__


def _shown_within(w: QWidget) -> QWidget:
    """The nearest ancestor that clips `w`: a scroll area's viewport, else the window."""
    parent = w.parentWidget()
    while parent is not None and not parent.isWindow():
        if isinstance(parent.parentWidget(), QScrollArea) and parent is parent.parentWidget().viewport():
            return parent
        parent = parent.parentWidget()
    return w.window()


def _combo_text_width(box: QComboBox) -> int:
    option = QStyleOptionComboBox()
    box.initStyleOption(option)
    return box.style().subControlRect(QStyle.ComplexControl.CC_ComboBox, option,
                                      QStyle.SubControl.SC_ComboBoxEditField, box).width()


def _cut_text(w: QWidget) -> str | None:
    """Why `w`'s text does not show whole, or None (a tooltip that holds the text is fine)."""
    if isinstance(w, QAbstractButton) and w.text() and w.width() < w.sizeHint().width():
        return f"{w.width()} < {w.sizeHint().width()}"
    if isinstance(w, QLabel) and w.text() and not w.wordWrap() and not w.toolTip() \
            and w.sizeHint().width() > w.contentsRect().width() + SLACK:
        return f"{w.contentsRect().width()} < {w.sizeHint().width()}, no tooltip"
    if isinstance(w, QComboBox) and not w.isEditable() and not w.toolTip() \
            and w.fontMetrics().horizontalAdvance(w.currentText()) > _combo_text_width(w):
        return "elided, no tooltip"
    return None


def _table_problems(table: QTableWidget) -> list[str]:
    out = []
    header = table.horizontalHeader()
    for c in range(table.columnCount()):
        item = table.horizontalHeaderItem(c)
        needed = header.sectionSizeFromContents(c).width()
        if item is not None and not header.isSectionHidden(c) and header.sectionSize(c) + SLACK < needed:
            out.append(f"header {item.text()!r}: {header.sectionSize(c)} < {needed}")
        for r in range(table.rowCount()):
            cell = table.item(r, c)
            if cell is None or cell.toolTip():
                continue
            if table.fontMetrics().horizontalAdvance(cell.text()) + 8 > table.columnWidth(c):
                out.append(f"cell {cell.text()!r} cut, no tooltip")
    return out


def _tab_problems(bar: QTabBar) -> list[str]:
    return [f"tab {bar.tabText(i)!r}: {bar.tabRect(i).width()} < {bar.tabSizeHint(i).width()}"
            for i in range(bar.count())
            if bar.tabRect(i).width() + SLACK < bar.tabSizeHint(i).width() and not bar.tabToolTip(i)]


def _plot_text_problems(view: pg.GraphicsView) -> list[str]:
    """Captions wider than the plots; axis titles running out of the view (a long title of a
    short axis is cut there)."""
    out = []
    shown = view.mapToScene(view.viewport().rect()).boundingRect()
    for item in view.scene().items():
        if not item.isVisible():
            continue
        if isinstance(item, theme.Caption) and item.item.boundingRect().width() > item.width() + SLACK:
            out.append(f"caption {item.text[:40]!r}: {item.item.boundingRect().width():.0f} > {item.width():.0f}")
        if isinstance(item, pg.AxisItem) and item.label.isVisible() and item.labelText:
            margin = item.label.document().documentMargin()      # blank around the text
            text = item.label.sceneBoundingRect().adjusted(margin, margin, -margin, -margin)
            if not shown.adjusted(-SLACK, -SLACK, SLACK, SLACK).contains(text):
                out.append(f"axis title {item.labelText[:40]!r} runs out of the view")
    return out


def layout_problems(root: QWidget) -> list[str]:
    """Every visible thing under `root` a user could not read whole, as lines to print."""
    problems = []
    for w in [root, *root.findChildren(QWidget)]:
        if not w.isVisible():
            continue
        if isinstance(w, QAbstractScrollArea) and w.horizontalScrollBar().isVisible():
            problems.append(f"{_name(w)}: a horizontal scrollbar")
        if isinstance(w, QTableWidget):
            problems += [f"{_name(w)}: {p}" for p in _table_problems(w)]
        if isinstance(w, QTabBar):
            problems += [f"{_name(w)}: {p}" for p in _tab_problems(w)]
        if isinstance(w, pg.GraphicsView):
            problems += [f"{_name(w)}: {p}" for p in _plot_text_problems(w)]
        if not isinstance(w, LEAVES) or isinstance(w, QHeaderView) or w is root:
            continue
        if (why := _cut_text(w)) is not None:
            problems.append(f"{_name(w)}: text cut, {why}")
        frame = _shown_within(w)
        right = w.mapTo(frame, QPoint(w.width(), 0)).x()
        if right > frame.width() + SLACK:
            problems.append(f"{_name(w)}: right edge at {right}, past {frame.width()}")
    return problems
