"""What LM Studio and Jan users expect of a chat: a system prompt, editing a question and asking
again as branches that keep the old answers (‹ 1/2 ›), the seed of every answer, exporting a
conversation, and an empty chat that says what the demo model does well."""
from __future__ import annotations

import json

import pytest
from PySide6.QtCore import QUrl

from diffuse import DiffuseError
from diffuse.studio import export, storage
from diffuse.studio.chat import ChatPanel, fit_history, system_support, with_system
from diffuse.studio.conversations import Conversation, ConversationStore, Message
from diffuse.studio.demo import DEMO_ABOUT, SUGGESTED_PROMPTS
from diffuse.studio.run_state import RunState

SMALL = {"gen_length": 48, "steps": 24, "block_length": 16, "threads": 1}


def finished_run(recorded_run, seed=None):
    run = RunState.from_recording(recorded_run("no_cache"))
    if seed is not None:
        run.options["seed"] = seed
    return run


def chat_with_answer(qtbot, recorded_run, question="one", seed=11) -> ChatPanel:
    chat = ChatPanel()
    qtbot.addWidget(chat)
    chat.set_model_ready(True, "fake.gguf")
    chat.prompt.setPlainText(question)
    chat.submit()
    chat.add_answer(finished_run(recorded_run, seed))
    return chat


def link(chat: ChatPanel, kind: str, message: Message) -> None:
    chat._link(QUrl(f"{kind}:{message.id}"))


# -- the conversation tree --------------------------------------------------------------------

def test_a_conversation_is_a_tree_whose_shown_branch_can_switch():
    conv = Conversation()
    q = conv.add(Message("user", "q"), None)
    a1 = conv.add(Message("assistant", "a1"), q)
    a2 = conv.add(Message("assistant", "a2"), q)
    assert conv.branch() == [q, a2] and conv.siblings(a2) == [a1, a2]
    conv.show(a1)
    assert conv.branch() == [q, a1]
    follow = conv.add(Message("user", "more"), a1)
    conv.show(q)                          # to the newest message under it
    assert conv.branch() == [q, a1, follow]
    conv.remove_after(q)
    assert conv.messages == [q] and conv.branch() == [q]
    conv.remove_after(None)
    assert conv.messages == [] and conv.branch() == []


def test_files_from_before_branches_load_as_one_branch(tmp_path):
    old = {"title": "old", "created": 1.0, "messages": [
        {"role": "user", "text": "hello", "meta": {}},
        {"role": "assistant", "text": "hi", "meta": {"steps": 3}},
        {"role": "user", "text": "again", "meta": {}}]}
    (tmp_path / "old1.json").write_text(json.dumps(old))
    conv = ConversationStore(tmp_path).load("old1")
    assert [m.text for m in conv.branch()] == ["hello", "hi", "again"] and conv.system == ""
    assert conv.chat_messages()[0] == {"role": "user", "content": "hello"}


@pytest.mark.parametrize("messages, leaf, why", [
    ([{"id": "a", "parent": "b"}, {"id": "b", "parent": "a"}], None, "after its parent"),   # a loop
    ([{"id": "a", "parent": "zz"}], None, "after its parent"),                              # dangling
    ([{"id": "a"}, {"id": "a"}], None, "after its parent"),                                 # twice
    ([{"id": 7}], None, "after its parent"),
    ([{"id": "a"}], 5, "leaf"),
])
def test_a_hostile_tree_is_refused_as_damaged(tmp_path, messages, leaf, why):
    msgs = [{"role": "user", "text": "x", "meta": {}, **m} for m in messages]
    (tmp_path / "bad.json").write_text(json.dumps({"title": "t", "created": 1.0, "messages": msgs,
                                                   "leaf": leaf}))
    store = ConversationStore.__new__(ConversationStore)       # without the start's sweep
    store.folder = tmp_path
    with pytest.raises(DiffuseError, match=why):
        store.load("bad")


def test_a_tree_and_its_system_prompt_survive_the_file(tmp_path):
    store = ConversationStore(tmp_path)
    conv = Conversation(system="Be brief.")
    q = conv.add(Message("user", "q"), None)
    q2 = conv.add(Message("user", "q edited"), None)          # two first questions: two branches
    conv.add(Message("assistant", "a"), q)
    conv.show(q2)
    store.save(conv)
    again = store.load(conv.id)
    assert again == conv and [m.text for m in again.branch()] == ["q edited"]


