"""Where diffusion wins on this machine: `diffuse bench knee`'s result drawn (docs/benchmarks.md
section 15).

Left: the cost of a pass over w new rows (1..32), in decode tokens of the same weights, one curve
per cache depth, beside y = 1 (one decode token) and y = w (w rows costing w decode tokens: no
work shared between the rows). Right: each family's speed against AR decode at its published
tokens per forward, a bar per depth from the low rate to the high one, beside y = 1 (AR decode).
The caption says where every figure comes from: the passes measured on which file, machine, date,
load, threads and rounds (now, or the JSON file opened; files older than the machine fields name
none), and each family's rate with its source. A DiffusionGemma result has no decode-token unit:
its canvas step and encoder pass in ms are in the caption, the cost plot says why it is empty. The view only
draws; the Benchmarks window runs the measurement and opens the files.
"""
from __future__ import annotations

import html
import json
import math
from pathlib import Path

import pyqtgraph as pg
from PySide6.QtCore import Qt
from PySide6.QtWidgets import QHBoxLayout, QLabel, QVBoxLayout, QWidget

from diffuse.bench.knee import range_values
from diffuse.studio import theme

DEPTH_COLORS = (theme.ACCENT, theme.ACTIVE, theme.EDITED, theme.CACHED, theme.DIFF)


def read_result(path: Path) -> dict:
    """A saved `bench knee --json` result; ValueError saying, in one line, what is wrong."""
    try:
        result = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as e:
        raise ValueError(f"{path}: cannot read it ({e.strerror or e})") from None
    except ValueError:
        raise ValueError(f"{path}: not JSON") from None
    passes = result.get("passes") if isinstance(result, dict) else None
    canvas = result.get("canvas") if isinstance(result, dict) else None
    if not (_rows(passes, ("depth", "w", "tokens")) or passes == [] and _rows(canvas, ("depth", "w", "ms"))):
        raise ValueError(f"{path}: not a bench knee result (no passes with depth, w and tokens)")
    families = result.get("families", [])
    if not isinstance(families, list) or not all(isinstance(f, dict) and isinstance(f.get("family"), str)
                                                 for f in families):
        raise ValueError(f"{path}: its families are not bench knee's rows")
    return result


def _rows(rows, keys: tuple[str, ...]) -> bool:
    """A non-empty list of dicts with a positive number under each key."""
    return isinstance(rows, list) and bool(rows) and all(
        isinstance(r, dict) and all(_number(r.get(k)) for k in keys) for r in rows)


def _number(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) and x > 0


