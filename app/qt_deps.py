"""The system libraries Qt's xcb platform plugin (X11) cannot find, and the apt packages that bring them.

Qt aborts the process when its platform plugin does not load, before Python sees an exception, so
the launcher and `make install-desktop` ask `ldd` first. Standard library only (no Qt import):

    python -m app.qt_deps    # exit 0 when every library is there, 1 with the apt command when not
"""
from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
from pathlib import Path

# Sonames the xcb plugin and QtWidgets load from the system, and their Debian / Ubuntu packages
# (24.04's t64 packages provide the older names, so apt takes these there too).
APT = {
    "libxcb-cursor.so.0": "libxcb-cursor0", "libxcb-icccm.so.4": "libxcb-icccm4",
    "libxcb-keysyms.so.1": "libxcb-keysyms1", "libxcb-image.so.0": "libxcb-image0",
    "libxcb-render-util.so.0": "libxcb-render-util0", "libxcb-render.so.0": "libxcb-render0",
    "libxcb-randr.so.0": "libxcb-randr0", "libxcb-shape.so.0": "libxcb-shape0", "libxcb-shm.so.0": "libxcb-shm0",
    "libxcb-sync.so.1": "libxcb-sync1", "libxcb-util.so.1": "libxcb-util1", "libxcb-xfixes.so.0": "libxcb-xfixes0",
    "libxcb-xkb.so.1": "libxcb-xkb1", "libxcb-xinerama.so.0": "libxcb-xinerama0",
    "libxcb-xinput.so.0": "libxcb-xinput0", "libxcb.so.1": "libxcb1", "libX11-xcb.so.1": "libx11-xcb1",
    "libX11.so.6": "libx11-6", "libxkbcommon-x11.so.0": "libxkbcommon-x11-0", "libxkbcommon.so.0": "libxkbcommon0",
    "libEGL.so.1": "libegl1", "libGL.so.1": "libgl1", "libOpenGL.so.0": "libopengl0", "libGLX.so.0": "libglx0",
    "libfontconfig.so.1": "libfontconfig1", "libfreetype.so.6": "libfreetype6", "libdbus-1.so.3": "libdbus-1-3",
    "libglib-2.0.so.0": "libglib2.0-0", "libgthread-2.0.so.0": "libglib2.0-0", "libSM.so.6": "libsm6",
    "libICE.so.6": "libice6", "libpng16.so.16": "libpng16-16", "libz.so.1": "zlib1g",
}
_NOT_FOUND = re.compile(r"^\s*(\S+)\s*=>\s*not found", re.M)


def qt_files() -> list[Path]:
    """The xcb platform plugin and QtWidgets of the installed PySide6 ([] without PySide6)."""
    spec = importlib.util.find_spec("PySide6")
    if spec is None or spec.origin is None:
        return []
    root = Path(spec.origin).parent
    return [p for p in (root / "Qt" / "plugins" / "platforms" / "libqxcb.so", *root.glob("QtWidgets.*.so"))
            if p.exists()]


def not_found(ldd_output: str) -> list[str]:
    return _NOT_FOUND.findall(ldd_output)


def missing_libraries(files: list[Path] | None = None) -> list[str]:
    """Sonames `ldd` cannot resolve for Qt's xcb plugin and widgets ([] when ldd is not there)."""
    missing: list[str] = []
    for f in qt_files() if files is None else files:
        try:
            out = subprocess.run(["ldd", str(f)], capture_output=True, text=True, timeout=30).stdout
        except (OSError, subprocess.TimeoutExpired):
            return []
        missing += [lib for lib in not_found(out) if lib not in missing]
    return missing


def advice(missing: list[str]) -> str:
    """One paragraph: what is missing and the command that installs it."""
    packages = sorted({APT[lib] for lib in missing if lib in APT})
    unknown = [lib for lib in missing if lib not in APT]
    text = f"Qt cannot open a window on X11: its xcb platform plugin misses {', '.join(missing)}."
    if packages:
        text += f" Install them with: sudo apt-get install {' '.join(packages)}"
    if unknown:
        text += f" (find the package of {', '.join(unknown)} with: apt-file search {unknown[0]})"
    return text


def main() -> int:
    if not qt_files():
        print("PySide6 is not installed in this environment: run 'make venv'", file=sys.stderr)
        return 2
    missing = missing_libraries()
    if missing:
        print(advice(missing), file=sys.stderr)
        return 1
    print("Qt's xcb platform plugin finds all its libraries")
    return 0


if __name__ == "__main__":
    sys.exit(main())
