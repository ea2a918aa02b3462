"""Background threads: the engine's denoising runs and long file jobs (load, convert, quantise).

The engine thread calls `model.generate` and turns each step into one Qt signal; the GUI thread
receives it in a bound method of an object it owns (a lambda would run on the engine thread).
Stopping is a flag read by the step callback, so a run ends within one step.

Whatever a worker body raises (a pyo3 PanicException and MemoryError are not `Exception`s) ends
as a `failed` message, so the GUI always hears back and the engine never stays busy. Expected
failures (DiffuseError: offline, a bad file, a full disk; OSError) are that one line and nothing
else; anything else is a bug of ours, and its traceback is logged too.
"""
from __future__ import annotations

import logging
import threading
from typing import Any, Callable

import numpy as np
import psutil
from PySide6.QtCore import (QCoreApplication, QDeadlineTimer, QMetaObject, QObject, Qt,
                            QThread, Signal, Slot)

from diffuse import DiffuseError
from diffuse.generation import OPTION_NAMES, resolve_options
from diffuse.studio.run_state import RunState

log = logging.getLogger(__name__)
EXPECTED = (DiffuseError, OSError)    # said to the user in one line; no traceback


def _message(exc: BaseException) -> str:
    try:
        text = str(exc) or type(exc).__name__
    except BaseException:         # a hostile __str__ must not hide the failure itself
        text = "(no message)"
    return text if isinstance(exc, (RuntimeError, OSError)) else f"{type(exc).__name__}: {text}"


def cpu_busy(before: list, after: list) -> np.ndarray:
    """Per-core busy percent between two psutil.cpu_times(percpu=True) readings."""
    out = []
    for a, b in zip(before, after):
        total = sum(b) - sum(a)
        out.append(100.0 * (1.0 - (b.idle - a.idle) / total) if total > 0 else 0.0)
    return np.clip(np.array(out), 0.0, 100.0)


def _call(fn: Callable, what: str, finished: Signal, failed: Signal) -> None:
    """Emit `finished(fn())`, or `failed(message)` whatever `fn` raises; exactly one of them."""
    value, message, quit_app = None, f"{what} ended without a result", False
    try:
        value, message = fn(), None
    except BaseException as exc:
        if not isinstance(exc, EXPECTED):
            log.exception("%s failed", what)
        message = _message(exc)
        # Raised again on a worker thread, SystemExit hangs Python's exit: quit the app instead,
        # which closes the window and ends every thread in order.
        quit_app = isinstance(exc, (KeyboardInterrupt, SystemExit))
    finally:
        if message is None:
            finished.emit(value)
        else:
            failed.emit(message)
    if quit_app:
        QMetaObject.invokeMethod(QCoreApplication.instance(), "quit",
                                 Qt.ConnectionType.QueuedConnection)


class _GenerateWorker(QObject):
    """Lives on the engine thread."""

    stepped = Signal(object)      # StepEvent
    finished = Signal(object)     # (GenerateResult, per-core CPU percent over the run)
    failed = Signal(str)

    def __init__(self):
        super().__init__()
        self.stop_flag = threading.Event()

    @Slot(object, object, object)
    def run(self, model: Any, prompt, options: dict) -> None:
        def generate():
            # A chat template or tokenizer can hang or panic: call it here, off the GUI thread.
            text = prompt() if callable(prompt) else prompt
            # Read around the run itself: a sub-second run falls between a GUI timer's samples.
            before = psutil.cpu_times(percpu=True)
            result = model.generate(text, on_step=self._on_step, **options)
            return result, cpu_busy(before, psutil.cpu_times(percpu=True))
        _call(generate, "generation", self.finished, self.failed)

    def _on_step(self, event) -> bool:
        self.stepped.emit(event)
        return not self.stop_flag.is_set()


