"""The Linux bundle and its installer, built by packaging/build_linux.sh and run headless.

Building takes minutes (portable engine wheel, PyInstaller, makeself), so the bundle tests run
only when asked (the smoke run from the source tree always runs):

    DIFFUSE_TEST_BUNDLE=1 python -m pytest tests/test_packaging.py -s

DIFFUSE_BUNDLE_WORK sets the build folder (default build/bundle; its venv and CMake folder are
reused by the next build). Timings go to WORK/measurements.json and are printed.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

bundle_test = pytest.mark.skipif(os.environ.get("DIFFUSE_TEST_BUNDLE") != "1",
                                 reason="builds the bundle (minutes): set DIFFUSE_TEST_BUNDLE=1")

ROOT = Path(__file__).resolve().parents[1]
BUILD_TIMEOUT_S = 3600
RUN_TIMEOUT_S = 600


@pytest.fixture(scope="module")
def built():
    work = Path(os.environ.get("DIFFUSE_BUNDLE_WORK", ROOT / "build" / "bundle")).resolve()
    start = time.perf_counter()
    proc = subprocess.run(["bash", str(ROOT / "packaging" / "build_linux.sh"), str(work)],
                          capture_output=True, text=True, timeout=BUILD_TIMEOUT_S)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    bundle = work / "dist" / "diffuse-studio"
    installer = next(work.glob("diffuse-studio-*-linux-*.run"))
    sizes = {"build_s": time.perf_counter() - start, "bundle_mb": _size(bundle) / 1e6,
             "installer_mb": installer.stat().st_size / 1e6}
    return {"work": work, "bundle": bundle, "installer": installer, "measured": sizes}


def _size(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file() and not p.is_symlink())


def _clean_env(home: Path) -> dict:
    """The environment of a user who never installed Python packages: no venv, no repo."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("PYTHON", "VIRTUAL_ENV", "DIFFUSE_", "QT_", "HF_"))}
    env.update(HOME=str(home), QT_QPA_PLATFORM="offscreen",
               PATH="/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin")
    return env


def _smoke(binary: Path, tmp: Path, x_server: bool = False) -> dict:
    """Run `binary --smoke-test` from an empty folder (offscreen, or with Qt's xcb platform on
    a virtual X server); its JSON report."""
    tmp.mkdir(parents=True, exist_ok=True)
    shot = tmp / "smoke.png"
    cmd, env = [str(binary), "--smoke-test", str(shot)], _clean_env(tmp / "home")
    if x_server:
        cmd = ["xvfb-run", "-a", "-s", "-screen 0 1600x1000x24"] + cmd
        env["QT_QPA_PLATFORM"] = "xcb"
    proc = subprocess.run(cmd, cwd=tmp, env=env, capture_output=True, text=True,
                          timeout=RUN_TIMEOUT_S)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    assert shot.is_file()
    return report


def _record(work: Path, **values) -> None:
    path = work / "measurements.json"
    data = json.loads(path.read_text()) if path.is_file() else {}
    data.update(values)
    path.write_text(json.dumps(data, indent=2))
    print(json.dumps(values, indent=2))


@bundle_test
def test_bundle_holds_the_demo_model_fonts_and_only_the_needed_qt_plugins(built):
    internal = built["bundle"] / "_internal"
    demo = sorted((ROOT / "models").glob("*.gguf"))
    assert demo, "no demo model in models/ to bundle"
    for p in demo + [ROOT / "models" / "catalog.json"]:
        assert (internal / "models" / p.name).read_bytes() == p.read_bytes()
    fonts = {p.name for p in (internal / "diffuse" / "studio" / "resources" / "fonts").iterdir()}
    assert {"DejaVuSans.ttf", "DejaVuSansMono.ttf"} <= fonts
    platforms = {p.name for p in internal.rglob("plugins/platforms/*")}
    assert platforms == {"libqxcb.so", "libqoffscreen.so"}
    assert not list(internal.rglob("torch"))


@bundle_test
def test_engine_is_the_portable_build(built):
    """No AVX-512 (zmm registers) in the engine: it runs on any x86-64 with AVX2, not only on
    the build machine's CPU."""
    core = next((built["bundle"] / "_internal" / "diffuse").glob("_core*.so"))
    if shutil.which("objdump") is None:
        pytest.skip("objdump (binutils) is not installed")
    asm = subprocess.run(["objdump", "-d", "--no-show-raw-insn", str(core)],
                         capture_output=True, text=True, check=True).stdout
    assert "ymm" in asm          # AVX2 kernels are there
    assert "zmm" not in asm


