"""Settings panel: the generation options, remembered between sessions.

The fields are built from the engine's option table (`diffuse.generation.OPTIONS`): kind, range
and help text come from there, so the panel offers no value the engine refuses. Every number and
the scheduler have an "auto" value (just below the allowed range) that leaves the choice to the
loaded model's default: the recipe its file suggests over its family's
(`diffuse.generation.default_options(arch, model.recipe)`); the panel shows that default under
the field once a model is loaded.
"""
from __future__ import annotations

import math
import os
from typing import NamedTuple

from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import (QAbstractSpinBox, QCheckBox, QComboBox, QDoubleSpinBox, QFormLayout,
                               QGroupBox, QLabel, QPushButton, QSpinBox, QVBoxLayout, QWidget)

from diffuse import DiffuseError, physical_cores
from diffuse.generation import PRESET_TITLES, PRESETS as GENERATION_PRESETS
from diffuse.generation import (ARCHITECTURES, FAMILIES, OPTION_NAMES, OPTIONS, default_options,
                                 has_causal_modes, option, resolve_options, schedule_check)
from diffuse.studio import storage, theme
from diffuse.studio.wheel import guard_wheel

AUTO = "auto"
INT_MAX = 2**31 - 1     # a QSpinBox holds a 32-bit int (the engine's seed goes to 2^64 - 1)
PROMPT_ALLOWANCE = 32   # positions of the model's context kept for the prompt
FAMILY_NAMES = {"llada": "LLaDA", "dream": "Dream"}
# scheduler: (the family whose rule it is, None for ours; help)
SCHEDULER_HELP = {
    "low_confidence": ("llada", "commit the most confident positions of the block"),
    "random": ("llada", "commit random positions (a baseline)"),
    "entropy_exit": (None, "commit every position whose entropy is under tau, at least the schedule's count"),
    "origin": ("dream", "each mask commits with probability 1 - s/t"),
    "maskgit_plus": ("dream", "commit by top-1 probability"),
    "topk_margin": ("dream", "commit by the margin between the top two"),
    "entropy": ("dream", "commit the lowest-entropy positions"),
    "low_confidence_dynamic": (None, "SDAR, LLaDA2: every position above the confidence tau when at least the "
                                     "schedule's count are, else that count"),
    "low_confidence_static": (None, "SDAR: the schedule's count, most confident first"),
    "confidence_threshold": (None, "Fast-dLLM: the most confident and every position at least tau likely; "
                                   "a block runs until it has no masks"),
    "entropy_bounded": (None, "EB-sampler: the lowest entropies while their sum minus the largest fits the budget"),
    "confidence_factor": (None, "Fast-dLLM's factor rule: the n most confident while the n-th is at least "
                                "1 - factor/(n+1) likely"),
}

# The named decoding modes (diffuse.generation.PRESETS, the CLI's --preset), by title; a preset
# first resets every field to auto.
PRESETS = {PRESET_TITLES[name]: opts for name, opts in GENERATION_PRESETS.items()}


def options_summary(opts: dict) -> str:
    return ", ".join(f"{k} = {v}" for k, v in opts.items())


class Place(NamedTuple):
    """Where an engine option sits in the panel, and how a number field steps and shows."""
    group: str
    label: str
    step: float = 1
    decimals: int = 2
    suffix: str = ""


