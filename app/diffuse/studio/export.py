"""Export a run as pictures: a PNG strip of chosen steps, or an animated GIF of every step; and
a chat conversation as Markdown (the branch on screen, to read) or JSON (every branch, as the app
keeps it).

Each picture says what it shows: a header with the prompt, the model, the options (seed
included) and the colour scale with its numbers (and the threshold's mark, for a threshold
rule); under it, each frame is the denoising canvas (`canvas.paint_cells`) under a one-line
caption. Qt writes PNG; GIF needs Pillow (Qt has no GIF writer; without Pillow only the GIF
export is refused). Files are written atomically, never into the app's own folder (its
conversations, recordings and settings are the inputs). Drawing uses QImage only, so exports may
run on a worker thread. `suggested_name` is the file name save dialogs offer.
"""
from __future__ import annotations

import io
import re
import time
from pathlib import Path

import numpy as np
from PySide6.QtCore import QBuffer, QIODevice, QRect, QRectF, Qt
from PySide6.QtGui import QFontMetrics, QImage, QPainter

from diffuse import DiffuseError
from diffuse.recording import write_atomic
from diffuse.studio import storage, theme
from diffuse.studio.canvas import (CellLayout, ColorScale, color_scale, paint_cells, paint_legend,
                                   scale_name)
from diffuse.studio.conversations import Conversation
from diffuse.studio.run_state import EDIT_MARK, TAU_MARK, RunState, options_text

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


def suggested_name(run: RunState | None, suffix: str) -> str:
    """A file name for the run: when it was made, the prompt's first words and the scheduler,
    e.g. "2026-12-02_1530_tell-me-about-mr-darcy_entropy_exit.png"; "" without a run."""
    if run is None or not run.events:
        return ""
    when = time.strftime("%Y-%m-%d_%H%M", time.localtime(run.recording.created))
    words = re.sub(r"[^a-z0-9]+", "-", run.prompt.lower()).strip("-")[:40].rstrip("-")
    parts = [when, words, str(run.options.get("scheduler") or "")]
    return "_".join(p for p in parts if p) + f".{suffix}"


def header_lines(run: RunState) -> list[str]:
    """The header's text: prompt, model, options, and what the threshold's mark means."""
    model = run.recording.model
    lines = [f"prompt: {' '.join(run.prompt.split())}",
             f"model: {model.get('name', '?')} ({model.get('arch', '?')})",
             f"options: {options_text(run.options)}"]
    if run.rule is not None:       # the canvas's mark of tau's commits
        lines.append(f"{TAU_MARK} white corner: committed by τ ({run.rule.condition()}), past "
                     f"what the rule commits anyway")
    if run.edits:                  # the canvas's mark of editing's replacements
        lines.append(f"{EDIT_MARK} violet corner: a token editing replaced ({len(run.edits)} edits)")
    return lines


def header(run: RunState, scale: ColorScale, width: int) -> QImage:
    """What every export shows above its frames: prompt (at most two lines), model, options
    (the seed included, wrapped), what the threshold's mark means, and the colour scale with
    its numbers."""
    font = theme.mono_font(8.5)
    metrics = QFontMetrics(font)
    text_w = width - 20
    lines = header_lines(run)
    lines[0] = metrics.elidedText(lines[0], Qt.TextElideMode.ElideRight, 2 * text_w - 40)
    wrap = Qt.AlignmentFlag.AlignLeft | Qt.TextFlag.TextWordWrap
    heights = [metrics.boundingRect(QRect(0, 0, text_w, 10_000), wrap, t).height() for t in lines]
    legend_h = 30
    image = QImage(width, sum(heights) + legend_h + 12, QImage.Format.Format_RGB32)
    image.fill(theme.PANEL)
    p = QPainter(image)
    p.setFont(font)
    p.setPen(theme.TEXT)
    y = 6
    for text, h in zip(lines, heights):
        p.drawText(QRectF(10, y, text_w, h), wrap, text)
        y += h
    y += 4
    what = "entropy (nats)" if scale.mode == "entropy" else "top-1 probability"
    p.setPen(theme.MUTED)
    p.drawText(QRectF(10, y, 250, 14), Qt.AlignmentFlag.AlignVCenter,
               f"colours: {what}, {scale_name(scale.fitted)}")
    paint_legend(p, QRectF(260, y, 300, legend_h - 2), scale, 8.0)
    p.end()
    return image


