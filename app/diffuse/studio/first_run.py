"""The "Getting real models" dialog: shown at the first start while only the demo model is known
(once dismissed it stays away unless asked back), and from Help at any time.

It first says honestly what the demo model is (a tiny model that continues Austen-like prose, with
prompts that show it at its best: diffuse.studio.demo), then offers the model we recommend for a
laptop as one click: download, convert and quantise in one job with progress, resumable. Below,
it says what the real models of the catalog are, what each weight type costs in disk and RAM
against this computer's memory, which one we recommend for a laptop, and offers the ways to get
one: download its ready GGUF (one file of 4-5 GB, where the catalog has one) or its whole folder to
convert here when the hub can be reached, convert (and quantise) a folder downloaded from Hugging
Face, or pick a GGUF file. Model facts come from
models/catalog.json (diffuse.catalog), the one place they are written down.
Jobs run on a worker thread; closing the dialog leaves them running, reopening shows them.
"""
from __future__ import annotations

import html
from pathlib import Path

import psutil
from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import (QApplication, QCheckBox, QComboBox, QDialog, QFileDialog,
                               QGroupBox, QHBoxLayout, QLabel, QPushButton,
                               QScrollArea, QVBoxLayout, QWidget)

from diffuse import DiffuseError, catalog, hub
from diffuse.convert.families import read_config
from diffuse.convert.hf_to_gguf import convert_hf
from diffuse.generation import ARCHITECTURES
from diffuse.quantize import quantize_file
from diffuse.studio import storage, theme
from diffuse.studio.demo import DEMO_ABOUT, SUGGESTED_PROMPTS
from diffuse.studio.job_box import JobBox
from diffuse.studio.model_panel import disk_problem, inspect_model
from diffuse.studio.wheel import guard_wheel
from diffuse.studio.workers import Job

GB = 1e9
# Unset until the dialog is first dismissed, then what its check box said: "false" keeps it away.
SHOW_AT_START = "first_run/show_at_start"
DIRECT = ("F16", "Q8_0")     # types the converter writes itself; others go through F16
# The real model for a laptop: block diffusion with an exact K/V cache makes it the fastest on a CPU
# (a step computes only its block's rows, a few rows cost about one decode token).
LAPTOP_MODEL = "sdar-1.7b-chat"


def has_real_model(entries, demo_dir: Path | None) -> bool:
    """Whether the model panel knows a usable diffusion model outside the demo folder."""
    demo = demo_dir.resolve() if demo_dir else None
    return any(e.family and not e.error and e.path.resolve().parent != demo for e in entries)


def laptop_model() -> dict | None:
    """The catalog entry of the model we recommend for a laptop; None when the catalog lacks it."""
    try:
        return catalog.find(catalog.load(), LAPTOP_MODEL)
    except DiffuseError:
        return None


def laptop_line() -> str:
    """The model we recommend for a laptop, with the file and RAM of its recommended weight type
    from the catalog; "" when the catalog does not have it."""
    model = laptop_model()
    if model is None:
        return ""
    q = model["recommended"]
    need = model["quantizations"][q]
    file_gb = catalog.marked(model, f"quantizations.{q}.file_gb", f"{need['file_gb']:.1f} GB")
    ram = catalog.marked(model, f"quantizations.{q}.ram_gb", theme.size_text(need["ram_gb"] * GB))
    return (f"<b>For a laptop, start with {model['name']}</b>: block diffusion with an exact cache, "
            f"so a step computes only a few new rows, and one of the smallest real models; as {q.upper()} it is a "
            f"{file_gb} file that needs {ram} of RAM. ")


def get_text(model: dict) -> str:
    """The one-click button of a model: what it fetches and what it makes."""
    gguf = model.get("ready_gguf")
    if gguf is not None:
        return f"Get {model['name']}: download its {catalog.gguf_size_text(gguf, model)} GGUF"
    q = model["recommended"]
    checkpoint = catalog.marked(model, "download_bytes", f"{model['download_bytes'] / GB:.1f} GB")
    made = catalog.marked(model, f"quantizations.{q}.file_gb", f"{model['quantizations'][q]['file_gb']:.1f} GB")
    return f"Get {model['name']}: download {checkpoint}, make a {made} {q.upper()} file"


