"""Serve the loaded model with the OpenAI API from inside the Studio (diffuse.serve).

The server runs on its own threads (uvicorn's and the batcher's); the switch only binds the port
and starts them, and stopping returns at once: a timer notices when the threads have ended.

Loading another model in the Studio does not stop the server: it keeps serving the file it was
started with (clients keep working), the log says so, and "Serve the loaded model instead"
switches it to the new one without a restart (Server.switch_model: the requests being served
finish on the old model, and no connection is refused).
"""
from __future__ import annotations

import json
import time
from pathlib import Path

from PySide6.QtCore import QTimer, Signal
from PySide6.QtGui import QGuiApplication
from PySide6.QtWidgets import (QCheckBox, QFormLayout, QHBoxLayout, QLabel, QLineEdit, QPlainTextEdit,
                               QPushButton, QSpinBox, QVBoxLayout, QWidget)

from diffuse import DiffuseError
from diffuse.studio import theme
from diffuse.studio.wheel import guard_wheel

LOG_LINES = 500
POLL_MS = 200


def client_snippet(url: str, model_id: str, api_key: str | None) -> str:
    """A Python (openai) and a curl example for the running server."""
    message = [{"role": "user", "content": "Why is the sky blue?"}]
    body = json.dumps({"model": model_id, "messages": message, "max_tokens": 64, "steps": 32})
    auth = f' \\\n  -H "Authorization: Bearer {api_key}"' if api_key else ""
    return (f"from openai import OpenAI\n"
            f"client = OpenAI(base_url={url!r}, api_key={(api_key or 'none')!r})\n"
            f"r = client.chat.completions.create(model={model_id!r}, messages={message!r},\n"
            f"                                   max_tokens=64, extra_body={{'steps': 32}})\n"
            f"print(r.choices[0].message.content)\n\n"
            f"curl {url}/chat/completions -H 'Content-Type: application/json'{auth} \\\n"
            f"  -d '{body}'\n")