class KneeView(QWidget):
    def __init__(self, parent=None):
        super().__init__(parent)
        self.result: dict | None = None
        self._items: list[tuple[pg.PlotWidget, object]] = []    # what the result drew, removed before the next
        self.cost_plot = self._plot("cost in decode tokens", "rows per pass (w)")
        self.speed_plot = self._plot("speed against AR decode (×)", "family (numbered below)")
        self.cost_empty = theme.EmptyState(self.cost_plot.getPlotItem(),
                                           "Pass cost in decode tokens\n(run bench knee or open its JSON)")
        self.speed_empty = theme.EmptyState(self.speed_plot.getPlotItem(),
                                            "Each family's speed against AR decode\n(run bench knee or open its JSON)")
        self.source = QLabel()
        self.source.setObjectName("Muted")
        self.source.setWordWrap(True)
        self.source.setTextFormat(Qt.TextFormat.RichText)
        self.source.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        plots = QHBoxLayout()
        plots.addWidget(self.cost_plot)
        plots.addWidget(self.speed_plot)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.addLayout(plots, 1)
        layout.addWidget(self.source)
        self.show_result(None)

    def _plot(self, ylabel: str, xlabel: str) -> pg.PlotWidget:
        plot = pg.PlotWidget()
        plot.setMenuEnabled(False)
        plot.setLabel("left", ylabel)
        plot.setLabel("bottom", xlabel)
        plot.showGrid(y=True, alpha=0.15)
        return plot

    def show_result(self, result: dict | None, where: str = "") -> None:
        """Draw `result` (bench knee's), measured `where` ("now", or the file it came from)."""
        self.result = result
        for plot, item in self._items:       # not plot.clear(): the empty-state note is an item too
            plot.removeItem(item)
        self._items = []
        for plot in (self.cost_plot, self.speed_plot):
            plot.setTitle(None)
        canvas = result is not None and not result["passes"]     # DiffusionGemma: no decode-token unit
        self.cost_empty.show(result is None or canvas, self.cost_empty.idle if not canvas else
                             "No cost in decode tokens for this model\n(its canvas step in ms is below)")
        self.speed_empty.show(result is None or not self._speeds(result), self.speed_empty.idle if result is None
                              else "No speed against AR decode to draw\n(no family's rate over a cost measured here)")
        if result is None:
            self.source.setText("")
            return
        depths = sorted({p["depth"] for p in result["passes"]})
        colors = {d: DEPTH_COLORS[i % len(DEPTH_COLORS)] for i, d in enumerate(depths)}
        if not canvas:
            self._draw_costs(result, depths, colors)
        families = self._draw_speeds(result, depths, colors)
        self.source.setText(self._source_text(result, where, families))

    def _draw_costs(self, result: dict, depths: list[int], colors: dict) -> None:
        plot = self.cost_plot
        widths = sorted({p["w"] for p in result["passes"]})
        x = [math.log2(w) for w in widths]           # rows double from tick to tick
        plot.getAxis("bottom").setTicks([[(math.log2(w), str(w)) for w in widths]])
        self._add(plot, pg.PlotDataItem(x, [1.0] * len(x), pen=pg.mkPen(theme.MUTED, width=1,
                                                                        style=Qt.PenStyle.DashLine)))
        self._add(plot, pg.PlotDataItem(x, widths, pen=pg.mkPen(theme.MUTED, width=1, style=Qt.PenStyle.DotLine)))
        for d in depths:
            rows = sorted((p["w"], p["tokens"]) for p in result["passes"] if p["depth"] == d)
            self._add(plot, pg.PlotDataItem([math.log2(w) for w, _ in rows], [t for _, t in rows],
                                            pen=pg.mkPen(colors[d], width=2), symbol="o", symbolBrush=colors[d],
                                            symbolPen=None, symbolSize=6))
        legend = [(f"depth {d}", colors[d]) for d in depths]
        plot.setTitle(theme.legend_html(legend, glyph="━") + "<br>" + theme.legend_html(
            [("1 decode token", theme.MUTED)], glyph="╌") + " &nbsp; " + theme.legend_html(
            [("w tokens: nothing shared", theme.MUTED)], glyph="┈"), size="8pt")
        plot.enableAutoRange()

    def _add(self, plot: pg.PlotWidget, item) -> None:
        plot.addItem(item)
        self._items.append((plot, item))

    @staticmethod
    def _speeds(result: dict) -> dict[str, dict[int, tuple[float, float]]]:
        """family -> depth -> (speed at the low rate, at the high one), for the rows measured."""
        out: dict[str, dict[int, tuple[float, float]]] = {}
        for f in result.get("families", []):
            speed = range_values(f.get("vs_ar"))
            if speed is not None and isinstance(f.get("depth"), int):
                out.setdefault(f["family"], {})[f["depth"]] = speed
        return out

    def _draw_speeds(self, result: dict, depths: list[int], colors: dict) -> list[str]:
        """The bars; returns the families in the numbered order the axis and caption use."""
        plot = self.speed_plot
        speeds = self._speeds(result)
        families = list(dict.fromkeys(f["family"] for f in result.get("families", [])))
        if not speeds:
            return families
        bar = 0.8 / len(depths)
        for j, d in enumerate(depths):
            xs, lo, hi = [], [], []
            for i, name in enumerate(families):
                if d in speeds.get(name, {}):
                    xs.append(i + 1 - 0.4 + bar * (j + 0.5))
                    lo.append(speeds[name][d][0])
                    hi.append(speeds[name][d][1])
            if not xs:
                continue
            # the bar spans the published range; its low end is marked (a single rate: a line)
            fill = pg.mkColor(colors[d])
            fill.setAlpha(110)
            self._add(plot, pg.BarGraphItem(x=xs, y0=lo, y1=hi, width=bar * 0.9, brush=fill,
                                            pen=pg.mkPen(colors[d])))
        self._add(plot, pg.InfiniteLine(pos=1.0, angle=0, pen=pg.mkPen(theme.HIGHLIGHT, width=1,
                                                                        style=Qt.PenStyle.DashLine)))
        plot.getAxis("bottom").setTicks([[(i + 1, str(i + 1)) for i in range(len(families))]])
        plot.setTitle(theme.legend_html([(f"depth {d}", colors[d]) for d in depths]) + " &nbsp; "
                      + theme.legend_html([("AR decode (1×)", theme.HIGHLIGHT)], glyph="╌"), size="8pt")
        plot.setXRange(0.4, len(families) + 0.6, padding=0)
        plot.setYRange(0, max(max(h for s in speeds.values() for _, h in s.values()), 1.0) * 1.1, padding=0)
        return families

    def _source_text(self, result: dict, where: str, families: list[str]) -> str:
        name = Path(str(result.get("model", "?"))).name
        made = f"measured now on {name}" if where == "now" else f"from {Path(where).name} (measured on {name})"
        lines = [f"<b>Pass costs</b> {html.escape(made)}{html.escape(self._machine_text(result))}: "
                 f"{result.get('threads', '?')} threads, median of {result.get('reps', '?')} alternated rounds"
                 + ("" if result.get("canvas") else "; one decode token is this engine's 1-row pass at that depth")
                 + (" (cancelled: the depths measured by then)" if result.get("cancelled") else "") + "."]
        if result.get("canvas"):
            lines.append(html.escape(str(result.get("note", ""))))
            lines += [html.escape(f"Context {r['depth']}: canvas step {r['ms']:.1f} ms over {r['w']} rows "
                                  f"({r['ms'] / r['w']:.2f} ms a row), encoder "
                                  + (f"{r['encoder_ms']:.1f} ms" if _number(r.get("encoder_ms")) else "?"))
                      for r in result["canvas"]]
        lines.append("<b>Speeds</b>: each family's published tokens per forward over that cost (the rates are the "
                     "papers', for their own models; the costs this file's):")
        sources = {f["family"]: f for f in result.get("families", [])}
        for i, name in enumerate(families):
            f = sources[name]
            rate = str(f.get("tokens_per_pass", "?"))
            rate = ("no tokens per pass to draw" if rate in ("not measured", "not published")
                    else f"{rate} tokens per pass")
            lines.append(f"{i + 1}. {html.escape(name)}: {html.escape(rate)}, {f.get('w', '?')} rows x "
                         f"{f.get('passes', '?')} pass(es); {html.escape(str(f.get('source', '?')))}")
        return "<br>".join(lines)

    @staticmethod
    def _machine_text(result: dict) -> str:
        """Where and when (bench knee's JSON since it records them; older files say nothing)."""
        m, when, load = result.get("machine"), result.get("when"), result.get("load_average")
        parts = []
        if isinstance(m, dict) and m.get("cpu"):
            parts.append(f"{m['cpu']}, {m.get('cores', '?')} cores")
        if isinstance(when, str):
            parts.append(when)
        if isinstance(load, list) and len(load) == 2 and all(_number(x) or x == 0 for x in load):
            parts.append(f"load {load[0]:.1f} -> {load[1]:.1f}")
        return f" ({'; '.join(parts)})" if parts else ""