# -- asking again, editing --------------------------------------------------------------------

def test_again_keeps_the_earlier_answer_as_a_branch(qtbot, recorded_run):
    chat = chat_with_answer(qtbot, recorded_run, seed=11)
    first = chat.conversation.branch()[-1]
    assert "seed 11" in chat.view.toPlainText()
    with qtbot.waitSignal(chat.generate_requested) as req:
        chat.regenerate()
    assert req.args[1] == [{"role": "user", "content": "one"}]    # the old answer is not sent
    assert first.text not in chat.view.toPlainText() or "Denoising" in chat.view.toPlainText()
    chat.add_answer(finished_run(recorded_run, 12))
    second = chat.conversation.branch()[-1]
    assert second is not first and chat.conversation.siblings(second) == [first, second]
    text = chat.view.toPlainText()
    assert "2/2" in text and "seed 12" in text and "seed 11" not in text
    link(chat, "prev", second)
    assert chat.conversation.branch()[-1] is first and "1/2" in chat.view.toPlainText()
    reopened = ChatPanel()                # the branch shown is remembered
    qtbot.addWidget(reopened)
    assert reopened.conversation.branch()[-1].id == first.id


def test_an_edited_question_starts_a_branch_and_the_old_one_stays(qtbot, recorded_run):
    chat = chat_with_answer(qtbot, recorded_run, "first question")
    chat.prompt.setPlainText("second question")
    chat.submit()
    chat.add_answer(finished_run(recorded_run))
    old = chat.conversation.branch()
    link(chat, "edit", old[2])
    assert chat.edit_bar.isVisibleTo(chat) and chat.prompt.toPlainText() == "second question"
    chat.prompt.setPlainText("second question, put better")
    with qtbot.waitSignal(chat.generate_requested) as req:
        chat.submit()
    assert [m["content"] for m in req.args[1]] == ["first question", old[1].text,
                                                   "second question, put better"]
    assert not chat.edit_bar.isVisibleTo(chat)
    edited = chat.conversation.branch()[-1]
    assert chat.conversation.siblings(edited) == [old[2], edited]
    assert "2/2" in chat.view.toPlainText()
    link(chat, "prev", edited)                  # the old question and its answer are still there
    assert chat.conversation.branch() == old


def test_editing_can_be_cancelled_and_is_refused_while_a_run_goes(qtbot, recorded_run):
    chat = chat_with_answer(qtbot, recorded_run)
    question = chat.conversation.branch()[0]
    link(chat, "edit", question)
    chat.cancel_edit()
    assert chat.prompt.toPlainText() == "" and not chat.edit_bar.isVisibleTo(chat)
    chat.set_busy(True)
    link(chat, "edit", question)
    assert chat.prompt.toPlainText() == "" and "edit:" not in chat.view.toHtml()


def test_a_failed_again_shows_the_earlier_answer_with_the_failure(qtbot, recorded_run):
    chat = chat_with_answer(qtbot, recorded_run)
    answer = chat.conversation.branch()[-1]
    chat.regenerate()
    chat.show_error("the engine said no")
    assert chat.conversation.branch()[-1] is answer
    assert "failed" not in chat.conversation.branch()[0].meta
    assert "the engine said no" in chat.view.toPlainText()


def test_again_says_whether_it_brings_a_new_seed(qtbot, window, fake_model):
    window.set_model(fake_model(step_delay=0))
    assert "new seed" in window.chat.regenerate_button.toolTip()
    window.settings_panel.set_options({"seed": 7})
    assert "fix the seed at 7" in window.chat.regenerate_button.toolTip()
    window.settings_panel.set_options({"seed": None})
    assert "new seed" in window.chat.regenerate_button.toolTip()


# -- the system prompt ------------------------------------------------------------------------

class NoSystemTokenizer:
    """A template that drops system turns, as some do (Gemma's refuses them)."""

    chat_template = "no system"

    def apply_chat_template(self, messages):
        return "".join(f"<{m['role']}>{m['content']}" for m in messages if m["role"] != "system")

    def encode_chat(self, messages):
        return [ord(c) for c in self.apply_chat_template(messages)]


