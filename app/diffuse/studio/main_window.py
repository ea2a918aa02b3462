"""The main window: models and settings on the left, the denoising views in the middle, the
chat on the right, a step timeline under the canvas.

Every view shows one run (live or replayed) at one step. Engine signals only mark the views
dirty; a GUI timer redraws what is visible, so a fast engine never floods the GUI. Each tick
redraws one of two groups (the canvas, or the plots, chat and status bar; in turns, so neither
starves), which keeps every slice of GUI work short: the window answers input and other timers
within a few tens of ms. A move of the slider redraws the canvas group at once (it only
schedules the paint), so the slider, the timeline's label and the canvas header always agree.
"""
from __future__ import annotations

import platform
import time
from pathlib import Path

import psutil
import PySide6
from PySide6.QtCore import QCoreApplication, Qt, QTimer, Signal, qVersion
from PySide6.QtGui import QAction, QKeySequence
from PySide6.QtWidgets import (QApplication, QFileDialog, QLabel, QMainWindow, QMessageBox,
                               QScrollArea, QSizePolicy, QSplitter, QTabWidget, QVBoxLayout, QWidget)

import diffuse
from diffuse import DiffuseError
from diffuse._core import GGML_VERSION
from diffuse.events import GenerateResult
from diffuse.generation import resolve_options
from diffuse.recording import Recording
from diffuse.studio import export, first_run, storage, theme
from diffuse.studio.bench_view import BenchWindow
from diffuse.studio.cache_view import CacheView
from diffuse.studio.causal_views import SpecView, WindowView
from diffuse.studio.canvas import CanvasPanel
from diffuse.studio.chat import ChatPanel, fit_history, system_support
from diffuse.studio.compare import CompareWindow
from diffuse.studio.conversations import Conversation, Message
from diffuse.studio.experts_view import ExpertsView
from diffuse.studio.uniform_view import UniformView
from diffuse.studio.heatmap import EntropyHeatmap
from diffuse.studio.model_panel import ModelPanel
from diffuse.studio.panes import PaneToggle
from diffuse.studio.remote_dialog import connect_to_server
from diffuse.studio.run_controller import AR_MEASURE_TOKENS, RunController
from diffuse.studio.run_state import RunState
from diffuse.studio.serve_panel import ServePanel
from diffuse.studio.settings_panel import SettingsPanel
from diffuse.studio.throughput import ThroughputView
from diffuse.studio.timeline import Timeline
from diffuse.studio.view_base import STARTING
from diffuse.studio.workers import Engine, Job, cpu_busy

REFRESH_MS = 25
PLOTS_INTERVAL_S = 0.1   # the plots, chat and status during a run: 10 redraws a second are plenty
RECENT_RUNS = 15       # recordings listed under File > Recorded runs
CLOSE_WAIT_S = 0.5     # how long closing may block the GUI for a step or a job to return
SERVE_LABEL_PX = 420   # the server state in the status bar


def _scrolled(page: QWidget) -> QScrollArea:
    """A side page that scrolls when taller or wider than the panel, rather than widening it
    (the window must fit a 1024-pixel screen)."""
    scroll = QScrollArea()
    scroll.setWidgetResizable(True)
    scroll.setWidget(page)
    return scroll


def about_text() -> str:
    return (f"Diffuse Studio {diffuse.__version__} (ggml {GGML_VERSION}, Qt {qVersion()}, "
            f"PySide6 {PySide6.__version__}, Python {platform.python_version()})\n\n"
            "Watch masked diffusion language models (LLaDA, Dream) denoise an answer step by "
            "step, on your CPU.")


