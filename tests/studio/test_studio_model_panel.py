"""Models panel: listing, fit checks and refusals, and the load / convert / quantise jobs."""
from __future__ import annotations

import shutil
from collections import namedtuple
from pathlib import Path

import gguf
import numpy as np
import psutil
import pytest
from PySide6.QtCore import Qt

import diffuse
from diffuse import gguf_file
from diffuse.studio import model_panel as mp
from diffuse.studio import theme
from diffuse.studio.model_panel import ModelPanel, inspect_model


def write_llama_gguf(path: Path) -> Path:
    """A valid GGUF of an autoregressive model: not something diffuse runs."""
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_tensor("token_embd.weight", np.zeros((8, 4), np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


@pytest.fixture
def models(tmp_path, tiny_gguf):
    folder = tmp_path / "models"
    folder.mkdir()
    shutil.copy(tiny_gguf("llada", "f32"), folder / "tiny-llada-f32.gguf")
    shutil.copy(tiny_gguf("dream", "q8_0"), folder / "tiny-dream-q8_0.gguf")
    return folder


def add_folder(qtbot, model_panel, folder):
    with qtbot.waitSignal(model_panel.scanned, timeout=10000):
        model_panel.add_folder(folder)


def test_lists_models_with_their_facts(qtbot, model_panel, models):
    add_folder(qtbot, model_panel, models)
    names = [e.name for e in model_panel.entries]
    assert {"tiny-llada-f32.gguf", "tiny-dream-q8_0.gguf"} <= set(names)
    row = names.index("tiny-dream-q8_0.gguf")
    cells = [model_panel.table.item(row, c).text() for c in range(model_panel.table.columnCount())]
    assert cells[0] == "● tiny-dream-q8_0" and cells[1] == "Q8_0"     # every file is a .gguf
    entry = model_panel.entries[row]
    assert cells[2:] == [theme.size_text(entry.ram_needed)]
    assert cells[2].endswith(" MiB") and not cells[2].startswith("0.")   # a unit that fits
    assert theme.size_text(entry.size) in model_panel.table.item(row, 0).toolTip()
    assert "dream family" in model_panel.table.item(row, 0).toolTip()
    assert model_panel.table.item(row, 0).data(Qt.ItemDataRole.UserRole) == "ready"
    assert model_panel.entries[names.index("tiny-llada-f32.gguf")].file_type == "F32"
    e = model_panel.entries[row]
    assert e.ram_needed > sum(t.nbytes for t in gguf_file.read(e.path).tensors)
    assert ModelPanel().folders()[-1] == models               # the folder is remembered


def test_unknown_architecture_and_garbage_are_refused(model_panel, tmp_path):
    llama = write_llama_gguf(tmp_path / "llama.gguf")
    assert "not a diffusion model" in inspect_model(llama).error
    model_panel.add_file(llama)
    assert model_panel.message.isVisibleTo(model_panel) and "not a diffusion model" in model_panel.message.text()
    junk = tmp_path / "junk.gguf"
    junk.write_bytes(b"GGUF" + b"\x00" * 10)
    with_refusal = []
    model_panel.refused.connect(with_refusal.append)
    model_panel.add_file(junk)
    assert with_refusal and "junk.gguf" in with_refusal[0]
    assert not model_panel.load(llama)


def test_not_enough_ram_is_refused(qtbot, model_panel, models, monkeypatch):
    vm = namedtuple("vm", "available total")(200 * 2**20, 1 * 2**30)
    monkeypatch.setattr(psutil, "virtual_memory", lambda: vm)
    add_folder(qtbot, model_panel, models)
    row = [e.name for e in model_panel.entries].index("tiny-llada-f32.gguf")
    assert model_panel.table.item(row, 0).data(Qt.ItemDataRole.UserRole) == "too big"
    assert not model_panel.load(models / "tiny-llada-f32.gguf")
    assert "needs about" in model_panel.message.text() and "available" in model_panel.message.text()


def test_load_runs_as_a_job(qtbot, model_panel, models):
    with qtbot.waitSignal(model_panel.model_loaded, timeout=20000) as loaded:
        assert model_panel.load(models / "tiny-llada-f32.gguf")
        assert model_panel.job_box.isVisibleTo(model_panel) and not model_panel.load_button.isEnabled()
    model = loaded.args[0]
    assert isinstance(model, diffuse.Model) and model.arch == "llada"
    assert not model_panel.job_box.isVisibleTo(model_panel) and model_panel.load_button.isEnabled()
    assert model_panel.loaded_path == (models / "tiny-llada-f32.gguf").resolve()
    model_panel.engine_busy = True
    assert not model_panel.load(models / "tiny-llada-f32.gguf")
    assert "Stop the running generation" in model_panel.message.text()


def test_quantise_with_progress(qtbot, model_panel, models, tmp_path):
    out = tmp_path / "models" / "tiny-llada-q8_0.gguf"
    progress = []
    model_panel.job_finished.connect(lambda title, value: progress.append(("done", title)))
    with qtbot.waitSignals([model_panel.job_finished, model_panel.scanned], timeout=30000):
        assert model_panel.quantise(models / "tiny-llada-f32.gguf", "Q8_0", out)
        model_panel.job.progressed.connect(lambda d, t, w: progress.append((d, t)))
    assert out.is_file() and inspect_model(out).weight_type == "Q8_0"
    assert progress[-1][0] == "done" and len(progress) > 2     # progress came before the end
    assert all(d <= t for d, t in progress[:-1])
    assert str(out.resolve()) in {str(e.path) for e in model_panel.entries}
    assert model_panel.selected().path == out.resolve()


def test_quantise_refusals(model_panel, models, tmp_path):
    q8 = models / "tiny-dream-q8_0.gguf"
    assert not model_panel.quantise(q8, "Q8_0", tmp_path / "x.gguf")
    assert "already Q8_0" in model_panel.message.text()
    assert not model_panel.quantise(q8, "Q4_K_M", tmp_path / "y.gguf")
    assert "already quantised" in model_panel.message.text()


def test_cancel_leaves_nothing(qtbot, model_panel, models, tmp_path):
    out = tmp_path / "cancelled.gguf"
    with qtbot.waitSignal(model_panel.job_finished, timeout=30000) as done:
        model_panel.quantise(models / "tiny-llada-f32.gguf", "F16", out)
        model_panel.cancel_job()
    assert done.args[1] is None
    assert not out.exists() and not list(tmp_path.glob("cancelled*"))
    assert "cancelled" in model_panel.message.text()


def test_convert_hf_folder(qtbot, model_panel, tiny_hf_dream, tmp_path):
    out = tmp_path / "converted" / "dream-f16.gguf"
    out.parent.mkdir()
    results = []
    model_panel.job_finished.connect(lambda title, value: results.append(value))
    with qtbot.waitSignals([model_panel.job_finished, model_panel.scanned], timeout=60000):
        assert model_panel.convert(tiny_hf_dream, "f16", out)
    assert results[0] is not None and out.is_file()
    assert inspect_model(out).family == "dream"
    assert model_panel.selected().path == out.resolve()


def test_convert_refuses_a_folder_that_is_no_checkpoint(model_panel, tmp_path):
    assert not model_panel.convert(tmp_path, "f16", tmp_path / "out.gguf")
    assert "config.json" in model_panel.message.text()


def test_disk_space_is_checked(model_panel, models, tmp_path, monkeypatch):
    usage = namedtuple("usage", "total used free")(10, 10, 0)
    monkeypatch.setattr(mp.shutil, "disk_usage", lambda p: usage)
    assert not model_panel.quantise(models / "tiny-llada-f32.gguf", "F16", tmp_path / "f16.gguf")
    assert "of disk" in model_panel.message.text()


def test_a_model_loaded_from_outside_the_list_is_listed_and_selected(qtbot, model_panel, models, tmp_path):
    """`diffuse-studio MODEL.gguf` loads a file no listed folder holds: the list gains it, selected,
    with its details (it showed another model highlighted, and its details, beside it)."""
    add_folder(qtbot, model_panel, models)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    path = Path(shutil.copy(models / "tiny-dream-q8_0.gguf", elsewhere / "opened.gguf")).resolve()
    model_panel.table.selectRow(0)
    with qtbot.waitSignal(model_panel.model_loaded, timeout=20000):
        assert model_panel.load(path)
    qtbot.waitUntil(lambda: model_panel.selected() is not None and model_panel.selected().path == path,
                    timeout=10000)
    assert "opened.gguf" in model_panel.details.toPlainText()
    assert str(path) in mp._setting_list("models/files")
    # Loading a listed model selects its row too.
    listed = (models / "tiny-llada-f32.gguf").resolve()
    with qtbot.waitSignal(model_panel.model_loaded, timeout=20000):
        assert model_panel.load(listed)
    assert model_panel.selected().path == listed