def test_how_a_system_prompt_reaches_the_model(fake_model):
    tok = fake_model().tokenizer
    assert system_support(tok) == "system"
    assert system_support(NoSystemTokenizer()) == "merged"
    assert system_support(type("T", (), {"chat_template": None})()) == "none"
    msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"}]
    assert with_system(msgs, "system") == msgs
    assert with_system(msgs, "merged") == [{"role": "user", "content": "Be brief.\n\nhi"}]
    assert with_system(msgs, "none") == msgs[1:]


def test_the_system_prompt_is_kept_when_old_turns_are_left_out(fake_model):
    tok = fake_model().tokenizer
    system = [{"role": "system", "content": "s" * 30}]
    turns = [{"role": r, "content": c * 40} for r, c in
             (("user", "a"), ("assistant", "b"), ("user", "c"))]
    ids, left_out = fit_history(tok, system + turns, gen_length=100, n_ctx=200)
    assert left_out == 2 and ids == tok.encode_chat(system + turns[2:])
    ids, _ = fit_history(NoSystemTokenizer(), system + turns, 100, 250, "merged")
    assert ids == NoSystemTokenizer().encode_chat(
        [{"role": "user", "content": "s" * 30 + "\n\n" + "c" * 40}])


def test_the_system_prompt_is_saved_and_sent_first(qtbot, window, fake_model):
    model = fake_model(step_delay=0)
    window.set_model(model)
    window.settings_panel.set_options(SMALL)
    chat = window.chat
    qtbot.waitUntil(lambda: "system turn" in chat.system_note.text(), timeout=10000)
    chat.system_button.click()
    assert chat.system_box.isVisible() and chat.system_note.isVisible()
    chat.system_box.setPlainText("Answer in one line.")
    assert "●" in chat.system_button.text() and "Answer in one line." in chat.system_button.toolTip()
    chat.prompt.setPlainText("hello")
    with qtbot.waitSignal(window.engine.run_finished, timeout=10000):
        chat.submit()
    tok = model.tokenizer
    assert model.calls[-1]["prompt"] == tok.encode_chat(
        [{"role": "system", "content": "Answer in one line."}, {"role": "user", "content": "hello"}])
    saved = json.loads(chat.store.path(chat.conversation.id).read_text())
    assert saved["system"] == "Answer in one line."
    chat.new_conversation()                    # per conversation
    assert chat.system_box.toPlainText() == "" and "●" not in chat.system_button.text()


def test_a_template_without_a_system_turn_is_said(qtbot, window, fake_model):
    model = fake_model(step_delay=0)
    model.tokenizer.apply_chat_template = NoSystemTokenizer().apply_chat_template
    window.set_model(model)
    qtbot.waitUntil(lambda: "no system turn" in window.chat.system_note.text(), timeout=10000)


# -- export -----------------------------------------------------------------------------------

def test_a_conversation_exports_as_markdown_and_json(qtbot, recorded_run, tmp_path):
    chat = chat_with_answer(qtbot, recorded_run, "Tell me about Mr. Darcy.", seed=42)
    conv = chat.conversation
    conv.system = "Be brief."
    md = export.save_conversation(conv, tmp_path / "chat.md").read_text()
    answer = conv.branch()[-1]
    assert "## System prompt\n\nBe brief." in md and "## You\n\nTell me about Mr. Darcy." in md
    assert "seed 42" in md and answer.text.strip() in md
    export.save_conversation(conv, tmp_path / "chat.json")
    copy = tmp_path / "copies"
    copy.mkdir()
    (copy / "imported.json").write_bytes((tmp_path / "chat.json").read_bytes())
    back = ConversationStore(copy).load("imported")           # the app reads its own export back
    assert back.messages == conv.messages and back.system == "Be brief."
    assert not list(tmp_path.glob(".*.part"))                # written atomically


