"""Fetch the pinned ggml source tree for the build.

ggml comes from a registry package, never from source copied into this repository: the
llama-cpp-python sdist on PyPI carries llama.cpp's ggml (0.25.3), the newest and fastest
ggml any registry offers (FACTS.md: Q4_K mat-mul 2-3x the older libggml-python wheels).

Usage: python fetch_ggml.py CACHE_DIR  -> prints the path of the ggml source folder.
DIFFUSE_GGML_SDIST may name a local copy of the sdist (offline builds); it is checked
against the same sha256.
"""
import hashlib
import os
import sys
import tarfile
import urllib.request
from pathlib import Path

SDIST_NAME = "llama_cpp_python-0.3.36.tar.gz"
SDIST_URL = ("https://files.pythonhosted.org/packages/ec/e9/"
             "e7de2b0463ea3ffbf0ede6cb21b58c1258a8f6521aae45ca773a59fe7cf3/" + SDIST_NAME)
SDIST_SHA256 = "832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e"
GGML_PREFIX = "llama_cpp_python-0.3.36/vendor/llama.cpp/ggml/"


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def fetch_sdist(cache: Path) -> Path:
    local = os.environ.get("DIFFUSE_GGML_SDIST")
    path = Path(local) if local else cache / SDIST_NAME
    if not path.exists():
        tmp = path.with_suffix(".part")
        print(f"fetch_ggml: downloading {SDIST_URL}", file=sys.stderr)
        urllib.request.urlretrieve(SDIST_URL, tmp)
        tmp.replace(path)
    digest = sha256(path)
    if digest != SDIST_SHA256:
        raise SystemExit(f"fetch_ggml: {path} has sha256 {digest}, expected {SDIST_SHA256}")
    return path


def main() -> None:
    cache = Path(sys.argv[1]).resolve()
    cache.mkdir(parents=True, exist_ok=True)
    ggml_dir = cache / "ggml-0.25.3"
    if not (ggml_dir / "CMakeLists.txt").exists():
        sdist = fetch_sdist(cache)
        staging = cache / "ggml-staging"
        with tarfile.open(sdist) as tar:
            members = [m for m in tar.getmembers()
                       if m.name.startswith(GGML_PREFIX) and (m.isfile() or m.isdir())]
            for m in members:
                m.name = m.name[len(GGML_PREFIX):] or "."
            tar.extractall(staging, members=members, filter="data")
        # The sdist leaves out ggml.pc.in, which ggml's CMakeLists configures unconditionally.
        (staging / "ggml.pc.in").touch()
        staging.replace(ggml_dir)
    print(ggml_dir)


if __name__ == "__main__":
    main()
