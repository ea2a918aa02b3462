"""Model panel: the GGUF files you have, whether they fit, and the jobs that make new ones.

Models are found in the repository's models/ folder and in folders or files the user added
(remembered). Each row says the family, weight type, size and RAM needed against RAM available;
a file that cannot run here is marked and refused with the reason. Loading, downloading the ready
GGUF of a catalog model (diffuse.catalog), converting a Hugging Face folder and quantising run as
background jobs with a progress bar and Cancel.
"""
from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path

import psutil
from PySide6.QtCore import Qt, Signal
from PySide6.QtGui import QColor
from PySide6.QtWidgets import (QAbstractItemView, QFileDialog, QGridLayout, QHeaderView,
                               QInputDialog, QLabel, QPushButton, QSizePolicy, QTableWidget,
                               QTableWidgetItem, QTextBrowser, QVBoxLayout, QWidget)

import diffuse
from diffuse import DiffuseError, catalog, gguf_file
from diffuse.convert import OUTTYPES, TAKES, convert_hf
from diffuse.convert.families import read_config
from diffuse.generation import ARCHITECTURES
from diffuse.info import ftype_name
from diffuse.quantize import QTYPES, plan, quantize_file
from diffuse.studio import storage, theme
from diffuse.studio.job_box import JobBox
from diffuse.studio.workers import Job

PLAN_POSITIONS = 1024     # prompt + answer positions the RAM estimate plans for, at most
OFFERED_QTYPES = ("F16", "Q8_0", "Q4_K_M")
FLOAT_TYPES = ("F32", "F16", "BF16")


@dataclass
class ModelEntry:
    path: Path
    family: str | None          # whose loop and defaults apply (generation.FAMILIES); None: not a diffusion model
    dialect: str
    architecture: str | None    # general.architecture ("llada2"); None: the file could not be read
    weight_type: str            # the type holding most of the weight bytes, e.g. Q4_K
    file_type: str              # general.file_type as a name, e.g. Q4_K_M, or the weight type
    size: int                   # file bytes
    ram_needed: int
    error: str | None = None    # why it cannot be used
    positions: int = 0          # prompt + answer positions ram_needed plans for

    @property
    def name(self) -> str:
        return self.path.name


def plan_positions(info: gguf_file.GGUFInfo) -> int:
    """Positions a run of this model is planned for: its context, at most PLAN_POSITIONS."""
    ctx = info.kv.get(f"{info.architecture}.context_length")
    return min(int(ctx), PLAN_POSITIONS) if isinstance(ctx, int) and ctx > 0 else PLAN_POSITIONS


def estimate_ram(info: gguf_file.GGUFInfo) -> int:
    """Bytes of RAM a run needs: the weights (memory-mapped, all read every step) plus logits,
    K/V rows and feed-forward activations for `plan_positions` (float32), plus graph overhead.
    The one estimate of the app: the list, its details and the refusal to load all show it."""
    positions = plan_positions(info)
    embd = info.tensor("token_embd.weight")
    n_embd, n_vocab = (embd.shape[0], embd.shape[1]) if embd else (4096, 32000)
    layers = {t.name.split(".")[1] for t in info.tensors if t.name.startswith("blk.")}
    k = info.tensor("blk.0.attn_k.weight")
    n_kv = k.shape[1] if k else n_embd
    ffn = info.tensor("blk.0.ffn_up.weight")
    n_ff = ffn.shape[1] if ffn else 4 * n_embd
    weights = sum(t.nbytes for t in info.tensors)
    work = positions * 4 * (n_vocab + 2 * n_kv * len(layers) + 3 * n_ff + 8 * n_embd)
    return weights + work + 256 * 2**20


def inspect_model(path: str | Path) -> ModelEntry:
    """What the panel shows about one file; problems go into `error`, never raise."""
    path = Path(path)
    try:
        info = gguf_file.read(path)
    except DiffuseError as e:
        return ModelEntry(path, None, "?", None, "?", "?", _size_of(path), 0, str(e))
    by_type: dict[str, int] = {}
    for t in info.tensors:
        by_type[t.type_name] = by_type.get(t.type_name, 0) + t.nbytes
    weight_type = max(by_type, key=by_type.get).upper() if by_type else "?"
    file_type = (ftype_name(info.kv.get("general.file_type")) or weight_type).removeprefix("ALL_")
    entry = ModelEntry(path, info.family, info.dialect, info.architecture, weight_type,
                       file_type, info.file_size, estimate_ram(info),
                       positions=plan_positions(info))
    if info.family is None:
        entry.error = (f"architecture '{info.architecture}' is not a diffusion model "
                       f"(diffuse runs {', '.join(ARCHITECTURES)})")
    return entry


