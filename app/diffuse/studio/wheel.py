"""The mouse wheel scrolls a panel, never changes the field it passes over.

A spin box or combo box takes wheel events wherever the pointer is: scrolling the Settings panel
changed (and saved) the field under the pointer, e.g. suffix_window=35. Guarded fields take the
wheel only once focused (clicked or tabbed into); otherwise the panel's scroll area gets it.
"""
from __future__ import annotations

from PySide6.QtCore import QCoreApplication, QEvent, QObject, Qt
from PySide6.QtWidgets import QAbstractScrollArea, QAbstractSpinBox, QComboBox, QWidget


class _WheelGuard(QObject):
    def eventFilter(self, watched: QObject, event: QEvent) -> bool:
        if event.type() != QEvent.Type.Wheel or watched.hasFocus():
            return False
        # Handed to the scroll area explicitly: Qt passes an ignored wheel event on to the
        # parents only when it came from the window system.
        area = watched.parentWidget()
        while area is not None and not isinstance(area, QAbstractScrollArea):
            area = area.parentWidget()
        if area is not None:
            QCoreApplication.sendEvent(area.verticalScrollBar(), event)
        return True


def guard_wheel(root: QWidget) -> None:
    """Every spin box and combo box under `root` takes the wheel only when focused; a click or
    Tab focuses it (StrongFocus: the wheel alone does not)."""
    guard = root.findChild(_WheelGuard) or _WheelGuard(root)
    for field in root.findChildren(QAbstractSpinBox) + root.findChildren(QComboBox):
        field.setFocusPolicy(Qt.FocusPolicy.StrongFocus)
        field.installEventFilter(guard)