class ServePanel(QWidget):
    # Both emitted on the server's threads, delivered on the GUI thread:
    log_entry = Signal(dict)          # the batcher's entry of a request that ran
    request_logged = Signal(dict)     # every HTTP request, refused ones too (the log shows these)
    # (Job, StepEvent): a step of a served request's first answer, for the live views to follow;
    # only while the server serves the Studio's loaded model (the views decode with its tokenizer)
    served_step = Signal(object, object)
    # One line for the status bar: what is served where, "" when nothing is
    state_changed = Signal(str)

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        self.model = None               # the Studio's loaded model
        self.server = None
        self.served_model = None        # the model the server was started with
        self._state_line = ""
        self.switch = QCheckBox("Serve the loaded model")
        self.switch.setToolTip("an OpenAI-compatible API (/v1/completions, /v1/chat/completions) "
                               "for other programs")
        self.switch.toggled.connect(self._switched)
        self.host = QLineEdit("127.0.0.1")
        self.host.setToolTip("127.0.0.1: this computer only; 0.0.0.0: every network interface")
        self.port = QSpinBox()
        self.port.setRange(0, 65535)
        self.port.setValue(8080)
        self.port.setToolTip("0 picks a free port")
        self.api_key = QLineEdit()
        self.api_key.setPlaceholderText("none (no key needed)")
        self.max_batch = QSpinBox()
        self.max_batch.setRange(1, 64)
        self.max_batch.setValue(8)
        self.max_batch.setToolTip("most requests denoised together in one forward pass per step")
        self.follow = QCheckBox("Show requests in the live views")
        self.follow.setToolTip("the Denoise, Heatmap, Cache and Throughput views follow the requests being "
                               "served, one at a time, while no run of your own is going")
        self.follow.setChecked(True)
        self.follow.toggled.connect(self._follow_toggled)
        self._following = True          # read on the batcher's thread: a plain bool, not the widget
        form = QFormLayout()
        form.addRow("Host", self.host)
        form.addRow("Port", self.port)
        form.addRow("API key", self.api_key)
        form.addRow("Max batch", self.max_batch)
        self.status = QLabel()
        self.status.setObjectName("Muted")
        self.status.setWordWrap(True)
        self.url = QLineEdit()
        self.url.setReadOnly(True)
        self.snippet = QPlainTextEdit()
        self.snippet.setReadOnly(True)
        self.snippet.setFont(theme.mono_font())
        self.snippet.setLineWrapMode(QPlainTextEdit.LineWrapMode.NoWrap)   # code: wrapped lines would mislead
        self.copy_button = QPushButton("Copy snippet")
        self.copy_button.clicked.connect(self._copy)
        self.swap_button = QPushButton("Serve the loaded model instead")
        self.swap_button.setToolTip("serve the model the Studio has loaded from the next request on, "
                                    "without a restart; requests being served finish on the old one")
        self.swap_button.clicked.connect(self.serve_loaded)
        for edit in (self.host.textChanged, self.port.valueChanged, self.api_key.textChanged,
                     self.max_batch.valueChanged):
            edit.connect(self._show_state)      # a refusal of the old address goes with it
        self.log = QPlainTextEdit()
        self.log.setReadOnly(True)
        self.log.setFont(theme.mono_font())
        self.log.setMaximumBlockCount(LOG_LINES)
        self.request_logged.connect(self._logged)
        self._poll = QTimer(self)
        self._poll.setInterval(POLL_MS)
        self._poll.timeout.connect(self._check_stopped)

        row = QHBoxLayout()
        row.addWidget(QLabel("URL"))
        row.addWidget(self.url, 1)
        layout = QVBoxLayout(self)
        layout.addWidget(self.switch)
        layout.addLayout(form)
        layout.addWidget(self.follow)
        layout.addWidget(self.status)
        layout.addWidget(self.swap_button)
        layout.addLayout(row)
        layout.addWidget(QLabel("Client snippet"))
        layout.addWidget(self.snippet, 1)
        layout.addWidget(self.copy_button)
        layout.addWidget(QLabel("Requests"))
        layout.addWidget(self.log, 1)
        guard_wheel(self)          # the wheel scrolls the panel, not the port under the pointer
        self._show_state()

    def set_model(self, model) -> None:
        """A newly loaded model. A running server keeps serving the file it has (its clients keep
        working); the log says so, and serve_loaded() switches it."""
        self.model = model
        if self.serving() and self.served_model is not model:
            self._note(f"the Studio loaded {_name(model)}; the server keeps serving "
                       f"{_name(self.served_model)} (“Serve the loaded model instead” switches it)")
        self._show_state()

    def serve_loaded(self) -> None:
        """Serve the loaded model from the next request on; the requests being served finish on
        the old one."""
        if not self.serving() or self.served_model is self.model:
            return
        try:
            self.server.switch_model(self.model)
        except DiffuseError as e:
            self._note(f"cannot serve {_name(self.model)}: {e}")
            return
        self._note(f"now serving {_name(self.model)}; requests already accepted finish on "
                   f"{_name(self.served_model)}")
        self.served_model = self.model
        self.snippet.setPlainText(client_snippet(self.server.url, self.server.model_id, self.api_key.text() or None))
        self._show_state()

    def start(self) -> bool:
        if self.model is None or self.serving():
            return False
        try:
            from diffuse.serve import Server
            self.server = Server(self.model, host=self.host.text().strip(), port=self.port.value(),
                                 api_key=self.api_key.text() or None, max_batch=self.max_batch.value())
        except ImportError as e:
            return self._refused(f"serving needs the serve extra: pip install 'diffuse[serve]' ({e})")
        except DiffuseError as e:
            return self._refused(str(e))
        self.served_model = self.model
        self.server.batcher.listeners.append(self.log_entry.emit)
        self.server.request_listeners.append(self.request_logged.emit)
        self.server.batcher.step_listeners.append(self._stepped)
        self.server.start()
        self._note(f"serving {_name(self.model)} at {self.server.url}")
        self.url.setText(self.server.url)
        self.snippet.setPlainText(client_snippet(self.server.url, self.server.model_id, self.api_key.text() or None))
        self._show_state()
        return True

    def stop(self) -> None:
        """Cancel the requests being served and close, without waiting for the threads."""
        if self.server is not None and self.server.running():
            self.server.stop(wait=0)
            self._poll.start()
        self._show_state()

    def _note(self, line: str) -> None:
        """A line of the panel's own in the request log."""
        self.log.appendPlainText(f"{time.strftime('%H:%M:%S')}  {line}")

    def serving(self) -> bool:
        return self.server is not None and self.server.running()

    def _switched(self, on: bool) -> None:
        if on and not self.serving():
            self.start()
        elif not on:
            self.stop()

    def _refused(self, message: str) -> bool:
        self.server = None
        self._show_state()
        self.status.setText(message)
        return False

    def _check_stopped(self) -> None:
        if not self.serving():
            self._poll.stop()
            self._note("stopped serving")
            self.served_model = None
            self._show_state()

    def _show_state(self) -> None:
        serving = self.serving()
        stopping = self._poll.isActive()
        other = serving and self.served_model is not self.model      # the Studio loaded another
        self.switch.blockSignals(True)
        self.switch.setChecked(serving and not stopping)
        self.switch.blockSignals(False)
        self.switch.setEnabled(self.model is not None and not stopping)
        for w in (self.host, self.port, self.api_key, self.max_batch):
            w.setEnabled(not serving)
        self.copy_button.setEnabled(serving and not stopping)
        self.swap_button.setVisible(other and not stopping)
        line = ""
        if self.model is None:
            self.status.setText("Load a model to serve it.")
        elif stopping:
            self.status.setText("Stopping: the requests being served are cancelled at their next step…")
            line = "server stopping"
        elif other:
            self.status.setText(f"Serving {self.server.model_id} at {self.server.url}: not the model "
                                f"the Studio has loaded ({_name(self.model)}). Requests are not shown "
                                "in the live views.")
            line = f"serving {self.server.model_id} (not the loaded model) at {self.server.url}"
        elif serving:
            self.status.setText(f"Serving {self.server.model_id} at {self.server.url}")
            line = f"serving {self.server.model_id} at {self.server.url}"
        else:
            self.status.setText("Not serving.")
            self.url.clear()
            self.snippet.clear()
        if line != self._state_line:
            self._state_line = line
            self.state_changed.emit(line)

    def state_line(self) -> str:
        """What the status bar shows about the server: "" when not serving."""
        return self._state_line

    def _follow_toggled(self, on: bool) -> None:
        self._following = on

    def _stepped(self, job, index: int, event) -> None:
        """On the batcher's thread: only the first answer of each request is shown (a request with
        n answers would otherwise fight itself for the views), and only a request on the loaded
        model (the views decode with its tokenizer)."""
        if index == 0 and self._following and job.model is self.model:
            self.served_step.emit(job, event)

    def _copy(self) -> None:
        QGuiApplication.clipboard().setText(self.snippet.toPlainText())

    def _logged(self, e: dict) -> None:
        """One line per HTTP request: what a request that ran did, or why one was refused. A client
        cut off for reading nothing is said in place of the status: its run's own ("ok": every token
        made) and the HTTP status (sent before the cut) are not what the client got."""
        r = e["request"]     # the batcher's entry, for a request that ran
        cut = e["cut_off"]
        if r is not None:
            status = f"cut off, {e['error']}" if cut else r["status"]
            line = (f"#{r['id']} {r['kind']} {status}: {r['prompt_tokens']}+{r['completion_tokens']} "
                    f"tokens, {r['steps']} steps, batch of {r['batch']}, waited {r['queued_ms']:.0f} ms, "
                    f"ran {r['run_ms']:.0f} ms" + (f" ({e['error']})" if e["error"] and not cut else ""))
        else:
            what = f"{e['method']} {e['path']}" if e["method"] else "request"
            line = f"{what} cut off, {e['error']}" if cut else f"{what} {e['status']}" + (
                f": {e['error']}" if e["error"] else "")
        self.log.appendPlainText(f"{time.strftime('%H:%M:%S')}  {line}")


def _name(model) -> str:
    return Path(model.path).stem