def demo_html() -> str:
    """What the demo model is, and the prompts that show it at its best."""
    prompts = "".join(f"<li><code>{p.replace('&', '&amp;').replace('<', '&lt;')}</code></li>"
                      for p in SUGGESTED_PROMPTS)
    return (f"<h3>The demo model continues Austen-like prose; it does not answer questions</h3>"
            f"{DEMO_ABOUT} Prompts that show it at its best:<ul style='margin:0'>{prompts}</ul>")


def models_dir() -> Path:
    """Where made and downloaded models go (storage.models_dir)."""
    return storage.models_dir()


def _stage(progress, lo: float, hi: float, label: str):
    """progress of one stage, (done, total) mapped to per-mille lo..hi of the whole job (Qt
    signals carry 32-bit ints, byte counts of real models do not fit)."""
    def report(done: int, total: int, what: str) -> None:
        frac = done / total if total > 0 else 0.0
        progress(int(1000 * (lo + (hi - lo) * frac)), 1000, f"{label} · {what}")
    return report


def make_gguf(hf_dir, out, qtype: str, progress, cancel, span=(0.0, 1.0)) -> Path | None:
    """HF checkpoint folder -> GGUF in `qtype`. F16 and Q8_0 come straight from the converter;
    Q4_K_M quantises a temporary F16 file, deleted afterwards. None when cancelled."""
    hf_dir, out = Path(hf_dir), Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    lo, hi = span
    if qtype in DIRECT:
        return convert_hf(hf_dir, out, qtype.lower(), _stage(progress, lo, hi, "converting"),
                          cancel)
    mid = lo + 0.6 * (hi - lo)
    tmp = out.with_name(out.stem + ".f16-tmp.gguf")
    try:
        if convert_hf(hf_dir, tmp, "f16", _stage(progress, lo, mid, "converting to F16"),
                      cancel) is None:
            return None
        return quantize_file(tmp, out, qtype, _stage(progress, mid, hi, f"quantising to {qtype}"),
                             cancel)
    finally:
        tmp.unlink(missing_ok=True)


def download_and_make(repo_id: str, folder, out, qtype: str, progress, cancel) -> Path | None:
    if hub.download(repo_id, folder, progress=_stage(progress, 0.0, 0.7, "downloading"),
                    cancel=cancel) is None:
        return None
    return make_gguf(folder, out, qtype, progress, cancel, span=(0.7, 1.0))


