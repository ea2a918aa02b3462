"""The denoising canvas: what each cell looks like, hover tooltips, the colour-mode switch."""
from __future__ import annotations

import numpy as np
import pytest
from PySide6.QtCore import QEvent, QPoint, QPointF, Qt
from PySide6.QtGui import QColor, QHelpEvent, QMouseEvent
from PySide6.QtWidgets import QToolTip

from diffuse.studio import theme
from diffuse.studio.canvas import (CanvasPanel, CellLayout, color_scale, display_text,
                                   render_image, tooltip_html)
from diffuse.studio.run_state import RunState

W, CW, CH = 960, 60, 30


def rgb(image, x, y):
    c = QColor(image.pixel(int(x), int(y)))
    return np.array([c.red(), c.green(), c.blue()], float)


def close(a, b, tol=12):
    return np.abs(np.asarray(a, float) - np.asarray(b, float)).max() <= tol


def qrgb(c: QColor):
    return [c.red(), c.green(), c.blue()]


@pytest.fixture
def run(recorded_run):
    return RunState.from_recording(recorded_run("blocks_cache"))


def test_cells_show_masked_decided_and_fresh(run):
    layout = CellLayout(run.gen_length, W, CW, CH)
    step = 3
    image = render_image(run, step, "entropy", W, CW, CH)
    e = run.events[step]
    masked = e.gen_mask
    colors = color_scale(run, "entropy").colors(run.cell_values(step, "entropy"))
    fresh = set((e.unmasked - run.prompt_length).tolist())
    n_checked = 0
    for i in range(run.gen_length):
        r = layout.rect(i)
        corner = rgb(image, r.left() + 6, r.top() + 6)
        if masked[i]:
            # hatched dark grey: one of the two mask colours, never a colour-map colour
            assert close(corner, qrgb(theme.MASKED), 20) or close(corner, qrgb(theme.MASK_HATCH), 20)
        else:
            assert close(corner, qrgb(colors[i])), (i, corner, qrgb(colors[i]))
            n_checked += 1
        ring = rgb(image, r.left() - 1.5, r.center().y())
        if i in fresh:
            assert close(ring, qrgb(theme.HIGHLIGHT), 60), (i, ring)
    assert n_checked > 0 and masked.sum() > 0


def test_all_cells_decided_at_the_end(run):
    image = render_image(run, -1, "entropy", W, CW, CH)
    layout = CellLayout(run.gen_length, W, CW, CH)
    for i in range(run.gen_length):
        r = layout.rect(i)
        corner = rgb(image, r.left() + 6, r.top() + 6)
        assert not close(corner, qrgb(theme.MASKED), 6)


def test_block_boundaries_and_current_block(run):
    layout = CellLayout(run.gen_length, W, CW, CH)
    step = 10                      # inside block 1 (positions 16..31)
    image = render_image(run, step, "entropy", W, CW, CH)
    start = layout.rect(16)
    bar = rgb(image, start.left() - layout.gap / 2, start.center().y())
    assert close(bar, qrgb(theme.ACCENT), 40)
    under = layout.rect(20)
    assert close(rgb(image, under.center().x(), under.bottom() + 2), qrgb(theme.ACCENT), 40)
    outside = layout.rect(40)
    assert not close(rgb(image, outside.center().x(), outside.bottom() + 2),
                     qrgb(theme.ACCENT), 40)


def test_modes_use_different_colour_maps(run):
    a = render_image(run, -1, "entropy", W, CW, CH)
    b = render_image(run, -1, "confidence", W, CW, CH)
    r = CellLayout(run.gen_length, W, CW, CH).rect(0)
    assert not close(rgb(a, r.left() + 6, r.top() + 6), rgb(b, r.left() + 6, r.top() + 6), 3)


def test_tooltip_tells_token_entropy_probability_and_step(run):
    i = int(np.flatnonzero(run.decided_step == 2)[0])
    text = tooltip_html(run, run.n_steps - 1, i)
    tid = int(run.events[-1].gen_tokens[i])
    assert repr(run.piece(tid)).strip("'") in text
    assert f"entropy: {run.commit_entropy[i]:.3f} nats" in text
    assert f"top-1 probability: {run.commit_confidence[i]:.3f}" in text
    assert "decided at step 3" in text                    # the header's count: "step 3/n"
    early = tooltip_html(run, 0, i)
    assert "still masked" in early and "will be decided at step 3" in early


def test_hover_and_tooltip_on_the_widget(qtbot, run):
    panel = CanvasPanel()
    qtbot.addWidget(panel)
    panel.resize(900, 500)
    panel.show()
    panel.set_run(run)
    panel.show_step(-1)
    canvas = panel.canvas
    centre = canvas.cell_rect(5).center()
    with qtbot.waitSignal(canvas.hovered) as hovered:
        canvas.mouseMoveEvent(QMouseEvent(QEvent.Type.MouseMove, QPointF(centre), QPointF(centre),
                                          Qt.MouseButton.NoButton, Qt.MouseButton.NoButton,
                                          Qt.KeyboardModifier.NoModifier))
    assert hovered.args == [5]
    pos = QPoint(int(centre.x()), int(centre.y()))
    canvas.event(QHelpEvent(QEvent.Type.ToolTip, pos, canvas.mapToGlobal(pos)))
    assert "position 5" in QToolTip.text()
    assert "step" in panel.status.text() and "masked" in panel.status.text()


def test_mode_buttons_switch_the_canvas(qtbot, run):
    panel = CanvasPanel()
    qtbot.addWidget(panel)
    panel.set_run(run)
    panel.mode_buttons.button(1).click()
    assert panel.canvas.mode == "confidence" and panel.legend.mode == "confidence"
    panel.set_mode("entropy")
    assert panel.mode_buttons.button(0).isChecked()


def test_two_canvas_panels_fit_side_by_side_in_1024_px_the_legend_shrinking(qtbot, run):
    # Compare puts two side by side with 6 px margins and spacing: each gets (1024 - 18) / 2
    panel = CanvasPanel(cell_w=44, cell_h=24)
    qtbot.addWidget(panel)
    panel.set_run(run)
    panel.set_fitted(True)
    assert panel.minimumSizeHint().width() <= (1024 - 3 * 6) // 2 - 60     # room for the window's frame
    legend = panel.legend
    assert legend.minimumWidth() <= 120 and legend.sizeHint().width() > legend.minimumWidth()
    panel.resize(panel.minimumSizeHint().width(), 300)
    panel.show()
    qtbot.waitUntil(lambda: legend.width() < legend.sizeHint().width())
    # narrow, it draws the short caption; the tooltip keeps the whole one
    assert legend.fontMetrics().horizontalAdvance(legend.caption()) > legend.width()
    assert legend.caption(short=True) == "entropy · fitted 5–95%"
    assert legend.toolTip().startswith("entropy (nats) · fitted 5–95%: ")
    legend.grab()           # paints without error at that width


def test_empty_canvas_paints_a_hint(qtbot):
    panel = CanvasPanel()
    qtbot.addWidget(panel)
    panel.resize(600, 300)
    panel.set_run(None)
    image = panel.canvas.grab().toImage()
    assert image.width() > 0                     # paints without a run


@pytest.mark.parametrize("piece,special,shown", [
    (" the", False, "the"), ("\n", False, "⏎"), (" ", False, "␣"), ("", False, "∅"),
    ("<|endoftext|>", True, "endoftext"), ("</s>", True, "/s"), ("<html>", False, "<html>")])
def test_display_text(piece, special, shown):
    assert display_text(piece, special) == shown
