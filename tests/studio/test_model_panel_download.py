"""Models panel, "Download GGUF…": the ready GGUF of each catalog model offered with its file size
and the RAM that file needs, downloaded from a local stand-in hub into the list, cancelled with
the part kept for later. No network: tests/fixtures/fake_hub.py."""
from __future__ import annotations

from fixtures.fake_hub import GGUF_FILE, GGUF_REPO, FakeHub

from diffuse import catalog
from diffuse.studio import model_panel as mp
from diffuse.studio import storage, theme


def test_every_ready_gguf_is_offered_with_its_size_and_ram(model_panel, monkeypatch):
    asked = {}

    def get_item(parent, title, label, items, current, editable):
        asked.update(title=title, label=label, items=list(items))
        return "", False                   # the user closes the dialog

    monkeypatch.setattr(mp.QInputDialog, "getItem", get_item)
    memory = mp.psutil.virtual_memory()._replace(available=5 * 2**30)
    monkeypatch.setattr(mp.psutil, "virtual_memory", lambda: memory)
    next(b for b in model_panel.buttons if b.text() == "Download GGUF…").click()
    models = [m for m in catalog.load() if "ready_gguf" in m]
    assert len(asked["items"]) == len(models) == 4
    for item, m in zip(asked["items"], models):
        gguf = m["ready_gguf"]
        assert item.startswith(m["name"]) and catalog.gguf_size_text(gguf) in item
        # every ram_gb of DiffusionGemma's entry is unverified (its catalog entry says so): marked ~
        mark = "~" if m["id"].startswith("diffusiongemma") else ""
        assert f"needs {mark}{theme.size_text(gguf['ram_gb'] * 1e9)} of RAM" in item
    moe = asked["items"][2]
    assert "4.52 GB" in moe and f"more than the {theme.size_text(5 * 2**30)} available" in moe
    gemma = asked["items"][3]     # Unsloth's file: its size pinned to the byte, no sha256
    assert gemma.startswith("DiffusionGemma-26B-A4B-it") and "16.81 GB" in gemma
    assert asked["label"].endswith("\n~: a figure no primary record confirmed (Help → Getting real models names them)")
    assert model_panel.job is None


def test_download_lands_in_the_list(qtbot, model_panel, gguf_repo, ready_model, small_chunks,
                                    monkeypatch):
    with FakeHub({GGUF_REPO: gguf_repo}) as server:
        monkeypatch.setenv("HF_ENDPOINT", server.url)
        monkeypatch.setattr(catalog, "load", lambda path=None: [ready_model])
        monkeypatch.setattr(mp.QInputDialog, "getItem",
                            lambda parent, title, label, items, *a: (items[0], True))
        with qtbot.waitSignal(model_panel.scanned, timeout=60_000):
            next(b for b in model_panel.buttons if b.text() == "Download GGUF…").click()
            assert model_panel.job is not None and not any(b.isEnabled() for b in model_panel.buttons)
            qtbot.waitUntil(lambda: model_panel.job is None, timeout=60_000)
    out = (storage.models_dir() / GGUF_FILE).resolve()
    assert out.read_bytes() == (gguf_repo / GGUF_FILE).read_bytes()
    entry = model_panel.selected()
    assert entry is not None and entry.path == out and entry.family == "llada"


def test_cancel_keeps_the_part(qtbot, model_panel, gguf_repo, ready_model, small_chunks, monkeypatch,
                               tmp_path):
    with FakeHub({GGUF_REPO: gguf_repo}) as server:
        monkeypatch.setenv("HF_ENDPOINT", server.url)
        assert model_panel.download_gguf(ready_model, tmp_path / "dl")
        model_panel.cancel_job()                     # stops at the first chunk that arrives
        qtbot.waitUntil(lambda: model_panel.job is None, timeout=60_000)
    assert "cancelled; the download resumes where it stopped" in model_panel.message.text()
    assert (tmp_path / "dl" / (GGUF_FILE + ".part")).is_file()
    assert not (tmp_path / "dl" / GGUF_FILE).exists()
