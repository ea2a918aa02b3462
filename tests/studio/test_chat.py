"""The chat holds up: a long conversation is fitted to the model's context (and says so), a
failed message is kept but never sent again, the live bubble shows readable text, Clear and
Delete ask first, and the prompt is encoded in one place, on the engine thread."""
from __future__ import annotations

import dataclasses
import json
import threading

import numpy as np
import pytest

from diffuse import DiffuseError
from diffuse.events import StepEvent
from diffuse.studio.chat import ChatPanel, fit_history
from diffuse.studio.conversations import ConversationStore, Message
from diffuse.studio.run_state import MASK_GLYPH, RunState

SMALL = {"gen_length": 48, "steps": 24, "block_length": 16, "threads": 1}


def ask(qtbot, window, prompt: str, signal="run_finished"):
    window.chat.prompt.setPlainText(prompt)
    with qtbot.waitSignal(getattr(window.engine, signal), timeout=10000) as done:
        window.chat.submit()
    return done.args[0]


def sent(model, call: int = -1) -> list[int]:
    return model.calls[call]["prompt"]


def test_fit_history_drops_whole_exchanges_from_the_start(fake_model):
    tok = fake_model().tokenizer            # one token per character, "<role>text" per message
    msgs = [{"role": r, "content": c * 40} for r, c in
            (("user", "a"), ("assistant", "b"), ("user", "c"), ("assistant", "d"), ("user", "e"))]
    ids, left_out = fit_history(tok, msgs, gen_length=100, n_ctx=256)
    assert left_out == 2 and ids == tok.encode(tok.apply_chat_template(msgs[2:]))
    assert fit_history(tok, msgs, gen_length=10, n_ctx=256)[1] == 0
    with pytest.raises(DiffuseError, match="context of 256"):
        fit_history(tok, msgs, gen_length=220, n_ctx=256)


def test_a_long_chat_is_fitted_to_the_context_and_says_which_turns_are_left_out(
        qtbot, window, fake_model):
    model = fake_model(step_delay=0)
    window.set_model(model)
    window.settings_panel.set_options(SMALL)
    window.timeline.pace.setValue(0)
    room = model.n_ctx_train - SMALL["gen_length"]
    for k in range(4):
        run = ask(qtbot, window, f"question {k}: " + "tell me more " * 5)
        assert run.result is not None and len(sent(model)) <= room
    assert run.left_out >= 2
    msgs = window.chat.conversation.chat_messages()[:-1]     # as sent with the last question
    tok = model.tokenizer
    assert sent(model) == tok.encode(tok.apply_chat_template(msgs[run.left_out:]))
    answer = window.chat.conversation.messages[-1]
    assert answer.meta["left_out"] == run.left_out
    assert (f"The {run.left_out} oldest messages of this conversation were left out"
            in window.chat.view.toPlainText())
    assert ChatPanel().conversation.messages[-1].meta["left_out"] == run.left_out   # on disk


def test_a_question_too_long_for_the_context_fails_with_the_reason(qtbot, window, fake_model):
    window.set_model(fake_model(step_delay=0))
    window.settings_panel.set_options(SMALL)
    ask(qtbot, window, "x" * 300, signal="run_failed")
    assert "exceeds the model's context of 256" in window.chat.view.toPlainText()


def test_a_failed_message_stays_marked_and_is_not_sent_again(qtbot, window, fake_model):
    class Broken(fake_model):
        def generate(self, prompt, **kw):
            raise DiffuseError("the engine said no")
    window.set_model(Broken(step_delay=0))
    ask(qtbot, window, "this one fails", signal="run_failed")
    failed = window.chat.conversation.messages[-1]
    assert failed.meta["failed"] == "the engine said no"
    text = window.chat.view.toPlainText()
    assert "this one fails" in text and "not sent again" in text and "the engine said no" in text
    model = fake_model(step_delay=0)
    window.set_model(model)
    window.settings_panel.set_options(SMALL)
    ask(qtbot, window, "this one works")
    tok = model.tokenizer
    assert sent(model) == tok.encode(tok.apply_chat_template(
        [{"role": "user", "content": "this one works"}]))
    saved = json.loads(window.chat.store.path(window.chat.conversation.id).read_text())
    assert saved["messages"][0]["meta"]["failed"] == "the engine said no"   # kept on disk
    # "Again" on a failed question retries it, and then it counts
    window.chat.conversation.messages[1:] = []
    with qtbot.waitSignal(window.engine.run_finished, timeout=10000):
        window.chat.regenerate()
    assert "failed" not in window.chat.conversation.messages[0].meta
    assert sent(model) == tok.encode(tok.apply_chat_template(
        [{"role": "user", "content": "this one fails"}]))


def test_the_prompt_is_encoded_once_on_the_engine_thread(qtbot, window, fake_model):
    model = fake_model(step_delay=0)
    threads = []
    encode = model.tokenizer.encode
    model.tokenizer.encode = lambda text: threads.append(threading.get_ident()) or encode(text)
    window.set_model(model)
    window.settings_panel.set_options(SMALL)
    ask(qtbot, window, "count me once")
    assert len(threads) == 1 and threading.get_ident() not in threads


# -- the live bubble ----------------------------------------------------------------------------

# byte-level pieces: "é" is split over two tokens, 5 is a special token, 9 end of text
BYTES = {1: b" caf", 2: b"\xc3", 3: b"\xa9", 4: b" ok", 5: b"<|start_header_id|>", 9: b""}
MASK = 0


