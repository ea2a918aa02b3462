"""Settings edges: the demo model's defaults, schedules the engine would round or refuse, the
model's context, and schedulers of the other family."""
from __future__ import annotations

import pytest
from PySide6.QtGui import QColor
from PySide6.QtWidgets import QGroupBox

from diffuse.generation import resolve_options
from diffuse.studio.settings_panel import CAUSAL, UNIFORM, WINDOW, SettingsPanel


def test_reset_gives_the_model_its_files_recipe(window, fake_model):
    model = fake_model(path="renamed-copy.gguf")  # the recipe is the file's, not the name's
    assert model.recipe["temperature"] > 0        # greedy, the demo model loops
    window.set_model(model)
    panel = window.settings_panel
    panel.set_options({"gen_length": 96, "steps": 8, "temperature": 0.0, "scheduler": "random"})
    panel.reset()
    opts = panel.options()
    assert all(opts[k] is None for k in model.recipe)       # auto: the model's default ...
    assert opts["scheduler"] is None and opts["seed"] is None
    defaults = resolve_options(model.arch, model.recipe)    # ... which the run gets
    assert {k: defaults[k] for k in model.recipe} == model.recipe


def test_hints_show_the_loaded_models_real_defaults(window, fake_model, synthetic_model):
    panel = window.settings_panel
    notes = panel.defaults_note
    window.set_model(fake_model())
    assert [notes[k].text() for k in ("gen_length", "steps", "block_length", "temperature")] == [
        "model default: 64", "model default: 64", "model default: 16", "model default: 0.7"]
    assert "recipe" in notes["steps"].toolTip() and "LLaDA" in notes["scheduler"].toolTip()
    assert notes["scheduler"].text() == "model default: low_confidence"
    window.set_model(synthetic_model())           # no recipe: the family's
    assert [notes[k].text() for k in ("gen_length", "steps", "block_length", "temperature")] == [
        "model default: 128", "model default: 128", "model default: 32", "model default: 0"]


def test_auto_schedule_is_checked_against_the_models_defaults(window, fake_model):
    window.set_model(fake_model())
    panel = window.settings_panel
    panel.reset()
    panel.set_options({"gen_length": 40})         # not whole blocks of the recipe's 16
    assert panel.refusal() == "gen_length (40) must be a multiple of block_length (16)"


def test_reset_of_another_model_leaves_everything_to_its_family(window, synthetic_model):
    window.set_model(synthetic_model(path="some-llada.gguf"))
    panel = window.settings_panel
    panel.set_options({"steps": 8, "temperature": 0.5})
    panel.reset()
    assert panel.options()["steps"] is None and panel.options()["temperature"] is None


def test_rounded_steps_are_shown(qtbot):
    panel = SettingsPanel()
    qtbot.addWidget(panel)
    panel.set_options({"gen_length": 48, "block_length": 16, "steps": 32})
    assert panel.schedule_line.text() == "steps 32 -> 30: 3 blocks get 10 steps each"
    assert not panel.schedule_line.isHidden()
    panel.set_options({"steps": 64})           # more than one per position: capped at the block
    assert panel.schedule_line.text() == "steps 64 -> 48: at most one step per position (16 per block)"
    panel.set_options({"steps": 48})
    assert panel.schedule_line.isHidden() and panel.refusal() is None


def test_a_gen_length_off_the_blocks_is_refused_before_the_run(qtbot, window, fake_model):
    model = fake_model(step_delay=0)
    window.set_model(model)
    panel = window.settings_panel
    panel.set_options({"gen_length": 50, "block_length": 16, "steps": 16, "threads": 1})
    assert "gen_length (50) must be a multiple of block_length (16)" in panel.schedule_line.text()
    window.chat.prompt.setPlainText("hello")
    window.chat.submit()
    assert "must be a multiple of block_length (16)" in window.chat.view.toPlainText()
    assert model.calls == [] and not window.engine.busy


