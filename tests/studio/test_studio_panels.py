"""Settings panel (options, persistence) and chat panel with its conversation store."""
from __future__ import annotations

import json
import os

import pytest
from PySide6.QtGui import QGuiApplication
from PySide6.QtCore import QUrl
from PySide6.QtWidgets import QDoubleSpinBox, QLabel

import diffuse
from diffuse import DiffuseError
from diffuse.generation import OPTIONS, SCHEDULERS, default_options, resolve_options
from diffuse.studio import storage
from diffuse.studio.chat import ChatPanel
from diffuse.studio.conversations import Conversation, ConversationStore, Message
from diffuse.studio.run_state import RunState
from diffuse.studio.settings_panel import SettingsPanel


# -- settings ---------------------------------------------------------------------------------

def test_auto_values_leave_options_to_the_model(qtbot):
    panel = SettingsPanel()
    qtbot.addWidget(panel)
    opts = panel.options()
    assert set(opts) == {o["name"] for o in OPTIONS} | {"threads", "chat"}
    assert opts["scheduler"] is None and opts["steps"] is None and opts["threshold"] is None
    assert opts["cache"] is default_options("llada")["cache"] and opts["chat"] is True
    scheduler = panel.fields["scheduler"]
    assert [scheduler.itemText(i) for i in range(1, scheduler.count())] == SCHEDULERS


def test_options_are_remembered(qtbot):
    panel = SettingsPanel()
    qtbot.addWidget(panel)
    wanted = {"scheduler": "entropy_exit", "steps": 64, "gen_length": 96, "block_length": 32,
              "threshold": 0.8, "cache": False, "keep_active": 2, "refresh_every": 16,
              "temperature": 0.7, "top_k": 40, "top_p": 0.9, "alg_temp": 0.5, "cfg_scale": 1.5,
              "eps": 0.0001, "seed": 42, "threads": 1, "chat": False,
              "confidence_threshold": 0.85, "entropy_budget": 0.5, "sub_block_length": 4, "factor": 0.5,
              "carry_first": True, "cache_policy": "prefix", "suffix_window": 8, "eos_stop": "holds_eos",
              "editing_threshold": 0.5, "max_post_steps": 4, "temperature_end": 0.3, "stability": 2,
              "stop_entropy": 0.01, "mode": "self_spec", "draft_length": 8, "draft_lora": False,
              "window_size": 8, "pos_penalty": 0.05}
    panel.set_options(wanted)
    panel.save()
    again = SettingsPanel()
    qtbot.addWidget(again)
    assert again.options() == wanted
    assert not again.fields["keep_active"].isEnabled()          # cache off: its knobs are greyed out
    again.reset()
    assert again.options()["steps"] is None


def test_edits_save_immediately_and_damaged_entries_are_ignored(qtbot):
    panel = SettingsPanel()
    qtbot.addWidget(panel)
    panel.fields["steps"].setValue(48)
    s = storage.settings()
    assert s.value("generation/steps") in (48, "48")
    s.setValue("generation/gen_length", "lots")
    s.setValue("generation/scheduler", "no_such_scheduler")
    s.sync()
    again = SettingsPanel()
    qtbot.addWidget(again)
    assert again.options()["steps"] == 48
    assert again.options()["gen_length"] is None and again.options()["scheduler"] is None


def test_model_defaults_are_shown(qtbot):
    panel = SettingsPanel()
    qtbot.addWidget(panel)
    panel.show()
    panel.show_defaults("llada")
    d = default_options("llada")
    assert panel.defaults_note["steps"].text() == f"model default: {d['steps']}"
    assert panel.defaults_note["block_length"].isVisible()
    assert d["seed"] is None and panel.defaults_note["seed"].text() == "random: a new one each run"
    panel.show_defaults("llada", recipe={"seed": 7})      # a file's recipe may name one
    assert panel.defaults_note["seed"].text() == "model default: 7"
    panel.show_defaults(None)
    assert not panel.defaults_note["steps"].isVisible()


