"""Views that must not mislead: the cache chart's prompt marker and legend, the model list's
details after a rescan, the compare window's model and settings, RAM figures, where file dialogs
open, and what a junk run file says."""
from __future__ import annotations

import shutil
import zipfile
from pathlib import Path

import numpy as np
import psutil
import pytest
from PySide6.QtCore import Qt
from PySide6.QtGui import QImage
from PySide6.QtWidgets import QFileDialog

import diffuse
from diffuse import DiffuseError, gguf_file
from diffuse.recording import Recording
from diffuse.studio import main_window as mw
from diffuse.studio import model_panel as mp
from diffuse.studio import first_run, storage, theme, throughput
from diffuse.studio.cache_view import CacheView
from diffuse.studio.model_panel import inspect_model
from diffuse.studio.run_state import RunState

DEMO = storage.demo_model()        # the installed package's copy: the one the panel lists


def pixels(widget) -> set[tuple[int, int, int]]:
    image = widget.grab().toImage().convertToFormat(QImage.Format.Format_RGB888)
    data = np.frombuffer(bytes(image.constBits()), np.uint8)
    rows = data.reshape(image.height(), image.bytesPerLine())[:, :image.width() * 3]
    return {tuple(p) for p in np.unique(rows.reshape(-1, 3), axis=0).tolist()}


def rgb(color) -> tuple[int, int, int]:
    return color.red(), color.green(), color.blue()


# -- the cache chart ----------------------------------------------------------------------------

def test_prompt_marker_is_at_the_prompt_length_of_the_run_shown(qtbot, recorded_run,
                                                                synthetic_recording):
    view = CacheView()
    qtbot.addWidget(view)
    replayed = RunState.from_recording(recorded_run("eos"))
    view.set_run(replayed)
    assert view.prompt_line.value() == replayed.prompt_length
    # a live run is shown before its first step: the marker follows once its sizes are known
    rec = synthetic_recording("one two three four five six seven eight nine ten")
    live = RunState(rec.prompt, rec.options, rec.model)
    view.set_run(live)
    assert not view.prompt_line.isVisible()
    live.add(rec.events[0])
    view.show_step(-1)
    assert live.prompt_length != replayed.prompt_length
    assert view.prompt_line.isVisible() and view.prompt_line.value() == live.prompt_length
    assert f"prompt {live.prompt_length} positions" in view.summary.text


def test_cache_chart_rows_are_the_steps_used(qtbot, recorded_run):
    run = RunState.from_recording(recorded_run("entropy_exit"))
    assert run.n_steps < run.steps_allowed              # stopped early
    view = CacheView()
    qtbot.addWidget(view)
    view.set_run(run)
    assert view.image.image.shape[0] == run.n_steps


def test_cache_legend_swatches_are_filled_in_the_drawn_colours(qtbot):
    view = CacheView()
    view.resize(600, 400)
    qtbot.addWidget(view)
    view.show()
    qtbot.waitExposed(view)
    # no run: the only orange and blue on screen are the legend's swatches
    shown = pixels(view)
    assert rgb(theme.ACTIVE) in shown and rgb(theme.CACHED) in shown
    assert view.plot.legend is None           # pyqtgraph's legend drew both in its default purple


# -- the model list -----------------------------------------------------------------------------

@pytest.fixture
def models(tmp_path, tiny_gguf):
    folder = tmp_path / "models"
    folder.mkdir()
    shutil.copy(tiny_gguf("llada", "f32"), folder / "m-llada.gguf")
    shutil.copy(tiny_gguf("dream", "q8_0"), folder / "z-dream.gguf")
    return folder


def rescan(qtbot, model_panel):
    with qtbot.waitSignal(model_panel.scanned, timeout=10000):
        model_panel.rescan()


