"""The Models panel as people use it: a broken file says what is wrong and cannot be loaded,
Enter and a double click load, Convert checks the folder before asking anything else, Quantise
offers each type with its size, a refusal goes once its cause has, expected job failures are one
line and no traceback, long names keep their distinguishing ends."""
from __future__ import annotations

import logging
import shutil

import pytest
from PySide6.QtCore import Qt
from PySide6.QtWidgets import QInputDialog

from diffuse import DiffuseError, gguf_file
from diffuse.quantize import plan
from diffuse.studio import model_panel as mp
from diffuse.studio import theme
from diffuse.studio.workers import Job


@pytest.fixture
def models(tmp_path, tiny_gguf):
    folder = tmp_path / "models"
    folder.mkdir()
    shutil.copy(tiny_gguf("llada", "f32"), folder / "tiny-llada-f32.gguf")
    (folder / "broken.gguf").write_bytes(b"GGUF" + b"\x00" * 10)
    return folder


def listed(qtbot, panel, folder, name):
    with qtbot.waitSignal(panel.scanned, timeout=10000):
        panel.add_folder(folder)
    return [e.name for e in panel.entries].index(name)


def test_a_broken_file_says_what_is_wrong_and_cannot_load(qtbot, model_panel, models):
    row = listed(qtbot, model_panel, models, "broken.gguf")
    cells = [model_panel.table.item(row, c).text() for c in range(model_panel.table.columnCount())]
    assert cells == ["✕ broken", "—", "—"]            # no "RAM 0 B"
    assert model_panel.table.item(row, 0).data(Qt.ItemDataRole.UserRole) == "unreadable"
    model_panel.table.selectRow(row)
    error = model_panel.entries[row].error
    assert error and not model_panel.load_button.isEnabled()
    assert error in model_panel.load_button.toolTip() and error in model_panel.details.toPlainText()
    good = [e.name for e in model_panel.entries].index("tiny-llada-f32.gguf")
    model_panel.table.selectRow(good)
    assert model_panel.load_button.isEnabled()


@pytest.mark.parametrize("how", ["enter", "double click"])
def test_enter_and_double_click_load_the_row(qtbot, model_panel, models, how):
    row = listed(qtbot, model_panel, models, "tiny-llada-f32.gguf")
    model_panel.show()
    qtbot.waitExposed(model_panel)
    model_panel.table.selectRow(row)
    with qtbot.waitSignal(model_panel.model_loaded, timeout=20000) as loaded:
        if how == "enter":
            model_panel.table.setFocus()
            qtbot.keyClick(model_panel.table, Qt.Key.Key_Return)
        else:
            rect = model_panel.table.visualRect(model_panel.table.model().index(row, 0))
            # a real double click: press, release, then the double click (the view checks it
            # lands on the row pressed)
            qtbot.mouseClick(model_panel.table.viewport(), Qt.MouseButton.LeftButton, pos=rect.center())
            qtbot.mouseDClick(model_panel.table.viewport(), Qt.MouseButton.LeftButton,
                              pos=rect.center())
    assert loaded.args[0].path.endswith("tiny-llada-f32.gguf")


def test_convert_checks_the_folder_before_asking_more(model_panel, tmp_path, monkeypatch):
    asked = []
    monkeypatch.setattr(mp.QFileDialog, "getExistingDirectory", lambda *a: str(tmp_path))
    monkeypatch.setattr(mp.QInputDialog, "getItem", lambda *a: asked.append(a) or ("f16", True))
    monkeypatch.setattr(mp.QFileDialog, "getSaveFileName", lambda *a: asked.append(a) or ("", ""))
    model_panel._convert_clicked()
    assert asked == [] and "config.json" in model_panel.message.text()


