"""Compare mode: one prompt, two settings, side by side.

The two runs go one after the other on the same engine (running them at once would make each
slower and the timing meaningless). Both take the loaded model and the main window's settings
with one seed (the Settings', or one drawn once for the pair and shown), and what the pair sets
(compare_pairs: what each isolates, and the headline its runs support). One step slider moves
both canvases, their step figures and answers together; past the end of the shorter run, that
side shows its final state and says so. Both canvases share one colour scale, mode and fit. When
both are done a headline states the pair's point as measured, over every figure, and the
positions where the answers differ are outlined in both canvases and texts. Results of another
model than the loaded one are cleared when the model changes, and the menu offers the pairs the
model can run. The window opens over the main window, no larger than it (nor than the screen, nor
smaller than its own content needs); Esc closes it.
"""
from __future__ import annotations

import html

import numpy as np
from PySide6.QtCore import Qt, QTimer
from PySide6.QtGui import QAction, QKeySequence
from PySide6.QtWidgets import (QComboBox, QGridLayout, QHBoxLayout, QLabel, QLineEdit,
                               QPushButton, QTextBrowser, QVBoxLayout, QWidget)

from diffuse.generation import random_seed
from diffuse.studio import theme
from diffuse.studio.canvas import CanvasPanel, display_text
from diffuse.studio.compare_pairs import PRESETS, Pair, answer_diff, headline, summary_lines
from diffuse.studio.run_controller import RunController
from diffuse.studio.run_state import TAU_MARK, RunState, options_text, step_number
from diffuse.studio.timeline import Timeline

SIZE = (1400, 820)      # the most the window takes; less on a smaller screen


def shared_text(model: str, options: dict, pair: Pair, seed: int | None) -> str:
    """The model and the settings both runs take from the main window (the values left to the
    model, "auto", are not listed), what the pair sets for both, and the seed they share."""
    shared = options_text({k: v for k, v in options.items() if k not in pair.varied | {"seed"}})
    if options.get("seed") is not None:
        seed_said = f"seed {options['seed']} (the Settings') for both"
    elif seed is not None:
        seed_said = f"seed {seed} for both, drawn for this pair (the Settings leave it unset)"
    else:
        seed_said = "one seed for both, drawn when the pair runs (the Settings leave it unset)"
    extra = pair.shared_text()
    return (f"Model: {model or 'none loaded'} · both runs use the Settings tab: "
            f"{shared or 'the model defaults'} · {seed_said}{' · ' + extra if extra else ''}")


def answer_html(run: RunState, diff: np.ndarray | None, step: int = -1) -> str:
    """The tokens at `step` (-1: the last) up to end of text, masks as ░, differing positions
    marked."""
    e = run.events[run.clamp(step)]
    out = []
    for i, (tid, masked) in enumerate(zip(e.gen_tokens.tolist(), e.gen_mask.tolist())):
        if not masked and tid in run.eos_ids:
            break
        text = "░" if masked else run.piece(tid)
        shown = html.escape(text).replace("\n", "<br>")
        if diff is not None and i < diff.shape[0] and diff[i]:
            shown = (f"<span style='background-color:#5a2530; color:#ffd0da' "
                     f"title='position {i}'>{shown or display_text(text)}</span>")
        out.append(shown)
    return "".join(out)


def diff_legend(runs: list[RunState]) -> str:
    """The marks under the canvases; τ's only where a shown run commits by a threshold rule (not AR
    against self-speculation, say)."""
    def mark(glyph: str, color, meaning: str) -> str:
        return f"<span style='color:{color.name()}'>{glyph}</span> {meaning}"

    entries = [mark("┅┅", theme.DIFF, "the answers differ at this position")]
    if any(run.rule is not None for run in runs):
        entries.append(mark(TAU_MARK, theme.HIGHLIGHT, "committed by τ"))
    entries.append(mark("○", theme.HIGHLIGHT, "committed at the shown step"))
    return " &nbsp; ".join(entries)


