"""Lanechat's desktop app: a PySide6 window over the engine's public API."""
# One id for the .desktop entry, the icon name and QGuiApplication.setDesktopFileName, so the
# desktop shell matches the running window to its launcher (taskbar icon, grouping).
APP_ID = "io.github.lanechat.Lanechat"
APP_NAME = "Lanechat"
