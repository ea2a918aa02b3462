#!/bin/sh
# Runs inside the extracted installer: puts Diffuse Studio in ~/.local/share/diffuse-studio/app,
# adds a menu entry and an icon, and writes an uninstall script. The app's own data (settings,
# recorded runs, downloaded and converted models) lives beside app/ and survives reinstalls.
set -eu
data=${XDG_DATA_HOME:-$HOME/.local/share}
home="$data/diffuse-studio"
app="$home/app"

mkdir -p "$home" "$data/applications" "$data/icons/hicolor/scalable/apps"
rm -rf "$app.new"
cp -R diffuse-studio "$app.new"
rm -rf "$app"
mv "$app.new" "$app"
cp uninstall.sh "$app/uninstall.sh"
chmod +x "$app/uninstall.sh" "$app/diffuse-studio"
cp diffuse.svg "$data/icons/hicolor/scalable/apps/diffuse-studio.svg"
sed "s|@APP@|$app|g" diffuse-studio.desktop > "$data/applications/diffuse-studio.desktop"
if [ -d "$HOME/.local/bin" ] || mkdir -p "$HOME/.local/bin" 2>/dev/null; then
    ln -sf "$app/diffuse-studio" "$HOME/.local/bin/diffuse-studio"
fi
command -v update-desktop-database >/dev/null && update-desktop-database -q "$data/applications" || true

echo "Diffuse Studio is installed in $app"
echo "Start it from your applications menu, or run: $app/diffuse-studio"
echo "Uninstall: $app/uninstall.sh   (add --purge to delete settings, runs and models too)"