class _Side(QWidget):
    def __init__(self, letter: str):
        super().__init__()
        self.letter = letter
        self.run: RunState | None = None
        self.title = QLabel(letter)
        self.title.setObjectName("Title")
        self.title.setWordWrap(True)
        self.canvas = CanvasPanel(cell_w=44, cell_h=24)
        self.step_info = QLabel()        # the shown step's figures, or where the run ended
        self.step_info.setObjectName("Muted")
        self.step_info.setWordWrap(True)
        self.stats = QLabel()            # the whole run's
        self.stats.setObjectName("Muted")
        self.stats.setWordWrap(True)
        self.text = QTextBrowser()
        self.text.setMaximumHeight(72)
        self.shared: list[RunState] | None = None     # the runs its colour scale spans
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.addWidget(self.title)
        layout.addWidget(self.canvas, 1)
        layout.addWidget(self.step_info)
        layout.addWidget(self.stats)
        layout.addWidget(self.text)

    def set_run(self, run: RunState | None) -> None:
        self.run = run
        self.canvas.set_run(run)
        self.step_info.clear()
        self.stats.setText("waiting…" if run is not None else "")
        self.text.clear()

    def show_step(self, step: int, diff: np.ndarray | None = None) -> None:
        """Step `step` of the slider: this run's, or past its end its final state, said so."""
        run = self.run
        if run is None or not run.events:
            return
        self.canvas.canvas.share_scale(self.shared)
        self.canvas.canvas.set_diff(diff)
        shown = run.clamp(step)
        self.canvas.show_step(shown)
        if step > shown and run.done:
            self.step_info.setText(f"{self.letter} ended after {run.n_steps} steps: past its "
                                   f"end, its final state")
        elif step > shown:
            self.step_info.setText(f"{self.letter} is at step {run.n_steps}")
        else:
            cache = run.cache[shown]
            rows = f"{(cache == 2).sum()} of {cache.size} rows computed"
            if (cache == 1).any():
                rows += f", {(cache == 1).sum()} from the cache"
            self.step_info.setText(f"{run.step_label(shown)}: {run.step_ms[shown]:.1f} ms · {rows}")
        res = run.result
        if res is not None:
            self.stats.setText(
                f"whole run: {res.steps}/{res.steps_allowed} steps · {res.total_ms / 1000:.2f} s · "
                f"{res.useful_tokens_per_s:.1f} answer tok/s · {res.stop_reason}")
        else:
            self.stats.setText("running…")
        self.text.setHtml(answer_html(run, diff, shown))

    def clear(self) -> None:
        self.shared = None
        self.canvas.canvas.share_scale(None)
        self.canvas.canvas.set_diff(None)
        self.set_run(None)