def test_rescan_keeps_the_highlighted_model_and_its_details(qtbot, model_panel, models, monkeypatch):
    with qtbot.waitSignal(model_panel.scanned, timeout=10000):
        model_panel.add_folder(models)
    model_panel.select_path(models / "z-dream.gguf")
    row = model_panel.table.currentRow()
    # a new file sorts before it: the rows move under the highlight
    shutil.copy(models / "m-llada.gguf", models / "a-llada.gguf")
    rescan(qtbot, model_panel)
    assert model_panel.selected().path == (models / "z-dream.gguf").resolve()
    assert model_panel.table.selectionModel().selectedRows()[0].row() != row
    assert "z-dream.gguf" in model_panel.details.toPlainText()
    # a file gone: the details describe the row now highlighted, and Load loads that one
    (models / "z-dream.gguf").unlink()
    rescan(qtbot, model_panel)
    loaded = []
    monkeypatch.setattr(model_panel, "load", loaded.append)
    model_panel._load_clicked()
    assert loaded == [model_panel.selected().path]
    assert model_panel.selected().name in model_panel.details.toPlainText()


def test_files_of_the_same_name_are_told_apart(qtbot, model_panel, tmp_path, tiny_gguf):
    a, b = tmp_path / "work" / "a", tmp_path / "home" / "a"
    for folder in (a, b):
        folder.mkdir(parents=True)
        shutil.copy(tiny_gguf("llada", "f32"), folder / "model.gguf")
        with qtbot.waitSignal(model_panel.scanned, timeout=10000):
            model_panel.add_folder(folder)
    names = {model_panel.table.item(r, 0).text() for r in range(model_panel.table.rowCount())}
    # shown without .gguf (the column's room goes to the name), told apart by their folders
    assert {n for n in names if n.startswith("● model ")} == {"● model (work/a)", "● model (home/a)"}
    tips = {model_panel.table.item(r, 0).toolTip().splitlines()[0]
            for r in range(model_panel.table.rowCount())}
    assert {str((a / "model.gguf").resolve()), str((b / "model.gguf").resolve())} <= tips
    assert mp.distinct_names([Path("/x/m.gguf"), Path("/y/n.gguf")]) == ["m.gguf", "n.gguf"]


# -- RAM --------------------------------------------------------------------------------------

def test_ram_need_is_for_the_models_context(qtbot, model_panel):
    entry = inspect_model(DEMO)
    assert entry.positions == 256 == gguf_file.read(DEMO).kv["llada.context_length"]
    model_panel.select_path(DEMO)
    assert f"{theme.size_text(entry.ram_needed)} for 256 positions" in model_panel.details.toPlainText()


def test_ram_is_written_in_one_unit_everywhere(qtbot, monkeypatch):
    total = 25 * 10**9          # a machine the issue saw as "25 GB" here and "23.x GiB" there
    memory = type("VM", (), {"total": total, "available": total})()
    monkeypatch.setattr(psutil, "virtual_memory", lambda: memory)
    monkeypatch.setattr(first_run.FirstRunDialog, "check_online", lambda self: None)
    dialog = first_run.FirstRunDialog()
    qtbot.addWidget(dialog)
    texts = " ".join(label.text() for label in dialog.findChildren(first_run.QLabel))
    assert f"<b>{theme.size_text(total)}</b>" in texts and "23.3 GiB" in texts
    assert " GB of RAM" not in texts and "GB</b> of RAM" not in texts
    view = throughput.ThroughputView()
    qtbot.addWidget(view)
    view.sample_cpu()
    assert f"of {theme.size_text(total)}" in view.memory.text() and "23.3 GiB" in view.memory.text()


# -- compare ------------------------------------------------------------------------------------

