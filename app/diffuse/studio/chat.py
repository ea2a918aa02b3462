"""Chat panel: the conversation, the prompt box and the run buttons.

While a run goes, the answer being denoised is shown as it stands (committed text, masks as ░);
when it ends the decoded answer replaces it and is saved, and once the run's recording is written
the answer links to it (a link is never saved before its file exists; one whose file has gone
since is said to be gone when the conversation is opened). The
conversation goes into the prompt with its oldest turns left out as far as the model's context
requires (the chat says so); a message whose run failed stays on screen, marked, and is not sent
again. Clear and Delete ask first.
"""
from __future__ import annotations

import html
import time
from pathlib import Path
from typing import Callable

from PySide6.QtCore import QUrl, Signal
from PySide6.QtGui import QGuiApplication, QKeySequence, QShortcut
from PySide6.QtWidgets import (QGridLayout, QHBoxLayout, QMessageBox, QPlainTextEdit, QPushButton,
                               QTextBrowser, QVBoxLayout, QWidget)

from diffuse import DiffuseError
from diffuse.studio import theme
from diffuse.studio.conversations import Conversation, ConversationStore, Message
from diffuse.studio.run_state import MASK_GLYPH, RunState


def _text_html(text: str) -> str:
    """Message text as HTML, whitespace kept (answers may hold code), masks dimmed."""
    body = html.escape(text).replace(MASK_GLYPH, f"<span style='color:#4a5064'>{MASK_GLYPH}</span>")
    return f"<span style='white-space:pre-wrap'>{body}</span>"


def fit_history(tokenizer, messages: list[dict], gen_length: int,
                n_ctx: int) -> tuple[list[int], int]:
    """Token ids of the templated conversation with its oldest turns left out, whole exchanges
    at a time, until the prompt and `gen_length` fit in the model's `n_ctx` positions; and how
    many messages were left out. DiffuseError if the latest message alone does not fit."""
    room = n_ctx - gen_length
    for start in (i for i, m in enumerate(messages) if m["role"] == "user"):
        ids = tokenizer.encode_chat(messages[start:])
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
            "recording": None, "time": time.time()}
    if run.left_out:
        meta["left_out"] = run.left_out
    if res is not None:
        meta.update(steps=res.steps, steps_allowed=res.steps_allowed, total_ms=res.total_ms,
                    stop_reason=res.stop_reason,
                    tokens_per_s=round(res.buffer_tokens_per_s, 2))
    return meta