class CompareWindow(QWidget):
    """Needs the window's run controller (a pair holds the model across both of its runs) and
    callables giving the current generation options and the model's facts."""

    def __init__(self, runs: RunController, base_options, model_info, parent=None):
        super().__init__(parent, Qt.WindowType.Window)
        self.setWindowTitle("Diffuse Studio · compare")
        self.controller = runs          # (self.runs is the pair of RunStates shown)
        self.engine = engine = runs.engine
        self.base_options = base_options
        self.model_info = model_info
        self.runs: list[RunState] = []
        self._queue: list[RunState] = []
        self.seed: int | None = None     # the seed the shown runs share
        self.ran: Pair | None = None     # the pair of the shown runs (the menu may have moved on)
        self.diff: np.ndarray | None = None

        self.prompt = QLineEdit()
        self.prompt.setPlaceholderText("Prompt for both runs")
        self.prompt.returnPressed.connect(self.start)
        self.preset = QComboBox()
        self.preset.addItems(list(PRESETS))
        self.preset.setToolTip("What A and B differ in")
        self.preset.currentIndexChanged.connect(self._update_titles)
        self.run_button = QPushButton("Run both")
        self.run_button.setObjectName("Primary")
        self.run_button.clicked.connect(self.start)
        self.stop_button = QPushButton("Stop")
        self.stop_button.setObjectName("Danger")
        self.stop_button.clicked.connect(self.stop)
        top = QHBoxLayout()
        top.addWidget(self.prompt, 1)
        top.addWidget(self.preset)
        top.addWidget(self.run_button)
        top.addWidget(self.stop_button)
        self.context = QLabel()      # the model and the shared settings
        self.context.setObjectName("Muted")
        self.context.setWordWrap(True)
        self.sides = (_Side("A"), _Side("B"))
        # One colour scale for both: a mode or fit chosen on one side is the other's too
        for one, other in (self.sides, self.sides[::-1]):
            one.canvas.scale_changed.connect(other.canvas.set_fitted)
            one.canvas.mode_changed.connect(other.canvas.set_mode)
        self.timeline = Timeline()      # one slider for both runs
        self.timeline.slider.setToolTip("The step both sides show; drag to scrub through both runs")
        self.timeline.slider.valueChanged.connect(self._show_step)
        self.diff_legend = QLabel(diff_legend([]))
        self.diff_legend.setObjectName("Muted")
        self.diff_legend.setWordWrap(True)
        grid = QGridLayout()
        grid.setHorizontalSpacing(6)
        grid.addWidget(self.sides[0], 0, 0)
        grid.addWidget(self.sides[1], 0, 1)
        self.headline = QLabel()       # the finished pair's point, in bold over its figures
        self.headline.setStyleSheet("font-weight: bold;")
        self.headline.setWordWrap(True)
        self.headline.hide()
        self.summary = QLabel("Pick a comparison and run it; the two runs go one after the other.")
        self.summary.setObjectName("Muted")
        self.summary.setWordWrap(True)
        self.summary.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(6, 6, 6, 6)      # two canvas headers side by side fit 1024 px
        layout.addLayout(top)
        layout.addWidget(self.context)
        layout.addLayout(grid, 1)
        layout.addWidget(self.timeline)
        layout.addWidget(self.diff_legend)
        layout.addWidget(self.headline)
        layout.addWidget(self.summary)
        self._fit_to_screen()

        self._dirty = False
        self._timer = QTimer(self)
        self._timer.setInterval(33)
        self._timer.timeout.connect(self._refresh)
        self._timer.start()
        engine.run_stepped.connect(self._stepped)
        engine.run_finished.connect(self._finished)
        engine.run_failed.connect(self._failed)
        self.controller.holder_changed.connect(self._holder_changed)
        # Esc closes the window as it would a dialog, whichever of its widgets has the focus
        close = QAction("Close", self)
        close.setShortcut(QKeySequence(Qt.Key.Key_Escape))
        close.setShortcutContext(Qt.ShortcutContext.WindowShortcut)
        close.triggered.connect(self.close)
        self.addAction(close)
        self._update_titles()
        self._holder_changed()

    def _fit_to_screen(self) -> None:
        """At most SIZE, within the screen's free area (taskbars and docks left out) with room
        for the title bar, and no larger than the main window it opens over; never smaller than
        its content needs, so every button stays on screen."""
        area, least = self.screen().availableGeometry(), self.minimumSizeHint()
        room_w, room_h = int(area.width() * 0.96), int(area.height() * 0.92)
        over = self.parentWidget().window() if self.parentWidget() is not None else None
        if over is not None and over.isVisible():
            room_w, room_h = min(room_w, over.width()), min(room_h, over.height())
        width = min(SIZE[0], max(room_w, least.width()), area.width())
        height = min(SIZE[1], max(room_h, least.height()), area.height())
        self.resize(width, height)
        if over is not None and over.isVisible():     # centred over the main window, on screen
            centre = over.frameGeometry().center()
            x, y = centre.x() - width // 2, centre.y() - height // 2
        else:
            x, y = area.x() + (area.width() - width) // 2, area.y() + (area.height() - height) // 3
        self.move(min(max(x, area.x()), area.right() + 1 - width), min(max(y, area.y()), area.bottom() + 1 - height))

    def pair(self) -> Pair:
        return PRESETS[self.preset.currentText()]

    def _update_titles(self) -> None:
        self._set_titles()
        self.update_context()

    def _set_titles(self) -> None:
        """The titles of the runs shown, with the tau each used (B's comes from the Settings or
        the model), and the legend of their marks; without runs, of the pair picked."""
        pair = self.ran if self.runs else self.pair()
        self.diff_legend.setText(diff_legend(self.runs))
        runs = self.runs or [None, None]
        for side, letter, name, over, run in zip(self.sides, "AB", pair.names, (pair.a, pair.b), runs):
            said = [letter, name]
            if run is not None and run.events and run.rule is not None:
                said.append(run.rule.condition())
            side.title.setText(" · ".join(said))
            side.title.setToolTip(f"{letter}: {options_text(over)} over the settings both share")

    def _offer_pairs(self, arch: str | None) -> bool:
        """The menu lists the pairs a model of family `arch` can run, keeping the one picked if it
        is among them; True if the list changed."""
        names = [name for name, pair in PRESETS.items() if pair.offered(arch)]
        if names == [self.preset.itemText(i) for i in range(self.preset.count())]:
            return False
        picked = self.preset.currentText()
        self.preset.blockSignals(True)
        self.preset.clear()
        self.preset.addItems(names)
        self.preset.setCurrentIndex(names.index(picked) if picked in names else 0)
        self.preset.blockSignals(False)
        return True

    def update_context(self) -> None:
        """Show the model and shared settings now in force; drop results of another model."""
        model = self.model_info()
        name = model.get("name", "")
        if self._offer_pairs(model.get("arch")):
            self._set_titles()
        self.context.setText(shared_text(name, self.base_options(), self.pair(), self.seed))
        shown = self.runs[0].recording.model if self.runs else model
        if shown.get("path") != model.get("path") and not any(r is self.engine.run
                                                              for r in self.runs):
            self.runs, self._queue, self.diff = [], [], None
            for side in self.sides:
                side.clear()
            self.timeline.reset()
            self.timeline.set_count(0)
            self._say("", f"The results of {shown.get('name')} were cleared: the model is now "
                          f"{name or 'unloaded'}.")
            self._update_titles()

    def _say(self, point: str, text: str) -> None:
        """The headline (the finished pair's point; none while running) and the lines under it."""
        self.headline.setText(point)
        self.headline.setVisible(bool(point))
        self.summary.setText(text)

    def start(self) -> None:
        text = self.prompt.text().strip()
        if not text or self.engine.model is None or not self.controller.acquire("compare", self.stop):
            return
        self.ran, base = self.pair(), dict(self.base_options())
        # One seed for both, said in the context line: an unset one would be drawn per run
        self.seed = base.get("seed")
        if self.seed is None:
            self.seed = random_seed()
        self.update_context()
        self.runs = [RunState(text, {**options, "seed": self.seed}, self.model_info(),
                              self.engine.model.tokenizer.decode)
                     for options in self.ran.options(base)]
        self.diff = None
        for side, run in zip(self.sides, self.runs):
            side.shared = self.runs
            side.set_run(run)
        self.timeline.reset()
        self.timeline.set_count(0)
        self._queue = list(self.runs)
        self._update_titles()
        self._say("", "Running A…")
        self.controller.start("compare", self._queue.pop(0))

    def stop(self) -> None:
        self._queue.clear()
        self.engine.stop()

    def _side_of(self, run: RunState):
        for side, mine in zip(self.sides, self.runs):
            if run is mine:
                return side
        return None

    def _stepped(self, run: RunState) -> None:
        if self._side_of(run) is not None:
            self._dirty = True

    def _show_step(self, step: int) -> None:
        for side in self.sides:
            side.show_step(step, self.diff)
        n = max((r.n_steps for r in self.runs), default=0)
        self.timeline.label.setText(f"step {step_number(step)}/{n}" if n else "no run")

    def _refresh(self) -> None:
        if not self._dirty:
            return
        self._dirty = False
        self.timeline.set_count(max(r.n_steps for r in self.runs))
        self._show_step(self.timeline.step())
        self._update_titles()

    def _finished(self, run: RunState) -> None:
        if self._side_of(run) is None:
            return
        self._refresh()
        if self._queue:
            self._say("", "Running B…")
            self.controller.start("compare", self._queue.pop(0))
            return
        self.controller.release("compare")
        a, b = self.runs
        if a.result is not None and b.result is not None and a.events and b.events:
            self.diff = answer_diff(a, b)
            self.timeline.run_ended(max(a.n_steps, b.n_steps), a.result.total_ms + b.result.total_ms)
            self._show_step(self.timeline.step())
            self._say(headline(a, b, self.ran),
                      "\n".join(summary_lines(a, b, self.ran)))
        else:
            self.timeline.stop()
            self._say("", "Stopped before both runs finished.")

    def _failed(self, run: RunState, message: str) -> None:
        if self._side_of(run) is not None:
            self._queue.clear()
            self.controller.release("compare")
            self._say("", f"Run failed: {message}")

    def _holder_changed(self, *_) -> None:
        """Run both only while nothing else holds the model, with the reason in the tooltip."""
        refused = self.controller.refusal("compare")
        self.run_button.setEnabled(not refused and self.engine.model is not None)
        self.run_button.setToolTip(refused or "Run A, then B")
        self.stop_button.setEnabled(self.controller.holder == "compare")

    def keyPressEvent(self, event) -> None:
        """Esc closes it also where the window was shown without becoming the active one (the
        shortcut above needs that: some window managers, the offscreen platform): the key comes up
        from the focused field, which does not use it."""
        if event.key() == Qt.Key.Key_Escape:
            self.close()
        else:
            super().keyPressEvent(event)

    def closeEvent(self, event) -> None:
        if any(r is self.engine.run for r in self.runs):
            self.stop()
        super().closeEvent(event)
