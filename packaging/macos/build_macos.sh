#!/usr/bin/env bash
# Build "Diffuse Studio.app" and a .dmg. Run on a Mac (arm64 or x86_64), macOS 12 or newer:
#
#   brew install cmake libomp
#   packaging/macos/build_macos.sh [WORK_DIR]          (default: build/bundle)
#
# Signing and notarisation (optional, needed for a download that opens without warnings):
#   CODESIGN_IDENTITY="Developer ID Application: NAME (TEAMID)"  signs every binary and the app
#       (hardened runtime, entitlements.plist beside this script);
#   NOTARY_PROFILE=NAME  a `xcrun notarytool store-credentials` profile: notarise and staple.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
work=${1:-$root/build/bundle}
mkdir -p "$work"

[ -x "$work/venv/bin/python" ] || "${PYTHON:-python3}" -m venv "$work/venv"
py="$work/venv/bin/python"
version=$("$py" -c "import tomllib;print(tomllib.load(open('$root/pyproject.toml','rb'))['project']['version'])")

# Apple's clang has no OpenMP of its own: the engine links Homebrew's libomp (bundled by
# PyInstaller). PORTABLE builds for the architecture's baseline, not this Mac's CPU.
rm -f "$work"/wheels/diffuse-*.whl
CMAKE_ARGS="-DDIFFUSE_PORTABLE=ON -DOpenMP_ROOT=$(brew --prefix libomp)" \
    "$py" -m pip wheel -q --no-deps -w "$work/wheels" -C build-dir="$work/cmake" "$root"
wheel=$(ls "$work"/wheels/diffuse-*.whl)
"$py" -m pip install -q --force-reinstall --no-deps "$wheel"
"$py" -m pip install -q "$wheel[studio,hub]" -r "$root/packaging/requirements.txt"

"$py" "$root/packaging/make_icon.py" "$work/icon.png" 1024
DIFFUSE_ICON="$work/icon.png" \
DIFFUSE_CODESIGN_IDENTITY="${CODESIGN_IDENTITY:-}" \
DIFFUSE_ENTITLEMENTS="$here/entitlements.plist" \
    "$work/venv/bin/pyinstaller" --noconfirm --log-level WARN --distpath "$work/dist" \
    --workpath "$work/pyinstaller" "$root/packaging/diffuse-studio.spec"
app="$work/dist/Diffuse Studio.app"
if [ -n "${CODESIGN_IDENTITY:-}" ]; then
    codesign --verify --deep --strict --verbose=2 "$app"
fi

# The disk image: the app and a link to /Applications to drag it onto.
stage="$work/dmg"
rm -rf "$stage"
mkdir -p "$stage"
cp -R "$app" "$stage/"
ln -s /Applications "$stage/Applications"
dmg="$work/diffuse-studio-$version-macos-$(uname -m).dmg"
hdiutil create -volname "Diffuse Studio" -srcfolder "$stage" -ov -format UDZO "$dmg"
rm -rf "$stage"
if [ -n "${CODESIGN_IDENTITY:-}" ]; then
    codesign --sign "$CODESIGN_IDENTITY" --timestamp "$dmg"
    if [ -n "${NOTARY_PROFILE:-}" ]; then
        xcrun notarytool submit "$dmg" --keychain-profile "$NOTARY_PROFILE" --wait
        xcrun stapler staple "$dmg"
    fi
fi
du -sh "$app" "$dmg"
