"""The real models diffuse knows (models/catalog.json): facts, sizes, and the ready GGUF each
can be downloaded as instead of its whole Hugging Face checkpoint.

A catalog entry is checked when it is read, so a damaged or hand-edited catalog is refused with
the entry and field named instead of failing later in the middle of a download. A ready GGUF is
one file: `download_ready_gguf` fetches it with diffuse.hub (resumable, checked against the hub's
sha256 and against the sha256 and size the catalog pins, where it pins them) and then reads its
header to make sure it is a model of the architecture the catalog names.
"""
from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from typing import Callable

from diffuse import DiffuseError, gguf_file, hub

_MODEL_FIELDS = {"id": str, "name": str, "family": str, "hf_repo": str, "url": str,
                 "license": str, "params": int, "context_length": int, "download_bytes": int,
                 "download_files": str, "quantizations": dict, "recommended": str}
# unverified: the fields ("ready_gguf.file_bytes", "ram_gb" for every one so named) whose figures
# no primary record confirmed; the catalog's "about" says where the others come from.
_OPTIONAL_MODEL_FIELDS = {"active_params": int, "experts": int, "experts_per_token": int,
                          "ready_gguf": dict, "unverified": list}
_GGUF_FIELDS = {"repo": str, "file": str, "quantization": str, "architecture": str,
                "file_gb": (int, float), "ram_gb": (int, float)}
_OPTIONAL_GGUF_FIELDS = {"file_bytes": int, "sha256": str}
_SHA256 = re.compile(r"[0-9a-f]{64}")
RAM_POSITIONS = 256      # the prompt + answer positions every ram_gb of the catalog plans for


def shipped_models_dir() -> Path | None:
    """The shipped models/ folder (demo model, catalog): the bundle's copy, the installed
    package's, or the checkout's."""
    bundle = getattr(sys, "_MEIPASS", None)     # set inside a PyInstaller bundle
    here = Path(__file__).resolve().parent
    candidates = [Path(bundle) / "models"] if bundle else [here / "models", here.parents[1] / "models"]
    return next((d for d in candidates if (d / "catalog.json").is_file()), None)


def default_path() -> Path:
    """models/catalog.json where it ships."""
    folder = shipped_models_dir()
    if folder is None:
        raise DiffuseError("models/catalog.json is not part of this installation")
    return folder / "catalog.json"


def _section(path: Path, name: str, kind: type):
    """One top-level member of the catalog file, of type `kind`; DiffuseError when unreadable."""
    try:
        value = json.loads(path.read_text(encoding="utf-8"))[name]
        if not isinstance(value, kind):
            raise TypeError(f"{name!r} is not a {kind.__name__}")
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise DiffuseError(f"{path}: unreadable model catalog ({e})") from e
    return value


def demo() -> tuple[Path, dict] | None:
    """The shipped demo model's file and catalog entry (its size, sha256...; its suggested
    settings are in the file, Model.recipe); None when the installation has none or its catalog is
    unreadable: the app then starts without it."""
    folder = shipped_models_dir()
    try:
        entry = _section(folder / "catalog.json", "demo", dict) if folder is not None else None
    except DiffuseError:
        return None
    return (folder / str(entry.get("file", "")), entry) if entry is not None else None


def load(path: str | Path | None = None) -> list[dict]:
    """The real models of the catalog, each checked (DiffuseError names what is wrong)."""
    path = Path(path) if path is not None else default_path()
    models = _section(path, "models", list)
    for i, model in enumerate(models):
        problem = _problem(model)
        if problem:
            name = model.get("id", f"entry {i}") if isinstance(model, dict) else f"entry {i}"
            raise DiffuseError(f"{path}: {name}: {problem}")
    return models


def find(models: list[dict], model_id: str) -> dict:
    for m in models:
        if m["id"] == model_id:
            return m
    raise DiffuseError(f"no model {model_id!r} in the catalog; known: "
                       + ", ".join(m["id"] for m in models))


def _problem(model) -> str | None:
    """What is wrong with one catalog entry, or None."""
    if not isinstance(model, dict):
        return "not an object"
    problem = _fields(model, _MODEL_FIELDS, _OPTIONAL_MODEL_FIELDS)
    if problem:
        return problem
    for q, need in model["quantizations"].items():
        if not isinstance(need, dict) or _fields(need, {"file_gb": (int, float),
                                                        "ram_gb": (int, float)}, {}):
            return f"quantizations.{q} needs file_gb and ram_gb (numbers)"
    if model["recommended"] not in model["quantizations"]:
        return f"recommended {model['recommended']!r} is none of its quantizations"
    gguf = model.get("ready_gguf")
    if gguf is not None:
        problem = _fields(gguf, _GGUF_FIELDS, _OPTIONAL_GGUF_FIELDS)
        if problem:
            return f"ready_gguf: {problem}"
        if "/" in gguf["file"] or not gguf["file"].endswith(".gguf"):
            return f"ready_gguf: file {gguf['file']!r} is not a .gguf name at the repository root"
        if gguf["quantization"] not in model["quantizations"]:
            return f"ready_gguf: quantization {gguf['quantization']!r} is none of its quantizations"
        if "sha256" in gguf and not _SHA256.fullmatch(gguf["sha256"]):
            return "ready_gguf: sha256 is not 64 lower-case hex digits"
    for name in model.get("unverified", []):
        if not isinstance(name, str) or not _names_a_figure(model, name):
            return f"unverified: {name!r} names no field of the entry"
    return None


