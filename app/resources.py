"""Files under the project's resources/ folder (icons, the .desktop template)."""
from __future__ import annotations

from pathlib import Path

from PySide6.QtGui import QIcon

from . import APP_ID

RESOURCES = Path(__file__).resolve().parent.parent / "resources"


def app_icon() -> QIcon:
    """The app icon at every size we ship, so the window and taskbar pick a sharp one."""
    icon = QIcon()
    for png in sorted((RESOURCES / "icons" / "hicolor").glob(f"*/apps/{APP_ID}.png")):
        icon.addFile(str(png))
    return icon