class MainWindow(QMainWindow):
    exported = Signal(str)          # path of a finished PNG or GIF export

    def __init__(self, engine: Engine | None = None):
        super().__init__()
        self.setWindowTitle("Diffuse Studio")
        screen = self.screen().availableGeometry()
        self.resize(min(1560, int(screen.width() * 0.96)), min(940, int(screen.height() * 0.94)))
        self.engine = engine or Engine(self)
        self.runs = RunController(self.engine, self)   # who runs the model; the runs shown
        self._probe: Job | None = None     # asks the model's template how it takes a system prompt
        self.compare_window: CompareWindow | None = None
        self.bench_window: BenchWindow | None = None
        self._dirty: set[str] = set()          # groups waiting to be redrawn: canvas, views
        self._drawn = "views"                  # the group redrawn last
        self._plots_drawn_at = 0.0             # time.monotonic() of the views' last redraw
        self._closing = False
        self._quitting = False     # the app's event loop is ending: close cannot be retried
        QApplication.instance().aboutToQuit.connect(self._about_to_quit)

        # untitled: the window fits a 1024-pixel screen
        self.canvas_panel = CanvasPanel(remember=True)
        self.timeline = Timeline()
        self.heatmap = EntropyHeatmap()
        self.cache_view = CacheView()
        self.experts_view = ExpertsView()
        self.throughput = ThroughputView()
        self.views = QTabWidget()
        self.views.addTab(self.heatmap, "Entropy heatmap")
        self.views.addTab(self.cache_view, "Cache")
        self.views.addTab(self.throughput, "Throughput")
        self.views.addTab(self.experts_view, "Experts")
        self.uniform_view = UniformView()
        self.views.addTab(self.uniform_view, "Uniform state")
        self.spec_view = SpecView(self.runs.ar_cost)
        self.spec_view.measure_requested.connect(self.measure_ar)
        self.views.addTab(self.spec_view, "Self-speculation")
        self.window_view = WindowView()
        self.views.addTab(self.window_view, "WeDLM window")
        self.views.currentChanged.connect(self._mark_dirty)
        centre_top = QWidget()
        top_layout = QVBoxLayout(centre_top)
        top_layout.setContentsMargins(0, 0, 0, 0)
        top_layout.setSpacing(0)
        top_layout.addWidget(self.canvas_panel, 1)
        top_layout.addWidget(self.timeline)
        self.centre = QSplitter(Qt.Orientation.Vertical)
        self.centre.addWidget(centre_top)
        self.centre.addWidget(self.views)
        self.centre.setSizes([470, 430])

        self.model_panel = ModelPanel()
        self.settings_panel = SettingsPanel()
        self.side_tabs = QTabWidget()
        self.side_tabs.addTab(self.model_panel, "Models")
        self.side_tabs.addTab(_scrolled(self.settings_panel), "Settings")
        self.serve_panel = ServePanel()
        self.side_tabs.addTab(_scrolled(self.serve_panel), "Serve")
        self.chat = ChatPanel()

        self.splitter = QSplitter(Qt.Orientation.Horizontal)
        self.splitter.addWidget(self.side_tabs)
        self.splitter.addWidget(self.centre)
        self.splitter.addWidget(self.chat)
        self.splitter.setStretchFactor(1, 1)
        self.splitter.setSizes([430, 760, 390])
        self.setCentralWidget(self.splitter)

        self.model_label = theme.ElidedLabel("no model")     # a long file name must not widen the window
        self.run_label = theme.SteadyLabel("")
        self.statusBar().addWidget(self.model_label, 1)
        self.statusBar().addPermanentWidget(self.run_label)
        # whether the Studio's server serves, and what: whole where there is room, elided where not
        # (it never widens the window), at most SERVE_LABEL_PX (the status messages keep the rest)
        self.serve_label = theme.ElidedLabel(self.serve_panel.state_line())
        self.serve_label.setSizePolicy(QSizePolicy.Policy.Preferred, QSizePolicy.Policy.Preferred)
        self.serve_label.setMaximumWidth(SERVE_LABEL_PX)
        self.statusBar().addPermanentWidget(self.serve_label)
        self.serve_panel.state_changed.connect(self.serve_label.setText)
        self._make_actions()

        self.engine.run_started.connect(self._run_started)
        self.engine.run_stepped.connect(self._run_stepped)
        self.engine.run_finished.connect(self._run_finished)
        self.engine.run_failed.connect(self._run_failed)
        self.engine.busy_changed.connect(self._update_actions)
        self.runs.holder_changed.connect(self._holder_changed)
        self.runs.recorded.connect(self._recorded)
        self.runs.not_recorded.connect(self._not_recorded)
        self.runs.ar_measured.connect(self._ar_measured)
        self.chat.generate_requested.connect(self.generate)
        self.chat.stop_requested.connect(self.stop)
        self.chat.replay_requested.connect(self.replay)
        self.chat.export_requested.connect(self._export_conversation_clicked)
        self.settings_panel.changed.connect(self._settings_changed)
        self._settings_changed()
        self.canvas_panel.scale_changed.connect(self.heatmap.set_fitted)
        self.heatmap.set_fitted(self.canvas_panel.canvas.fitted)
        self.model_panel.model_loaded.connect(self.set_model)
        self.serve_panel.served_step.connect(self._served_step)
        self.serve_panel.log_entry.connect(self._served_done)
        self._served_cpu: list = []      # psutil.cpu_times(percpu=True) as the followed request began
        self.model_panel.refused.connect(self._show_status)
        self.heatmap.step_clicked.connect(self.show_step)
        self.timeline.slider.valueChanged.connect(self._step_changed)

        self.chat.set_model_ready(False)
        self._timer = QTimer(self)
        self._timer.setInterval(REFRESH_MS)
        self._timer.timeout.connect(self.refresh)
        self._timer.start()
        self._restore_layout()
        self._update_actions()
        if problems := storage.take_problems():   # damaged local state found while starting: said once
            self._error("\n".join(problems))

    # -- menus --------------------------------------------------------------------------------

    def _action(self, menu, text: str, slot, shortcut: str | None = None, tip: str = ""):
        action = QAction(text, self)
        if shortcut:
            action.setShortcut(QKeySequence(shortcut))
        action.setToolTip(tip or text)
        action.triggered.connect(slot)
        menu.addAction(action)
        return action

    def _make_actions(self) -> None:
        bar = self.menuBar()
        file = bar.addMenu("&File")
        self.open_action = self._action(file, "Open run…", self._open_clicked, "Ctrl+O",
                                        "Replay a recorded run (.npz)")
        self.connect_action = self._action(
            file, "Connect to server…", self._connect_clicked,
            tip="Run a model of an OpenAI-compatible server: diffuse serve shows every step, "
                "llama.cpp, vLLM or SGLang stream the answer's text")
        self.recent_menu = file.addMenu("Recorded runs")
        self.recent_menu.setToolTipsVisible(True)
        self.recent_menu.aboutToShow.connect(self._list_recent_runs)
        self.save_action = self._action(file, "Save run as…", self._save_clicked, "Ctrl+S",
                                        "Record the shown run to a file")
        file.addSeparator()
        self.png_action = self._action(file, "Export PNG strip…", self._png_clicked, "Ctrl+E")
        self.gif_action = self._action(file, "Export animated GIF…", self._gif_clicked,
                                       "Ctrl+Shift+E")
        self._action(file, "Export conversation…", self._export_conversation_clicked,
                     tip="Save the chat's conversation as Markdown or JSON")
        file.addSeparator()
        self._action(file, "Quit", self.close, "Ctrl+Q")
        run = bar.addMenu("&Run")
        # The chat's prompt box owns Ctrl+Return (a second binding would make both dead): the
        # menu only names it.
        self.generate_action = self._action(run, "Generate\tCtrl+Return", self.chat.submit,
                                            tip="Generate an answer to the chat's prompt")
        self.stop_action = self._action(run, "Cancel", self.stop, "Esc", "Stop the run after the current step")
        self.compare_action = self._action(run, "Compare two settings…", self.open_compare,
                                           "Ctrl+K")
        self._action(run, "Benchmarks…", self.open_benchmarks,
                     tip="Sweep steps, cache, block length or batch size and plot the speed")
        view = bar.addMenu("&View")
        for mode in ("entropy", "confidence"):
            self._action(view, f"Colour cells by {mode}",
                         lambda checked=False, m=mode: self.canvas_panel.set_mode(m))
        self._action(view, "Play / pause the timeline",
                     self.timeline.play_button.toggle, "Space")
        self._action(view, "Step back", self.timeline.back, "Ctrl+Left")
        self._action(view, "Step forward", self.timeline.forward, "Ctrl+Right")
        # Esc too, but never at once with Cancel: this one only while nothing runs
        self.stop_replay_action = self._action(view, "Stop the replay", self.stop, "Esc",
                                               "Stop playing the steps and show the last one")
        view.addSeparator()
        # Ctrl+Tab changes tabs anywhere, the prompt box included (it would type a tab there).
        self._action(view, "Next tab", lambda: self._cycle_tabs(1), "Ctrl+Tab",
                     "The next tab of the side panel when it has the focus, else of the plots")
        self._action(view, "Previous tab", lambda: self._cycle_tabs(-1), "Ctrl+Shift+Tab")
        view.addSeparator()
        self.pane_toggles = []       # panels that collapse, for small screens
        for text, keys, splitter, index in (("Models and settings panel", "Ctrl+1", self.splitter, 0),
                                             ("Plots under the canvas", "Ctrl+2", self.centre, 1),
                                             ("Chat panel", "Ctrl+3", self.splitter, 2)):
            action = QAction(text, self)
            action.setShortcut(QKeySequence(keys))
            view.addAction(action)
            self.pane_toggles.append(PaneToggle(action, splitter, index))
        help_menu = bar.addMenu("&Help")
        self._action(help_menu, "Getting real models…",
                     lambda checked=False: first_run.open_for(self),
                     tip="LLaDA-8B and Dream-7B: sizes, RAM, and how to convert or download them")
        self._action(help_menu, "About Diffuse Studio", self._about)

        tools = self.addToolBar("Main")
        tools.setMovable(False)
        for action in (self.open_action, self.save_action, self.png_action, self.gif_action,
                       self.compare_action, self.stop_action):
            tools.addAction(action)

    def _cycle_tabs(self, step: int) -> None:
        focus = QApplication.focusWidget()
        tabs = self.side_tabs if focus is not None and self.side_tabs.isAncestorOf(focus) else self.views
        tabs.setCurrentIndex((tabs.currentIndex() + step) % tabs.count())

    def _update_actions(self) -> None:
        has_run = self.run is not None and bool(self.run.events)
        busy = self.engine.busy
        self.save_action.setEnabled(has_run and self.run.done)
        self.png_action.setEnabled(has_run and self.run.done)
        self.gif_action.setEnabled(has_run and self.run.done)
        running = self.runs.busy or busy
        self.stop_action.setEnabled(running)         # a replay is not a run: Cancel has nothing to stop
        self.stop_replay_action.setEnabled(self.timeline.playing and not running)
        refused = self.runs.refusal("chat")
        self.generate_action.setEnabled(not busy and not refused and self.engine.model is not None)
        self.generate_action.setToolTip(refused or "Generate an answer to the chat's prompt")
        steps = self.engine.model is not None and getattr(self.engine.model, "steps_sent", True)
        self.compare_action.setEnabled(steps)
        self.compare_action.setToolTip("Compare two settings on one prompt" if steps or self.engine.model is None
                                       else "The server sends no steps: there is nothing to compare")
        self.connect_action.setEnabled(not self.runs.busy and not busy)
        self.open_action.setEnabled(not busy)
        self.recent_menu.setEnabled(not busy)

    # The runs shown are the run controller's; the window names them as its views see them.
    @property
    def run(self) -> RunState | None:
        """The run the views show."""
        return self.runs.shown

    @property
    def live(self) -> RunState | None:
        """The chat's run, while it goes."""
        return self.runs.live

    @live.setter
    def live(self, run: RunState | None) -> None:
        self.runs.live = run

    @property
    def served(self) -> tuple[object, RunState] | None:
        """(serve Job, its run): the served request the views follow."""
        return self.runs.served

    # -- model and runs -----------------------------------------------------------------------

    def set_model(self, model) -> None:
        """A model loaded from a file, or a server's (remote_dialog.StudioRemoteModel): the
        server applies its own chat template, and one that sends text only streams it to the
        chat while the views say why they stay empty."""
        self.engine.model = model
        remote = getattr(model, "remote", False)
        name = Path(model.path).name
        self.model_label.setText(model.status_text() if remote else f"{name} · {model.arch}")
        # Auto means the model's defaults: the recipe in its file over its family's. A server
        # that does not say its family keeps its own defaults, which no note claims to know.
        self.settings_panel.show_defaults(model.arch or None, model.n_ctx_train or None, model.recipe,
                                          getattr(model, "hparams", None))
        if model.recipe_problem:
            self._show_status(model.recipe_problem)
        note = model.views_note() if remote else ""
        for view in (self.canvas_panel, self.heatmap, self.cache_view, self.throughput, self.experts_view,
                     self.spec_view, self.window_view):
            view.set_no_steps("" if getattr(model, "steps_sent", True) else note)
        if remote:
            self._probe = None          # a file's template probe still going answers for nothing
            self.model_panel.unload()
            self.chat.set_system_support("server")
            model.text_arrived.connect(self._text_arrived)
            if note:
                self._show_status(note)
        else:
            self._probe_system_support(model)
            self.serve_panel.set_model(model)     # the Studio serves files, not another server's model
        self.chat.set_model_ready(True, name, demo=Path(model.path) == storage.demo_model())
        if self.compare_window is not None:
            self.compare_window.update_context()
        self._update_actions()

    def model_info(self) -> dict:
        m = self.engine.model
        if m is None:
            return {}
        tok = m.tokenizer
        return {"name": Path(m.path).name, "arch": m.arch, "path": str(m.path),
                "n_vocab": int(m.n_vocab), "n_expert": int(m.n_expert),
                "eos_ids": [int(i) for i in tok.eos_token_ids],
                "special_ids": sorted(int(i) for i in tok.special_tokens)}

    def _prompt_for(self, run: RunState, messages: list[dict] | None):
        """The prompt, made on the engine thread (a template or tokenizer may hang or fail, and
        this is the one place it is encoded): in a chat, the token ids of the templated
        conversation with its oldest turns left out to fit the model's context (run.left_out
        says how many)."""
        if not run.options.get("chat", True):
            return run.prompt
        model = self.engine.model
        messages = messages or [{"role": "user", "content": run.prompt}]
        if getattr(model, "remote", False):
            return messages         # the server applies its own template and fits its context

        def templated():
            tok = model.tokenizer
            if tok.chat_template is None:
                return run.prompt       # no chat template: the latest prompt alone
            gen = resolve_options(model.arch, model.recipe, gen_length=run.options.get("gen_length"))
            # asked here too: the load's probe may not have answered yet
            support = system_support(tok) if messages[0]["role"] == "system" else "system"
            ids, run.left_out = fit_history(tok, messages, gen["gen_length"], model.n_ctx_train,
                                            support)
            return ids
        return templated

    def _probe_system_support(self, model) -> None:
        """Find how the model's chat template takes a system prompt, off the GUI thread (a
        template may take seconds), and let the chat say so."""
        job = Job("checking the chat template", lambda progress, cancel: system_support(model.tokenizer))
        job.finished.connect(self._probed)
        job.failed.connect(self._probe_failed)
        self._probe = job
        job.start()

    def _probed(self, support: str) -> None:
        if self.sender() is self._probe:        # not an earlier model's late answer
            self.chat.set_system_support(support)

    def _probe_failed(self, message: str) -> None:
        if self.sender() is self._probe:
            self.chat.set_system_support("merged")

    def generate(self, text: str, messages: list[dict] | None = None) -> None:
        if self.engine.model is None:
            return
        if refused := self.runs.refusal("chat"):
            self.chat.show_error(refused)
            return
        options = self.settings_panel.options()
        # The prompt's own length is checked where it is encoded (_prompt_for).
        if refused := self.settings_panel.refusal():
            self.chat.show_error(f"{refused}; change it in the Settings tab")
            return
        try:
            info, decode = self.model_info(), self.engine.model.tokenizer.decode
        except Exception as exc:    # a damaged tokenizer: say so rather than drop the request
            self.chat.show_error(f"the model's tokenizer failed: {exc}")
            return
        run = RunState(text, options, info, decode)
        self.runs.start_live(run, self._prompt_for(run, messages), self.engine.stop)

    def _text_arrived(self, piece: str) -> None:
        """Text of a run on a server that sends no steps: the chat's answer streams it."""
        if self.live is not None:
            self.chat.add_text(piece)

    def _connect_clicked(self) -> None:
        """File > Connect to server…: a server's model takes the place of the loaded one."""
        if self.runs.busy or self.engine.busy:
            self._show_status("Stop the run before connecting to a server.")
            return
        model = connect_to_server(self)
        if model is not None and not (self.runs.busy or self.engine.busy):
            self.set_model(model)

    def _run_started(self, run: RunState) -> None:
        if run is self.live:
            self.runs.shown_before = self.run
            self.show_run(run)

    def _run_stepped(self, run: RunState) -> None:
        if run is self.live:        # the engine's step, which a paced display may trail (a SteadyLabel: cheap)
            self.run_label.setText(f"denoising · engine at step {run.n_steps}/{run.steps_allowed}"
                                   f" · {run.step_ms[run.n_steps - 1]:.0f} ms/step")
        if run is self.run:
            self._mark_dirty()

    def _run_finished(self, run: RunState) -> None:
        if not self.runs.end_live(run):
            return
        self.run_label.setText("")
        conversation, answer = self.chat.add_answer(run)
        if run.events:
            self.runs.record(run, (conversation, answer))
        res = run.result
        if res.stop_reason != "cancelled":
            self.timeline.run_ended(run.n_steps, res.total_ms)
        self._show_status(f"{res.stop_reason}: {res.steps}/{res.steps_allowed} steps in "
                          f"{res.total_ms / 1000:.2f} s, {res.buffer_tokens_per_s:.1f} tok/s")
        self._mark_dirty()

    def _recorded(self, tag: tuple[Conversation, Message], path: str) -> None:
        """A chat answer's recording is written: the answer links to it."""
        self.chat.link_recording(*tag, path)

    def _not_recorded(self, message: str) -> None:
        self._show_status(f"could not record the run: {message}")

    def _run_failed(self, run: RunState, message: str) -> None:
        before = self.runs.shown_before
        if self.runs.end_live(run):
            if run is self.run and not run.events:   # refused before a step: nothing to show
                self.show_run(before)
                self.timeline.stop()
            self.run_label.setText("")
            self.chat.show_error(message)
            self._show_status(f"run failed: {message}")

    def _served_step(self, job, event) -> None:
        """A step of a request being served: the live views follow the newest request that starts
        while neither a run of the user's nor an earlier followed request is going."""
        if self.served is None or self.served[1].done:
            # the views decode with the Studio's model: not a server's model it connected to
            if self.live is not None or event.step != 0 or getattr(self.engine.model, "remote", False):
                return
            req, tok = job.request, self.engine.model.tokenizer
            run = RunState(tok.decode(req.prompt_of(0)), req.options_of(0), self.model_info(), tok.decode,
                           templated=True)
            self.runs.served = (job, run)
            self._served_cpu = psutil.cpu_times(percpu=True)   # its load over the run, at its end
            self.show_run(run)
            self.run_label.setText(f"following served request #{job.id}")
        followed, run = self.served
        if job is followed:
            run.add(event)
            self._run_stepped(run)

    def _served_done(self, entry: dict) -> None:
        if self.served is None or entry["id"] != self.served[0].id:
            return
        job, run = self.served
        result = job.results[0]       # set before the entry was logged: GenerateResult, or the error
        if not isinstance(result, GenerateResult):
            run.failed = entry["status"]
        else:
            run.cpu_percent = cpu_busy(self._served_cpu, psutil.cpu_times(percpu=True))
            run.finish(result)
            self.timeline.run_ended(run.n_steps, result.total_ms)
        self.run_label.setText("")
        self._show_status(f"served request #{entry['id']}: {entry['status']}, {entry['steps']} steps, "
                          f"{entry['completion_tokens']} tokens")
        self._mark_dirty()

    def _settings_changed(self) -> None:
        self.chat.set_seed(self.settings_panel.options().get("seed"))

    def _holder_changed(self, holder: str | None) -> None:
        """Another part took or freed the model: the chat's buttons, the model panel's swap
        and the actions follow."""
        self.chat.set_busy(holder == "chat")
        self.chat.set_refusal(self.runs.refusal("chat"))
        self.model_panel.engine_busy = holder is not None     # no model swap under any run
        self._update_actions()
        self._mark_dirty()          # a measurement of AR that ended changes what Self-speculation says

    # -- showing a run ------------------------------------------------------------------------

    def show_run(self, run: RunState | None) -> None:
        self.runs.shown = run
        self.timeline.reset()
        for view in (self.canvas_panel, self.heatmap, self.cache_view, self.throughput, self.experts_view,
                     self.uniform_view, self.spec_view, self.window_view):
            view.set_run(run)
        self.timeline.set_count(run.n_steps if run else 0)
        self._draw_canvas()
        self._update_actions()
        self._mark_dirty()

    def measure_ar(self, run: RunState | None) -> None:
        """Self-speculation's 'measure AR here': a short mode-ar run after `run`'s prompt."""
        if run is None:
            return
        refused = self.runs.measure_ar(run)
        self._show_status(refused or f"measuring AR decoding: {AR_MEASURE_TOKENS} tokens after the run's prompt")

    def _ar_measured(self, cost) -> None:
        self._show_status(f"AR on this model: {cost.ms_per_token:.2f} ms per token after the prompt" if cost
                          else "the measurement of AR decoding was stopped")

    def stop(self) -> None:
        """Cancel: whatever runs the model stops after its current step, and the display stops
        playing."""
        self.runs.stop()
        self.timeline.stop()
        self._update_actions()

    def show_step(self, step: int) -> None:
        self.timeline.follow = False
        self.timeline.slider.setValue(step)

    def _mark_dirty(self, *_) -> None:
        self._dirty = {"canvas", "views"}

    def _step_changed(self) -> None:
        self._draw_canvas()
        self._dirty.add("views")

    def refresh(self) -> None:
        """Redraw one dirty group per timer tick; with both dirty, the one not redrawn last. While
        a run goes, the plots (several times the canvas's cost) at most every PLOTS_INTERVAL_S."""
        run = self.run
        ready = set(self._dirty)
        if (run is not None and run is self.live and not run.done
                and time.monotonic() - self._plots_drawn_at < PLOTS_INTERVAL_S):
            ready.discard("views")
        if not ready:
            return
        group = min(ready, key=lambda g: g == self._drawn)
        self._dirty.discard(group)
        self._drawn = group
        if group == "views":
            self._plots_drawn_at = time.monotonic()
        if run is None or not run.events:
            return
        self.timeline.set_count(run.n_steps)
        if group == "canvas":
            self._draw_canvas()
            return
        step = self.timeline.step()
        current = self.views.currentWidget()
        if current is not None:
            current.show_step(step)
        if run is self.live:
            self.chat.show_progress(run, step)
        self._update_actions()

    def _draw_canvas(self) -> None:
        """The canvas and the timeline's label at the slider's step."""
        run = self.run
        if run is None or not run.events:
            self.timeline.label.setText("no run" if run is None else "text only, no steps"
                                        if self.canvas_panel.no_steps else STARTING)
            return
        step = run.clamp(self.timeline.step())
        behind = run.n_steps - 1 - step
        if not run.done:
            state = " · live" if behind == 0 else f" · {behind} behind"
        else:
            state = " · replay" if self.timeline.playing else ""
        self.timeline.label.setText(run.step_label(step) + state)
        self.canvas_panel.show_step(step)

    def _show_status(self, message: str) -> None:
        self.statusBar().showMessage(message, 10000)

    def _error(self, message: str) -> None:
        """A message box that does not block the event loop (runs keep drawing behind it)."""
        box = QMessageBox(QMessageBox.Icon.Warning, "Diffuse Studio", message,
                          QMessageBox.StandardButton.Ok, self)
        box.setAttribute(Qt.WidgetAttribute.WA_DeleteOnClose)
        box.open()
        self._show_status(message)

    # -- files --------------------------------------------------------------------------------

    def open_recording(self, path: str | Path) -> bool:
        if self.engine.busy:
            self._error("Stop the current run before opening a recording.")
            return False
        try:
            rec = Recording.load(path)
        except DiffuseError as e:
            self._error(str(e))
            return False
        self.show_run(RunState.from_recording(rec))
        self.timeline.stop()        # its last step, not paced through
        self._show_status(f"replaying {Path(path).name}: {rec.prompt[:60]!r}")
        return True

    def replay(self, path: str) -> None:
        """The chat's replay link: open the answer's recording and play it from the start."""
        if self.open_recording(path):
            self.timeline.play()

    def save_recording(self, path: str | Path) -> None:
        try:
            self.run.recording.save(path)
        except (OSError, DiffuseError) as e:
            self._error(f"{path}: could not save the run ({e})")
            return
        self._show_status(f"run saved to {path}")

    def export_png(self, path: str | Path) -> None:
        self._export(export.png_strip, path)

    def export_gif(self, path: str | Path) -> None:
        self._export(export.gif, path)

    def _export(self, fn, path) -> None:
        """Draw and encode on a worker thread (a long run's GIF takes seconds)."""
        run = self.run
        if run is None or not run.done:
            self._error("Wait for the run to finish before exporting it.")
            return
        mode, fitted = self.canvas_panel.canvas.mode, self.canvas_panel.canvas.fitted
        job = Job(f"exporting {Path(path).name}",
                  lambda progress, cancel: str(fn(run, path, mode=mode, fitted=fitted)))
        job.finished.connect(self._exported)
        job.failed.connect(self._export_failed)
        self._show_status(f"exporting {path}…")
        self.runs.track(job)

    def _exported(self, path: str) -> None:
        self.runs.saves_done()
        self._show_status(f"exported {path}")
        self.exported.emit(path)

    def _export_failed(self, message: str) -> None:
        self.runs.saves_done()
        self._error(f"export failed: {message}")

    def _file_dialog(self, save: bool, title: str, suffix: str, kind: str) -> str:
        """A file picked by the user; each kind opens where the last one went, a save offering
        a name for the shown run."""
        place = "exports" if suffix != "npz" else "runs" if save else "recordings"
        folder = storage.dialog_dir(place)
        if save:
            name = export.suggested_name(self.run, suffix)
            start = str(Path(folder) / name) if name else folder
            path, _ = QFileDialog.getSaveFileName(self, title, start, f"{kind} (*.{suffix})")
            if path and not path.endswith(f".{suffix}"):
                path += f".{suffix}"
        else:
            path, _ = QFileDialog.getOpenFileName(self, title, folder, f"{kind} (*.{suffix})")
        if path:
            storage.remember_dialog_dir(place, path)
        return path

    def _list_recent_runs(self) -> None:
        """File > Recorded runs: the newest runs recorded, named by date and prompt, and the
        folder of them all."""
        menu = self.recent_menu
        menu.clear()
        try:
            recent = storage.recent_runs(RECENT_RUNS)
        except OSError as e:          # the app's folder cannot be read
            recent = []
            self._show_status(f"could not list the recorded runs: {e}")
        for path in recent:
            action = menu.addAction(path.stem)
            action.setToolTip(str(path))
            action.triggered.connect(lambda checked=False, p=path: self.open_recording(p))
        if not recent:
            menu.addAction("No runs recorded yet").setEnabled(False)
        menu.addSeparator()
        menu.addAction("All recorded runs…").triggered.connect(self._browse_runs)

    def _browse_runs(self) -> None:
        path, _ = QFileDialog.getOpenFileName(self, "Open a recorded run", str(storage.runs_dir()),
                                              "Diffuse runs (*.npz)")
        if path:
            self.open_recording(path)

    def _open_clicked(self) -> None:
        path = self._file_dialog(False, "Open a recorded run", "npz", "Diffuse runs")
        if path:
            self.open_recording(path)

    def _save_clicked(self) -> None:
        path = self._file_dialog(True, "Save the run as", "npz", "Diffuse runs")
        if path:
            self.save_recording(path)

    def _png_clicked(self) -> None:
        path = self._file_dialog(True, "Export a PNG strip", "png", "PNG images")
        if path:
            self.export_png(path)

    def _export_conversation_clicked(self) -> None:
        conv = self.chat.conversation
        if not conv.messages:
            self._show_status("The conversation is empty: nothing to export.")
            return
        folder = storage.dialog_dir("exports")
        filters = ";;".join(f"{name} (*.{suffix})" for suffix, name in export.CONVERSATION_FORMATS.items())
        start = str(Path(folder) / f"{export.conversation_name(conv)}.md")
        path, chosen = QFileDialog.getSaveFileName(self, "Export the conversation", start, filters)
        if not path:
            return
        suffix = "json" if chosen.startswith("JSON") else "md"
        if Path(path).suffix.lower() not in (".md", ".json"):
            path += f".{suffix}"
        storage.remember_dialog_dir("exports", path)
        self.export_conversation(path)

    def export_conversation(self, path: str | Path) -> None:
        """The chat's conversation to `path` (.md or .json)."""
        try:
            export.save_conversation(self.chat.conversation, path)
        except DiffuseError as e:
            self._error(str(e))
            return
        self._show_status(f"conversation exported to {path}")

    def _gif_clicked(self) -> None:
        path = self._file_dialog(True, "Export an animated GIF", "gif", "GIF animations")
        if path:
            self.export_gif(path)

    def open_compare(self) -> None:
        if self.compare_window is None:
            self.compare_window = CompareWindow(self.runs, self.settings_panel.options,
                                                self.model_info, self)
            self.settings_panel.changed.connect(self.compare_window.update_context)
        # The shown run's prompt as the user asked it; not a served request's templated text (also
        # reopened from its recording): Run would template it again.
        self.compare_window.prompt.setText(self.run.prompt if self.run and not self.run.recording.templated
                                           else "")
        self.compare_window.update_context()     # the model may have changed since
        self.compare_window.show()
        self.compare_window.raise_()
        self.compare_window.activateWindow()     # the keys go to it (Esc closes it), not to this window

    def open_benchmarks(self) -> None:
        if self.bench_window is None:
            self.bench_window = BenchWindow(self.runs, self.settings_panel.options, self)
        self.bench_window.show()
        self.bench_window.raise_()

    def _about(self) -> None:
        QMessageBox.about(self, "Diffuse Studio", about_text())

    # -- session ------------------------------------------------------------------------------

    def restore_session(self) -> None:
        """Load the model used last time (the demo model on first start); offer real models."""
        last = storage.settings().value("models/last")
        if last and Path(last).is_file():
            self.model_panel.load(last)
        elif (demo := storage.demo_model()) is not None:
            self.model_panel.load(str(demo))
        first_run.open_at_start(self)

    def _restore_layout(self) -> None:
        s = storage.settings()
        geometry, state = s.value("window/geometry"), s.value("window/splitter")
        if geometry is not None:
            self.restoreGeometry(geometry)
        if state is not None:
            self.splitter.restoreState(state)
        for toggle in self.pane_toggles:     # a panel may have been left collapsed
            toggle.sync()

    def closeEvent(self, event) -> None:
        first = not self._closing
        if first:
            self._closing = True
            s = storage.settings()
            s.setValue("window/geometry", self.saveGeometry())
            s.setValue("window/splitter", self.splitter.saveState())
            s.sync()
            if self.compare_window is not None:
                self.compare_window.stop()
            self.model_panel.cancel_job()
            self.serve_panel.stop()
        if self._threads_ended(CLOSE_WAIT_S if first else 0.0):
            super().closeEvent(event)
            return
        # One step of a large model, or a job, can take seconds: hide now rather than freeze,
        # and close for real once they return.
        self.hide()
        if self._quitting:      # the event loop is ending: nothing would retry, so wait here
            self._threads_ended(None)
            super().closeEvent(event)
            return
        event.ignore()
        QTimer.singleShot(100, self, self.close)

    def _threads_ended(self, wait_s: float | None) -> bool:
        """Stop the run and end every background thread, waiting at most `wait_s` in all
        (None: as long as it takes); saves are let finish so that no run is lost."""
        deadline = None if wait_s is None else time.monotonic() + wait_s

        def left_ms() -> int:
            return -1 if deadline is None else max(0, int((deadline - time.monotonic()) * 1000))
        ended = self.engine.shutdown(left_ms())
        if ended:   # the run's last steps and its end wait in the queue: taken now, they start its recording
            QCoreApplication.sendPostedEvents(self.engine)
        probe = [self._probe] if self._probe is not None else []
        for job in self.runs.saves + self.model_panel.jobs() + probe:
            ended = job.wait(left_ms()) and ended
        for job in list(self.runs.saves):   # a written recording gets its chat link before the window goes
            QCoreApplication.sendPostedEvents(job)
        return ended

    def _about_to_quit(self) -> None:
        self._quitting = True