def _engine_options(panel) -> dict:
    return {k: v for k, v in panel.options().items() if k not in ("threads", "chat")}


@pytest.mark.parametrize("arch", ["llada", "dream"])
def test_every_value_the_panel_allows_is_accepted_by_the_engine(qtbot, arch):
    """Each number field at its least and greatest value passes resolve_options, and its "auto"
    slot just below (None: the family default) lies outside the engine's range."""
    panel = SettingsPanel()
    qtbot.addWidget(panel)
    assert set(panel.fields) == {o["name"] for o in OPTIONS}
    panel.set_options({"mode": "self_spec"})      # every field on (an off one is not sent): the draft's too
    resolve_options(arch, **_engine_options(panel))
    for o in OPTIONS:
        box = panel.fields[o["name"]]
        assert o["help"] in box.toolTip() and o["range"] in box.toolTip()
        if o["kind"] in ("bool", "choice"):
            continue
        unit = 10.0 ** -box.decimals() if isinstance(box, QDoubleSpinBox) else 1
        auto = box.minimum()
        assert auto < o["min"] or (o["min_open"] and auto == o["min"])
        for value in (round(auto + unit, 10), box.maximum()):
            box.setValue(value)
            assert panel.options()[o["name"]] == value
            resolve_options(arch, **_engine_options(panel))
        box.setValue(auto)
        assert panel.options()[o["name"]] is None
    for name in SCHEDULERS:
        panel.set_options({"scheduler": name})
        assert resolve_options(arch, **_engine_options(panel))["scheduler"] == name


def test_keep_active_cannot_be_zero(qtbot):
    panel = SettingsPanel()
    qtbot.addWidget(panel)
    box = panel.fields["keep_active"]
    box.setValue(0)
    assert box.value() == box.minimum() and panel.options()["keep_active"] is None
    box.setValue(1)
    assert panel.options()["keep_active"] == 1
    storage.settings().setValue("generation/keep_active", "0")      # saved by an older panel
    again = SettingsPanel()
    qtbot.addWidget(again)
    assert again.options()["keep_active"] is None


def test_first_step_up_from_auto_lands_on_the_step_grid(qtbot):
    panel = SettingsPanel()
    qtbot.addWidget(panel)
    for name, first in (("threshold", 0.0), ("top_p", 0.05), ("eps", 0.001), ("keep_active", 1)):
        panel.fields[name].stepBy(1)
        assert panel.options()[name] == pytest.approx(first)


def test_threads_auto_means_the_physical_cores(qtbot):
    panel = SettingsPanel()
    qtbot.addWidget(panel)
    assert panel.options()["threads"] is None
    assert panel.threads.specialValueText() == "auto"      # narrow: the count is said under it
    assert f"auto: {diffuse.physical_cores()} physical cores" in [
        label.text() for label in panel.findChildren(QLabel)]
    assert "physical cores" in panel.threads.toolTip()
    assert panel.threads.maximum() == (os.cpu_count() or 1)


# -- conversations ----------------------------------------------------------------------------

def test_store_round_trip_and_listing(tmp_path):
    store = ConversationStore(tmp_path)
    a = Conversation(messages=[Message("user", "first question")])
    store.save(a)
    b = Conversation(messages=[Message("user", "second"), Message("assistant", "answer",
                                                                    {"steps": 8})])
    store.save(b)
    assert store.load(b.id) == b and a.title == "first question"
    assert {cid for cid, _ in store.list()} == {a.id, b.id}
    (tmp_path / "broken.json").write_text("{not json")
    assert len(store.list()) == 2                         # damaged files are skipped
    with pytest.raises(DiffuseError, match="damaged"):
        store.load("broken")
    store.delete(a.id)
    assert [cid for cid, _ in store.list()] == [b.id]
    assert b.chat_messages() == [{"role": "user", "content": "second"},
                                 {"role": "assistant", "content": "answer"}]


def finished_run(recorded_run):
    return RunState.from_recording(recorded_run("no_cache"))


