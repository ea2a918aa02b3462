"""Chat panel: the conversation, the prompt box and the run buttons.

While a run goes, the answer being denoised is shown as it stands (committed text, masks as ░);
when it ends the decoded answer replaces it and is saved, and once the run's recording is written
the answer links to it (a link is never saved before its file exists; one whose file has gone
since is said to be gone when the conversation is opened). The
conversation goes into the prompt with its oldest turns left out as far as the model's context
requires (the chat says so); a message whose run failed stays on screen, marked, and is not sent
again. Clear and Delete ask first.

As in LM Studio or Jan: each conversation has a system prompt (sent as the template's system
turn, or before the first message where the template has none, which the panel says); a question
can be edited and Again asks anew with a fresh seed, each starting a branch beside the old one,
which stays (‹ 1/2 › switches); every answer shows its seed, to repeat it exactly; a
conversation exports as Markdown or JSON. The empty chat of the demo model says what it is and
offers prompts it does well.
"""
from __future__ import annotations

import html
import time
from pathlib import Path
from typing import Callable

from PySide6.QtCore import QTimer, QUrl, Signal
from PySide6.QtGui import QGuiApplication, QKeySequence, QShortcut
from PySide6.QtWidgets import (QGridLayout, QHBoxLayout, QLabel, QMessageBox, QPlainTextEdit,
                               QPushButton, QTextBrowser, QToolButton, QVBoxLayout, QWidget)

from diffuse import DiffuseError
from diffuse.studio import theme
from diffuse.studio.conversations import Conversation, ConversationStore, Message
from diffuse.studio.demo import DEMO_ABOUT, SUGGESTED_PROMPTS
from diffuse.studio.run_state import MASK_GLYPH, RunState, decoding_text

SYSTEM_SAVE_MS = 600       # the system prompt is saved this long after the last key
_PROBE = "diffuse-system-probe"   # text no template writes by itself

# How a system prompt reaches the model, by what its chat template does with one (system_support)
SYSTEM_NOTES = {
    "system": "Sent as the system turn of the model's chat template.",
    "merged": "This model's chat template has no system turn: the system prompt goes before "
              "the first message.",
    "none": "This model has no chat template: only the latest message is sent, without the "
            "system prompt.",
    "server": "Sent as the system message: the server applies its model's chat template.",
}
STREAM_RENDER_MS = 100     # a streamed answer is redrawn at most this often


def _text_html(text: str) -> str:
    """Message text as HTML, whitespace kept (answers may hold code), masks dimmed."""
    body = html.escape(text).replace(MASK_GLYPH, f"<span style='color:#4a5064'>{MASK_GLYPH}</span>")
    return f"<span style='white-space:pre-wrap'>{body}</span>"


def system_support(tokenizer) -> str:
    """How a system prompt reaches the model (a SYSTEM_NOTES key): "system" if the chat
    template writes a system turn, "merged" if it drops or refuses one (Gemma's raises), "none"
    without a template."""
    if tokenizer.chat_template is None:
        return "none"
    try:
        out = tokenizer.apply_chat_template([{"role": "system", "content": _PROBE},
                                             {"role": "user", "content": "hello"}])
    except DiffuseError:
        return "merged"
    return "system" if _PROBE in out else "merged"


def with_system(messages: list[dict], support: str) -> list[dict]:
    """`messages`, whose first may be the system prompt, as the template takes them: the system
    turn kept, put before the first message's text ("merged"), or dropped ("none")."""
    if not messages or messages[0]["role"] != "system" or support == "system":
        return messages
    system, rest = messages[0]["content"], messages[1:]
    if support == "none" or not rest:
        return rest
    return [{**rest[0], "content": f"{system}\n\n{rest[0]['content']}"}] + rest[1:]


def fit_history(tokenizer, messages: list[dict], gen_length: int, n_ctx: int,
                support: str = "system") -> tuple[list[int], int]:
    """Token ids of the templated conversation with its oldest turns left out, whole exchanges
    at a time, until the prompt and `gen_length` fit in the model's `n_ctx` positions; and how
    many messages were left out. A leading system prompt is always kept (`with_system` says
    how). DiffuseError if the latest message alone does not fit."""
    room = n_ctx - gen_length
    head = messages[:1] if messages and messages[0]["role"] == "system" else []
    turns = messages[len(head):]
    for start in (i for i, m in enumerate(turns) if m["role"] == "user"):
        ids = tokenizer.encode_chat(with_system(head + turns[start:], support))
        if len(ids) <= room:
            return ids, start
    raise DiffuseError(f"the prompt takes {len(ids)} tokens: with gen_length {gen_length} it "
                       f"exceeds the model's context of {n_ctx}; shorten it or lower gen_length")


