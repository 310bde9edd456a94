#!/usr/bin/env bash
# Install Lanechat's desktop entry and icons for this user (~/.local/share, or $XDG_DATA_HOME),
# so the app starts by double-click. Exec runs packaging/lanechat-launch.sh with the project's venv
# ($LANECHAT_VENV, default <repo>/.venv, as `make venv` builds it): it logs to the state dir and
# tells the user when the app cannot start. Run again after moving the project.
set -euo pipefail

APP_ID=io.github.lanechat.Lanechat
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
VENV=${LANECHAT_VENV:-$REPO/.venv}
LAUNCHER=$VENV/bin/lanechat
START=$REPO/packaging/lanechat-launch.sh
DATA=${XDG_DATA_HOME:-$HOME/.local/share}
APPS=$DATA/applications
ICONS=$DATA/icons/hicolor

if [ ! -x "$LAUNCHER" ]; then
    echo "install-desktop: $LAUNCHER not found; run 'make venv' first (or set LANECHAT_VENV)" >&2
    exit 1
fi
# Exec's arguments are always quoted (spaces are common in home folders) and % doubled, per the
# Desktop Entry spec; the few characters that would need a second level of escaping are refused.
for path in "$START" "$VENV"; do
    case "$path" in
        *[\"\`\$\\]*)
            echo "install-desktop: cannot write a launcher for a path with \" \` \$ or \\ in it: $path" >&2
            exit 1 ;;
    esac
done
EXEC="\"${START//%/%%}\" \"${VENV//%/%%}\""

# Qt aborts at start without its xcb libraries; say now which apt packages bring them.
if ! "$VENV/bin/python" -m app.qt_deps >/dev/null; then
    echo "install-desktop: warning: the app will not open a window until the above is fixed" >&2
fi

WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
NEW=$WORK/$APP_ID.desktop
while IFS= read -r line; do
    line=${line//@TRYEXEC@/$START}
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