class Engine(QObject):
    """GUI-side owner of the model and of the engine thread; one run at a time.

    `start(run)` generates `run.prompt` with `run.options` and fills `run` as steps arrive.
    """

    run_started = Signal(object)     # RunState
    run_stepped = Signal(object)     # RunState, after its new event was added
    run_finished = Signal(object)    # RunState, result attached
    run_failed = Signal(object, str)
    busy_changed = Signal(bool)
    _request = Signal(object, object, object)

    def __init__(self, parent=None):
        super().__init__(parent)
        self.model: Any = None
        self.run: RunState | None = None
        self._thread = QThread()
        self._thread.setObjectName("diffuse-engine")
        self._worker = _GenerateWorker()
        self._worker.moveToThread(self._thread)
        self._request.connect(self._worker.run)
        self._worker.stepped.connect(self._on_step)
        self._worker.finished.connect(self._on_finished)
        self._worker.failed.connect(self._on_failed)
        self._thread.start()

    @property
    def busy(self) -> bool:
        return self.run is not None

    def start(self, run: RunState, prompt: str | list[int] | Callable | None = None) -> None:
        """Generate for `run`; `prompt` (text or token ids, or a function giving them, called on
        the engine thread) defaults to `run.prompt`."""
        if self.model is None:
            raise RuntimeError("no model loaded")
        if self.busy:
            raise RuntimeError("a run is already going")
        # The run records what runs: "auto" options as the model's defaults (its recipe over its
        # family's), so the views (tau, the cache) and the recording know them.
        try:
            run.options.update(resolve_options(self.model.arch, self.model.recipe,
                                               **{k: v for k, v in run.options.items() if k in OPTION_NAMES}))
        except DiffuseError:
            pass        # the engine refuses them with the same message, as the run's failure
        self.run = run
        self._worker.stop_flag.clear()
        self.busy_changed.emit(True)
        self.run_started.emit(run)
        self._request.emit(self.model, run.prompt if prompt is None else prompt,
                           dict(run.options))

    def stop(self) -> None:
        self._worker.stop_flag.set()
        # A remote model's run may bring no steps to refuse (a server that sends text only)
        getattr(self.model, "cancel", lambda: None)()

    def shutdown(self, timeout_ms: int = -1) -> bool:
        """Stop any run and end the thread; False if the current step outlasts `timeout_ms`
        (-1: wait for it); the thread then ends when the step returns."""
        self.stop()
        self._thread.quit()
        return self._thread.wait(QDeadlineTimer(timeout_ms))

    def _on_step(self, event) -> None:
        if self.run is not None:
            self.run.add(event)
            self.run_stepped.emit(self.run)

    def _on_finished(self, value) -> None:
        run, self.run = self.run, None
        result, run.cpu_percent = value
        run.finish(result)
        self.busy_changed.emit(False)
        self.run_finished.emit(run)

    def _on_failed(self, message: str) -> None:
        run, self.run = self.run, None
        run.failed = message
        self.busy_changed.emit(False)
        self.run_failed.emit(run, message)


class _JobWorker(QObject):
    progressed = Signal(object, object, str)   # Python ints: byte counts pass 2**31
    finished = Signal(object)
    failed = Signal(str)

    def __init__(self, fn: Callable, cancel_flag: threading.Event):
        super().__init__()
        self.fn, self.cancel_flag = fn, cancel_flag

    @Slot()
    def run(self) -> None:
        _call(lambda: self.fn(self._progress, self.cancel_flag.is_set), "job", self.finished,
              self.failed)

    def _progress(self, done: int, total: int, what: str = "") -> None:
        self.progressed.emit(int(done), int(total), str(what))


class Job(QObject):
    """Runs `fn(progress, cancel)` on its own thread; progress(done, total, what), cancel() -> bool.

    Signals arrive on the GUI thread; `cancelled` tells apart a job stopped by `cancel()`.
    A started job keeps itself alive until its thread ends, so the widget that started it may
    go away meanwhile (Qt aborts if a running QThread is destroyed).
    """

    _running: set[Job] = set()

    progressed = Signal(object, object, str)   # Python ints: byte counts pass 2**31
    finished = Signal(object)
    failed = Signal(str)

    def __init__(self, title: str, fn: Callable):
        super().__init__()
        self.title = title
        self._cancel = threading.Event()
        self._thread = QThread()
        self._thread.setObjectName(f"diffuse-job: {title}")
        self._worker = _JobWorker(fn, self._cancel)
        self._worker.moveToThread(self._thread)
        self._thread.started.connect(self._worker.run)
        self._worker.progressed.connect(self._on_progress)
        self._worker.finished.connect(self._on_finished)
        self._worker.failed.connect(self._on_failed)

    @property
    def cancelled(self) -> bool:
        return self._cancel.is_set()

    @property
    def running(self) -> bool:
        return self._thread.isRunning()

    def start(self) -> None:
        Job._running.add(self)
        self._thread.finished.connect(self._ended)
        self._thread.start()

    def _ended(self) -> None:
        Job._running.discard(self)

    def cancel(self) -> None:
        self._cancel.set()

    def wait(self, timeout_ms: int = -1) -> bool:
        """End the thread once the job returns; False if that takes over `timeout_ms`."""
        self._thread.quit()
        return self._thread.wait(QDeadlineTimer(timeout_ms))

    def _on_progress(self, done: int, total: int, what: str) -> None:
        self.progressed.emit(done, total, what)

    def _on_finished(self, value) -> None:
        self.wait()
        self.finished.emit(value)

    def _on_failed(self, message: str) -> None:
        self.wait()
        self.failed.emit(message)
