"""The "Getting real models" dialog: the demo framed honestly with the prompts that show it at its
best, the recommended model one click away (download, convert and quantise in one job,
resumable), catalog facts against this computer's RAM, the ways to a real model (the ready GGUF or
the checkpoint folder downloaded from a local stand-in hub, convert + quantise a folder, pick a
GGUF), cancel and refusals, and when it opens at start (not again once dismissed). No network: the
hub is tests/fixtures/fake_hub."""
from __future__ import annotations

import diffuse

import shutil
import socket

import pytest
from fixtures.fake_hub import GGUF_FILE, GGUF_REPO, FakeHub
from PySide6.QtCore import Qt

from diffuse import catalog
from diffuse.studio import first_run, storage, theme
from diffuse.studio.demo import SUGGESTED_PROMPTS
from diffuse.studio.first_run import FirstRunDialog
from diffuse.studio.model_panel import inspect_model

GB = 1e9
JOB_TIMEOUT_MS = 180_000
SDAR_REPO = "JetLM/SDAR-tiny-Chat"


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


def card(d, family):
    return next(c for c in d.cards if c.model["family"] == family)


def test_catalog_facts_against_this_computers_ram(dialog, monkeypatch):
    import psutil
    ram = psutil.virtual_memory()._replace(total=int(8 * GB))
    monkeypatch.setattr(psutil, "virtual_memory", lambda: ram)
    d = dialog()
    models = catalog.load()
    # every catalog model, the recommended one first
    assert [c.model["name"] for c in d.cards] == sorted([m["name"] for m in models],
                                                        key=lambda n: n != "SDAR-1.7B-Chat")
    assert {"LLaDA-8B-Instruct", "Dream-v0-Instruct-7B",
            "LLaDA-MoE-7B-A1B-Instruct"} <= {m["name"] for m in models}
    llada = card(d, "llada")
    text = llada.findChildren(first_run.QLabel)[0].text()
    q = llada.model["quantizations"]
    for name, need in q.items():
        assert f"{name.upper()}" in text and theme.size_text(need["ram_gb"] * GB) in text
    # 8 GB of RAM: Q4_K_M (6 GB) fits, F16 (17 GB) does not.
    rows = {line.split("</td>")[0]: line for line in text.split("<tr><td>")[1:]}
    assert "fits" in rows["Q4_K_M (recommended)"]
    assert f"more than this computer's {theme.size_text(8 * GB)}" in rows["F16"]
    assert llada.qtype.currentData() == "Q4_K_M"
    # The ready GGUF beside the folder: its own file size and the RAM that file needs.
    gguf = llada.model["ready_gguf"]
    ready = text.split("<b>Ready GGUF</b>")[1].split("<br>")[0]
    assert gguf["file"] in ready and f"about {gguf['file_gb']:.1f} GB" in ready
    assert f"needs {theme.size_text(gguf['ram_gb'] * GB)} of RAM" in ready and "fits" in ready
    assert "Download the ready GGUF (about 4.9 GB)" == llada.gguf_button.text()
    moe = card(d, "llada-moe")
    moe_text = moe.findChildren(first_run.QLabel)[0].text()
    assert f"4.52 GB · needs {theme.size_text(5.5 * GB)} of RAM" in moe_text
    assert "8 of 64 experts" in moe_text


def test_recommends_sdar_for_a_laptop(dialog):
    """SDAR-1.7B-Chat (block diffusion: a step computes a few rows): its recommended file and RAM, from the
    catalog, in the dialog's introduction; its card offers the checkpoint to download and convert."""
    sdar = catalog.find(catalog.load(), first_run.LAPTOP_MODEL)
    assert (sdar["name"], sdar["family"], sdar["recommended"]) == ("SDAR-1.7B-Chat", "sdar", "q4_k_m")
    need = sdar["quantizations"]["q4_k_m"]
    line = first_run.laptop_line()
    assert line.startswith("<b>For a laptop, start with SDAR-1.7B-Chat</b>")
    assert f"as Q4_K_M it is a {need['file_gb']:.1f} GB file" in line
    assert f"needs {theme.size_text(need['ram_gb'] * GB)} of RAM" in line
    d = dialog()
    assert any(line in label.text() for label in d.findChildren(first_run.QLabel))
    card = next(c for c in d.cards if c.model["id"] == first_run.LAPTOP_MODEL)
    assert card.gguf_button is None and card.qtype.currentData() == "Q4_K_M"
    assert card.download_button.text() == "Download and make (4 GB)"


def test_no_recommendation_without_the_model(monkeypatch):
    monkeypatch.setattr(first_run, "LAPTOP_MODEL", "no-such-model")
    assert first_run.laptop_line() == ""


def test_offline_says_so_and_turns_download_off(dialog):
    d = dialog()
    assert d.online_label.text().startswith("This computer is offline")
    assert "Convert a downloaded folder" in d.online_label.text()
    assert all(not b.isEnabled() for c in d.cards for b in c.download_buttons())
    assert all((c.gguf_button is not None) == ("ready_gguf" in c.model) for c in d.cards)
    assert all(c.convert_button.isEnabled() for c in d.cards)