def distinct_names(paths: list[Path]) -> list[str]:
    """Each file's name, followed by as many of its folders as it takes to tell it apart from
    the other files of the same name."""
    names = []
    for p in paths:
        same = [q for q in paths if q.name == p.name and q != p]
        depth = 1
        while same and depth < len(p.parts) - 1 and any(
                q.parts[-depth - 1:] == p.parts[-depth - 1:] for q in same):
            depth += 1
        names.append(f"{p.name} ({Path(*p.parts[-depth - 1:-1])})" if same else p.name)
    return names


def _size_of(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


def fit_problem(entry: ModelEntry, available: int | None = None) -> str | None:
    """Why `entry` cannot be loaded on this machine now, or None."""
    if entry.error:
        return entry.error
    available = psutil.virtual_memory().available if available is None else available
    if entry.ram_needed > available:
        return (f"{entry.name} needs about {theme.size_text(entry.ram_needed)} of RAM, only "
                f"{theme.size_text(available)} are available. Close other programs or use a "
                f"smaller quantisation (Q4_K_M).")
    return None


def quantised_size(path: Path, qtype: str) -> int:
    """Bytes of `path` written as `qtype`: its tensors in the types diffuse.quantize's plan gives
    them (llama.cpp's mixtures, ggml's block sizes), plus the header and tokenizer as they are."""
    info = gguf_file.read(path)
    header = info.file_size - sum(t.nbytes for t in info.tensors)
    return header + sum(t.nbytes for t in plan(info, qtype))


def quantise_problem(entry: ModelEntry, qtype: str, out: Path) -> str | None:
    if entry.error:
        return entry.error
    if qtype not in QTYPES:
        return f"unknown quantisation type {qtype}"
    if entry.file_type.upper() == qtype:
        return f"{entry.name} is already {qtype}"
    if entry.weight_type.upper() not in FLOAT_TYPES:
        return (f"{entry.name} is already quantised ({entry.file_type}); quantising again "
                f"loses quality. Start from an F32, F16 or BF16 file.")
    try:
        needed = quantised_size(entry.path, qtype)
    except DiffuseError as e:        # changed on disk since it was listed
        return str(e)
    return disk_problem(out, needed)


def disk_problem(out: Path, needed: int) -> str | None:
    try:
        free = shutil.disk_usage(out.parent).free
    except OSError as e:
        return f"{out.parent}: cannot write there ({e})"
    if needed > free:
        return (f"{out.name} needs about {theme.size_text(needed)} of disk, {out.parent} has "
                f"{theme.size_text(free)} free")
    return None


def load_model(path: Path, progress, cancel):
    """Job body: map the weights and read the tokenizer (the first generate would otherwise)."""
    progress(0, 2, f"mapping {path.name}")
    model = diffuse.load(path)
    progress(1, 2, "reading the tokenizer")
    model.tokenizer
    progress(2, 2, "ready")
    return model


def _setting_list(key: str) -> list[str]:
    """A list from the INI settings (which give back a one-item list as a plain string)."""
    value = storage.settings().value(key)
    if isinstance(value, str):
        value = [value]
    return [str(v) for v in (value or []) if v]


class ModelPanel(QWidget):
    model_loaded = Signal(object)        # diffuse.Model
    scanned = Signal()                   # the list was (re)filled
    refused = Signal(str)
    job_finished = Signal(str, object)   # title, value (None if failed or cancelled)

    # Three columns, the name taking what is left: at 1024 pixels a fourth (the file size, in the
    # details and the tooltips like the family) squeezed the names to "di…gguf".
    COLUMNS = ("Model", "Type", "RAM")
    STATUS = {"loaded": ("▶", "#5ad1c8"), "ready": ("●", "#7ed07e"), "too big": ("●", "#ff9e7a"),
              "not a dLLM": ("○", "#8a90a2"), "unreadable": ("✕", "#ff6b6b")}

    def __init__(self, parent=None):
        super().__init__(parent)
        self.entries: list[ModelEntry] = []
        self.job: Job | None = None
        self.job_output: Path | None = None     # the file the running job writes, if any
        self.job_resumes = False                # the running job is a download that resumes
        self.loaded_path: Path | None = None
        self.engine_busy = False                # set by the window: no model swap mid-run
        self._scan: Job | None = None           # the header-reading job, while it runs
        self._scan_again = False
        self._select_after_scan: Path | None = None

        self.table = QTableWidget(0, len(self.COLUMNS))
        self.table.setHorizontalHeaderLabels(self.COLUMNS)
        self.table.setSelectionBehavior(QAbstractItemView.SelectionBehavior.SelectRows)
        self.table.setSelectionMode(QAbstractItemView.SelectionMode.SingleSelection)
        self.table.setEditTriggers(QAbstractItemView.EditTrigger.NoEditTriggers)
        self.table.verticalHeader().hide()
        self.table.setAlternatingRowColors(True)
        header = self.table.horizontalHeader()
        header.setSectionResizeMode(0, QHeaderView.ResizeMode.Stretch)
        header.setMinimumSectionSize(36)
        self.table.setWordWrap(False)
        # A long name loses its middle (its start and its quantisation stay), never the panel's
        # width: the whole path is in the row's tooltip.
        self.table.setTextElideMode(Qt.TextElideMode.ElideMiddle)
        self.table.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        for c in range(1, len(self.COLUMNS)):
            header.setSectionResizeMode(c, QHeaderView.ResizeMode.ResizeToContents)
        self.table.itemSelectionChanged.connect(self._selected)
        # Enter on a row and a double click (activation, as the platform has it) load the model.
        self.table.activated.connect(self._activated)

        self.load_button = QPushButton("Load")
        self.load_button.setObjectName("Primary")
        self.load_button.setToolTip("Load the selected model (Enter or a double click on its row)")
        self.load_button.clicked.connect(self._load_clicked)
        buttons = [self.load_button]
        for text, slot, tip in (
                ("Add GGUF…", self._add_file_clicked, "Add one .gguf file to the list"),
                ("Add folder…", self._add_folder_clicked, "Watch a folder of .gguf files"),
                ("Download GGUF…", self._download_clicked,
                 "Download the ready GGUF of a real model (one file of 4-5 GB)"),
                ("Convert HF…", self._convert_clicked,
                 f"Convert a Hugging Face checkpoint folder to GGUF ({TAKES})"),
                ("Quantise…", self._quantise_clicked, "Write the selected model as F16/Q8_0/Q4_K_M"),
                ("Rescan", self._rescan_clicked, "Look for new files")):
            b = QPushButton(text)
            b.setToolTip(tip)
            b.clicked.connect(slot)
            buttons.append(b)
        self.buttons = buttons
        grid = QGridLayout()        # two columns: the panel stays narrow on small screens
        for k, b in enumerate(buttons):
            grid.addWidget(b, k // 2, k % 2)

        self.message = QLabel()
        self.message.setWordWrap(True)
        # wrapped within the panel's width: a long path must not widen the panel
        self.message.setSizePolicy(QSizePolicy.Policy.Ignored, QSizePolicy.Policy.Preferred)
        self.message.setObjectName("Warning")
        self.message.hide()
        self.job_box = JobBox(self.cancel_job)
        self.job_label, self.progress, self.cancel_button = (
            self.job_box.label, self.job_box.progress, self.job_box.cancel_button)
        self.details = QTextBrowser()
        self.details.setMaximumHeight(150)

        layout = QVBoxLayout(self)
        layout.setContentsMargins(4, 4, 4, 4)
        layout.addWidget(self.table, 1)
        layout.addLayout(grid)
        layout.addWidget(self.message)
        layout.addWidget(self.job_box)
        layout.addWidget(self.details)
        self.rescan()

    # -- the list -----------------------------------------------------------------------------

    def folders(self) -> list[Path]:
        user = [Path(p) for p in _setting_list("models/folders")]
        repo = catalog.shipped_models_dir()
        return ([repo] if repo else []) + [f for f in user if f != repo]

    def files(self) -> list[Path]:
        return [Path(p) for p in _setting_list("models/files")]

    def _remember(self, key: str, path: Path) -> None:
        items = _setting_list(key)
        if str(path) not in items:
            s = storage.settings()
            s.setValue(key, items + [str(path)])
            s.sync()

    def rescan(self, select: Path | None = None) -> None:
        """Look for models again, reading headers on a background thread; `scanned` follows.
        `select`: a file to select once the list is filled."""
        if select is not None:
            self._select_after_scan = Path(select).resolve()
        if self._scan is not None:
            self._scan_again = True
            return
        paths: dict[Path, None] = {}
        for folder in self.folders():
            if folder.is_dir():
                for p in sorted(folder.glob("*.gguf")):
                    paths[p.resolve()] = None
        for p in self.files():
            if p.is_file():
                paths[p.resolve()] = None
        self._scan = Job("scanning models",
                         lambda progress, cancel: [inspect_model(p) for p in paths])
        self._scan.finished.connect(self._scanned)
        self._scan.failed.connect(self._scan_failed)
        self._scan.start()

    def _scan_failed(self, message: str) -> None:
        self._scanned(self.entries)
        self.refuse(f"Could not list the models: {message}")

    def _scanned(self, entries: list[ModelEntry]) -> None:
        self._scan = None
        if self._scan_again:            # something changed while we were reading
            self._scan_again = False
            self.rescan()
            return
        # Rows move when files come or go: keep the highlighted file, not the row number.
        shown = self.selected()
        keep = self._select_after_scan or (shown.path if shown else None)
        self._select_after_scan = None
        self.entries = entries
        self.table.clearSelection()
        self._fill_table()
        if keep is not None:
            self.select_path(keep)
        if self.entries and not self.table.selectedItems():
            self.table.selectRow(0)
        self._selected()      # the details follow the row even when the row number did not change
        self.scanned.emit()

    def unload(self) -> None:
        """The Studio runs another model (a server's): no file is marked loaded."""
        self.loaded_path = None
        self._fill_table()

    def _fill_table(self) -> None:
        available = psutil.virtual_memory().available
        self.table.setRowCount(len(self.entries))
        names = distinct_names([e.path for e in self.entries])
        for r, (e, name) in enumerate(zip(self.entries, names)):
            problem = fit_problem(e, available)
            status = _status(e, problem, self.loaded_path)
            mark, color = self.STATUS[status]
            shown = name.replace(e.path.name, e.path.stem, 1) if e.path.suffix == ".gguf" else name
            if e.architecture is None:         # nothing could be read: no type, no RAM to show
                cells = (f"{mark} {shown}", "—", "—")
                tip = f"{e.path}\n{theme.size_text(e.size)} · unreadable: {e.error}"
            else:
                cells = (f"{mark} {shown}", e.file_type, theme.size_text(e.ram_needed))
                tip = (f"{e.path}\n{e.architecture}" + (f" ({e.family} family)" if e.family else "") +
                       f" · {e.file_type} · "
                       f"{theme.size_text(e.size)} · needs {theme.size_text(e.ram_needed)} of RAM at "
                       f"{e.positions} positions, {theme.size_text(available)} available\n{status}"
                       + (f": {problem}" if problem else ""))
            for c, text in enumerate(cells):
                item = QTableWidgetItem(text)
                item.setToolTip(tip)
                item.setData(Qt.ItemDataRole.UserRole, status)
                if c == 0 or problem:
                    item.setForeground(QColor(color))
                self.table.setItem(r, c, item)

    def selected(self) -> ModelEntry | None:
        rows = self.table.selectionModel().selectedRows()
        return self.entries[rows[0].row()] if rows else None

    def select_path(self, path: Path) -> None:
        for r, e in enumerate(self.entries):
            if e.path == Path(path).resolve():
                self.table.selectRow(r)

    def _selected(self) -> None:
        # A refusal was about the row selected before (or about none being selected): it goes
        # with it. A running job's own messages come after its start and stay.
        if self.job is None:
            self._clear_message()
        e = self.selected()
        self._update_load_button(e)
        if e is None:
            self.details.clear()
            return
        if e.architecture is None:
            lines = [f"<b>{e.name}</b>", f"{e.path}", f"{theme.size_text(e.size)} · not a model "
                     f"diffuse can read"]
        else:
            lines = [f"<b>{e.name}</b>", f"{e.path}",
                     f"architecture <b>{e.architecture}</b> · family {e.family or '-'} · dialect {e.dialect} · "
                     f"weights {e.weight_type} · file type {e.file_type} · {theme.size_text(e.size)}",
                     f"RAM needed ≈ {theme.size_text(e.ram_needed)} for {e.positions} positions "
                     f"(prompt + answer)"]
        problem = fit_problem(e)
        if problem:
            lines.append(f"<span style='color:#ff9e7a'>{problem}</span>")
        self.details.setHtml("<br>".join(lines))

    def _update_load_button(self, e: ModelEntry | None) -> None:
        """Load is off for a file that can never load (unreadable, not a diffusion model), and
        says why; a model too big for the RAM free now stays on: Load then says how much is
        missing, and memory may have been freed since the list was made."""
        self.load_button.setEnabled(self.job is None and (e is None or e.error is None))
        self.load_button.setToolTip(
            f"{e.name} cannot be loaded: {e.error}" if e is not None and e.error
            else "Load the selected model (Enter or a double click on its row)")

    # -- messages -----------------------------------------------------------------------------

    def refuse(self, message: str) -> None:
        """Say no, visibly and without a modal dialog."""
        self.message.setText(message)
        self.message.show()
        self.refused.emit(message)

    def _clear_message(self) -> None:
        self.message.hide()
        self.message.clear()

    # -- actions (the dialogs only gather arguments) ------------------------------------------

    def add_file(self, path: str | Path) -> None:
        path = Path(path)
        self._clear_message()
        entry = inspect_model(path)
        if entry.error:
            self.refuse(f"{path.name}: {entry.error}")
            return
        self._remember("models/files", path)
        self.rescan(select=path)

    def add_folder(self, folder: str | Path) -> None:
        self._remember("models/folders", Path(folder))
        self.rescan()

    def load(self, path: str | Path) -> bool:
        if self.engine_busy:
            self.refuse("Stop the running generation before loading another model.")
            return False
        entry = inspect_model(path)
        problem = fit_problem(entry)
        if problem:
            self.refuse(problem)
            return False
        return self._start_job(f"Loading {entry.name}",
                               lambda progress, cancel: load_model(entry.path, progress, cancel))

    def convert(self, hf_dir: str | Path, outtype: str, out: str | Path) -> bool:
        hf_dir, out = Path(hf_dir), Path(out)
        try:
            read_config(hf_dir)          # refuse unknown architectures before any work
        except DiffuseError as e:
            self.refuse(str(e))
            return False
        src = sum(p.stat().st_size for p in hf_dir.glob("*.safetensors"))
        factor = {"f32": 2.0, "f16": 1.0, "bf16": 1.0, "q8_0": 0.55}[outtype]
        problem = disk_problem(out, int(src * factor))
        if problem:
            self.refuse(problem)
            return False
        return self._start_job(f"Converting {hf_dir.name} to {outtype.upper()}",
                               lambda progress, cancel: convert_hf(hf_dir, out, outtype,
                                                                  progress, cancel), out)

    def download_gguf(self, model: dict, folder: str | Path) -> bool:
        """Download the ready GGUF of `model` (a catalog entry) into `folder`: resumable, checked
        (the download itself refuses a full disk or a file of the user's in the way)."""
        out = Path(folder) / model["ready_gguf"]["file"]
        return self._start_job(f"Downloading {out.name}",
                               lambda progress, cancel: catalog.download_ready_gguf(
                                   model, out.parent, progress=progress, cancel=cancel),
                               out, resumes=True)

    def quantise(self, src: str | Path, qtype: str, out: str | Path) -> bool:
        entry, out = inspect_model(src), Path(out)
        problem = quantise_problem(entry, qtype, out)
        if problem:
            self.refuse(problem)
            return False
        return self._start_job(f"Quantising {entry.name} to {qtype}",
                               lambda progress, cancel: quantize_file(entry.path, out, qtype,
                                                                      progress, cancel), out)

    def cancel_job(self) -> None:
        if self.job is not None:
            self.job.cancel()
            self.job_label.setText(f"{self.job.title}: cancelling…")

    def jobs(self) -> list[Job]:
        """The background jobs going: the job and the model scan."""
        return [job for job in (self.job, self._scan) if job is not None]

    def shutdown(self) -> None:
        """Cancel the job and wait for background threads (the window is closing)."""
        self.cancel_job()
        for job in self.jobs():
            job.wait()

    # -- jobs ---------------------------------------------------------------------------------

    def _start_job(self, title: str, fn, output: Path | None = None,
                   resumes: bool = False) -> bool:
        """`resumes`: a download, whose cancelled part the next try continues."""
        if self.job is not None:
            self.refuse(f"Wait for '{self.job.title}' to finish (or cancel it) first.")
            return False
        self._clear_message()
        self.job = Job(title, fn)
        self.job_output, self.job_resumes = output, resumes
        self.job.progressed.connect(self._job_progress)
        self.job.finished.connect(self._job_finished)
        self.job.failed.connect(self._job_failed)
        self.job_label.setText(title)
        self.progress.setRange(0, 0)      # busy until the first progress report
        self.job_box.show()
        for b in self.buttons:
            b.setEnabled(False)
        self.job.start()
        return True

    def _job_progress(self, done: int, total: int, what: str) -> None:
        # Whole percents only: a QProgressBar repaints synchronously on every change.
        percent = 100 * done // total if total > 0 else 0
        if self.progress.maximum() != 100 or percent != self.progress.value():
            self.progress.setRange(0, 100)
            self.progress.setValue(percent)
        self.job_label.setText(f"{self.job.title} · {percent}%" + (f" · {what}" if what else ""))

    def _job_done(self) -> Job:
        job, self.job = self.job, None
        self.job_box.hide()
        for b in self.buttons:
            b.setEnabled(True)
        self._update_load_button(self.selected())
        return job

    def _job_finished(self, value) -> None:
        job, output = self._job_done(), self.job_output
        if job.cancelled or (output is not None and not output.exists()):
            self.refuse(f"{job.title}: cancelled; " + ("the download resumes where it stopped."
                                                        if self.job_resumes else
                                                        "nothing was written."))
            self.job_finished.emit(job.title, None)
            return
        if isinstance(value, diffuse.Model):
            self.loaded_path = Path(value.path).resolve()
            storage.settings().setValue("models/last", str(self.loaded_path))
            self._show_loaded()
            self.model_loaded.emit(value)
        elif output is not None:
            if not any(output.parent.resolve() == f.resolve() for f in self.folders()):
                self._remember("models/files", output)
            self.rescan(select=output)
        self.job_finished.emit(job.title, value)

    def _show_loaded(self) -> None:
        """The loaded model is listed, selected and its details shown. One opened from the command
        line (or last session's) that no listed folder holds is added as Add GGUF… adds it: the list
        otherwise lacked it and showed another model's details beside it."""
        path = self.loaded_path
        if any(e.path == path for e in self.entries):
            self._fill_table()
            self.select_path(path)
            return
        if not any(path.parent == f.resolve() for f in self.folders()):
            self._remember("models/files", path)
        self.rescan(select=path)

    def _job_failed(self, message: str) -> None:
        job = self._job_done()
        self.refuse(f"{job.title} failed: {message}")
        self.job_finished.emit(job.title, None)

    # -- dialogs ------------------------------------------------------------------------------

    def _rescan_clicked(self) -> None:
        self.rescan()

    def _load_clicked(self) -> None:
        e = self.selected()
        if e is None:
            self.refuse("Select a model in the list first (or add one).")
        else:
            self.load(e.path)

    def _activated(self, index) -> None:
        self.load(self.entries[index.row()].path)

    def _add_file_clicked(self) -> None:
        path, _ = QFileDialog.getOpenFileName(self, "Add a GGUF model",
                                              storage.dialog_dir("models"), "GGUF models (*.gguf)")
        if path:
            storage.remember_dialog_dir("models", path)
            self.add_file(path)

    def _add_folder_clicked(self) -> None:
        folder = QFileDialog.getExistingDirectory(self, "Add a folder of GGUF models",
                                                  storage.dialog_dir("models"))
        if folder:
            storage.remember_dialog_dir("models", folder)
            self.add_folder(folder)

    def _save_model_as(self, title: str, name: str) -> str:
        """Where to write a new model: asked, starting in the user's models folder."""
        out, _ = QFileDialog.getSaveFileName(self, title,
                                             str(Path(storage.dialog_dir("models")) / name),
                                             "GGUF models (*.gguf)")
        if out:
            storage.remember_dialog_dir("models", out)
        return out

    def _convert_clicked(self) -> None:
        hf_dir = QFileDialog.getExistingDirectory(
            self, "Hugging Face model folder (config.json + *.safetensors)",
            storage.dialog_dir("checkpoints"))
        if not hf_dir:
            return
        storage.remember_dialog_dir("checkpoints", hf_dir)
        try:
            read_config(Path(hf_dir))     # a wrong folder is said now, not after two more questions
        except DiffuseError as e:
            self.refuse(str(e))
            return
        outtype, ok = QInputDialog.getItem(self, "Convert", "Weight type of the GGUF file:",
                                           list(OUTTYPES), 1, False)
        if not ok:
            return
        out = self._save_model_as("Save the GGUF file as", f"{Path(hf_dir).name}-{outtype}.gguf")
        if out:
            self.convert(hf_dir, outtype, out)

    def _download_clicked(self) -> None:
        try:
            offered = [m for m in catalog.load() if "ready_gguf" in m]
        except DiffuseError as e:
            self.refuse(str(e))
            return
        available = psutil.virtual_memory().available
        labels = [_gguf_offer(m, available) for m in offered]
        # the list's items have no tooltips: the mark of an unverified figure is said over them
        marks = any(catalog.UNVERIFIED_MARK in label for label in labels)
        label, ok = QInputDialog.getItem(self, "Download a ready GGUF", f"Into {storage.models_dir()}:" + (
            f"\n{catalog.UNVERIFIED_MARK}: a figure no primary record confirmed (Help → Getting real models names them)"
            if marks else ""), labels, 0, False)
        if ok and label in labels:
            self.download_gguf(offered[labels.index(label)], storage.models_dir())

    def _quantise_clicked(self) -> None:
        e = self.selected()
        if e is None:
            self.refuse("Select the model to quantise first.")
            return
        try:
            offers = {f"{q} · about {theme.size_text(quantised_size(e.path, q))}": q
                      for q in OFFERED_QTYPES}
        except DiffuseError as err:        # the file changed on disk since it was listed
            self.refuse(str(err))
            return
        label, ok = QInputDialog.getItem(
            self, "Quantise", f"Write {e.name} ({theme.size_text(e.size)}) as:", list(offers),
            list(offers.values()).index("Q4_K_M"), False)
        if not ok or label not in offers:
            return
        qtype = offers[label]
        stem = e.path.stem
        for t in (e.file_type, e.weight_type):
            stem = stem.replace(f"-{t.lower()}", "").replace(f"-{t}", "")
        out = self._save_model_as("Save the quantised model as", f"{stem}-{qtype.lower()}.gguf")
        if out:
            self.quantise(e.path, qtype, out)


def _status(e: ModelEntry, problem: str | None, loaded: Path | None) -> str:
    """The row's status: a key of ModelPanel.STATUS."""
    if e.architecture is None:
        return "unreadable"
    if e.error:
        return "not a dLLM"
    return "loaded" if e.path == loaded else "ready" if problem is None else "too big"


def _gguf_offer(model: dict, available: int) -> str:
    """One ready GGUF as the download dialog lists it: the file's size and the RAM it needs."""
    gguf = model["ready_gguf"]
    ram = gguf["ram_gb"] * 1e9
    fits = "fits" if ram <= available else f"more than the {theme.size_text(available)} available"
    need = catalog.marked(model, "ready_gguf.ram_gb", theme.size_text(ram))
    return (f"{model['name']} · {gguf['quantization'].upper()} · "
            f"{catalog.gguf_size_text(gguf, model)} · needs {need} of RAM at {catalog.RAM_POSITIONS} "
            f"positions ({fits})")
