"""The wheel over the Settings and Serve panels scrolls them; a field changes only once focused
(scrolling the Settings panel once set suffix_window=35 and saved it)."""
from __future__ import annotations

import pytest
from PySide6.QtCore import QPoint, QPointF, Qt
from PySide6.QtGui import QWheelEvent
from PySide6.QtWidgets import QApplication, QScrollArea

from diffuse.studio import storage
from diffuse.studio.serve_panel import ServePanel
from diffuse.studio.settings_panel import SettingsPanel


def wheel(widget, notches: int = -3) -> None:
    """`notches` clicks of the wheel over the middle of `widget` (negative: scroll down)."""
    centre = QPointF(widget.rect().center())
    event = QWheelEvent(centre, QPointF(widget.mapToGlobal(centre.toPoint())), QPoint(0, 0),
                        QPoint(0, 120 * notches), Qt.MouseButton.NoButton,
                        Qt.KeyboardModifier.NoModifier, Qt.ScrollPhase.NoScrollPhase, False)
    QApplication.sendEvent(widget, event)


def scrolled(qtbot, panel):
    area = QScrollArea()
    area.setWidgetResizable(True)
    area.setWidget(panel)
    area.resize(300, 250)          # much shorter than the panel: it scrolls
    qtbot.addWidget(area)
    area.show()
    qtbot.waitExposed(area)
    return area


@pytest.mark.parametrize("name", ["suffix_window", "steps", "temperature", "scheduler"])
def test_wheel_over_a_settings_field_scrolls_the_panel(qtbot, name):
    panel = SettingsPanel()
    area = scrolled(qtbot, panel)
    field = panel.fields[name]
    before, saved = panel.options()[name], storage.settings().value(f"generation/{name}")
    assert field.focusPolicy() == Qt.FocusPolicy.StrongFocus     # the wheel alone does not focus
    wheel(field)
    assert panel.options()[name] == before
    assert storage.settings().value(f"generation/{name}") == saved
    assert area.verticalScrollBar().value() > 0                  # the panel scrolled instead
    field.setFocus()
    qtbot.waitUntil(field.hasFocus)
    wheel(field, -1 if name == "scheduler" else 1)    # the next item; up from auto
    assert panel.options()[name] != before                       # focused: the wheel is its own


def test_wheel_over_the_serve_panel_ports_scrolls(qtbot):
    panel = ServePanel()
    area = scrolled(qtbot, panel)
    area.resize(300, 120)
    wheel(panel.port)
    assert panel.port.value() == 8080 and area.verticalScrollBar().value() > 0
