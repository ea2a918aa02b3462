"""File → "Connect to server…": run an OpenAI-compatible server's model in the Studio.

`StudioRemoteModel` is what the Studio's run path runs in place of a local model: the engine
thread calls its `generate(prompt, on_step=..., **options)`, as for diffuse.Model. Against
`diffuse serve` every step arrives as a StepEvent and the views draw it; any other engine (llama.cpp,
vLLM, SGLang) streams text only, which `text_arrived` hands to the chat, and `views_note()` says in
a sentence what the views cannot show. `cancel()` ends a run on either (closing the connection,
which the server takes as a cancel).

The dialog checks the server off the GUI thread (a Job): /v1/models fills the model list. The URL
and model are remembered; the key only when the user ticks "Remember the key", and then in plain
text in the Studio's settings file (the checkbox names it). Otherwise the key lives in memory for
the session, or comes from $DIFFUSE_API_KEY / $OPENAI_API_KEY when the field is left empty.
"""
from __future__ import annotations

import threading

from PySide6.QtCore import QObject, Signal
from PySide6.QtWidgets import (QCheckBox, QComboBox, QDialog, QDialogButtonBox, QFormLayout, QLabel, QLineEdit,
                               QPushButton, QVBoxLayout, QWidget)

from diffuse.events import GenerateResult
from diffuse.remote import KEY_ENV, RemoteModel, api_key_from_env
from diffuse.studio import storage, theme
from diffuse.studio.workers import Job

SETTING_URL, SETTING_MODEL, SETTING_KEY = "remote/url", "remote/model", "remote/key"
CHECK_TIMEOUT_S = 15.0      # the dialog's check; runs then use the client's own timeout


class StudioRemoteModel(QObject):
    """A server's model with the attributes the Studio reads of a local one (path, arch,
    n_ctx_train, recipe, tokenizer, ...). `remote` tells the run path to send the chat's messages
    as they are (the server applies its own chat template)."""

    remote = True
    text_arrived = Signal(str)       # final text as it streams, on the engine thread (queued to the GUI)

    def __init__(self, model: RemoteModel, parent: QObject | None = None):
        super().__init__(parent)
        self.client = model
        self.name = model.id
        self.path = f"{model.url}/{model.id}"    # Path(path).name is the model's id, as the window labels it
        # "" when the server does not say: the engine then leaves the options to the server's defaults
        self.arch, self.n_ctx_train, self.recipe = model.arch or "", model.n_ctx_train, model.recipe
        self.recipe_problem = None
        self.n_vocab, self.n_expert = 0, 0
        self.steps_sent = model.steps_sent     # diffuse serve: the views draw its runs
        self.tokenizer = model.tokenizer
        self._cancel = threading.Event()

    def generate(self, prompt, *, chat: bool = True, on_step=None, **options) -> GenerateResult:
        self._cancel.clear()

        def step(event) -> bool:
            return (on_step is None or on_step(event) is not False) and not self._cancel.is_set()

        def text(piece: str) -> bool:
            self.text_arrived.emit(piece)
            return not self._cancel.is_set()
        return self.client.generate(prompt, chat=chat, on_step=step, on_text=text, **options)

    def cancel(self) -> None:
        """End the run going (any thread): the connection closes at the next event."""
        self._cancel.set()

    def views_note(self) -> str:
        return self.client.views_note()

    def status_text(self) -> str:
        """One line for the window: which model, on what, where."""
        return f"{self.name} on {self.client.server_kind} · {self.client.url}"