def test_convert_folder_to_q4_k_m(dialog, qtbot, tiny_hf_llada):
    d = dialog()
    seen = []
    with qtbot.waitSignal(d.model_ready, timeout=JOB_TIMEOUT_MS) as ready:
        assert d.convert_folder(tiny_hf_llada, "Q4_K_M")
        d.job.progressed.connect(lambda done, total, what: seen.append(done))
        assert not d.buttons[0].isEnabled()      # one job at a time
    out = first_run.models_dir() / "LLaDA-tiny-Instruct-q4_k_m.gguf"
    assert ready.args == [str(out)]
    entry = inspect_model(out)
    assert (entry.family, entry.file_type, entry.error) == ("llada", "Q4_K_M", None)
    assert sorted(p.name for p in out.parent.iterdir()) == [out.name]   # the F16 step is gone
    assert seen == sorted(seen) and 0 <= seen[0] and seen[-1] <= 1000
    assert "Ready" in d.message.text() and d.buttons[0].isEnabled()
    # Asking again offers the file already made.
    with qtbot.waitSignal(d.model_ready, timeout=1000):
        assert d.convert_folder(tiny_hf_llada, "Q4_K_M")
    assert d.job is None


def test_cancel_leaves_nothing(dialog, qtbot, tiny_hf_dream):
    d = dialog()
    d.convert_folder(tiny_hf_dream, "Q4_K_M")
    d.cancel()
    qtbot.waitUntil(lambda: d.job is None, timeout=JOB_TIMEOUT_MS)
    assert "cancelled" in d.message.text()
    assert not list(first_run.models_dir().iterdir())


def test_refusals(dialog, tmp_path, monkeypatch, tiny_hf_llada):
    d = dialog()
    assert not d.convert_folder(tmp_path, "Q8_0")             # no config.json there
    assert d.message.objectName() == "Warning" and str(tmp_path) in d.message.text()
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"not a model")
    assert not d.use_gguf(bad)
    assert "bad.gguf" in d.message.text()
    import diffuse.studio.model_panel as panel
    monkeypatch.setattr(panel.shutil, "disk_usage",
                        lambda p: shutil._ntuple_diskusage(10**12, 10**12 - 10, 10))
    assert not d.convert_folder(tiny_hf_llada, "F16")
    assert "2.9 MiB of disk" in d.message.text() and "has 10 B free" in d.message.text() and d.job is None


def test_pick_a_gguf(dialog, qtbot, tiny_gguf):
    d = dialog()
    path = tiny_gguf("dream", "q8_0")
    with qtbot.waitSignal(d.model_ready, timeout=1000) as ready:
        assert d.use_gguf(path)
    assert ready.args == [str(path.resolve())]


def test_download_then_convert(dialog, qtbot, tiny_hf_dream, monkeypatch):
    repo = "Dream-org/Dream-tiny-Instruct"
    with FakeHub({repo: tiny_hf_dream}) as server:
        monkeypatch.setenv("HF_ENDPOINT", server.url)
        d = dialog()
        assert d.online_label.text().startswith("Online")
        assert all(c.download_button.isEnabled() for c in d.cards)
        model = dict(card(d, "dream").model, hf_repo=repo, download_bytes=10**7)
        with qtbot.waitSignal(d.model_ready, timeout=JOB_TIMEOUT_MS) as ready:
            assert d.download(model, "Q8_0")
    out = first_run.models_dir() / "Dream-tiny-Instruct-q8_0.gguf"
    assert ready.args == [str(out)]
    assert inspect_model(out).family == "dream"
    folder = storage.home_dir() / "downloads" / "Dream-tiny-Instruct"
    assert (folder / "config.json").is_file() and not list(folder.glob("*.part"))
    assert str(folder) in d.message.text() and "no longer needed" in d.message.text()


def test_opens_at_start_only_without_a_real_model(qtbot, dialog, tiny_gguf):
    from diffuse.studio.main_window import MainWindow
    window = MainWindow()
    qtbot.addWidget(window)
    d = first_run.open_at_start(window)
    assert d is not None and d.isVisible()
    qtbot.waitUntil(lambda: d.check is None, timeout=20_000)
    d.close()
    # Help reopens the same dialog.
    action = next(a for m in window.menuBar().findChildren(first_run.QWidget)
                  for a in m.actions() if a.text().startswith("Getting real models"))
    action.trigger()
    assert window.findChild(FirstRunDialog) is d and d.isVisible()
    # What the dialog makes or picks lands in the model list and loads.
    path = tiny_gguf("llada", "q8_0")
    with qtbot.waitSignal(window.model_panel.model_loaded, timeout=60_000):
        d.use_gguf(path)
    # the list is read again on a thread of its own: it may end after the model loaded
    qtbot.waitUntil(lambda: first_run.has_real_model(window.model_panel.entries,
                                                     catalog.shipped_models_dir()), timeout=30_000)
    d.close()
    assert first_run.open_at_start(window) is None
    d.shutdown()