class ChatPanel(QWidget):
    generate_requested = Signal(str, object)   # prompt text, chat messages (list of dicts)
    stop_requested = Signal()
    replay_requested = Signal(str)             # recording path

    def __init__(self, store: ConversationStore | None = None, parent=None):
        super().__init__(parent)
        self.store = store or ConversationStore()
        self.conversation = Conversation()
        self._pending: str | None = None       # the answer being denoised, as it stands
        self._pending_left_out = 0             # messages its prompt left out
        self._progress_of: tuple | None = None  # (run, step) the pending answer shows
        self._asking: Message | None = None    # the user's message of the run going
        self._error: str | None = None         # a failure no message of the chat asked for
        self._gone: set[str] = set()           # recordings linked from this conversation, missing
        self.confirm_box: QMessageBox | None = None
        self.busy = False
        self.refused = ""                      # why another part's run keeps the chat from running
        self.model_ready = False
        self._ready_hint = ""

        self.picker = theme.ElidedComboBox(6)    # its tooltip: the whole title
        self.picker.activated.connect(self._picked)
        new = QPushButton("New")
        new.setToolTip("Start a new conversation")
        new.clicked.connect(self.new_conversation)
        delete = QPushButton("Delete")
        delete.setToolTip("Delete this conversation")
        delete.clicked.connect(self.delete_conversation)
        top = QHBoxLayout()
        top.addWidget(self.picker, 1)
        top.addWidget(new)
        top.addWidget(delete)

        self.view = QTextBrowser()
        self.view.setOpenLinks(False)
        self.view.anchorClicked.connect(self._link)
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
        self.regenerate_button.setToolTip("Regenerate: drop the last answer and ask again")
        self.regenerate_button.clicked.connect(self.regenerate)
        self.copy_button = QPushButton("Copy")
        self.copy_button.setToolTip("Copy the last answer to the clipboard")
        self.copy_button.clicked.connect(self.copy_answer)
        self.clear_button = QPushButton("Clear")
        self.clear_button.setToolTip("Remove every message of this conversation")
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
        layout.addWidget(self.view, 1)
        layout.addWidget(self.prompt)
        layout.addWidget(self.hint)
        layout.addLayout(buttons)
        for keys in ("Ctrl+Return", "Ctrl+Enter"):
            QShortcut(QKeySequence(keys), self.prompt, self.submit)

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
        self._check_recordings()
        self._refresh_picker()
        self.render()

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
        try:
            self.conversation = self.store.load(cid)
        except DiffuseError as e:
            QMessageBox.warning(self, "Diffuse Studio", str(e))
        self._check_recordings()
        self._error = None
        self._refresh_picker()
        self.render()

    def new_conversation(self) -> None:
        if self.busy:
            return
        self.conversation = Conversation()
        self._error, self._gone = None, set()
        self._refresh_picker()
        self.render()
        self.prompt.setFocus()

    def delete_conversation(self) -> None:
        if self.busy:
            return
        conv = self.conversation

        def delete():
            self.store.delete(conv.id)
            self.conversation = Conversation()
            self._restore()
        if conv.messages:
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
        try:
            self.store.save(self.conversation)
        except DiffuseError as e:   # a full disk or a read-only folder: said, the chat goes on in memory
            self._error = f"the conversation could not be saved: {e}"
        self._refresh_picker()

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
        message = Message("user", text)
        self.conversation.messages.append(message)
        self._save()
        self._request(message)

    def regenerate(self) -> None:
        """Drop the last answer and ask again with the same prompt (a failed one included)."""
        msgs = self.conversation.messages
        if self.busy or not self.model_ready or not msgs:
            return
        if self.refused:
            return
        if msgs[-1].role == "assistant":
            msgs.pop()
        if msgs and msgs[-1].role == "user":
            msgs[-1].meta.pop("failed", None)
            self._save()
            self._request(msgs[-1])

    def _request(self, message: Message) -> None:
        self.hint.setText(self._ready_hint)     # a note of the last action is old news
        self._error = None
        self._asking = message
        self._pending, self._pending_left_out = "", 0
        self.render()
        self.generate_requested.emit(message.text, self.conversation.chat_messages())

    def copy_answer(self) -> None:
        answer = next((m.text for m in reversed(self.conversation.messages)
                       if m.role == "assistant"), None)
        if answer is not None:
            QGuiApplication.clipboard().setText(answer)
            self.hint.setText("Answer copied to the clipboard")

    def clear(self) -> None:
        if self.busy or not self.conversation.messages:
            return
        def clear():
            self.conversation.messages.clear()
            self._error = None
            self._save()
            self.render()
        self._confirm(f"Remove all {len(self.conversation.messages)} messages of "
                      f"“{self.conversation.title}”?", "Clear", clear)

    def _link(self, url: QUrl) -> None:
        kind, _, index = url.toString().partition(":")
        try:
            msg = self.conversation.messages[int(index)]
        except (ValueError, IndexError):
            return
        if kind == "copy":
            QGuiApplication.clipboard().setText(msg.text)
            self.hint.setText("Copied to the clipboard")
        elif kind == "replay" and msg.meta.get("recording") not in self._gone | {None}:
            self.replay_requested.emit(msg.meta["recording"])   # the window says if it is gone since

    # -- run feedback -------------------------------------------------------------------------

    def set_busy(self, busy: bool) -> None:
        self.busy = busy
        self._update_buttons()

    def set_refusal(self, reason: str) -> None:
        """Why the chat may not run now (another part holds the model), or ""."""
        self.refused = reason
        self.hint.setText(reason or self._ready_hint)
        self._update_buttons()

    def set_model_ready(self, ready: bool, name: str = "") -> None:
        self.model_ready = ready
        self._ready_hint = f"Model: {name}" if ready else "Load a model in the Models tab first"
        self.hint.setText(self._ready_hint)
        self._update_buttons()

    def show_progress(self, run: RunState, step: int) -> None:
        """The answer as it stands at the shown `step` of the run going."""
        if run.events and (run, run.clamp(step)) != self._progress_of:
            self._progress_of = (run, run.clamp(step))    # decoding and layout take a while
            self._pending, self._pending_left_out = run.text_at(run.clamp(step)), run.left_out
            self.render()

    def add_answer(self, run: RunState) -> tuple[Conversation, Message]:
        """Save the run's answer; returns where it is, for `link_recording`."""
        self._pending, self._asking = None, None
        res = run.result
        answer = Message("assistant", res.text if res else "", answer_meta(run))
        self.conversation.messages.append(answer)
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
        """The run asked for failed: its message is marked, kept on screen, never sent again."""
        self._pending = None
        if self._asking is not None:
            self._asking.meta["failed"] = message
            self._asking = None
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
        self.stop_button.setEnabled(self.busy)
        self.clear_button.setEnabled(idle)
        self.picker.setEnabled(idle)

    # -- view ---------------------------------------------------------------------------------

    def render(self) -> None:
        bar = self.view.verticalScrollBar()
        at_bottom = bar.value() >= bar.maximum() - 4
        parts = []
        for i, m in enumerate(self.conversation.messages):
            if m.role == "user" and "failed" in m.meta:
                why = f"<br><span style='color:#ff5c7a'>{html.escape(m.meta['failed'])}</span>"
                parts.append(self._bubble("You · run failed, not sent again", "#ff5c7a",
                                          "#2a1a20", _text_html(m.text) + why))
            elif m.role == "user":
                parts.append(self._bubble("You", "#5ad1c8", "#1b2430", _text_html(m.text)))
            else:
                if m.meta.get("left_out"):
                    parts.append(self._notice(left_out_note(m.meta["left_out"])))
                body = _text_html(m.text) if m.text.strip() else self._no_text(m)
                parts.append(self._bubble(m.meta.get("model") or "Answer", "#f2a541", "#1a1d25",
                                          body, self._answer_note(i, m, self._gone)))
        if self._pending_left_out and self._pending is not None:
            parts.append(self._notice(left_out_note(self._pending_left_out)))
        if self._pending is not None:
            body = _text_html(self._pending or MASK_GLYPH * 3)
            parts.append(self._bubble("Denoising…", "#f2a541", "#1a1d25", body))
        if self._error:
            parts.append(self._bubble("Run failed", "#ff5c7a", "#2a1a20",
                                      html.escape(self._error)))
        if not parts:
            parts.append("<p style='color:#8a90a2'>No messages yet. Type a prompt below; the "
                         "canvas shows every denoising step of the answer.</p>")
        self.view.setHtml("".join(parts))
        if at_bottom:
            bar.setValue(bar.maximum())

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
    def _answer_note(i: int, m: Message, gone: set[str]) -> str:
        meta = m.meta
        bits = []
        if "steps" in meta:
            bits.append(f"{meta['steps']}/{meta.get('steps_allowed', '?')} steps")
        if "total_ms" in meta:
            bits.append(f"{meta['total_ms'] / 1000:.2f} s")
        if meta.get("stop_reason") == "cancelled":
            bits.append("stopped")
        sched = (meta.get("options") or {}).get("scheduler")
        if sched:
            bits.append(sched)
        links = f" &nbsp;<a href='copy:{i}' style='color:#8a90a2'>copy</a>"
        if meta.get("recording") in gone:
            links += " &nbsp;<span style='color:#8a90a2'>recording gone</span>"
        elif meta.get("recording"):
            links += f" &nbsp;<a href='replay:{i}' style='color:#5ad1c8'>▶ replay</a>"
        return f"<span style='color:#8a90a2'> · {' · '.join(bits)}</span>{links}" if bits else links