class ModelCard(QGroupBox):
    """One real model: facts, sizes and RAM per weight type, and its buttons."""

    convert_requested = Signal(dict, str)     # catalog entry, qtype
    download_requested = Signal(dict, str)
    gguf_requested = Signal(dict)             # catalog entry: download its ready GGUF

    def __init__(self, model: dict, ram_total: int, parent=None):
        laptop = model["id"] == LAPTOP_MODEL
        super().__init__(model["name"] + (" · recommended for a laptop" if laptop else ""), parent)
        self.model = model
        quants = model["quantizations"]
        rows = []

        def figure(path: str, text: str) -> str:      # marked where the catalog has it unverified
            return html.escape(catalog.marked(model, path, text), quote=False)

        for q, need in quants.items():
            verdict = _verdict(need["ram_gb"], ram_total)
            star = " (recommended)" if q == model.get("recommended") else ""
            file_gb = figure(f"quantizations.{q}.file_gb", f"{need['file_gb']:.1f} GB")
            ram = figure(f"quantizations.{q}.ram_gb", theme.size_text(need["ram_gb"] * GB))
            rows.append(f"<tr><td>{q.upper()}{star}</td><td align=right>{file_gb}</td><td align=right>{ram}</td>"
                        f"<td>{verdict}</td></tr>")
        params = figure("params", f"{model['params'] / 1e9:.1f}")
        checkpoint = figure("download_bytes", f"{model['download_bytes'] / GB:.1f} GB")
        unverified = catalog.unverified_text(model)
        facts = QLabel(
            f"<a href='{model['url']}' style='color:{theme.ACCENT.name()}'>{model['hf_repo']}</a>"
            f" · {model['family']} family · {params} billion parameters{_active(model)} · "
            f"{figure('license', model['license'])} licence<br>{_ready_line(model, ram_total)}"
            f"Hugging Face checkpoint: {checkpoint} ({figure('download_files', model['download_files'])}), "
            "made into a GGUF here:<table cellspacing=6><tr><th align=left>weights</th><th>file</th>"
            f"<th>RAM needed at {catalog.RAM_POSITIONS} positions</th><th></th></tr>" + "".join(rows) + "</table>"
            + (f"<span style='color:{theme.MUTED.name()}'>{html.escape(unverified, quote=False)}</span>" if unverified else ""))
        facts.setToolTip(unverified)       # the figures marked ~, named
        facts.setOpenExternalLinks(True)
        facts.setWordWrap(True)
        facts.setTextInteractionFlags(Qt.TextInteractionFlag.TextBrowserInteraction)

        self.qtype = QComboBox()
        for q in quants:
            self.qtype.addItem(q.upper(), q.upper())
        self.qtype.setCurrentText(model.get("recommended", "q4_k_m").upper())
        self.qtype.setToolTip("Weight type of the GGUF file to make: Q4_K_M is smallest, F16 exact")
        self.convert_button = QPushButton("Convert a downloaded folder…")
        self.convert_button.setToolTip(f"Pick the folder of {model['hf_repo']} you downloaded "
                                       f"(config.json and *.safetensors inside)")
        self.convert_button.clicked.connect(
            lambda: self.convert_requested.emit(self.model, self.qtype.currentData()))
        whole = catalog.marked(model, "download_bytes", f"{model['download_bytes'] / GB:.0f} GB")
        self.download_button = QPushButton(f"Download and make ({whole})")
        self.download_button.setToolTip("Download the whole checkpoint folder, then make the "
                                        "GGUF of the chosen weight type from it")
        self.download_button.clicked.connect(
            lambda: self.download_requested.emit(self.model, self.qtype.currentData()))
        gguf = model.get("ready_gguf")
        self.gguf_button = None
        if gguf is not None:
            self.gguf_button = QPushButton(f"Download the ready GGUF "
                                           f"({catalog.gguf_size_text(gguf, model)})")
            self.gguf_button.setObjectName("Primary")
            self.gguf_button.setToolTip(f"{gguf['repo']}/{gguf['file']}: one file, resumable, "
                                        f"{catalog.gguf_checks_text(gguf)}")
            self.gguf_button.clicked.connect(lambda: self.gguf_requested.emit(self.model))
        for b in self.download_buttons():
            b.setEnabled(False)       # until the hub is known to answer
        # The ready file on a row of its own, the ways to make one on the next: one row was wider
        # than the dialog, whose text then ran past its right edge.
        make = QHBoxLayout()
        make.addWidget(QLabel("Or make:"))
        make.addWidget(self.qtype)
        make.addWidget(self.convert_button)
        make.addWidget(self.download_button)
        make.addStretch(1)
        layout = QVBoxLayout(self)
        layout.addWidget(facts)
        if self.gguf_button is not None:
            layout.addWidget(self.gguf_button, 0, Qt.AlignmentFlag.AlignLeft)
        layout.addLayout(make)

    def download_buttons(self) -> list[QPushButton]:
        """The buttons that need the hub."""
        return [b for b in (self.gguf_button, self.download_button) if b is not None]


def _verdict(ram_gb: float, ram_total: int) -> str:
    if ram_gb * GB <= ram_total:
        return f"<span style='color:{theme.ACCENT.name()}'>fits</span>"
    return f"<span style='color:#ff9e7a'>more than this computer's {theme.size_text(ram_total)}</span>"


def _active(model: dict) -> str:
    """How much of a mixture-of-experts model one token uses, where the catalog says."""
    if "active_params" not in model:
        return ""
    experts = (f": {model['experts_per_token']} of {model['experts']} experts"
               if "experts" in model and "experts_per_token" in model else "")
    used = catalog.marked(model, "active_params", f"{model['active_params'] / 1e9:.1f}")
    return f" ({used} billion used per token{experts})"


def _ready_line(model: dict, ram_total: int) -> str:
    """The ready GGUF: its file, size and the RAM that file needs, against this computer's."""
    gguf = model.get("ready_gguf")
    if gguf is None:
        return ""
    ram = catalog.marked(model, "ready_gguf.ram_gb", theme.size_text(gguf["ram_gb"] * GB))
    return (f"<b>Ready GGUF</b> ({gguf['quantization'].upper()}): {gguf['repo']}/{gguf['file']}"
            f" · {catalog.gguf_size_text(gguf, model)} · needs {ram} of RAM at "
            f"{catalog.RAM_POSITIONS} positions, "
            f"{_verdict(gguf['ram_gb'], ram_total)} · {catalog.gguf_checks_text(gguf)}<br>")