def test_opting_out(qtbot, dialog):
    d = dialog()
    d.show_at_start.setChecked(True)
    d.show_at_start.setChecked(False)
    assert not first_run.show_at_start()
    from diffuse.studio.main_window import MainWindow
    window = MainWindow()
    qtbot.addWidget(window)
    assert first_run.open_at_start(window) is None


def test_first_start_opens_the_demo_with_its_suggested_settings():
    from diffuse.studio import storage
    demo = storage.demo_model()
    assert demo is not None and demo.name == "diffuse-demo-3m.gguf"
    suggested = diffuse.load(demo, threads=1).recipe     # in the file, whatever its name
    assert suggested["temperature"] > 0 and suggested["gen_length"] <= 128


def test_download_the_ready_gguf(dialog, qtbot, gguf_repo, ready_model, small_chunks,
                                 monkeypatch):
    with FakeHub({GGUF_REPO: gguf_repo}) as server:
        monkeypatch.setenv("HF_ENDPOINT", server.url)
        d = dialog()
        assert all(c.gguf_button.isEnabled() for c in d.cards if c.gguf_button is not None)
        seen = []
        with qtbot.waitSignal(d.model_ready, timeout=JOB_TIMEOUT_MS) as ready:
            assert d.download_gguf(ready_model)
            d.job.progressed.connect(lambda done, total, what: seen.append(done))
            assert not card(d, "llada").gguf_button.isEnabled()   # one job at a time
    out = first_run.models_dir() / GGUF_FILE
    assert ready.args == [str(out)]
    assert out.read_bytes() == (gguf_repo / GGUF_FILE).read_bytes()
    assert inspect_model(out).family == "llada"
    assert seen == sorted(seen) and "Ready" in d.message.text()
    assert "no longer needed" not in d.message.text()           # no folder to delete


def test_a_refused_ready_gguf_says_why(dialog, qtbot, gguf_repo, ready_model, monkeypatch):
    with FakeHub({GGUF_REPO: gguf_repo}) as server:
        monkeypatch.setenv("HF_ENDPOINT", server.url)
        d = dialog()
        model = dict(ready_model, ready_gguf=dict(ready_model["ready_gguf"], sha256="0" * 64))
        assert d.download_gguf(model)
        qtbot.waitUntil(lambda: d.job is None, timeout=JOB_TIMEOUT_MS)
    assert "another file than the pinned one" in d.message.text()
    assert d.message.objectName() == "Warning"
    assert not list(first_run.models_dir().iterdir())


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
    with FakeHub({SDAR_REPO: tiny_hf_sdar}) as server:
        monkeypatch.setenv("HF_ENDPOINT", server.url)
        d = dialog()
        assert d.get_button.isEnabled()
        d.recommended = dict(d.recommended, hf_repo=SDAR_REPO, download_bytes=10**7)
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


def test_unverified_figures_are_marked_and_named(dialog):
    """A catalog entry's unverified member (figures no primary record confirmed): each such figure the
    card shows carries ~, and the card names them all, in words, under its table and in its tooltip."""
    d = dialog()
    nemotron = card(d, "nemotron-diffusion")     # the 8B: licence and context unverified, parameters computed
    entry = nemotron.model
    assert entry["id"] == "nemotron-labs-diffusion-8b" and entry["unverified"] == ["license", "context_length"]
    text = nemotron.findChildren(first_run.QLabel)[0].text()
    assert f"~{entry['license']} licence" in text and f" · {entry['params'] / 1e9:.1f} billion parameters" in text
    named = ("~ unverified: no primary record confirmed the licence, context length of Nemotron-Labs-Diffusion-8B "
             "(read from third-party pages or inferred; the catalog's about says from where)")
    assert named in text and nemotron.findChildren(first_run.QLabel)[0].toolTip() == named
    gemma = card(d, "diffusion-gemma")           # every ram_gb, the F16 and Q8_0 files, the checkpoint
    text = gemma.findChildren(first_run.QLabel)[0].text()
    rows = {line.split("</td>")[0]: line for line in text.split("<tr><td>")[1:]}
    assert "<td align=right>~50.5 GB</td>" in rows["F16"] and "<td align=right>16.8 GB</td>" in rows["Q4_K_M (recommended)"]
    assert all(f"~{theme.size_text(need['ram_gb'] * GB)}" in rows[q.upper() + (" (recommended)" if q == "q4_k_m" else "")]
               for q, need in gemma.model["quantizations"].items())
    assert "Hugging Face checkpoint: ~" in text and "needs ~" in text.split("<b>Ready GGUF</b>")[1]
    assert gemma.gguf_button.text() == "Download the ready GGUF (16.81 GB)"    # its pinned size is a record's
    assert gemma.download_button.text().startswith("Download and make (~")
    assert "RAM needed (all)" in gemma.findChildren(first_run.QLabel)[0].toolTip()
    llada = card(d, "llada")                     # nothing unverified: no mark, no note
    assert "~" not in llada.findChildren(first_run.QLabel)[0].text() and not llada.findChildren(first_run.QLabel)[0].toolTip()