SCHEDULE, CACHE, SAMPLING = "Schedule", "Inter-step cache", "Sampling and compute"
# The options of one decoding loop only (generation.ARCHITECTURES' "loop"), each in a group of its own.
CAUSAL, WINDOW, UNIFORM = "AR and self-speculation", "WeDLM's sliding window", "Uniform-state canvas"
# (titles that fit the 1024-pixel panel)
# In panel order; an option the engine adds later shows at the end of the sampling group.
PLACES = {
    "scheduler": Place(SCHEDULE, "Scheduler"),
    "steps": Place(SCHEDULE, "Steps"),
    "gen_length": Place(SCHEDULE, "Gen length", 16),
    "block_length": Place(SCHEDULE, "Block length", 8),
    "sub_block_length": Place(SCHEDULE, "Sub-block length", 4),
    "threshold": Place(SCHEDULE, "Tau", 0.1, suffix=" nats"),
    "confidence_threshold": Place(SCHEDULE, "Confidence tau", 0.05),
    "factor": Place(SCHEDULE, "Factor", 0.1),
    "entropy_budget": Place(SCHEDULE, "Entropy budget", 0.05, suffix=" nats"),
    "carry_first": Place(SCHEDULE, "A block's first position first"),
    "eos_stop": Place(SCHEDULE, "End-of-text stop"),
    "editing_threshold": Place(SCHEDULE, "Editing tau", 0.05),
    "max_post_steps": Place(SCHEDULE, "Post steps"),
    "eps": Place(SCHEDULE, "Eps", 0.001, decimals=5),
    "cache": Place(CACHE, "Reuse settled positions' K/V"),
    "keep_active": Place(CACHE, "Keep active"),
    "refresh_every": Place(CACHE, "Refresh every"),
    "cache_policy": Place(CACHE, "Cache policy"),
    "suffix_window": Place(CACHE, "Suffix window"),
    "temperature": Place(SAMPLING, "Temperature", 0.1),
    "top_k": Place(SAMPLING, "Top-k"),
    "top_p": Place(SAMPLING, "Top-p", 0.05),
    "alg_temp": Place(SAMPLING, "Alg temp", 0.1),
    "cfg_scale": Place(SAMPLING, "CFG scale", 0.5),
    "seed": Place(SAMPLING, "Seed"),
    # the causal-cache modes (AR decode, self-speculation) of every loop but the uniform-state one
    "mode": Place(CAUSAL, "Decoding mode"),
    "draft_length": Place(CAUSAL, "Draft length"),
    "draft_lora": Place(CAUSAL, "Draft with the model's draft LoRA"),
    # WeDLM's sliding window (its threshold is Tau)
    "window_size": Place(WINDOW, "Window"),
    "pos_penalty": Place(WINDOW, "Position penalty", 0.01, decimals=3, suffix=" nats"),
    # the uniform-state canvas (DiffusionGemma): its temperature schedule and its stop rule
    "temperature_end": Place(UNIFORM, "Temperature at the end", 0.1),
    "stability": Place(UNIFORM, "Stable steps to stop"),
    "stop_entropy": Place(UNIFORM, "Stop below mean entropy", 0.001, decimals=4, suffix=" nats"),
}
UNIFORM_STATE = tuple(name for name, place in PLACES.items() if place.group == UNIFORM)
KINDS = {o["name"]: o["kind"] for o in OPTIONS} | {"threads": "int", "chat": "bool"}


class _FloatBox(QDoubleSpinBox):
    def stepBy(self, steps: int) -> None:
        # Up from "auto": onto the first multiple of the step the engine allows (tau 0, top_p
        # 0.05), not auto + step (-0.01 + 0.1).
        if self.value() == self.minimum() and steps > 0:
            least = self.minimum() + 10.0 ** -self.decimals()
            first = math.ceil(least / self.singleStep() - 1e-9) * self.singleStep()
            self.setValue(first + (steps - 1) * self.singleStep())
        else:
            super().stepBy(steps)


def _field(o: dict, place: Place) -> QWidget:
    """The widget of one engine option, limited to the values the engine accepts (and auto)."""
    tip = f"{o['help']}\nallowed: {o['range']}"
    if o["kind"] == "bool":
        box = QCheckBox(place.label)
    elif o["kind"] == "choice":
        box = theme.ElidedComboBox()     # as narrow as the panel
        box.addItem(AUTO, None)
        for name in o["choices"]:
            family, text = SCHEDULER_HELP.get(name, (None, ""))
            box.addItem(name, name)
            box.setItemData(box.count() - 1, f"{FAMILY_NAMES[family]}: {text}" if family else text,
                            Qt.ItemDataRole.ToolTipRole)
    else:
        if o["kind"] == "float":
            box, unit = _FloatBox(), 10.0 ** -place.decimals
            box.setDecimals(place.decimals)
        else:
            box, unit = QSpinBox(), 1
        # An open end moves in by the smallest step the field shows.
        lo = o["min"] + unit if o["min_open"] else o["min"]
        hi = o["max"] - unit if o["max_open"] else o["max"]
        if isinstance(box, QSpinBox):
            lo, hi = int(lo), min(int(hi), INT_MAX)
        box.setRange(lo - unit, hi)      # lo - unit is "auto"
        box.setSingleStep(place.step)
        box.setSuffix(place.suffix)
        box.setSpecialValueText(AUTO)
        _fit_digits(box)
        tip += "; auto: the model's default"
    box.setToolTip(tip)
    box.setProperty("help", tip)      # kept for a tooltip that adds why the field is off
    return box


def _fit_digits(box: QAbstractSpinBox) -> None:
    """As narrow as eight digits need, not as the range's extremes in full: Qt's width for the
    seed (up to 2^31) or eps widened the panel past a 1024-pixel screen."""
    box.setMinimumWidth(box.fontMetrics().horizontalAdvance("0" * 8) + 40)   # + padding, arrows