def test_compare_shows_its_model_and_settings_and_drops_another_models_results(
        qtbot, window, fake_model):
    window.set_model(fake_model(step_delay=0.0))
    window.settings_panel.set_options({"gen_length": 48, "steps": 24, "block_length": 16})
    window.open_compare()
    cmp = window.compare_window
    context = cmp.context.text()
    assert "diffuse-demo-3m.gguf" in context
    assert "gen_length 48" in context and "steps 24" in context
    assert "cache" not in context             # the preset varies it: A and B say which
    window.settings_panel.set_options({"steps": 12})
    assert "steps 12" in cmp.context.text()
    cmp.prompt.setText("Tell me about Mr. Darcy.")
    with qtbot.waitSignal(window.engine.run_finished, timeout=20000):
        cmp.start()
    qtbot.waitUntil(lambda: cmp.summary.text().startswith("Steps: A"), timeout=20000)
    cmp.close()
    window.set_model(fake_model(path="other-model.gguf", step_delay=0.0))
    window.open_compare()
    assert cmp.runs == [] and "other-model.gguf" in cmp.context.text()
    assert "diffuse-demo-3m.gguf" in cmp.summary.text()       # says why the results went
    assert all(side.canvas.canvas.run is None and not side.text.toPlainText()
               for side in cmp.sides)
    qtbot.keyClick(cmp.prompt, Qt.Key.Key_Escape)     # the prompt box has the focus
    assert not cmp.isVisible()


# -- file dialogs -------------------------------------------------------------------------------

def test_file_dialogs_open_in_the_users_folders_and_remember_each_kind(
        qtbot, window, monkeypatch, tmp_path, studio_home):
    asked = []

    def pick(answer):
        def dialog(parent, title, folder, *args):
            asked.append(folder)
            return answer, ""
        return dialog

    internal = (storage.runs_dir(), Path(mw.__file__).parent.parent)
    monkeypatch.setattr(QFileDialog, "getOpenFileName", staticmethod(pick("")))
    window._open_clicked()
    assert asked == [str(storage.runs_dir())]         # opening: where every run is recorded
    monkeypatch.setattr(QFileDialog, "getSaveFileName",
                        staticmethod(pick(str(tmp_path / "pictures" / "strip.png"))))
    (tmp_path / "pictures").mkdir()
    window._png_clicked()
    window._gif_clicked()
    window.save_recording = lambda path: None
    window._save_clicked()
    saved_in = [asked[1], asked[3]]                   # the first PNG and the run saved
    assert not any(Path(f).resolve().is_relative_to(p.resolve()) for f in saved_in
                   for p in internal)
    assert asked[2] == str(tmp_path / "pictures")     # pictures: where the last one went
    assert asked[3] != asked[2]                       # runs saved: their own memory

    model_panel = window.model_panel
    qtbot.waitUntil(lambda: model_panel._scan is None, timeout=10000)
    model_panel.select_path(DEMO)
    # the offers name each type with its size ("Q8_0 · about 3.6 MiB")
    monkeypatch.setattr(mp.QInputDialog, "getItem", staticmethod(
        lambda parent, title, text, items, *a: (next(i for i in items if i.startswith("Q8_0 ")), True)))
    monkeypatch.setattr(QFileDialog, "getSaveFileName", staticmethod(pick("")))
    before = len(asked)
    model_panel._quantise_clicked()
    assert len(asked) == before + 1                   # the save dialog opened
    out = Path(asked[-1])
    assert out.name == "diffuse-demo-3m-q8_0.gguf"
    assert out.parent == storage.models_dir() and out.parent.is_relative_to(studio_home)
    assert not out.resolve().is_relative_to(Path(diffuse.__file__).parent)


# -- junk run files -----------------------------------------------------------------------------

def test_a_junk_npz_is_refused_with_our_own_words(qtbot, window, tmp_path):
    header = b"{'descr': '|u1', 'fortran_order': False, 'shape': (3,), 'x': '%s'}" % (b"a" * 20000)
    with zipfile.ZipFile(tmp_path / "junk.npz", "w") as z:
        z.writestr("meta.npy", b"\x93NUMPY\x02\x00" + len(header).to_bytes(4, "little")
                   + header + b"abc")
    np.savez(tmp_path / "other.npz", x=np.array([{"a": 1}], dtype=object))
    for name in ("junk.npz", "other.npz"):
        with pytest.raises(DiffuseError, match="not a diffuse recording") as refused:
            Recording.load(tmp_path / name)
        assert "pickle" not in str(refused.value) and "max_header_size" not in str(refused.value)
        assert not window.open_recording(tmp_path / name)
        assert "not a diffuse recording" in window.statusBar().currentMessage()
