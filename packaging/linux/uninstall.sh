#!/bin/sh
# Removes Diffuse Studio installed by the .run installer. Keeps the user's settings, recorded
# runs and models (in ~/.local/share/diffuse-studio) unless --purge is given.
set -eu
data=${XDG_DATA_HOME:-$HOME/.local/share}
home="$data/diffuse-studio"

rm -f "$data/applications/diffuse-studio.desktop" \
      "$data/icons/hicolor/scalable/apps/diffuse-studio.svg"
if [ "$(readlink "$HOME/.local/bin/diffuse-studio" 2>/dev/null)" = "$home/app/diffuse-studio" ]; then
    rm -f "$HOME/.local/bin/diffuse-studio"
fi
rm -rf "$home/app"
command -v update-desktop-database >/dev/null && update-desktop-database -q "$data/applications" || true
if [ "${1:-}" = "--purge" ]; then
    rm -rf "$home"
    echo "Diffuse Studio and its data are removed."
else
    echo "Diffuse Studio is removed. Your settings, runs and models stay in $home"
    echo "(run again with --purge to delete them)."
fi
