"""Where the app keeps its files: settings, conversations and recorded runs.

The folder is Qt's per-user app data location, or $DIFFUSE_STUDIO_HOME when set (tests, portable
installs). Settings are an INI file in that folder, so one variable moves everything.
"""
from __future__ import annotations

import os
import sys
from pathlib import Path

from PySide6.QtCore import QSettings, QStandardPaths


def home_dir() -> Path:
    override = os.environ.get("DIFFUSE_STUDIO_HOME")
    if override:
        home = Path(override)
    else:
        base = QStandardPaths.writableLocation(QStandardPaths.StandardLocation.GenericDataLocation)
        home = Path(base) / "diffuse-studio"
    home.mkdir(parents=True, exist_ok=True)
    return home


def settings() -> QSettings:
    return QSettings(str(home_dir() / "settings.ini"), QSettings.Format.IniFormat)


def runs_dir() -> Path:
    d = home_dir() / "runs"
    d.mkdir(exist_ok=True)
    return d


def conversations_dir() -> Path:
    d = home_dir() / "conversations"
    d.mkdir(exist_ok=True)
    return d


def repo_models_dir() -> Path | None:
    """The shipped models/ folder: the bundle's copy, the installed package's, or the checkout's."""
    bundle = getattr(sys, "_MEIPASS", None)     # set inside a PyInstaller bundle
    here = Path(__file__).resolve()
    candidates = [Path(bundle) / "models"] if bundle else [here.parents[1] / "models", here.parents[3] / "models"]
    return next((d for d in candidates if d.is_dir()), None)


def demo_model() -> Path | None:
    """The demo model that ships with the app (the one GGUF in the shipped models/ folder)."""
    d = repo_models_dir()
    found = sorted(d.glob("*.gguf")) if d else []
    return found[0] if found else None
