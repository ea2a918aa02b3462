"""Compare's "AR vs self-speculation, same model, same seed" (compare_pairs.SPEC) on a tiny
Nemotron-Labs-Diffusion look-alike, offered only to models that can self-speculate; and the window
as a new user opens it: no larger than a small main window, closed by Esc."""
from __future__ import annotations

import pytest
from causal_runs import agreeable_nemotron, causal_run
from PySide6.QtCore import QRect, Qt
from test_compare import _Screen

import diffuse
from diffuse.studio import compare
from diffuse.studio.compare_pairs import PRESETS, SPEC, headline, parting, summary_lines

SPEC_PAIR = "AR vs self-speculation, same model, same seed"


@pytest.fixture(scope="module")
def nemotron(tmp_path_factory):
    return diffuse.load(str(agreeable_nemotron(tmp_path_factory.mktemp("agreeable"))), threads=1)


def test_the_pair_is_offered_only_where_self_speculation_runs():
    pair = PRESETS[SPEC_PAIR]
    assert pair.effect == SPEC and pair.a == {"mode": "ar"} and pair.b == {"mode": "self_spec"}
    assert pair.offered("nemotron-diffusion") and pair.offered("llada") and pair.offered("sdar")
    # the table's loop decides, for every architecture of a family alike
    assert pair.offered("wedlm-qwen2") and pair.offered("stable-diffcoder")
    assert not pair.offered("diffusion-gemma") and not pair.offered("") and not pair.offered(None)
    assert not pair.offered("some-future-arch")       # a server's architecture this engine lacks
    assert all(p.offered("diffusion-gemma") for p in PRESETS.values() if p is not pair)


def test_same_text_passes_saved_and_time_per_token(nemotron):
    a = causal_run(nemotron, "ar", seed=3)
    b = causal_run(nemotron, "self_spec", seed=3, draft_length=8)
    pair = PRESETS[SPEC_PAIR]
    said = headline(a, b, pair)
    assert said.startswith("Self-speculation gave AR's answer token for token (40 positions).")
    pa, pb = a.result.forward_passes, b.result.forward_passes
    assert pa == 40 and f"{pb} against {pa}" in said
    assert (f"B ran {pa - pb} passes fewer" if pb < pa else f"B ran {pb - pa} passes more") in said
    assert "Per token after the prefill" in said
    passes, times, answers = summary_lines(a, b, pair)
    assert passes.startswith(f"Forward passes: A {pa} (one per token after the prefill) · B {pb} (a draft and a "
                             f"verify pass per iteration, {b.n_steps - 1} iterations after the prefill)")
    assert times.startswith("Time per token after the prefill: A ") and "8 rows each" in times
    assert answers.startswith("Answers: the same, token for token (all 40 positions")


def test_answers_that_part_say_where_and_why(nemotron):
    a = causal_run(nemotron, "ar", seed=3)
    b = causal_run(nemotron, "self_spec", seed=3, draft_length=8, temperature=0.8)
    b.events[-1].tokens[a.prompt_length + 5:] = b.events[-1].tokens[a.prompt_length + 5] ^ 1   # as a flipped draw would
    where = parting(a, b)
    assert where.startswith("they part at position ") and "temperature 0.8" in where
    assert headline(a, b, PRESETS[SPEC_PAIR]).startswith(f"The answers differ: {where}")
    b.options["temperature"] = 0.0
    assert "near tie" in parting(a, b)


def test_the_window_offers_it_and_runs_it_on_the_loaded_model(qtbot, window, nemotron):
    window.set_model(nemotron)
    window.settings_panel.set_options({"gen_length": 24, "draft_length": 4, "seed": 5, "chat": False})
    window.open_compare()
    cmp = window.compare_window
    names = [cmp.preset.itemText(i) for i in range(cmp.preset.count())]
    assert names == [n for n, p in PRESETS.items() if p.offered("nemotron-diffusion")] and SPEC_PAIR in names
    cmp.preset.setCurrentText(SPEC_PAIR)
    cmp.prompt.setText("a fox")
    cmp.start()
    qtbot.waitUntil(lambda: cmp.headline.isVisible(), timeout=60000)
    a, b = cmp.runs
    assert a.options["mode"] == "ar" and b.options["mode"] == "self_spec" and a.options["seed"] == b.options["seed"]
    assert cmp.headline.text().startswith("Self-speculation gave AR's answer token for token")
    # no threshold rule in the titles: the tiny model's scheduler (confidence_threshold) decided nothing here
    assert [side.title.text() for side in cmp.sides] == [f"{x} · {name}" for x, name in zip("AB", PRESETS[SPEC_PAIR].names)]
    assert "τ" not in cmp.diff_legend.text() and "committed at the shown step" in cmp.diff_legend.text()
    # the AR run measured what a token costs here: the main window's Self-speculation view holds B against it
    assert window.runs.ar_cost(b) is not None


def test_the_menu_leaves_it_out_for_a_model_that_cannot_self_speculate(qtbot, window, fake_model, monkeypatch):
    window.set_model(fake_model())
    window.open_compare()
    cmp = window.compare_window
    assert SPEC_PAIR in [cmp.preset.itemText(i) for i in range(cmp.preset.count())]    # LLaDA can
    cmp.preset.setCurrentText(SPEC_PAIR)
    monkeypatch.setattr(cmp, "model_info", lambda: {"name": "g.gguf", "arch": "diffusion-gemma", "path": "g"})
    cmp.update_context()
    names = [cmp.preset.itemText(i) for i in range(cmp.preset.count())]
    assert SPEC_PAIR not in names and cmp.preset.currentText() == names[0]
    assert cmp.sides[0].title.text().startswith(f"A · {PRESETS[names[0]].names[0]}")


def test_compare_opens_no_larger_than_a_small_main_window_and_esc_closes_it(qtbot, window, fake_model, monkeypatch):
    # a 1366x768 screen (less a panel), the main window made 1024x700 on it
    monkeypatch.setattr(compare.CompareWindow, "screen", lambda self: _Screen(QRect(0, 0, 1366, 740)))
    window.resize(1024, 700)
    window.set_model(fake_model())
    window.open_compare()
    cmp = window.compare_window
    least = cmp.minimumSizeHint()
    assert cmp.width() <= max(window.width(), least.width()) and cmp.height() <= max(window.height(), least.height())
    assert least.width() <= 1024 and least.height() <= 700      # so at 1024x700 it is no larger
    qtbot.waitUntil(cmp.isActiveWindow)      # opened in front with the keyboard: not left to the main window
    qtbot.keyClick(cmp.prompt, Qt.Key.Key_Escape)
    assert not cmp.isVisible()
    window.open_compare()
    window.activateWindow()                  # back to the main window, Compare left open behind it
    qtbot.waitUntil(window.isActiveWindow)
    window.open_compare()                    # Ctrl+K again: in front, with the keyboard, so Esc closes it
    qtbot.waitUntil(cmp.isActiveWindow)
    qtbot.keyClick(cmp.preset, Qt.Key.Key_Escape)
    assert not cmp.isVisible()