def test_an_export_never_lands_in_the_apps_own_folder(qtbot, recorded_run, tmp_path):
    chat = chat_with_answer(qtbot, recorded_run)
    own = chat.store.path(chat.conversation.id)
    before = own.read_bytes()
    with pytest.raises(DiffuseError, match="app's own folder"):
        export.save_conversation(chat.conversation, own)
    with pytest.raises(DiffuseError, match="app's own folder"):
        export.save_conversation(chat.conversation, storage.runs_dir() / "x.md")
    with pytest.raises(DiffuseError, match=r"\.md .*or \.json"):
        export.save_conversation(chat.conversation, tmp_path / "x.npz")
    with pytest.raises(DiffuseError, match="does not exist"):
        export.save_conversation(chat.conversation, tmp_path / "nowhere" / "x.md")
    assert own.read_bytes() == before


def test_the_window_exports_through_a_file_dialog(qtbot, window, recorded_run, tmp_path, monkeypatch):
    from diffuse.studio import main_window
    window.chat.conversation.add(Message("user", "hello"), None)
    target = tmp_path / "talk"
    monkeypatch.setattr(main_window.QFileDialog, "getSaveFileName",
                        lambda *a: (str(target), "JSON (*.json)"))
    window.chat.export_button.click()
    assert json.loads((tmp_path / "talk.json").read_text())["messages"][0]["text"] == "hello"
    assert "exported" in window.statusBar().currentMessage()
    monkeypatch.setattr(main_window.QFileDialog, "getSaveFileName",
                        lambda *a: (str(storage.conversations_dir() / "x.md"), "Markdown (*.md)"))
    window.export_conversation(storage.conversations_dir() / "x.md")
    assert "app's own folder" in window.statusBar().currentMessage()


# -- the empty chat ---------------------------------------------------------------------------

def test_the_demo_models_empty_chat_frames_it_and_offers_prompts(qtbot, window, fake_model):
    window.set_model(fake_model(path=storage.demo_model(), step_delay=0))
    window.settings_panel.set_options(SMALL)
    chat = window.chat
    text = chat.view.toPlainText()
    assert DEMO_ABOUT in text and all(p in text for p in SUGGESTED_PROMPTS)
    with qtbot.waitSignal(window.engine.run_finished, timeout=10000):
        chat._link(QUrl("suggest:1"))
    assert chat.conversation.branch()[0].text == SUGGESTED_PROMPTS[1]
    chat.new_conversation()
    window.set_model(fake_model(path="elsewhere/real-model.gguf", step_delay=0))
    assert DEMO_ABOUT not in chat.view.toPlainText() and "No messages yet" in chat.view.toPlainText()


def test_again_draws_a_new_seed_unless_the_settings_fix_one(qtbot, window, fake_model):
    model = fake_model(step_delay=0)
    window.set_model(model)
    window.settings_panel.set_options(SMALL)
    chat = window.chat
    chat.prompt.setPlainText("hello")
    with qtbot.waitSignal(window.engine.run_finished, timeout=10000):
        chat.submit()
    for _ in range(2):
        with qtbot.waitSignal(window.engine.run_finished, timeout=10000):
            chat.regenerate()
    answers = chat.conversation.siblings(chat.conversation.branch()[-1])
    seeds = [a.meta["options"]["seed"] for a in answers]
    assert len(answers) == 3 and len(set(seeds)) == 3         # each as the engine drew it
    assert [call["seed"] for call in model.calls] == seeds
    assert f"seed {seeds[-1]}" in chat.view.toPlainText()
    window.settings_panel.set_options({**SMALL, "seed": 5})
    with qtbot.waitSignal(window.engine.run_finished, timeout=10000):
        chat.regenerate()
    assert model.calls[-1]["seed"] == 5 and "seed 5" in chat.view.toPlainText()


def test_an_answers_architecture_survives_the_file_also_when_unknown(tmp_path):
    """An answer keeps its model's architecture (its header says how it decoded); a model that did
    not say one (None) must not make the whole conversation unreadable."""
    store = ConversationStore(tmp_path)
    conv = Conversation()
    q = conv.add(Message("user", "q"), None)
    conv.add(Message("assistant", "a", {"arch": "diffusion-gemma"}), q)
    conv.add(Message("assistant", "b", {"arch": None}), q)
    store.save(conv)
    assert store.load(conv.id) == conv