@bundle_test
def test_bundled_binary_starts_loads_the_demo_and_generates(built, tmp_path):
    binary = built["bundle"] / "diffuse-studio"
    cold = _smoke(binary, tmp_path / "first")
    warm = _smoke(binary, tmp_path / "second")
    for report in (cold, warm):
        assert report["steps"] > 0 and report["model"].endswith(".gguf")
        # The first-run dialog found the catalog and the hub client (and no network).
        assert {"LLaDA-8B-Instruct", "Dream-v0-Instruct-7B"} <= set(report["real_models"])
        assert "optional huggingface_hub" not in report["hub"]
        assert "/_internal/models/" in report["model"]        # the bundled demo model
        assert 0 < report["window_s"] < report["model_s"] < report["first_step_s"]
        assert isinstance(report["served"], str)     # uvicorn works inside the bundle
    shot = tmp_path / "second" / "smoke.png"
    _assert_not_blank(shot)
    shutil.copy(shot, built["work"] / "smoke.png")
    _record(built["work"], **built["measured"],
            first_run={k: round(v, 2) for k, v in cold.items() if k.endswith("_s")},
            second_run={k: round(v, 2) for k, v in warm.items() if k.endswith("_s")},
            demo_answer=warm["text"][:200])


@bundle_test
def test_bundled_binary_draws_on_an_x_server(built, tmp_path):
    """The xcb platform plugin and the X libraries it needs are in the bundle."""
    if shutil.which("xvfb-run") is None:
        pytest.skip("xvfb-run (Debian xvfb) is not installed")
    report = _smoke(built["bundle"] / "diffuse-studio", tmp_path, x_server=True)
    assert report["steps"] > 0
    _assert_not_blank(tmp_path / "smoke.png")


def _assert_not_blank(png: Path) -> None:
    from PIL import Image
    with Image.open(png) as im:
        assert im.width >= 800 and im.height >= 500
        colours = im.convert("RGB").getcolors(maxcolors=1 << 16)
        assert colours is None or len(colours) > 50      # text and plots, not a flat fill


@bundle_test
def test_installer_installs_runs_and_uninstalls(built, tmp_path):
    home = tmp_path / "home"
    home.mkdir()
    env = _clean_env(home)
    proc = subprocess.run(["sh", str(built["installer"]), "--quiet", "--nox11"], cwd=tmp_path,
                          env=env, capture_output=True, text=True, timeout=RUN_TIMEOUT_S)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    data = home / ".local" / "share"
    app = data / "diffuse-studio" / "app"
    desktop = data / "applications" / "diffuse-studio.desktop"
    assert (app / "diffuse-studio").is_file() and os.access(app / "diffuse-studio", os.X_OK)
    entry = desktop.read_text()
    assert f'Exec="{app}/diffuse-studio" %f' in entry and "Icon=diffuse-studio" in entry
    assert (data / "icons" / "hicolor" / "scalable" / "apps" / "diffuse-studio.svg").is_file()
    link = home / ".local" / "bin" / "diffuse-studio"
    assert link.resolve() == (app / "diffuse-studio").resolve()
    if shutil.which("desktop-file-validate"):
        subprocess.run(["desktop-file-validate", str(desktop)], check=True)

    # The installed copy runs from its new place; its data goes beside app/, not inside.
    report = _smoke(app / "diffuse-studio", tmp_path / "run")
    assert report["steps"] > 0
    keep = data / "diffuse-studio" / "models" / "mine.gguf"
    keep.parent.mkdir()
    keep.write_bytes(b"user data")

    # Reinstalling replaces app/ and keeps the user's data.
    subprocess.run(["sh", str(built["installer"]), "--quiet", "--nox11"], cwd=tmp_path, env=env,
                   check=True, capture_output=True, timeout=RUN_TIMEOUT_S)
    assert keep.is_file()

    subprocess.run(["sh", str(app / "uninstall.sh")], env=env, check=True, capture_output=True)
    assert not app.exists() and not desktop.exists() and not link.is_symlink()
    assert keep.is_file()
    subprocess.run(["sh", str(built["installer"]), "--quiet", "--nox11"], cwd=tmp_path, env=env,
                   check=True, capture_output=True, timeout=RUN_TIMEOUT_S)
    subprocess.run(["sh", str(app / "uninstall.sh"), "--purge"], env=env, check=True,
                   capture_output=True)
    assert not (data / "diffuse-studio").exists()


def test_smoke_module_in_the_dev_tree(tiny_gguf, tmp_path):
    """The same smoke run from the source tree (what the bundle's --smoke-test calls)."""
    shot = tmp_path / "dev.png"
    proc = subprocess.run([sys.executable, "-m", "diffuse.studio.smoke", str(shot),
                           str(tiny_gguf("llada", "q8_0"))], env=_clean_env(tmp_path) | {
                               "PATH": os.environ["PATH"]},
                          capture_output=True, text=True, timeout=RUN_TIMEOUT_S)
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    assert report["steps"] > 0 and shot.is_file()
    assert report["real_models"] and (tmp_path / "dev-first-run.png").is_file()
    assert isinstance(report["served"], str)
