"""Settings panel: the generation options, remembered between sessions.

Every number has an "auto" value (its minimum) that leaves the choice to the model family's
default (`diffuse.generation.default_options`); the panel shows that default beside the field
once a model is loaded.
"""
from __future__ import annotations

import os

from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import (QCheckBox, QComboBox, QDoubleSpinBox, QFormLayout, QGroupBox,
                               QLabel, QPushButton, QSpinBox, QVBoxLayout, QWidget)

from diffuse.generation import SCHEDULERS, default_options
from diffuse.studio import storage

AUTO = "auto"
SCHEDULER_HELP = {
    "low_confidence": "LLaDA: commit the most confident positions of the block",
    "random": "LLaDA: commit random positions (a baseline)",
    "entropy_exit": "commit every position whose entropy is under tau, at least the schedule's count",
    "origin": "Dream: each mask commits with probability 1 - s/t",
    "maskgit_plus": "Dream: commit by top-1 probability",
    "topk_margin": "Dream: commit by the margin between the top two",
    "entropy": "Dream: commit the lowest-entropy positions",
}


def _int_box(lo: int, hi: int, tip: str, step: int = 1) -> QSpinBox:
    box = QSpinBox()
    box.setRange(lo - 1, hi)       # lo - 1 is "auto"
    box.setSingleStep(step)
    box.setSpecialValueText(AUTO)
    box.setToolTip(tip)
    return box


def _parse(key: str, raw):
    """A value read back from the INI file (which stores everything as text)."""
    if raw == "":
        return None
    if key in ("cache", "chat"):
        return raw in (True, "true", "1", 1)
    if key == "scheduler":
        return raw if raw in SCHEDULERS else None
    if key in ("threshold", "temperature"):
        return float(raw)
    return int(raw)