def _value(box: QWidget):
    """What a field holds; None for "auto"."""
    if isinstance(box, QCheckBox):
        return box.isChecked()
    if isinstance(box, QComboBox):
        return box.currentData()
    return None if box.value() == box.minimum() else box.value()


def _show(box: QWidget, value) -> None:
    if isinstance(box, QCheckBox):
        box.setChecked(bool(value))
    elif isinstance(box, QComboBox):
        box.setCurrentIndex(max(box.findData(value), 0))
    else:
        box.setValue(box.minimum() if value is None else value)


def _changed_signal(box: QWidget):
    if isinstance(box, QCheckBox):
        return box.toggled
    return box.currentIndexChanged if isinstance(box, QComboBox) else box.valueChanged


def _parse(key: str, raw):
    """A value read back from the INI file (which stores everything as text)."""
    if raw == "":
        return None
    kind = KINDS[key]
    if kind == "bool":
        if raw not in (True, False, "true", "false", "1", "0", 1, 0):
            raise ValueError("expected true or false")
        return raw in (True, "true", "1", 1)
    if kind == "choice":
        return raw      # the engine checks it (resolve_options)
    return float(raw) if kind == "float" else int(raw)


def _checked(key: str, value, box: QWidget, arch: str):
    """`value` if the engine accepts it for `key` and its field can show it; raises if not."""
    if value is None:
        return None
    if key in OPTION_NAMES:
        resolve_options(arch, **{key: value})
    if isinstance(box, (QSpinBox, QDoubleSpinBox)) and not box.minimum() <= value <= box.maximum():
        raise ValueError(f"outside what its field holds (up to {box.maximum():.15g})")
    return value


def _note(text: str = "") -> QLabel:
    """A muted line under a field; it wraps rather than widen the panel (a scheduler's name)."""
    note = QLabel(text)
    note.setObjectName("Muted")
    note.setWordWrap(True)
    return note


def _with_note(field: QWidget, note: QLabel) -> QWidget:
    box = QWidget()
    column = QVBoxLayout(box)
    column.setContentsMargins(0, 0, 0, 0)
    column.setSpacing(0)
    column.addWidget(field)
    column.addWidget(note)
    return box


