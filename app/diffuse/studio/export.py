"""Export a run as pictures: a PNG strip of chosen steps, or an animated GIF of every step.

Frames are the denoising canvas (`canvas.paint_cells`) under a one-line caption. Qt writes PNG;
GIF needs Pillow (Qt has no GIF writer; without Pillow only the GIF export is refused). Files
are written atomically. Drawing uses QImage only, so exports may run on a worker thread.
"""
from __future__ import annotations

import io
from pathlib import Path

import numpy as np
from PySide6.QtCore import QBuffer, QIODevice, QRectF, Qt
from PySide6.QtGui import QImage, QPainter

from diffuse import DiffuseError
from diffuse.recording import write_atomic
from diffuse.studio import theme
from diffuse.studio.canvas import CellLayout, color_scale, paint_cells, scale_name
from diffuse.studio.run_state import RunState

try:
    from PIL import Image
except ImportError:      # only the GIF export needs it
    Image = None

CAPTION_H = 26


def strip_steps(run: RunState, n_frames: int = 8) -> list[int]:
    """`n_frames` step indices spread over the run, first and last included."""
    if run.n_steps == 0:
        return []
    return sorted(set(np.linspace(0, run.n_steps - 1, min(n_frames, run.n_steps))
                      .round().astype(int).tolist()))


def frame(run: RunState, step: int, mode: str = "entropy", width: int = 960,
          cell_w: int = 52, cell_h: int = 26, fitted: bool = False) -> QImage:
    """The canvas at `step` with a caption line: step, block, masked count, colour scale
    (`fitted`: the run's own percentiles, as the canvas shows them)."""
    layout = CellLayout(run.gen_length, width, cell_w, cell_h, margin=8)
    image = QImage(width, CAPTION_H + layout.height, QImage.Format.Format_RGB32)
    image.fill(theme.BG)
    p = QPainter(image)
    e = run.events[step]
    p.setPen(theme.TEXT)
    p.setFont(theme.mono_font(9))
    p.drawText(QRectF(10, 0, width - 20, CAPTION_H), Qt.AlignmentFlag.AlignVCenter,
               f"{run.step_label(step)}   block {e.block + 1}/{e.n_blocks}   "
               f"{int(e.gen_mask.sum())} masked   {len(e.unmasked)} decided this step   "
               f"{mode}, {scale_name(fitted)}")
    p.translate(0, CAPTION_H)
    paint_cells(p, layout, run, step, mode, scale=color_scale(run, mode, fitted))
    p.end()
    return image


def _check(run: RunState) -> None:
    if run is None or not run.events:
        raise DiffuseError("nothing to export: generate or open a run first")


def png_strip(run: RunState, path: str | Path, steps: list[int] | None = None,
              mode: str = "entropy", width: int = 960, fitted: bool = False) -> Path:
    """Stack the canvas at `steps` (default: 8 spread over the run) into one PNG."""
    _check(run)
    frames = [frame(run, k, mode, width, fitted=fitted) for k in (steps or strip_steps(run))]
    gap = 6
    height = sum(f.height() for f in frames) + gap * (len(frames) - 1)
    strip = QImage(width, height, QImage.Format.Format_RGB32)
    strip.fill(theme.GRID)
    p = QPainter(strip)
    y = 0
    for f in frames:
        p.drawImage(0, y, f)
        y += f.height() + gap
    p.end()
    buf = QBuffer()
    buf.open(QIODevice.OpenModeFlag.WriteOnly)
    if not strip.save(buf, "PNG"):
        raise DiffuseError(f"{path}: Qt could not encode the PNG")
    write_atomic(path, bytes(buf.data()))
    return Path(path)


def _to_pil(image: QImage):
    rgb = image.convertToFormat(QImage.Format.Format_RGB888)
    data = bytes(rgb.constBits())
    return Image.frombuffer("RGB", (rgb.width(), rgb.height()), data, "raw", "RGB",
                            rgb.bytesPerLine(), 1)


def gif(run: RunState, path: str | Path, mode: str = "entropy", frame_ms: int = 120,
        width: int = 720, max_frames: int = 240, fitted: bool = False) -> Path:
    """An animated GIF of the run, one frame per step (evenly thinned past `max_frames`);
    the last frame is held for two seconds."""
    _check(run)
    if Image is None:
        raise DiffuseError("GIF export needs Pillow (pip install Pillow)")
    steps = strip_steps(run, max_frames)
    frames = [_to_pil(frame(run, k, mode, width, cell_w=44, cell_h=22, fitted=fitted)) for k in steps]
    # One palette for every frame keeps colours steady; taken from the first, middle and last
    # frames so that both masked and decided cells are in it.
    picks = [frames[0], frames[len(frames) // 2], frames[-1]]
    sample = Image.new("RGB", (picks[0].width, sum(f.height for f in picks)))
    y = 0
    for f in picks:
        sample.paste(f, (0, y))
        y += f.height
    palette = sample.quantize(colors=255)
    frames = [f.quantize(palette=palette, dither=Image.Dither.NONE) for f in frames]
    durations = [frame_ms] * (len(frames) - 1) + [2000]
    buf = io.BytesIO()
    frames[0].save(buf, format="GIF", save_all=True, append_images=frames[1:],
                   duration=durations, loop=0, optimize=False)
    write_atomic(path, buf.getvalue())
    return Path(path)