def test_gen_length_is_capped_at_the_models_context(qtbot, window, fake_model):
    model = fake_model(step_delay=0)
    window.set_model(model)
    gen = window.settings_panel.fields["gen_length"]
    assert gen.maximum() < model.n_ctx_train
    gen.setValue(300)
    assert gen.value() == gen.maximum()


def test_a_prompt_too_long_for_the_context_is_refused_in_the_chat(qtbot, window, fake_model):
    model = fake_model(step_delay=0)
    window.set_model(model)
    window.settings_panel.set_options({"gen_length": 224, "block_length": 16, "steps": 224})
    window.chat.prompt.setPlainText("a long prompt " * 10)
    with qtbot.waitSignal(window.engine.run_failed, timeout=5000):   # measured where encoded
        window.chat.submit()
    assert "exceeds the model's context of 256" in window.chat.view.toPlainText()
    assert model.calls == [] and not window.engine.busy


def test_schedulers_of_the_other_family_are_labelled(window, fake_model):
    scheduler = window.settings_panel.fields["scheduler"]
    names = {scheduler.itemData(i): scheduler.itemText(i) for i in range(1, scheduler.count())}
    assert names["entropy"] == "entropy"                 # no model: no family to compare with
    window.set_model(fake_model())                       # a LLaDA model
    names = {scheduler.itemData(i): scheduler.itemText(i) for i in range(1, scheduler.count())}
    assert names["entropy"] == "entropy (Dream's rule)" and names["low_confidence"] == "low_confidence"
    assert names["entropy_exit"] == "entropy_exit"
    dream = fake_model()
    dream.arch = "dream"
    window.set_model(dream)
    names = {scheduler.itemData(i): scheduler.itemText(i) for i in range(1, scheduler.count())}
    assert names["random"] == "random (LLaDA's rule)" and names["entropy"] == "entropy"
    scheduler.setCurrentIndex(scheduler.findData("random"))
    assert window.settings_panel.options()["scheduler"] == "random"     # still the engine's name


def test_an_ignored_recipe_is_said_in_the_status_bar(window, fake_model):
    model = fake_model(path="odd.gguf")
    model.recipe, model.recipe_problem = {}, ("odd.gguf: diffuse.recipe.steps: steps = 0 is out of "
                                              "range; the file's recipe is ignored")
    window.set_model(model)
    assert "the file's recipe is ignored" in window.statusBar().currentMessage()
    assert window.settings_panel.defaults_note["steps"].text() == "model default: 128"


def test_a_run_records_the_recipes_options_and_its_views_use_them(qtbot, window, fake_model):
    """A recipe that suggests entropy_exit at tau 0.8: with every field on auto, the run is an
    entropy-exit run at 0.8 for the engine, the recording and the heatmap's tau line."""
    model = fake_model(step_delay=0)
    model.recipe = {**model.recipe, "scheduler": "entropy_exit", "threshold": 0.8}
    window.set_model(model)
    window.settings_panel.reset()
    window.settings_panel.set_options({"gen_length": 48, "steps": 24})
    assert window.settings_panel.defaults_note["scheduler"].text() == "model default: entropy_exit"
    window.chat.prompt.setPlainText("Tell me about Mr. Darcy.")
    with qtbot.waitSignal(window.engine.run_finished, timeout=20000) as done:
        window.chat.generate_button.click()
    run = done.args[0]
    assert model.calls[0]["scheduler"] == run.options["scheduler"] == "entropy_exit"
    assert run.options["threshold"] == 0.8 and run.rule.tau == 0.8


