"""The strip a long job shows while it runs: what it is doing, a progress bar, Cancel."""
from __future__ import annotations

from typing import Callable

from PySide6.QtWidgets import (QHBoxLayout, QLabel, QProgressBar, QPushButton, QSizePolicy,
                               QVBoxLayout, QWidget)


class JobBox(QWidget):
    """Hidden while idle; the owner shows it, sets `label` and `progress`, and hides it again."""

    def __init__(self, on_cancel: Callable[[], None], parent: QWidget | None = None):
        super().__init__(parent)
        self.label = QLabel()
        self.label.setObjectName("Muted")
        # Wrapped within the width it is given: a long tensor or file name must not widen the
        # panel while the job runs.
        self.label.setWordWrap(True)
        self.label.setSizePolicy(QSizePolicy.Policy.Ignored, QSizePolicy.Policy.Preferred)
        self.progress = QProgressBar()
        self.progress.setTextVisible(False)       # the label says how far
        self.cancel_button = QPushButton("Cancel")
        self.cancel_button.setObjectName("Danger")
        self.cancel_button.clicked.connect(on_cancel)
        row = QHBoxLayout()
        row.addWidget(self.progress, 1)
        row.addWidget(self.cancel_button)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.addWidget(self.label)
        layout.addLayout(row)
        self.hide()