def left_out_note(n: int) -> str:
    return (f"The {n} oldest message{'s' * (n != 1)} of this conversation were left out of the "
            f"prompt to fit the model's context.")


def answer_meta(run: RunState) -> dict:
    """What an answer remembers of its run (its recording is added once written)."""
    res = run.result
    meta = {"options": run.options, "model": run.recording.model.get("name", ""),
            "arch": run.arch, "recording": None, "time": time.time()}
    if run.left_out:
        meta["left_out"] = run.left_out
    if res is not None:
        meta.update(steps=res.steps, steps_allowed=res.steps_allowed, total_ms=res.total_ms,
                    stop_reason=res.stop_reason,
                    tokens_per_s=round(res.buffer_tokens_per_s, 2))
    return meta


def answer_seed(m: Message):
    """The seed an answer was sampled with (its run's options), or None."""
    return (m.meta.get("options") or {}).get("seed")


class ChatPanel(QWidget):
    generate_requested = Signal(str, object)   # prompt text, chat messages (list of dicts)
    stop_requested = Signal()
    replay_requested = Signal(str)             # recording path
    export_requested = Signal()                # the shown conversation, to a file

    def __init__(self, store: ConversationStore | None = None, parent=None):
        super().__init__(parent)
        self.store = store or ConversationStore()
        self.conversation = Conversation()
        self._pending: str | None = None       # the answer being denoised, as it stands
        self._pending_left_out = 0             # messages its prompt left out
        self._streamed = False                 # the pending answer comes as text, not steps
        self._progress_of: tuple | None = None  # (run, step) the pending answer shows
        self._asking: Message | None = None    # the user's message of the run going
        self._editing: Message | None = None   # the question being edited in the prompt box
        self._error: str | None = None         # a failure no message of the chat asked for
        self._gone: set[str] = set()           # recordings linked from this conversation, missing
        self.confirm_box: QMessageBox | None = None
        self.busy = False
        self.refused = ""                      # why another part's run keeps the chat from running
        self.model_ready = False
        self.demo = False                      # the demo model is loaded: the empty chat says so
        self.fixed_seed: int | None = None     # the Settings' seed, when not auto
        self._ready_hint = ""

        self.picker = theme.ElidedComboBox(6)    # its tooltip: the whole title
        self.picker.activated.connect(self._picked)
        new = QPushButton("New")
        new.setToolTip("Start a new conversation")
        new.clicked.connect(self.new_conversation)
        delete = QPushButton("Delete")
        delete.setToolTip("Delete this conversation")
        delete.clicked.connect(self.delete_conversation)
        self.export_button = QPushButton("Export…")
        self.export_button.setToolTip("Save this conversation as Markdown or JSON")
        self.export_button.clicked.connect(self.export_requested)
        top = QHBoxLayout()
        top.addWidget(self.picker, 1)
        top.addWidget(new)
        top.addWidget(delete)

        # The system prompt folds away: most turns do not need it on screen.
        self.system_button = QToolButton()
        self.system_button.setCheckable(True)
        self.system_button.setAutoRaise(True)
        self.system_button.toggled.connect(self._system_toggled)
        self.system_box = QPlainTextEdit()
        self.system_box.setPlaceholderText("e.g. You are a concise assistant. (this conversation only)")
        self.system_box.setMaximumHeight(70)
        self.system_box.setTabChangesFocus(True)
        self.system_box.textChanged.connect(self._system_edited)
        self.system_note = QLabel(SYSTEM_NOTES["system"])
        self.system_note.setObjectName("Muted")
        self.system_note.setWordWrap(True)
        self._system_timer = QTimer(self)
        self._system_timer.setSingleShot(True)
        self._system_timer.setInterval(SYSTEM_SAVE_MS)
        self._system_timer.timeout.connect(self._save)
        self._stream_timer = QTimer(self)       # redraws an answer streaming in as text
        self._stream_timer.setSingleShot(True)
        self._stream_timer.setInterval(STREAM_RENDER_MS)
        self._stream_timer.timeout.connect(self.render)

        self.view = QTextBrowser()
        self.view.setOpenLinks(False)
        self.view.anchorClicked.connect(self._link)
        self.edit_bar = QWidget()                # shown while a question is being edited
        self.edit_label = QLabel("Editing a question: Generate sends it as a new branch; "
                                 "the old one is kept")
        self.edit_label.setObjectName("Muted")
        self.edit_label.setWordWrap(True)
        cancel_edit = QPushButton("Cancel edit")
        cancel_edit.clicked.connect(self.cancel_edit)
        edit_row = QHBoxLayout(self.edit_bar)
        edit_row.setContentsMargins(0, 0, 0, 0)
        edit_row.addWidget(self.edit_label, 1)
        edit_row.addWidget(cancel_edit)
        self.edit_bar.hide()
        self.prompt = QPlainTextEdit()
        self.prompt.setPlaceholderText("Ask something…  (Ctrl+Enter to generate)")
        self.prompt.setMaximumHeight(110)
        self.prompt.setTabChangesFocus(True)     # Tab leaves the box; a prompt needs no tab characters
        self.generate_button = QPushButton("Generate")
        self.generate_button.setObjectName("Primary")
        self.generate_button.clicked.connect(self.submit)
        self.stop_button = QPushButton("Stop")
        self.stop_button.setObjectName("Danger")
        self.stop_button.clicked.connect(self.stop_requested)
        self.regenerate_button = QPushButton("Again")
        self.regenerate_button.clicked.connect(self.regenerate)
        self.copy_button = QPushButton("Copy")
        self.copy_button.setToolTip("Copy the last answer to the clipboard")
        self.copy_button.clicked.connect(self.copy_answer)
        self.clear_button = QPushButton("Clear")
        self.clear_button.setToolTip("Remove every message of this conversation, every branch")
        self.clear_button.clicked.connect(self.clear)
        self.hint = theme.ElidedLabel()
        self.hint.setObjectName("Muted")
        # Two rows, so that the panel fits beside the canvas on a 1024-pixel screen.
        buttons = QGridLayout()
        for k, b in enumerate((self.copy_button, self.regenerate_button, self.clear_button)):
            buttons.addWidget(b, 0, k)
        buttons.addWidget(self.stop_button, 1, 0)
        buttons.addWidget(self.generate_button, 1, 1, 1, 2)

        layout = QVBoxLayout(self)
        layout.setContentsMargins(6, 6, 6, 6)
        layout.addLayout(top)
        second = QHBoxLayout()      # beside the system prompt: the top row fits a 1024-pixel screen
        second.addWidget(self.system_button)
        second.addStretch(1)
        second.addWidget(self.export_button)
        layout.addLayout(second)
        layout.addWidget(self.system_box)
        layout.addWidget(self.system_note)
        layout.addWidget(self.view, 1)
        layout.addWidget(self.edit_bar)
        layout.addWidget(self.prompt)
        layout.addWidget(self.hint)
        layout.addLayout(buttons)
        for keys in ("Ctrl+Return", "Ctrl+Enter"):
            QShortcut(QKeySequence(keys), self.prompt, self.submit)

        self._system_toggled(False)
        self._restore()
        self._update_buttons()

    # -- conversations ------------------------------------------------------------------------

    def _restore(self) -> None:
        convs = self.store.list()
        if convs:
            try:
                self.conversation = self.store.load(convs[0][0])
            except DiffuseError:
                self.conversation = Conversation()
        self._opened()

    def _opened(self) -> None:
        """Show the conversation just opened or started."""
        self._check_recordings()
        self._error = None
        self.cancel_edit()
        self.system_box.blockSignals(True)
        self.system_box.setPlainText(self.conversation.system)
        self.system_box.blockSignals(False)
        self._system_toggled(self.system_button.isChecked())
        self._refresh_picker()
        self.render(to_end=True)         # a conversation opens at its newest message

    def _check_recordings(self) -> None:
        """Note which of the opened conversation's recordings no longer exist (deleted, or
        linked before the file was written), to say so rather than offer a dead link."""
        linked = {m.meta["recording"] for m in self.conversation.messages
                  if m.meta.get("recording")}
        self._gone = {path for path in linked if not Path(path).is_file()}

    def _refresh_picker(self) -> None:
        self.picker.blockSignals(True)
        self.picker.clear()
        saved = self.store.list()
        if self.conversation.id not in {cid for cid, _ in saved}:
            self.picker.addItem(self.conversation.title, self.conversation.id)
        for cid, title in saved:
            self.picker.addItem(title, cid)
        self.picker.setCurrentIndex(max(0, self.picker.findData(self.conversation.id)))
        self.picker.setToolTip(self.conversation.title)
        self.picker.blockSignals(False)

    def _picked(self, index: int) -> None:
        cid = self.picker.itemData(index)
        if self.busy or cid == self.conversation.id:
            self._refresh_picker()
            return
        self._flush_system()
        try:
            self.conversation = self.store.load(cid)
        except DiffuseError as e:
            QMessageBox.warning(self, "Diffuse Studio", str(e))
        self._opened()

    def new_conversation(self) -> None:
        if self.busy:
            return
        self._flush_system()
        self.conversation = Conversation()
        self._opened()
        self.prompt.setFocus()

    def delete_conversation(self) -> None:
        if self.busy:
            return
        conv = self.conversation

        def delete():
            self._system_timer.stop()      # its save would bring the file back
            self.store.delete(conv.id)
            self.conversation = Conversation()
            self._restore()
        if conv.messages or conv.system:
            self._confirm(f"Delete the conversation “{conv.title}”? This cannot be undone.",
                          "Delete", delete)
        else:                # nothing to lose: no question
            delete()

    def _confirm(self, question: str, verb: str, action: Callable[[], None]) -> None:
        """Ask before anything is lost; window-modal (the conversation cannot change meanwhile)
        without blocking the event loop, so runs keep drawing. Nothing changes, on screen or on
        disk, unless the user says yes."""
        box = QMessageBox(QMessageBox.Icon.Question, "Diffuse Studio", question,
                          QMessageBox.StandardButton.Cancel, self)
        yes = box.addButton(verb, QMessageBox.ButtonRole.DestructiveRole)
        box.setDefaultButton(QMessageBox.StandardButton.Cancel)
        yes.clicked.connect(action)
        box.finished.connect(self._confirmed)
        box.finished.connect(box.deleteLater)     # once answered and its handlers have returned
        self.confirm_box = box
        box.open()

    def _confirmed(self) -> None:
        self.confirm_box = None

    def _save(self) -> None:
        self._system_timer.stop()
        try:
            self.store.save(self.conversation)
        except DiffuseError as e:   # a full disk or a read-only folder: said, the chat goes on in memory
            self._error = f"the conversation could not be saved: {e}"
        self._refresh_picker()

    # -- system prompt ------------------------------------------------------------------------

    def _system_toggled(self, shown: bool) -> None:
        text = " ".join(self.conversation.system.split())
        # The button's text stays short (the panel fits a 1024-pixel screen): ● says one is set.
        self.system_button.setText(f"{'▾' if shown else '▸'} System prompt{' ●' if text else ''}")
        self.system_button.setToolTip(f"System prompt: {text}" if text else
                                      "No system prompt: instructions sent before the conversation "
                                      "(this conversation only)")
        self.system_box.setVisible(shown)
        self.system_note.setVisible(shown)

    def _system_edited(self) -> None:
        self.conversation.system = self.system_box.toPlainText()
        self._system_toggled(self.system_button.isChecked())
        if self.conversation.messages or self.conversation.system:
            self._system_timer.start()       # saved once typing pauses

    def _flush_system(self) -> None:
        """Save a system prompt edit still waiting for its timer."""
        if self._system_timer.isActive():
            self._save()

    def set_system_support(self, support: str) -> None:
        """Say how the loaded model's template takes a system prompt (a SYSTEM_NOTES key)."""
        self.system_note.setText(SYSTEM_NOTES[support])

    # -- actions ------------------------------------------------------------------------------

    def submit(self) -> None:
        text = self.prompt.toPlainText().strip()
        if self.busy or self.refused or not self.model_ready:
            return       # the button is off, and the hint says why
        if not text:
            self.hint.setText("Type a prompt first.")
            self.prompt.setFocus()
            return
        self.prompt.clear()
        conv = self.conversation
        if self._editing is not None:     # a new version of the question, beside the old one
            by_id = {m.id: m for m in conv.messages}
            after = by_id.get(self._editing.parent)
            self.cancel_edit()
        else:
            tail = conv.branch()
            after = tail[-1] if tail else None
        message = conv.add(Message("user", text), after)
        self._save()
        self._request(message)

    def regenerate(self) -> None:
        """Ask the shown branch's last question again (a failed one included), with a fresh
        seed unless the Settings fix one: the new answer starts a branch beside the old."""
        branch = self.conversation.branch()
        if self.busy or self.refused or not self.model_ready or not branch:
            return
        question = branch[-1] if branch[-1].role == "user" else branch[-2] if len(branch) > 1 else None
        if question is None:
            return
        question.meta.pop("failed", None)
        self.conversation.leaf = question.id      # the old answer waits in its branch
        self._save()
        self._request(question)

    def _request(self, message: Message) -> None:
        self.hint.setText(self._ready_hint)     # a note of the last action is old news
        self._error = None
        self._asking = message
        self._pending, self._pending_left_out, self._streamed = "", 0, False
        self.render(to_end=True)         # the question asked and its answer coming, in sight
        self.generate_requested.emit(message.text, self.conversation.chat_messages())

    def start_edit(self, message: Message) -> None:
        """Put a question in the prompt box; Generate sends it as a new branch."""
        if self.busy or message.role != "user":
            return
        self._editing = message
        self.prompt.setPlainText(message.text)
        self.prompt.setFocus()
        self.edit_bar.show()

    def cancel_edit(self) -> None:
        if self._editing is not None:
            self._editing = None
            self.prompt.clear()
        self.edit_bar.hide()

    def copy_answer(self) -> None:
        answer = next((m.text for m in reversed(self.conversation.branch())
                       if m.role == "assistant"), None)
        if answer is not None:
            QGuiApplication.clipboard().setText(answer)
            self.hint.setText("Answer copied to the clipboard")

    def clear(self) -> None:
        if self.busy or not self.conversation.messages:
            return

        def clear():
            self.conversation.remove_after(None)
            self._error = None
            self.cancel_edit()
            self._save()
            self.render()
        self._confirm(f"Remove all {len(self.conversation.messages)} messages of "
                      f"“{self.conversation.title}”, every branch?", "Clear", clear)

    def _link(self, url: QUrl) -> None:
        kind, _, key = url.toString().partition(":")
        if kind == "suggest":
            self._suggested(key)
            return
        msg = next((m for m in self.conversation.messages if m.id == key), None)
        if msg is None:
            return
        if kind == "copy":
            QGuiApplication.clipboard().setText(msg.text)
            self.hint.setText("Copied to the clipboard")
        elif kind == "replay" and msg.meta.get("recording") not in self._gone | {None}:
            self.replay_requested.emit(msg.meta["recording"])   # the window says if it is gone since
        elif kind == "edit":
            self.start_edit(msg)
        elif kind in ("prev", "next") and not self.busy:
            versions = self.conversation.siblings(msg)
            k = versions.index(msg) + (1 if kind == "next" else -1)
            if 0 <= k < len(versions):
                self.conversation.show(versions[k])
                self._save()
                self.render()

    def _suggested(self, key: str) -> None:
        """A suggested prompt clicked: asked at once, as if typed."""
        try:
            text = SUGGESTED_PROMPTS[int(key)]
        except (ValueError, IndexError):
            return
        self.prompt.setPlainText(text)
        self.submit()

    # -- run feedback -------------------------------------------------------------------------

    def set_busy(self, busy: bool) -> None:
        self.busy = busy
        self._update_buttons()
        self.render()           # no edit links or branch switches while a run goes

    def set_refusal(self, reason: str) -> None:
        """Why the chat may not run now (another part holds the model), or ""."""
        self.refused = reason
        self.hint.setText(reason or self._ready_hint)
        self._update_buttons()

    def set_model_ready(self, ready: bool, name: str = "", demo: bool = False) -> None:
        self.model_ready, self.demo = ready, ready and demo
        self._ready_hint = f"Model: {name}" if ready else "Load a model in the Models tab first"
        self.hint.setText(self.refused or self._ready_hint)
        self._update_buttons()
        self.render()

    def set_seed(self, seed: int | None) -> None:
        """The Settings' seed (None: auto, a fresh one each run), for what Again says."""
        self.fixed_seed = seed
        self._update_buttons()

    def show_progress(self, run: RunState, step: int) -> None:
        """The answer as it stands at the shown `step` of the run going."""
        if run.events and (run, run.clamp(step)) != self._progress_of:
            self._progress_of = (run, run.clamp(step))    # decoding and layout take a while
            self._pending, self._pending_left_out = run.text_at(run.clamp(step)), run.left_out
            self.render()

    def add_text(self, piece: str) -> None:
        """Text of the answer going, as a server that sends no steps streams it."""
        if self._pending is None:       # no answer asked for (a late piece of a finished one)
            return
        self._pending += piece
        self._streamed = True
        if not self._stream_timer.isActive():
            self._stream_timer.start()

    def add_answer(self, run: RunState) -> tuple[Conversation, Message]:
        """Save the run's answer after its question; returns where it is, for `link_recording`."""
        after = self._asking
        if after is None:       # asked without the prompt box (the smoke test): after the branch
            tail = self.conversation.branch()
            after = tail[-1] if tail else None
        self._pending, self._asking = None, None
        res = run.result
        answer = self.conversation.add(Message("assistant", res.text if res else "",
                                               answer_meta(run)), after)
        self._save()
        self.render()
        return self.conversation, answer

    def link_recording(self, conversation: Conversation, answer: Message, path: str) -> None:
        """The answer's recording is written: link it, in the conversation on disk too, unless
        the answer was cleared or its conversation deleted meanwhile."""
        if not any(m is answer for m in conversation.messages):
            return
        if conversation is not self.conversation and not self.store.path(conversation.id).is_file():
            return
        answer.meta["recording"] = path
        if conversation is self.conversation:
            self._save()
            self.render()
            return
        try:
            self.store.save(conversation)
        except DiffuseError as e:
            self._error = f"the conversation could not be saved: {e}"
            self.render()

    def show_error(self, message: str) -> None:
        """The run asked for failed: its message is marked, kept on screen, never sent again;
        asked again, its earlier answers are shown again, with the failure under them."""
        self._pending = None
        asking, self._asking = self._asking, None
        if asking is not None and any(m.parent == asking.id for m in self.conversation.messages):
            self.conversation.show(asking)
            self._save()
            self._error = message
        elif asking is not None:
            asking.meta["failed"] = message
            self._save()
        else:
            self._error = message
        self.render()

    def _update_buttons(self) -> None:
        idle = not self.busy
        can_run = idle and self.model_ready and not self.refused
        self.generate_button.setEnabled(can_run)
        self.generate_button.setToolTip(self.refused or "Generate an answer (Ctrl+Enter)")
        self.regenerate_button.setEnabled(can_run)
        if self.refused:
            again = self.refused
        elif self.fixed_seed is not None:
            again = (f"Regenerate: the Settings fix the seed at {self.fixed_seed}, so the answer "
                     f"comes out the same; set Seed to auto for a new one")
        else:
            again = ("Regenerate with a new seed; the earlier answer is kept (‹ › switches "
                     "between them)")
        self.regenerate_button.setToolTip(again)
        self.stop_button.setEnabled(self.busy)
        self.clear_button.setEnabled(idle)
        self.picker.setEnabled(idle)

    # -- view ---------------------------------------------------------------------------------

    def render(self, to_end: bool = False) -> None:
        """The conversation; the view stays at its end if it was there (or `to_end`), else where
        the user scrolled to."""
        bar = self.view.verticalScrollBar()
        at_bottom = bar.value() >= bar.maximum() - 4
        parts = []
        conv = self.conversation
        for m in conv.branch():
            versions = self._versions(conv, m)
            if m.role == "user" and "failed" in m.meta:
                why = f"<br><span style='color:#ff5c7a'>{html.escape(m.meta['failed'])}</span>"
                parts.append(self._bubble("You · run failed, not sent again", "#ff5c7a",
                                          "#2a1a20", _text_html(m.text) + why,
                                          versions + self._edit_link(m)))
            elif m.role == "user":
                parts.append(self._bubble("You", "#5ad1c8", "#1b2430", _text_html(m.text),
                                          versions + self._edit_link(m)))
            else:
                if m.meta.get("left_out"):
                    parts.append(self._notice(left_out_note(m.meta["left_out"])))
                body = _text_html(m.text) if m.text.strip() else self._no_text(m)
                parts.append(self._bubble(m.meta.get("model") or "Answer", "#f2a541", "#1a1d25",
                                          body, versions + self._answer_note(m, self._gone)))
        if self._pending_left_out and self._pending is not None:
            parts.append(self._notice(left_out_note(self._pending_left_out)))
        if self._pending is not None:
            body = _text_html(self._pending or MASK_GLYPH * 3)
            parts.append(self._bubble("Answering…" if self._streamed else "Denoising…", "#f2a541",
                                      "#1a1d25", body))
        if self._error:
            parts.append(self._bubble("Run failed", "#ff5c7a", "#2a1a20",
                                      html.escape(self._error)))
        if not parts:
            parts.append(self._empty_html())
        self.view.setHtml("".join(parts))
        if at_bottom or to_end:
            bar.setValue(bar.maximum())

    def _empty_html(self) -> str:
        """The empty chat: for the demo model, what it is and prompts it does well."""
        if not self.demo:
            return ("<p style='color:#8a90a2'>No messages yet. Type a prompt below; the canvas "
                    "shows every denoising step of the answer.</p>")
        links = "".join(f"<p>&nbsp;&nbsp;<a href='suggest:{i}' style='color:#5ad1c8'>"
                        f"{html.escape(p)}</a></p>" for i, p in enumerate(SUGGESTED_PROMPTS))
        return (f"<p style='color:#c8ccd8'>{html.escape(DEMO_ABOUT)}</p>"
                f"<p style='color:#8a90a2'>Try one (a click asks it); the canvas shows every "
                f"denoising step of the answer:</p>{links}")

    def _versions(self, conv: Conversation, m: Message) -> str:
        """‹ 2/3 › when the message has other versions (an edited question, answers asked
        again); the arrows switch branch."""
        versions = conv.siblings(m)
        if len(versions) < 2:
            return ""
        k = versions.index(m)
        big = "font-size:large; font-weight:bold; text-decoration:none"    # a target a click finds

        def arrow(kind: str, glyph: str, live: bool) -> str:
            return (f"<a href='{kind}:{m.id}' style='color:#5ad1c8; {big}'>&nbsp;{glyph}&nbsp;</a>" if live
                    else f"<span style='{big}'>&nbsp;{glyph}&nbsp;</span>")
        return (f" <span style='color:#8a90a2'>{arrow('prev', '‹', k > 0)}{k + 1}/{len(versions)}"
                f"{arrow('next', '›', k < len(versions) - 1)}</span>")

    def _edit_link(self, m: Message) -> str:
        return "" if self.busy else f" &nbsp;<a href='edit:{m.id}' style='color:#8a90a2'>edit</a>"

    @staticmethod
    def _no_text(m: Message) -> str:
        """What an answer without text says instead of an empty bubble."""
        if m.meta.get("stop_reason") == "cancelled":
            why = "stopped before any text was decided"
        else:
            why = ("no text: the model ended the answer at once (end-of-text everywhere); "
                   "try another seed, more steps or a longer answer")
        return f"<i style='color:#8a90a2'>{html.escape(why)}</i>"

    @staticmethod
    def _notice(text: str) -> str:
        return f"<p style='color:#8a90a2'><i>{html.escape(text)}</i></p>"

    @staticmethod
    def _bubble(who: str, color: str, background: str, body: str, note: str = "") -> str:
        return (f"<table width='100%' cellpadding='8' cellspacing='0' bgcolor='{background}' "
                f"style='margin-bottom:8px'><tr><td>"
                f"<span style='color:{color}; font-weight:bold'>{html.escape(who)}</span>"
                f"{note}<br>{body}</td></tr></table>")

    @staticmethod
    def _answer_note(m: Message, gone: set[str]) -> str:
        meta = m.meta
        bits = []
        if "steps" in meta:
            bits.append(f"{meta['steps']}/{meta.get('steps_allowed', '?')} steps")
        if "total_ms" in meta:
            bits.append(f"{meta['total_ms'] / 1000:.2f} s")
        if meta.get("stop_reason") == "cancelled":
            bits.append("stopped")
        # the mode, the uniform-state canvas, WeDLM's window or the scheduler (answers kept before
        # answers kept their arch: the mode or the scheduler)
        if decoding := decoding_text(meta.get("options") or {}, meta.get("arch")):
            bits.append(html.escape(decoding))
        if (seed := answer_seed(m)) is not None:      # set it in Settings to repeat the answer
            bits.append(f"seed {seed}")
        links = f" &nbsp;<a href='copy:{m.id}' style='color:#8a90a2'>copy</a>"
        if meta.get("recording") in gone:
            links += " &nbsp;<span style='color:#8a90a2'>recording gone</span>"
        elif meta.get("recording"):
            links += f" &nbsp;<a href='replay:{m.id}' style='color:#5ad1c8'>▶ replay</a>"
        return f"<span style='color:#8a90a2'> · {' · '.join(bits)}</span>{links}" if bits else links