def test_options_of_another_kind_of_decoding_are_off_with_the_reason(qtbot):
    """The uniform-state canvas options only for an architecture of that loop (the engine's table:
    DiffusionGemma), which has no AR or self-speculation mode; the draft length only under
    self_spec. Each kind's options are a group of their own."""
    panel = SettingsPanel()
    qtbot.addWidget(panel)
    f = panel.fields
    panel.show_defaults("llada")
    assert not f["stop_entropy"].isEnabled() and "(off: a uniform-state canvas only" in f["stop_entropy"].toolTip()
    titles = [g.title() for g in panel.findChildren(QGroupBox)]
    assert titles.index(CAUSAL) < titles.index(UNIFORM) and f["stop_entropy"].parent().parent().title() == UNIFORM
    assert f["mode"].isEnabled() and not f["draft_length"].isEnabled()
    assert f["draft_length"].toolTip().startswith(f["draft_length"].property("help"))
    panel.set_options({"mode": "self_spec"})
    assert f["draft_length"].isEnabled() and f["draft_length"].toolTip() == f["draft_length"].property("help")
    panel.show_defaults("wedlm-qwen2")     # the table's loop decides (generation.has_causal_modes), not a name
    assert f["mode"].isEnabled() and f["draft_length"].isEnabled()
    panel.show_defaults("diffusion-gemma")
    assert all(f[k].isEnabled() for k in ("temperature_end", "stability", "stop_entropy"))
    assert not f["mode"].isEnabled() and not f["draft_length"].isEnabled()
    assert "has no AR or self-speculation mode: its decoding loop is uniform-state" in f["mode"].toolTip()


def test_an_option_the_loaded_model_does_not_take_is_not_sent_but_kept(qtbot):
    """self_spec chosen for Nemotron, then a DiffusionGemma model: the mode is off, not sent (the
    engine would refuse it, and the user could not change an off field), and back on with the
    user's choice for the next model that takes it; also after a restart (the settings file)."""
    panel = SettingsPanel()
    qtbot.addWidget(panel)
    f = panel.fields
    panel.show_defaults("nemotron-diffusion")
    panel.set_options({"mode": "self_spec", "draft_length": 8, "draft_lora": False})
    chosen = {"mode": "self_spec", "draft_length": 8, "draft_lora": False}
    assert {k: panel.options()[k] for k in chosen} == chosen
    panel.show_defaults("diffusion-gemma", 4096, {}, {"canvas_length": 256})
    assert not f["mode"].isEnabled() and f["mode"].currentData() == "self_spec"     # kept, shown off
    assert all(panel.options()[k] is None for k in chosen) and panel.refusal() is None
    panel.show_defaults("diffusion-gemma")                   # no sizes known: the same
    assert panel.options()["mode"] is None and panel.refusal() is None
    again = SettingsPanel()
    qtbot.addWidget(again)
    again.show_defaults("nemotron-diffusion")
    assert {k: again.options()[k] for k in chosen} == chosen
    panel.show_defaults("nemotron-diffusion")
    assert {k: panel.options()[k] for k in chosen} == chosen


def test_wedlm_and_uniform_state_options_are_sent_to_their_models_only(qtbot):
    panel = SettingsPanel()
    qtbot.addWidget(panel)
    panel.show_defaults("wedlm")
    panel.set_options({"window_size": 8, "pos_penalty": 0.05})
    assert (panel.options()["window_size"], panel.options()["pos_penalty"]) == (8, 0.05)
    panel.set_options({"mode": "ar"})                  # WeDLM's window is its diffusion decoding's
    assert (panel.options()["window_size"], panel.options()["pos_penalty"]) == (None, None)
    panel.set_options({"mode": None})
    panel.show_defaults("diffusion-gemma")
    panel.set_options({"stability": 3, "temperature_end": 0.2})
    assert panel.options()["window_size"] is None and panel.options()["stability"] == 3
    panel.show_defaults("llada")
    assert (panel.options()["stability"], panel.options()["temperature_end"]) == (None, None)
    assert panel.fields["stability"].value() == 3 and panel.refusal() is None


