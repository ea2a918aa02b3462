"""Where the app keeps its files: settings, conversations and recorded runs.

The folder is Qt's per-user app data location, or $DIFFUSE_STUDIO_HOME when set (tests, portable
installs). Settings are an INI file in that folder, so one variable moves everything.
"""
from __future__ import annotations

import json
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


def _demo_entry() -> tuple[Path, dict] | None:
    """The shipped models/ folder and the "demo" entry of its catalog.json."""
    d = repo_models_dir()
    if d is None:
        return None
    try:
        return d, dict(json.loads((d / "catalog.json").read_text(encoding="utf-8"))["demo"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def demo_model() -> Path | None:
    """The demo model that ships with the app, as models/catalog.json names it."""
    found = _demo_entry()
    path = found[0] / str(found[1].get("file", "")) if found else None
    return path if path is not None and path.is_file() else None


def demo_options() -> dict:
    """Generation settings the catalog suggests for the demo model (it loops when greedy)."""
    found = _demo_entry()
    return dict(found[1].get("suggested", {})) if found else {}