def decode(ids):
    return b"".join(BYTES[i] for i in ids).decode("utf-8", errors="replace")


def event(step: int, tokens: list[int]) -> StepEvent:
    t = np.array([7] + tokens, np.int32)              # one prompt token
    n = t.shape[0]
    nan = np.full(n, np.nan, np.float32)
    return StepEvent(step=step, block=0, n_blocks=1, steps_allowed=2, prompt_length=1,
                     block_start=1, block_end=n, tokens=t, mask=t == MASK,
                     unmasked=np.zeros(0, np.int32), entropy=nan, confidence=nan,
                     active=np.arange(n, dtype=np.int32), cached=np.zeros(0, np.int32),
                     forward_ms=1.0, sample_ms=1.0, total_ms=2.0)


def test_live_text_hides_special_tokens_and_holds_back_split_characters(qtbot):
    run = RunState("p", {}, {"eos_ids": [9], "special_ids": [5]}, decode)
    run.add(event(0, [1, 2, MASK, 5, 4, 9, MASK]))
    run.add(event(1, [1, 2, 3, 5, 4, 9, 4]))
    assert run.text_at(0) == f" caf{MASK_GLYPH} ok"      # the cut "é" waits for its other half
    assert run.text_at(1) == " café ok"                   # whole; nothing after end of text
    chat = ChatPanel()
    qtbot.addWidget(chat)
    chat.show_progress(run, 0)
    shown = chat.view.toPlainText()
    assert " caf" in shown and "start_header_id" not in shown and "\ufffd" not in shown


# -- clear and delete ---------------------------------------------------------------------------

def answer(chat: ChatPanel, button: str) -> None:
    next(b for b in chat.confirm_box.buttons() if b.text() == button).click()


def test_clear_and_delete_ask_first_and_keep_the_file_until_confirmed(qtbot):
    chat = ChatPanel()
    qtbot.addWidget(chat)
    chat.set_model_ready(True)
    chat.prompt.setPlainText("keep me")
    chat.submit()
    path = chat.store.path(chat.conversation.id)

    def on_disk() -> list[str]:
        return [m["text"] for m in json.loads(path.read_text())["messages"]]
    chat.clear()
    assert chat.confirm_box.isVisible() and on_disk() == ["keep me"]
    answer(chat, "Cancel")
    assert on_disk() == ["keep me"] and "keep me" in chat.view.toPlainText()
    chat.clear()
    answer(chat, "Clear")
    assert on_disk() == [] and chat.conversation.messages == []
    chat.prompt.setPlainText("delete me")
    chat.submit()
    chat.delete_conversation()
    assert path.exists() and chat.confirm_box.isVisible()
    answer(chat, "Cancel")
    assert path.exists() and chat.conversation.messages[0].text == "delete me"
    chat.delete_conversation()
    answer(chat, "Delete")
    assert not path.exists() and chat.conversation.messages == []
    assert ConversationStore().list() == []


def test_an_empty_prompt_and_an_answer_without_text_say_so(qtbot, window, fake_model, recorded_run):
    window.set_model(fake_model(step_delay=0))
    window.chat.prompt.setPlainText("  \n ")
    window.chat.submit()
    assert not window.engine.busy and window.chat.hint.text().startswith("Type a prompt first")
    rec = recorded_run("eos")
    rec.result = dataclasses.replace(rec.result, text="")       # end-of-text everywhere
    run = RunState.from_recording(rec)
    window.chat.add_answer(run)
    assert "no text: the model ended the answer at once" in window.chat.view.toPlainText()
    ask(qtbot, window, "Tell me about Mr. Darcy.")        # the hint is the model's again
    assert window.chat.hint.text() == "Model: diffuse-demo-3m.gguf"


def test_a_diffusion_gemma_answer_names_its_canvas_not_a_scheduler():
    """A DiffusionGemma run's options hold a scheduler (every run's do) that its uniform-state
    canvas does not use: its header says the canvas and its steps per canvas."""
    meta = {"options": {"scheduler": "low_confidence", "steps": 48}, "arch": "diffusion-gemma",
            "steps": 48, "steps_allowed": 768, "total_ms": 330}
    note = ChatPanel._answer_note(Message("assistant", "x", meta), set())
    assert "48/768 steps · 0.33 s · uniform-state canvas, up to 48 steps per canvas" in note
    assert "low_confidence" not in note
    left_to_the_model = ChatPanel._answer_note(Message("assistant", "x", {**meta, "options": {}}), set())
    assert "uniform-state canvas, up to " in left_to_the_model and "up to None" not in left_to_the_model


def test_a_new_question_scrolls_the_chat_to_it_wherever_it_was(qtbot, window, fake_model):
    """Reopened, a long chat showed its top, and the view followed new answers only from its end:
    a question asked from anywhere lands in sight with its answer."""
    window.set_model(fake_model())
    window.resize(1024, 700)
    window.chat.view.setFixedHeight(120)
    for i in range(4):
        ask(qtbot, window, f"question {i}")
    bar = window.chat.view.verticalScrollBar()
    assert bar.maximum() > 0
    bar.setValue(0)                          # as a reopened chat, or a user reading back
    ask(qtbot, window, "the last question")
    assert bar.value() == bar.maximum()
