"""The first-run dialog as a first-time user meets it: the demo framed honestly with the prompts
that show it at its best, the recommended model one click away (download, convert and quantise
in one job, resumable), and a dialog that stays away once dismissed. No network: the hub is
tests/fixtures/fake_hub."""
from __future__ import annotations

import socket

import pytest
from fixtures.fake_hub import FakeHub
from PySide6.QtCore import Qt

from diffuse import catalog
from diffuse.studio import first_run, storage
from diffuse.studio.demo import SUGGESTED_PROMPTS
from diffuse.studio.first_run import FirstRunDialog
from diffuse.studio.model_panel import inspect_model

JOB_TIMEOUT_MS = 180_000
REPO = "JetLM/SDAR-tiny-Chat"


@pytest.fixture(autouse=True)
def no_network(monkeypatch):
    """The hub endpoint is a closed local port unless a test starts a fake hub."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{port}")


@pytest.fixture
def dialog(qtbot):
    made = []

    def make(parent=None):
        d = FirstRunDialog(parent)
        if parent is None:
            qtbot.addWidget(d)
        made.append(d)
        qtbot.waitUntil(lambda: d.check is None, timeout=20_000)   # the online check
        return d

    yield make
    for d in made:
        d.shutdown()


def test_the_demo_is_framed_honestly_with_its_best_prompts(dialog):
    d = dialog()
    text = " ".join(label.text() for label in d.findChildren(first_run.QLabel))
    assert "continues Austen-like prose" in text and "cannot answer questions" in text
    for prompt in SUGGESTED_PROMPTS:
        assert prompt.replace("&", "&amp;") in text
    assert all(p.startswith("Continue:") for p in SUGGESTED_PROMPTS)   # the instruction it was trained on


def test_the_suggested_prompts_read_as_prose_on_the_demo_model(demo_model):
    """Each prompt, with the demo model's own recipe, gives mostly words (not `NI. -- Al yy"`)."""
    for prompt in SUGGESTED_PROMPTS:
        for seed in (1, 2):
            text = demo_model.generate(prompt, seed=seed).text
            words = text.split()
            assert words, (prompt, seed)
            letters = sum(c.isalpha() or c.isspace() for c in text) / len(text)
            assert letters > 0.8, (prompt, seed, text)


def test_the_recommended_model_is_highlighted_and_off_while_offline(dialog):
    d = dialog()
    model = catalog.find(catalog.load(), first_run.LAPTOP_MODEL)
    assert d.cards[0].model["id"] == first_run.LAPTOP_MODEL
    assert "recommended" in d.cards[0].title()
    assert d.get_button.text() == first_run.get_text(model)
    assert d.get_button.text().startswith(f"Get {model['name']}: download")
    assert not d.get_button.isEnabled() and d.online_label.text().startswith("This computer is offline")


def test_one_click_downloads_converts_and_quantises_resumably(dialog, qtbot, tiny_hf_sdar,
                                                              small_chunks, monkeypatch):
    with FakeHub({REPO: tiny_hf_sdar}) as server:
        monkeypatch.setenv("HF_ENDPOINT", server.url)
        d = dialog()
        assert d.get_button.isEnabled()
        d.recommended = dict(d.recommended, hf_repo=REPO, download_bytes=10**7)
        d.get_button.click()
        # cancelled once the weights are arriving
        d.job.progressed.connect(lambda done, total, what: ".safetensors" in what and d.cancel())
        qtbot.waitUntil(lambda: d.job is None, timeout=JOB_TIMEOUT_MS)
        assert "cancelled. The download resumes where it stopped." in d.message.text()
        folder = storage.home_dir() / "downloads" / "SDAR-tiny-Chat"
        assert list(folder.glob("*.part")) and d.get_button.isEnabled()
        seen = []
        with qtbot.waitSignal(d.model_ready, timeout=JOB_TIMEOUT_MS) as ready:
            d.get_button.click()
            assert d.message.text() == ""           # the old message goes with the new try
            d.job.progressed.connect(lambda done, total, what: seen.append((done, what)))
            assert not d.get_button.isEnabled()     # one job at a time
        resumed = [r for p in folder.glob("*.safetensors") for r in server.ranges(p.name)]
        assert any(r and r.startswith("bytes=") and r != "bytes=0-" for r in resumed)
    out = first_run.models_dir() / "SDAR-tiny-Chat-q4_k_m.gguf"
    assert ready.args == [str(out)]
    entry = inspect_model(out)
    assert (entry.family, entry.file_type, entry.error) == ("sdar", "Q4_K_M", None)
    stages = [what.split(" · ")[0] for _, what in seen]
    assert stages.index("downloading") < stages.index("converting to F16") < stages.index("quantising to Q4_K_M")
    assert [n for n, _ in seen] == sorted(n for n, _ in seen)      # one bar, never going back
    assert "Ready" in d.message.text() and d.message.objectName() != "Warning"


@pytest.mark.parametrize("how", ["close button", "escape"])
def test_dismissed_once_it_stays_away(qtbot, dialog, how):
    from diffuse.studio.main_window import MainWindow
    window = MainWindow()
    qtbot.addWidget(window)
    d = first_run.open_at_start(window)
    assert d is not None and not d.show_at_start.isChecked()
    qtbot.waitUntil(lambda: d.check is None, timeout=20_000)
    if how == "escape":
        qtbot.keyClick(d, Qt.Key.Key_Escape)
    else:
        next(b for b in d.findChildren(first_run.QPushButton) if b.text() == "Close").click()
    assert not d.isVisible()
    assert storage.settings().value(first_run.SHOW_AT_START) == "false"
    assert first_run.open_at_start(window) is None
    d.shutdown()


def test_asked_back_it_comes_back(qtbot, dialog):
    d = dialog()
    d.show_at_start.setChecked(True)
    d.close()
    assert first_run.show_at_start() and dialog().show_at_start.isChecked()