class FirstRunDialog(QDialog):
    model_ready = Signal(str)     # a GGUF file made or picked here

    def __init__(self, parent=None):
        super().__init__(parent)
        self.setWindowTitle("Getting real models")
        screen = self.screen().availableGeometry()
        self.resize(min(760, screen.width() - 40), min(720, screen.height() - 40))
        self.job: Job | None = None
        self.check: Job | None = None
        self.online = False
        self._downloaded: Path | None = None     # the folder the running job downloads into
        self._resumes = False                    # the running job is a download (it resumes)
        self.cards: list[ModelCard] = []
        ram = psutil.virtual_memory().total

        demo = QLabel(demo_html())
        demo.setWordWrap(True)
        demo.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        intro = QLabel(
            "<h3>The real models write real answers</h3>" + laptop_line() +
            f"This computer has <b>{theme.size_text(ram)}</b> of RAM. The models from the "
            "research papers are below: some come as a ready GGUF file of 4-5 GB; each can be "
            "made into one GGUF file here from its Hugging Face checkpoint (Q4_K_M needs the "
            "least memory, F16 is exact but needs the most RAM).")
        intro.setWordWrap(True)
        self.recommended = laptop_model()
        self.get_button = None
        if self.recommended is not None:
            self.get_button = QPushButton(get_text(self.recommended))
            self.get_button.setObjectName("Primary")
            self.get_button.setToolTip("One job with progress: download (resumes where it stopped "
                                       "if interrupted or cancelled), convert and quantise; the "
                                       "model then loads")
            self.get_button.clicked.connect(self.get_recommended)
            self.get_button.setEnabled(False)      # until the hub is known to answer
        cards = QWidget()
        cards_layout = QVBoxLayout(cards)
        try:
            # the recommended model first: its card holds the other weight types
            for model in sorted(catalog.load(), key=lambda m: m["id"] != LAPTOP_MODEL):
                card = ModelCard(model, ram)
                card.convert_requested.connect(self._convert_clicked)
                card.download_requested.connect(self.download)
                card.gguf_requested.connect(self.download_gguf)
                self.cards.append(card)
                cards_layout.addWidget(card)
        except DiffuseError as e:
            cards_layout.addWidget(QLabel(str(e)))
        cards_layout.addStretch(1)
        scroll = QScrollArea()
        scroll.setWidgetResizable(True)
        scroll.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)   # the cards wrap
        scroll.setWidget(cards)
        guard_wheel(cards)         # the wheel scrolls the cards, not a card's weight type

        self.online_label = QLabel("Checking whether Hugging Face can be reached…")
        self.online_label.setWordWrap(True)
        self.online_label.setObjectName("Muted")
        gguf_button = QPushButton("I have a GGUF file: open it…")
        gguf_button.setToolTip(f"A .gguf of {', '.join(ARCHITECTURES)}, made by diffuse, llama.cpp or "
                               "diffuse-cpp")
        gguf_button.clicked.connect(self._gguf_clicked)
        self.buttons = [gguf_button] + [b for c in self.cards
                                        for b in (c.convert_button, *c.download_buttons())]
        self.hub_buttons = [b for c in self.cards for b in c.download_buttons()]
        if self.get_button is not None:
            self.hub_buttons.append(self.get_button)

        self.message = QLabel()
        self.message.setWordWrap(True)
        self.message.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.job_box = JobBox(self.cancel)
        self.job_label, self.progress, self.cancel_button = (
            self.job_box.label, self.job_box.progress, self.job_box.cancel_button)
        self.progress.setRange(0, 1000)

        self.show_at_start = QCheckBox("Show this window at every start until a real model is set up")
        self.show_at_start.setToolTip("Help → Getting real models opens it at any time")
        self.show_at_start.setChecked(asked_back())
        self.show_at_start.toggled.connect(_set_show_at_start)
        close = QPushButton("Close")
        close.setToolTip("A running job goes on; Help → Getting real models shows it again")
        close.clicked.connect(self.close)
        bottom = QHBoxLayout()
        bottom.addWidget(self.show_at_start, 1)
        bottom.addWidget(close)

        layout = QVBoxLayout(self)
        layout.addWidget(demo)
        layout.addWidget(intro)
        if self.get_button is not None:
            layout.addWidget(self.get_button)
        layout.addWidget(self.online_label)     # beside the button it can turn off
        layout.addWidget(scroll, 1)
        layout.addWidget(gguf_button)
        layout.addWidget(self.message)
        layout.addWidget(self.job_box)
        layout.addLayout(bottom)
        app = QApplication.instance()
        if app is not None:
            app.aboutToQuit.connect(self.shutdown)
        self.check_online()

    def done(self, result: int) -> None:
        """Closed by the user (Close, Esc, the window's close box): it stays away at the next
        start unless the check box asks it back."""
        _set_show_at_start(self.show_at_start.isChecked())
        super().done(result)

    # -- the ways to a model ------------------------------------------------------------------

    def get_recommended(self) -> bool:
        """The recommended model in one job: its ready GGUF where the catalog has one, else its
        checkpoint downloaded, converted and quantised to its recommended type."""
        model = self.recommended
        if model.get("ready_gguf") is not None:
            return self.download_gguf(model)
        return self.download(model, model["recommended"].upper())

    def use_gguf(self, path) -> bool:
        entry = inspect_model(path)
        if entry.error:
            return self._say(f"{Path(path).name}: {entry.error}", error=True)
        self._say(f"{entry.name} ({entry.architecture}, {entry.file_type}) is in the Models list.")
        self.model_ready.emit(str(entry.path))
        return True

    def convert_folder(self, hf_dir, qtype: str) -> bool:
        """Convert (and quantise) a downloaded checkpoint folder into models_dir()."""
        hf_dir = Path(hf_dir)
        try:
            read_config(hf_dir)           # refuse a wrong folder before any work
        except DiffuseError as e:
            return self._say(str(e), error=True)
        out = models_dir() / f"{hf_dir.name}-{qtype.lower()}.gguf"
        src = sum(p.stat().st_size for p in hf_dir.glob("*.safetensors"))
        return self._start(f"Making {out.name}", out, _disk_needed(qtype, src),
                           lambda progress, cancel: make_gguf(hf_dir, out, qtype, progress,
                                                              cancel))

    def download(self, model: dict, qtype: str) -> bool:
        """Download the model's folder (resumable), then make the GGUF from it."""
        name = model["hf_repo"].split("/")[-1]
        folder = storage.home_dir() / "downloads" / name
        out = models_dir() / f"{name}-{qtype.lower()}.gguf"
        started = self._start(f"Downloading and making {out.name}", out,
                           _disk_needed(qtype, model["download_bytes"]),
                           lambda progress, cancel: download_and_make(
                               model["hf_repo"], folder, out, qtype, progress, cancel))
        if started and self.job is not None:
            self._downloaded, self._resumes = folder, True
        return started

    def download_gguf(self, model: dict) -> bool:
        """Download the model's ready GGUF into models_dir() (resumable, checksummed)."""
        out = models_dir() / model["ready_gguf"]["file"]
        # Disk space is checked by the download itself, against the hub's exact size and
        # whatever part of the file is already here.
        started = self._start(f"Downloading {out.name}", out, 0,
                              lambda progress, cancel: catalog.download_ready_gguf(
                                  model, out.parent, progress=_stage(progress, 0.0, 1.0,
                                                                     "downloading"),
                                  cancel=cancel))
        if started and self.job is not None:
            self._resumes = True
        return started

    def cancel(self) -> None:
        if self.job is not None:
            self.job.cancel()
            self.job_label.setText(f"{self.job.title}: cancelling…")

    def shutdown(self) -> None:
        """Stop and wait for the worker threads (the app is quitting)."""
        if self.isVisible():         # seen and left open at quit: dismissed too
            _set_show_at_start(self.show_at_start.isChecked())
        for job in (self.job, self.check):
            if job is not None:
                job.cancel()
                job.wait()

    # -- online check -------------------------------------------------------------------------

    def check_online(self) -> None:
        self.check = Job("checking the hub", lambda progress, cancel: hub.offline_reason())
        self.check.finished.connect(self._checked)
        self.check.failed.connect(self._checked)
        self.check.start()

    def _checked(self, reason: str | None) -> None:
        self.check = None
        self.online = reason is None
        if self.online:
            if self.message.objectName() == "Warning" and self.job is None:
                self._say("")            # an earlier failure (offline, likely) is no longer true
            self.online_label.setText(f"Online: downloads from {hub.default_endpoint()} work, "
                                      "and resume where they stopped if interrupted.")
        else:
            self.online_label.setText(
                f"{reason} Downloading is off. On a computer with internet, download the "
                "model folder from its Hugging Face page (all files), copy it here, then use "
                "“Convert a downloaded folder…”.")
        self._enable(self.job is None)

    # -- jobs ---------------------------------------------------------------------------------

    def _start(self, title: str, out: Path, needed: int, fn) -> bool:
        if self.job is not None:
            return self._say(f"Wait for '{self.job.title}' to finish (or cancel it).", error=True)
        if out.exists():
            self._say(f"{out.name} was made before.")
            self.model_ready.emit(str(out))
            return True
        models_dir().mkdir(parents=True, exist_ok=True)
        problem = disk_problem(out, needed)
        if problem:
            return self._say(problem, error=True)
        self._say("")
        self.job = Job(title, fn)
        self.job.progressed.connect(self._progressed)
        self.job.finished.connect(self._finished)
        self.job.failed.connect(self._failed)
        self.job_label.setText(title)
        self.progress.setValue(0)
        self.job_box.show()
        self._enable(False)
        self.job.start()
        return True

    def _progressed(self, done: int, total: int, what: str) -> None:
        self.progress.setValue(done)
        self.job_label.setText(f"{self.job.title} · {done / 10:.0f}% · {what}")

    def _finished(self, out) -> None:
        job = self._job_done()
        downloaded, self._downloaded = self._downloaded, None
        resumes, self._resumes = self._resumes, False
        if out is None or job.cancelled:
            kept = " The download resumes where it stopped." if resumes else ""
            self._say(f"{job.title}: cancelled.{kept}")
            return
        note = (f" The downloaded folder {downloaded} is no longer needed; delete it to free "
                f"the disk space." if downloaded else "")
        self._say(f"Ready: {out}. It is in the Models list and loading.{note}")
        self.model_ready.emit(str(out))

    def _failed(self, message: str) -> None:
        job = self._job_done()
        self._downloaded, self._resumes = None, False
        self._say(f"{job.title} failed: {message}", error=True)

    def _job_done(self) -> Job:
        job, self.job = self.job, None
        self.job_box.hide()
        self._enable(True)
        return job

    def _enable(self, on: bool) -> None:
        for b in self.buttons:
            b.setEnabled(on)
        for b in self.hub_buttons:
            b.setEnabled(on and self.online)

    def _say(self, text: str, error: bool = False) -> bool:
        self.message.setObjectName("Warning" if error else "")
        self.message.style().unpolish(self.message)   # the style sheet keys on the name
        self.message.style().polish(self.message)
        self.message.setText(text)
        return not error

    # -- file dialogs -------------------------------------------------------------------------

    def _convert_clicked(self, model: dict, qtype: str) -> None:
        folder = QFileDialog.getExistingDirectory(
            self, f"The downloaded {model['name']} folder (config.json + *.safetensors)",
            str(Path.home()))
        if folder:
            self.convert_folder(folder, qtype)

    def _gguf_clicked(self) -> None:
        path, _ = QFileDialog.getOpenFileName(self, "Open a GGUF model", str(Path.home()),
                                              "GGUF models (*.gguf)")
        if path:
            self.use_gguf(path)


