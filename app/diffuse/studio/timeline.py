"""The step timeline under the canvas: the slider every view follows, play/pause, pace and speed.

A live run is drawn paced: the display moves on at most one step per `pace` milliseconds while
the engine runs at full speed on its thread (what is drawn are the steps it recorded), so a model
that denoises 64 steps in a quarter of a second can still be watched. A run shown in less than
WATCHABLE_MS is replayed once from the start when the display has caught up. Replays (the play
button, the chat's replay links, that automatic one) go at the replay speed. Pace and speed are
remembered in the settings.
"""
from __future__ import annotations

from PySide6.QtCore import Qt, QTimer
from PySide6.QtWidgets import (QComboBox, QHBoxLayout, QLabel, QSlider, QSpinBox, QToolButton,
                               QWidget)

from diffuse.studio import storage, theme

PACE_MS = 60                     # default shortest time a live step is shown
SPEEDS = (2, 5, 10, 20, 50)      # replay speeds, steps per second
SPEED = 10                       # the default one
WATCHABLE_MS = 1000              # a run shown faster than this is replayed


def _saved_int(key: str, default: int, allowed) -> int:
    """An int from the settings; a missing or damaged entry gives `default`."""
    try:
        value = int(storage.settings().value(key, default))
    except (TypeError, ValueError):
        return default
    return value if value in allowed else default


class Timeline(QWidget):
    """Step slider with play/pause. Follows the newest step, paced, until the user moves it."""

    def __init__(self, parent=None):
        super().__init__(parent)
        self.play_button = QToolButton()
        self.play_button.setText("▶")
        self.play_button.setToolTip("Replay the run from the start (Space)")
        self.play_button.setCheckable(True)
        self.play_button.toggled.connect(self._play_toggled)
        self.slider = QSlider(Qt.Orientation.Horizontal)
        self.slider.setRange(0, 0)
        self.slider.setToolTip("Step shown by every view; drag to scrub through the run")
        self.slider.setMinimumWidth(60)             # a handle's travel, also in a narrow window
        # rewritten at every step shown; "step 224/224 · live" fits, a longer text elides
        self.label = theme.SteadyLabel("no run", min_width=90, max_chars=18)
        self.label.setObjectName("Muted")
        self.label.setToolTip("The step every view shows; during a run, \"live\" when it is the "
                              "engine's newest step, else how many steps the engine is ahead")
        self.pace = QSpinBox()
        self.pace.setRange(0, 1000)
        self.pace.setSingleStep(10)
        self.pace.setSuffix(" ms")
        self.pace.setSpecialValueText("unpaced")
        self.pace.setMaximumWidth(self.pace.fontMetrics().horizontalAdvance("unpaced") + 48)
        self.pace.setToolTip("Pace of live runs: the shortest time each step is shown (the "
                             "engine still runs at full speed); 0 shows steps as they come")
        self.pace.setValue(_saved_int("view/pace_ms", PACE_MS, range(0, 1001)))
        self.pace.valueChanged.connect(self._pace_changed)
        self.speed = QComboBox()
        for n in SPEEDS:
            self.speed.addItem(f"{n}/s", n)
        self.speed.setToolTip("Replay speed, steps per second")
        self.speed.setCurrentIndex(SPEEDS.index(_saved_int("view/replay_speed", SPEED, SPEEDS)))
        self.speed.currentIndexChanged.connect(self._speed_changed)
        layout = QHBoxLayout(self)
        layout.setContentsMargins(8, 2, 8, 2)
        layout.addWidget(self.play_button)
        layout.addWidget(self.slider, 1)
        layout.addWidget(self.label)
        layout.addWidget(self.pace)
        layout.addWidget(self.speed)
        self.follow = True
        self._paced = True               # newest steps are shown paced (until stopped)
        self._replay_pending = False     # replay once the display has caught up
        # Every move of the user's (a drag, a click on the groove, Home, PageUp, the wheel), not
        # only drags: a view left following the newest step would play itself back to it.
        self.slider.actionTriggered.connect(self._user_moved)
        self._clock = QTimer(self)       # one step per tick: paced following, or a replay
        self._clock.timeout.connect(self._tick)

    @property
    def playing(self) -> bool:
        """Steps are being played: a paced live run catching up, or a replay."""
        return self._clock.isActive()

    def reset(self) -> None:
        """A new run is shown: no playback, follow its newest step, paced."""
        self._replay_pending = False
        self.play_button.setChecked(False)
        self._clock.stop()
        self.follow = True
        self._paced = True

    def stop(self) -> None:
        """End any playback and show the newest step, now and when more come (a cancelled run
        still ends its current step)."""
        self.reset()
        self._paced = False
        self.slider.setValue(self.slider.maximum())

    def set_count(self, n_steps: int) -> None:
        """The run now has `n_steps` steps; keep following the newest unless scrubbed away."""
        self.slider.setRange(0, max(n_steps - 1, 0))
        if not self.follow or self.play_button.isChecked():
            return
        if self.pace.value() == 0 or not self._paced:
            self.slider.setValue(self.slider.maximum())
        elif self.slider.value() < self.slider.maximum() and not self._clock.isActive():
            self._clock.start(self.pace.value())

    def run_ended(self, n_steps: int, total_ms: float) -> None:
        """The live run ended with `n_steps` after `total_ms`: if it was shown too fast to watch
        (paced or not), replay it once when the display has caught up."""
        self.set_count(n_steps)
        if max(total_ms, n_steps * self.pace.value()) < WATCHABLE_MS:
            self._replay_pending = True
            if not self._clock.isActive():
                self._tick()

    def play(self) -> None:
        """Replay from the start."""
        self.play_button.setChecked(False)
        self.slider.setValue(0)
        self.play_button.setChecked(True)

    def step(self) -> int:
        return self.slider.value()

    def back(self) -> None:
        self.follow = False
        self.slider.setValue(self.slider.value() - 1)

    def forward(self) -> None:
        self.slider.setValue(self.slider.value() + 1)
        self.follow = self.slider.value() >= self.slider.maximum()

    def _user_moved(self, _action: int) -> None:
        # the slider's position is where the action takes it; its value follows after this
        self.follow = self.slider.sliderPosition() >= self.slider.maximum()

    def _play_toggled(self, on: bool) -> None:
        self.play_button.setText("❚❚" if on else "▶")
        self._clock.stop()
        if on:
            if self.slider.value() >= self.slider.maximum():
                self.slider.setValue(0)
            self.follow = False
            self._clock.start(1000 // self.speed.currentData())
        elif self.slider.value() >= self.slider.maximum():
            self.follow = True

    def _tick(self) -> None:
        playing = self.play_button.isChecked()
        if not (playing or self.follow):           # scrubbed away from a paced live run
            self._clock.stop()
            return
        if self.slider.value() < self.slider.maximum():
            self.slider.setValue(self.slider.value() + 1)
        if self.slider.value() < self.slider.maximum():
            return
        if playing:                                  # the replay is over
            self.play_button.setChecked(False)
        elif self._replay_pending:                   # caught up with a run too fast to watch
            self._replay_pending = False
            self.play_button.setChecked(True)
        else:                                        # caught up; set_count starts it again
            self._clock.stop()

    def _pace_changed(self, ms: int) -> None:
        storage.settings().setValue("view/pace_ms", ms)
        if self._clock.isActive() and not self.play_button.isChecked():
            self._clock.setInterval(max(ms, 1))

    def _speed_changed(self, _index: int) -> None:
        storage.settings().setValue("view/replay_speed", self.speed.currentData())
        if self.play_button.isChecked():
            self._clock.setInterval(1000 // self.speed.currentData())