def test_a_field_that_is_off_looks_off(qtbot):
    """Not only its tooltip: an off field's text and its name in the form are dimmed (style.qss's
    :disabled rules, text #555b6b)."""
    panel = SettingsPanel()
    qtbot.addWidget(panel)
    panel.show()
    panel.show_defaults("nemotron-diffusion")

    def brightest(widget) -> int:
        image = widget.grab().toImage()
        return max(image.pixelColor(x, y).lightness() for x in range(image.width()) for y in range(image.height()))

    def off(key) -> bool:
        field, label = panel.fields[key], panel.labels[key]
        dim = QColor("#555b6b").lightness()
        assert field.isEnabled() == label.isEnabled()
        assert (brightest(field) <= dim) == (brightest(label) <= dim) == (not field.isEnabled())
        return not field.isEnabled()

    assert off("draft_length") and off("stability") and not off("steps") and not off("mode")
    panel.set_options({"mode": "self_spec"})
    assert not off("draft_length")


def test_wedlms_window_is_a_group_of_its_own_on_for_wedlm(qtbot):
    """Window and position penalty are WeDLM's decoding's, not every model's schedule: their own
    group, between the causal modes' and the uniform-state canvas's, on for WeDLM's diffusion only."""
    panel = SettingsPanel()
    qtbot.addWidget(panel)
    f = panel.fields
    titles = [g.title() for g in panel.findChildren(QGroupBox)]
    assert titles.index(CAUSAL) < titles.index(WINDOW) < titles.index(UNIFORM)
    assert f["window_size"].parent().parent().title() == f["pos_penalty"].parent().parent().title() == WINDOW
    for arch, on in (("wedlm", True), ("wedlm-qwen2", True), ("nemotron-diffusion", False), ("llada", False)):
        panel.show_defaults(arch)
        assert f["window_size"].isEnabled() == f["pos_penalty"].isEnabled() == on, arch


def test_the_decoding_mode_list_shows_every_mode(qtbot, window):
    """Its popup is tall enough for all its items (no scrolling), wherever the field is."""
    window.resize(1024, 700)
    window.show()
    panel = window.settings_panel
    panel.show_defaults("nemotron-diffusion")
    box = panel.fields["mode"]
    for current in range(box.count()):
        box.setCurrentIndex(current)
        box.showPopup()
        view = box.view()
        qtbot.waitUntil(view.isVisible, timeout=5000)
        rows = sum(view.sizeHintForRow(i) for i in range(box.count()))
        assert view.verticalScrollBar().maximum() == 0 and view.viewport().height() >= rows
        box.hidePopup()
        qtbot.waitUntil(lambda: not view.isVisible(), timeout=5000)


def test_after_self_spec_on_nemotron_a_diffusion_gemma_model_generates(qtbot, window, tmp_path):
    """The new user's path: self_spec chosen for a Nemotron model, then a DiffusionGemma model
    loaded and Generate: it runs (the mode the model does not take is not sent), and Nemotron gets
    self_spec back."""
    pytest.importorskip("torch")
    pytest.importorskip("transformers.models.diffusion_gemma")
    from causal_runs import agreeable_nemotron
    from fixtures.tiny_diffusion_gemma import CANVAS, write_diffusion_gemma

    import diffuse
    from diffuse.convert import convert_hf
    nemotron = diffuse.load(str(agreeable_nemotron(tmp_path / "nemotron")), threads=1)
    gemma = diffuse.load(convert_hf(write_diffusion_gemma(tmp_path / "hf"), tmp_path / "dg.gguf", "f32"), threads=1)
    panel = window.settings_panel
    window.set_model(nemotron)
    panel.set_options({"mode": "self_spec", "gen_length": CANVAS, "steps": 4, "chat": False})
    window.set_model(gemma)
    assert panel.refusal() is None and panel.options()["mode"] is None
    window.chat.prompt.setPlainText("Hi")
    with qtbot.waitSignal(window.engine.run_finished, timeout=120000) as done:
        window.chat.generate_button.click()
    assert done.args[0].options["mode"] == "diffusion" and done.args[0].result is not None
    window.set_model(nemotron)
    assert panel.options()["mode"] == "self_spec"