def test_quantise_offers_each_type_with_its_size(qtbot, model_panel, models, monkeypatch, tiny_gguf):
    row = listed(qtbot, model_panel, models, "tiny-llada-f32.gguf")
    model_panel.table.selectRow(row)
    path = models / "tiny-llada-f32.gguf"
    info = gguf_file.read(path)
    header = info.file_size - sum(t.nbytes for t in info.tensors)
    offered = {}
    monkeypatch.setattr(QInputDialog, "getItem",
                        lambda parent, title, label, items, current, editable:
                        offered.update(items=items, current=current) or ("", False))
    model_panel._quantise_clicked()
    sizes = {q: header + sum(t.nbytes for t in plan(info, q)) for q in mp.OFFERED_QTYPES}
    assert offered["items"] == [f"{q} · about {theme.size_text(n)}" for q, n in sizes.items()]
    assert offered["items"][offered["current"]].startswith("Q4_K_M")
    assert sizes["F16"] > sizes["Q8_0"] > sizes["Q4_K_M"]
    f16 = tiny_gguf("llada", "f16")       # our converter's F16 and quantize's agree on every type
    assert mp.quantised_size(f16, "F16") == gguf_file.read(f16).file_size


def test_a_refusal_goes_with_its_cause(qtbot, model_panel, models):
    model_panel.table.clearSelection()
    model_panel._load_clicked()
    assert model_panel.message.isVisibleTo(model_panel) and "Select a model" in model_panel.message.text()
    model_panel.table.selectRow(0)
    assert not model_panel.message.isVisibleTo(model_panel)
    row = listed(qtbot, model_panel, models, "broken.gguf")
    assert not model_panel.load(models / "broken.gguf")
    assert model_panel.message.isVisibleTo(model_panel)
    model_panel.table.selectRow([e.name for e in model_panel.entries].index("tiny-llada-f32.gguf"))
    assert row >= 0 and not model_panel.message.isVisibleTo(model_panel)


def test_an_expected_failure_is_one_line_and_no_traceback(qtbot, caplog, capfd):
    def offline(progress, cancel):
        raise DiffuseError("org/model: this computer is offline, https://huggingface.co cannot be reached")
    job = Job("download", offline)
    with caplog.at_level(logging.DEBUG), qtbot.waitSignal(job.failed, timeout=10000) as failed:
        job.start()
    assert failed.args == ["org/model: this computer is offline, https://huggingface.co cannot be reached"]
    assert not caplog.records and "Traceback" not in capfd.readouterr().err

    def bug(progress, cancel):
        raise KeyError("x")
    job = Job("bug", bug)
    with caplog.at_level(logging.DEBUG), qtbot.waitSignal(job.failed, timeout=10000) as failed:
        job.start()
    assert failed.args == ["KeyError: 'x'"]
    assert caplog.records and caplog.records[0].exc_info      # a bug of ours keeps its traceback


def test_long_names_keep_their_ends_and_the_name_column_has_the_room(qtbot, model_panel, tmp_path,
                                                                     tiny_gguf):
    folder = tmp_path / "long"
    folder.mkdir()
    name = "LLaDA-MoE-7B-A1B-Instruct-from-the-hub-q4_k_m"
    shutil.copy(tiny_gguf("llada", "f32"), folder / f"{name}.gguf")
    row = listed(qtbot, model_panel, folder, f"{name}.gguf")
    model_panel.resize(260, 500)            # the side panel at 1024 pixels
    model_panel.show()
    qtbot.waitExposed(model_panel)
    table = model_panel.table
    assert table.textElideMode() == Qt.TextElideMode.ElideMiddle
    others = sum(table.columnWidth(c) for c in range(1, table.columnCount()))
    assert table.columnWidth(0) >= others
    item = table.item(row, 0)
    assert str(folder / f"{name}.gguf") in item.toolTip()
    shown = table.fontMetrics().elidedText(item.text(), Qt.TextElideMode.ElideMiddle,
                                           table.columnWidth(0) - 8)
    assert shown.startswith("● LLaDA") and shown.endswith("q4_k_m")
