"""Panels that collapse: a checkable action hides one pane of a splitter and brings it back at
the size it had, so a small screen can give the denoising views the whole width."""
from __future__ import annotations

from PySide6.QtCore import QObject, Qt
from PySide6.QtGui import QAction
from PySide6.QtWidgets import QSplitter


class PaneToggle(QObject):
    """`action` (made checkable) shows or collapses pane `index` of `splitter`; dragging the
    splitter's handle to the edge collapses it too, and the action follows."""

    def __init__(self, action: QAction, splitter: QSplitter, index: int):
        super().__init__(action)
        self.action, self.splitter, self.index = action, splitter, index
        self.last = 0            # the pane's size before it was collapsed
        splitter.setCollapsible(index, True)
        action.setCheckable(True)
        action.toggled.connect(self.set_shown)
        splitter.splitterMoved.connect(self.sync)
        self.sync()

    def shown(self) -> bool:
        return self.splitter.sizes()[self.index] > 0

    def set_shown(self, shown: bool) -> None:
        sizes = self.splitter.sizes()
        if shown == (sizes[self.index] > 0):
            return
        # The space comes from, or goes to, the largest other pane (the views).
        other = max((i for i in range(len(sizes)) if i != self.index), key=sizes.__getitem__)
        if shown:
            hint = self.splitter.widget(self.index).minimumSizeHint()
            least = hint.width() if self.splitter.orientation() == Qt.Orientation.Horizontal else hint.height()
            size = min(max(self.last, least), sizes[other] // 2)
            sizes[self.index], sizes[other] = size, sizes[other] - size
        else:
            self.last = sizes[self.index]
            sizes[other] += sizes[self.index]
            sizes[self.index] = 0
        self.splitter.setSizes(sizes)
        self.sync()

    def sync(self, *_) -> None:
        """The action's check mark as the pane is (after a drag or a restored layout), and the
        size to come back at."""
        if self.shown():
            self.last = self.splitter.sizes()[self.index]
        self.action.blockSignals(True)
        self.action.setChecked(self.shown())
        self.action.blockSignals(False)
