#!/usr/bin/env bash
# Build the Linux bundle of Diffuse Studio and its self-extracting installer.
#
#   packaging/build_linux.sh [WORK_DIR]          (default: build/bundle)
#
# 1. a build venv in WORK_DIR/venv (the developer's venv is never touched);
# 2. the engine wheel built PORTABLE (x86-64 AVX2/FMA/F16C or the aarch64 baseline, no
#    -march=native) in its own CMake folder WORK_DIR/cmake;
# 3. PyInstaller one-folder bundle: WORK_DIR/dist/diffuse-studio/diffuse-studio;
# 4. makeself installer: WORK_DIR/diffuse-studio-VERSION-linux-ARCH.run.
# Needs python3 (3.10+, with its shared library), a C++ compiler, cmake, makeself.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(dirname "$here")
work=$(realpath -m "${1:-$root/build/bundle}")
python=${PYTHON:-python3}
command -v makeself >/dev/null || { echo "makeself is missing (apt-get install makeself)" >&2; exit 1; }
mkdir -p "$work"

[ -x "$work/venv/bin/python" ] || "$python" -m venv "$work/venv"
py="$work/venv/bin/python"
version=$("$py" -c "import tomllib;print(tomllib.load(open('$root/pyproject.toml','rb'))['project']['version'])")

echo "== portable engine wheel"
rm -f "$work"/wheels/diffuse-*.whl
CMAKE_ARGS="-DDIFFUSE_PORTABLE=ON" "$py" -m pip wheel -q --no-deps -w "$work/wheels" \
    -C build-dir="$work/cmake" "$root"
wheel=$(ls "$work"/wheels/diffuse-*.whl)
"$py" -m pip install -q --force-reinstall --no-deps "$wheel"
"$py" -m pip install -q "$wheel[studio,hub]" -r "$here/requirements.txt"

echo "== PyInstaller bundle"
"$work/venv/bin/pyinstaller" --noconfirm --log-level WARN --distpath "$work/dist" \
    --workpath "$work/pyinstaller" "$here/diffuse-studio.spec"
bundle="$work/dist/diffuse-studio"

echo "== installer"
stage="$work/installer"
rm -rf "$stage"
mkdir -p "$stage"
cp -a "$bundle" "$stage/diffuse-studio"
cp "$here/linux/install.sh" "$here/linux/uninstall.sh" "$here/linux/diffuse-studio.desktop" \
    "$root/resources/icons/diffuse.svg" "$stage/"
run="$work/diffuse-studio-$version-linux-$(uname -m).run"
makeself --quiet --nox11 --sha256 "$stage" "$run" "Diffuse Studio $version" ./install.sh
rm -rf "$stage"

du -sb "$bundle" | awk '{printf "bundle     %6.1f MB  %s\n", $1/1e6, $2}'
du -sb "$run" | awk '{printf "installer  %6.1f MB  %s\n", $1/1e6, $2}'