class SettingsPanel(QWidget):
    changed = Signal()

    def __init__(self, parent=None):
        super().__init__(parent)
        self.arch: str | None = None        # the loaded model's architecture (generation.ARCHITECTURES)
        self.hparams: dict | None = None    # the loaded model's sizes, where known (a local model's hparams)
        self.n_ctx: int | None = None       # the loaded model's context (positions)
        self.recipe: dict = {}              # the loaded model's recipe (Model.recipe)
        self.fields: dict[str, QWidget] = {}
        # Fields of another kind of decoding than the loaded model's (off, _enable): not sent.
        self.off: set[str] = set()
        self.defaults_note: dict[str, QLabel] = {}
        self.labels: dict[str, QLabel] = {}     # a field's name in its form (a checkbox has its own)
        forms: dict[str, QFormLayout] = {}
        layout = QVBoxLayout(self)
        layout.setContentsMargins(4, 4, 4, 4)
        self.preset = theme.ElidedComboBox()
        self.preset.addItem("Method presets…", None)
        for name, opts in PRESETS.items():
            self.preset.addItem(name, name)
            self.preset.setItemData(self.preset.count() - 1, options_summary(opts), Qt.ItemDataRole.ToolTipRole)
        self.preset.setToolTip("set the fields to a published decoding method over the model's defaults")
        self.preset.activated.connect(self.apply_preset)
        layout.addWidget(self.preset)
        for name in [*PLACES, *(o["name"] for o in OPTIONS if o["name"] not in PLACES)]:
            place = PLACES.get(name) or Place(SAMPLING, name.replace("_", " ").capitalize())
            if place.group not in forms:
                group = QGroupBox(place.group)
                forms[place.group] = QFormLayout(group)
                layout.addWidget(group)
            box = self.fields[name] = _field(option(name), place)
            if isinstance(box, QCheckBox):
                forms[place.group].addRow(box)
            else:
                self._row(forms[place.group], place.label, box, name)
        self.threads = QSpinBox()
        self.threads.setRange(0, os.cpu_count() or 1)      # up to the logical CPUs; 0 is "auto"
        self.threads.setSpecialValueText(AUTO)
        _fit_digits(self.threads)
        self.threads.setToolTip("CPU threads; auto: the physical cores (hyper-threads cost more than they give)")
        self.chat = QCheckBox("Use the chat template")
        self.chat.setToolTip("wrap the prompt in the model's chat template")
        threads_note = _note(f"auto: {physical_cores()} physical cores")
        forms[SAMPLING].addRow("Threads", _with_note(self.threads, threads_note))
        forms[SAMPLING].addRow(self.chat)
        self.schedule_line = QLabel()       # what the engine would round or refuse
        self.schedule_line.setWordWrap(True)
        forms[SCHEDULE].addRow(self.schedule_line)
        reset = QPushButton("Reset to model defaults")
        reset.clicked.connect(self.reset)
        layout.addWidget(reset)
        layout.addStretch(1)

        guard_wheel(self)          # the wheel scrolls the panel, not the field under the pointer
        self.reset()
        self.restore()
        for box in [*self.fields.values(), self.threads, self.chat]:
            _changed_signal(box).connect(self._changed)
        self._update_enabled()
        self._update_schedule_line()

    def _row(self, form: QFormLayout, label: str, widget: QWidget, key: str) -> None:
        note = self.defaults_note[key] = _note()
        note.hide()
        name = self.labels[key] = QLabel(label)
        name.setWordWrap(True)      # a long name takes two lines, not the field's width
        form.addRow(name, _with_note(widget, note))

    # -- values -------------------------------------------------------------------------------

    def options(self) -> dict:
        """Keyword arguments for Model.generate; None leaves an option to the model's default. An
        option of a kind of decoding the loaded model does not do (its field off) is not sent; its
        field keeps the user's choice for the next model that takes it."""
        return self._values() | dict.fromkeys(self.off)

    def _values(self) -> dict:
        """What the fields hold, off or not (what is saved)."""
        opts = {name: _value(box) for name, box in self.fields.items()}
        return opts | {"threads": _value(self.threads), "chat": self.chat.isChecked()}

    def set_options(self, opts: dict) -> None:
        """Show `opts` (as returned by `options`); keys not given keep their value."""
        for name, box in [*self.fields.items(), ("threads", self.threads), ("chat", self.chat)]:
            if name in opts:
                _show(box, opts[name])

    def apply_preset(self, index: int) -> None:
        """Every field to auto (the model's defaults), then the preset's settings."""
        name = self.preset.itemData(index)
        if name is None:
            return
        self.reset()
        self.set_options(PRESETS[name])
        self._changed()

    def reset(self) -> None:
        """Numbers and the scheduler to auto, the loaded model's defaults; a checkbox, which has
        no auto, to the model's default (before any model is loaded, the first family's)."""
        defaults = self.defaults()
        opts = {name: defaults[name] if isinstance(box, QCheckBox) else None for name, box in self.fields.items()}
        self.set_options(opts | {"threads": None, "chat": True})

    def defaults(self) -> dict:
        """What auto means: the loaded model's defaults (its recipe over its family's)."""
        return default_options(self.arch or FAMILIES[0], self.recipe)

    def refusal(self) -> str | None:
        """Why the engine would refuse the settings, or None (the prompt is measured where it is
        encoded, on the engine thread)."""
        return schedule_check(self.options(), self.arch or FAMILIES[0], self.n_ctx, self.recipe, self.hparams)[1]

    def _family(self) -> str | None:
        return ARCHITECTURES[self.arch]["family"] if self.arch in ARCHITECTURES else None

    def show_defaults(self, arch: str | None, n_ctx: int | None = None,
                      recipe: dict | None = None, hparams: dict | None = None) -> None:
        """Show, under each field, what "auto" means for the loaded model of architecture `arch`
        (its family's defaults under the recipe its file suggests, Model.recipe); cap the gen length
        at the model's context; label the schedulers of the other family. `hparams`: the model's
        sizes where known (its block, canvas), for the schedule line."""
        self.arch, self.n_ctx, self.recipe, self.hparams = arch, n_ctx, dict(recipe or {}), hparams
        gen = self.fields["gen_length"]
        gen.setMaximum(int(option("gen_length")["max"]) if n_ctx is None else max(n_ctx - PROMPT_ALLOWANCE, 1))
        scheduler = self.fields["scheduler"]
        for i in range(1, scheduler.count()):
            name = scheduler.itemData(i)
            family = SCHEDULER_HELP.get(name, (None, ""))[0]
            other = arch is not None and family is not None and family != self._family()
            scheduler.setItemText(i, f"{name} ({FAMILY_NAMES[family]}'s rule)" if other else name)
        defaults = self.defaults() if arch else {}
        for key, note in self.defaults_note.items():
            if key in defaults:
                value = defaults[key]
                if value is None:       # the seed, unless the recipe names one
                    note.setText("random: a new one each run")
                    note.setToolTip("each run draws its own seed and reports it with the answer, "
                                    "so that a run can be repeated exactly")
                else:
                    shown = f"{value:g}" if isinstance(value, float) else str(value)
                    note.setText(f"model default: {shown}")
                    note.setToolTip("suggested by the model's file (its recipe)" if key in self.recipe
                                    else f"the {FAMILY_NAMES.get(self._family(), self._family())} family's default")
                note.show()
            else:
                note.hide()
        self._update_enabled()
        self._update_schedule_line()

    # -- persistence --------------------------------------------------------------------------

    def save(self) -> None:
        s = storage.settings()
        s.beginGroup("generation")
        for key, value in self._values().items():
            s.setValue(key, "" if value is None else value)
        s.endGroup()
        s.sync()

    def restore(self) -> None:
        """Show the saved options. A value the engine or its field refuses (a hand-edited or
        damaged entry) is dropped from the file, so the user is told once, and keeps its default."""
        s = storage.settings()
        s.beginGroup("generation")
        restored = {}
        boxes = {**self.fields, "threads": self.threads, "chat": self.chat}
        for key, box in boxes.items():
            raw = s.value(key)
            if raw is None:
                continue
            try:
                restored[key] = _checked(key, _parse(key, raw), box, self.arch or FAMILIES[0])
            except (TypeError, ValueError, OverflowError, DiffuseError) as e:
                storage.note_problem(f"settings.ini: {key} = {raw!r} was dropped ({e}).")
                s.remove(key)
        s.endGroup()
        s.sync()
        self.set_options(restored)

    def _changed(self) -> None:
        self._update_enabled()
        self._update_schedule_line()
        self.save()
        self.changed.emit()

    def _update_enabled(self) -> None:
        f = self.fields
        scheduler = f["scheduler"].currentData()
        wedlm = self._family() == "wedlm"
        f["threshold"].setEnabled(wedlm or scheduler in (None, "entropy_exit"))
        f["confidence_threshold"].setEnabled(scheduler in (None, "low_confidence_dynamic", "confidence_threshold"))
        f["factor"].setEnabled(scheduler in (None, "confidence_factor"))
        f["entropy_budget"].setEnabled(scheduler in (None, "entropy_bounded"))
        for key in ("keep_active", "refresh_every", "cache_policy"):
            f[key].setEnabled(f["cache"].isChecked())
        f["max_post_steps"].setEnabled(_value(f["editing_threshold"]) != 1)    # 1: editing off
        # Options of one decoding loop are off, saying why, where the loaded model decodes otherwise.
        loop = ARCHITECTURES[self.arch]["loop"] if self.arch in ARCHITECTURES else None
        uniform = loop == "uniform-state"
        for key in UNIFORM_STATE:
            self._enable(key, self.arch is None or uniform,
                         f"a uniform-state canvas only: this model ({self.arch}) unmasks masked positions")
        causal = self.arch is None or has_causal_modes(self.arch)
        self._enable("mode", causal, f"this model ({self.arch}) has no AR or self-speculation mode: its decoding "
                                     f"loop is {loop or 'not one this engine knows'}")
        for key in ("draft_length", "draft_lora"):
            self._enable(key, causal and f["mode"].currentData() == "self_spec",
                         "used by the self_spec decoding mode only")
        for key in ("window_size", "pos_penalty"):
            self._enable(key, self.arch is None or wedlm and f["mode"].currentData() in (None, "diffusion"),
                         "WeDLM's decoding only")
        for key, label in self.labels.items():      # a field off reads off by its name too (the theme)
            label.setEnabled(f[key].isEnabled())

    def _enable(self, key: str, on: bool, why_off: str) -> None:
        """A field on, or off (not sent: options) with the reason after its help in the tooltip."""
        box = self.fields[key]
        help_text = box.property("help")
        box.setEnabled(on)
        (self.off.discard if on else self.off.add)(key)
        box.setToolTip(help_text if on else f"{help_text}\n(off: {why_off})")

    def _update_schedule_line(self) -> None:
        rounded, refused = schedule_check(self.options(), self.arch or FAMILIES[0], self.n_ctx, self.recipe,
                                          self.hparams)
        self.schedule_line.setText(f"Generate is refused: {refused}" if refused else rounded)
        self.schedule_line.setVisible(bool(refused or rounded))