def test_chat_flow_saves_every_message(qtbot, recorded_run, tmp_path):
    chat = ChatPanel()
    qtbot.addWidget(chat)
    chat.set_model_ready(True, "fake.gguf")
    chat.prompt.setPlainText("What is diffusion?")
    with qtbot.waitSignal(chat.generate_requested) as req:
        chat.generate_button.click()
    text, messages = req.args
    assert text == "What is diffusion?"
    assert messages == [{"role": "user", "content": "What is diffusion?"}]
    # the prompt is on disk before the answer exists
    saved = json.loads(chat.store.path(chat.conversation.id).read_text())
    assert saved["messages"][0]["text"] == "What is diffusion?"
    chat.set_busy(True)
    assert not chat.generate_button.isEnabled() and chat.stop_button.isEnabled()
    run = finished_run(recorded_run)
    chat.show_progress(run, -1)
    assert "Denoising" in chat.view.toPlainText()
    chat.set_busy(False)
    conversation, answer = chat.add_answer(run)
    recording = tmp_path / "run.npz"
    recording.write_bytes(b"a recording")
    chat.link_recording(conversation, answer, str(recording))
    assert run.result.text in chat.view.toPlainText()
    # a new panel (next start of the app) restores the conversation
    again = ChatPanel()
    qtbot.addWidget(again)
    msgs = again.conversation.messages
    assert [m.role for m in msgs] == ["user", "assistant"]
    assert msgs[1].meta["steps"] == 16 and msgs[1].meta["recording"] == str(recording)


def test_multi_turn_regenerate_copy_clear(qtbot, recorded_run):
    chat = ChatPanel()
    qtbot.addWidget(chat)
    chat.set_model_ready(True)
    for q in ("one", "two"):
        chat.prompt.setPlainText(q)
        chat.submit()
        chat.add_answer(finished_run(recorded_run))
    with qtbot.waitSignal(chat.generate_requested) as req:
        chat.regenerate()
    assert req.args[0] == "two"
    assert [m["role"] for m in req.args[1]] == ["user", "assistant", "user"]
    chat.link_recording(*chat.add_answer(finished_run(recorded_run)), "/tmp/r.npz")
    # Again keeps the old answer, in a branch beside the new one
    assert [m.role for m in chat.conversation.messages] == ["user", "assistant", "user", "assistant", "assistant"]
    answer = chat.conversation.branch()[-1]
    assert answer is chat.conversation.messages[-1]
    chat.copy_answer()
    assert QGuiApplication.clipboard().text() == answer.text
    with qtbot.waitSignal(chat.replay_requested) as replay:
        chat._link(QUrl(f"replay:{answer.id}"))           # links name the message
    assert replay.args == ["/tmp/r.npz"]
    chat.clear()                                          # asks first
    next(b for b in chat.confirm_box.buttons() if b.text() == "Clear").click()
    assert chat.conversation.messages == []
    assert ChatPanel().conversation.messages == []


def test_conversations_switch_and_errors_show(qtbot):
    chat = ChatPanel()
    qtbot.addWidget(chat)
    chat.set_model_ready(True)
    chat.prompt.setPlainText("first chat")
    chat.submit()
    first = chat.conversation.id
    chat.new_conversation()
    chat.prompt.setPlainText("second chat")
    chat.submit()
    chat.show_error("the engine said no")
    assert "the engine said no" in chat.view.toPlainText()
    assert chat.picker.count() == 2
    chat._picked(chat.picker.findData(first))
    assert chat.conversation.id == first
    assert "first chat" in chat.view.toPlainText()
    assert "the engine said no" not in chat.view.toPlainText()


def test_nothing_is_sent_without_a_model(qtbot):
    chat = ChatPanel()
    qtbot.addWidget(chat)
    chat.set_model_ready(False)
    chat.prompt.setPlainText("hello")
    with qtbot.assertNotEmitted(chat.generate_requested):
        chat.submit()
    assert not chat.generate_button.isEnabled() and "Load a model" in chat.hint.text()