class SettingsPanel(QWidget):
    changed = Signal()

    def __init__(self, parent=None):
        super().__init__(parent)
        self.scheduler = QComboBox()
        self.scheduler.addItem(AUTO, None)
        for name in SCHEDULERS:
            self.scheduler.addItem(name, name)
            self.scheduler.setItemData(self.scheduler.count() - 1, SCHEDULER_HELP.get(name, ""),
                                       Qt.ItemDataRole.ToolTipRole)
        self.steps = _int_box(1, 4096, "denoising steps in all (the step budget)")
        self.gen_length = _int_box(1, 4096, "generated positions (answer buffer length)", 16)
        self.block_length = _int_box(0, 4096, "semi-autoregressive block length (0: one block)", 8)
        self.tau = QDoubleSpinBox()
        self.tau.setRange(0.0, 12.0)
        self.tau.setSingleStep(0.1)
        self.tau.setDecimals(2)
        self.tau.setSuffix(" nats")
        self.tau.setToolTip("entropy-exit threshold: masked positions under it are committed")
        self.cache = QCheckBox("reuse K/V of settled positions between steps")
        self.keep_active = _int_box(0, 64, "steps a position stays recomputed after it changed")
        self.refresh_every = _int_box(0, 1024, "full recompute every N steps (0: never)")
        self.temperature = QDoubleSpinBox()
        self.temperature.setRange(0.0, 5.0)
        self.temperature.setSingleStep(0.1)
        self.temperature.setDecimals(2)
        self.temperature.setToolTip("0 is greedy (deterministic)")
        self.seed = QSpinBox()
        self.seed.setRange(0, 2**31 - 1)
        self.threads = _int_box(1, os.cpu_count() or 1, "CPU threads (auto: all cores)")
        self.chat = QCheckBox("wrap the prompt in the model's chat template")
        self.defaults_note: dict[str, QLabel] = {}

        schedule = QGroupBox("Schedule")
        form = QFormLayout(schedule)
        self._row(form, "Scheduler", self.scheduler, "scheduler")
        self._row(form, "Steps", self.steps, "steps")
        self._row(form, "Gen length", self.gen_length, "gen_length")
        self._row(form, "Block length", self.block_length, "block_length")
        self._row(form, "Tau", self.tau, "threshold")
        cache = QGroupBox("Inter-step cache")
        form = QFormLayout(cache)
        form.addRow(self.cache)
        self._row(form, "Keep active", self.keep_active, "keep_active")
        self._row(form, "Refresh every", self.refresh_every, "refresh_every")
        sampling = QGroupBox("Sampling and compute")
        form = QFormLayout(sampling)
        self._row(form, "Temperature", self.temperature, "temperature")
        form.addRow("Seed", self.seed)
        form.addRow("Threads", self.threads)
        form.addRow(self.chat)
        reset = QPushButton("Reset to model defaults")
        reset.clicked.connect(self.reset)

        layout = QVBoxLayout(self)
        layout.setContentsMargins(4, 4, 4, 4)
        for w in (schedule, cache, sampling):
            layout.addWidget(w)
        layout.addWidget(reset)
        layout.addStretch(1)

        self.reset()
        self.restore()
        for w in (self.steps, self.gen_length, self.block_length, self.keep_active,
                  self.refresh_every, self.seed, self.threads):
            w.valueChanged.connect(self._changed)
        for w in (self.tau, self.temperature):
            w.valueChanged.connect(self._changed)
        self.scheduler.currentIndexChanged.connect(self._changed)
        self.cache.toggled.connect(self._changed)
        self.chat.toggled.connect(self._changed)
        self._update_enabled()

    def _row(self, form: QFormLayout, label: str, widget: QWidget, key: str) -> None:
        note = QLabel()
        note.setObjectName("Muted")
        self.defaults_note[key] = note
        box = QWidget()
        row = QVBoxLayout(box)
        row.setContentsMargins(0, 0, 0, 0)
        row.setSpacing(0)
        row.addWidget(widget)
        row.addWidget(note)
        note.hide()
        form.addRow(label, box)

    # -- values -------------------------------------------------------------------------------

    def options(self) -> dict:
        """Keyword arguments for Model.generate; None leaves an option to the model's default."""
        def num(box):
            return None if box.value() == box.minimum() else box.value()
        return {
            "scheduler": self.scheduler.currentData(),
            "steps": num(self.steps),
            "gen_length": num(self.gen_length),
            "block_length": num(self.block_length),
            "threshold": self.tau.value(),
            "cache": self.cache.isChecked(),
            "keep_active": num(self.keep_active),
            "refresh_every": num(self.refresh_every),
            "temperature": self.temperature.value(),
            "seed": self.seed.value(),
            "threads": num(self.threads),
            "chat": self.chat.isChecked(),
        }

    def set_options(self, opts: dict) -> None:
        """Show `opts` (as returned by `options`); keys not given keep their value."""
        def put(box, value):
            box.setValue(box.minimum() if value is None else value)
        if "scheduler" in opts:
            i = self.scheduler.findData(opts["scheduler"])
            self.scheduler.setCurrentIndex(max(i, 0))
        for key, box in (("steps", self.steps), ("gen_length", self.gen_length),
                         ("block_length", self.block_length), ("keep_active", self.keep_active),
                         ("refresh_every", self.refresh_every), ("threads", self.threads)):
            if key in opts:
                put(box, opts[key])
        if "threshold" in opts:
            self.tau.setValue(opts["threshold"])
        if "temperature" in opts:
            self.temperature.setValue(opts["temperature"])
        if "seed" in opts:
            self.seed.setValue(opts["seed"])
        if "cache" in opts:
            self.cache.setChecked(bool(opts["cache"]))
        if "chat" in opts:
            self.chat.setChecked(bool(opts["chat"]))

    def reset(self) -> None:
        self.set_options({"scheduler": None, "steps": None, "gen_length": None,
                          "block_length": None, "threshold": 1.5, "cache": True,
                          "keep_active": None, "refresh_every": None, "temperature": 0.0,
                          "seed": 0, "threads": None, "chat": True})

    def show_defaults(self, arch: str | None) -> None:
        """Show, under each field, what "auto" means for the loaded model's family."""
        defaults = default_options(arch) if arch else {}
        for key, note in self.defaults_note.items():
            if key in defaults:
                value = defaults[key]
                note.setText(f"model default: {value:g}" if isinstance(value, float)
                             else f"model default: {value}")
                note.show()
            else:
                note.hide()

    # -- persistence --------------------------------------------------------------------------

    def save(self) -> None:
        s = storage.settings()
        s.beginGroup("generation")
        for key, value in self.options().items():
            s.setValue(key, "" if value is None else value)
        s.endGroup()
        s.sync()

    def restore(self) -> None:
        s = storage.settings()
        s.beginGroup("generation")
        restored = {}
        for key in self.options():
            raw = s.value(key)
            if raw is None:
                continue
            try:
                restored[key] = _parse(key, raw)
            except (TypeError, ValueError):
                continue        # a hand-edited or damaged entry keeps the default
        s.endGroup()
        self.set_options(restored)

    def _changed(self) -> None:
        self._update_enabled()
        self.save()
        self.changed.emit()

    def _update_enabled(self) -> None:
        self.tau.setEnabled(self.scheduler.currentData() in (None, "entropy_exit"))
        self.keep_active.setEnabled(self.cache.isChecked())
        self.refresh_every.setEnabled(self.cache.isChecked())