class ConnectDialog(QDialog):
    """URL, key, model (from the server's /v1/models), Test connection; `model` once accepted."""

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        self.setWindowTitle("Connect to server")
        self.model: StudioRemoteModel | None = None
        self._job: Job | None = None
        self._accept = False
        settings = storage.settings()
        self.url = QLineEdit(str(settings.value(SETTING_URL, "") or ""))
        self.url.setPlaceholderText("http://localhost:8080/v1")
        self.key = QLineEdit(str(settings.value(SETTING_KEY, "") or ""))
        self.key.setEchoMode(QLineEdit.EchoMode.Password)
        env = next((name for name in KEY_ENV if api_key_from_env()), None)
        self.key.setPlaceholderText(f"empty: ${env} is used" if env else "none")
        self.remember = QCheckBox("Remember the key (kept in plain text in the Studio's settings file)")
        self.remember.setToolTip(f"Unticked, the key is kept in memory until the Studio closes. The file: "
                                 f"{settings.fileName()}")
        self.remember.setChecked(bool(settings.value(SETTING_KEY, "")))
        self.models = QComboBox()
        self.models.setEditable(True)       # a server may serve names it does not list
        self.models.setPlaceholderText("Test the connection to list its models")
        remembered = str(settings.value(SETTING_MODEL, "") or "")
        if remembered:
            self.models.addItem(remembered)
            self.models.setCurrentText(remembered)    # with a placeholder, adding an item selects none
        self.test_button = QPushButton("Test connection")
        self.test_button.clicked.connect(self.test)
        self.status = QLabel("Any OpenAI-compatible server: diffuse serve shows every denoising step; "
                             "llama.cpp, vLLM or SGLang stream the answer's text.")
        self.status.setWordWrap(True)
        self.status.setObjectName("Muted")
        form = QFormLayout()
        form.addRow("Server URL", self.url)
        form.addRow("API key", self.key)
        form.addRow("", self.remember)
        form.addRow("Model", self.models)
        self.buttons = QDialogButtonBox(QDialogButtonBox.StandardButton.Cancel)
        self.connect_button = self.buttons.addButton("Connect", QDialogButtonBox.ButtonRole.AcceptRole)
        self.buttons.addButton(self.test_button, QDialogButtonBox.ButtonRole.ActionRole)
        self.buttons.accepted.connect(self.connect_to_server)
        self.buttons.rejected.connect(self.reject)
        layout = QVBoxLayout(self)
        layout.addLayout(form)
        layout.addWidget(self.status)
        layout.addWidget(self.buttons)
        self.setMinimumWidth(520)

    def api_key(self) -> str | None:
        return self.key.text().strip() or api_key_from_env()

    def test(self) -> None:
        """List the server's models (off the GUI thread) and say what kind of server it is."""
        self._check(accept=False)

    def connect_to_server(self) -> None:
        """Check the chosen model on the server, then accept with it."""
        self._check(accept=True)

    def _check(self, accept: bool) -> None:
        if self._job is not None:
            return
        url, key = self.url.text().strip(), self.api_key()
        chosen = self.models.currentText().strip() or None if accept else None
        if not url:
            self._say("Give the server's URL, like http://localhost:8080/v1", error=True)
            return
        self._busy(True)
        self._say(f"Connecting to {url}…")
        self._accept = accept
        self._job = Job(f"connecting to {url}", lambda progress, cancel: RemoteModel.connect(url, key, chosen,
                                                                                              timeout=CHECK_TIMEOUT_S))
        self._job.finished.connect(self._checked)      # bound methods: Qt drops them if the dialog goes first
        self._job.failed.connect(self._failed)
        self._job.start()

    def _checked(self, model: RemoteModel) -> None:
        self._busy(False)
        if self._accept:
            self._connected(model)
        else:
            self._listed(model)

    def _failed(self, message: str) -> None:
        self._busy(False)
        self._say(message, error=True)

    def _listed(self, model: RemoteModel) -> None:
        current = self.models.currentText()
        self.models.clear()
        self.models.addItems(list(model.served))
        self.models.setCurrentText(current if current in model.served else model.id)
        what = ("diffuse serve: every denoising step is shown" if model.steps_sent else
                f"a {model.server_kind}: the chat streams its text; it sends no denoising steps for the views")
        self._say(f"Connected: {len(model.served)} model{'s' if len(model.served) != 1 else ''}, {what}.")

    def _connected(self, model: RemoteModel) -> None:
        settings = storage.settings()
        settings.setValue(SETTING_URL, model.url)
        settings.setValue(SETTING_MODEL, model.id)
        if self.remember.isChecked() and self.key.text().strip():
            settings.setValue(SETTING_KEY, self.key.text().strip())
        else:
            settings.remove(SETTING_KEY)      # unticked: a key stored before is removed too
        settings.sync()
        self.model = StudioRemoteModel(model)
        self.accept()

    def _busy(self, busy: bool) -> None:
        if not busy:
            self._job = None
        for w in (self.test_button, self.connect_button, self.url, self.key, self.models):
            w.setEnabled(not busy)

    def _say(self, text: str, error: bool = False) -> None:
        # an error in the compare colour until the next message: red never outlives its cause
        self.status.setStyleSheet(f"color: {theme.DIFF.name()};" if error else "")
        self.status.setText(text)

    def reject(self) -> None:
        if self._job is not None:     # the check ends at its timeout; its answer is then ignored
            self._job.finished.disconnect(self._checked)
            self._job.failed.disconnect(self._failed)
            self._job = None
        super().reject()


def connect_to_server(parent: QWidget | None = None) -> StudioRemoteModel | None:
    """Show the dialog; the connected model, or None when cancelled."""
    dialog = ConnectDialog(parent)
    return dialog.model if dialog.exec() == QDialog.DialogCode.Accepted else None