def _names_a_figure(model: dict, name: str) -> bool:
    """Whether `name` is a dotted path to a field of `model`, or a field name found at any depth."""
    node = model
    for part in name.split("."):
        if not isinstance(node, dict) or part not in node:
            return any(isinstance(v, dict) and _names_a_figure(v, name) for v in model.values())
        node = node[part]
    return True


def _fields(obj: dict, required: dict, optional: dict) -> str | None:
    missing = [key for key in required if key not in obj]
    if missing:
        return f"the field {missing[0]!r} is missing"
    for key, value in obj.items():
        kind = required.get(key) or optional.get(key)
        if kind is not None and (not isinstance(value, kind) or isinstance(value, bool)):
            return f"the field {key!r} has the wrong type ({type(value).__name__})"
    return None


# -- display: how the apps show an entry's figures -------------------------------------------------

UNVERIFIED_MARK = "~"     # before a figure no primary record confirmed (the entry's unverified member)
_FIGURE_WORDS = {"license": "licence", "context_length": "context length", "params": "parameters",
                 "active_params": "parameters used per token", "download_bytes": "checkpoint size",
                 "download_files": "checkpoint files", "file_gb": "file size", "file_bytes": "file size",
                 "ram_gb": "RAM needed"}


def unverified(model: dict, path: str) -> bool:
    """Whether the figure at dotted `path` ("params", "quantizations.f16.file_gb") is one the entry's
    unverified member names: by that path, or by its field's name alone (every field so named)."""
    names = model.get("unverified", [])
    return path in names or path.rsplit(".", 1)[-1] in names


def marked(model: dict, path: str, text: str) -> str:
    """A figure's text, with UNVERIFIED_MARK in front where it is unverified."""
    return UNVERIFIED_MARK + text if unverified(model, path) else text


def unverified_text(model: dict) -> str:
    """One sentence naming the entry's unverified figures in words, for a tooltip; "" when none."""
    names = []
    for path in model.get("unverified", []):
        parts = path.split(".")
        words = _FIGURE_WORDS.get(parts[-1], parts[-1].replace("_", " "))
        if parts[0] == "ready_gguf":
            words = f"ready GGUF's {words}"
        elif parts[0] == "quantizations" and len(parts) == 3:
            words = f"{parts[1].upper()} {words}"
        elif parts[0] not in model:         # a field's name alone, found deeper: every one so named
            words = f"{words} (all)"
        names.append(words)
    if not names:
        return ""
    return (f"{UNVERIFIED_MARK} unverified: no primary record confirmed the {', '.join(names)} of {model['name']} "
            f"(read from third-party pages or inferred; the catalog's about says from where)")


def gguf_size_text(gguf: dict, model: dict | None = None) -> str:
    """The ready GGUF's size as exactly as the catalog knows it (of `model`'s entry: marked where
    unverified)."""
    key = "file_bytes" if "file_bytes" in gguf else "file_gb"
    if model is not None and unverified(model, f"ready_gguf.{key}"):
        return f"{UNVERIFIED_MARK}{gguf[key] / (1e9 if key == 'file_bytes' else 1):.1f} GB"
    if key == "file_bytes":
        return f"{gguf['file_bytes'] / 1e9:.2f} GB"
    return f"about {gguf['file_gb']:.1f} GB"


def gguf_checks_text(gguf: dict) -> str:
    """What a download of the ready GGUF is checked against, said plainly."""
    if "sha256" in gguf:
        return "checked against the sha256 pinned in the catalog and its GGUF header"
    pinned = "the size pinned in the catalog, " if "file_bytes" in gguf else ""
    return (f"checked against {pinned}the hub's sha256 (the catalog pins none) "
            f"and its GGUF header")


def download_ready_gguf(model: dict, folder, endpoint: str | None = None,
                        progress: hub.Progress | None = None,
                        cancel: Callable[[], bool] | None = None) -> Path | None:
    """Download `model`'s ready GGUF into `folder`; the path, or None when cancelled (the .part
    stays and the next call resumes). The file's header must name the catalog's architecture:
    a file that does not is deleted if this call fetched it."""
    gguf = model.get("ready_gguf")
    if gguf is None:
        raise DiffuseError(f"{model['name']}: the catalog offers no ready GGUF; download the "
                           f"checkpoint and convert it")
    out = Path(folder) / gguf["file"]
    fetched = not out.exists()
    path = hub.download_file(gguf["repo"], gguf["file"], out, sha256=gguf.get("sha256"),
                             size=gguf.get("file_bytes"), endpoint=endpoint, progress=progress,
                             cancel=cancel)
    if path is None:
        return None
    try:
        arch = gguf_file.read(path).architecture
    except DiffuseError as e:
        arch, reason = None, str(e)
    else:
        reason = f"its architecture is {arch!r}"
    if arch != gguf["architecture"]:
        if fetched:
            path.unlink(missing_ok=True)
        raise DiffuseError(f"{gguf['repo']}/{gguf['file']} is not a {gguf['architecture']} "
                           f"model: {reason}" + (" (deleted)" if fetched else ""))
    return path