def frame(run: RunState, step: int, mode: str = "entropy", width: int = 960,
          cell_w: int = 52, cell_h: int = 26, fitted: bool = False) -> QImage:
    """The canvas at `step` with a caption line: step, block, masked count, the step's commits
    (a threshold rule: the schedule's and tau's), colour scale (`fitted`: fitted to the run's
    own values, as the canvas shows them)."""
    layout = CellLayout(run.gen_length, width, cell_w, cell_h, margin=8)
    image = QImage(width, CAPTION_H + layout.height, QImage.Format.Format_RGB32)
    image.fill(theme.BG)
    p = QPainter(image)
    e = run.events[step]
    p.setPen(theme.TEXT)
    font = theme.mono_font(9)
    p.setFont(font)
    caption = (f"{run.step_label(step)}   block {e.block + 1}/{e.n_blocks}   "
               f"{int(run.shown(step)[1].sum())} masked   {run.commits_text(step)}")
    p.drawText(QRectF(10, 0, width - 20, CAPTION_H), Qt.AlignmentFlag.AlignVCenter,
               QFontMetrics(font).elidedText(caption, Qt.TextElideMode.ElideRight, width - 20))
    p.translate(0, CAPTION_H)
    paint_cells(p, layout, run, step, mode, scale=color_scale(run, mode, fitted))
    p.end()
    return image


def _stack(parts: list[QImage], gap: int) -> QImage:
    """Images of one width, one under the other."""
    image = QImage(parts[0].width(), sum(f.height() for f in parts) + gap * (len(parts) - 1),
                   QImage.Format.Format_RGB32)
    image.fill(theme.GRID)
    p = QPainter(image)
    y = 0
    for f in parts:
        p.drawImage(0, y, f)
        y += f.height() + gap
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
    strip = _stack([header(run, color_scale(run, mode, fitted), width)] + frames, gap=6)
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
    top = header(run, color_scale(run, mode, fitted), width)
    frames = [_to_pil(_stack([top, frame(run, k, mode, width, cell_w=44, cell_h=22, fitted=fitted)], gap=0))
              for k in steps]
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


CONVERSATION_FORMATS = {"md": "Markdown", "json": "JSON"}


def conversation_name(conv: Conversation) -> str:
    """A file name stem for the conversation: its date and its title's first words."""
    when = time.strftime("%Y-%m-%d", time.localtime(conv.created))
    words = re.sub(r"[^a-z0-9]+", "-", conv.title.lower()).strip("-")[:40].rstrip("-")
    return f"{when}_{words or 'conversation'}"


def conversation_markdown(conv: Conversation) -> str:
    """The branch on screen as Markdown: the system prompt, then each turn under a heading;
    an answer's heading names its model, seed and steps, so it can be repeated."""
    lines = [f"# {conv.title}", "",
             f"*Diffuse Studio conversation, {time.strftime('%Y-%m-%d %H:%M', time.localtime(conv.created))}*", ""]
    if conv.system.strip():
        lines += ["## System prompt", "", conv.system.strip(), ""]
    for m in conv.branch():
        if m.role == "user":
            title = "You" + (" (run failed, not sent again)" if "failed" in m.meta else "")
        else:
            opts = m.meta.get("options") or {}
            facts = [f"seed {opts['seed']}" if opts.get("seed") is not None else "",
                     f"{m.meta['steps']}/{m.meta.get('steps_allowed', '?')} steps" if "steps" in m.meta else "",
                     str(opts.get("scheduler") or "")]
            title = " · ".join([m.meta.get("model") or "Answer"] + [f for f in facts if f])
        lines += [f"## {title}", "", m.text if m.text.strip() else "*(no text)*", ""]
    return "\n".join(lines)


def save_conversation(conv: Conversation, path: str | Path) -> Path:
    """Write `conv` to `path`, Markdown or JSON by its suffix, atomically; never into the app's
    own folder, where it would replace the conversations and recordings it was made from."""
    path = Path(path)
    kind = path.suffix.lower().lstrip(".")
    if kind not in CONVERSATION_FORMATS:
        raise DiffuseError(f"{path}: a conversation exports as .md (Markdown) or .json")
    home = storage.home_dir().resolve()
    if path.resolve().is_relative_to(home):
        raise DiffuseError(f"{path}: that is the app's own folder ({home}); pick another place")
    data = conv.to_json() if kind == "json" else conversation_markdown(conv).encode("utf-8")
    write_atomic(path, data)
    return path