def _disk_needed(qtype: str, checkpoint_bytes: int) -> int:
    """Bytes a job writes besides its input: the GGUF, plus the temporary F16 for Q4_K_M."""
    bits = {"F16": 16, "Q8_0": 8.5, "Q4_K_M": 4.9}[qtype]
    f16 = checkpoint_bytes        # the checkpoints are bf16: F16 is the same size
    return int(f16 * bits / 16) + (0 if qtype in DIRECT else f16)


def show_at_start() -> bool:
    """Whether the dialog opens at start: until it is first dismissed, then as its check box said."""
    return str(storage.settings().value(SHOW_AT_START, "true")).lower() == "true"


def asked_back() -> bool:
    """Whether the user asked for the dialog at every start (the check box; off at first)."""
    return str(storage.settings().value(SHOW_AT_START, "false")).lower() == "true"


def _set_show_at_start(on: bool) -> None:
    s = storage.settings()
    s.setValue(SHOW_AT_START, "true" if on else "false")
    s.sync()


def open_for(window) -> FirstRunDialog:
    """Show the window's dialog (made once); what it makes or picks is added and loaded."""
    dialog = window.findChild(FirstRunDialog)
    if dialog is None:
        dialog = FirstRunDialog(window)
        dialog.model_ready.connect(window.model_panel.add_file)
        dialog.model_ready.connect(window.model_panel.load)
    dialog.show()
    dialog.raise_()
    return dialog


def open_at_start(window) -> FirstRunDialog | None:
    """On start: the dialog, unless a real model is already known or the user opted out."""
    if not show_at_start() or has_real_model(window.model_panel.entries,
                                             catalog.shipped_models_dir()):
        return None
    return open_for(window)
