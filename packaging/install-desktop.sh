#!/usr/bin/env bash
# Install Lanechat's desktop entry and icons for this user (~/.local/share, or $XDG_DATA_HOME),
# so the app starts by double-click. Exec points at the project's venv launcher ($LANECHAT_VENV,
# default <repo>/.venv, as `make venv` builds it). Run again after moving the project.
set -euo pipefail

APP_ID=io.github.lanechat.Lanechat
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
VENV=${LANECHAT_VENV:-$REPO/.venv}
LAUNCHER=$VENV/bin/lanechat
DATA=${XDG_DATA_HOME:-$HOME/.local/share}
APPS=$DATA/applications
ICONS=$DATA/icons/hicolor

if [ ! -x "$LAUNCHER" ]; then
    echo "install-desktop: $LAUNCHER not found; run 'make venv' first (or set LANECHAT_VENV)" >&2
    exit 1
fi
# Exec is always quoted (spaces are common in home folders) and % doubled, per the Desktop Entry
# spec; the few characters that would need a second level of escaping are refused instead.
case "$LAUNCHER" in
    *[\"\`\$\\]*)
        echo "install-desktop: cannot write a launcher for a path with \" \` \$ or \\ in it: $LAUNCHER" >&2
        exit 1 ;;
esac
EXEC="\"${LAUNCHER//%/%%}\""

WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
NEW=$WORK/$APP_ID.desktop
while IFS= read -r line; do
    line=${line//@TRYEXEC@/$LAUNCHER}
    printf '%s\n' "${line//@EXEC@/$EXEC}"
done < "$REPO/resources/$APP_ID.desktop.in" > "$NEW"
if command -v desktop-file-validate >/dev/null 2>&1; then
    desktop-file-validate "$NEW"
fi
# Replace the entry in one rename, so a menu never reads half a file.
mkdir -p "$APPS"
ENTRY=$APPS/$APP_ID.desktop
install -m 644 "$NEW" "$APPS/.$APP_ID.desktop.new"
mv "$APPS/.$APP_ID.desktop.new" "$ENTRY"

for dir in "$REPO"/resources/icons/hicolor/*/apps; do
    size=$(basename "$(dirname "$dir")")
    mkdir -p "$ICONS/$size/apps"
    cp "$dir"/"$APP_ID".* "$ICONS/$size/apps/"
done

# Menus pick the entry up sooner with a fresh MIME cache. No icon-theme.cache is written: once one
# exists, GTK trusts it alone, and icons other programs add there later would stay invisible;
# touching the folder makes GTK rescan it instead.
command -v update-desktop-database >/dev/null 2>&1 && update-desktop-database -q "$APPS" || true
touch "$ICONS"

echo "Installed $ENTRY"
echo "  Exec=$EXEC"
echo "  icons in $ICONS/*/apps/$APP_ID.*"
