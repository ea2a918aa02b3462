"""Where the app keeps its files (settings, conversations, recorded runs, made models) and where
its file dialogs open.

The folder is Qt's per-user app data location, or $DIFFUSE_STUDIO_HOME when set (tests, portable
installs). Settings are an INI file in that folder, so one variable moves everything.

Damaged local state never stops the app: an unreadable file is moved aside to NAME.bad (never
deleted: the user may want it back), a value of the wrong type is dropped, and each problem is
noted once for the window to show (`take_problems`).
"""
from __future__ import annotations

import os
import re
import time
from pathlib import Path

from PySide6.QtCore import QByteArray, QSettings, QStandardPaths

from diffuse import catalog

MAX_SETTINGS_BYTES = 1 << 20        # a real settings file is a few kB
# Settings read outside the settings panel, and the type each must have.
_SETTING_TYPES = {"models/last": (str,), "window/geometry": (QByteArray, bytes),
                  "window/splitter": (QByteArray, bytes)}
_problems: list[str] = []
_checked: set[Path] = set()          # settings files checked in this process


def home_dir() -> Path:
    override = os.environ.get("DIFFUSE_STUDIO_HOME")
    if override:
        home = Path(override)
    else:
        base = QStandardPaths.writableLocation(QStandardPaths.StandardLocation.GenericDataLocation)
        home = Path(base) / "diffuse-studio"
    home.mkdir(parents=True, exist_ok=True)
    return home


def note_problem(message: str) -> None:
    """Remember a problem found in local state, for the window to show once."""
    _problems.append(message)


def take_problems() -> list[str]:
    """The problems noted since the last call; the window shows them, then they are gone."""
    taken = _problems[:]
    _problems.clear()
    return taken


def set_aside(path: Path, why: str) -> None:
    """Move an unreadable file to NAME.bad (NAME.bad.2, ... when taken) and note it."""
    bad, k = path.with_name(path.name + ".bad"), 2
    while bad.exists():
        bad, k = path.with_name(f"{path.name}.bad.{k}"), k + 1
    try:
        os.replace(path, bad)
    except OSError as e:
        note_problem(f"{path} could not be read ({why}) nor moved aside ({e}).")
        return
    note_problem(f"{path.name} could not be read ({why}); it was kept as {bad}.")


def settings() -> QSettings:
    path = home_dir() / "settings.ini"
    if path not in _checked:
        _checked.add(path)
        _check_settings(path)
    return QSettings(str(path), QSettings.Format.IniFormat)


def _check_settings(path: Path) -> None:
    """Set aside a settings file Qt cannot parse; drop entries of the wrong type."""
    try:
        if path.stat().st_size > MAX_SETTINGS_BYTES:
            set_aside(path, f"larger than {MAX_SETTINGS_BYTES} bytes")
            return
        raw = path.read_bytes()
    except FileNotFoundError:
        return
    except OSError as e:
        set_aside(path, str(e))
        return
    s = QSettings(str(path), QSettings.Format.IniFormat)
    # Qt reads binary junk as odd keys without complaint: NUL or invalid UTF-8 marks it as junk.
    try:
        raw.decode("utf-8")
        parsed = b"\0" not in raw and s.status() == QSettings.Status.NoError
    except UnicodeDecodeError:
        parsed = False
    if not parsed:
        set_aside(path, "not a settings file")
        return
    for key, kinds in _SETTING_TYPES.items():
        if s.contains(key) and not isinstance(s.value(key), kinds):
            note_problem(f"settings.ini: {key} = {s.value(key)!r} was not understood and was "
                         f"dropped.")
            s.remove(key)
    s.sync()


# write_atomic's temporary files (.NAME.XXXXXXXX.part) are renamed within seconds; one this old was
# left by a process killed mid-write (kill -9, power loss) and holds nothing the user saved.
STALE_PART_S = 3600.0


def sweep_stale_parts() -> None:
    """Delete stale temporary files from the app's own folders (runs, conversations); at start."""
    now = time.time()
    for part in [*runs_dir().glob(".*.part"), *conversations_dir().glob(".*.part")]:
        try:
            if now - part.stat().st_mtime > STALE_PART_S:
                part.unlink()
        except OSError:          # gone already, or not ours to remove: leave it
            continue


def runs_dir() -> Path:
    d = home_dir() / "runs"
    d.mkdir(exist_ok=True)
    return d


RUN_NAME_WORDS = 40        # characters of the prompt in a recording's file name


def new_run_path(prompt: str, created: float, taken=()) -> Path:
    """A free file name in runs_dir() for a run recorded at `created` (epoch seconds): its local
    date and time and the prompt's first words, e.g. 2026-12-02_00-28-09_tell-me-about-darcy.npz.
    Only letters, digits and - are kept from the prompt; a name that exists or is in `taken`
    (recordings still being written) gets -2, -3, ..., so no recording is ever overwritten."""
    words = "-".join(re.findall(r"[^\W_]+", prompt.lower()))[:RUN_NAME_WORDS].strip("-") or "run"
    stem = f"{time.strftime('%Y-%m-%d_%H-%M-%S', time.localtime(created))}_{words}"
    folder, taken = runs_dir(), {Path(t) for t in taken}
    path, k = folder / f"{stem}.npz", 2
    while path.exists() or path in taken:
        path, k = folder / f"{stem}-{k}.npz", k + 1
    return path


def recent_runs(n: int) -> list[Path]:
    """The `n` newest recordings in runs_dir(), newest first."""
    found = []
    for path in runs_dir().glob("*.npz"):
        try:
            found.append((path.stat().st_mtime, path))
        except OSError:          # removed while listed
            continue
    return [path for _, path in sorted(found, reverse=True)[:n]]


def models_dir() -> Path:
    """Where made and downloaded models go: the app's own folder, kept across reinstalls."""
    d = home_dir() / "models"
    d.mkdir(exist_ok=True)
    return d


def dialog_dir(kind: str) -> str:
    """The folder a file dialog for `kind` opens in: the one last chosen for that kind, else
    for "models" the app's models folder, for "recordings" (runs to open) the folder every run
    is recorded in, for the rest (runs saved, exports, checkpoints) the user's Documents. Files
    are never offered a place in the installed package or among the app's own recordings."""
    last = settings().value(f"dialogs/{kind}")
    if isinstance(last, str) and Path(last).is_dir():
        return last
    if kind in ("models", "recordings"):
        return str(models_dir() if kind == "models" else runs_dir())
    docs = QStandardPaths.writableLocation(QStandardPaths.StandardLocation.DocumentsLocation)
    return docs if docs and Path(docs).is_dir() else str(Path.home())


def remember_dialog_dir(kind: str, chosen: str | Path) -> None:
    """Remember where the user put or took a file of `kind` (a file's folder, or a folder)."""
    chosen = Path(chosen)
    s = settings()
    s.setValue(f"dialogs/{kind}", str(chosen if chosen.is_dir() else chosen.parent))
    s.sync()


def conversations_dir() -> Path:
    d = home_dir() / "conversations"
    d.mkdir(exist_ok=True)
    return d


def demo_model() -> Path | None:
    """The demo model that ships with the app, as models/catalog.json names it."""
    found = catalog.demo()
    return found[0] if found is not None and found[0].is_file() else None

