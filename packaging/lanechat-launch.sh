#!/usr/bin/env bash
# The desktop entry's Exec: runs the app from its venv with the log in the state dir, and when
# Python cannot even start it (a missing or broken venv, an install that does not import) says so
# in that log and in a desktop notification: a double-click has no terminal to print to.
# Usage: lanechat-launch.sh VENV [ARGS...]
set -u
VENV=${1:?usage: lanechat-launch.sh VENV [ARGS...]}
shift
REPORTED=3  # app.launch has told the user already

# The state dir of engine/paths.py (platformdirs on Linux), computed here since Python may not run.
if [ -n "${LANECHAT_HOME:-}" ]; then
    STATE=$LANECHAT_HOME/state
else
    STATE=${XDG_STATE_HOME:-$HOME/.local/state}/lanechat
fi
if ! mkdir -p "$STATE" 2>/dev/null || ! [ -w "$STATE" ]; then
    STATE=${TMPDIR:-/tmp}/lanechat-$(id -u)  # somewhere the user can still be pointed to
    mkdir -p "$STATE"
fi
export LANECHAT_LOG=$STATE/lanechat.log

fail() {  # a line in the log, on stderr, and in a notification when a session bus is there
    printf '%s ERROR lanechat-launch: %s\n' "$(date '+%Y-%m-%d %H:%M:%S')" "$1" >>"$LANECHAT_LOG"
    printf 'lanechat: %s\n' "$1" >&2
    if command -v notify-send >/dev/null 2>&1 &&
        { [ -n "${DBUS_SESSION_BUS_ADDRESS:-}" ] || [ -S "/run/user/$(id -u)/bus" ]; }; then
        notify-send -a Lanechat -i io.github.lanechat.Lanechat -u critical "Lanechat could not start" \
            "$1 (details: $LANECHAT_LOG)" >/dev/null 2>&1 || true
    fi
}

if ! "$VENV/bin/python" -c '' >/dev/null 2>&1; then
    fail "its environment $VENV is missing or broken (its python does not run): run 'make venv' in the Lanechat folder, then start it again"
    exit 1
fi
ERR=$(mktemp)
trap 'rm -f "$ERR"' EXIT
"$VENV/bin/python" -m app.launch "$@" 2>"$ERR"
rc=$?
if [ "$rc" -ne 0 ] && [ "$rc" -ne "$REPORTED" ] && [ "$rc" -ne 130 ]; then
    cat "$ERR" >>"$LANECHAT_LOG"
    last=$(grep -v '^[[:space:]]*$' "$ERR" | tail -n 1)
    if [ "$rc" -gt 128 ]; then how="it was killed by signal $((rc - 128))"; else how="it stopped with exit code $rc"; fi
    fail "$how${last:+: $last}"
fi
exit "$rc"
