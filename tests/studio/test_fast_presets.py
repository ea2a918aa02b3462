"""The fast-decoding methods in the Studio: a settings preset per method, and Compare running a
method against the decoding it speeds up."""
from __future__ import annotations

import pytest

from diffuse.generation import FAST_METHODS, PRESET_TITLES, resolve_options
from diffuse.studio import compare
from diffuse.studio.settings_panel import PRESETS, SettingsPanel


@pytest.mark.parametrize("name", [PRESET_TITLES[m] for m in (*FAST_METHODS, "paper-entropy-exit")])
def test_a_preset_sets_its_method_over_the_models_defaults(qtbot, demo_model, name):
    panel = SettingsPanel()
    qtbot.addWidget(panel)
    panel.show_defaults(demo_model.arch, demo_model.n_ctx_train, demo_model.recipe)
    panel.set_options({"gen_length": 32, "temperature": 0.5})        # reset by the preset
    panel.apply_preset(panel.preset.findData(name))
    opts = panel.options()
    assert {k: opts[k] for k in PRESETS[name]} == PRESETS[name]
    assert opts["gen_length"] is None and opts["temperature"] is None
    given = {k: v for k, v in opts.items() if k not in ("threads", "chat")}
    r = demo_model.generate("Tell me about Mr. Darcy.", **resolve_options(demo_model.arch, demo_model.recipe,
                                                                           **given))
    assert r.steps > 0
    if "cache_policy" in PRESETS[name]:
        assert panel.fields["cache_policy"].isEnabled()
    if PRESETS[name].get("scheduler") == "confidence_factor":
        assert panel.fields["factor"].isEnabled() and not panel.fields["threshold"].isEnabled()


def test_compare_runs_a_method_against_its_baseline(qtbot, window, demo_model):
    window.set_model(demo_model)
    window.settings_panel.set_options({"gen_length": 48, "steps": 24, "seed": 3})
    window.open_compare()
    cmp = window.compare_window
    cmp.prompt.setText("Tell me about Mr. Darcy.")
    cmp.preset.setCurrentIndex(list(compare.PRESETS).index("DualCache vs the paper's cache"))
    finished = []
    window.engine.run_finished.connect(finished.append)
    cmp.start()
    qtbot.waitUntil(lambda: len(finished) == 2 and cmp.summary.text().startswith("Steps"), timeout=60000)
    a, b = cmp.runs
    assert a.options["cache_policy"] == "active" and b.options["cache_policy"] == "dual"
    assert {k: v for k, v in a.options.items() if k != "cache_policy"} == \
        {k: v for k, v in b.options.items() if k != "cache_policy"}
    # DualCache: after each block's full pass a step recomputes the block's rows only
    n = len(b.events[0].tokens)
    for ev in b.events:
        assert len(ev.active) == n or ev.active.tolist() == list(range(ev.block_start, ev.block_end))
    cmp.close()
